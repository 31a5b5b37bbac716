//! The control thread against a (fake, in-test) Kubernetes API server, for
//! real otherwise: nodes listed and watched decide which nodes iptables
//! leaves alone (Ready nodes without an agent), yurt-tunnel's server
//! ConfigMap adds ports, and the DNS records land in their ConfigMap;
//! node changes flow through the watch. The server runs in its own network
//! namespace with a real agent.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::fake_kube::{self, node, FakeKube};
use support::netns::{save, Netns};
use support::{Env, Proc, BIN};

fn wait_for(what: &str, mut f: impl FnMut() -> bool, log: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Plays the cluster's signer with the local CA in `certs`: approves and
/// signs every pending request (valid `secs` seconds) until stopped.
struct Signer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Signer {
    fn start(kube: &FakeKube, certs: std::path::PathBuf, secs: u64) -> Signer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (kube, flag) = (kube.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                kube.sign_pending(&certs, secs);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Signer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Signer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn nodes_and_configmaps_drive_rules_and_records() {
    let ns = Netns::new(&format!("etkube{}", std::process::id() % 100_000));
    let kube = FakeKube::start(Some(&ns.0));
    kube.put_node(node("cloud-1", "10.0.0.11", true, false));
    kube.put_node(node("cloud-down", "10.0.0.12", false, false));
    kube.put_node(node("edge-1", "10.0.0.21", true, true));
    kube.put_configmap(
        "kube-system",
        "yurt-tunnel-server-cfg",
        json!({"http-proxy-ports": "9100"}),
    );

    let env = Env::new();
    let kc = env.path("kubeconfig");
    fake_kube::kubeconfig(&kc, kube.addr);
    let certs = env.certs().display().to_string();
    let mut server = ns.cmd(BIN);
    server.args([
        "server",
        "--certs-dir",
        &certs,
        "--agent-bind",
        "127.0.0.1:0",
        "--admin-bind",
        "127.0.0.1:0",
        "--interception-bind",
        "0.0.0.0:10264",
        "--iptables",
        "--iptables-dnat-ip",
        "10.0.0.2",
        "--kube",
        &kc.display().to_string(),
        "--dns-configmap",
        "kube-system/yurt-tunnel-nodes",
        "--dns-tunnel-ip",
        "10.96.0.50",
        // Its agents' certificate does not name their IDs.
        "--bind-agent-identity=false",
    ]);
    let mut server = Proc::spawn(server, env.path("server.log"));
    let agent_addr = server
        .wait_line("LISTEN agent ")
        .rsplit(' ')
        .next()
        .unwrap()
        .to_string();
    server.wait_line("READY");
    let mut agent = ns.cmd(BIN);
    agent.args([
        "agent",
        "--certs-dir",
        &certs,
        "--server-addr",
        &agent_addr,
        "--server-name",
        "localhost",
        "--agent-id",
        "edge-1",
        "--agent-identifiers",
        "host=edge-1&ipv4=10.0.0.21",
    ]);
    let agent = Proc::spawn(agent, env.path("agent.log"));
    agent.wait_line("CONNECTED");

    let records = || {
        kube.configmap("kube-system", "yurt-tunnel-nodes")
            .and_then(|cm| cm["data"]["tunnel-nodes"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let log = || server.log_text();
    wait_for(
        "the DNS records ConfigMap",
        || records() == "10.0.0.11\tcloud-1\n10.0.0.12\tcloud-down\n10.96.0.50\tedge-1",
        || format!("{:?}\n{}", records(), log()),
    );
    let rules = save(&ns);
    for want in [
        "-A TUNNEL-PORT-10250 -d 127.0.0.0/8 -j RETURN",
        "-A TUNNEL-PORT-10250 -d 10.0.0.11/32 -j RETURN",
        "-A TUNNEL-PORT-10250 -p tcp -j DNAT --to-destination 10.0.0.2:10264",
        "-A TUNNEL-PORT -p tcp -m tcp --dport 9100 -j TUNNEL-PORT-9100",
    ] {
        assert!(rules.contains(want), "missing {want:?} in\n{rules}");
    }
    // Not Ready, or with an agent: not left alone.
    assert!(
        !rules.contains("10.0.0.12/32") && !rules.contains("10.0.0.21/32"),
        "{rules}"
    );

    // The cluster changes: a new edge node, a cloud node gone.
    kube.put_node(node("edge-2", "10.0.0.22", true, true));
    kube.delete_node("cloud-1");
    wait_for(
        "records after the watch events",
        || records() == "10.0.0.12\tcloud-down\n10.96.0.50\tedge-1\n10.96.0.50\tedge-2",
        || format!("{:?}\n{}", records(), log()),
    );
    wait_for(
        "rules after the watch events",
        || !save(&ns).contains("10.0.0.11/32"),
        log,
    );
    assert!(
        kube.requests().iter().any(|r| r.contains("watch")),
        "no watch request: {:?}",
        kube.requests()
    );

    server.signal(libc::SIGTERM);
    assert!(server.wait_exit(Duration::from_secs(20)).is_some());
    assert!(!save(&ns).contains("TUNNEL-PORT"));
}

#[test]
fn one_elected_server_publishes_and_a_follower_takes_over() {
    let kube = FakeKube::start(None);
    kube.put_node(node("cloud-1", "10.0.0.11", true, false));
    let env = Env::new();
    let kc = env.path("kubeconfig");
    fake_kube::kubeconfig(&kc, kube.addr);
    let kc = kc.display().to_string();
    let flags = |id: &'static str| -> Vec<String> {
        [
            "--kube",
            &kc,
            "--dns-configmap",
            "kube-system/yurt-tunnel-nodes",
            "--dns-tunnel-ip",
            "10.96.0.50",
            "--leader-lease-secs",
            "3",
            "--server-id",
            id,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let fa = flags("server-a");
    let a = support::Server::start(&env, &fa.iter().map(String::as_str).collect::<Vec<_>>());
    let holder = || {
        kube.object("leases", "kube-system", "edgetunnel-dns")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let records = || {
        kube.configmap("kube-system", "yurt-tunnel-nodes")
            .and_then(|cm| cm["data"]["tunnel-nodes"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    wait_for(
        "server-a to hold the lease",
        || holder() == "server-a",
        || a.proc.log_text(),
    );
    let fb = flags("server-b");
    let b = support::Server::start(&env, &fb.iter().map(String::as_str).collect::<Vec<_>>());
    wait_for(
        "the records",
        || records() == "10.0.0.11\tcloud-1",
        || a.proc.log_text(),
    );
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        holder(),
        "server-a",
        "the lease moved while its holder lived"
    );

    // The leader dies without a word; the follower takes over and publishes.
    let mut a = a;
    let _ = a.proc.child.kill();
    let _ = a.proc.child.wait();
    kube.put_node(node("edge-3", "10.0.0.23", true, true));
    wait_for(
        "server-b to take over",
        || holder() == "server-b",
        || b.proc.log_text(),
    );
    wait_for(
        "records from the new leader",
        || records() == "10.0.0.11\tcloud-1\n10.96.0.50\tedge-3",
        || b.proc.log_text(),
    );
}

#[test]
fn csr_mode_obtains_and_rotates_the_serving_certificate() {
    let kube = FakeKube::start(None);
    kube.put_service(
        "kube-system",
        "x-tunnel-server-svc",
        "10.96.0.10",
        "203.0.113.5",
    );
    let env = Env::new();
    let kc = env.path("kubeconfig");
    fake_kube::kubeconfig(&kc, kube.addr);
    // The cluster's signer, played by this test with the local CA: every
    // request approved, certificates valid for 6 s (renewed at 80%).
    let _signer = Signer::start(&kube, env.certs(), 6);
    let sdir = env.path("server-certs");
    std::fs::create_dir(&sdir).unwrap();
    let (crt, key) = (
        sdir.join("server.crt").display().to_string(),
        sdir.join("server.key").display().to_string(),
    );
    let kc_s = kc.display().to_string();
    let server = support::Server::start(
        &env,
        &[
            "--cert",
            &crt,
            "--key",
            &key,
            "--cert-mode",
            "csr",
            "--kube",
            &kc_s,
            "--csr-dns-name",
            "localhost",
            "--csr-ip",
            "127.0.0.1",
        ],
    );
    let csrs = kube.csrs();
    assert_eq!(csrs.len(), 1);
    assert_eq!(
        csrs[0]["spec"]["signerName"],
        "kubernetes.io/kubelet-serving"
    );
    assert_eq!(
        csrs[0]["spec"]["usages"],
        json!(["digital signature", "key encipherment", "server auth"])
    );
    {
        use base64::Engine as _;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(csrs[0]["spec"]["request"].as_str().unwrap())
            .unwrap();
        let req =
            rcgen::CertificateSigningRequestParams::from_pem(std::str::from_utf8(&pem).unwrap())
                .unwrap();
        let dn = &req.params.distinguished_name;
        assert!(
            matches!(dn.get(&rcgen::DnType::CommonName), Some(rcgen::DnValue::Utf8String(s)) if s == "system:node:tunnel-server")
        );
        assert!(
            matches!(dn.get(&rcgen::DnType::OrganizationName), Some(rcgen::DnValue::Utf8String(s)) if s == "system:nodes")
        );
    }
    let _agent = support::Agent::start(&env, server.agent, "edge-1", "host=edge-1", &[]);

    // Renewal before expiry: a second request, the new pair swapped in, the
    // agent still connected, new agents welcome.
    wait_for(
        "a renewal request",
        || kube.csrs().len() >= 2,
        || server.proc.log_text(),
    );
    // The renewed pair is in use: counted as a reload.
    support::wait_metric_at(
        server.admin,
        "edgetunnel_certificate_reloads_total{result=\"ok\"}",
        &server.proc,
        |n| n >= 1.0,
    );
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    let _second = support::Agent::start(&env, server.agent, "edge-2", "host=edge-2", &[]);
    server.wait_metric("edgetunnel_agents_connected", 2.0);
}

#[test]
fn agent_certificate_from_a_csr() {
    let kube = FakeKube::start(None);
    let env = Env::new();
    let kc = env.path("kubeconfig");
    fake_kube::kubeconfig(&kc, kube.addr);
    let _signer = Signer::start(&kube, env.certs(), 3600);
    let server = support::Server::start(&env, &[]);
    let adir = env.path("agent-certs");
    std::fs::create_dir(&adir).unwrap();
    let crt = adir.join("agent.crt").display().to_string();
    let key = adir.join("agent.key").display().to_string();
    let ca = env.certs().join("ca.crt").display().to_string();
    let kc_s = kc.display().to_string();
    let _agent = support::Agent::start(
        &env,
        server.agent,
        "node-7",
        "host=node-7&ipv4=10.0.0.77",
        &[
            "--cert",
            &crt,
            "--key",
            &key,
            "--ca",
            &ca,
            "--cert-mode",
            "csr",
            "--kube",
            &kc_s,
        ],
    );
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    let csrs = kube.csrs();
    assert_eq!(csrs.len(), 1);
    assert_eq!(
        csrs[0]["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client"
    );
    assert_eq!(
        csrs[0]["spec"]["usages"],
        json!(["digital signature", "key encipherment", "client auth"])
    );
    use base64::Engine as _;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(csrs[0]["spec"]["request"].as_str().unwrap())
        .unwrap();
    let req = rcgen::CertificateSigningRequestParams::from_pem(std::str::from_utf8(&pem).unwrap())
        .unwrap();
    assert!(
        matches!(req.params.distinguished_name.get(&rcgen::DnType::CommonName), Some(rcgen::DnValue::Utf8String(s)) if s == "tunnel-agent-client")
    );
    let sans: Vec<String> = req
        .params
        .subject_alt_names
        .iter()
        .map(|s| format!("{s:?}"))
        .collect();
    assert!(
        sans.iter().any(|s| s.contains("node-7")) && sans.iter().any(|s| s.contains("10.0.0.77")),
        "{sans:?}"
    );
}
