//! Abnormal tunnel ends are visible to the caller (issue 13): when the
//! agent or the server dies under a tunnel, a CONNECT caller's connection
//! is reset (its read fails with ECONNRESET) instead of ending with a FIN
//! that looks like a complete answer; a clean close by the target still
//! ends with a FIN. Over TCP, over TLS (the TLS relay resets the caller for
//! the tunnel behind its socket pair), and for the server stopping.

use crate::support;

use std::io::{ErrorKind, Read, Write};
use std::time::Duration;

use support::tls_client::{client_tls, tls_connect};
use support::*;

/// How the caller's connection ended: `Ok(())` for a clean FIN, `Err`
/// with the error kind otherwise.
fn end_of(mut s: impl Read) -> Result<(), ErrorKind> {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                panic!("the caller's connection did not end")
            }
            Err(e) => return Err(e.kind()),
        }
    }
}

fn tunnel_through(server: &Server, target: &str) -> std::net::TcpStream {
    let (status, body, mut s) = connect_tcp(server.connect, target);
    assert_eq!(status, 200, "{body}");
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn agent_death_resets_the_caller() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let mut agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let s = tunnel_through(&server, &echo.addr.to_string());
    agent.proc.signal(libc::SIGKILL);
    let _ = agent.proc.wait_exit(Duration::from_secs(5));
    assert_eq!(end_of(s), Err(ErrorKind::ConnectionReset));
}

#[test]
fn clean_target_close_is_a_fin() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let target = banner_server("127.0.0.1", "hello and goodbye\n");
    let (status, _, s) = connect_tcp(server.connect, &target.to_string());
    assert_eq!(status, 200);
    assert_eq!(end_of(s), Ok(()));
}

#[test]
fn server_stopping_resets_open_tunnels() {
    let env = Env::new();
    // Without and with a graceful timeout that runs out.
    for extra in [&[][..], &["--graceful-shutdown-timeout-secs", "0.5"][..]] {
        let mut server = Server::start(&env, extra);
        let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
        let echo = echo_server("127.0.0.1");
        let s = tunnel_through(&server, &echo.addr.to_string());
        server.proc.signal(libc::SIGTERM);
        assert!(server.proc.wait_exit(Duration::from_secs(10)).is_some());
        assert_eq!(end_of(s), Err(ErrorKind::ConnectionReset), "{extra:?}");
    }
}

#[test]
fn agent_death_resets_a_tls_caller() {
    let env = Env::new();
    let c = env.certs();
    let server = Server::start(
        &env,
        &[
            "--frontend-cert",
            c.join("server.crt").to_str().unwrap(),
            "--frontend-key",
            c.join("server.key").to_str().unwrap(),
        ],
    );
    let mut agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let cfg = client_tls(
        &c.join("ca.crt"),
        None,
        b"http/1.1",
        &[&rustls::version::TLS13],
        &[],
    );
    let tls = tls_connect(server.connect, cfg.clone()).unwrap();
    let (status, _, mut tls) = connect_over(tls, &echo.addr.to_string());
    assert_eq!(status, 200);
    tls.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    tls.read_exact(&mut b).unwrap();
    agent.proc.signal(libc::SIGKILL);
    let _ = agent.proc.wait_exit(Duration::from_secs(5));
    assert_eq!(end_of(tls), Err(ErrorKind::ConnectionReset));

    // A clean close over TLS is close_notify and FIN.
    let _agent = Agent::start(&env, server.agent, "node2", "host=node2", &[]);
    let target = banner_server("127.0.0.1", "bye\n").to_string();
    let tls = tls_connect(server.connect, cfg).unwrap();
    let (status, _, tls) = connect_over(tls, &target);
    assert_eq!(status, 200);
    assert_eq!(end_of(tls), Ok(()));
}

/// A target that reads four bytes, then resets its connection.
fn resetting_target() -> std::net::SocketAddr {
    serve_each("127.0.0.1", |mut s| {
        let mut b = [0u8; 4];
        let _ = s.read_exact(&mut b);
        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    })
}

#[test]
fn target_reset_resets_the_caller() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let target = resetting_target();
    let (status, _, mut s) = connect_tcp(server.connect, &target.to_string());
    assert_eq!(status, 200);
    s.write_all(b"ping").unwrap();
    assert_eq!(end_of(s), Err(ErrorKind::ConnectionReset));
}

#[test]
fn server_death_resets_the_target() {
    let env = Env::new();
    let mut server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let (tx, rx) = std::sync::mpsc::channel();
    let target = serve_each("127.0.0.1", move |mut s| {
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = tx.send(end_of(s));
    });
    let _s = tunnel_through(&server, &target.to_string());
    server.proc.signal(libc::SIGKILL);
    let _ = server.proc.wait_exit(Duration::from_secs(5));
    let end = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("target saw an end");
    assert_eq!(end, Err(ErrorKind::ConnectionReset));
}

/// The interception listener (its tunnels run behind a socket pair, for
/// the request tracing): the agent's death resets the intercepted caller.
#[test]
fn agent_death_resets_an_intercepted_caller() {
    let env = Env::new();
    let server = Server::start(&env, &["--interception-bind", "127.0.0.1:0"]);
    let mut agent = Agent::start(
        &env,
        server.agent,
        "edge-1",
        "host=edge-1&ipv4=127.0.0.1",
        &[],
    );
    let echo = echo_server("127.0.0.1");
    let at = server.interception.expect("interception listener");
    let mut c = std::net::TcpStream::connect(at).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "GET / HTTP/1.1\r\nHost: edge-1:{}\r\n\r\n",
        echo.addr.port()
    );
    c.write_all(req.as_bytes()).unwrap();
    let mut back = vec![0u8; req.len()];
    c.read_exact(&mut back).expect("the request echoed back");
    agent.proc.signal(libc::SIGKILL);
    let _ = agent.proc.wait_exit(Duration::from_secs(5));
    assert_eq!(end_of(c), Err(ErrorKind::ConnectionReset));
}
