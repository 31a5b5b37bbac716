//! The two other layouts of `deploy/` on real nodes ([`crate::real_node`]),
//! the way their documents say to install them: the konnectivity drop-in
//! (the Kubernetes documentation's static Pod and agent DaemonSet, with
//! the Go binaries' names and flags) and OpenYurt's yurt-tunnel layout
//! (iptables DNAT of kubelet traffic on the cloud node, no egress
//! selector). Each reaches a pod on the edge node with `kubectl logs`,
//! `exec` and `port-forward`, which the cloud does only through the
//! tunnel, and then upgrades its server under load as deploy/README.md
//! "Upgrades" says ([`crate::rollout`]): the yurt-tunnel server's
//! DaemonSet rolled to a new image; the konnectivity server moved from the
//! static Pod to its DaemonSet form and rolled, then its agents rolled.
//! The native layout is `deploy_path` (the README's block).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{serial, tail};
use crate::kube_cluster::{KubeApiserver, CLOUD_IP, KUBELET_IP};
use crate::node_image::{self, Archive};
use crate::real_node::{pod_json, wait_running, wait_until, Cluster, RealNode, EDGE_NODE};
use crate::rollout;
use crate::support::{repo, BIN};

/// `cp` with the parents made.
fn install(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("{} -> {}: {e}", from.display(), to.display()));
}

/// The shipped seccomp profile on a node (`/var/lib/kubelet/seccomp/`).
fn install_seccomp(node: &RealNode) {
    install(
        &repo().join("deploy/seccomp/edgetunnel.json"),
        &node.fs.join("var/lib/kubelet/seccomp/edgetunnel.json"),
    );
}

