//! Listener handover (`--handover-socket`): a new server started with the
//! same flags takes the running one's listening sockets, the old one stops
//! accepting, tells its agents, and drains. Under a steady load of dials
//! through the TCP and unix CONNECT frontends, three handovers in a row
//! must fail no dial, never leave a socket path missing, and keep every
//! tunnel open at the handover whole until it ends.

use crate::support;

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use support::dial_load::{assert_none_failed, still_echoes, watch_paths, Load, Via};
use support::*;

#[test]
fn three_handovers_under_load_fail_no_dial_and_cut_no_tunnel() {
    let env = Env::new();
    let handover = env.path("handover.sock");
    let handover_arg = handover.display().to_string();
    let flags = [
        "--handover-socket",
        handover_arg.as_str(),
        "--graceful-shutdown-timeout-secs",
        "60",
        "--workers",
        "2",
    ];
    let mut server = Server::start(&env, &flags);
    let binds = Binds::of(&server);
    let agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    server.wait_agent_links(2.0, &agent.proc);
    let echo = echo_server("127.0.0.1");
    let target = echo.addr.to_string();

    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_paths(
        vec![
            server.connect_uds.clone(),
            server.grpc_uds.clone(),
            handover.clone(),
        ],
        stop_watch.clone(),
    );
    let load = Load::start(Via::both_frontends(&server), target.clone());
    thread::sleep(Duration::from_millis(500));

    for round in 1..=3u8 {
        // A tunnel open across the handover, on the old server.
        let (status, _, mut held) = connect_unix(&binds.connect_uds.clone().unwrap(), &target);
        assert_eq!(status, 200);
        still_echoes(&mut held, round);
        let before = load.dialled();

        let next = Server::start_at(&env, &binds, &flags);
        server
            .proc
            .wait_log("handover: a successor listens on our sockets; draining");
        next.proc.wait_log("handover: the predecessor drains");
        // The old one drains: the held tunnel carries on, and dials go on
        // through the new one.
        thread::sleep(Duration::from_millis(700));
        still_echoes(&mut held, round.wrapping_add(100));
        assert!(
            server.proc.wait_exit(Duration::ZERO).is_none(),
            "round {round}: the old server left with a tunnel open:\n{}",
            server.proc.log_text()
        );
        load.wait_past(before + 20, || format!("round {round}"));
        // The held tunnel ends; then the old server has nothing left.
        drop(held);
        let status = server.proc.wait_exit(WAIT);
        assert!(
            status.is_some(),
            "round {round}: the old server still runs with no tunnel:\n{}",
            server.proc.log_text()
        );
        server = next;
    }
    thread::sleep(Duration::from_millis(500));
    let (ok, failures) = load.finish();
    stop_watch.store(true, Ordering::SeqCst);
    let missing = watcher.join().unwrap();
    assert_none_failed("dials through three handovers", ok, &failures, || {
        format!(
            "--- server:\n{}\n--- agent:\n{}",
            server.proc.log_text(),
            agent.proc.log_text()
        )
    });
    assert_eq!(missing, 0, "a socket path was missing");
    assert!(ok > 60, "only {ok} dials");
    // The agent follows: links to the last server.
    server.wait_agent_links(2.0, &agent.proc);
}

#[test]
fn without_a_server_at_the_handover_socket_the_server_starts_as_before() {
    let env = Env::new();
    let handover = env.path("handover.sock");
    // A stale socket file (nobody listens) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&handover).unwrap());
    assert!(handover.exists());
    let arg = handover.display().to_string();
    let server = Server::start(&env, &["--handover-socket", &arg]);
    server
        .proc
        .wait_log("handover: no server to take over from; binding the listeners");
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let (status, _, mut t) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    still_echoes(&mut t, 7);
    drop(t);
    // A plain stop removes the handover socket with the others.
    let mut server = server;
    server.proc.signal(libc::SIGTERM);
    assert!(server.proc.wait_exit(WAIT).is_some());
    assert!(!handover.exists(), "the handover socket stayed");
    assert!(!server.connect_uds.exists());
}

