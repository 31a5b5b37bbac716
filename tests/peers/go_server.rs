//! Our agent against ANP's Go `proxy-server` (v0.36.0), and our Go-flag
//! faces run with the very command lines the Go binaries get:
//!
//! - grpc mode on a unix socket (`--uds-name`, `--server-port=0`): echo /
//!   upload / download / target-closes-first through our agent, each
//!   checked by sha256; then the Go server killed (-9) and started again
//!   on the same ports: our agent reconnects by itself and traffic works;
//! - http-connect mode on TCP with mutual TLS (`--server-cert`,
//!   `--server-key`, `--server-ca-cert`; Go's TCP frontend is TLS only);
//! - DRAIN: SIGTERM to our agent with a connection open: the Go server
//!   logs the DRAIN and routes new dials to the other agent, the open one
//!   runs to its end, then our agent exits;
//! - one list of server arguments and one of agent arguments, each run
//!   once with the Go binary and once as `edgetunnel proxy-server ARGS` /
//!   `edgetunnel proxy-agent ARGS`, crossed (Go server with our agent, our
//!   server with the Go agent) in grpc and http-connect mode.
//!
//! Cleanup checked on our side: the agent's
//! `konnectivity_network_proxy_agent_open_endpoint_connections` (or our
//! server's `edgetunnel_open_connections`) back to 0, and no connection
//! left at the target.

use std::net::SocketAddr;
use std::process::Command;
use std::thread;
use std::time::Duration;

use crate::common::{client, peers, serial, tail, ClientRun, GoTarget, Logged, Peers};
use crate::go_agent::{agent_mtls, dials_at, go_agent_args, spawn_go_agent};
use crate::support::fake_kube::{self, FakeKube};
use crate::support::{free_port, metric_at, wait_metric_at, Agent, Env, Proc, BIN, WAIT};

/// The gauge of our agent's connections to targets.
const AGENT_OPEN: &str = "konnectivity_network_proxy_agent_open_endpoint_connections";

/// Ports a Go server listens on (none left to its defaults, which other
/// tests or helpers may hold).
struct Ports {
    agent: u16,
    admin: u16,
    health: u16,
}

impl Ports {
    fn free() -> Ports {
        Ports {
            agent: free_port(),
            admin: free_port(),
            health: free_port(),
        }
    }
}

/// The arguments of a server in `mode` with its frontend on the unix
/// socket `uds`, agents authenticated by the `certs init` server
/// certificate and CA.
fn server_args(env: &Env, mode: &str, uds: &str, ports: &Ports) -> Vec<String> {
    let c = env.certs();
    vec![
        format!("--mode={mode}"),
        format!("--uds-name={uds}"),
        "--server-port=0".into(),
        format!("--cluster-cert={}", c.join("server.crt").display()),
        format!("--cluster-key={}", c.join("server.key").display()),
        format!("--cluster-ca-cert={}", c.join("ca.crt").display()),
        "--agent-bind-address=127.0.0.1".into(),
        format!("--agent-port={}", ports.agent),
        format!("--admin-port={}", ports.admin),
        "--health-bind-address=127.0.0.1".into(),
        format!("--health-port={}", ports.health),
        "--keepalive-time=1h".into(),
        "-v=2".into(),
    ]
}

/// Starts ANP's Go server with `args` and waits until its listeners are up
/// (the health server starts last).
fn go_server(peers: &Peers, env: &Env, name: &str, args: &[String]) -> Logged {
    let mut cmd = Command::new(peers.bin("anp-server"));
    cmd.args(args).env_remove("PROXY_SERVER_ID");
    let s = Logged::spawn(cmd, env.path(&format!("{name}.log")));
    s.wait_for("Starting health server", WAIT);
    s
}

/// Our agent (`edgetunnel agent`, the `certs init` agent certificate)
/// toward `127.0.0.1:port`, with its admin listener.
fn our_agent(env: &Env, port: u16, id: &str) -> (Agent, SocketAddr) {
    Agent::start_with_admin(
        env,
        SocketAddr::from(([127, 0, 0, 1], port)),
        id,
        &format!("host={id}"),
        &[],
    )
}

fn must(r: ClientRun, logs: impl Fn() -> String) {
    assert!(r.ok, "{}\n{}", r.describe(), logs());
}

/// anptool client ARGS.
fn run(p: &Peers, args: &[&str]) -> ClientRun {
    client(p, args)
}

