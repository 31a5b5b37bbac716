//! End to end on loopback: real `edgetunnel server` and `agent` processes,
//! real TLS, real targets and clients.

use crate::support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

const SIZES: [usize; 7] = [
    1,
    100,
    16 * 1024,
    64 * 1024 + 1,
    1 << 20,
    7 * 1024 * 1024 + 3,
    64 << 20,
];

#[test]
fn payloads_roundtrip_through_connect_over_tcp_and_unix() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(
        &env,
        server.agent,
        "node1",
        "host=node1&ipv4=127.0.0.1",
        &[],
    );
    let echo = echo_server("127.0.0.1");
    let target = echo.addr.to_string();
    for (i, &size) in SIZES.iter().enumerate() {
        let data = random_bytes(size, i as u64);
        let (status, body, s) = connect_tcp(server.connect, &target);
        assert_eq!(status, 200, "{body}");
        assert!(
            echo_roundtrip(s, &data) == data,
            "TCP frontend corrupted {size} bytes"
        );
        let (status, body, s) = connect_unix(&server.connect_uds, &target);
        assert_eq!(status, 200, "{body}");
        assert!(
            echo_roundtrip(s, &data) == data,
            "unix frontend corrupted {size} bytes"
        );
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
    assert!(
        server.metric("edgetunnel_bytes_total{direction=\"to_agent\"}")
            >= (2 * SIZES.iter().sum::<usize>()) as f64
    );
}

