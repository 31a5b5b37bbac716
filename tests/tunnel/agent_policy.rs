//! The agent's destination policy and dial cancellation, with a real
//! server and agent: refused destinations get a 502 with the policy's text
//! and are counted, without a socket ever opened toward them (a real
//! listener checks); an explicit deny beats an allow; a name is checked on
//! the addresses it resolves to. And a dial the server gave up on (its
//! 504) is aborted on the agent at once, its socket closed.

use crate::support;

use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

const POLICY_FAILURES: &str =
    "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"policy\"}";
const REFUSED: &str = "edgetunnel_agent_dials_total{result=\"refused\"}";
const PENDING: &str = "edgetunnel_agent_dials_pending";

/// An agent with an admin listener; `default_policy` drops the tests'
/// loopback allowance from its environment.
fn agent(env: &Env, server: &Server, default_policy: bool, extra: &[&str]) -> (Proc, SocketAddr) {
    let mut args = vec!["--admin-bind", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut cmd: Command = Agent::command(env, server.agent, "node1", "host=node1", &args);
    if default_policy {
        cmd.env_remove(ALLOW_ENV);
    }
    let proc = Proc::spawn(cmd, env.path("agent-node1.log"));
    let admin = listen_addr(&proc, "admin");
    proc.wait_line("CONNECTED");
    (proc, admin)
}

/// A listener on `ip` that counts the connections it accepts.
fn counting_listener(ip: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    let addr = serve_each(ip, move |_s| {
        c.fetch_add(1, Ordering::SeqCst);
    });
    (addr, n)
}

fn assert_refused(server: &Server, target: &str, text: &str, log: &Proc) {
    let (status, body, _) = connect_tcp(server.connect, target);
    assert_eq!(status, 502, "{target}: {body}\n{}", log.log_text());
    assert!(
        body.contains(text),
        "{target}: {body:?} lacks {text:?}\n{}",
        log.log_text()
    );
}

#[test]
fn default_policy_refuses_metadata_loopback_and_names_resolving_to_them() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let (agent, admin) = agent(&env, &server, true, &[]);
    let (target, accepted) = counting_listener("127.0.0.1");
    let port = target.port();

    assert_refused(
        &server,
        "169.254.169.254:80",
        "destination 169.254.169.254:80 refused by agent policy: link-local addresses are refused unless --allow-destinations lists them",
        &agent,
    );
    assert_refused(
        &server,
        &target.to_string(),
        &format!("destination {target} refused by agent policy: loopback"),
        &agent,
    );
    // A name is checked on what it resolves to (127.0.0.1 and/or ::1).
    assert_refused(
        &server,
        &format!("localhost:{port}"),
        &format!("destination localhost:{port} ("),
        &agent,
    );
    // IPv4-mapped IPv6 is IPv4.
    assert_refused(
        &server,
        &format!("[::ffff:127.0.0.1]:{port}"),
        "refused by agent policy: loopback",
        &agent,
    );
    assert_refused(&server, &format!("0.0.0.0:{port}"), "unspecified", &agent);
    assert_eq!(metric_at(admin, POLICY_FAILURES), 5.0);
    assert_eq!(metric_at(admin, REFUSED), 5.0);
    assert_eq!(metric_at(admin, PENDING), 0.0);
    // No socket was ever opened toward the target.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    agent.wait_log("refused by agent policy");
}