/// The Go server in grpc mode on a unix socket carries our agent's
/// tunnels; killed (-9) and started again on the same ports and socket, it
/// gets our agent back without any help and carries traffic again.
#[test]
fn go_server_grpc_uds_then_killed_and_restarted() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let env = Env::new();
    let target = GoTarget::start(p, &env, "127.0.0.1:0");
    let ports = Ports::free();
    let uds = env.path("konnectivity-server.socket").display().to_string();
    let args = server_args(&env, "grpc", &uds, &ports);
    let mut server = go_server(p, &env, "go-server", &args);
    let (agent, admin) = our_agent(&env, ports.agent, "node-1");
    server.wait_for("\"Agent connected\" agentID=\"node-1\"", WAIT);
    let t = target.target();
    let logs = |s: &Logged| {
        format!(
            "--- go server:\n{}\n--- agent:\n{}",
            tail(&s.text(), 30),
            tail(&agent.proc.log_text(), 30)
        )
    };
    for test in ["echo", "up", "down"] {
        must(
            run(
                p,
                &[
                    "-via", "grpc-uds", "-addr", &uds, "-target", &t, "-test", test, "-size",
                    "8388608",
                ],
            ),
            || logs(&server),
        );
    }
    must(
        run(
            p,
            &[
                "-via", "grpc-uds", "-addr", &uds, "-target", &t, "-test", "srcclose", "-size",
                "1000000",
            ],
        ),
        || logs(&server),
    );
    wait_metric_at(admin, AGENT_OPEN, &agent.proc, |v| v == 0.0);
    target.wait_idle(WAIT);

    server.signal(libc::SIGKILL);
    let _ = server.child.wait();
    let server = go_server(p, &env, "go-server-2", &args);
    // Our agent reconnects on its own (backoff 0.1 s .. 1 s).
    agent.proc.wait_line("CONNECTED");
    server.wait_for("\"Agent connected\" agentID=\"node-1\"", WAIT);
    for test in ["echo", "down"] {
        must(
            run(
                p,
                &[
                    "-via", "grpc-uds", "-addr", &uds, "-target", &t, "-test", test, "-size",
                    "4194304",
                ],
            ),
            || logs(&server),
        );
    }
    wait_metric_at(admin, AGENT_OPEN, &agent.proc, |v| v == 0.0);
    target.wait_idle(WAIT);
}

/// The Go server in http-connect mode on TCP: its TCP frontend is mutual
/// TLS only (`--server-cert`, `--server-key`, `--server-ca-cert`);
/// anptool CONNECTs with the `certs init` proxy-client certificate.
#[test]
fn go_server_http_connect_over_tcp_mtls() {
    let Some(p) = peers() else { return };
    let env = Env::new();
    let target = GoTarget::start(p, &env, "127.0.0.1:0");
    let ports = Ports::free();
    let frontend = free_port();
    let c = env.certs();
    let mut args = server_args(&env, "http-connect", "", &ports);
    args.retain(|a| a != "--server-port=0");
    args.extend([
        "--server-bind-address=127.0.0.1".to_string(),
        format!("--server-port={frontend}"),
        format!("--server-cert={}", c.join("server.crt").display()),
        format!("--server-key={}", c.join("server.key").display()),
        format!("--server-ca-cert={}", c.join("ca.crt").display()),
    ]);
    let server = go_server(p, &env, "go-server", &args);
    let (agent, admin) = our_agent(&env, ports.agent, "node-1");
    server.wait_for("\"Agent connected\" agentID=\"node-1\"", WAIT);
    let t = target.target();
    let addr = format!("127.0.0.1:{frontend}");
    let ca = c.join("ca.crt").display().to_string();
    let cert = c.join("proxy-client.crt").display().to_string();
    let key = c.join("proxy-client.key").display().to_string();
    for (test, size) in [
        ("echo", "8388608"),
        ("up", "8388608"),
        ("down", "8388608"),
        ("srcclose", "1000000"),
    ] {
        must(
            run(
                p,
                &[
                    "-via",
                    "connect",
                    "-addr",
                    &addr,
                    "-ca",
                    &ca,
                    "-cert",
                    &cert,
                    "-key",
                    &key,
                    "-sni",
                    "localhost",
                    "-target",
                    &t,
                    "-test",
                    test,
                    "-size",
                    size,
                ],
            ),
            || {
                format!(
                    "--- go server:\n{}\n--- agent:\n{}",
                    tail(&server.text(), 30),
                    agent.proc.log_text()
                )
            },
        );
    }
    wait_metric_at(admin, AGENT_OPEN, &agent.proc, |v| v == 0.0);
    target.wait_idle(WAIT);
}

