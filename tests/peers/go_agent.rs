//! ANP's Go `proxy-agent` (v0.36.0) against our server, driven by
//! anptool's konnectivity-client and raw CONNECT:
//!
//! - mutual TLS with the `certs init` files: echo / upload / download over
//!   the gRPC frontend (unix socket) and the CONNECT frontends (TCP and
//!   unix socket), each checked by sha256; then our server killed (-9) and
//!   started again on the same port: the Go agent comes back by itself;
//! - bearer token authentication (`--service-account-token-path`) against
//!   a fake TokenReview API, and a wrong token refused;
//! - routing between two Go agents with `--proxy-strategies
//!   destHost,defaultRoute`: each dial lands at the agent whose
//!   identifiers name its host (127.0.0.1 or 127.0.0.2), an unknown host at
//!   the `default-route=true` one (which agent took a dial: its log's
//!   `Received DIAL_REQ ... dialAddress=...`);
//! - DRAIN (SIGTERM: the Go agent sends DRAIN and keeps serving what it
//!   has): its open connection finishes intact, new dials go to the other
//!   agent;
//! - `kill -9` mid-transfer: the clients get an error at once and our
//!   server drops every tunnel of that agent.
//!
//! Every case ends with our server holding no tunnel and no pending dial
//! (`edgetunnel_open_connections`, `edgetunnel_pending_dials`) and the
//! target no connection.
//!
//! The helpers here (a Go agent's command line, which agent took a dial)
//! are shared with `go_server.rs`.

use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{client, peers, serial, tail, GoTarget, Logged, Peers};
use crate::support::fake_kube::{self, FakeKube};
use crate::support::{free_port, Env, Server, WAIT};

/// The arguments of a Go agent toward `127.0.0.1:server_port` with free
/// admin and health ports (the defaults 8093/8094 may be taken), log
/// level 3 (dials logged, not every DATA packet), `id`, `identifiers`,
/// and `creds` (certificate flags or a token path).
pub(crate) fn go_agent_args(
    server_port: u16,
    id: &str,
    identifiers: &str,
    creds: &[String],
) -> Vec<String> {
    let mut a = vec![
        "--proxy-server-host=127.0.0.1".to_string(),
        format!("--proxy-server-port={server_port}"),
        format!("--agent-id={id}"),
        format!("--agent-identifiers={identifiers}"),
        format!("--admin-server-port={}", free_port()),
        format!("--health-server-port={}", free_port()),
        "--sync-interval=100ms".to_string(),
        "--sync-interval-cap=1s".to_string(),
        "-v=3".to_string(),
    ];
    a.extend_from_slice(creds);
    a
}

pub(crate) use crate::support::agent_mtls;

/// Starts ANP's Go agent with `args`, logging to `<name>.log`.
pub(crate) fn spawn_go_agent(peers: &Peers, env: &Env, name: &str, args: &[String]) -> Logged {
    let mut cmd = Command::new(peers.bin("anp-agent"));
    cmd.args(args).env_remove("PROXY_AGENT_ID");
    Logged::spawn(cmd, env.path(&format!("{name}.log")))
}

/// Starts a Go agent and waits until it serves a server.
fn go_agent(peers: &Peers, env: &Env, name: &str, args: &[String]) -> Logged {
    let a = spawn_go_agent(peers, env, name, args);
    a.wait_for("\"Start serving\"", WAIT);
    a
}

/// How many dials to `target` a Go agent received.
pub(crate) fn dials_at(agent: &Logged, target: &str) -> usize {
    let needle = format!("dialAddress=\"{target}\"");
    agent
        .text()
        .lines()
        .filter(|l| l.contains("\"Received DIAL_REQ\"") && l.contains(&needle))
        .count()
}

/// Waits until `f` holds (`what` and `log()` on failure).
pub(crate) fn wait_until(what: &str, mut f: impl FnMut() -> bool, log: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "{what}:\n{}", log());
        thread::sleep(Duration::from_millis(25));
    }
}

/// Our server, its log and the agents' on failure.
struct Case<'a> {
    peers: &'a Peers,
    server: Server,
    agents: Vec<&'a Logged>,
}

