//! The README's "From zero to a cluster", followed as written on real
//! nodes. The shell block under that heading is parsed (so the README
//! cannot drift from this test) and every command in it runs through `sh
//! -c` on a node: the control-plane node (the cloud network namespace of
//! `kube_cluster`) or, for the per-node step, the edge node too, each with
//! its own `/etc/kubernetes` and `/var/lib/kubelet` bind-mounted in a
//! private mount namespace. Only documented placeholders are replaced
//! (`<server address>`, `<edge node>`, `<ns>`, `<pod on an edge node>`, the
//! agent manifest's `--server-addr` that step 4 says to set), `sudo` is
//! dropped (root here), and `edgetunnel` on PATH is the built binary.
//!
//! The nodes are real ([`crate::real_node`]): the peers' kubelet with
//! Debian's containerd and runc on each, kube-controller-manager (the
//! DaemonSet controller, the CSR signer) and kube-scheduler beside
//! kube-apiserver, which runs as its static pod would, seeing the
//! control-plane node's `/etc/kubernetes`. Step 1's `docker build` is
//! replaced by packing the image its Dockerfile's final stage declares
//! ([`crate::node_image`]) and importing it into both nodes' containerd.
//!
//! Checked on the way: the Secrets hold the keys the pods mount; each
//! Service selects its DaemonSet's pods in the same namespace; each
//! ServiceAccount can do what its role needs and not more (`kubectl auth
//! can-i --as`); each DaemonSet's pod is placed on its node only; the
//! server and agent run under the shipped seccomp profile and
//! securityContext and keep io_uring; the agent's CSR, approved by step 5,
//! is signed by the controller manager; the kubelet's probes never restart
//! a pod; and at the end step 7's `kubectl logs`, then `kubectl exec` and
//! `kubectl port-forward`, reach a pod on the edge node through the egress
//! selector file step 6 installed, the server's unix socket and the agent,
//! the only way from the cloud to that node.
//!
//! The mount points are made on the host where missing (empty
//! directories, removed again at the end).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{serial, tail};
use crate::kube_cluster::{run_bounded, KubeApiserver, CLOUD_IP, KUBELET_IP, KUBELET_PORT};
use crate::node_image;
use crate::real_node::{
    pod_json, pod_log, wait_running, wait_until, Cluster, ControlPlane, RealNode, CP_NODE,
    EDGE_NODE,
};
use crate::rollout;
use crate::support::{repo, BIN};

/// The heading whose shell block is the deploy path.
const HEADING: &str = "### From zero to a cluster";

/// One numbered step of the README's block: its comment lines and its
/// commands (continuation lines joined).
#[derive(Debug, Default)]
struct Step {
    n: u32,
    comments: Vec<String>,
    commands: Vec<String>,
}

/// The steps of the first ```sh block under [`HEADING`].
fn readme_steps(readme: &str) -> Vec<Step> {
    let after = readme
        .split_once(HEADING)
        .unwrap_or_else(|| panic!("README.md has no {HEADING:?}"))
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, b)| b.split_once("\n```"))
        .map(|(b, _)| b)
        .expect("a ```sh block under the heading");
    let mut steps: Vec<Step> = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        let t = line.trim();
        if let Some(c) = t.strip_prefix('#') {
            let c = c.trim();
            let number = c.split_once('.').and_then(|(n, _)| n.parse::<u32>().ok());
            if let Some(n) = number {
                steps.push(Step {
                    n,
                    ..Step::default()
                });
            }
            steps
                .last_mut()
                .expect("the block starts with a numbered comment")
                .comments
                .push(c.to_string());
            continue;
        }
        if t.is_empty() {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(t);
                steps
                    .last_mut()
                    .expect("a command after a numbered comment")
                    .commands
                    .push(std::mem::take(&mut pending));
            }
        }
    }
    steps
}

/// Replaces the documented placeholders; panics on one left over.
fn substitute(cmd: &str) -> String {
    let mut c = cmd.to_string();
    for (from, to) in [
        ("<server address>", CLOUD_IP),
        ("<edge node>", EDGE_NODE),
        ("<ns>", "default"),
        ("<pod on an edge node>", "p1"),
    ] {
        c = c.replace(from, to);
    }
    // Root here, and sudo may not be installed.
    c = c.replace("sudo ", "");
    assert!(
        !c.contains('<'),
        "an undocumented placeholder in the README's command {cmd:?}"
    );
    c
}

