//! Our server's `/metrics` beside ANP's Go `proxy-server`'s, after the
//! same traffic (anptool over grpc-uds: an echo, a dial that succeeds, a
//! dial the target refuses), both parsed with a Prometheus text parser
//! (`support::prom_text`):
//!
//! - every family of ours has HELP and TYPE, no family is untyped, every
//!   counter's samples carry the family's name;
//! - every `konnectivity_network_proxy_server_*` and `process_*` family
//!   the Go server shows is in ours with Go's type and label names (Go's
//!   `process_network_*` and `process_virtual_memory_max_bytes` aside);
//! - a client that closes its tunnel the usual way is counted as
//!   `stream_errors_total{segment="from_client",code="Canceled"}`, as Go
//!   counts it;
//! - process_* are sane (RSS > 0, open fds > 0, started in the last hour),
//!   `edgetunnel_build_info` is 1 and names a commit;
//! - `/readyz` counts one agent (with its two links) where
//!   `ready_backend_connections` says 1.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::{client, peers, serial, GoTarget, Logged, Peers, Stack};
use crate::go_agent::{agent_mtls, go_agent_args, spawn_go_agent};
use crate::support::prom_text::{self, Families};
use crate::support::{free_port, http_get, Env, WAIT};

const S: &str = "konnectivity_network_proxy_server_";

/// The three anptool runs every server gets: (test, target, expect OK).
fn traffic(p: &Peers, uds: &str, target: &str) {
    for (test, to, ok) in [
        ("echo", target, true),
        ("dial", target, true),
        ("dial", "127.0.0.1:1", false),
    ] {
        let r = client(
            p,
            &[
                "-via", "grpc-uds", "-addr", uds, "-target", to, "-test", test, "-size", "1000",
            ],
        );
        assert_eq!(r.ok, ok, "anptool {test} to {to}: {}", r.describe());
    }
}

fn scrape(admin: SocketAddr) -> Families {
    prom_text::scrape(admin)
}

