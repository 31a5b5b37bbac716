//! The DNS records the control thread keeps, served by a real dnsmasq (from
//! Debian's package) on a loopback port and queried with dig: connected edge
//! nodes resolve to the tunnel server, cloud nodes to their own address, and
//! a node whose agent leaves drops out.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::{Agent, Env, Proc, Server};

/// A port free for both UDP and TCP (dnsmasq listens on both; a UDP-only
/// check lost to busy TCP ports on a shared machine).
fn free_port() -> u16 {
    loop {
        let port = support::free_port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn dig(port: u16, name: &str) -> String {
    let out = Command::new("dig")
        .args([
            "@127.0.0.1",
            "-p",
            &port.to_string(),
            name,
            "A",
            "+short",
            "+time=2",
            "+tries=1",
        ])
        .output()
        .expect("dig (apt-get install dnsutils)");
    // No answer yet (dnsmasq still starting): dig 9.18 prints the error on
    // stdout and exits 9; that is no record, not a record.
    if !out.status.success() {
        return String::new();
    }
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn wait_file(path: &std::path::Path, what: &str, f: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if f(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what}: hosts file is {text:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn hosts_records_follow_agents_and_dnsmasq_serves_them() {
    let env = Env::new();
    let hosts = env.path("tunnel-nodes");
    let hosts_s = hosts.display().to_string();
    let server = Server::start(
        &env,
        &[
            "--dns-hosts-file",
            &hosts_s,
            "--dns-tunnel-ip",
            "10.96.0.50",
            "--dns-cloud-node",
            "cloud-1=10.0.0.11",
        ],
    );
    let edge = Agent::start(
        &env,
        server.agent,
        "edge-1",
        "host=edge-1&ipv4=10.0.0.21",
        &[],
    );
    let text = wait_file(&hosts, "edge-1 record", |t| t.contains("edge-1"));
    assert_eq!(text, "10.0.0.11\tcloud-1\n10.96.0.50\tedge-1");

    let port = free_port();
    let mut cmd = Command::new("dnsmasq");
    cmd.args([
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        "--listen-address=127.0.0.1",
        &format!("--port={port}"),
        &format!("--addn-hosts={hosts_s}"),
        "--pid-file",
        "--log-facility=-",
    ]);
    let dnsmasq = Proc::spawn(cmd, env.path("dnsmasq.log"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while dig(port, "cloud-1").is_empty() {
        assert!(
            Instant::now() < deadline,
            "dnsmasq not answering: {}",
            dnsmasq.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(dig(port, "edge-1"), "10.96.0.50");
    assert_eq!(dig(port, "cloud-1"), "10.0.0.11");

    // A second edge node joins; the first leaves.
    let _edge2 = Agent::start(&env, server.agent, "edge-2", "host=edge-2", &[]);
    drop(edge);
    wait_file(&hosts, "edge-2 in, edge-1 out", |t| {
        t.contains("edge-2") && !t.contains("edge-1")
    });
    dnsmasq.signal(libc::SIGHUP); // dnsmasq rereads --addn-hosts on SIGHUP
    let deadline = Instant::now() + Duration::from_secs(10);
    while dig(port, "edge-2") != "10.96.0.50" {
        assert!(
            Instant::now() < deadline,
            "edge-2 not served: {}",
            dnsmasq.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(dig(port, "edge-1"), "");
}