/// `kubectl apply -f -` of `yaml`.
fn apply(kas: &KubeApiserver, yaml: &str) {
    let out = kas.kubectl_stdin(&["apply", "-f", "-"], yaml.as_bytes().to_vec());
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pods labelled `selector` in kube-system (`kubectl get -o json`).
fn pods(kas: &KubeApiserver, selector: &str) -> serde_json::Value {
    let out = kas.kubectl(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        selector,
        "-o",
        "json",
    ]);
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Waits until the pods labelled `selector` in kube-system are all on
/// `node` and ready; their names.
fn wait_pods_ready(
    kas: &KubeApiserver,
    selector: &str,
    node: &str,
    cluster: &Cluster,
    within: Duration,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let v = pods(kas, selector);
        let items = v["items"].as_array().cloned().unwrap_or_default();
        let ready = !items.is_empty()
            && items.iter().all(|p| {
                p["spec"]["nodeName"] == node
                    && p["status"]["containerStatuses"][0]["ready"] == true
            });
        if ready {
            return items
                .iter()
                .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
                .collect();
        }
        if Instant::now() > deadline {
            let logs: String = cluster
                .nodes()
                .iter()
                .map(|n| format!("--- kubelet {}:\n{}\n", n.name, tail(&n.kubelet_log(), 20)))
                .collect();
            panic!(
                "pods {selector} not ready on {node} within {within:?}: {}\n{logs}\n{}",
                v["items"],
                cluster.control_plane.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// What `p1` on the edge node prints before it echoes.
fn p1_lines() -> String {
    (1..=300).map(|i| format!("edge line {i}\n")).collect()
}

/// Waits up to a minute for `kubectl logs p1` to bring [`p1_lines`].
fn logs_of_p1(kas: &KubeApiserver, what: &str) {
    let lines = p1_lines();
    let t = Instant::now();
    let out = loop {
        let out = kas.kubectl(&["logs", "-n", "default", "p1", "--request-timeout=10s"]);
        if (out.status.success() && out.stdout == lines.as_bytes())
            || t.elapsed() > Duration::from_secs(60)
        {
            break out;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        out.status.success() && out.stdout == lines.as_bytes(),
        "{what}: kubectl logs: {} bytes, {}",
        out.stdout.len(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pod on the edge node that prints known lines and then echoes on
/// `port`; `kubectl logs`, `exec` and `port-forward` reach it through the
/// tunnel. Returns a line for the test's summary.
fn reach_the_edge(cluster: &Cluster, what: &str) -> String {
    let kas = cluster.kas();
    let kubelet: std::net::SocketAddr = format!("{KUBELET_IP}:10250").parse().unwrap();
    if let Err(e) = cluster.net.cloud_cannot_reach(kubelet) {
        panic!("{e}");
    }
    let mut p1 = pod_json(
        "p1",
        EDGE_NODE,
        &cluster.images.workload.name,
        "for i in $(seq 1 300); do echo \"edge line $i\"; done; exec nc -ll -p 18080 -e cat",
    );
    p1["spec"].as_object_mut().unwrap().remove("nodeName");
    p1["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": EDGE_NODE});
    kas.create(&cluster.env, "pod-p1", &p1);
    wait_running(
        kas,
        "default",
        "p1",
        Duration::from_secs(60),
        &cluster.nodes(),
    );
    logs_of_p1(kas, what);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    crate::deploy_path::exec_and_port_forward_echo(kas, "p1", &data, what);
    "logs, exec and port-forward through the tunnel".to_string()
}

/// The edgetunnel image under another name (what an upgrade rolls to),
/// imported into both nodes.
fn rolled_image(cluster: &Cluster) -> Archive {
    let (rolled, _) = node_image::edgetunnel(
        &cluster.images.dir,
        Path::new(BIN),
        "edgetunnel:0.1.0-rollout",
    );
    for node in cluster.nodes() {
        node.import(&rolled);
    }
    rolled
}

/// DaemonSet `kube-system/ds` rolled to `image` (container `container`,
/// pods named `ds-...` on `node`) under `kubectl logs` in a loop and a held
/// `logs -f` (deploy/README.md "Upgrades"): the new pod logs `took_over`,
/// no dial fails. A line for the summary.
fn roll_under_load(
    cluster: &Cluster,
    node: &RealNode,
    image: &Archive,
    (ds, container): (&str, &str),
    took_over: &str,
) -> String {
    let kas = cluster.kas();
    let roll = rollout::roll_daemonset(
        cluster,
        node,
        &image.name,
        (ds, container),
        took_over,
        &p1_lines(),
    );
    logs_of_p1(kas, "after the roll");
    format!(
        "{ds} rolled to a new image in {:.1} s: {} kubectl logs during it, none failed, \
         the held logs -f streamed on ({} lines)",
        roll.took.as_secs_f64(),
        roll.logs_ok,
        roll.followed
    )
}

#[test]
fn the_konnectivity_drop_in_runs_on_real_nodes() {
    let _g = serial();
    let t0 = Instant::now();
    let Some(mut cluster) = Cluster::start(&[], true) else {
        return;
    };
    cluster.mark_control_plane();
    let dir = repo().join("deploy/konnectivity");
    let cp_etc = cluster.cp.fs.join("etc/kubernetes");
    // The control-plane node's files, as the Kubernetes documentation
    // makes them: kube-apiserver's serving pair under pki/, and the
    // server's kubeconfig for the user system:konnectivity-server.
    install(
        &cluster.certs.apiserver.0,
        &cp_etc.join("pki/apiserver.crt"),
    );
    install(
        &cluster.certs.apiserver.1,
        &cp_etc.join("pki/apiserver.key"),
    );
    install(&cluster.certs.ca, &cp_etc.join("pki/ca.crt"));
    let (kc, kk) = &cluster.certs.konnectivity;
    let b64 = |p: &Path| {
        let out = std::process::Command::new("base64")
            .arg("-w0")
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    // `kubectl config set-credentials --embed-certs`, as the docs do: the
    // file is read inside the server's container.
    std::fs::write(
        cp_etc.join("konnectivity-server.conf"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    \
             server: https://{CLOUD_IP}:6443\n    certificate-authority-data: {}\nusers:\n\
             - name: system:konnectivity-server\n  user:\n    client-certificate-data: {}\n    \
             client-key-data: {}\ncontexts:\n- name: system:konnectivity-server@kubernetes\n  \
             context: {{cluster: kubernetes, user: system:konnectivity-server}}\n\
             current-context: system:konnectivity-server@kubernetes\n",
            b64(&cluster.certs.ca),
            b64(kc),
            b64(kk)
        ),
    )
    .unwrap();
    for node in cluster.nodes() {
        install_seccomp(node);
    }
    // The server: the Pod into the static pod directory, the rest (RBAC)
    // applied.
    let server_yaml = std::fs::read_to_string(dir.join("konnectivity-server.yaml")).unwrap();
    let docs: Vec<&str> = server_yaml.split("\n---\n").collect();
    assert!(docs[0].contains("kind: Pod"), "{}", docs[0]);
    std::fs::write(cp_etc.join("manifests/konnectivity-server.yaml"), docs[0]).unwrap();
    let kas = cluster.kas();
    apply(kas, &docs[1..].join("\n---\n"));
    // The agents, with the server's address set as the manifest says.
    let agent_yaml = std::fs::read_to_string(dir.join("konnectivity-agent.yaml")).unwrap();
    assert_eq!(agent_yaml.matches("KONNECTIVITY_SERVER_ADDRESS").count(), 1);
    apply(
        kas,
        &agent_yaml.replace("KONNECTIVITY_SERVER_ADDRESS", CLOUD_IP),
    );
    // kube-apiserver with the egress selector file.
    install(
        &dir.join("egress-selector-configuration.yaml"),
        &cp_etc.join("egress-selector-configuration.yaml"),
    );
    cluster.restart_apiserver(&[
        "--egress-selector-config-file=/etc/kubernetes/egress-selector-configuration.yaml"
            .to_string(),
    ]);
    let kas = cluster.kas();
    let server = wait_pods_ready(
        kas,
        "k8s-app=konnectivity-server",
        "cp-1",
        &cluster,
        Duration::from_secs(90),
    );
    let agents = wait_pods_ready(
        kas,
        "k8s-app=konnectivity-agent",
        EDGE_NODE,
        &cluster,
        Duration::from_secs(90),
    );
    let reached = reach_the_edge(&cluster, "konnectivity");
    // The same server as a DaemonSet (konnectivity-server-daemonset.yaml,
    // the form that upgrades by handover): the static Pod removed, the
    // DaemonSet applied, then rolled under load.
    std::fs::remove_file(cp_etc.join("manifests/konnectivity-server.yaml")).unwrap();
    wait_until(
        "the static pod gone",
        Duration::from_secs(90),
        || pods(kas, "k8s-app=konnectivity-server")["items"] == json!([]),
        || cluster.cp.kubelet_log(),
    );
    let ds = std::fs::read_to_string(dir.join("konnectivity-server-daemonset.yaml")).unwrap();
    apply(kas, &ds);
    let ds_pod = wait_pods_ready(
        kas,
        "k8s-app=konnectivity-server",
        "cp-1",
        &cluster,
        Duration::from_secs(90),
    );
    logs_of_p1(kas, "through the DaemonSet's server");
    // Both rolled under load: the server through a handover, the agents
    // (on the pod network, ready once linked) one beside the other.
    let image = rolled_image(&cluster);
    let server_rolled = roll_under_load(
        &cluster,
        &cluster.cp,
        &image,
        ("konnectivity-server", "konnectivity-server-container"),
        rollout::TOOK_OVER,
    );
    let agent_rolled = roll_under_load(
        &cluster,
        &cluster.edge,
        &image,
        ("konnectivity-agent", "konnectivity-agent"),
        "connected to server",
    );
    eprintln!(
        "konnectivity drop-in on real nodes in {:.1} s: static pod {server:?}, agents {agents:?}; {reached}; \
         then as the DaemonSet {ds_pod:?}: {server_rolled}; {agent_rolled}",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn the_yurt_tunnel_layout_runs_on_real_nodes() {
    let _g = serial();
    let t0 = Instant::now();
    // kube-apiserver as kubeadm sets it up: kubelets' serving certificates
    // are not verified (no --kubelet-certificate-authority), which is what
    // lets yurt-tunnel's server answer in the kubelets' place.
    let Some(cluster) = Cluster::start(&["--kubelet-certificate-authority=".to_string()], false)
    else {
        return;
    };
    cluster.mark_control_plane();
    let kas = cluster.kas();
    // The edge node's address leads nowhere from the cloud (a real
    // cloud's route toward a node behind NAT): only the server's DNAT
    // rules take kubelet traffic into the tunnel.
    let out = crate::real_node::in_ns(&cluster.net.cloud.0, "sh")
        .arg("-c")
        .arg(format!(
            "ip link add nowhere type veth peer name nowhere-end && ip link set nowhere up && \
             ip link set nowhere-end up && ip route add {KUBELET_IP}/32 dev nowhere"
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for node in cluster.nodes() {
        install_seccomp(node);
    }
    // The cloud side on nodes labelled is-edge-worker=false, the agents on
    // those labelled true.
    kas.kubectl_ok(&["label", "node", "cp-1", "openyurt.io/is-edge-worker=false"]);
    kas.kubectl_ok(&[
        "label",
        "node",
        EDGE_NODE,
        "openyurt.io/is-edge-worker=true",
    ]);
    // Secrets (deploy/README.md): the server's pair (signed by the CA the
    // agents trust, here the cluster's) and, as its client pair toward
    // kubelets, kube-apiserver's own (kubeadm's apiserver-kubelet-client).
    let env = &cluster.env;
    use rcgen::ExtendedKeyUsagePurpose::ServerAuth;
    let (sc, sk) = env.issue(
        "yurt-server",
        "edgetunnel-server",
        &[CLOUD_IP, "localhost"],
        &[ServerAuth],
    );
    let (pc, pk) = (
        cluster.certs.kubelet_client.0.display().to_string(),
        cluster.certs.kubelet_client.1.display().to_string(),
    );
    let secret = |name: &str, files: &[(&str, &str)]| {
        let mut args = vec!["-n", "kube-system", "create", "secret", "generic", name];
        let files: Vec<String> = files
            .iter()
            .map(|(key, path)| format!("--from-file={key}={path}"))
            .collect();
        args.extend(files.iter().map(String::as_str));
        kas.kubectl_ok(&args);
    };
    secret(
        "edgetunnel-server-certs",
        &[
            ("server.crt", &sc),
            ("server.key", &sk),
            ("proxy-client.crt", &pc),
            ("proxy-client.key", &pk),
        ],
    );
    let ca = cluster.certs.ca.display().to_string();
    secret("edgetunnel-agent-certs", &[("ca.crt", &ca)]);
    let cloud = std::fs::read_to_string(repo().join("deploy/edgetunnel-yurt-cloud.yaml")).unwrap();
    apply(kas, &cloud);
    let agent = std::fs::read_to_string(repo().join("deploy/edgetunnel-agent.yaml")).unwrap();
    let default_addr = "--server-addr=edgetunnel.example.com:10262";
    assert_eq!(agent.matches(default_addr).count(), 1);
    apply(
        kas,
        &agent.replace(default_addr, &format!("--server-addr={CLOUD_IP}:10262")),
    );
    let server = wait_pods_ready(
        kas,
        "app=edgetunnel-server",
        "cp-1",
        &cluster,
        Duration::from_secs(90),
    );
    // The agent's CSR, approved as deploy/README.md says; the controller
    // manager signs it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = kas.kubectl(&["get", "csr", "-o", "name"]);
        let csrs: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("edgetunnel-agent"))
            .map(str::to_string)
            .collect();
        if let Some(csr) = csrs.first() {
            kas.kubectl_ok(&["certificate", "approve", csr]);
            break;
        }
        assert!(Instant::now() < deadline, "no agent CSR within 60 s");
        std::thread::sleep(Duration::from_millis(250));
    }
    let agents = wait_pods_ready(
        kas,
        "app=edgetunnel-agent",
        EDGE_NODE,
        &cluster,
        Duration::from_secs(90),
    );
    // The server's DNAT rule for the edge node, in the cloud node's
    // namespace (where kube-apiserver runs).
    let deadline = Instant::now() + Duration::from_secs(60);
    let rules = loop {
        let out = crate::real_node::in_ns(&cluster.net.cloud.0, "iptables-save")
            .args(["-t", "nat"])
            .output()
            .unwrap();
        let rules = String::from_utf8_lossy(&out.stdout).into_owned();
        if rules.contains(KUBELET_IP) || Instant::now() > deadline {
            break rules;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        rules.contains(KUBELET_IP),
        "no DNAT rule for {KUBELET_IP}:\n{rules}"
    );
    let reached = reach_the_edge(&cluster, "yurt-tunnel");
    // kube-apiserver's dials come in through the DNAT rules here, which
    // the old server leaves to the new one.
    let image = rolled_image(&cluster);
    let rolled = roll_under_load(
        &cluster,
        &cluster.cp,
        &image,
        ("edgetunnel-server", "server"),
        rollout::TOOK_OVER,
    );
    eprintln!(
        "yurt-tunnel layout on real nodes in {:.1} s: server {server:?}, agents {agents:?}; {reached}; {rolled}",
        t0.elapsed().as_secs_f64()
    );
}
