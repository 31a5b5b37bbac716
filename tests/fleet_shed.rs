//! Polite shedding (issue 30): a server whose handshake caps are full
//! answers a new connection with a TLS `user_canceled` alert and closes it
//! (no TLS work), and agents back off from it instead of hammering.
//!
//! * What it answers: with the cap held by connections that completed TLS
//!   (never shed), a rustls client's handshake fails at once with
//!   `AlertReceived(UserCanceled)` (before: a reset or EOF, nothing an
//!   agent could tell from a crash).
//! * Our agents back off: 8 agents started while the cap stays full for
//!   5 s are all refused; the server's refusal count says how often they
//!   tried: at least once each, at most what "busy" backoff allows (equal
//!   jitter: attempts at least `initial / 2`, `initial`, ... apart up to
//!   half of `--backoff-max-secs`), and in the last 2 s at most one attempt
//!   per agent per half ceiling. Each agent counts the refusals
//!   (`edgetunnel_agent_server_busy_total`) and logs the first at info,
//!   once. When the cap frees, every agent links with all its links (one
//!   per server worker): none gave up.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::tls_client::{client_tls, tls_connect, Tls};
use support::*;

/// A mutual-TLS client config with the `certs init` agent certificate.
fn agent_tls(env: &Env) -> Arc<rustls::ClientConfig> {
    let c = env.certs();
    client_tls(
        &c.join("ca.crt"),
        Some((&c.join("agent.crt"), &c.join("agent.key"))),
        b"h2",
        rustls::ALL_VERSIONS,
        &[],
    )
}

/// Fills the server's handshake cap (`cap` slots) with connections that
/// completed TLS and then say nothing: a newcomer cannot shed them.
fn hold_cap(server: &Server, env: &Env, cap: usize) -> Vec<Tls> {
    let cfg = agent_tls(env);
    let held: Vec<Tls> = (0..cap)
        .map(|_| tls_connect(server.agent, cfg.clone()).expect("filler TLS"))
        .collect();
    server.wait_metric("edgetunnel_agent_handshakes", cap as f64);
    held
}

/// The rustls error a handshake ended with, if any.
fn handshake_error(server: &Server, env: &Env) -> Option<rustls::Error> {
    let e = tls_connect(server.agent, agent_tls(env)).err()?;
    e.get_ref()?.downcast_ref::<rustls::Error>().cloned()
}

/// Refusals by either cap (every connection here comes from 127.0.0.1,
/// so the per-address cap, as large as the total, is met first).
fn refused(server: &Server) -> f64 {
    server.metric("edgetunnel_agent_handshakes_refused_total{cap=\"total\"}")
        + server.metric("edgetunnel_agent_handshakes_refused_total{cap=\"per_ip\"}")
}

const CAP: usize = 2;
const AGENTS: usize = 8;
/// The test agents' backoff (support's Agent::command): 0.1 s to 1 s.
const INITIAL: f64 = 0.1;
const MAX: f64 = 1.0;
const HOLD: Duration = Duration::from_secs(5);

#[test]
fn a_busy_server_answers_an_alert_and_agents_back_off_then_all_link() {
    let env = Env::new();
    let cap = CAP.to_string();
    let server = Server::start(
        &env,
        &[
            "--max-handshakes",
            &cap,
            "--max-handshakes-per-ip",
            &cap,
            "--workers",
            "2",
        ],
    );
    let held = hold_cap(&server, &env, CAP);

    // What a client is answered: a TLS alert, user_canceled, at once (at
    // accept, before any TLS work). Without it a client waits for the 15 s
    // handshake timeout: 10 s tells the two apart, with margin for a
    // loaded machine.
    let t0 = Instant::now();
    let err = handshake_error(&server, &env);
    assert_eq!(
        err,
        Some(rustls::Error::AlertReceived(
            rustls::AlertDescription::UserCanceled
        )),
        "a refused handshake's error"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(refused(&server), 1.0);

    // Agents started while the cap stays full.
    let admins: Vec<(Agent, std::net::SocketAddr)> = (0..AGENTS)
        .map(|i| {
            let id = format!("node{i}");
            let a = Agent::spawn(
                &env,
                server.agent,
                &id,
                &format!("host={id}"),
                &["--admin-bind", "127.0.0.1:0"],
            );
            let admin = listen_addr(&a.proc, "admin");
            (a, admin)
        })
        .collect();
    let start = Instant::now();
    let r0 = refused(&server);
    std::thread::sleep(HOLD - Duration::from_secs(2));
    let r_mid = refused(&server);
    let mid = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    let r_end = refused(&server);
    let window = start.elapsed().as_secs_f64();
    let (attempts, late) = (r_end - r0, r_end - r_mid);
    // Busy delays: [c/2, c) with c = 0.1, 0.2, 0.4, 0.8, 1, 1, ...: the
    // k-th retry comes no sooner than the sum of the halves. Attempts
    // within the window per agent at most: 1 + those that fit, plus one
    // for an agent that started late in our count.
    let mut per_agent = 1.0;
    let (mut t, mut c) = (0.0, INITIAL);
    while t + c / 2.0 <= window {
        t += c / 2.0;
        per_agent += 1.0;
        c = (c * 2.0).min(MAX);
    }
    let most = AGENTS as f64 * (per_agent + 1.0);
    // In the last 2 s every agent is at the ceiling: one attempt per half
    // of it at most, plus one in flight at each end.
    let most_late = AGENTS as f64 * ((window - mid) / (MAX / 2.0) + 2.0);
    println!(
        "{AGENTS} agents over {window:.1} s refused: {attempts} attempts (bound {most}), \
         {late} in the last {:.1} s (bound {most_late:.0})",
        window - mid
    );
    assert!(attempts >= AGENTS as f64, "every agent tried: {attempts}");
    assert!(attempts <= most, "{attempts} attempts > {most}");
    assert!(late <= most_late, "{late} late attempts > {most_late}");
    for (a, admin) in &admins {
        let busy = metric_at(*admin, "edgetunnel_agent_server_busy_total");
        assert!(
            busy >= 1.0,
            "agent counted no busy answer:\n{}",
            a.proc.log_text()
        );
        // (Through the agent's log thread: waited for.)
        let logged = a
            .proc
            .wait_log("server busy")
            .lines()
            .filter(|l| l.contains("server busy"))
            .count();
        assert_eq!(
            logged,
            1,
            "busy logged once at info:\n{}",
            a.proc.log_text()
        );
        assert!(!a.proc.log_text().contains("connection to server failed"));
    }

    // The cap frees: every agent links, with a link per server worker.
    drop(held);
    let t1 = Instant::now();
    let deadline = t1 + Duration::from_secs(20);
    while server.agent_links() != (AGENTS * 2) as f64 {
        assert!(
            Instant::now() < deadline,
            "links: {}\n{}",
            server.agent_links(),
            server.metrics()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.metric("edgetunnel_agents_connected"), AGENTS as f64);
    println!(
        "all {AGENTS} agents linked {:?} after the cap freed",
        t1.elapsed()
    );
}