#[test]
fn thousand_concurrent_connections() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let target = echo.addr.to_string();
    // Open all 1,000 first, then exchange data on all of them.
    let mut streams = Vec::new();
    for _ in 0..1000 {
        let (status, body, s) = connect_tcp(server.connect, &target);
        assert_eq!(status, 200, "{body}");
        streams.push(s);
    }
    server.wait_metric("edgetunnel_open_connections", 1000.0);
    let handles: Vec<_> = streams
        .chunks(100)
        .map(|c| c.iter().map(|s| s.try_clone().unwrap()).collect::<Vec<_>>())
        .enumerate()
        .map(|(t, group)| {
            thread::spawn(move || {
                for (i, mut s) in group.into_iter().enumerate() {
                    let data = random_bytes(4096, (t * 1000 + i) as u64);
                    s.write_all(&data).unwrap();
                    let mut got = vec![0; data.len()];
                    s.read_exact(&mut got).unwrap();
                    assert_eq!(got, data);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    drop(streams);
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

#[test]
fn half_close_delivers_the_whole_answer() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    // Target: read until EOF, then answer with the byte count and close.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = l.local_addr().unwrap().to_string();
    thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        let reply = format!("got {} bytes", all.len());
        s.write_all(reply.as_bytes()).unwrap();
    });
    let (status, _, mut s) = connect_tcp(server.connect, &target);
    assert_eq!(status, 200);
    s.write_all(&vec![1u8; 300_000]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "got 300000 bytes");
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

/// A target that reads until its peer finishes, then stays silent and
/// open until asked (on the returned sender) whether its connection is
/// gone: it writes until a write fails or for up to [`WAIT`]; the answer
/// is whether a write failed (a closed peer answers a write with RST, and
/// the next write fails).
fn silent_target() -> (
    std::net::SocketAddr,
    std::sync::mpsc::Sender<()>,
    std::sync::mpsc::Receiver<bool>,
) {
    let (ask_tx, ask_rx) = std::sync::mpsc::channel::<()>();
    let (answer_tx, answer_rx) = std::sync::mpsc::channel();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        if ask_rx.recv().is_ok() {
            // The agent may take a moment to hear of the close (more on a
            // loaded machine): ask until a write fails.
            let deadline = Instant::now() + WAIT;
            let failed = loop {
                let r = s.write_all(b"x");
                if r.is_err() {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                thread::sleep(Duration::from_millis(50));
            };
            let _ = answer_tx.send(failed);
        }
    });
    (addr, ask_tx, answer_rx)
}

/// A caller that finishes (half-close) while its target stays silent and
/// open: the tunnel is closed after the idle linger, on both sides, instead
/// of lingering in CLOSE-WAIT / FIN-WAIT-2 for ever.
#[test]
fn half_closed_tunnel_to_a_silent_target_is_released_by_the_linger() {
    let env = Env::new();
    // Only the server lingers briefly: the agent's default (30 s) shows the
    // server's linger alone releases both ends.
    let server = Server::start(&env, &["--half-close-linger-secs", "1"]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let (target, ask, closed_at_target) = silent_target();
    let (status, _, mut s) = connect_tcp(server.connect, &target.to_string());
    assert_eq!(status, 200);
    s.write_all(b"request").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let finished = Instant::now();
    server.wait_metric("edgetunnel_open_connections", 1.0);
    // The client sees the tunnel end (EOF), the target sees its peer gone.
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("tunnel closed within 10 s");
    let closed = finished.elapsed();
    println!("client EOF after {closed:?}");
    assert!(
        closed >= Duration::from_millis(900),
        "closed before the linger: {closed:?}"
    );
    server.wait_metric("edgetunnel_open_connections", 0.0);
    // The agent closed the target's connection too (its default linger is
    // 30 s: only the server's close can have done it).
    ask.send(()).unwrap();
    assert!(
        closed_at_target
            .recv_timeout(WAIT + Duration::from_secs(5))
            .unwrap(),
        "the target's connection is still open at the agent"
    );

    // The other way round: the target finishes, the caller stays silent;
    // an agent with a short linger releases it too, and data flowing keeps
    // a half-closed tunnel alive past the linger.
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(
        &env,
        server.agent,
        "node1",
        "host=node1",
        &["--half-close-linger-secs", "1"],
    );
    // Target: says hello, closes its sending side, then reads for ever.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = l.local_addr().unwrap().to_string();
    let got = Arc::new(AtomicUsize::new(0));
    let got_t = got.clone();
    thread::spawn(move || {
        let (mut t, _) = l.accept().unwrap();
        t.write_all(b"hello").unwrap();
        t.shutdown(Shutdown::Write).unwrap();
        let mut buf = [0u8; 4096];
        while let Ok(n) = t.read(&mut buf) {
            if n == 0 {
                break;
            }
            got_t.fetch_add(n, Ordering::SeqCst);
        }
    });
    let (status, _, mut s) = connect_tcp(server.connect, &target);
    assert_eq!(status, 200);
    let mut hello = [0u8; 5];
    s.read_exact(&mut hello).unwrap();
    // Keep sending for 2.5 s (past the 1 s linger): the tunnel stays. A
    // tick every 50 ms: the test thread would have to stall for 20 ticks
    // (the whole linger) on a loaded machine for the tunnel to look idle.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        s.write_all(b"tick").unwrap();
        thread::sleep(Duration::from_millis(50));
    }
    let sent_until = Instant::now();
    // Then go silent: the tunnel closes about a linger later.
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("tunnel closed within 10 s");
    let idle = sent_until.elapsed();
    println!("silent caller released after {idle:?} idle");
    assert_eq!(got.load(Ordering::SeqCst) % 4, 0);
    assert!(
        got.load(Ordering::SeqCst) >= 4 * 10,
        "ticks reached the target"
    );
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

#[test]
fn refused_target_and_missing_agent_get_anp_status_codes() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    // No agent yet: 500 with ANP's words.
    let (status, body, _) = connect_tcp(server.connect, "127.0.0.1:9");
    assert_eq!(status, 500);
    assert!(body.contains("currently no tunnels available"), "{body}");
    let (status, body, _) = connect_unix(&server.connect_uds, "127.0.0.1:9");
    assert_eq!(status, 500, "{body}");
    assert_eq!(http_get(server.admin, "/readyz").0, 500);
    // Operators who want 503 for "no agent" can have it.
    let server503 = Server::start(&env, &["--no-agent-status", "503"]);
    let (status, body, _) = connect_tcp(server503.connect, "127.0.0.1:9");
    assert_eq!(status, 503);
    assert!(body.contains("currently no tunnels available"), "{body}");

    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    assert_eq!(http_get(server.admin, "/readyz").0, 200);
    // A closed port: the agent's error comes back as 502.
    let (_held, dead) = refused_addr();
    let (status, body, _) = connect_tcp(server.connect, &dead.to_string());
    assert_eq!(status, 502);
    assert!(body.to_lowercase().contains("refused"), "{body}");
    assert_eq!(
        server.metric("edgetunnel_dials_total{result=\"failure\"}"),
        1.0
    );
    assert!(server.metric("edgetunnel_dials_total{result=\"no_agent\"}") >= 2.0);
}

#[test]
fn malformed_and_non_connect_requests_are_refused() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    // A healthy tunnel keeps flowing while garbage arrives elsewhere.
    let (status, _, healthy) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);

    let send = |raw: &[u8]| -> String {
        let mut s = TcpStream::connect(server.connect).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(raw).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    assert!(send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 405"));
    assert!(send(b"\x16\x03\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
    assert!(send(b"CONNECT nohost HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 400"));
    let mut flood = b"CONNECT a:1 HTTP/1.1\r\n".to_vec();
    flood.extend(std::iter::repeat_n(b'x', 64 * 1024));
    assert!(send(&flood).starts_with("HTTP/1.1 431"));
    // Garbage on the agent (TLS) and gRPC listeners just gets closed.
    for addr in [server.agent, server.grpc, server.admin] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let _ = s.write_all(&random_bytes(100_000, 9));
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    let data = random_bytes(1 << 20, 3);
    assert!(echo_roundtrip(healthy, &data) == data);
    assert_eq!(http_get(server.admin, "/healthz").0, 200);
}

#[test]
fn client_disconnect_mid_transfer_closes_the_agent_side() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let (source, ended) = source_server();
    let (status, _, mut s) = connect_tcp(server.connect, &source.to_string());
    assert_eq!(status, 200);
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    while got < 8 << 20 {
        got += s.read(&mut buf).unwrap();
    }
    server.wait_metric("edgetunnel_open_connections", 1.0);
    drop(s);
    server.wait_metric("edgetunnel_open_connections", 0.0);
    // The CLOSE reached the agent: the target's connection ended.
    let deadline = Instant::now() + WAIT;
    while ended.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "target connection was never closed"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn agent_killed_mid_transfer_then_a_new_one_serves() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let mut agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let (source, _) = source_server();
    let (status, _, mut s) = connect_tcp(server.connect, &source.to_string());
    assert_eq!(status, 200);
    let mut buf = vec![0u8; 1 << 20];
    s.read_exact(&mut buf).unwrap();
    agent.proc.signal(libc::SIGKILL);
    agent.proc.wait_exit(WAIT).expect("agent exits");
    // The caller's stream ends (EOF or error) instead of hanging.
    let mut sink = Vec::new();
    if let Err(e) = s.read_to_end(&mut sink) {
        let timed_out = matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        );
        assert!(
            !timed_out,
            "the caller was left hanging after the agent died"
        );
    }
    server.wait_metric("edgetunnel_agents_connected", 0.0);
    server.wait_metric("edgetunnel_open_connections", 0.0);
    assert_eq!(http_get(server.admin, "/healthz").0, 200);
    let _agent2 = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let (status, _, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    assert_eq!(echo_roundtrip(s, b"again"), b"again");
}

#[test]
fn agent_reconnects_after_server_restart() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let agent_addr = server.agent;
    let agent = Agent::start(&env, agent_addr, "node1", "host=node1", &[]);
    drop(server);
    let server = Server::start_on(&env, &agent_addr.to_string(), &[]);
    agent.proc.wait_line("CONNECTED");
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    let echo = echo_server("127.0.0.1");
    let (status, _, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    assert_eq!(echo_roundtrip(s, b"back"), b"back");
}

/// An agent's successful dials to local endpoints.
const AGENT_DIALS_OK: &str = "edgetunnel_agent_dials_total{result=\"success\"}";

#[test]
fn routes_by_host_ip_cidr_and_default_route() {
    let env = Env::new();
    let server = Server::start(&env, &["--proxy-strategies", "destHost,defaultRoute"]);
    let (_a, a) = Agent::start_with_admin(
        &env,
        server.agent,
        "a",
        "host=localhost&ipv4=127.0.0.2",
        &[],
    );
    let (_b, b) = Agent::start_with_admin(
        &env,
        server.agent,
        "b",
        "cidr=127.0.3.0/24&cidr=127.0.0.0/8",
        &[],
    );
    let (_c, c) = Agent::start_with_admin(&env, server.agent, "c", "default-route=true", &[]);
    server.wait_metric("edgetunnel_agents_connected", 3.0);
    // Which agent dialed: the one whose count of successful dials moved
    // (by one, and no other's), read from each agent's /metrics.
    let agents = [("a", a), ("b", b), ("c", c)];
    let dials = || agents.map(|(_, admin)| metric_at(admin, AGENT_DIALS_OK));
    let ta = banner_server("127.0.0.2", "A");
    let tb = banner_server("127.0.3.7", "B");
    let tlocal = banner_server("127.0.0.1", "L");
    let read_all = |addr: &str| {
        let before = dials();
        let (status, body, mut s) = connect_tcp(server.connect, addr);
        assert_eq!(status, 200, "{addr}: {body}");
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        // The agent counts the dial before it answers the server, so
        // before the first byte: no wait.
        let after = dials();
        let moved: Vec<_> = (0..agents.len())
            .filter(|&i| after[i] != before[i])
            .collect();
        assert!(
            moved.len() == 1 && after[moved[0]] == before[moved[0]] + 1.0,
            "{addr}: dials before {before:?}, after {after:?}"
        );
        (out, agents[moved[0]].0)
    };
    let by_name = format!("localhost:{}", tlocal.port());
    // 127.0.0.1 is in b's /8 only; the longest prefix decides for 127.0.3.7.
    let in_wide_cidr = tlocal.to_string();
    for _ in 0..3 {
        assert_eq!(read_all(&ta.to_string()), ("A".to_string(), "a"));
        assert_eq!(read_all(&by_name), ("L".to_string(), "a"));
        assert_eq!(read_all(&tb.to_string()), ("B".to_string(), "b"));
        assert_eq!(read_all(&in_wide_cidr), ("L".to_string(), "b"));
    }
    // Nobody announced ::1 and no cidr holds it: the default-route agent.
    let v6 = std::net::TcpListener::bind("[::1]:0").ok();
    let v6_addr = v6.as_ref().map(|l| l.local_addr().unwrap().to_string());
    if let Some(l) = v6 {
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                let mut s = s;
                let _ = s.write_all(b"V6");
            }
        });
        assert_eq!(
            read_all(v6_addr.as_deref().unwrap()),
            ("V6".to_string(), "c")
        );
    }
    drop(server);

    // destHost alone: an unknown host has no agent.
    let server = Server::start(&env, &["--proxy-strategies", "destHost"]);
    let _a = Agent::start(&env, server.agent, "a", "host=localhost", &[]);
    assert_eq!(read_all_status(&server, &by_name), 200);
    assert_eq!(read_all_status(&server, "elsewhere:80"), 500);
}

