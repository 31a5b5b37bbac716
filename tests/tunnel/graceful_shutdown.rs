//! Graceful server shutdown (`--graceful-shutdown-timeout-secs`, ANP's
//! `--graceful-shutdown-timeout`): on SIGTERM the listeners close at once,
//! `/readyz` fails, agents are told (GOAWAY and DRAIN: edgetunnel's agents
//! connect again for new dials), open tunnels go on until they finish or
//! the timeout passes, then the server exits.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::*;

/// A tunnel that still carries bytes both ways.
fn still_echoes(s: &mut (impl Read + Write), tag: u8) {
    let data = vec![tag; 10_000];
    s.write_all(&data).unwrap();
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back)
        .expect("echo through the open tunnel");
    assert_eq!(back, data);
}

/// Waits for the server to exit; how long it took from `since`.
fn exit_time(server: &mut Server, since: Instant, limit: Duration) -> Duration {
    let status = server.proc.wait_exit(limit);
    assert!(
        status.is_some(),
        "server still running after {limit:?}:\n{}",
        server.proc.log_text()
    );
    since.elapsed()
}

#[test]
fn draining_server_finishes_open_tunnels_and_refuses_new_callers() {
    let env = Env::new();
    let mut server = Server::start(&env, &["--graceful-shutdown-timeout-secs", "20"]);
    let (agent, agent_admin) =
        Agent::start_with_admin(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let (status, _, mut tunnel) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    let (status, _, mut uds_tunnel) = connect_unix(&server.connect_uds, &echo.addr.to_string());
    assert_eq!(status, 200);
    still_echoes(&mut tunnel, 1);
    assert_eq!(http_get(server.admin, "/readyz").0, 200);

    server.proc.signal(libc::SIGTERM);
    let t0 = Instant::now();
    // New callers are refused (the listeners are closed at once; polled
    // for up to WAIT, as a loaded machine may be slow to run the handler) ...
    let mut refused = false;
    while t0.elapsed() < WAIT {
        if TcpStream::connect(server.connect).is_err() && TcpStream::connect(server.grpc).is_err() {
            refused = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(refused, "frontends still accept after SIGTERM");
    assert!(
        TcpStream::connect(server.agent).is_err(),
        "agent listener open"
    );
    // ... readiness fails while health and metrics still answer ...
    let (code, body) = http_get(server.admin, "/readyz");
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("shutting down"), "{body}");
    assert!(server.metrics().contains("edgetunnel_open_connections 2"));
    // ... the agent heard of it ...
    wait_metric_at(
        agent_admin,
        "edgetunnel_agent_server_drains_total",
        &agent.proc,
        |v| v >= 1.0,
    );
    // ... and the open tunnels keep working.
    still_echoes(&mut tunnel, 2);
    still_echoes(&mut uds_tunnel, 3);
    std::thread::sleep(Duration::from_millis(500));
    still_echoes(&mut tunnel, 4);
    assert!(
        server.proc.wait_exit(Duration::ZERO).is_none(),
        "exited early"
    );

    // The last tunnel's end lets the server exit, long before the 20 s
    // timeout: within 10 s shows it did not wait for the timeout (it takes
    // well under a second; the 10 s more are the margin for a loaded
    // machine).
    drop(tunnel);
    drop(uds_tunnel);
    let closed = Instant::now();
    let took = exit_time(&mut server, closed, Duration::from_secs(15));
    assert!(
        took < Duration::from_secs(10),
        "exit {took:?} after the last tunnel"
    );
    let log = server.proc.log_text();
    assert!(log.contains("drained: no tunnel left"), "{log}");
    // The unix sockets are gone with the server.
    assert!(!server.connect_uds.exists() && !server.grpc_uds.exists());
}

#[test]
fn drain_timeout_ends_what_is_left() {
    let env = Env::new();
    let mut server = Server::start(&env, &["--graceful-shutdown-timeout-secs", "1.5"]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let (status, _, mut tunnel) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    still_echoes(&mut tunnel, 1);
    server.proc.signal(libc::SIGTERM);
    let t0 = Instant::now();
    // The timeout under test is 1.5 s: not before it (less 0.2 s for the
    // signal's way), and within 5 s (3.5 s of margin: closing what is left
    // and exiting take milliseconds).
    let took = exit_time(&mut server, t0, Duration::from_secs(10));
    assert!(
        took >= Duration::from_millis(1300) && took < Duration::from_secs(5),
        "exit after {took:?} with a 1.5 s timeout"
    );
    assert!(server
        .proc
        .log_text()
        .contains("graceful shutdown timed out"));
    // The caller's connection ended with the server.
    tunnel
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 16];
    assert!(matches!(tunnel.read(&mut b), Ok(0) | Err(_)));

    // A second signal cuts the wait short.
    let mut server = Server::start(&env, &["--graceful-shutdown-timeout-secs", "30"]);
    let _agent = Agent::start(&env, server.agent, "node2", "host=node2", &[]);
    let (status, _, _tunnel) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    server.proc.signal(libc::SIGTERM);
    // The first signal handled (two signals sent before the first is
    // taken would arrive as one).
    server.proc.wait_log("draining: listeners closed");
    assert!(server.proc.wait_exit(Duration::ZERO).is_none());
    server.proc.signal(libc::SIGTERM);
    let t0 = Instant::now();
    // Against the 30 s timeout: within 10 s shows the second signal cut
    // the wait short (it takes milliseconds; the rest is margin).
    let took = exit_time(&mut server, t0, Duration::from_secs(15));
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn without_a_timeout_the_server_exits_at_once() {
    let env = Env::new();
    let mut server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let (status, _, _tunnel) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    server.proc.signal(libc::SIGTERM);
    let t0 = Instant::now();
    // No timeout: the open tunnel is not waited for. Exiting takes
    // milliseconds; 5 s is the margin for a loaded machine.
    let took = exit_time(&mut server, t0, Duration::from_secs(10));
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// A rolling update: the old server drains, a new one starts on the same
/// agent port; the agent connects to the new one at once for new dials
/// while its tunnel through the old one goes on.
#[test]
fn agent_moves_new_dials_to_the_replacement_server() {
    let env = Env::new();
    let port = free_port();
    let agent_bind = format!("127.0.0.1:{port}");
    let mut old = Server::start_on(
        &env,
        &agent_bind,
        &[
            "--graceful-shutdown-timeout-secs",
            "20",
            "--server-id",
            "old",
        ],
    );
    let agent = Agent::start(&env, old.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let (status, _, mut tunnel) = connect_tcp(old.connect, &echo.addr.to_string());
    assert_eq!(status, 200);

    old.proc.signal(libc::SIGTERM);
    let deadline = Instant::now() + WAIT;
    while TcpStream::connect(old.agent).is_ok() {
        assert!(Instant::now() < deadline, "old agent listener still open");
        std::thread::sleep(Duration::from_millis(20));
    }
    let new = Server::start_on(&env, &agent_bind, &["--server-id", "new"]);
    // The agent's replacement connection reaches the new server.
    let l = agent
        .proc
        .wait_line_any(&["CONNECTED 127.0.0.1"], Duration::from_secs(20));
    assert!(l.ends_with(" new"), "{l}");
    new.wait_metric("edgetunnel_agents_connected", 1.0);
    let (status, _, mut fresh) = connect_tcp(new.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    still_echoes(&mut fresh, 5);
    // The old tunnel still runs through the old server.
    still_echoes(&mut tunnel, 6);
    drop(tunnel);
    let t0 = Instant::now();
    exit_time(&mut old, t0, Duration::from_secs(10));
    // The agent keeps one connection (to the new server), not two.
    std::thread::sleep(Duration::from_millis(500));
    still_echoes(&mut fresh, 7);
    let (status, _, mut again) = connect_tcp(new.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    still_echoes(&mut again, 8);
}