/// SIGTERM to our agent with a ping exchange open through it: it sends
/// DRAIN (the Go server logs it), the Go server sends new dials to the
/// other agent, the exchange runs to its end, then our agent exits.
#[test]
fn our_agent_drains_against_go_server() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let env = Env::new();
    let target = GoTarget::start(p, &env, "127.0.0.1:0");
    let ports = Ports::free();
    let uds = env.path("konnectivity-server.socket").display().to_string();
    let server = go_server(
        p,
        &env,
        "go-server",
        &server_args(&env, "grpc", &uds, &ports),
    );
    let (mut first, first_admin) = our_agent(&env, ports.agent, "node-1");
    server.wait_for("\"Agent connected\" agentID=\"node-1\"", WAIT);
    let t = target.target();
    let ping = {
        let (uds, t) = (uds.clone(), t.clone());
        thread::spawn(move || {
            client(
                p,
                &[
                    "-via", "grpc-uds", "-addr", &uds, "-target", &t, "-test", "ping", "-dur", "3s",
                ],
            )
        })
    };
    wait_metric_at(first_admin, AGENT_OPEN, &first.proc, |v| v == 1.0);
    let (second, second_admin) = our_agent(&env, ports.agent, "node-2");
    server.wait_for("\"Agent connected\" agentID=\"node-2\"", WAIT);
    first.proc.signal(libc::SIGTERM);
    server.wait_for("\"agent is draining\" agentID=\"node-1\"", WAIT);
    let dials = "konnectivity_network_proxy_agent_dial_duration_seconds_count";
    for _ in 0..4 {
        must(
            run(
                p,
                &[
                    "-via", "grpc-uds", "-addr", &uds, "-target", &t, "-test", "echo", "-size",
                    "65536",
                ],
            ),
            || format!("{}\n{}", server.text(), second.proc.log_text()),
        );
    }
    assert_eq!(metric_at(second_admin, dials), 4.0, "{}", server.text());
    let r = ping.join().unwrap();
    assert!(
        r.ok,
        "the exchange through the draining agent:\n{}\n{}\n{}",
        r.describe(),
        tail(&server.text(), 30),
        first.proc.log_text()
    );
    // Nothing left: our draining agent ends by itself.
    let status = first.proc.wait_exit(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "our agent did not exit after its last connection: {status:?}\n{}",
        first.proc.log_text()
    );
    wait_metric_at(second_admin, AGENT_OPEN, &second.proc, |v| v == 0.0);
    target.wait_idle(WAIT);
}

/// One running server or agent, Go's or ours.
enum Side {
    Go(Logged),
    Ours(Proc),
}

impl Side {
    fn log(&self) -> String {
        match self {
            Side::Go(l) => l.text(),
            Side::Ours(p) => p.log_text(),
        }
    }
}

/// `edgetunnel proxy-server ARGS` / `edgetunnel proxy-agent ARGS`.
fn ours(env: &Env, face: &str, args: &[String]) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.arg(face)
        .args(args)
        .env_remove("PROXY_SERVER_ID")
        .env_remove("PROXY_AGENT_ID");
    Proc::spawn(cmd, env.path(&format!("ours-{face}.log")))
}

/// How agents prove themselves in a crossed run.
#[derive(Clone, Copy, Debug)]
enum Auth {
    /// The `certs init` agent certificate, checked with `--cluster-ca-cert`.
    Mtls,
    /// A projected ServiceAccount token only, reviewed by a fake API.
    Token,
}

/// The projected token of the crossed token runs.
const POD_TOKEN: &str = "token-from-the-kubelet";

