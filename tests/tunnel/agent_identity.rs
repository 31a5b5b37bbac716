//! `edgetunnel server --bind-agent-identity`, end to end: real server and
//! agent processes, real mutual TLS with certificates signed by the test CA.
//!
//! With the flag, an agent whose certificate is CN node-a, IP SAN 10.0.0.1:
//! - registering agent ID node-b, or host=node-b, or ipv4=10.0.0.2 is
//!   refused with PERMISSION_DENIED naming what was refused (the agent logs
//!   the server's message), counted by reason, and nothing registers;
//! - registering node-a, host=node-a, ipv4=10.0.0.1 works and carries a
//!   dial;
//! - a second agent with another certificate for node-a is refused while
//!   the first is connected (the first's tunnel keeps moving data), a second
//!   connection with the first's certificate is fine, and once the first is
//!   gone the second certificate may take the ID;
//! - a certificate without the clientAuth usage is not an agent's: a
//!   serverAuth-only one is refused by the TLS handshake (webpki, flag or
//!   not), one without any EKU by the flag.
//!
//! Without the flag every one of those spoofs registers, as before: the
//! same cases, so the refusals above are the flag's doing.

use crate::support;

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
use support::*;

const BIND: &str = "--bind-agent-identity";

fn refused(server: &Server, reason: &str) -> f64 {
    server.metric(&format!(
        "edgetunnel_agent_identity_refused_total{{reason=\"{reason}\"}}"
    ))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool, log: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "{what}:\n{}", log());
        thread::sleep(Duration::from_millis(25));
    }
}

/// An agent presenting `cert` (the CA from the test certificates).
fn spawn_with(
    env: &Env,
    server: SocketAddr,
    cert: &(String, String),
    id: &str,
    identifiers: &str,
) -> Agent {
    Agent::spawn(
        env,
        server,
        id,
        identifiers,
        &["--cert", &cert.0, "--key", &cert.1],
    )
}