impl Case<'_> {
    fn logs(&self) -> String {
        let mut s = format!("--- server:\n{}", tail(&self.server.proc.log_text(), 30));
        for a in &self.agents {
            s += &format!("\n--- {}:\n{}", a.log.display(), tail(&a.text(), 30));
        }
        s
    }

    /// anptool client ARGS, which must say OK.
    fn ok(&self, args: &[&str]) {
        let r = client(self.peers, args);
        assert!(
            r.ok,
            "anptool client {args:?}:\n{}\n{}",
            r.describe(),
            self.logs()
        );
    }

    /// No tunnel, no dial left at our server, no connection at `targets`.
    fn clean(&self, targets: &[&GoTarget]) {
        self.server.wait_metric("edgetunnel_open_connections", 0.0);
        self.server.wait_metric("edgetunnel_pending_dials", 0.0);
        for t in targets {
            t.wait_idle(WAIT);
        }
    }
}

/// A Go target, our server and one Go agent (`go-1`, mutual TLS with the
/// `certs init` agent certificate) linked to it.
fn one_go_agent(p: &Peers) -> (Env, GoTarget, Server, Logged) {
    let env = Env::new();
    let target = GoTarget::start(p, &env, "127.0.0.1:0");
    let server = Server::start(&env, &[]);
    let agent = go_agent(
        p,
        &env,
        "go-agent",
        &go_agent_args(server.agent.port(), "go-1", "host=go-1", &agent_mtls(&env)),
    );
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    (env, target, server, agent)
}

/// mTLS: the Go agent with the `certs init` agent certificate; echo, up
/// and down through every frontend kind, then nothing left open.
#[test]
fn go_agent_mtls_carries_grpc_and_connect() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let (env, target, server, agent) = one_go_agent(p);
    let c = Case {
        peers: p,
        server,
        agents: vec![&agent],
    };
    let t = target.target();
    let grpc_uds = c.server.grpc_uds.display().to_string();
    let connect = c.server.connect.to_string();
    let connect_uds = c.server.connect_uds.display().to_string();
    for (via, addr) in [
        ("grpc-uds", &grpc_uds),
        ("connect", &connect),
        ("connect-uds", &connect_uds),
    ] {
        for test in ["echo", "up", "down"] {
            c.ok(&[
                "-via", via, "-addr", addr, "-target", &t, "-test", test, "-size", "8388608",
            ]);
        }
        // The target closes first: EOF reaches the client.
        c.ok(&[
            "-via", via, "-addr", addr, "-target", &t, "-test", "srcclose", "-size", "1000000",
        ]);
        c.clean(&[&target]);
    }
    assert_eq!(dials_at(&agent, &t), 12, "{}", c.logs());

    // Our server killed (-9) and started again on the same agent port:
    // the Go agent finds it again by itself and carries traffic.
    let port = c.server.agent.port();
    let mut c = c;
    c.server.proc.signal(libc::SIGKILL);
    let _ = c.server.proc.child.wait();
    c.server = Server::start_on(&env, &format!("127.0.0.1:{port}"), &[]);
    wait_until(
        "the Go agent back",
        || agent.text().matches("\"Start serving\"").count() == 2,
        || agent.text(),
    );
    c.server.wait_metric("edgetunnel_agents_connected", 1.0);
    let uds = c.server.grpc_uds.display().to_string();
    c.ok(&[
        "-via", "grpc-uds", "-addr", &uds, "-target", &t, "-test", "echo", "-size", "1048576",
    ]);
    c.clean(&[&target]);
}

const NS: &str = "kube-system";
const SA: &str = "konnectivity-agent";
const AUDIENCE: &str = "system:konnectivity-server";

