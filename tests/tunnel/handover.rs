//! Listener handover (`--handover-socket`): a new server started with the
//! same flags takes the running one's listening sockets, the old one stops
//! accepting, tells its agents, and drains. Under a steady load of dials
//! through the TCP and unix CONNECT frontends, three handovers in a row
//! must fail no dial, never leave a socket path missing, and keep every
//! tunnel open at the handover whole until it ends.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::*;

/// One CONNECT tunnel: the answer, then 1 KiB echoed. Any failure is the
/// dial's failure, described.
fn one_dial(mut s: impl Read + Write, target: &str, tag: u8) -> Result<(), String> {
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            Ok(_) => {
                return Err(format!(
                    "closed in the answer: {:?}",
                    String::from_utf8_lossy(&head)
                ))
            }
            Err(e) => return Err(format!("answer: {e}")),
        }
        if head.len() > 4096 {
            return Err("answer too long".into());
        }
    }
    let head = String::from_utf8_lossy(&head);
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "answer: {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    let data = vec![tag; 1024];
    s.write_all(&data).map_err(|e| format!("send: {e}"))?;
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back).map_err(|e| format!("echo: {e}"))?;
    if back != data {
        return Err("echo differs".into());
    }
    Ok(())
}

/// Dials in a loop until `stop`, through `via` (TCP address or socket
/// path), counting successes and keeping every failure's description.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

enum Via {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

impl Load {
    fn start(vias: Vec<Via>, target: String) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = vias
            .into_iter()
            .enumerate()
            .map(|(i, via)| {
                let (stop, ok, failures, target) =
                    (stop.clone(), ok.clone(), failures.clone(), target.clone());
                thread::spawn(move || {
                    let mut n = 0u32;
                    while !stop.load(Ordering::SeqCst) {
                        n += 1;
                        let tag = (i as u8).wrapping_mul(31).wrapping_add(n as u8);
                        let r = match &via {
                            Via::Tcp(a) => TcpStream::connect(a)
                                .map_err(|e| format!("connect {a}: {e}"))
                                .and_then(|s| {
                                    s.set_read_timeout(Some(WAIT)).unwrap();
                                    one_dial(s, &target, tag)
                                }),
                            Via::Unix(p) => UnixStream::connect(p)
                                .map_err(|e| format!("connect {}: {e}", p.display()))
                                .and_then(|s| {
                                    s.set_read_timeout(Some(WAIT)).unwrap();
                                    one_dial(s, &target, tag)
                                }),
                        };
                        match r {
                            Ok(()) => {
                                ok.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => failures.lock().unwrap().push(e),
                        }
                        // About 50 dials a second over the threads.
                        thread::sleep(Duration::from_millis(60));
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failures,
            threads,
        }
    }

    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::SeqCst), failures)
    }
}

/// Watches that `paths` exist, every millisecond, until stopped: the
/// number of looks that found one missing.
fn watch_paths(paths: Vec<PathBuf>, stop: Arc<AtomicBool>) -> thread::JoinHandle<usize> {
    thread::spawn(move || {
        let mut missing = 0;
        while !stop.load(Ordering::SeqCst) {
            missing += paths.iter().filter(|p| !Path::new(p).exists()).count();
            thread::sleep(Duration::from_millis(1));
        }
        missing
    })
}

/// A tunnel that still carries bytes both ways.
fn still_echoes(s: &mut (impl Read + Write), tag: u8) {
    let data = vec![tag; 64 * 1024];
    s.write_all(&data).unwrap();
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back)
        .expect("echo through the held tunnel");
    assert_eq!(back, data);
}

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
    let binds = Binds {
        agent: server.agent.to_string(),
        connect: server.connect.to_string(),
        grpc: server.grpc.to_string(),
        admin: server.admin.to_string(),
        connect_uds: Some(server.connect_uds.clone()),
        grpc_uds: Some(server.grpc_uds.clone()),
    };
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
    let load = Load::start(
        vec![
            Via::Tcp(server.connect),
            Via::Tcp(server.connect),
            Via::Unix(server.connect_uds.clone()),
            Via::Unix(server.connect_uds.clone()),
        ],
        target.clone(),
    );
    thread::sleep(Duration::from_millis(500));

    for round in 1..=3u8 {
        // A tunnel open across the handover, on the old server.
        let (status, _, mut held) = connect_unix(&binds.connect_uds.clone().unwrap(), &target);
        assert_eq!(status, 200);
        still_echoes(&mut held, round);
        let before = load.ok.load(Ordering::SeqCst);

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
        let deadline = Instant::now() + WAIT;
        while load.ok.load(Ordering::SeqCst) < before + 20 {
            assert!(Instant::now() < deadline, "round {round}: dials stopped");
            thread::sleep(Duration::from_millis(20));
        }
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
    eprintln!(
        "{ok} dials through three handovers, {} failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} dials failed: {:?}\n--- server:\n{}\n--- agent:\n{}",
        failures.len(),
        ok + failures.len(),
        &failures[..failures.len().min(10)],
        server.proc.log_text(),
        agent.proc.log_text()
    );
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