/// A node's own directories (its `/etc/kubernetes`, `/var/lib/kubelet`).
struct Node {
    root: PathBuf,
    netns: String,
}

impl Node {
    fn host(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// The node's directories, to bind-mount over the real paths.
    fn binds(&self) -> Vec<(PathBuf, String)> {
        ["/etc/kubernetes", "/var/lib/kubelet"]
            .into_iter()
            .map(|p| {
                let h = self.host(p);
                std::fs::create_dir_all(&h).unwrap();
                (h, p.to_string())
            })
            .collect()
    }
}

/// The mount points this test may create on the host, deepest first;
/// those absent at the start are removed at the end (when empty).
const MOUNT_POINTS: [&str; 9] = [
    "/etc/kubernetes/edgetunnel",
    "/etc/kubernetes",
    "/var/lib/kubelet",
    "/etc/edgetunnel/certs",
    "/etc/edgetunnel",
    "/var/lib/edgetunnel",
    "/run/secrets/kubernetes.io/serviceaccount",
    "/run/secrets/kubernetes.io",
    "/run/secrets",
];

struct MountPoints(Vec<&'static str>);

impl MountPoints {
    fn note() -> MountPoints {
        MountPoints(
            MOUNT_POINTS
                .into_iter()
                .filter(|p| !Path::new(p).exists())
                .collect(),
        )
    }
}

impl Drop for MountPoints {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// `argv` in network namespace `ns` and a private mount namespace where
/// each `(src, dst)` is bind-mounted (dst made first when missing).
fn in_mounts(ns: &str, binds: &[(PathBuf, String)], argv: &[OsString]) -> Command {
    let mut script = String::from("set -e\n");
    for (i, _) in binds.iter().enumerate() {
        let (s, d) = (2 * i + 1, 2 * i + 2);
        script.push_str(&format!(
            "mkdir -p \"${{{d}}}\"; mount --bind \"${{{s}}}\" \"${{{d}}}\"\n"
        ));
    }
    script.push_str(&format!("shift {}\nexec \"$@\"\n", 2 * binds.len()));
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        ns,
        "unshare",
        "-m",
        "--propagation",
        "private",
    ])
    .args(["sh", "-c", &script, "pod"]);
    for (s, d) in binds {
        c.arg(s).arg(d);
    }
    c.args(argv);
    c
}

/// Runs one README command on `node` (cwd `work`, kubectl's admin
/// kubeconfig, `edgetunnel` on PATH); fails the test unless it succeeds.
fn run_step(node: &Node, work: &Path, kubeconfig: &Path, bin_dir: &Path, cmd: &str) -> String {
    let mut c = in_mounts(
        &node.netns,
        &node.binds(),
        &["sh".into(), "-c".into(), cmd.into()],
    );
    c.current_dir(work).env("KUBECONFIG", kubeconfig).env(
        "PATH",
        format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    );
    let out = run_bounded(c, None, Duration::from_secs(60));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the README's command {cmd:?} on {} failed ({}):\n{said}",
        node.root.display(),
        out.status
    );
    said
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn get_json(kas: &KubeApiserver, args: &[&str]) -> Value {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "json"]);
    serde_json::from_slice(&kas.kubectl_ok(&a)).expect("kubectl get -o json")
}

/// Whether `labels` has every pair of `selector`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels[k] == *v))
}