/// Token authentication: our server reviews the Go agent's projected
/// token (`Authorization: Bearer`, as ANP's agent sends it) with a fake
/// API; a Go agent with an unknown token is refused.
#[test]
fn go_agent_token_auth() {
    let Some(p) = peers() else { return };
    let env = Env::new();
    let kube = FakeKube::start(None);
    kube.put_token(
        "go-agent-token",
        &format!("system:serviceaccount:{NS}:{SA}"),
        &[AUDIENCE],
    );
    let kc = env.path("kubeconfig");
    fake_kube::kubeconfig(&kc, kube.addr);
    let (cert, key) = crate::common::cert_pair(&env.certs(), "server");
    let kc_s = kc.display().to_string();
    let server = Server::start_with_tls(
        &env,
        "127.0.0.1:0",
        &["--cert", &cert, "--key", &key],
        &[
            "--agent-namespace",
            NS,
            "--agent-service-account",
            SA,
            "--authentication-audience",
            AUDIENCE,
            "--kube",
            &kc_s,
        ],
    );
    let target = GoTarget::start(p, &env, "127.0.0.1:0");
    let token_args = |file: &Path| {
        vec![
            format!("--ca-cert={}", env.certs().join("ca.crt").display()),
            format!("--service-account-token-path={}", file.display()),
        ]
    };

    // A wrong token first: refused, never counted as connected.
    let bad = env.path("bad-token");
    std::fs::write(&bad, "not-a-known-token").unwrap();
    let refused = spawn_go_agent(
        p,
        &env,
        "go-agent-bad",
        &go_agent_args(server.agent.port(), "bad", "host=bad", &token_args(&bad)),
    );
    wait_until(
        "the bad token reviewed",
        || {
            kube.token_reviews()
                .iter()
                .any(|r| r["spec"]["token"] == "not-a-known-token")
        },
        || server.proc.log_text(),
    );
    drop(refused);
    assert_eq!(server.metric("edgetunnel_agents_connected"), 0.0);

    let good = env.path("token");
    std::fs::write(&good, "go-agent-token").unwrap();
    let agent = go_agent(
        p,
        &env,
        "go-agent",
        &go_agent_args(server.agent.port(), "go-1", "host=go-1", &token_args(&good)),
    );
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    let c = Case {
        peers: p,
        server,
        agents: vec![&agent],
    };
    let uds = c.server.grpc_uds.display().to_string();
    let t = target.target();
    for test in ["echo", "up", "down"] {
        c.ok(&[
            "-via", "grpc-uds", "-addr", &uds, "-target", &t, "-test", test, "-size", "4194304",
        ]);
    }
    c.clean(&[&target]);
    let reviews = kube.token_reviews();
    let good_review = reviews
        .iter()
        .find(|r| r["spec"]["token"] == "go-agent-token")
        .expect("the good token reviewed");
    assert_eq!(
        good_review["spec"]["audiences"],
        serde_json::json!([AUDIENCE])
    );
}

/// destHost then defaultRoute over two Go agents: A announces
/// `ipv4=127.0.0.1&ipv6=::1`, B `ipv4=127.0.0.2&default-route=true`; a
/// target on each address plus one on 127.0.0.3 that no agent names. Every dial
/// lands where Go's server would send it, three times each so that a
/// random pick cannot pass by luck.
#[test]
fn go_agents_routed_by_dest_host_and_default_route() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let env = Env::new();
    let t1 = GoTarget::start(p, &env, "127.0.0.1:0");
    let t2 = GoTarget::start(p, &env, "127.0.0.2:0");
    let t3 = GoTarget::start(p, &env, "127.0.0.3:0");
    let t6 = GoTarget::start(p, &env, "[::1]:0");
    let server = Server::start(&env, &["--proxy-strategies", "destHost,defaultRoute"]);
    let port = server.agent.port();
    let a = go_agent(
        p,
        &env,
        "go-agent-a",
        &go_agent_args(
            port,
            "agent-a",
            "ipv4=127.0.0.1&ipv6=::1",
            &agent_mtls(&env),
        ),
    );
    let b = go_agent(
        p,
        &env,
        "go-agent-b",
        &go_agent_args(
            port,
            "agent-b",
            "ipv4=127.0.0.2&default-route=true",
            &agent_mtls(&env),
        ),
    );
    server.wait_metric("edgetunnel_agents_connected", 2.0);
    let c = Case {
        peers: p,
        server,
        agents: vec![&a, &b],
    };
    let uds = c.server.grpc_uds.display().to_string();
    let connect = c.server.connect.to_string();
    for t in [&t1, &t2, &t3, &t6] {
        let target = t.target();
        for via in [
            ("grpc-uds", &uds),
            ("connect", &connect),
            ("grpc-uds", &uds),
        ] {
            c.ok(&[
                "-via", via.0, "-addr", via.1, "-target", &target, "-test", "echo", "-size",
                "100000",
            ]);
        }
    }
    c.clean(&[&t1, &t2, &t3, &t6]);
    let all = [t1.target(), t2.target(), t3.target(), t6.target()];
    let seen = [&a, &b].map(|agent| all.clone().map(|t| dials_at(agent, &t)));
    assert_eq!(seen, [[3, 0, 0, 3], [0, 3, 3, 0]], "{}", c.logs());
}

