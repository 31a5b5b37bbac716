//! Interoperability with an independent gRPC implementation: Python grpcio
//! (C-core + BoringSSL) as an ANP agent, as a konnectivity ProxyService
//! client, and as an ANP server that our agent connects to.
//!
//! The venv comes from `tests/interop/setup.sh` (run here if needed; it
//! installs grpcio from PyPI). Set `EDGETUNNEL_INTEROP_VENV` to reuse one.

mod support;

use std::time::Duration;

use support::*;

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// Waits for a script's final line and exit code 0.
fn expect_ok(p: &mut Proc) -> String {
    let last = p.wait_line_any(&["OK", "FAIL"], Duration::from_secs(120));
    let status = p.wait_exit(Duration::from_secs(30)).expect("script exits");
    assert!(
        last.starts_with("OK") && status.success(),
        "script failed: {last} ({status:?})\n{}",
        p.log_text()
    );
    last
}

fn fake_agent(env: &Env, server: &Server, id: &str, ids: &str, extra: &[String]) -> Proc {
    let c = env.certs();
    let mut args = vec![
        s("--server"),
        s(server.agent),
        s("--server-name"),
        s("localhost"),
        s("--ca"),
        s(c.join("ca.crt").display()),
        s("--cert"),
        s(c.join("agent.crt").display()),
        s("--key"),
        s(c.join("agent.key").display()),
        s("--agent-id"),
        s(id),
        s("--identifiers"),
        s(ids),
        s("--serve-seconds"),
        s(60),
        s("--timeout"),
        s(90),
    ];
    args.extend_from_slice(extra);
    script(env, "fake_agent.py", &args)
}