fn read_all_status(server: &Server, addr: &str) -> u16 {
    connect_tcp(server.connect, addr).0
}

#[test]
fn draining_agent_gets_no_new_dials_and_exits_when_idle() {
    let env = Env::new();
    // Two workers: agent a holds a link to each, and sends a DRAIN on each.
    let server = Server::start(&env, &["--workers", "2"]);
    let (mut a, a_admin) = Agent::start_with_admin(&env, server.agent, "a", "host=node", &[]);
    server.wait_agent_links(2.0, &a.proc);
    let echo = echo_server("127.0.0.1");
    let target = echo.addr.to_string();
    // The held connection goes through a (the only agent yet).
    let (status, _, mut held) = connect_tcp(server.connect, &target);
    assert_eq!(status, 200);
    let (_b, b_admin) = Agent::start_with_admin(&env, server.agent, "b", "host=node", &[]);
    server.wait_metric("edgetunnel_agents_connected", 2.0);
    // Dials each agent made (its /metrics).
    let dials = |admin| metric_at(admin, "edgetunnel_agent_dials_total{result=\"success\"}");
    assert_eq!(dials(a_admin), 1.0);
    a.proc.signal(libc::SIGTERM);
    // The server saw a's DRAIN on both its links (waiting for the first
    // alone let a dial reach a's other link before its DRAIN came).
    wait_metric_at(
        server.admin,
        "edgetunnel_agent_drains_total",
        &server.proc,
        |v| v >= 2.0,
    );
    // New dials all go to b; the held one on a still works.
    for _ in 0..6 {
        let (status, _, s) = connect_tcp(server.connect, &target);
        assert_eq!(status, 200);
        assert_eq!(echo_roundtrip(s, b"x"), b"x");
    }
    assert_eq!(dials(a_admin), 1.0, "a draining agent got a new dial");
    assert_eq!(dials(b_admin), 6.0);
    held.write_all(b"still").unwrap();
    let mut got = [0u8; 5];
    held.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still");
    drop(held);
    let status = a
        .proc
        .wait_exit(WAIT)
        .expect("drained agent exits once idle");
    assert!(status.success(), "{status:?}");
    server.wait_metric("edgetunnel_agents_connected", 1.0);
}

