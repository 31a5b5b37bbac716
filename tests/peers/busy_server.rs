//! ANP's Go `proxy-agent` against our server while its handshake caps are
//! full (issue 30, polite shedding): the server answers the Go agent's
//! TLS handshake with a `user_canceled` alert (crypto/tls reports `remote
//! error: tls: user canceled`; grpc-go fails the Connect stream at once),
//! the Go agent backs off (its `ClientSet.sync` in ANP's
//! pkg/agent/clientset.go: `backoff.Step()`, factor 1.5, jitter 0.1, from
//! `--sync-interval` to `--sync-interval-cap`; here 100 ms to 1 s), the
//! server counts a bounded number of refusals, and once the cap frees the
//! Go agent links by itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{peers, serial, tail};
use crate::go_agent::{agent_mtls, go_agent_args, spawn_go_agent};
use crate::support::tls_client::{client_tls, tls_connect, Tls};
use crate::support::{Env, Server, WAIT};

const CAP: usize = 2;
const HOLD: Duration = Duration::from_secs(4);

/// Connections that completed TLS and say nothing: they fill the cap and
/// cannot be shed.
fn hold_cap(server: &Server, env: &Env) -> Vec<Tls> {
    let c = env.certs();
    let cfg: Arc<rustls::ClientConfig> = client_tls(
        &c.join("ca.crt"),
        Some((&c.join("agent.crt"), &c.join("agent.key"))),
        b"h2",
        rustls::ALL_VERSIONS,
        &[],
    );
    let held = (0..CAP)
        .map(|_| tls_connect(server.agent, cfg.clone()).expect("filler TLS"))
        .collect();
    server.wait_metric("edgetunnel_agent_handshakes", CAP as f64);
    held
}

#[test]
fn go_agent_backs_off_from_a_busy_server_then_links() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let env = Env::new();
    let cap = CAP.to_string();
    let server = Server::start(
        &env,
        &["--max-handshakes", &cap, "--max-handshakes-per-ip", &cap],
    );
    // Either cap: everything comes from 127.0.0.1.
    let refused = || {
        server.metric("edgetunnel_agent_handshakes_refused_total{cap=\"total\"}")
            + server.metric("edgetunnel_agent_handshakes_refused_total{cap=\"per_ip\"}")
    };
    let held = hold_cap(&server, &env);
    let agent = spawn_go_agent(
        p,
        &env,
        "go-agent",
        &go_agent_args(server.agent.port(), "go-1", "host=go-1", &agent_mtls(&env)),
    );
    let t0 = Instant::now();
    std::thread::sleep(HOLD);
    // At least one attempt refused (a loaded machine may be slow to start
    // the Go agent: waited for), and the Go agent's error names the alert.
    let deadline = Instant::now() + WAIT;
    while refused() < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the Go agent never tried:\n{}",
            tail(&agent.text(), 20)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.wait_for("user canceled", WAIT);
    let attempts = refused();
    let took = t0.elapsed();
    // Backoff 0.1 s × 1.5^k (±10%) up to 1 s: about 8 tries in 4 s (and
    // grpc-go may retry a transport once on its own); without backoff it
    // would be hundreds. At most 5 a second over the time watched (20 in
    // the 4 s of HOLD).
    let most = 5.0 * took.as_secs_f64().max(HOLD.as_secs_f64());
    assert!(
        attempts <= most,
        "{attempts} refused attempts in {took:?} (at most {most}):\n{}",
        tail(&agent.text(), 20)
    );
    drop(held);
    agent.wait_for("\"Start serving\"", WAIT);
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    println!(
        "Go agent refused {attempts} times in {took:?}, linked {:?} after the cap freed",
        t0.elapsed() - took
    );
}