#[test]
fn grpcio_agent_serves_connect_and_grpc_frontends() {
    let env = Env::new();
    let server = Server::start(
        &env,
        &[
            "--server-id",
            "srv-1",
            "--server-count",
            "1",
            "--workers",
            "2",
        ],
    );
    let agent = fake_agent(
        &env,
        &server,
        "py-agent",
        "host=node-py&ipv4=127.0.0.1",
        &[],
    );
    let headers = agent.wait_line("HEADERS");
    assert!(
        headers.contains("serverID=srv-1") && headers.contains("serverCount=1"),
        "{headers}"
    );
    agent.wait_line("READY");
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    // A Go-like agent sends no link token: one connection, one link.
    let links: f64 = server
        .metrics()
        .lines()
        .filter_map(|l| l.strip_prefix("edgetunnel_worker_agent_links{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(links, 1.0);

    // HTTP CONNECT (TCP and unix) through the Python agent.
    let echo = echo_server("127.0.0.1");
    for (i, size) in [1usize, 70_000, 5 << 20].into_iter().enumerate() {
        let data = random_bytes(size, i as u64);
        let (status, body, st) = connect_tcp(server.connect, &echo.addr.to_string());
        assert_eq!(status, 200, "{body}");
        assert!(echo_roundtrip(st, &data) == data);
        let (status, body, st) = connect_unix(&server.connect_uds, &echo.addr.to_string());
        assert_eq!(status, 200, "{body}");
        assert!(echo_roundtrip(st, &data) == data);
    }
    // A refused target: the Python agent's error text comes back as 502.
    let (_held, dead) = refused_addr();
    let (status, body, _) = connect_tcp(server.connect, &dead.to_string());
    assert_eq!(status, 502, "{body}");

    // gRPC ProxyService (Python client) -> our server -> Python agent.
    let mut client = script(
        &env,
        "proxy_client.py",
        &[
            s("--target"),
            format!("unix:{}", server.grpc_uds.display()),
            s("--dial"),
            s(echo.addr),
            s("--payload-size"),
            s(2 << 20),
            s("--connections"),
            s(4),
        ],
    );
    expect_ok(&mut client);
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

/// An agent whose connection drops after it got a dial, before answering:
/// the server routes that dial to another agent, through either frontend,
/// and the caller never sees the loss.
#[test]
fn dial_to_an_agent_that_vanishes_goes_to_another() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let echo = echo_server("127.0.0.1");
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    for frontend in ["connect", "grpc"] {
        let vanisher = fake_agent(
            &env,
            &server,
            "py-vanish",
            "host=node1",
            &[s("--vanish-on-dial")],
        );
        vanisher.wait_line("READY");
        server.wait_metric("edgetunnel_agents_connected", 2.0);
        // Two agents for node1, balanced: within two dials one lands on the
        // vanishing agent.
        for _ in 0..2 {
            if frontend == "connect" {
                let (status, body, st) = connect_tcp(server.connect, &echo.addr.to_string());
                assert_eq!(status, 200, "{body}");
                assert_eq!(echo_roundtrip(st, b"hello"), b"hello");
            } else {
                let mut client = script(
                    &env,
                    "proxy_client.py",
                    &[
                        s("--target"),
                        format!("unix:{}", server.grpc_uds.display()),
                        s("--dial"),
                        s(echo.addr),
                        s("--payload-size"),
                        s(1000),
                    ],
                );
                expect_ok(&mut client);
            }
        }
        let line = vanisher.wait_line("VANISH");
        assert!(line.contains(&echo.addr.to_string()), "{line}");
        server.wait_metric("edgetunnel_agents_connected", 1.0);
    }
    assert_eq!(
        server.metric("edgetunnel_dials_total{result=\"no_agent\"}"),
        0.0
    );
}

#[test]
fn grpcio_proxy_client_through_our_server_and_agent() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    let targets = [
        format!("unix:{}", server.grpc_uds.display()),
        s(server.grpc),
    ];
    for target in &targets {
        for streams in ["per-connection", "shared"] {
            let mut client = script(
                &env,
                "proxy_client.py",
                &[
                    s("--target"),
                    target.clone(),
                    s("--dial"),
                    s(echo.addr),
                    s("--payload-size"),
                    s(3 << 20),
                    s("--connections"),
                    s(8),
                    s("--streams"),
                    s(streams),
                ],
            );
            expect_ok(&mut client);
        }
    }
    // 64 MiB on one connection.
    let mut big = script(
        &env,
        "proxy_client.py",
        &[
            s("--target"),
            s(server.grpc),
            s("--dial"),
            s(echo.addr),
            s("--payload-size"),
            s(64 << 20),
        ],
    );
    expect_ok(&mut big);
    // Dial errors come back in DIAL_RSP.
    let (_held, dead) = refused_addr();
    let mut refused = script(
        &env,
        "proxy_client.py",
        &[
            s("--target"),
            s(server.grpc),
            s("--dial"),
            s(dead),
            s("--expect-dial-error"),
            s("--connections"),
            s(2),
        ],
    );
    let ok = expect_ok(&mut refused);
    assert!(ok.contains("dial errors=2"), "{ok}");
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

#[test]
fn our_agent_against_grpcio_server() {
    let env = Env::new();
    let echo = echo_server("127.0.0.1");
    let c = env.certs();
    let mut server = script(
        &env,
        "fake_server.py",
        &[
            s("--listen"),
            s("127.0.0.1:0"),
            s("--ca"),
            s(c.join("ca.crt").display()),
            s("--cert"),
            s(c.join("server.crt").display()),
            s("--key"),
            s(c.join("server.key").display()),
            s("--dial"),
            s(echo.addr),
            s("--payload-size"),
            s(8 << 20),
            s("--server-id"),
            s("py-server"),
            s("--server-count"),
            s(1),
            s("--timeout"),
            s(90),
        ],
    );
    let line = server.wait_line("LISTENING");
    let port = line.rsplit('=').next().unwrap().trim().to_string();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let agent = Agent::start(
        &env,
        addr,
        "rust-agent",
        "host=edge-1&ipv4=10.0.0.5",
        &["--workers", "2"],
    );
    let seen = server.wait_line("AGENT");
    assert!(seen.contains("id=rust-agent"), "{seen}");
    assert!(
        seen.contains("host=edge-1") && seen.contains("ipv4=10.0.0.5"),
        "{seen}"
    );
    expect_ok(&mut server);
    // A Go-like server announces no workers: the agent says so in its
    // connection line, and announces no secondary link (`LINKED`).
    agent.proc.wait_log("link=None");
    let linked: Vec<String> = agent
        .proc
        .lines
        .try_iter()
        .filter(|l| l.starts_with("LINKED"))
        .collect();
    assert!(linked.is_empty(), "{linked:?}");
    drop(agent);
}

#[test]
fn bearer_token_is_checked() {
    let env = Env::new();
    let token = env.path("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let server = Server::start(&env, &["--agent-token-file", token.to_str().unwrap()]);
    let good = fake_agent(
        &env,
        &server,
        "good",
        "host=a",
        &[s("--token"), s("s3cret")],
    );
    good.wait_line("READY");
    let mut bad = fake_agent(
        &env,
        &server,
        "bad",
        "host=b",
        &[s("--token"), s("wrong"), s("--serve-seconds"), s(5)],
    );
    let last = bad.wait_line_any(&["OK", "FAIL"], Duration::from_secs(60));
    assert!(last.starts_with("FAIL"), "{last}");
    assert!(last.contains("UNAUTHENTICATED"), "{last}");
    let _ = bad.wait_exit(Duration::from_secs(10));
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    // Our own agent: with and without the token.
    let ok = Agent::start(
        &env,
        server.agent,
        "rust-good",
        "host=c",
        &["--token-file", token.to_str().unwrap()],
    );
    server.wait_metric("edgetunnel_agents_connected", 2.0);
    let refused = Agent::spawn(&env, server.agent, "rust-bad", "host=d", &[]);
    refused.proc.wait_log("bad or missing bearer token");
    assert_eq!(server.metric("edgetunnel_agents_connected"), 2.0);
    drop(ok);
}