/// Does the agent register? Yes: it printed CONNECTED. No: the server
/// refused it for `reason` (its counter moved, the agent logged `needle`
/// from the server's message) and it never printed CONNECTED.
fn admitted(
    env: &Env,
    server: &Server,
    cert: &(String, String),
    id: &str,
    identifiers: &str,
    reason: &str,
    needle: &str,
) -> bool {
    let before = refused(server, reason);
    let agent = spawn_with(env, server.agent, cert, id, identifiers);
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(l) = agent.proc.lines.try_recv() {
            if l.starts_with("CONNECTED") {
                return true;
            }
        }
        if refused(server, reason) > before {
            // The agent heard why.
            // The refusal's own line (the needle alone may also be in the
            // agent's start line, which names its identifiers).
            wait_until(
                "the agent logs the server's refusal",
                || {
                    agent
                        .proc
                        .log_text()
                        .lines()
                        .any(|l| l.contains("gRPC status 7: ") && l.contains(needle))
                },
                || agent.proc.log_text(),
            );
            let log = agent.proc.log_text();
            // PERMISSION_DENIED.
            assert!(log.contains("gRPC status 7: "), "{log}");
            assert!(
                !std::iter::from_fn(|| agent.proc.lines.try_recv().ok())
                    .any(|l| l.starts_with("CONNECTED")),
                "refused yet connected"
            );
            return false;
        }
        assert!(
            Instant::now() < deadline,
            "agent {id} {identifiers}: neither connected nor refused\n{}\n{}",
            agent.proc.log_text(),
            server.proc.log_text()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn dial_ok(server: &Server) {
    let echo = echo_server("127.0.0.1");
    let (status, body, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}\n{}", server.proc.log_text());
    let data = random_bytes(200_000, 7);
    assert!(echo_roundtrip(s, &data) == data);
}

/// The spoofs of node-a's certificate: (agent ID, identifiers, refusal
/// reason, what the refusal names).
const SPOOFS: [(&str, &str, &str, &str); 3] = [
    ("node-b", "ipv4=10.0.0.1", "agent_id", "agent ID \"node-b\""),
    ("node-a", "host=node-b", "host", "host=node-b"),
    ("node-a", "ipv4=10.0.0.2", "ipv4", "ipv4=10.0.0.2"),
];

fn node_a(env: &Env, name: &str) -> (String, String) {
    env.issue(name, "node-a", &["10.0.0.1"], &[ClientAuth])
}

#[test]
fn with_binding_spoofed_ids_and_identifiers_are_refused() {
    let env = Env::new();
    let server = Server::start(&env, &[BIND]);
    let cert = node_a(&env, "node-a");
    for (id, ids, reason, needle) in SPOOFS {
        assert!(
            !admitted(&env, &server, &cert, id, ids, reason, needle),
            "spoof {id} {ids} registered"
        );
        assert_eq!(server.metric("edgetunnel_agents_connected"), 0.0);
    }
    // Each spoof refused (at least once: an agent retries).
    let denied = server.metric("edgetunnel_agents_refused_total{code=\"PermissionDenied\"}");
    assert!(denied >= SPOOFS.len() as f64, "{denied}");
    // The log names what was refused.
    server.proc.wait_log("host=node-b");

    // What the certificate names registers and carries traffic.
    let good = spawn_with(
        &env,
        server.agent,
        &cert,
        "node-a",
        "host=node-a&ipv4=10.0.0.1&cidr=10.0.0.1%2F32",
    );
    good.proc.wait_line("CONNECTED");
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    dial_ok(&server);
    // A Kubernetes node client certificate names its node.
    let node = env.issue("node-c", "system:node:node-c", &[], &[ClientAuth]);
    let c = spawn_with(&env, server.agent, &node, "node-c", "host=node-c");
    c.proc.wait_line("CONNECTED");
    server.wait_metric("edgetunnel_agents_connected", 2.0);
}

#[test]
fn without_binding_the_same_spoofs_register_as_before() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let cert = node_a(&env, "node-a");
    for (id, ids, reason, needle) in SPOOFS {
        assert!(
            admitted(&env, &server, &cert, id, ids, reason, needle),
            "without the flag {id} {ids} was refused"
        );
    }
    // A second certificate takes a connected agent's ID; a certificate
    // without any EKU is an agent's (webpki accepts it for any usage).
    let a = spawn_with(&env, server.agent, &cert, "node-a", "");
    a.proc.wait_line("CONNECTED");
    let other = node_a(&env, "node-a-2");
    let b = spawn_with(&env, server.agent, &other, "node-a", "");
    b.proc.wait_line("CONNECTED");
    let no_eku = env.issue("no-eku", "node-e", &[], &[]);
    let e = spawn_with(&env, server.agent, &no_eku, "node-e", "");
    e.proc.wait_line("CONNECTED");
    for r in [
        "agent_id",
        "host",
        "ipv4",
        "agent_id_taken",
        "not_client_auth",
    ] {
        assert_eq!(refused(&server, r), 0.0, "{r}");
    }
}

#[test]
fn a_second_certificate_cannot_take_a_connected_agent_id() {
    let env = Env::new();
    let server = Server::start(&env, &[BIND]);
    let first = node_a(&env, "node-a");
    let a = spawn_with(&env, server.agent, &first, "node-a", "ipv4=10.0.0.1");
    a.proc.wait_line("CONNECTED");
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    // A tunnel through the first agent, open across the attempt.
    let echo = echo_server("127.0.0.1");
    let (status, body, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}");
    let s2 = s.try_clone().unwrap();
    let data = random_bytes(100_000, 1);
    assert!(echo_roundtrip(s, &data) == data);

    // Same names, another key: refused while node-a is connected.
    let second = node_a(&env, "node-a-2");
    assert!(!admitted(
        &env,
        &server,
        &second,
        "node-a",
        "ipv4=10.0.0.1",
        "agent_id_taken",
        "held by a connected agent"
    ));
    assert_eq!(server.metric("edgetunnel_agents_connected"), 1.0);
    // The first agent's tunnel and new dials are unaffected.
    let data = random_bytes(100_000, 2);
    assert!(echo_roundtrip(s2, &data) == data);
    dial_ok(&server);

    // Another connection with the first certificate is the same agent.
    let again = spawn_with(&env, server.agent, &first, "node-a", "ipv4=10.0.0.1");
    again.proc.wait_line("CONNECTED");
    server.wait_metric("edgetunnel_agents_connected", 2.0);

    // Once both are gone, the second certificate may hold node-a.
    drop(a);
    drop(again);
    server.wait_metric("edgetunnel_agents_connected", 0.0);
    let b = spawn_with(&env, server.agent, &second, "node-a", "ipv4=10.0.0.1");
    b.proc.wait_line("CONNECTED");
    dial_ok(&server);
}

#[test]
fn certificates_without_client_auth_are_not_agents() {
    let env = Env::new();
    for flags in [&[][..], &[BIND][..]] {
        let server = Server::start(&env, flags);
        // Signed by the same CA, for serving only: refused by the handshake.
        let serving = env.issue("serving", "node-a", &["10.0.0.1"], &[ServerAuth]);
        let s = spawn_with(&env, server.agent, &serving, "node-a", "");
        wait_until(
            "the server refuses the serving certificate in the handshake",
            || {
                server
                    .proc
                    .log_text()
                    .contains("presented a certificate without the clientAuth usage")
            },
            || format!("{}\n{}", server.proc.log_text(), s.proc.log_text()),
        );
        assert_eq!(server.metric("edgetunnel_agents_connected"), 0.0);
        assert!(
            !std::iter::from_fn(|| s.proc.lines.try_recv().ok())
                .any(|l| l.starts_with("CONNECTED")),
            "a serving certificate connected"
        );
        // The handshake refused it: the identity check never saw it.
        assert_eq!(refused(&server, "not_client_auth"), 0.0);
    }

    // No EKU at all: webpki takes it for any usage; the flag does not.
    let server = Server::start(&env, &[BIND]);
    let no_eku = env.issue("no-eku", "node-a", &["10.0.0.1"], &[]);
    assert!(!admitted(
        &env,
        &server,
        &no_eku,
        "node-a",
        "",
        "not_client_auth",
        "clientAuth"
    ));
}

/// An identifier key the agent does not know is refused at start, as ANP's
/// agent refuses it (`cmd/agent/app/options/options.go`
/// `validateAgentIdentifiers`: "unknown address type"): `hostname=node-1`
/// would otherwise register no host, and destHost routing would never pick
/// the agent. Known keys with a server that answers still connect.
#[test]
fn unknown_identifier_keys_stop_the_agent() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    for bad in ["hostname=node-1", "host=node-1&zone=a", "uid=1234"] {
        let mut agent = Agent::spawn(&env, server.agent, "node-1", bad, &[]);
        let status = agent.proc.wait_exit(Duration::from_secs(10));
        let log = agent.proc.log_text();
        assert!(
            status.is_some_and(|s| !s.success()),
            "{bad}: the agent did not stop ({status:?})\n{log}"
        );
        let key = bad.rsplit('&').next().unwrap().split('=').next().unwrap();
        assert!(
            log.contains(&format!("unknown address type: {key}")),
            "{bad}: {log}"
        );
    }
    Agent::start(
        &env,
        server.agent,
        "node-1",
        "host=node-1&ipv4=10.0.0.1",
        &[],
    );
}
