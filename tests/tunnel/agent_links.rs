//! One edgetunnel agent on every server worker (issue 15, goal 1): real
//! server and agent processes, real mutual TLS.
//!
//! - With `--workers 2` on both sides the agent holds a link on each server
//!   worker, counts as one agent, and tunnels run on both workers (the
//!   per-worker counters of /metrics).
//! - A link that dies leaves the agent registered and serving through the
//!   other; the lost link comes back on the free worker.
//! - A secondary link passes the same identity checks as the first: with
//!   `--bind-agent-identity` another certificate cannot join an agent's
//!   links, and a link without a first one is refused.
//! - `--max-links-per-server 1` keeps one connection, as ANP's agent.

use crate::support;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::raw_h2::{header, Event, RawH2};
use support::tls_client::{client_tls, tls_connect};
use support::*;

fn links(server: &Server, worker: usize) -> f64 {
    let text = server.metrics();
    let sample = format!("edgetunnel_worker_agent_links{{worker=\"{worker}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&sample))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

fn dials(server: &Server, worker: usize) -> f64 {
    let text = server.metrics();
    let sample = format!("edgetunnel_worker_dials_total{{worker=\"{worker}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&sample))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool, log: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "{what}:\n{}", log());
        thread::sleep(Duration::from_millis(25));
    }
}

/// Waits for one link on each of the server's two workers.
fn wait_both_linked(server: &Server, agent: &Agent) {
    wait_until(
        "a link on each server worker",
        || {
            server.metrics().contains("edgetunnel_worker_agent_links")
                && links(server, 0) == 1.0
                && links(server, 1) == 1.0
        },
        || format!("{}\n{}", server.metrics(), agent.proc.log_text()),
    );
}

/// `n` CONNECT tunnels at once, each echoing a little.
fn tunnels(server: &Server, target: SocketAddr, n: usize) {
    let hs: Vec<_> = (0..n)
        .map(|_| {
            let proxy = server.connect;
            thread::spawn(move || {
                let s = TcpStream::connect(proxy).unwrap();
                connect_and_echo(s, &target.to_string(), 4096)
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap().expect("tunnel through the agent");
    }
}

#[test]
fn agent_links_every_worker_and_tunnels_use_both() {
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "2"]);
    let agent = Agent::start(
        &env,
        server.agent,
        "node1",
        "host=node1",
        &["--workers", "2"],
    );
    wait_both_linked(&server, &agent);
    // One agent, two links.
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    server.wait_metric(
        "konnectivity_network_proxy_server_ready_backend_connections",
        1.0,
    );
    // Every CONNECT socket lands on a worker by the kernel's hash, and its
    // dial goes to the agent's link on that worker. The hash is the
    // kernel's: in about 1 run of 8 a batch of 24 all landed on one worker
    // (every dial then picked that worker's link, as it should), so a few
    // batches are allowed before calling it one-sided.
    let echo = echo_server("127.0.0.1");
    let mut sent = 0.0;
    for _ in 0..4 {
        tunnels(&server, echo.addr, 24);
        sent += 24.0;
        if dials(&server, 0) > 0.0 && dials(&server, 1) > 0.0 {
            break;
        }
    }
    let (d0, d1) = (dials(&server, 0), dials(&server, 1));
    assert_eq!(d0 + d1, sent, "{}", server.metrics());
    assert!(
        d0 > 0.0 && d1 > 0.0,
        "dials on one worker only: {d0} {d1}\n{}\n{}",
        server.proc.log_text(),
        agent.proc.log_text()
    );
    // The agent announced its secondary link (`LINKED <server> <server
    // ID> <worker>`), on one of the server's two workers.
    let linked = agent.proc.wait_line("LINKED ");
    let worker: f64 = linked.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(worker == 0.0 || worker == 1.0, "{linked}");
}

/// Forwards TCP connections to `to`, keeping them so a test can cut one.
struct Cutter {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<(TcpStream, TcpStream)>>>,
}

impl Cutter {
    fn start(to: SocketAddr) -> Cutter {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let conns = Arc::new(Mutex::new(Vec::new()));
        let c = conns.clone();
        thread::spawn(move || {
            for a in l.incoming().flatten() {
                let Ok(b) = TcpStream::connect(to) else {
                    continue;
                };
                let pump = |mut r: TcpStream, mut w: TcpStream| {
                    thread::spawn(move || {
                        let _ = std::io::copy(&mut r, &mut w);
                        let _ = w.shutdown(std::net::Shutdown::Both);
                    })
                };
                pump(a.try_clone().unwrap(), b.try_clone().unwrap());
                pump(b.try_clone().unwrap(), a.try_clone().unwrap());
                c.lock().unwrap().push((a, b));
            }
        });
        Cutter { addr, conns }
    }

    /// Cuts connection `i` (in accept order) at both ends.
    fn cut(&self, i: usize) {
        let conns = self.conns.lock().unwrap();
        let (a, b) = &conns[i];
        let _ = a.shutdown(std::net::Shutdown::Both);
        let _ = b.shutdown(std::net::Shutdown::Both);
    }
}

#[test]
fn a_link_dies_and_the_agent_carries_on() {
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "2"]);
    let cut = Cutter::start(server.agent);
    let agent = Agent::start(&env, cut.addr, "node1", "host=node1", &["--workers", "2"]);
    wait_both_linked(&server, &agent);
    let echo = echo_server("127.0.0.1");
    // The last connection accepted is the secondary link that stayed (the
    // refused ones ended at once).
    let last = cut.conns.lock().unwrap().len() - 1;
    cut.cut(last);
    // The agent noticed: it connects again (after a jittered backoff that
    // may be ~0, so the gap in the link gauges is not waited for).
    wait_until(
        "the agent reconnects the lost link",
        || cut.conns.lock().unwrap().len() > last + 1,
        || format!("{}\n{}", server.metrics(), agent.proc.log_text()),
    );
    // Still one agent, still serving, whatever links are up right now.
    assert_eq!(server.metric("edgetunnel_agents_connected"), 1.0);
    tunnels(&server, echo.addr, 8);
    // The link comes back, on the free worker.
    wait_both_linked(&server, &agent);
    tunnels(&server, echo.addr, 8);
    assert_eq!(server.metric("edgetunnel_agents_connected"), 1.0);
    let (d0, d1) = (dials(&server, 0), dials(&server, 1));
    assert_eq!(d0 + d1, 16.0, "{}", server.metrics());
}

/// The instance token the agent logged.
fn instance_of(agent: &Agent) -> String {
    let log = agent.proc.wait_log("instance=");
    let at = log.find("instance=").expect("instance logged") + "instance=".len();
    log[at..at + 16].to_string()
}

/// A Connect request as a secondary link of `instance`, over TLS with
/// `cert`: the gRPC status of the answer.
fn secondary_status(
    env: &Env,
    server: &Server,
    cert: &(String, String),
    id: &str,
    instance: &str,
    server_id: &str,
) -> String {
    let cfg = client_tls(
        &env.certs().join("ca.crt"),
        Some((cert.0.as_ref(), cert.1.as_ref())),
        b"h2",
        &[&rustls::version::TLS13],
        &[],
    );
    let tls = tls_connect(server.agent, cfg).expect("TLS");
    let mut h2 = RawH2::start(tls);
    h2.open(
        1,
        &[
            (":method", "POST"),
            (":scheme", "https"),
            (":path", "/AgentService/Connect"),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("agentid", id),
            ("agentidentifiers", &format!("host={id}")),
            ("x-edgetunnel-link", instance),
            ("x-edgetunnel-link-of", server_id),
        ],
    );
    match h2.next_event(1) {
        Event::Headers(f) => header(&f, "grpc-status").unwrap_or("0").to_string(),
        e => panic!("{e:?}"),
    }
}

#[test]
fn secondary_links_pass_the_identity_checks() {
    let env = Env::new();
    let server = Server::start(
        &env,
        &[
            "--workers",
            "2",
            "--server-id",
            "s1",
            "--bind-agent-identity",
        ],
    );
    use rcgen::ExtendedKeyUsagePurpose::ClientAuth;
    let a = env.issue("node-a", "node-a", &["127.0.0.1"], &[ClientAuth]);
    let b = env.issue("node-b", "node-b", &["127.0.0.2"], &[ClientAuth]);
    let agent = Agent::start(
        &env,
        server.agent,
        "node-a",
        "host=node-a",
        &["--cert", &a.0, "--key", &a.1, "--workers", "2"],
    );
    wait_both_linked(&server, &agent);
    let instance = instance_of(&agent);
    // Another certificate cannot join node-a's links.
    assert_eq!(
        secondary_status(&env, &server, &b, "node-a", &instance, "s1"),
        "7"
    );
    // node-a's own certificate: both workers are taken (ALREADY_EXISTS) ...
    assert_eq!(
        secondary_status(&env, &server, &a, "node-a", &instance, "s1"),
        "6"
    );
    // ... and a link of an instance with no first link is refused.
    assert_eq!(
        secondary_status(&env, &server, &a, "node-a", "0000000000000000", "s1"),
        "9"
    );
    assert_eq!(links(&server, 0) + links(&server, 1), 2.0);
    assert_eq!(server.metric("edgetunnel_agents_connected"), 1.0);
}

#[test]
fn one_link_when_asked() {
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "2"]);
    let _agent = Agent::start(
        &env,
        server.agent,
        "node1",
        "host=node1",
        &["--max-links-per-server", "1"],
    );
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    let echo = echo_server("127.0.0.1");
    tunnels(&server, echo.addr, 8);
    thread::sleep(Duration::from_millis(300));
    let m = server.metrics();
    let total: f64 = m
        .lines()
        .filter_map(|l| l.strip_prefix("edgetunnel_worker_agent_links{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(total, 1.0, "{m}");
}
