//! Listener safety with real processes: a second server cannot join the
//! first one's TCP ports or take over its unix sockets; unix socket files
//! get their mode before anyone connects, replace only stale sockets and go
//! away on SIGTERM; a malformed CONNECT authority is answered 400 without a
//! dial.

use crate::support;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::*;

/// Starts a server that is expected to fail; its exit status and log.
fn start_failing(env: &Env, binds: &Binds, extra: &[&str]) -> (bool, String) {
    let certs = env.certs().display().to_string();
    let (cmd, n, _, _) = Server::command(env, &["--certs-dir", &certs], binds, extra);
    let mut p = Proc::spawn(cmd, env.path(&format!("failing-{n}.log")));
    let exited = p.wait_exit(Duration::from_secs(10));
    let failed = exited.is_some_and(|s| !s.success());
    (failed, p.log_text())
}

fn dials(server: &Server) -> f64 {
    ["success", "failure", "timeout", "no_agent"]
        .iter()
        .map(|r| server.metric(&format!("edgetunnel_dials_total{{result=\"{r}\"}}")))
        .sum()
}

#[test]
fn second_server_on_the_same_ports_fails_and_the_first_keeps_every_dial() {
    let env = Env::new();
    let port = |_| format!("127.0.0.1:{}", free_port());
    let first = Binds {
        agent: port(0),
        connect: port(1),
        grpc: port(2),
        admin: port(3),
        ..Binds::default()
    };
    // Two workers, so the TCP listeners are SO_REUSEPORT groups.
    let server = Server::start_at(&env, &first, &["--workers", "2"]);
    let _agent = Agent::start(&env, server.agent, "a1", "", &[]);
    let echo = echo_server("127.0.0.1");
    let target = echo.addr.to_string();

    let cases = [
        (
            "agent",
            Binds {
                agent: first.agent.clone(),
                ..Binds::default()
            },
        ),
        (
            "connect",
            Binds {
                connect: first.connect.clone(),
                ..Binds::default()
            },
        ),
        (
            "grpc",
            Binds {
                grpc: first.grpc.clone(),
                ..Binds::default()
            },
        ),
        (
            "admin",
            Binds {
                admin: first.admin.clone(),
                ..Binds::default()
            },
        ),
    ];
    for (what, binds) in cases {
        let (failed, log) = start_failing(&env, &binds, &["--workers", "2"]);
        // Whatever the second one did, every dial still reaches the agent.
        for i in 0..40 {
            let (status, body, _s) = connect_tcp(server.connect, &target);
            assert_eq!(status, 200, "{what}: dial {i} answered {status}: {body}");
        }
        assert_eq!(http_get(server.admin, "/healthz").0, 200, "{what}");
        assert!(failed, "a second server on the {what} port started:\n{log}");
        // The message names the listener that could not be bound.
        assert!(
            log.contains(&format!("{what} listener: binding ")) && log.contains("address in use"),
            "{what}:\n{log}"
        );
    }
    let grpc_port = first.grpc.rsplit(':').next().unwrap();
    let (_, log) = start_failing(&env, &first, &[]);
    assert!(
        log.contains(&format!(
            "agent listener: binding {}: address in use",
            first.agent
        )),
        "{log}"
    );
    assert!(
        !log.contains(grpc_port),
        "fails at the first listener:\n{log}"
    );
}

#[test]
fn agent_health_port_in_use_fails_clearly() {
    let env = Env::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut cmd = Command::new(BIN);
    cmd.arg("agent").arg("--certs-dir").arg(env.certs()).args([
        "--server-addr",
        "127.0.0.1:1",
        "--health-bind",
        &addr,
    ]);
    let mut p = Proc::spawn(cmd, env.path("agent.log"));
    let exit = p.wait_exit(Duration::from_secs(10));
    assert!(exit.is_some_and(|s| !s.success()), "{}", p.log_text());
    let want = format!("health listener: binding {addr}: address in use");
    assert!(p.log_text().contains(&want), "{}", p.log_text());
}