/// SIGTERM makes the Go agent send DRAIN and keep its connections: a
/// `ping` exchange (16-byte messages every 200 ms, each checked) open
/// through it runs to its end, while every new dial goes to the second
/// agent. ANP's agent keeps draining for minutes; the drop SIGKILLs it.
#[test]
fn go_agent_drain_keeps_open_connections_and_moves_new_dials() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let env = Env::new();
    let target = GoTarget::start(p, &env, "127.0.0.1:0");
    let server = Server::start(&env, &["--proxy-strategies", "default"]);
    let port = server.agent.port();
    let a = go_agent(
        p,
        &env,
        "go-agent-a",
        &go_agent_args(port, "agent-a", "host=a", &agent_mtls(&env)),
    );
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    let t = target.target();
    let uds = server.grpc_uds.display().to_string();
    // The long exchange, through A (the only agent yet).
    let ping = {
        let args: Vec<String> = [
            "-via", "grpc-uds", "-addr", &uds, "-target", &t, "-test", "ping", "-dur", "3s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let peers = p;
        thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            client(peers, &args)
        })
    };
    wait_until(
        "the ping dialed through A",
        || dials_at(&a, &t) == 1,
        || a.text(),
    );
    let b = go_agent(
        p,
        &env,
        "go-agent-b",
        &go_agent_args(port, "agent-b", "host=b", &agent_mtls(&env)),
    );
    server.wait_metric("edgetunnel_agents_connected", 2.0);
    a.signal(libc::SIGTERM);
    a.wait_for("\"drain agent client\"", WAIT);
    // Our server took A's DRAIN (A holds one connection: one DRAIN).
    server.wait_metric("edgetunnel_agent_drains_total", 1.0);
    let c = Case {
        peers: p,
        server,
        agents: vec![&a, &b],
    };
    let connect = c.server.connect.to_string();
    for via in [("grpc-uds", uds.as_str()), ("connect", connect.as_str())] {
        for _ in 0..3 {
            c.ok(&[
                "-via", via.0, "-addr", via.1, "-target", &t, "-test", "echo", "-size", "65536",
            ]);
        }
    }
    let r = ping.join().unwrap();
    assert!(
        r.ok,
        "the ping through the draining agent:\n{}\n{}",
        r.describe(),
        c.logs()
    );
    assert_eq!(
        (dials_at(&a, &t), dials_at(&b, &t)),
        (1, 6),
        "new dials must avoid the draining agent\n{}",
        c.logs()
    );
    c.clean(&[&target]);
}

/// `kill -9` of the Go agent with a gRPC and a CONNECT tunnel open (each
/// a ping exchange): both clients fail within a second or two, not at
/// their timeout, and our server drops both tunnels; the target sees both
/// connections closed (the kernel closes the dead agent's sockets).
#[test]
fn go_agent_killed_mid_transfer() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let (_env, target, server, agent) = one_go_agent(p);
    let t = target.target();
    let runs: Vec<_> = [
        ("grpc-uds", server.grpc_uds.display().to_string()),
        ("connect-uds", server.connect_uds.display().to_string()),
        ("connect", server.connect.to_string()),
    ]
    .into_iter()
    .map(|(via, addr)| {
        let t = t.clone();
        thread::spawn(move || {
            client(
                p,
                &[
                    "-via", via, "-addr", &addr, "-target", &t, "-test", "ping", "-dur", "20s",
                ],
            )
        })
    })
    .collect();
    wait_until(
        "three tunnels open",
        || server.metric("edgetunnel_open_connections") == 3.0,
        || server.proc.log_text(),
    );
    thread::sleep(Duration::from_millis(300));
    let mut agent = agent;
    let killed = Instant::now();
    agent.signal(libc::SIGKILL);
    let _ = agent.child.wait();
    // The clients ping for 20 s: one not told of the dead agent would
    // report only then. Told, they report at once; 15 s is the margin for a
    // loaded machine.
    for r in runs {
        let r = r.join().unwrap();
        assert!(!r.ok, "a client through a killed agent said OK: {}", r.line);
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "the client learned of the dead agent only after {:?}: {}\n{}",
            killed.elapsed(),
            r.describe(),
            server.proc.log_text()
        );
    }
    server.wait_metric("edgetunnel_agents_connected", 0.0);
    server.wait_metric("edgetunnel_open_connections", 0.0);
    server.wait_metric("edgetunnel_pending_dials", 0.0);
    target.wait_idle(WAIT);
}