/// `kubectl auth can-i` as `sa` (`namespace:name`): yes or no.
fn can_i(kas: &KubeApiserver, sa: &str, verb: &str, what: &str, ns: &str) -> bool {
    let who = format!("--as=system:serviceaccount:{sa}");
    let out = kas.kubectl(&["auth", "can-i", verb, what, "-n", ns, &who]);
    match text(&out).trim() {
        "yes" => true,
        "no" => false,
        other => panic!(
            "can-i {verb} {what} as {sa}: {other:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[test]
fn the_readmes_deploy_path_as_written_runs_on_real_nodes() {
    let _g = serial();
    let t0 = Instant::now();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let steps = readme_steps(&readme);
    assert_eq!(
        steps.iter().map(|s| s.n).collect::<Vec<_>>(),
        (1..=steps.len() as u32).collect::<Vec<_>>(),
        "{steps:?}"
    );
    let step = |n: u32| &steps[n as usize - 1];
    let _mount_points = MountPoints::note();
    // 1. The image. No Docker engine here: the cluster packs the image as
    // the Dockerfile's final stage declares it (from the test build's
    // binary) and imports it into each node's containerd, as `docker
    // build` and a registry would put it there.
    let s1 = step(1);
    assert_eq!(
        s1.commands,
        ["docker build -t edgetunnel:0.1.0 ."],
        "{s1:?}"
    );
    let Some(mut cluster) = Cluster::start(&[], true) else {
        return;
    };
    cluster.mark_control_plane();
    let kas = cluster.kas();
    let (env, net) = (&cluster.env, &cluster.net);
    let (cp_node, edge_node) = (&cluster.cp, &cluster.edge);
    let _workload = &cluster.images.workload;
    let stage = &cluster.images.stage;
    let mut said = vec![format!(
        "1: packed as the Dockerfile's final stage ({} packages, user {:?}); two real nodes Ready after {:.1} s",
        stage.packages.len(),
        stage.user,
        t0.elapsed().as_secs_f64()
    )];
    // The working copy the operator runs from: the repository's deploy/
    // and Dockerfile.
    let work = env.path("work");
    std::fs::create_dir_all(&work).unwrap();
    let cp_r = Command::new("cp")
        .arg("-r")
        .arg(repo().join("deploy"))
        .arg(&work)
        .status()
        .unwrap();
    assert!(cp_r.success());
    let bin_dir = env.path("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::os::unix::fs::symlink(BIN, bin_dir.join("edgetunnel")).unwrap();
    let kubeconfig = kas.kubeconfig.clone();
    let run = |node: &Node, cmd: &str| run_step(node, &work, &kubeconfig, &bin_dir, cmd);
    // The operator's shell on each node: its files, its network.
    let cp = Node {
        root: cp_node.fs.clone(),
        netns: net.cloud.0.clone(),
    };
    let edge = Node {
        root: edge_node.fs.clone(),
        netns: net.node.0.clone(),
    };

    // 2. Certificates and Secrets.
    for c in &step(2).commands {
        run(&cp, &substitute(c));
    }
    said.push(format!("2: {} commands run", step(2).commands.len()));

    // 3. The seccomp profile, on every node.
    for node in [&cp, &edge] {
        for c in &step(3).commands {
            run(node, &substitute(c));
        }
    }

    // 4. The manifests; the agent manifest's --server-addr set first, as
    // the step says.
    let agent_yaml = work.join("deploy/edgetunnel-agent.yaml");
    let y = std::fs::read_to_string(&agent_yaml).unwrap();
    let default_addr = "--server-addr=edgetunnel.example.com:10262";
    assert_eq!(
        y.matches(default_addr).count(),
        1,
        "{default_addr} in the agent manifest"
    );
    std::fs::write(
        &agent_yaml,
        y.replace(default_addr, &format!("--server-addr={CLOUD_IP}:10262")),
    )
    .unwrap();
    for c in &step(4).commands {
        run(&cp, &substitute(c));
    }

    // What the API server holds now.
    let ds_server = get_json(
        kas,
        &["daemonset", "edgetunnel-server", "-n", "kube-system"],
    );
    let ds_agent = get_json(kas, &["daemonset", "edgetunnel-agent", "-n", "kube-system"]);
    let svc = get_json(kas, &["service", "edgetunnel-server", "-n", "kube-system"]);
    assert!(
        selects(
            &svc["spec"]["selector"],
            &ds_server["spec"]["template"]["metadata"]["labels"]
        ) && svc["metadata"]["namespace"] == ds_server["metadata"]["namespace"],
        "Service edgetunnel-server selects no pod of its DaemonSet: {}",
        svc["spec"]["selector"]
    );
    for ds in [&ds_server, &ds_agent] {
        assert_eq!(
            ds["spec"]["template"]["spec"]["containers"][0]["image"], "edgetunnel:0.1.0",
            "the image step 1 builds"
        );
    }
    // Each DaemonSet's pod lands on its node, and only there (the
    // DaemonSet controller and the kubelets decide).
    let nodes = cluster.nodes();
    let server_pod = ds_pod(kas, &ds_server, CP_NODE, &nodes, &cluster.control_plane);
    let agent_pod = ds_pod(kas, &ds_agent, EDGE_NODE, &nodes, &cluster.control_plane);
    // The Secrets hold what the pods mount.
    for (secret, keys) in [
        ("edgetunnel-server-certs", &["server.crt", "server.key"][..]),
        ("edgetunnel-agent-certs", &["ca.crt"][..]),
    ] {
        let s = get_json(kas, &["secret", secret, "-n", "kube-system"]);
        for k in keys {
            assert!(
                s["data"][k].is_string(),
                "Secret {secret} has no {k}: {}",
                s["data"]
            );
        }
    }
    // RBAC: what each role needs, and not more.
    let server_sa = "kube-system:edgetunnel-server";
    let agent_sa = "kube-system:edgetunnel-agent";
    for verb in ["get", "create", "update", "list", "delete"] {
        assert!(
            can_i(
                kas,
                server_sa,
                verb,
                "leases.coordination.k8s.io",
                "kube-system"
            ),
            "server {verb} leases"
        );
    }
    assert!(!can_i(kas, server_sa, "watch", "nodes", "kube-system"));
    assert!(!can_i(kas, server_sa, "get", "secrets", "kube-system"));
    assert!(!can_i(
        kas,
        server_sa,
        "create",
        "leases.coordination.k8s.io",
        "default"
    ));
    for verb in ["create", "get"] {
        assert!(
            can_i(
                kas,
                agent_sa,
                verb,
                "certificatesigningrequests.certificates.k8s.io",
                "default"
            ),
            "agent {verb} csr"
        );
    }
    assert!(can_i(
        kas,
        agent_sa,
        "list",
        "leases.coordination.k8s.io",
        "kube-system"
    ));
    assert!(!can_i(
        kas,
        agent_sa,
        "create",
        "leases.coordination.k8s.io",
        "kube-system"
    ));
    assert!(!can_i(kas, agent_sa, "get", "secrets", "kube-system"));
    said.push("4: applied; selectors, node placement, Secrets and RBAC checked".to_string());

    // The kubelets run the pods: the server is Ready; the agent runs and
    // asks for its certificate. An operator quick off the mark runs step 5
    // before any agent has asked: it must do no harm.
    wait_ready(
        kas,
        &server_pod,
        Duration::from_secs(90),
        &[cp_node, edge_node],
    );
    for c in &step(5).commands {
        run(&cp, &substitute(c));
    }

    // 5. Approve the agent's request once it is there; the controller
    // manager's signer issues it.
    wait_until(
        "the agent's CSR",
        Duration::from_secs(60),
        || text(&kas.kubectl(&["get", "csr", "-o", "name"])).contains("edgetunnel-agent"),
        || pod_log(edge_node, &agent_pod),
    );
    for c in &step(5).commands {
        let out = run(&cp, &substitute(c));
        assert!(out.contains("approved"), "{out}");
    }
    wait_until(
        "the agent's link (CONNECTED)",
        Duration::from_secs(60),
        || pod_log(edge_node, &agent_pod).contains("CONNECTED"),
        || pod_log(edge_node, &agent_pod),
    );
    wait_ready(
        kas,
        &agent_pod,
        Duration::from_secs(60),
        &[cp_node, edge_node],
    );
    said.push("5: run; kube-controller-manager signed the agent's certificate".to_string());

    // 6. The egress selector file, and kube-apiserver restarted with the
    // flag the step names.
    let s6 = step(6);
    for c in &s6.commands {
        run(&cp, &substitute(c));
    }
    let flag = s6
        .comments
        .iter()
        .find(|c| c.starts_with("--egress-selector-config-file="))
        .expect("step 6 names the flag")
        .clone();
    cluster.restart_apiserver(&[flag]);
    let kas = cluster.kas();
    let (env, net) = (&cluster.env, &cluster.net);
    let (cp_node, edge_node) = (&cluster.cp, &cluster.edge);
    let workload = &cluster.images.workload;

    // 7. Logs of a pod on the edge node, which the scheduler places there.
    let lines: String = (1..=300).map(|i| format!("edge line {i}\n")).collect();
    let mut p1 = pod_json(
        "p1",
        EDGE_NODE,
        &workload.name,
        "for i in $(seq 1 300); do echo \"edge line $i\"; done; exec nc -ll -p 18080 -e cat",
    );
    p1["spec"].as_object_mut().unwrap().remove("nodeName");
    p1["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": EDGE_NODE});
    kas.create(env, "pod-p1", &p1);
    let p1 = wait_running(
        kas,
        "default",
        "p1",
        Duration::from_secs(60),
        &[cp_node, edge_node],
    );
    assert_eq!(p1["spec"]["nodeName"], EDGE_NODE, "{}", p1["spec"]);
    let kubelet_addr: std::net::SocketAddr =
        format!("{KUBELET_IP}:{KUBELET_PORT}").parse().unwrap();
    if let Err(e) = net.cloud_cannot_reach(kubelet_addr) {
        panic!("{e}");
    }
    let s7 = step(7);
    assert_eq!(s7.commands.len(), 1, "{s7:?}");
    let got = run(&cp, &substitute(&s7.commands[0]));
    assert_eq!(got, lines, "step 7's logs");
    said.push("6, 7: run; kubectl logs came through the tunnel".to_string());

    // exec and port-forward reach the same pod the same way.
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    exec_and_port_forward_echo(kas, "p1", &data, "deploy path");
    said.push("exec and port-forward: 200,000 bytes each way".to_string());

    // The probes as the kubelet ran them all along: nothing restarted.
    for pod in [&server_pod, &agent_pod] {
        let v = get_json(kas, &["pod", "-n", "kube-system", pod]);
        let st = &v["status"]["containerStatuses"][0];
        assert_eq!(st["restartCount"], 0, "{pod}: {st}");
        assert_eq!(st["ready"], true, "{pod}: {st}");
    }
    // Under the shipped seccomp profile both kept io_uring (the `auto`
    // driver would have fallen back to epoll had it been refused).
    for (node, pod) in [(&cp_node, &server_pod), (&edge_node, &agent_pod)] {
        let log = pod_log(node, pod);
        assert!(
            log.contains("driver=\"io_uring\""),
            "{pod} is not on io_uring under edgetunnel.json:\n{}",
            tail(&log, 10)
        );
    }
    let logs_again = |what: &str| {
        let t = Instant::now();
        wait_until(
            &format!("kubectl logs through the tunnel {what}"),
            Duration::from_secs(90),
            || {
                let o = kas.kubectl(&["logs", "-n", "default", "p1", "--request-timeout=10s"]);
                o.status.success() && o.stdout == lines.as_bytes()
            },
            || {
                format!(
                    "--- server:\n{}\n--- agent:\n{}",
                    tail(
                        &pod_log(cp_node, &current_pod(kas, "edgetunnel-server")),
                        15
                    ),
                    tail(
                        &pod_log(edge_node, &current_pod(kas, "edgetunnel-agent")),
                        15
                    )
                )
            },
        );
        t.elapsed()
    };

    // What a real cluster does to the tunnel. The runtime kills the agent
    // (SIGKILL, as the OOM killer would): the kubelet restarts it, and it
    // links again with the certificate it kept.
    let id = container_id(kas, &agent_pod);
    let killed = Command::new("ctr")
        .arg("--address")
        .arg(&edge_node.sock)
        .args(["-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", &id])
        .output()
        .unwrap();
    assert!(killed.status.success(), "{killed:?}");
    wait_until(
        "the kubelet's restart of the killed agent",
        Duration::from_secs(60),
        || {
            let v = get_json(kas, &["pod", "-n", "kube-system", &agent_pod]);
            let st = &v["status"]["containerStatuses"][0];
            st["restartCount"] == 1 && st["ready"] == true
        },
        || edge_node.kubelet_log(),
    );
    let after = logs_again("after the agent was killed");
    said.push(format!(
        "agent killed by the runtime: restarted, logs again after {:.1} s",
        after.as_secs_f64()
    ));

    // The agent evicted (the Eviction API, as a drain or the kubelet's
    // pressure eviction does): the DaemonSet controller makes a new pod.
    let eviction = env.path("eviction.json");
    std::fs::write(
        &eviction,
        json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": agent_pod, "namespace": "kube-system"}})
        .to_string(),
    )
    .unwrap();
    kas.kubectl_ok(&[
        "create",
        "--raw",
        &format!("/api/v1/namespaces/kube-system/pods/{agent_pod}/eviction"),
        "-f",
        &eviction.display().to_string(),
    ]);
    wait_until(
        "a new agent pod",
        Duration::from_secs(90),
        || {
            let p = current_pod(kas, "edgetunnel-agent");
            !p.is_empty() && p != agent_pod && {
                let v = get_json(kas, &["pod", "-n", "kube-system", &p]);
                v["status"]["containerStatuses"][0]["ready"] == true
            }
        },
        || edge_node.kubelet_log(),
    );
    let after = logs_again("after the agent was evicted");
    said.push(format!(
        "agent evicted: a new pod, logs again after {:.1} s",
        after.as_secs_f64()
    ));

    // The server DaemonSet, then the agent's, rolled to a new image under
    // load (deploy/README.md "Upgrades"): each new pod takes the old one's
    // listeners over; the new agent links before the old one drains.
    let (rolled, _) = node_image::edgetunnel(
        &cluster.images.dir,
        Path::new(BIN),
        "edgetunnel:0.1.0-rollout",
    );
    for (node, ds, container) in [
        (cp_node, "edgetunnel-server", "server"),
        (edge_node, "edgetunnel-agent", "agent"),
    ] {
        node.import(&rolled);
        let old = current_pod(kas, ds);
        let roll = rollout::roll_daemonset(
            &cluster,
            node,
            &rolled.name,
            (ds, container),
            rollout::TOOK_OVER,
            &lines,
        );
        let after = logs_again(&format!("after {ds} rolled"));
        let new = current_pod(kas, ds);
        assert_ne!(new, old);
        assert_eq!(new, roll.new_pod);
        let v = get_json(kas, &["pod", "-n", "kube-system", &new]);
        assert_eq!(
            v["spec"]["containers"][0]["image"],
            rolled.name.as_str(),
            "{}",
            v["spec"]
        );
        said.push(format!(
            "{container} rolled to a new image in {:.1} s (logs again {:.1} s later) through a handover: \
             {} kubectl logs during the roll, none failed; the held logs -f streamed on through it ({} lines)",
            roll.took.as_secs_f64(),
            after.as_secs_f64(),
            roll.logs_ok,
            roll.followed,
        ));
    }
    eprintln!(
        "README deploy path on real nodes in {:.1} s: {}",
        t0.elapsed().as_secs_f64(),
        said.join("; ")
    );
}

/// `kubectl rollout status` of DaemonSet `kube-system/ds`: it must end
/// within two minutes.
pub(crate) fn rollout_status(kas: &KubeApiserver, ds: &str) {
    let status = run_bounded(
        kas.kubectl_cmd(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            &format!("daemonset/{ds}"),
            "--timeout=120s",
        ]),
        None,
        Duration::from_secs(130),
    );
    assert!(
        status.status.success(),
        "rollout of {ds}: {}\n{}",
        text(&status),
        String::from_utf8_lossy(&status.stderr)
    );
}

/// The one pod of DaemonSet `ds` (as the API server holds it), once it is
/// placed and the only one: on `node`.
fn ds_pod(
    kas: &KubeApiserver,
    ds: &Value,
    node: &str,
    nodes: &[&RealNode],
    control_plane: &ControlPlane,
) -> String {
    let selector: Vec<String> = ds["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    let selector = selector.join(",");
    let ns = ds["metadata"]["namespace"].as_str().unwrap();
    let mut last = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        last = get_json(kas, &["pods", "-n", ns, "-l", &selector]);
        let items = last["items"].as_array().cloned().unwrap_or_default();
        let placed: Vec<&str> = items
            .iter()
            .filter_map(|p| p["spec"]["nodeName"].as_str())
            .collect();
        if !items.is_empty() && placed.len() == items.len() {
            assert_eq!(placed, [node], "{selector}: pods on {placed:?}");
            return items[0]["metadata"]["name"].as_str().unwrap().to_string();
        }
        thread::sleep(Duration::from_millis(250));
    }
    let logs: String = nodes
        .iter()
        .map(|n| format!("--- kubelet {}:\n{}\n", n.name, tail(&n.kubelet_log(), 15)))
        .collect();
    panic!(
        "no pod of {selector} placed within 60 s: {}\n{logs}\n{}",
        last["items"],
        control_plane.logs()
    );
}

/// The name of the pod of DaemonSet `ds` (label `app=ds`) in kube-system
/// that is not being deleted, or "".
fn current_pod(kas: &KubeApiserver, ds: &str) -> String {
    let v = get_json(
        kas,
        &["pods", "-n", "kube-system", "-l", &format!("app={ds}")],
    );
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["metadata"]["deletionTimestamp"].is_null())
        .and_then(|p| p["metadata"]["name"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The runtime's ID of pod `kube-system/name`'s container.
fn container_id(kas: &KubeApiserver, name: &str) -> String {
    let v = get_json(kas, &["pod", "-n", "kube-system", name]);
    v["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("containerd://")
        .to_string()
}

/// Waits until pod `kube-system/name`'s container is ready.
fn wait_ready(kas: &KubeApiserver, name: &str, within: Duration, nodes: &[&RealNode]) {
    wait_until(
        &format!("pod {name} ready"),
        within,
        || {
            let v = get_json(kas, &["pod", "-n", "kube-system", name]);
            v["status"]["containerStatuses"][0]["ready"] == true
        },
        || {
            let v = get_json(kas, &["pod", "-n", "kube-system", name]);
            let logs: String = nodes
                .iter()
                .map(|n| format!("--- {}:\n{}\n", n.name, pod_log(n, name)))
                .collect();
            format!("{}\n{logs}", v["status"])
        },
    );
}

/// `data` through `kubectl exec -i POD -- cat` and through a port-forward
/// to the pod's echo on 18080: both must bring it back whole (`what` names
/// the case in the message).
pub(crate) fn exec_and_port_forward_echo(kas: &KubeApiserver, pod: &str, data: &[u8], what: &str) {
    let out = kas.kubectl_stdin(
        &["exec", "-i", "-n", "default", pod, "--", "cat"],
        data.to_vec(),
    );
    assert!(
        out.status.success() && out.stdout == data,
        "{what}: kubectl exec -i {pod} -- cat: {} of {} bytes back, {}",
        out.stdout.len(),
        data.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    let echoed = port_forward_echo(kas, pod, 18080, data);
    assert!(
        echoed == data,
        "{what}: port-forward: {} of {} bytes back",
        echoed.len(),
        data.len()
    );
}

/// `kubectl port-forward pod/POD :PORT` in the cloud namespace, `data`
/// sent through it to the pod's echo; what came back.
fn port_forward_echo(kas: &KubeApiserver, pod: &str, port: u16, data: &[u8]) -> Vec<u8> {
    use std::io::{BufRead, Read, Write};
    let mut cmd = kas.kubectl_cmd(&[
        "port-forward",
        "-n",
        "default",
        "--address",
        "127.0.0.1",
        &format!("pod/{pod}"),
        &format!(":{port}"),
    ]);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl port-forward");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let local: std::net::SocketAddr = lines
        .next()
        .and_then(|l| l.ok())
        .and_then(|l| {
            l.strip_prefix("Forwarding from ")
                .and_then(|r| r.split(" -> ").next())
                .and_then(|a| a.parse().ok())
        })
        .unwrap_or_else(|| {
            let _ = child.kill();
            let mut e = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut e);
            panic!("kubectl port-forward printed no address: {e}")
        });
    let ns = kas.netns().to_string();
    let data = data.to_vec();
    let got = crate::kube_cluster::in_netns(&ns, move || {
        let mut s = std::net::TcpStream::connect(local).expect("connect to port-forward");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut w = s.try_clone().unwrap();
        let n = data.len();
        let writer = thread::spawn(move || w.write_all(&data));
        let mut got = vec![0u8; n];
        let mut read = 0;
        while read < n {
            match s.read(&mut got[read..]) {
                Ok(0) | Err(_) => break,
                Ok(k) => read += k,
            }
        }
        got.truncate(read);
        let _ = writer.join();
        got
    });
    let _ = child.kill();
    let _ = child.wait();
    got
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn readme_steps_are_parsed_from_the_block() {
        let md = "x\n### From zero to a cluster\ntext\n```sh\n# 1. One\n#    more\na b \\\n  c\n# 2. Two\n# --flag=x\nd <ns>\n```\n```sh\nno\n```\n";
        let s = readme_steps(md);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].commands, ["a b c"]);
        assert_eq!(s[0].comments, ["1. One", "more"]);
        assert_eq!(s[1].comments[1], "--flag=x");
        assert_eq!(substitute(&s[1].commands[0]), "d default");
    }
}
