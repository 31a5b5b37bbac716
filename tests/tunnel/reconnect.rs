//! Reconnect backoff across server restarts: after the agent's backoff has
//! climbed to its cap through restarts it could not ride out, a connection
//! that then stays healthy resets it, so a short blip afterwards is over in
//! about the blip's length, not in a capped backoff delay.

use crate::support;

use std::net::SocketAddr;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

/// First reconnect delay given to the agent, seconds.
const BACKOFF_INITIAL: &str = "0.2";
/// Longest reconnect delay: the old policy, at its cap, waited at least
/// half of this (5 s) after the blip.
const BACKOFF_MAX: &str = "10";
/// The agent's default healthy period (`--backoff-reset-after-secs`).
const RESET_AFTER: Duration = Duration::from_secs(5);
/// How long the server stays down during each restart.
const RESTART_DOWN: Duration = Duration::from_millis(1500);
/// How long the server stays up after the agent reconnected, in each
/// restart (well under RESET_AFTER, so the backoff keeps climbing).
const RESTART_UP: Duration = Duration::from_millis(300);
const BLIP: Duration = Duration::from_millis(500);
/// How long the agent may take to come back once the restarted server is
/// ready: at most one reconnect delay (capped at BACKOFF_MAX, 10 s) plus a
/// handshake and a dial, for which 5 s is the margin on a loaded machine.
/// Measured from the server's readiness, not from its restart: how slowly
/// a loaded machine starts a server is not the agent's doing. Not what
/// shows the reset (the first delay after the blip does that): this is the
/// promise that the agent is back within its cap of a server's return.
const RECOVERY_LIMIT: Duration = Duration::from_secs(15);

fn spawn_agent(env: &Env, server: SocketAddr) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.arg("agent")
        .arg("--certs-dir")
        .arg(env.certs())
        .args(["--server-addr", &server.to_string()])
        .args(["--server-name", "localhost"])
        .args(["--agent-id", "node1", "--agent-identifiers", "host=node1"])
        .args(["--backoff-initial-secs", BACKOFF_INITIAL])
        .args(["--backoff-max-secs", BACKOFF_MAX]);
    Proc::spawn(cmd, env.path("agent-node1.log"))
}

/// One CONNECT dial through the server to the echo target works.
fn dial_works(server: &Server, target: &str) -> bool {
    let Ok(s) = std::net::TcpStream::connect(server.connect) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (status, _, s) = connect_over(s, target);
    status == 200 && echo_roundtrip(s, b"ping") == b"ping"
}

/// Waits (up to `limit`) until the server counts one agent and a dial
/// through it works; how long that took from `since`.
fn wait_recovered(
    server: &Server,
    agent: &Proc,
    target: &str,
    since: Instant,
    limit: Duration,
) -> Duration {
    loop {
        if server.metric("edgetunnel_agents_connected") == 1.0 && dial_works(server, target) {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < limit,
            "agent not back within {limit:?}\nagent log:\n{}",
            agent.log_text()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// The reconnect delays the agent logged (`reconnecting ... delay=1.5s`).
fn logged_delays(log: &str) -> Vec<Duration> {
    log.lines()
        .filter(|l| l.contains("reconnecting"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("delay=")))
        .filter_map(|d| {
            let (num, unit) = d.split_at(d.find(|c: char| c.is_alphabetic() || c == 'µ')?);
            let v: f64 = num.parse().ok()?;
            let scale = match unit {
                "s" => 1.0,
                "ms" => 1e-3,
                "µs" | "us" => 1e-6,
                "ns" => 1e-9,
                _ => return None,
            };
            Some(Duration::from_secs_f64(v * scale))
        })
        .collect()
}

#[test]
fn backoff_resets_after_healthy_connection_so_blip_recovers_fast() {
    let env = Env::new();
    let echo = echo_server("127.0.0.1");
    let target = echo.addr.to_string();
    let mut server = Server::start(&env, &[]);
    let agent_addr = server.agent;
    let bind = agent_addr.to_string();
    let agent = spawn_agent(&env, agent_addr);
    wait_recovered(&server, &agent, &target, Instant::now(), WAIT);

    // Five restarts, each down long enough for failed attempts: the
    // backoff climbs (to its cap) and the short sessions in between do not
    // count as healthy.
    for i in 1..=5 {
        drop(server);
        thread::sleep(RESTART_DOWN);
        let t = Instant::now();
        server = Server::start_on(&env, &bind, &[]);
        let took = wait_recovered(&server, &agent, &target, t, Duration::from_secs(30));
        eprintln!("restart {i}: agent back {took:?} after the server restarted");
        thread::sleep(RESTART_UP);
    }
    // The backoff did climb: with a 0.2 s start, a delay of 1 s or more
    // takes at least three doublings (and at the cap most draws are).
    let delays = logged_delays(&agent.log_text());
    let longest = delays.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{} reconnect delays during the restarts, longest {longest:?}",
        delays.len()
    );
    assert!(
        longest >= Duration::from_secs(1),
        "the backoff never climbed: {delays:?}"
    );

    // A healthy stretch longer than the agent's healthy period.
    thread::sleep(RESET_AFTER + Duration::from_secs(2));
    assert!(dial_works(&server, &target));

    // The blip.
    let delays_before_blip = logged_delays(&agent.log_text()).len();
    drop(server);
    let down = Instant::now();
    thread::sleep(BLIP);
    let restart = Instant::now();
    server = Server::start_on(&env, &bind, &[]);
    let ready = restart.elapsed();
    let took = wait_recovered(&server, &agent, &target, restart, Duration::from_secs(30));
    eprintln!(
        "blip of {BLIP:?}: server ready {ready:?} after its restart; agent back {took:?} after \
         the restart ({:?} after the server went down)",
        down.elapsed()
    );
    // The reset: the first delay after the blip is drawn from the initial
    // ceiling (full jitter: 0 to 0.2 s), not from the climbed one (up to
    // 10 s, where a draw this low has a 2% chance).
    let after_blip = logged_delays(&agent.log_text());
    let first = after_blip.get(delays_before_blip).copied();
    let initial = Duration::from_secs_f64(BACKOFF_INITIAL.parse().unwrap());
    assert!(
        first.is_some_and(|d| d <= initial + Duration::from_millis(1)),
        "the first reconnect delay after the blip was {first:?}, not within the \
         initial {initial:?}: the backoff was not reset\nagent log:\n{}",
        agent.log_text()
    );
    let after_ready = took.saturating_sub(ready);
    assert!(
        after_ready < RECOVERY_LIMIT,
        "agent took {after_ready:?} (over {RECOVERY_LIMIT:?}) to come back once the server was \
         ready after a {BLIP:?} blip\nagent log:\n{}",
        agent.log_text()
    );
}