/// The same server and agent argument lists, each run by the Go binary
/// and by our Go-flag face, crossed: Go server + `edgetunnel
/// proxy-agent`, `edgetunnel proxy-server` + Go agent; in grpc mode and in
/// http-connect mode with mutual TLS, and in grpc mode with token
/// authentication (`--agent-namespace`, `--agent-service-account`,
/// `--authentication-audience`, `--kubeconfig` to a fake TokenReview API,
/// `--kube-api-content-type=application/json`, which the fake API speaks;
/// the agent with `--ca-cert` and `--service-account-token-path` only).
/// Frontends on a unix socket.
#[test]
fn same_command_lines_run_by_go_and_by_edgetunnel() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let env = Env::new();
    let target = GoTarget::start(p, &env, "127.0.0.1:0");
    let t = target.target();
    let kube = FakeKube::start(None);
    kube.put_token(
        POD_TOKEN,
        "system:serviceaccount:kube-system:konnectivity-agent",
        &["system:konnectivity-server"],
    );
    let kubeconfig = env.path("kubeconfig");
    fake_kube::kubeconfig(&kubeconfig, kube.addr);
    let token = env.path("token");
    // As the kubelet projects it: no newline (ANP's agent sends the file's
    // bytes as they are, and grpc-go refuses a newline in a header).
    std::fs::write(&token, POD_TOKEN).unwrap();
    for (mode, auth) in [
        ("grpc", Auth::Mtls),
        ("http-connect", Auth::Mtls),
        ("grpc", Auth::Token),
    ] {
        for go_server_side in [true, false] {
            let ports = Ports::free();
            let uds = env
                .path(&format!("{mode}-{auth:?}-{go_server_side}.socket"))
                .display()
                .to_string();
            let mut s_args = server_args(&env, mode, &uds, &ports);
            let creds = match auth {
                Auth::Mtls => agent_mtls(&env),
                Auth::Token => {
                    s_args.retain(|a| !a.starts_with("--cluster-ca-cert="));
                    s_args.extend([
                        "--agent-namespace=kube-system".to_string(),
                        "--agent-service-account=konnectivity-agent".into(),
                        "--authentication-audience=system:konnectivity-server".into(),
                        format!("--kubeconfig={}", kubeconfig.display()),
                        "--kube-api-content-type=application/json".into(),
                    ]);
                    vec![
                        format!("--ca-cert={}", env.certs().join("ca.crt").display()),
                        format!("--service-account-token-path={}", token.display()),
                    ]
                }
            };
            let a_args = go_agent_args(ports.agent, "node-1", "host=node-1", &creds);
            let reviews = kube.token_reviews().len();
            let (server, agent) = if go_server_side {
                let s = go_server(p, &env, &format!("go-server-{mode}-{auth:?}"), &s_args);
                let a = ours(&env, "proxy-agent", &a_args);
                a.wait_line("CONNECTED");
                s.wait_for("\"Agent connected\" agentID=\"node-1\"", WAIT);
                (Side::Go(s), Side::Ours(a))
            } else {
                let s = ours(&env, "proxy-server", &s_args);
                s.wait_line("READY");
                let a = spawn_go_agent(p, &env, &format!("go-agent-{mode}-{auth:?}"), &a_args);
                a.wait_for("\"Start serving\"", WAIT);
                (Side::Ours(s), Side::Go(a))
            };
            let logs = || {
                format!(
                    "{mode} {auth:?}, Go server: {go_server_side}\n--- server:\n{}\n--- agent:\n{}",
                    tail(&server.log(), 30),
                    tail(&agent.log(), 30)
                )
            };
            if let Auth::Token = auth {
                let new = &kube.token_reviews()[reviews..];
                assert!(
                    !new.is_empty() && new.iter().all(|r| r["spec"]["token"] == POD_TOKEN),
                    "the server did not review the agent's token: {new:?}\n{}",
                    logs()
                );
            }
            let via = if mode == "grpc" {
                "grpc-uds"
            } else {
                "connect-uds"
            };
            for test in ["echo", "up", "down"] {
                must(
                    run(
                        p,
                        &[
                            "-via", via, "-addr", &uds, "-target", &t, "-test", test, "-size",
                            "4194304",
                        ],
                    ),
                    logs,
                );
            }
            // Cleanup at whichever side is ours, and at the target.
            let admin = SocketAddr::from(([127, 0, 0, 1], ports.admin));
            match (&server, &agent) {
                (Side::Ours(s), _) => {
                    wait_metric_at(admin, "edgetunnel_open_connections", s, |v| v == 0.0);
                    assert!(dials_at_go(&agent, &t) >= 3, "{}", logs());
                }
                (_, Side::Ours(a)) => {
                    // The agent's admin port is the one in its argument list.
                    let port: u16 = a_args
                        .iter()
                        .find_map(|x| x.strip_prefix("--admin-server-port="))
                        .unwrap()
                        .parse()
                        .unwrap();
                    let a_admin = SocketAddr::from(([127, 0, 0, 1], port));
                    wait_metric_at(a_admin, AGENT_OPEN, a, |v| v == 0.0);
                }
                _ => unreachable!(),
            }
            target.wait_idle(WAIT);
        }
    }
}

/// Dials to `target` a Go agent logged (0 for ours).
fn dials_at_go(side: &Side, target: &str) -> usize {
    match side {
        Side::Go(l) => dials_at(l, target),
        Side::Ours(_) => 0,
    }
}