#[test]
fn legacy_epoll_driver_works_end_to_end() {
    let env = Env::new();
    let server = Server::start(&env, &["--driver", "legacy"]);
    let _agent = Agent::start(
        &env,
        server.agent,
        "node1",
        "host=node1",
        &["--driver", "legacy"],
    );
    server.proc.wait_log("driver=\"epoll\"");
    let echo = echo_server("127.0.0.1");
    let data = random_bytes(3 << 20, 1);
    let (status, _, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    assert!(echo_roundtrip(s, &data) == data);
}

#[test]
fn single_worker_and_cross_core_handoff() {
    // With 2 workers, an agent lives on one core and CONNECTs land on both:
    // half of them are handed off; all must work.
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "2"]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    for i in 0..50 {
        let (status, _, s) = connect_tcp(server.connect, &echo.addr.to_string());
        assert_eq!(status, 200);
        let data = random_bytes(10_000, i);
        assert!(echo_roundtrip(s, &data) == data);
    }
}

#[test]
fn dial_timeout_answers_504() {
    let env = Env::new();
    let server = Server::start(&env, &["--dial-timeout-secs", "0.5"]);
    // The agent's own dial timeout is longer than the server's.
    let _agent = Agent::start(
        &env,
        server.agent,
        "node1",
        "host=node1",
        &["--dial-timeout-secs", "10"],
    );
    // A loopback listener that never accepts, with its queue filled: further
    // SYNs are dropped, so the agent's connect hangs.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    sock.listen(0).unwrap();
    let addr = sock.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&addr.into());
        fillers.push(s);
    }
    thread::sleep(Duration::from_millis(100));
    let (status, body, _) = connect_tcp(server.connect, &addr.to_string());
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("timeout"), "{body}");
    assert_eq!(
        server.metric("edgetunnel_dials_total{result=\"timeout\"}"),
        1.0
    );
    server.wait_metric("edgetunnel_pending_dials", 0.0);
}

