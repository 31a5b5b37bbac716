//! Lease-based server counting, in ANP's lease format, against the fake
//! Kubernetes API server: three servers (`--enable-lease-controller`,
//! `--server-count 1`, so only the leases can tell the agent there are
//! three) behind haproxy in TCP mode; one agent with
//! `--count-server-leases` dialing haproxy reaches every server. A server
//! killed with SIGKILL leaves a lease that expires and is culled by the
//! others; dials through the survivors keep working; a server stopped
//! cleanly deletes its own lease. Lease timings are shortened with the
//! hidden `--lease-duration-secs`, `--lease-renew-secs`, `--lease-gc-secs`
//! (ANP: 30 s, 15 s, 15 s) and the agent's `--lease-poll-secs`.

use crate::support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::fake_kube::{self, FakeKube};
use support::{
    connect_tcp, echo_roundtrip, echo_server, free_port, listen_addr, wait_metric_at, Agent, Env,
    Proc, Server,
};

const NS: &str = "kube-system";
const LABEL: &str = "k8s-app=konnectivity-server";

fn wait_for(what: &str, mut f: impl FnMut() -> bool, log: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn leases(kube: &FakeKube) -> Vec<Value> {
    kube.list("leases", NS, Some(LABEL))["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn lease_names(kube: &FakeKube) -> Vec<String> {
    let mut v: Vec<String> = leases(kube)
        .iter()
        .filter_map(|l| l["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    v.sort();
    v
}

fn haproxy_bin() -> Option<String> {
    [
        "/usr/sbin/haproxy",
        "/usr/bin/haproxy",
        "/usr/local/sbin/haproxy",
    ]
    .iter()
    .find(|p| std::path::Path::new(p).exists())
    .map(|p| p.to_string())
}

/// haproxy in TCP mode, round robin over `backends`, listening on `port`.
fn start_haproxy(env: &Env, port: u16, backends: &[SocketAddr]) -> Proc {
    let bin = haproxy_bin().expect("haproxy not installed (scripts/ensure-tools installs it)");
    let mut cfg = format!(
        "global\n    maxconn 1000\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    \
         timeout client 1h\n    timeout server 1h\n\nlisten agents\n    bind 127.0.0.1:{port}\n    \
         balance roundrobin\n"
    );
    for (i, b) in backends.iter().enumerate() {
        cfg.push_str(&format!("    server s{i} {b}\n"));
    }
    let path = env.path("haproxy.cfg");
    std::fs::write(&path, cfg).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-db").arg("-f").arg(&path);
    let p = Proc::spawn(cmd, env.path("haproxy.log"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "haproxy did not listen\n{}",
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    p
}

fn rfc3339_micro(v: &Value) -> bool {
    // e.g. 2026-12-03T10:11:12.123456Z (metav1.MicroTime's format).
    let s = v.as_str().unwrap_or("");
    s.len() == 27 && s.ends_with('Z') && s.as_bytes()[19] == b'.'
}

fn dial_ok(server: &Server, target: SocketAddr) {
    let (code, head, s) = connect_tcp(server.connect, &target.to_string());
    assert_eq!(code, 200, "{head}\n{}", server.proc.log_text());
    let data = support::random_bytes(4096, 7);
    assert_eq!(echo_roundtrip(s, &data), data);
}

#[test]
fn agents_count_server_leases_behind_a_load_balancer() {
    if haproxy_bin().is_none() {
        panic!("haproxy missing: run scripts/ensure-tools");
    }
    let kube = FakeKube::start(None);
    // Leases another (Go) server fleet left: one of ours, expired (to be
    // culled), and one with other labels (never touched).
    let old = "2020-01-01T00:00:00.000000Z";
    let go_lease = |name: &str, app: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": NS, "labels": {"k8s-app": app}},
            "spec": {"holderIdentity": "0b9e0c7e-dead", "leaseDurationSeconds": 30, "renewTime": old}})
    };
    kube.put_object(
        "leases",
        NS,
        "konnectivity-proxy-server-0b9e0c7e-dead",
        go_lease(
            "konnectivity-proxy-server-0b9e0c7e-dead",
            "konnectivity-server",
        ),
    );
    kube.put_object(
        "leases",
        NS,
        "someone-else",
        go_lease("someone-else", "other"),
    );

    let env = Env::new();
    let kc = env.path("kubeconfig");
    fake_kube::kubeconfig(&kc, kube.addr);
    let kc = kc.display().to_string();
    let lease_flags = |id: &'static str| -> Vec<String> {
        [
            "--kube",
            &kc,
            "--enable-lease-controller",
            "--server-id",
            id,
            "--server-count",
            "1",
            "--lease-duration-secs",
            "3",
            "--lease-renew-secs",
            "0.5",
            "--lease-gc-secs",
            "0.5",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut servers: Vec<Server> = ["srv-a", "srv-b", "srv-c"]
        .into_iter()
        .map(|id| {
            let f = lease_flags(id);
            let f: Vec<&str> = f.iter().map(String::as_str).collect();
            Server::start(&env, &f)
        })
        .collect();
    let logs = |servers: &[Server]| -> String {
        servers
            .iter()
            .map(|s| s.proc.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };

    // Each server's lease, in ANP's format; the dead Go lease is culled.
    wait_for(
        "three server leases and the expired one culled",
        || {
            lease_names(&kube)
                == [
                    "konnectivity-proxy-server-srv-a",
                    "konnectivity-proxy-server-srv-b",
                    "konnectivity-proxy-server-srv-c",
                ]
        },
        || format!("{:?}\n{}", lease_names(&kube), logs(&servers)),
    );
    assert!(kube.object("leases", NS, "someone-else").is_some());
    for l in leases(&kube) {
        let name = l["metadata"]["name"].as_str().unwrap();
        let id = name.strip_prefix("konnectivity-proxy-server-").unwrap();
        assert_eq!(
            l["metadata"]["labels"],
            json!({"k8s-app": "konnectivity-server"})
        );
        assert_eq!(l["metadata"]["namespace"], json!(NS));
        assert_eq!(l["spec"]["holderIdentity"], json!(id), "{l}");
        assert_eq!(l["spec"]["leaseDurationSeconds"], json!(3), "{l}");
        assert!(rfc3339_micro(&l["spec"]["renewTime"]), "{l}");
        assert!(l["spec"].get("acquireTime").is_none(), "{l}");
    }
    // Renewed: the renewTime moves on.
    let before = kube
        .object("leases", NS, "konnectivity-proxy-server-srv-a")
        .unwrap();
    wait_for(
        "a renewal",
        || {
            kube.object("leases", NS, "konnectivity-proxy-server-srv-a")
                .is_some_and(|l| l["spec"]["renewTime"] != before["spec"]["renewTime"])
        },
        || logs(&servers),
    );

    let port = free_port();
    let backends: Vec<SocketAddr> = servers.iter().map(|s| s.agent).collect();
    let _lb = start_haproxy(&env, port, &backends);
    let lb: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let agent = Agent::spawn(
        &env,
        lb,
        "lease-agent",
        "host=node1",
        &[
            "--kube",
            &kc,
            "--count-server-leases",
            "--lease-poll-secs",
            "0.3",
            "--admin-bind",
            "127.0.0.1:0",
        ],
    );
    let agent_admin = listen_addr(&agent.proc, "admin");
    // Every server reports only itself (--server-count 1), yet the agent
    // connects to all three: the count came from the leases.
    for s in &servers {
        wait_for(
            "the agent on every server",
            || s.metric("edgetunnel_agents_connected") == 1.0,
            || format!("{}\n==== agent\n{}", logs(&servers), agent.proc.log_text()),
        );
    }
    let echo = echo_server("127.0.0.1");
    for s in &servers {
        dial_ok(s, echo.addr);
    }

    // SIGKILL one server: no clean-up, its lease expires and is culled.
    let mut dead = servers.pop().unwrap();
    dead.proc.signal(libc::SIGKILL);
    assert!(dead.proc.wait_exit(Duration::from_secs(5)).is_some());
    for s in &servers {
        dial_ok(s, echo.addr);
    }
    wait_for(
        "the dead server's lease culled",
        || {
            kube.object("leases", NS, "konnectivity-proxy-server-srv-c")
                .is_none()
        },
        || logs(&servers),
    );
    // ANP's lease GC families on the survivors (one of them culled srv-c's
    // lease): the culled count, list and delete calls by status code. The
    // count follows the delete's answer, which the lease's absence may
    // precede: scraped until it shows.
    const P: &str = "konnectivity_network_proxy_server_";
    let scrape_all = || -> Vec<_> {
        servers
            .iter()
            .map(|s| support::prom_text::scrape(s.admin))
            .collect()
    };
    let culled = |scrapes: &[_]| -> f64 {
        scrapes
            .iter()
            .filter_map(|f| support::prom_text::value(f, &format!("{P}culled_leases_count"), &[]))
            .sum()
    };
    wait_for(
        "the culled lease counted",
        || culled(&scrape_all()) >= 1.0,
        || logs(&servers),
    );
    let scrapes = scrape_all();
    let sum = |name: &str, labels: &[(&str, &str)]| -> f64 {
        scrapes
            .iter()
            .filter_map(|f| support::prom_text::value(f, name, labels))
            .sum()
    };
    assert!(sum(&format!("{P}culled_leases_count"), &[]) >= 1.0);
    assert!(
        sum(
            &format!("{P}lease_delete_total"),
            &[("http_status_code", "200")]
        ) >= 1.0
    );
    for f in &scrapes {
        let lists = support::prom_text::value(
            f,
            &format!("{P}lease_list_total"),
            &[("http_status_code", "200"), ("reason", "")],
        );
        assert!(lists.is_some_and(|n| n >= 1.0), "{lists:?}");
        assert_eq!(
            f[&format!("{P}lease_list_latency_seconds")].kind.as_deref(),
            Some("histogram")
        );
        assert_eq!(
            f[&format!("{P}culled_leases_count")].kind.as_deref(),
            Some("counter")
        );
    }
    wait_metric_at(
        agent_admin,
        "konnectivity_network_proxy_agent_known_server_count",
        &agent.proc,
        |v| v == 2.0,
    );
    for s in &servers {
        assert_eq!(s.metric("edgetunnel_agents_connected"), 1.0);
        dial_ok(s, echo.addr);
    }

    // A clean stop deletes the server's own lease at once (long before it
    // would expire and be culled).
    let mut stopped = servers.pop().unwrap();
    stopped.proc.signal(libc::SIGTERM);
    assert!(
        stopped.proc.wait_exit(Duration::from_secs(10)).is_some(),
        "{}",
        stopped.proc.log_text()
    );
    assert!(
        kube.object("leases", NS, "konnectivity-proxy-server-srv-b")
            .is_none(),
        "{}",
        stopped.proc.log_text()
    );
    dial_ok(&servers[0], echo.addr);
    assert_eq!(lease_names(&kube), ["konnectivity-proxy-server-srv-a"]);
}
