//! The plain interception listener end to end on loopback (no iptables: a
//! client connects to it directly and names the node in Host): an upgraded
//! connection relays both ways, a streamed answer arrives as it is sent,
//! and `--localhost-proxy-ports` makes the agent dial the node's 127.0.0.1.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{random_bytes, refused_addr, Agent, Env, Server};

/// A kubelet stand-in on 127.0.0.1: `/stream` sends one event, waits for
/// the gate to drop, sends another; an Upgrade request gets 101 and an echo.
fn kubelet(gate: Arc<AtomicBool>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                if head.to_ascii_lowercase().contains("connection: upgrade") {
                    w.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n").unwrap();
                    let mut buf = vec![0u8; 65536];
                    loop {
                        match r.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if w.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }
                // Raised before the first event is written: the client may
                // read it before this thread runs again.
                gate.store(true, Ordering::SeqCst);
                w.write_all(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nfirst\n\r\n",
                )
                .unwrap();
                let deadline = Instant::now() + Duration::from_secs(10);
                while gate.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                gate.store(false, Ordering::SeqCst);
                let _ = w.write_all(b"5\r\nlast\n\r\n0\r\n\r\n");
            });
        }
    });
    addr
}

fn interception_addr(server: &Server) -> SocketAddr {
    server.interception.expect("interception listener")
}

#[test]
fn upgrades_streams_and_localhost_ports_through_the_interception_listener() {
    let env = Env::new();
    let gate = Arc::new(AtomicBool::new(false));
    let target = kubelet(gate.clone());
    let port = target.port().to_string();
    let server = Server::start(
        &env,
        &[
            "--interception-bind",
            "127.0.0.1:0",
            "--localhost-proxy-ports",
            &port,
        ],
    );
    // The node announces 127.0.0.2; the kubelet listens on 127.0.0.1 only,
    // so only the localhost-proxy rule can reach it.
    let _agent = Agent::start(
        &env,
        server.agent,
        "edge-1",
        "host=edge-1&ipv4=127.0.0.2",
        &[],
    );
    let at = interception_addr(&server);

    // Upgrade: 101, then 1 MiB echoed byte for byte.
    let mut c = TcpStream::connect(at).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(c, "POST /portForward/ns/pod HTTP/1.1\r\nHost: edge-1:{port}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            c.read(&mut b).unwrap(),
            1,
            "EOF in the 101 head: {}",
            server.proc.log_text()
        );
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let data = random_bytes(1 << 20, 11);
    let mut buf = vec![0u8; 65536];
    for piece in data.chunks(65536) {
        c.write_all(piece).unwrap();
        let mut got = Vec::new();
        while got.len() < piece.len() {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == piece);
    }
    drop(c);

    // Streaming: the first event arrives while the kubelet still holds the
    // rest back.
    let mut c = TcpStream::connect(at).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "GET /containerLogs/ns/pod/c?follow=true HTTP/1.1\r\nHost: edge-1:{port}\r\n\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("first") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        gate.load(Ordering::SeqCst),
        "the first event came only after the kubelet finished"
    );
    gate.store(false, Ordering::SeqCst);
    while !String::from_utf8_lossy(&got).contains("0\r\n\r\n") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).contains("last"));
    // The tracing wrapper logged both exchanges with their status (through
    // the log thread, which a loaded machine may run late).
    let deadline = Instant::now() + support::WAIT;
    loop {
        let log = server.proc.log_text();
        let traced = |path: &str, status: &str| {
            log.lines()
                .any(|l| l.contains("kubelet request") && l.contains(path) && l.contains(status))
        };
        if traced("/portForward/ns/pod", "status=101")
            && traced("/containerLogs/ns/pod/c", "status=200")
        {
            break;
        }
        assert!(Instant::now() < deadline, "exchanges not traced:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Without the localhost rule the node's own address is dialed (and
    // refused): the caller gets an answer, not a hang.
    let (_held, other) = refused_addr();
    let other = other.port();
    let mut c = TcpStream::connect(at).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(c, "GET / HTTP/1.1\r\nHost: edge-1:{other}\r\n\r\n").unwrap();
    let mut reply = String::new();
    let _ = c.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 50"), "{reply:?}");
}