/// ANP's Go server and Go agent, the same traffic, its scrape.
fn go_scrape(p: &Peers, env: &Env, target: &GoTarget) -> Families {
    let (agent_port, admin, health) = (free_port(), free_port(), free_port());
    let uds = env.path("go-konnectivity.socket").display().to_string();
    let c = env.certs();
    let mut cmd = Command::new(p.bin("anp-server"));
    cmd.args([
        "--mode=grpc".to_string(),
        format!("--uds-name={uds}"),
        "--server-port=0".into(),
        format!("--cluster-cert={}", c.join("server.crt").display()),
        format!("--cluster-key={}", c.join("server.key").display()),
        format!("--cluster-ca-cert={}", c.join("ca.crt").display()),
        "--agent-bind-address=127.0.0.1".into(),
        format!("--agent-port={agent_port}"),
        format!("--admin-port={admin}"),
        "--health-bind-address=127.0.0.1".into(),
        format!("--health-port={health}"),
        "--keepalive-time=1h".into(),
    ])
    .env_remove("PROXY_SERVER_ID");
    let server = Logged::spawn(cmd, env.path("go-server.log"));
    server.wait_for("Starting health server", WAIT);
    let args = go_agent_args(agent_port, "go-node", "host=go-node", &agent_mtls(env));
    let agent = spawn_go_agent(p, env, "go-agent", &args);
    server.wait_for("\"Agent connected\"", WAIT);
    traffic(p, &uds, &target.target());
    target.wait_idle(WAIT);
    // The Go server counts a stream's error when the stream's goroutine
    // ends, which may come after the client left and the target saw its
    // connections close: scraped again until the three closes are counted
    // (the test then checks them).
    let canceled = [("segment", "from_client"), ("code", "Canceled")];
    let errors = format!("{S}stream_errors_total");
    let deadline = std::time::Instant::now() + WAIT;
    let f = loop {
        let f = scrape(SocketAddr::from(([127, 0, 0, 1], admin)));
        let n = prom_text::value(&f, &errors, &canceled).unwrap_or(0.0);
        if n >= 3.0 || std::time::Instant::now() > deadline {
            break f;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    drop(agent);
    f
}

/// Go families compared with ours (Go's own `go_*`, `promhttp_*` and the
/// network counters client_golang reads from /proc/net are not ANP's).
fn compared(name: &str) -> bool {
    (name.starts_with(S) || name.starts_with("process_"))
        && !name.starts_with("process_network_")
        && name != "process_virtual_memory_max_bytes"
}

#[test]
fn live_scrape_has_gos_families_types_and_labels() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let stack = Stack::start(p, &[]);
    let uds = stack.server.grpc_uds.display().to_string();
    traffic(p, &uds, &stack.target.target());
    stack.assert_clean();
    let ours = scrape(stack.server.admin);
    let go = go_scrape(p, &stack.env, &stack.target);

    let problems = prom_text::form_problems(&ours);
    assert!(problems.is_empty(), "our scrape: {problems:#?}");

    let mut differ = Vec::new();
    for (name, gf) in go.iter().filter(|(n, _)| compared(n)) {
        match ours.get(name) {
            None => differ.push(format!("{name}: missing (Go: {:?})", gf.kind)),
            Some(of) => {
                if of.kind != gf.kind {
                    differ.push(format!("{name}: type {:?}, Go {:?}", of.kind, gf.kind));
                }
                let (ol, gl) = (of.label_names(), gf.label_names());
                if ol != gl {
                    differ.push(format!("{name}: labels {ol:?}, Go {gl:?}"));
                }
            }
        }
    }
    assert!(differ.is_empty(), "against ANP's Go server: {differ:#?}");
    // The Go server showed these after that traffic (they are the
    // families this test is about); the Go families it does not show
    // until used (full_receive_channels, the lease calls) are ours too.
    for f in [
        "frontend_write_duration_seconds",
        "dial_failure_count",
        "culled_leases_count",
        "stream_errors_total",
    ] {
        assert!(go.contains_key(&format!("{S}{f}")), "Go shows no {f}");
    }
    assert_eq!(
        ours[&format!("{S}full_receive_channels")].kind.as_deref(),
        Some("gauge")
    );

    // A client closing its tunnel: Canceled on both, never Unknown.
    let canceled = [("segment", "from_client"), ("code", "Canceled")];
    let errors = format!("{S}stream_errors_total");
    for (who, f) in [("ours", &ours), ("Go", &go)] {
        let n = prom_text::value(f, &errors, &canceled).unwrap_or(0.0);
        assert!(n >= 3.0, "{who}: {n} Canceled from_client stream errors");
    }
    let unknown = prom_text::value(&ours, &errors, &[("code", "Unknown")]);
    assert_eq!(unknown, None, "a normal stream end counted as Unknown");

    // Process and build.
    let v = |n: &str| prom_text::value(&ours, n, &[]).unwrap_or_else(|| panic!("no {n}"));
    assert!(v("process_resident_memory_bytes") > 1e6);
    assert!(v("process_virtual_memory_bytes") >= v("process_resident_memory_bytes"));
    assert!(v("process_open_fds") > 0.0);
    assert!(v("process_max_fds") >= v("process_open_fds"));
    assert!(v("process_cpu_seconds_total") >= 0.0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = v("process_start_time_seconds");
    assert!(
        start <= now + 1.0 && start > now - 3600.0,
        "start {start}, now {now}"
    );
    let build = &ours["edgetunnel_build_info"];
    assert_eq!(build.kind.as_deref(), Some("gauge"));
    let keys: BTreeSet<&str> = build.samples[0].labels.keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, BTreeSet::from(["commit", "rustc", "version"]));
    assert_eq!(build.samples[0].value, 1.0);
    assert!(!build.samples[0].labels["commit"].is_empty());

    // One agent over two links: /readyz and the gauges agree.
    assert_eq!(v(&format!("{S}ready_backend_connections")), 1.0);
    assert_eq!(stack.server.agent_links(), 2.0);
    let (code, body) = http_get(stack.server.admin, "/readyz");
    assert_eq!(code, 200);
    assert!(body.contains("1 agent(s)"), "/readyz: {body}");
}