#[test]
fn agent_serves_several_servers_and_honours_server_count() {
    let env = Env::new();
    let s1 = Server::start(&env, &["--server-id", "one"]);
    let s2 = Server::start(&env, &["--server-id", "two", "--server-count", "2"]);
    let (agent, admin) = Agent::start_with_admin(
        &env,
        s1.agent,
        "multi",
        "host=node1",
        &["--server-addr", &s2.agent.to_string()],
    );
    s1.wait_metric("edgetunnel_agents_connected", 1.0);
    s2.wait_metric("edgetunnel_agents_connected", 1.0);
    let echo = echo_server("127.0.0.1");
    for server in [&s1, &s2] {
        // The agent's second slot to s2 keeps reconnecting and is closed
        // as a duplicate each time; a dial that lands on it in that moment
        // is routed again to the other slot, so every dial succeeds.
        for _ in 0..20 {
            let (status, body, s) = connect_tcp(server.connect, &echo.addr.to_string());
            assert_eq!(status, 200, "{body}");
            assert_eq!(echo_roundtrip(s, b"hi"), b"hi");
        }
        let (status, body, s) = connect_tcp(server.connect, &echo.addr.to_string());
        assert_eq!(status, 200, "{body}");
        assert_eq!(echo_roundtrip(s, b"hi"), b"hi");
    }
    // s2 says two servers share its address; both slots reach the same
    // serverID, so the duplicate is dropped (as ANP's agent does).
    thread::sleep(Duration::from_millis(500));
    s2.wait_metric("edgetunnel_agents_connected", 1.0);
    // The second slot exists: it reached s2 again and closed that
    // connection as a duplicate, counted by the agent.
    wait_metric_at(
        admin,
        "edgetunnel_agent_server_duplicates_total",
        &agent.proc,
        |n| n >= 1.0,
    );
    // Still one connection to each server.
    assert_eq!(metric_at(admin, "edgetunnel_agent_servers_connected"), 2.0);
}

