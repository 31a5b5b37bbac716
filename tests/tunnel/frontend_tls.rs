//! TLS on the TCP frontends (ANP's `--server-cert/--server-key/
//! --server-ca-cert`, edgetunnel's `--frontend-cert/--frontend-key/
//! --frontend-ca`), as kube-apiserver's egress configuration with
//! `transport.tcp.tlsConfig` uses them:
//!
//! * HTTP CONNECT over TLS with a client certificate carries bytes; no
//!   certificate, one from another CA, or plaintext gets no tunnel and no
//!   dial reaches the agent;
//! * gRPC `ProxyService` over TLS with grpcio (an independent TLS and
//!   HTTP/2 stack) carries bytes, and is refused without a certificate;
//! * `--tls-min-version` and `--cipher-suites` hold on the frontend and on
//!   the agent listener;
//! * ANP's README mTLS quick start (`proxy-server --server-ca-cert ...`,
//!   both modes), verbatim apart from ports and paths, carries traffic.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use support::tls_client::{client_tls, tls_connect};
use support::*;

struct Setup {
    env: Env,
    server: Server,
    _agent: Agent,
    echo: Echo,
}

fn setup(extra: &[&str]) -> Setup {
    let env = Env::new();
    let c = env.certs();
    let (cert, key, ca) = (c.join("server.crt"), c.join("server.key"), c.join("ca.crt"));
    let mut args: Vec<&str> = vec![
        "--frontend-cert",
        cert.to_str().unwrap(),
        "--frontend-key",
        key.to_str().unwrap(),
        "--frontend-ca",
        ca.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let server = Server::start(&env, &args);
    let agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    Setup {
        env,
        server,
        _agent: agent,
        echo,
    }
}

impl Setup {
    fn ca(&self) -> std::path::PathBuf {
        self.env.certs().join("ca.crt")
    }

    fn client_cert(&self) -> (std::path::PathBuf, std::path::PathBuf) {
        let c = self.env.certs();
        (c.join("proxy-client.crt"), c.join("proxy-client.key"))
    }

    fn dials(&self) -> f64 {
        dial_count(&self.server)
    }
}

/// Dials the server sent to agents, whatever their outcome.
fn dial_count(server: &Server) -> f64 {
    server
        .metrics()
        .lines()
        .filter(|l| l.starts_with("edgetunnel_dials_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const TLS_BOTH: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

#[test]
fn connect_over_tls_needs_a_client_certificate_from_the_ca() {
    let s = setup(&[]);
    let target = s.echo.addr.to_string();
    let (cert, key) = s.client_cert();
    let good = client_tls(&s.ca(), Some((&cert, &key)), b"http/1.1", TLS_BOTH, &[]);
    // With the certificate: TLS 1.3 and TLS 1.2 both carry a tunnel.
    for v in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let cfg = client_tls(&s.ca(), Some((&cert, &key)), b"http/1.1", &[v], &[]);
        let tls = tls_connect(s.server.connect, cfg).expect("TLS with a client certificate");
        assert_eq!(
            tls.conn.alpn_protocol(),
            Some(&b"http/1.1"[..]),
            "ALPN as Go's http.Server"
        );
        connect_and_echo(tls, &target, 200_000).unwrap_or_else(|e| {
            panic!("tunnel over TLS ({v:?}): {e}\n{}", s.server.proc.log_text())
        });
    }
    let dials = s.dials();
    assert!(dials >= 2.0, "the tunnels were dialled: {dials}");

    // Without a client certificate: no tunnel.
    let none = client_tls(&s.ca(), None, b"http/1.1", TLS_BOTH, &[]);
    let refused = tls_connect(s.server.connect, none)
        .map_err(|e| e.to_string())
        .and_then(|t| connect_and_echo(t, &target, 10));
    assert!(refused.is_err(), "no client certificate was accepted");

    // A certificate from another CA: no tunnel.
    let other = s.env.path("other-certs");
    let out = Command::new(BIN)
        .args(["certs", "init"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(out.status.success());
    let foreign = client_tls(
        &s.ca(),
        Some((
            &other.join("proxy-client.crt"),
            &other.join("proxy-client.key"),
        )),
        b"http/1.1",
        TLS_BOTH,
        &[],
    );
    let refused = tls_connect(s.server.connect, foreign)
        .map_err(|e| e.to_string())
        .and_then(|t| connect_and_echo(t, &target, 10));
    assert!(
        refused.is_err(),
        "a foreign client certificate was accepted"
    );

    // Plaintext CONNECT on the TLS port: no tunnel.
    let plain = TcpStream::connect(s.server.connect).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(connect_and_echo(plain, &target, 10).is_err());

    // None of the refused callers reached an agent; the unix socket
    // frontend stays plaintext; the good client still works.
    assert_eq!(s.dials(), dials, "{}", s.server.metrics());
    let (status, body, st) = connect_unix(&s.server.connect_uds, &target);
    assert_eq!(status, 200, "{body}");
    drop(st);
    connect_and_echo(tls_connect(s.server.connect, good).unwrap(), &target, 1000).unwrap();
    assert!(
        s.server.metric("edgetunnel_frontend_errors_total") >= 3.0,
        "{}",
        s.server.metrics()
    );
}

#[test]
fn grpc_over_tls_with_grpcio() {
    let s = setup(&[]);
    let (cert, key) = s.client_cert();
    let run = |with_cert: bool| {
        let mut args: Vec<String> = vec![
            "--target".into(),
            s.server.grpc.to_string(),
            "--dial".into(),
            s.echo.addr.to_string(),
            "--payload-size".into(),
            (512 << 10).to_string(),
            "--connections".into(),
            "3".into(),
            "--connect-wait".into(),
            "5".into(),
            "--ca".into(),
            s.ca().display().to_string(),
            "--server-name".into(),
            "localhost".into(),
        ];
        if with_cert {
            args.extend([
                "--cert".into(),
                cert.display().to_string(),
                "--key".into(),
                key.display().to_string(),
            ]);
        }
        let mut client = script(&s.env, "proxy_client.py", &args);
        let last = client.wait_line_any(&["OK", "FAIL"], Duration::from_secs(120));
        let status = client.wait_exit(Duration::from_secs(30));
        (
            last.starts_with("OK") && status.is_some_and(|st| st.success()),
            client.log_text(),
        )
    };
    let (ok, log) = run(true);
    assert!(
        ok,
        "grpcio over TLS failed:\n{log}\n{}",
        s.server.proc.log_text()
    );
    let dials = s.dials();
    let (ok, log) = run(false);
    assert!(!ok, "grpcio without a client certificate succeeded:\n{log}");
    assert_eq!(s.dials(), dials);
    // Plaintext HTTP/2 on the TLS port is refused too.
    let mut plain = TcpStream::connect(s.server.grpc).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 64];
    let n = plain.read(&mut buf).unwrap_or(0);
    assert!(
        n == 0 || !buf[..n].windows(3).any(|w| w == [0, 0, 4]),
        "an HTTP/2 SETTINGS frame came back in plaintext: {:?}",
        &buf[..n]
    );
}

#[test]
fn minimum_version_and_cipher_suites_hold_on_frontend_and_agent_listener() {
    let s = setup(&[
        "--tls-min-version",
        "VersionTLS12",
        "--cipher-suites",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ]);
    let target = s.echo.addr.to_string();
    let (cert, key) = s.client_cert();
    let tls12 = [&rustls::version::TLS12];
    let allowed = client_tls(
        &s.ca(),
        Some((&cert, &key)),
        b"http/1.1",
        &tls12,
        &["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
    );
    connect_and_echo(
        tls_connect(s.server.connect, allowed).expect("allowed suite"),
        &target,
        1000,
    )
    .unwrap();
    let other_suite = client_tls(
        &s.ca(),
        Some((&cert, &key)),
        b"http/1.1",
        &tls12,
        &["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"],
    );
    assert!(tls_connect(s.server.connect, other_suite).is_err());
    // TLS 1.3 suites are not restricted (as in Go).
    let tls13 = client_tls(
        &s.ca(),
        Some((&cert, &key)),
        b"http/1.1",
        &[&rustls::version::TLS13],
        &["TLS_AES_256_GCM_SHA384"],
    );
    connect_and_echo(tls_connect(s.server.connect, tls13).unwrap(), &target, 10).unwrap();

    // TLS 1.3 only: a TLS 1.2 client is refused on the frontend and on
    // the agent listener.
    let env = Env::new();
    let c = env.certs();
    let server = Server::start(
        &env,
        &[
            "--frontend-cert",
            c.join("server.crt").to_str().unwrap(),
            "--frontend-key",
            c.join("server.key").to_str().unwrap(),
            "--tls-min-version",
            "VersionTLS13",
        ],
    );
    let agent_cert = (c.join("agent.crt"), c.join("agent.key"));
    for (addr, alpn, cert) in [
        (server.connect, &b"http/1.1"[..], None),
        (
            server.agent,
            &b"h2"[..],
            Some((&agent_cert.0, &agent_cert.1)),
        ),
    ] {
        let cert = cert.map(|(a, b)| (a.as_path(), b.as_path()));
        let old = client_tls(&c.join("ca.crt"), cert, alpn, &tls12, &[]);
        assert!(
            tls_connect(addr, old).is_err(),
            "TLS 1.2 accepted on {addr}"
        );
        let new = client_tls(
            &c.join("ca.crt"),
            cert,
            alpn,
            &[&rustls::version::TLS13],
            &[],
        );
        tls_connect(addr, new).unwrap_or_else(|e| panic!("TLS 1.3 on {addr}: {e}"));
    }
    // Without --frontend-ca no client certificate is asked (Go's
    // getTLSConfig without a CA).
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let anon = client_tls(
        &c.join("ca.crt"),
        None,
        b"http/1.1",
        &[&rustls::version::TLS13],
        &[],
    );
    connect_and_echo(
        tls_connect(server.connect, anon).unwrap(),
        &echo.addr.to_string(),
        1000,
    )
    .unwrap();
    // Bad values stop the server at start with Go's messages.
    for (flag, value, want) in [
        (
            "--tls-min-version",
            "TLS12",
            "unsupported TLS version \"TLS12\"",
        ),
        (
            "--cipher-suites",
            "TLS_FOO",
            "cipher suite TLS_FOO not supported",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["server", "--certs-dir"])
            .arg(env.certs())
            .args(["--agent-bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
            .args([flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{flag}: {err}");
    }
}

/// ANP's README quick start with mutual TLS on both sides (separate CAs for
/// the frontend and for agents), in gRPC and http-connect modes.
const README_SERVER: &[&str] = &[
    "--server-ca-cert=certs/frontend/issued/ca.crt",
    "--server-cert=certs/frontend/issued/proxy-frontend.crt",
    "--server-key=certs/frontend/private/proxy-frontend.key",
    "--cluster-ca-cert=certs/agent/issued/ca.crt",
    "--cluster-cert=certs/agent/issued/proxy-frontend.crt",
    "--cluster-key=certs/agent/private/proxy-frontend.key",
];
const README_AGENT: &[&str] = &[
    "--ca-cert=certs/agent/issued/ca.crt",
    "--agent-cert=certs/agent/issued/proxy-agent.crt",
    "--agent-key=certs/agent/private/proxy-agent.key",
];

#[test]
fn anp_readme_mtls_quick_start_both_modes() {
    let env = Env::new();
    // Two CAs, laid out as the README's easy-rsa tree.
    let root = env.path("anp");
    let frontend = env.path("frontend-ca");
    let out = Command::new(BIN)
        .args(["certs", "init"])
        .arg(&frontend)
        .output()
        .unwrap();
    assert!(out.status.success());
    let agent_ca = env.certs();
    for (from, to) in [
        (frontend.join("ca.crt"), "certs/frontend/issued/ca.crt"),
        (
            frontend.join("server.crt"),
            "certs/frontend/issued/proxy-frontend.crt",
        ),
        (
            frontend.join("server.key"),
            "certs/frontend/private/proxy-frontend.key",
        ),
        (agent_ca.join("ca.crt"), "certs/agent/issued/ca.crt"),
        (
            agent_ca.join("server.crt"),
            "certs/agent/issued/proxy-frontend.crt",
        ),
        (
            agent_ca.join("server.key"),
            "certs/agent/private/proxy-frontend.key",
        ),
        (
            agent_ca.join("agent.crt"),
            "certs/agent/issued/proxy-agent.crt",
        ),
        (
            agent_ca.join("agent.key"),
            "certs/agent/private/proxy-agent.key",
        ),
    ] {
        let to = root.join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&from, &to).unwrap();
    }
    let echo = echo_server("127.0.0.1");
    for mode in ["grpc", "http-connect"] {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(&root)
            .arg("proxy-server")
            .args(README_SERVER)
            .arg(format!("--mode={mode}"))
            // Ports: Go's defaults may be taken on a shared machine.
            .args([
                "--server-bind-address=127.0.0.1",
                "--server-port=0",
                "--agent-port=0",
                "--admin-port=0",
                "--health-port=0",
            ]);
        let server = Proc::spawn(cmd, env.path(&format!("proxy-server-{mode}.log")));
        // LISTEN lines come in this order.
        let agent_port = listen_addr(&server, "agent").port();
        let frontend_addr = listen_addr(&server, if mode == "grpc" { "grpc" } else { "connect" });
        server.wait_line("READY");
        let mut cmd = Command::new(BIN);
        cmd.current_dir(&root)
            .arg("proxy-agent")
            .args(README_AGENT)
            .args([
                "--proxy-server-host=127.0.0.1".to_string(),
                format!("--proxy-server-port={agent_port}"),
                format!("--health-server-port={}", free_port()),
                format!("--admin-server-port={}", free_port()),
            ]);
        let agent = Proc::spawn(cmd, env.path(&format!("proxy-agent-{mode}.log")));
        agent.wait_line("CONNECTED");
        let (cert, key) = (
            frontend.join("proxy-client.crt"),
            frontend.join("proxy-client.key"),
        );
        if mode == "grpc" {
            let args: Vec<String> = vec![
                "--target".into(),
                frontend_addr.to_string(),
                "--dial".into(),
                echo.addr.to_string(),
                "--ca".into(),
                frontend.join("ca.crt").display().to_string(),
                "--cert".into(),
                cert.display().to_string(),
                "--key".into(),
                key.display().to_string(),
                "--server-name".into(),
                "localhost".into(),
            ];
            let mut client = script(&env, "proxy_client.py", &args);
            let last = client.wait_line_any(&["OK", "FAIL"], Duration::from_secs(120));
            let status = client.wait_exit(Duration::from_secs(30));
            assert!(
                last.starts_with("OK") && status.is_some_and(|st| st.success()),
                "{last}\n{}\n{}",
                client.log_text(),
                server.log_text()
            );
        } else {
            let cfg = client_tls(
                &frontend.join("ca.crt"),
                Some((&cert, &key)),
                b"http/1.1",
                TLS_BOTH,
                &[],
            );
            connect_and_echo(
                tls_connect(frontend_addr, cfg).unwrap(),
                &echo.addr.to_string(),
                100_000,
            )
            .unwrap_or_else(|e| panic!("{e}\n{}", server.log_text()));
            // The agent CA's client certificate is not a frontend caller's.
            let wrong = client_tls(
                &frontend.join("ca.crt"),
                Some((&agent_ca.join("agent.crt"), &agent_ca.join("agent.key"))),
                b"http/1.1",
                TLS_BOTH,
                &[],
            );
            assert!(tls_connect(frontend_addr, wrong)
                .map_err(|e| e.to_string())
                .and_then(|t| connect_and_echo(t, &echo.addr.to_string(), 10))
                .is_err());
        }
    }
}
