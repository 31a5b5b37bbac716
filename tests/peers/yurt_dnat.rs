//! yurt-tunnel's DNS controller's `dnat-PORT` Service ports against the
//! peers' kube-apiserver: our server with yurt's DNS controller flags
//! (`--dns-tunnel-service kube-system/x-tunnel-server-internal-svc
//! --dns-service-dnat-ports`, what the `yurt-tunnel-server` face passes)
//! keeps a TCP port `dnat-P` on that Service for every extra port of
//! `kube-system/yurt-tunnel-server-cfg` (`dnat-ports-pair` pairs aimed at
//! the insecure port, `http-proxy-ports` to the plain interception
//! listener, `https-proxy-ports` to the TLS one), retargets one that moves,
//! removes the ones no longer listed, and leaves the Service's other ports
//! alone (openyurt `pkg/yurttunnel/trafficforward/dns/dns.go`
//! `resolveServicePorts`, `pkg/yurttunnel/util/util.go`
//! `resolveProxyPortsAndMappings`).

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{peers, serial, tail};
use crate::kube_cluster::{start_etcd, Egress, KubeApiserver, KubeCerts, Net};
use crate::support::{Env, Proc, BIN};

const SVC: &str = "x-tunnel-server-internal-svc";
const CFG: &str = "yurt-tunnel-server-cfg";

/// The Service's ports as `name port->target` lines.
fn ports(kas: &KubeApiserver) -> BTreeSet<String> {
    let out = kas.kubectl_ok(&["get", "service", SVC, "-n", "kube-system", "-o", "json"]);
    let v: Value = serde_json::from_slice(&out).unwrap();
    v["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{} {}/{}->{}",
                p["name"].as_str().unwrap_or(""),
                p["port"],
                p["protocol"].as_str().unwrap_or(""),
                p["targetPort"]
            )
        })
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn wait_ports(kas: &KubeApiserver, server: &Proc, want: &BTreeSet<String>) -> f64 {
    let t = Instant::now();
    let deadline = t + Duration::from_secs(30);
    loop {
        let got = ports(kas);
        if &got == want {
            return t.elapsed().as_secs_f64();
        }
        assert!(
            Instant::now() < deadline,
            "Service ports {got:?}, want {want:?}\n--- server:\n{}",
            tail(&server.log_text(), 20)
        );
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn yurt_dns_controller_keeps_dnat_ports_on_the_tunnel_service() {
    let Some(p) = peers() else { return };
    if !p.has("kube-apiserver") {
        return;
    }
    let _g = serial();
    let t0 = Instant::now();
    let net = Net::new();
    let env = Env::new();
    let certs = KubeCerts::new(&env);
    let _etcd = start_etcd(&net, &env);
    let none = Egress::GrpcUds(env.path("unused.socket"));
    let kas = KubeApiserver::start(&p.bin("kube-apiserver"), &net, &env, &certs, &none, 0);
    // The Service as yurt's manifest has it (kubelet ports), and the
    // ConfigMap with one field of each kind; 10250 and a pair aimed
    // elsewhere never count.
    kas.create(
        &env,
        "svc",
        &json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SVC, "namespace": "kube-system"},
            "spec": {"ports": [
                {"name": "https", "port": 10250, "targetPort": 10263},
                {"name": "http", "port": 10255, "targetPort": 10264}]}}),
    );
    kas.create(
        &env,
        "cfg",
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CFG, "namespace": "kube-system"},
            "data": {"dnat-ports-pair": "9100=10264,9150=10999",
                     "http-proxy-ports": "9200,10250",
                     "https-proxy-ports": "9300"}}),
    );
    let mut cmd = net.cloud_cmd(BIN);
    cmd.arg("server")
        .arg("--certs-dir")
        .arg(env.certs())
        .arg("--kube")
        .arg(&kas.kubeconfig)
        .args([
            "--agent-bind=127.0.0.1:0",
            "--admin-bind=127.0.0.1:0",
            "--interception-bind=127.0.0.1:10264",
            "--interception-tls-bind=127.0.0.1:10263",
            "--dns-configmap=kube-system/yurt-tunnel-nodes",
            "--dns-tunnel-service=kube-system/x-tunnel-server-internal-svc",
            "--dns-service-dnat-ports",
            "--leader-lease=kube-system/tunnel-dns-controller",
        ]);
    let server = Proc::spawn(cmd, env.path("server.log"));
    server.wait_line("READY");
    let base = ["https 10250/TCP->10263", "http 10255/TCP->10264"];
    let mut want = set(&base);
    want.extend(set(&[
        "dnat-9100 9100/TCP->10264",
        "dnat-9200 9200/TCP->10264",
        "dnat-9300 9300/TCP->10263",
    ]));
    let added = wait_ports(&kas, &server, &want);
    // 9100 moves to the TLS listener, 9200 and 9300 go.
    kas.kubectl_ok(&[
        "patch",
        "configmap",
        CFG,
        "-n",
        "kube-system",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/data","value":{"https-proxy-ports":"9100"}}]"#,
    ]);
    let mut want = set(&base);
    want.insert("dnat-9100 9100/TCP->10263".into());
    let changed = wait_ports(&kas, &server, &want);
    // No ConfigMap: no dnat ports.
    kas.kubectl_ok(&["delete", "configmap", CFG, "-n", "kube-system"]);
    let removed = wait_ports(&kas, &server, &set(&base));
    // The records still point edge names at the Service's ClusterIP.
    let cm = kas.kubectl_ok(&["get", "configmap", "yurt-tunnel-nodes", "-n", "kube-system"]);
    assert!(!cm.is_empty());
    eprintln!(
        "yurt dnat ports: added in {added:.1} s, changed in {changed:.1} s, removed in {removed:.1} s; all {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