/// A peer that stops answering (frozen with SIGSTOP, its TCP connection
/// still open) is dropped by the other side's HTTP/2 keepalive PINGs: the
/// server unregisters a silent agent, an agent leaves a silent server (each
/// counts it in `edgetunnel_keepalive_timeouts_total`), and both sides
/// recover once the peer runs again.
#[test]
fn keepalive_drops_a_silent_peer_and_recovers() {
    const SILENT_AGENT: &str = "edgetunnel_keepalive_timeouts_total{peer=\"agent\"}";
    const SILENT_SERVER: &str = "edgetunnel_keepalive_timeouts_total{peer=\"server\"}";
    let env = Env::new();
    let echo = echo_server("127.0.0.1");
    // The server pings every second; the agent would only ping hourly.
    let server = Server::start(&env, &["--keepalive-secs", "1"]);
    let agent = Agent::start(
        &env,
        server.agent,
        "node1",
        "host=node1",
        &["--keepalive-secs", "3600"],
    );
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    assert_eq!(server.metric(SILENT_AGENT), 0.0);
    agent.proc.signal(libc::SIGSTOP);
    server.wait_metric("edgetunnel_agents_connected", 0.0);
    // One per link (with several server workers the agent has several).
    assert!(server.metric(SILENT_AGENT) >= 1.0);
    agent.proc.signal(libc::SIGCONT);
    agent.proc.wait_line("CONNECTED");
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    let (status, body, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}");
    assert_eq!(echo_roundtrip(s, b"back"), b"back");
    drop(agent);

    // Now the agent pings every second and the server is the silent one.
    let (agent, admin) = Agent::start_with_admin(
        &env,
        server.agent,
        "node2",
        "host=node2",
        &["--keepalive-secs", "1"],
    );
    assert_eq!(metric_at(admin, SILENT_SERVER), 0.0);
    server.proc.signal(libc::SIGSTOP);
    wait_metric_at(admin, SILENT_SERVER, &agent.proc, |v| v >= 1.0);
    server.proc.signal(libc::SIGCONT);
    agent.proc.wait_line("CONNECTED");
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    let (status, body, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}");
    assert_eq!(echo_roundtrip(s, b"again"), b"again");
}

/// More than the server's and the agent's shared buffer budgets (64 MiB
/// each) plus every socket buffer on the way.
const PAST_THE_BUDGET: usize = 160 << 20;

/// A target that accepts and never reads (its peer's writes stall).
fn stalled_target() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    addr
}

/// A target that counts what it reads.
fn counting_target() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    let addr = serve_each("127.0.0.1", move |mut s| {
        let mut buf = vec![0u8; 256 * 1024];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            g.fetch_add(n, Ordering::SeqCst);
        }
    });
    (addr, got)
}

/// A source that starts sending, as fast as it can, once its client has
/// sent one byte; counts what it wrote.
fn triggered_source() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let sent = Arc::new(AtomicUsize::new(0));
    let total = sent.clone();
    let addr = serve_each("127.0.0.1", move |mut s| {
        let mut go = [0u8; 1];
        if s.read_exact(&mut go).is_err() {
            return;
        }
        let chunk = vec![7u8; 64 * 1024];
        while s.write_all(&chunk).is_ok() {
            total.fetch_add(chunk.len(), Ordering::SeqCst);
        }
    });
    (addr, sent)
}

/// Waits until `counter` has not moved for `quiet` (the stall is in place:
/// every buffer on the stalled connection's way is full).
fn wait_until_still(counter: &AtomicUsize, quiet: Duration) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (counter.load(Ordering::SeqCst), Instant::now());
    while last.1.elapsed() < quiet {
        assert!(
            Instant::now() < deadline,
            "the stalled connection never stalled"
        );
        thread::sleep(Duration::from_millis(20));
        let now = counter.load(Ordering::SeqCst);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
}