#[test]
fn a_successor_that_goes_away_before_confirming_leaves_the_server_serving() {
    use std::os::unix::net::UnixDatagram;
    let env = Env::new();
    let handover = env.path("handover.sock");
    let arg = handover.display().to_string();
    let server = Server::start(&env, &["--handover-socket", &arg]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    // A stream socket is the wrong kind: refused by the kernel.
    assert!(UnixStream::connect(&handover).is_err());
    let _ = UnixDatagram::unbound().unwrap().connect(&handover);
    // A successor speaking garbage, and one that says hello and leaves
    // with the sockets unconfirmed.
    for hello in [&b"hello there\n"[..], b"hello min=1 max=1 pid=1\n"] {
        let s =
            socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None).unwrap();
        s.connect(&socket2::SockAddr::unix(&handover).unwrap())
            .unwrap();
        s.send(hello).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 65536];
        let _ = s.recv(&mut buf);
        drop(s);
    }
    server.proc.wait_log("handover: no handover, serving on");
    // Still serving, on every listener.
    for _ in 0..3 {
        let (status, _, mut t) = connect_tcp(server.connect, &echo.addr.to_string());
        assert_eq!(status, 200);
        still_echoes(&mut t, 3);
        let (status, _, mut u) = connect_unix(&server.connect_uds, &echo.addr.to_string());
        assert_eq!(status, 200);
        still_echoes(&mut u, 4);
    }
    assert_eq!(http_get(server.admin, "/readyz").0, 200);
}

/// A DaemonSet rolled with maxSurge signals the old pod once the new one
/// runs, which may be a moment before the new one took over: after
/// SIGTERM the server serves on for `--handover-wait-secs` and hands over
/// to a successor that comes meanwhile, losing no dial.
#[test]
fn a_successor_that_comes_after_the_signal_still_takes_over() {
    let env = Env::new();
    let handover = env.path("handover.sock");
    let h = handover.display().to_string();
    let flags = [
        "--handover-socket",
        h.as_str(),
        "--handover-wait-secs",
        "30",
    ];
    let mut server = Server::start(&env, &flags);
    let binds = Binds::of(&server);
    let agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let load = Load::start(
        vec![
            Via::Tcp(server.connect),
            Via::Unix(server.connect_uds.clone()),
        ],
        echo.addr.to_string(),
    );
    server.proc.signal(libc::SIGTERM);
    server
        .proc
        .wait_log("shutdown signal: serving on while a successor may still take over");
    thread::sleep(Duration::from_millis(500));
    assert!(server.proc.wait_exit(Duration::ZERO).is_none());
    let next = Server::start_at(&env, &binds, &flags);
    next.proc.wait_log("handover: the predecessor drains");
    assert!(
        server.proc.wait_exit(WAIT).is_some(),
        "the old server still runs:\n{}",
        server.proc.log_text()
    );
    load.wait_past(load.dialled() + 10, String::new);
    let (ok, failures) = load.finish();
    assert_none_failed("dials", ok, &failures, || agent.proc.log_text());
}

/// Agents roll too (a DaemonSet of agents with maxSurge, or a new agent
/// started before the old one is stopped; both with the node's agent ID,
/// as the DaemonSet's pods have): the new agent links, the old one
/// gets SIGTERM, sends DRAIN and finishes its tunnels. Three rollouts under
/// a steady load of dials: none fails, and a tunnel held on the old agent
/// stays whole until it ends.
#[test]
fn three_agent_rollouts_under_load_fail_no_dial() {
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "2"]);
    let mut agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    server.wait_agent_links(2.0, &agent.proc);
    let echo = echo_server("127.0.0.1");
    let target = echo.addr.to_string();
    let load = Load::start(Via::both_frontends(&server), target.clone());
    thread::sleep(Duration::from_millis(300));
    for round in 1..=3u8 {
        let (status, _, mut held) = connect_unix(&server.connect_uds, &target);
        assert_eq!(status, 200);
        still_echoes(&mut held, round);
        let next = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
        server.wait_metric("edgetunnel_agents_connected", 2.0);
        agent.proc.signal(libc::SIGTERM);
        load.wait_past(load.dialled() + 20, || format!("round {round}"));
        still_echoes(&mut held, round.wrapping_add(100));
        drop(held);
        old_agent_leaves(&server, &mut agent, round);
        agent = next;
    }
    let (ok, failures) = load.finish();
    assert_none_failed("dials through three agent rollouts", ok, &failures, || {
        server.proc.log_text()
    });
}

