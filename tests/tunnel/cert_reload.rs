//! Certificate files replaced under a running server: the control thread
//! swaps the new pair in, new handshakes use it, and connections made with
//! the old one keep working.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{connect_tcp, echo_roundtrip, echo_server, Agent, Env, Proc, Server, BIN};

fn certs_init(dir: &Path) {
    let out = Command::new(BIN)
        .args(["certs", "init"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// Replaces `dst` by `src` atomically (write aside, rename over).
fn replace(src: &Path, dst: &Path) {
    let tmp = dst.with_extension("new");
    std::fs::copy(src, &tmp).unwrap();
    std::fs::rename(&tmp, dst).unwrap();
}

/// Certificate pairs reloaded and in use.
const RELOADED: &str = "edgetunnel_certificate_reloads_total{result=\"ok\"}";

#[test]
fn server_certificate_is_reloaded_without_dropping_agents() {
    let env = Env::new();
    let a = env.certs();
    let b = env.path("certs-b");
    certs_init(&b);
    // The server's files start as copies of set A.
    let live = env.path("live");
    std::fs::create_dir(&live).unwrap();
    for f in ["server.crt", "server.key"] {
        std::fs::copy(a.join(f), live.join(f)).unwrap();
    }
    let live_crt = live.join("server.crt").display().to_string();
    let live_key = live.join("server.key").display().to_string();
    let server = Server::start(&env, &["--cert", &live_crt, "--key", &live_key]);
    let echo = echo_server("127.0.0.1");
    let _old = Agent::start(&env, server.agent, "old", "host=old&ipv4=127.0.0.1", &[]);
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    assert_eq!(server.metric(RELOADED), 0.0);

    // Renewal: a certificate from another CA (B) replaces A's.
    replace(&b.join("server.key"), &live.join("server.key"));
    replace(&b.join("server.crt"), &live.join("server.crt"));

    // An agent that trusts only B connects once the swap happened.
    let a_crt = a.join("agent.crt").display().to_string();
    let a_key = a.join("agent.key").display().to_string();
    let b_ca = b.join("ca.crt").display().to_string();
    let mut cmd = Command::new(BIN);
    cmd.arg("agent")
        .args([
            "--server-addr",
            &server.agent.to_string(),
            "--server-name",
            "localhost",
        ])
        .args(["--agent-id", "new", "--agent-identifiers", "host=new"])
        .args(["--cert", &a_crt, "--key", &a_key, "--ca", &b_ca])
        .args(["--backoff-initial-secs", "0.2", "--backoff-max-secs", "0.5"]);
    let new = Proc::spawn(cmd, env.path("agent-new.log"));
    new.wait_line("CONNECTED");
    // The swap was counted once (a check between the two renames may have
    // met B's key with A's certificate: counted as failed, A's pair kept).
    server.wait_metric(RELOADED, 1.0);

    // The agent connected before the swap still carries traffic.
    server.wait_metric("edgetunnel_agents_connected", 2.0);
    let (status, _, s) = connect_tcp(server.connect, &format!("127.0.0.1:{}", echo.addr.port()));
    assert_eq!(status, 200);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(echo_roundtrip(s, b"still here"), b"still here");
}