#[test]
fn a_regular_file_at_the_socket_path_is_left_alone() {
    let env = Env::new();
    let path = env.path("precious.txt");
    std::fs::write(&path, b"keep me").unwrap();
    let binds = Binds {
        connect_uds: Some(path.clone()),
        ..Binds::default()
    };
    let (failed, log) = start_failing(&env, &binds, &[]);
    assert!(failed, "{log}");
    assert!(
        log.contains(&format!(
            "connect-uds listener: binding {}: the path exists and is not a socket",
            path.display()
        )),
        "{log}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
}

#[test]
fn a_live_servers_socket_is_not_stolen() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "a1", "", &[]);
    let echo = echo_server("127.0.0.1");
    for uds in [&server.connect_uds, &server.grpc_uds] {
        let binds = Binds {
            connect_uds: Some(uds.clone()),
            ..Binds::default()
        };
        let (failed, log) = start_failing(&env, &binds, &[]);
        assert!(failed, "{log}");
        assert!(log.contains("address in use"), "{log}");
    }
    let (status, body, s) = connect_unix(&server.connect_uds, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}");
    assert_eq!(echo_roundtrip(s, b"still mine"), b"still mine");
}

#[test]
fn a_stale_socket_is_replaced_but_not_with_keep_existing_uds() {
    let env = Env::new();
    let stale = env.path("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(std::fs::symlink_metadata(&stale)
        .unwrap()
        .file_type()
        .is_socket());

    let binds = Binds {
        connect_uds: Some(stale.clone()),
        ..Binds::default()
    };
    let (failed, log) = start_failing(&env, &binds, &["--keep-existing-uds"]);
    assert!(failed, "{log}");
    assert!(log.contains("address in use"), "{log}");

    let server = Server::start_at(&env, &binds, &[]);
    let _agent = Agent::start(&env, server.agent, "a1", "", &[]);
    let echo = echo_server("127.0.0.1");
    let (status, body, _s) = connect_unix(&stale, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}");
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn sockets_get_their_mode_and_are_removed_on_sigterm() {
    let env = Env::new();
    let mut server = Server::start(&env, &[]);
    assert_eq!(mode(&server.connect_uds), 0o600);
    assert_eq!(mode(&server.grpc_uds), 0o600);
    server.proc.signal(libc::SIGTERM);
    let exit = server.proc.wait_exit(Duration::from_secs(10));
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
    for p in [&server.connect_uds, &server.grpc_uds] {
        assert!(!p.exists(), "{} left behind", p.display());
    }

    let mut wide = Server::start(&env, &["--uds-mode", "0660"]);
    assert_eq!(mode(&wide.connect_uds), 0o660);
    assert_eq!(mode(&wide.grpc_uds), 0o660);
    wide.proc.signal(libc::SIGINT);
    assert!(wide.proc.wait_exit(Duration::from_secs(10)).is_some());
    assert!(!wide.connect_uds.exists());
}

#[test]
fn malformed_connect_authorities_get_400_and_no_dial() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "a1", "", &[]);
    let echo = echo_server("127.0.0.1");
    let long_label = format!("{}.example:80", "a".repeat(64));
    let long_host = format!("{}:80", ["abcdefghij"; 24].join("."));
    let port = echo.addr.port();
    let targets = [
        "[::1".to_string(),
        "[::1]".to_string(),
        "127.0.0.1:0".to_string(),
        "127.0.0.1:65536".to_string(),
        "127.0.0.1".to_string(),
        format!(":{port}"),
        format!("a@127.0.0.1:{port}"),
        format!("127.0.0.1\x01:{port}"),
        long_label,
        long_host,
    ];
    for t in &targets {
        let (status, body, _s) = connect_tcp(server.connect, t);
        assert_eq!(status, 400, "{t:?}: {body}");
    }
    assert_eq!(dials(&server), 0.0, "{}", server.metrics());

    for t in [echo.addr.to_string(), format!("localhost:{port}")] {
        let (status, body, s) = connect_tcp(server.connect, &t);
        assert_eq!(status, 200, "{t}: {body}");
        assert_eq!(echo_roundtrip(s, b"ok"), b"ok");
    }
    assert_eq!(dials(&server), 2.0);
}

#[test]
fn connect_to_ipv6_literal_still_works() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    }
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "a1", "", &[]);
    let echo = echo_server("::1");
    let (status, body, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}");
    assert_eq!(echo_roundtrip(s, b"v6"), b"v6");
}