/// Bytes a healthy download (or upload) moves through the agent once
/// another connection's reader has stalled in the same direction (the
/// stalled one fills every buffer it can before the healthy one starts),
/// given `patience` without progress.
fn healthy_bytes_beside_a_stall(upload: bool, agent_flags: &[&str], patience: Duration) -> usize {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", agent_flags);
    let quiet = Duration::from_secs(1);
    if !upload {
        // Both open first: without windows, no dial is answered once the
        // stalled connection has spent the budget.
        let (healthy_source, _) = triggered_source();
        let (stalled_source, stalled_sent) = triggered_source();
        let (status, _, mut healthy) = connect_tcp(server.connect, &healthy_source.to_string());
        assert_eq!(status, 200);
        // This client never reads what its target sends.
        let (status, _, mut stalled_reader) =
            connect_tcp(server.connect, &stalled_source.to_string());
        assert_eq!(status, 200);
        stalled_reader.write_all(b"g").unwrap();
        wait_until_still(&stalled_sent, quiet);
        healthy.write_all(b"g").unwrap();
        healthy.set_read_timeout(Some(patience)).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut downloaded = 0;
        while downloaded < PAST_THE_BUDGET {
            match healthy.read(&mut buf) {
                Ok(n) if n > 0 => downloaded += n,
                _ => break,
            }
        }
        return downloaded;
    }
    let (sink, uploaded) = counting_target();
    let (status, _, mut healthy) = connect_tcp(server.connect, &sink.to_string());
    assert_eq!(status, 200);
    // This target never reads what its client sends.
    let (status, _, mut stalled_writer) =
        connect_tcp(server.connect, &stalled_target().to_string());
    assert_eq!(status, 200);
    stalled_writer
        .set_write_timeout(Some(patience * 4))
        .unwrap();
    let stalled_sent = Arc::new(AtomicUsize::new(0));
    let counter = stalled_sent.clone();
    thread::spawn(move || {
        let chunk = vec![3u8; 64 * 1024];
        while stalled_writer.write_all(&chunk).is_ok() {
            counter.fetch_add(chunk.len(), Ordering::SeqCst);
        }
    });
    wait_until_still(&stalled_sent, quiet);
    healthy.set_write_timeout(Some(patience)).unwrap();
    let chunk = vec![5u8; 1 << 20];
    let mut sent = 0;
    while sent < PAST_THE_BUDGET && healthy.write_all(&chunk).is_ok() {
        sent += chunk.len();
    }
    let mut last = (usize::MAX, Instant::now());
    loop {
        let now = uploaded.load(Ordering::SeqCst);
        if now >= PAST_THE_BUDGET {
            return now;
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > patience {
            return now;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// One tunneled connection whose reader stalls does not hold up another
/// connection through the same agent, in either direction: edgetunnel peers
/// negotiate per-connection windows. Without them (`--no-flow-control`, as
/// with ANP's agent) the healthy connection stops once the stalled one has
/// filled the shared budget, which shows the test tells the two apart.
#[test]
fn stalled_reader_does_not_hold_up_other_connections() {
    for upload in [false, true] {
        let way = if upload { "upload" } else { "download" };
        // Both tunnels on one connection (agent links would otherwise
        // spread them over the server's workers): its windows are tested.
        let one = ["--max-links-per-server", "1"];
        let moved = healthy_bytes_beside_a_stall(upload, &one, Duration::from_secs(20));
        assert!(moved >= PAST_THE_BUDGET, "{way} stalled at {moved} bytes");
        // Without windows, as ANP's agent (one connection too).
        let moved = healthy_bytes_beside_a_stall(
            upload,
            &["--no-flow-control", "--max-links-per-server", "1"],
            Duration::from_secs(3),
        );
        eprintln!("{way}: without windows the healthy connection moved {moved} bytes");
        assert!(
            moved < PAST_THE_BUDGET,
            "without windows the {way} moved {moved} bytes"
        );
    }
}

/// The server's health listener (ANP's `--health-port`) answers /healthz,
/// /readyz and ANP's older /ready, and readiness follows the agents.
#[test]
fn health_listener_reports_readiness_by_agents() {
    let env = Env::new();
    let health: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let server = Server::start(&env, &["--health-bind", &health.to_string()]);
    assert_eq!(http_get(health, "/healthz").0, 200);
    for path in ["/readyz", "/ready"] {
        let (status, body) = http_get(health, path);
        assert_eq!(status, 500, "{path}: {body}");
    }
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    for path in ["/readyz", "/ready"] {
        let (status, body) = http_get(health, path);
        assert_eq!(status, 200, "{path}: {body}");
    }
    assert!(http_get(health, "/metrics")
        .1
        .contains("edgetunnel_agents_connected 1"));
}