/// On a host-network node two agents of one DaemonSet overlap only if they
/// can share the health port: with `--handover-socket` the new agent takes
/// the old one's health listener, links, and only then tells the old one to
/// drain. Three rollouts under a steady load of dials, the old agent
/// signalled as soon as the new one starts (the DaemonSet controller with
/// maxSurge deletes the old pod once the new one runs, maybe before it
/// linked) or not at all, each new agent's links a second slow to come up
/// (a WAN's handshakes): no dial fails, the health port answers every
/// probe, and a tunnel held on the old agent stays whole until it ends. In
/// the last round no tunnel holds the old agent: were it to drain before
/// the new one linked, it would leave at once and the node's dials fail.
#[test]
fn three_agent_handovers_under_load_fail_no_dial_and_keep_the_health_port() {
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "2"]);
    let sock = env.path("agent-handover.socket").display().to_string();
    let health: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let health_arg = health.to_string();
    let args = [
        "--handover-socket",
        sock.as_str(),
        "--health-bind",
        health_arg.as_str(),
    ];
    let mut agent = Agent::start(&env, server.agent, "node1", "host=node1", &args);
    server.wait_agent_links(2.0, &agent.proc);
    let echo = echo_server("127.0.0.1");
    let target = echo.addr.to_string();
    let load = Load::start(Via::both_frontends(&server), target.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let probes = {
        let stop = stop.clone();
        thread::spawn(move || {
            let (mut ok, mut failed) = (0usize, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                match probe(health) {
                    Ok(200) => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
                thread::sleep(Duration::from_millis(20));
            }
            (ok, failed)
        })
    };
    thread::sleep(Duration::from_millis(300));
    for round in 1..=3u8 {
        let mut held = (round < 3).then(|| {
            let (status, _, mut held) = connect_unix(&server.connect_uds, &target);
            assert_eq!(status, 200);
            still_echoes(&mut held, round);
            held
        });
        let slow = slow_link(server.agent, Duration::from_secs(1));
        let next = Agent::spawn(&env, slow, "node1", "host=node1", &args);
        if round != 2 {
            agent.proc.signal(libc::SIGTERM);
        }
        next.proc.wait_log("handover: the predecessor drains");
        agent
            .proc
            .wait_log("handover: a successor listens on our sockets");
        load.wait_past(load.dialled() + 20, || format!("round {round}"));
        if let Some(mut held) = held.take() {
            still_echoes(&mut held, round.wrapping_add(100));
        }
        old_agent_leaves(&server, &mut agent, round);
        agent = next;
    }
    let (ok, failures) = load.finish();
    stop.store(true, Ordering::SeqCst);
    let (probed, probe_failures) = probes.join().unwrap();
    assert_none_failed("dials through three agent handovers", ok, &failures, || {
        server.proc.log_text()
    });
    assert!(
        probe_failures.is_empty() && probed > 20,
        "health probes through three agent handovers: {probed} answered, failed: {probe_failures:?}\n{}",
        agent.proc.log_text()
    );
    assert!(agent
        .proc
        .log_text()
        .contains("handover: took the listening sockets of the running agent"));
    eprintln!(
        "three agent handovers: {ok} dials, none failed; {probed} health probes, all answered"
    );
}

/// The old agent of a rollout exits, and the server sees one agent left.
fn old_agent_leaves(server: &Server, agent: &mut Agent, round: u8) {
    assert!(
        agent.proc.wait_exit(WAIT).is_some(),
        "round {round}: the old agent still runs:\n{}",
        agent.proc.log_text()
    );
    server.wait_metric("edgetunnel_agents_connected", 1.0);
}

/// A TCP forwarder to `upstream` that connects each connection only
/// `delay` after accepting it: a link whose handshakes take that long.
fn slow_link(upstream: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(down) = conn else { return };
            thread::spawn(move || {
                thread::sleep(delay);
                let Ok(up) = std::net::TcpStream::connect(upstream) else {
                    return;
                };
                let (mut d2, mut u2) = (down.try_clone().unwrap(), up.try_clone().unwrap());
                let (mut down, mut up) = (down, up);
                let t = thread::spawn(move || {
                    let _ = std::io::copy(&mut d2, &mut u2);
                    let _ = u2.shutdown(std::net::Shutdown::Write);
                });
                let _ = std::io::copy(&mut up, &mut down);
                let _ = down.shutdown(std::net::Shutdown::Write);
                let _ = t.join();
            });
        }
    });
    addr
}

/// GET /healthz at `addr`: the status, or why there was none.
fn probe(addr: std::net::SocketAddr) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {text:?}")))
}