#[test]
fn allowed_loopback_works_and_an_explicit_deny_wins() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let echo = echo_server("127.0.0.1");
    let (denied, accepted) = counting_listener("127.0.0.1");
    let deny = format!("127.0.0.1/32:{}", denied.port());
    let (agent, admin) = agent(
        &env,
        &server,
        true,
        &[
            "--allow-destinations",
            "127.0.0.0/8",
            "--deny-destinations",
            &deny,
        ],
    );
    let (status, body, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}\n{}", agent.log_text());
    assert_eq!(echo_roundtrip(s, b"allowed"), b"allowed");

    assert_refused(
        &server,
        &denied.to_string(),
        &format!("refused by agent policy: matches --deny-destinations {deny}"),
        &agent,
    );
    // The allow list is exclusive.
    assert_refused(
        &server,
        "192.0.2.1:80",
        "destination 192.0.2.1:80 refused by agent policy: not in --allow-destinations",
        &agent,
    );
    // 127.0.0.0/8 lifts loopback, not the metadata range.
    assert_refused(&server, "169.254.169.254:80", "link-local", &agent);
    assert_eq!(metric_at(admin, POLICY_FAILURES), 3.0);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

/// A loopback listener whose accept queue is full: connects to it stay in
/// SYN-SENT (the kernel drops their SYNs). The fillers are returned to be
/// kept open.
fn never_accepting() -> (SocketAddr, socket2::Socket, Vec<TcpStream>) {
    use socket2::{Domain, Socket, Type};
    let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    l.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    l.listen(0).unwrap();
    let addr = l.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            Ok(s) => fillers.push(s),
            Err(_) => return (addr, l, fillers),
        }
    }
    panic!("the accept queue of {addr} never filled");
}

/// Sockets in SYN-SENT toward `port` on 127.0.0.1, from the network
/// namespace's TCP table.
fn syn_sent_to(pid: u32, port: u16) -> usize {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    let rem = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[2] == rem && f[3] == "02"
        })
        .count()
}

#[test]
fn a_dial_the_server_gave_up_on_is_aborted_at_the_agent() {
    let env = Env::new();
    // The server gives up after 3 s: time enough, on a loaded machine,
    // to see the dial pending at the agent before that.
    let server = Server::start(&env, &["--dial-timeout-secs", "3"]);
    let (agent, admin) = agent(&env, &server, false, &["--dial-timeout-secs", "30"]);
    let pid = agent.child.id();
    let (target, _listener, _fillers) = never_accepting();
    let before = syn_sent_to(pid, target.port());

    let connect = server.connect;
    let asked = Instant::now();
    let caller = thread::spawn(move || {
        let (status, body, _) = connect_tcp(connect, &target.to_string());
        (status, body, Instant::now())
    });
    // The dial is under way on the agent: pending, its socket in SYN-SENT
    // (seen before the server's 3 s timeout ends it; it takes milliseconds).
    let deadline = asked + Duration::from_millis(2700);
    while !(metric_at(admin, PENDING) == 1.0 && syn_sent_to(pid, target.port()) > before) {
        assert!(
            Instant::now() < deadline,
            "the agent's dial never showed up\n{}",
            agent.log_text()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let (status, body, answered) = caller.join().unwrap();
    assert_eq!(status, 504, "{body}");
    // The server's 3 s timeout, with 5 s of margin.
    assert!(answered - asked < Duration::from_secs(8));

    // The server's DIAL_CLS aborts the connect at once (milliseconds); the
    // agent's own timeout, 30 s, would end it otherwise: 5 s tells the two
    // apart with margin to spare on a loaded machine.
    let deadline = answered + Duration::from_secs(5);
    loop {
        let pending = metric_at(admin, PENDING);
        let sockets = syn_sent_to(pid, target.port());
        if pending == 0.0 && sockets == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{:?} after the 504 the agent still has {pending} pending dial(s) and {sockets} SYN-SENT socket(s) to {target}\n{}",
            answered.elapsed(),
            agent.log_text()
        );
        thread::sleep(Duration::from_millis(10));
    }
    let took = answered.elapsed();
    eprintln!("dial aborted {took:?} after the 504");
    assert_eq!(
        metric_at(admin, "edgetunnel_agent_dials_total{result=\"cancelled\"}"),
        1.0
    );
    // Nothing was counted as a dial failure.
    assert_eq!(
        metric_at(
            admin,
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"timeout\"}"
        ),
        0.0
    );
}
