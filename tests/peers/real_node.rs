//! Real nodes for the deploy tests: the peers' kubelet with Debian's
//! containerd and runc, in a network namespace of the test's own, and the
//! peers' kube-controller-manager and kube-scheduler beside
//! kube-apiserver. Nothing of a node is played by the test.
//!
//! What it takes on these machines (the peers' README, "A real node"):
//! the kubelet runs in the namespace through `nsenter --net` (not `ip
//! netns exec`, which remounts /sys); a cgroup v1 host wants
//! `failCgroupV1: false` and the cgroupfs driver; containerd's CRI must
//! not raise `oom_score_adj` (`restrict_oom_score_adj`); images are
//! docker-archives imported with `ctr` ([`crate::node_image`]); other
//! pods than hostNetwork ones get a bridge and an address from the node's
//! range (Debian's CNI plugins), the node forwarding and masquerading.
//!
//! Each node has its own containerd (root, state, socket) and kubelet
//! root under the test's directory, and its own cgroup root
//! (`/edgetunnel-test-NODE` in every v1 hierarchy), so that two nodes
//! share the machine without sharing a pod. The host directories the two
//! still create (`/run/containerd`, `/run/netns/cni-*`,
//! `/usr/libexec/kubernetes`, `/var/log/pods`, `/var/log/containers`) are
//! removed at the end when they were not there before.
//!
//! There is no kube-proxy among the peers: the one rule it would
//! program for the `kubernetes` Service (its ClusterIP's port 443 to
//! kube-apiserver) is installed in each node's namespace, so that pods
//! find the API as in-cluster clients do.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{tail, Logged};
use crate::kube_cluster::{KubeApiserver, KubeCerts, APISERVER, CLOUD_IP};
use crate::node_image::Archive;
use crate::support::Env;

/// The `kubernetes` Service's ClusterIP (the first of
/// `--service-cluster-ip-range`).
pub(crate) const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// `--service-cluster-ip-range`.
pub(crate) const SERVICE_RANGE: &str = "10.96.0.0/24";
/// The sandbox image every node's containerd names.
pub(crate) const PAUSE_IMAGE: &str = "localhost/pause:test";

/// How long a node may take to go Ready.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// Host directories the kubelet and containerd create: removed at the end
/// if they did not exist before.
const HOST_DIRS: &[&str] = &[
    "/etc/kubernetes",
    "/etc/edgetunnel",
    "/var/lib/edgetunnel",
    "/run/containerd",
    "/usr/libexec/kubernetes",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/kubelet",
];

/// Notes which of [`HOST_DIRS`] are missing and which pod network
/// namespaces (`/run/netns/cni-*`, made by containerd for pods that are not
/// hostNetwork) exist, and removes what is new again on drop (after the
/// nodes stopped).
pub(crate) struct HostDirs {
    missing: Vec<&'static str>,
    netns: Vec<PathBuf>,
}

fn cni_netns() -> Vec<PathBuf> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("cni-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

impl HostDirs {
    pub(crate) fn note() -> HostDirs {
        HostDirs {
            missing: HOST_DIRS
                .iter()
                .copied()
                .filter(|d| !Path::new(d).exists())
                .collect(),
            netns: cni_netns(),
        }
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        for ns in cni_netns() {
            if !self.netns.contains(&ns) {
                let _ = Command::new("umount").arg(&ns).output();
                let _ = std::fs::remove_file(&ns);
            }
        }
        for d in &self.missing {
            let _ = Command::new("umount").arg("-R").arg(d).output();
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A command in network namespace `ns` through `nsenter --net`.
pub(crate) fn in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/var/run/netns/{ns}")).arg(program);
    c
}

fn check(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cgroup v1 hierarchies of this machine (`/sys/fs/cgroup/*` except
/// the unified one).
fn v1_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.file_name().is_some_and(|n| n != "unified") && p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes a cgroup subtree, deepest first (the kernel refuses a
/// non-empty one).
fn remove_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// One node: containerd and a kubelet in a network namespace.
pub(crate) struct RealNode {
    pub name: String,
    pub dir: PathBuf,
    /// This node's file system view: `fs/etc/kubernetes` is what its
    /// kubelet and runtime see at `/etc/kubernetes` (see [`RealNode::start`]).
    pub fs: PathBuf,
    pub sock: PathBuf,
    cgroup: String,
    // Dropped in this order: the kubelet, then containerd.
    pub kubelet: Option<Logged>,
    pub containerd: Option<Logged>,
}

impl RealNode {
    /// Starts containerd and the kubelet of node `name` (address `ip`,
    /// already in namespace `ns`), registering with `kas`; imports
    /// `images` first. Both run in a private mount namespace where this
    /// node's directories are bind-mounted over the host's: `fs/var/lib/kubelet`
    /// (the kubelet's root, with `seccomp/`) and `fs/` + each of `paths`
    /// (for example `/etc/kubernetes`), so that hostPath volumes and the
    /// files an operator installs on "the node" are this node's own. Waits
    /// until the node is Ready.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        env: &Env,
        kas: &KubeApiserver,
        certs: &KubeCerts,
        name: &str,
        ip: &str,
        pod_cidr: &str,
        ns: &str,
        paths: &[&str],
        images: &[&Archive],
    ) -> RealNode {
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let dir = env.path(&format!("node-{name}"));
        let fs = dir.join("fs");
        let root = fs.join("var/lib/kubelet");
        let cni = dir.join("cni");
        for d in [&root, &cni, &dir.join("containerd"), &dir.join("logs")] {
            std::fs::create_dir_all(d).unwrap();
        }
        let sock = dir.join("containerd.sock");
        // Pods that are not hostNetwork get an address from the node's
        // range on a bridge, the node routing and masquerading for them
        // (Debian's bridge and host-local plugins).
        std::fs::write(
            cni.join("10-pods.conflist"),
            serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "pods",
                "plugins": [{
                    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": dir.join("cni-ipam"),
                    },
                }],
            })
            .to_string(),
        )
        .unwrap();
        let config = dir.join("containerd.toml");
        std::fs::write(
            &config,
            format!(
                r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
                d = dir.display(),
                sock = sock.display(),
                cni = cni.display(),
            ),
        )
        .unwrap();
        let mut binds: Vec<(PathBuf, String)> = vec![(root.clone(), "/var/lib/kubelet".into())];
        for p in paths {
            binds.push((fs.join(p.trim_start_matches('/')), p.to_string()));
        }
        let mut script = String::from("set -e\n");
        for (i, (src, _)) in binds.iter().enumerate() {
            std::fs::create_dir_all(src).unwrap();
            let (s, d) = (2 * i + 1, 2 * i + 2);
            script.push_str(&format!(
                "mkdir -p \"${{{d}}}\"; mount --bind \"${{{s}}}\" \"${{{d}}}\"\n"
            ));
        }
        script.push_str(&format!("shift {}\nexec \"$@\"\n", 2 * binds.len()));
        let mut cmd = in_ns(ns, "unshare");
        cmd.args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "node",
        ]);
        for (src, dst) in &binds {
            cmd.arg(src).arg(dst);
        }
        cmd.arg("containerd")
            .arg("--config")
            .arg(&config)
            .args(["--log-level", "warn"]);
        let containerd = Logged::spawn(cmd, dir.join("containerd.log"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !sock.exists() {
            assert!(
                Instant::now() < deadline,
                "containerd of {name} did not start:\n{}",
                tail(&containerd.text(), 30)
            );
            thread::sleep(Duration::from_millis(50));
        }
        let mnt = format!("/proc/{}/ns/mnt", containerd.child.id());
        let mut node = RealNode {
            fs,
            name: name.to_string(),
            dir: dir.clone(),
            sock: sock.clone(),
            cgroup: format!("edgetunnel-test-{name}"),
            kubelet: None,
            containerd: Some(containerd),
        };
        for image in images {
            node.import(image);
        }
        // What kube-proxy would program for the `kubernetes` Service, and
        // a route for the Service range (a node's default route would
        // carry it) through the namespace's link.
        let api_port = APISERVER.rsplit(':').next().unwrap();
        check(
            in_ns(ns, "sh")
                .arg("-c")
                .arg(format!(
                    "dev=$(ip -o link | awk -F': ' '$2 != \"lo\" {{print $2; exit}}' | cut -d@ -f1) && \
                     ip route add {SERVICE_RANGE} dev \"$dev\""
                ))
                .output()
                .unwrap(),
            "the Service range's route",
        );
        // From the node itself (hostNetwork pods) and from its pods.
        for chain in ["OUTPUT", "PREROUTING"] {
            check(
                in_ns(ns, "iptables")
                    .args(["-t", "nat", "-A", chain, "-p", "tcp", "-d"])
                    .arg(KUBERNETES_SERVICE_IP)
                    .args(["--dport", "443", "-j", "DNAT", "--to-destination"])
                    .arg(format!("{CLOUD_IP}:{api_port}"))
                    .output()
                    .unwrap(),
                "the kubernetes Service's rule",
            );
        }
        check(
            in_ns(ns, "sysctl")
                .args(["-qw", "net.ipv4.ip_forward=1"])
                .output()
                .unwrap(),
            "forwarding for the node's pods",
        );
        // The node's own cgroup root in every v1 hierarchy.
        for h in v1_hierarchies() {
            let _ = std::fs::create_dir_all(h.join(&node.cgroup));
        }
        let (crt, key) = env.issue_with_org(
            &format!("node-{name}/kubelet-client"),
            &format!("system:node:{name}"),
            Some("system:nodes"),
            &[],
            &[ClientAuth],
        );
        let (serving_crt, serving_key) = env.issue(
            &format!("node-{name}/kubelet-serving"),
            &format!("system:node:{name}"),
            &[ip],
            &[ServerAuth],
        );
        let kubeconfig = dir.join("kubelet.kubeconfig");
        crate::kube_cluster::write_kubeconfig(
            &kubeconfig,
            &format!("{CLOUD_IP}:{api_port}"),
            &certs.ca,
            &format!("client-certificate: {crt}\n    client-key: {key}"),
        );
        let kcfg = dir.join("kubelet.yaml");
        std::fs::write(
            &kcfg,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                 address: {ip}\nport: 10250\nreadOnlyPort: 0\n\
                 healthzBindAddress: 127.0.0.1\nhealthzPort: 10248\n\
                 authentication:\n  anonymous: {{enabled: false}}\n  webhook: {{enabled: true}}\n  \
                 x509: {{clientCAFile: {ca}}}\n\
                 authorization: {{mode: Webhook}}\n\
                 tlsCertFile: {serving_crt}\ntlsPrivateKeyFile: {serving_key}\n\
                 cgroupDriver: cgroupfs\ncgroupRoot: /{cgroup}\nfailSwapOn: false\nfailCgroupV1: false\n\
                 containerRuntimeEndpoint: unix://{sock}\n\
                 podLogsDir: {logs}\n\
                 staticPodPath: /etc/kubernetes/manifests\n\
                 imageGCHighThresholdPercent: 100\n\
                 evictionHard: {{memory.available: 1Mi, nodefs.available: 1%, imagefs.available: 1%}}\n\
                 serializeImagePulls: false\n\
                 registerNode: true\n",
                ca = certs.ca.display(),
                cgroup = node.cgroup,
                sock = sock.display(),
                logs = dir.join("logs").display(),
            ),
        )
        .unwrap();
        std::fs::create_dir_all(node.fs.join("etc/kubernetes/manifests")).unwrap();
        let kubelet_bin = crate::common::peers().expect("peers").bin("kubelet");
        // The kubelet in containerd's mount namespace: the hostPaths it
        // hands the runtime mean the same files to both.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/var/run/netns/{ns}"))
            .arg(format!("--mount={mnt}"))
            .arg(kubelet_bin)
            .arg(format!("--config={}", kcfg.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--root-dir=/var/lib/kubelet")
            .arg(format!("--hostname-override={name}"))
            .arg(format!("--node-ip={ip}"))
            .arg(format!(
                "--volume-plugin-dir={}",
                dir.join("volume-plugins").display()
            ))
            .arg("--v=1");
        node.kubelet = Some(Logged::spawn(cmd, dir.join("kubelet.log")));
        node.wait_ready(kas);
        node
    }

    /// `ctr images import` of a docker-archive into this node's
    /// containerd (the CRI's namespace).
    pub(crate) fn import(&self, image: &Archive) {
        check(
            Command::new("ctr")
                .arg("--address")
                .arg(&self.sock)
                .args(["-n", "k8s.io", "images", "import", "--no-unpack"])
                .arg(&image.path)
                .output()
                .unwrap(),
            &format!("ctr images import {}", image.name),
        );
    }

    fn wait_ready(&mut self, kas: &KubeApiserver) {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let out = kas.kubectl(&[
                "get",
                "node",
                &self.name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ]);
            if String::from_utf8_lossy(&out.stdout).trim() == "True" {
                return;
            }
            if let Some(Ok(Some(st))) = self.kubelet.as_mut().map(|k| k.child.try_wait()) {
                panic!(
                    "the kubelet of {} exited ({st}):\n{}",
                    self.name,
                    tail(&self.kubelet_log(), 40)
                );
            }
            assert!(
                Instant::now() < deadline,
                "node {} not Ready within {READY_WITHIN:?}: {}\n--- kubelet:\n{}\n--- containerd:\n{}",
                self.name,
                String::from_utf8_lossy(&out.stderr),
                tail(&self.kubelet_log(), 40),
                tail(&self.containerd.as_ref().map(|c| c.text()).unwrap_or_default(), 20)
            );
            thread::sleep(Duration::from_millis(250));
        }
    }

    pub(crate) fn kubelet_log(&self) -> String {
        self.kubelet.as_ref().map(|k| k.text()).unwrap_or_default()
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        // The kubelet first (it would restart what dies), then every
        // process of the node's pods (its cgroup tree), the runtime's shims
        // and containerd itself: SIGKILL, as a node losing power. The pods'
        // mounts live in containerd's private mount namespace and go with it.
        drop(self.kubelet.take());
        for h in v1_hierarchies() {
            for pid in cgroup_pids(&h.join(&self.cgroup)) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).output();
            }
        }
        let sock = self.sock.display().to_string();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains("containerd-shim") && cmdline.contains(&sock) {
                let pid = e.file_name().to_string_lossy().into_owned();
                let _ = Command::new("kill").args(["-9", &pid]).output();
            }
        }
        drop(self.containerd.take());
        // Mounts the kubelet and runtime left under the node's directory.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
            let dir = self.dir.display().to_string();
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .filter(|p| p.starts_with(&dir))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                let _ = Command::new("umount").arg("-l").arg(p).output();
            }
        }
        // Killed processes leave their cgroups a moment later.
        let deadline = Instant::now() + Duration::from_secs(10);
        for h in v1_hierarchies() {
            let root = h.join(&self.cgroup);
            remove_cgroup_tree(&root);
            while root.exists() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
                remove_cgroup_tree(&root);
            }
        }
    }
}

/// Every process in cgroup `dir` and below (a v1 hierarchy's `cgroup.procs`).
fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(cgroup_pids(&e.path()));
        }
    }
    out
}

/// kube-controller-manager and kube-scheduler in the cloud namespace
/// (admin credentials, no leader election); the controller manager signs
/// CSRs with the cluster CA and fills ServiceAccount tokens' CA.
pub(crate) struct ControlPlane {
    pub controller_manager: Logged,
    pub scheduler: Logged,
}

impl ControlPlane {
    pub(crate) fn start(env: &Env, ns: &str, kas: &KubeApiserver, certs: &KubeCerts) -> Self {
        let peers = crate::common::peers().expect("peers");
        let kc = kas.kubeconfig.display().to_string();
        let ca_key = crate::support::ca_key(&env.certs());
        let mut kcm = in_ns(ns, peers.bin("kube-controller-manager"));
        kcm.args([
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            format!("--cluster-signing-cert-file={}", certs.ca.display()),
            format!("--cluster-signing-key-file={}", ca_key.display()),
            format!("--root-ca-file={}", certs.ca.display()),
            format!(
                "--service-account-private-key-file={}",
                certs.sa_key.display()
            ),
            "--use-service-account-credentials=false".into(),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            "--controllers=*".into(),
            "--v=1".into(),
        ]);
        let controller_manager = Logged::spawn(kcm, env.path("kube-controller-manager.log"));
        let mut sched = in_ns(ns, peers.bin("kube-scheduler"));
        sched.args([
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            "--v=1".into(),
        ]);
        let scheduler = Logged::spawn(sched, env.path("kube-scheduler.log"));
        ControlPlane {
            controller_manager,
            scheduler,
        }
    }

    /// The last lines of both logs (for failure messages).
    pub(crate) fn logs(&self) -> String {
        format!(
            "--- kube-controller-manager:\n{}\n--- kube-scheduler:\n{}",
            tail(&self.controller_manager.text(), 15),
            tail(&self.scheduler.text(), 10)
        )
    }
}

/// Whether this machine has the runtime (containerd, runc, ctr, the CNI
/// plugins): scripts/ensure-tools installs them.
pub(crate) fn runtime_missing() -> Option<String> {
    let missing: Vec<&str> = ["containerd", "ctr", "runc", "nsenter", "cc"]
        .into_iter()
        .filter(|b| {
            !Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {b}"))
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    let cni = Path::new("/usr/lib/cni/loopback").exists();
    match (missing.is_empty(), cni) {
        (true, true) => None,
        _ => Some(format!(
            "missing: {missing:?}{} (scripts/ensure-tools installs containerd, runc, \
             containernetworking-plugins)",
            if cni { "" } else { " /usr/lib/cni/loopback" }
        )),
    }
}

/// A hostNetwork pod of `image` pinned to `node`, running `script`.
pub(crate) fn pod_json(name: &str, node: &str, image: &str, script: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
            }],
        },
    })
}

/// Waits until pod `ns/name` is Running; its JSON.
pub(crate) fn wait_running(
    kas: &KubeApiserver,
    ns: &str,
    name: &str,
    within: Duration,
    nodes: &[&RealNode],
) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let out = kas.kubectl(&["get", "pod", "-n", ns, name, "-o", "json"]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if v["status"]["phase"] == "Running" {
                return v;
            }
            if Instant::now() >= deadline {
                let logs: String = nodes
                    .iter()
                    .map(|n| format!("--- kubelet {}:\n{}\n", n.name, tail(&n.kubelet_log(), 25)))
                    .collect();
                panic!(
                    "pod {ns}/{name} not Running within {within:?}: {}\n{logs}",
                    v["status"]
                );
            }
        }
        assert!(Instant::now() < deadline, "pod {ns}/{name}: {out:?}");
        thread::sleep(Duration::from_millis(250));
    }
}

/// The control-plane node and the edge node.
pub(crate) const CP_NODE: &str = "cp-1";
pub(crate) const EDGE_NODE: &str = "edge-1";

/// The images every node holds.
pub(crate) struct Images {
    pub pause: Archive,
    /// Debian's static busybox (pods to reach on the edge node).
    pub workload: Archive,
    /// The Dockerfile's image, named as the manifests pin it.
    pub edgetunnel: Archive,
    pub stage: crate::node_image::FinalStage,
    pub dir: PathBuf,
}

/// A cluster of two real nodes: kube-apiserver (run as its static pod
/// would be, seeing the control-plane node's `/etc/kubernetes` and
/// `/var/lib/kubelet`), etcd, kube-controller-manager and kube-scheduler
/// in the cloud namespace; the control-plane node `cp-1` there
/// (labelled and tainted as kubeadm does) and the edge node `edge-1` in
/// the node namespace, reachable from the cloud only through a tunnel.
/// Each node has its own `/etc/kubernetes`, `/etc/edgetunnel`,
/// `/var/lib/edgetunnel` and `/var/lib/kubelet`.
pub(crate) struct Cluster {
    // Dropped in this order: the nodes (their pods), then the control
    // plane, etcd, the namespaces and directories.
    pub edge: RealNode,
    pub cp: RealNode,
    pub control_plane: ControlPlane,
    kas: Option<KubeApiserver>,
    kas_bin: PathBuf,
    /// kube-apiserver's flags besides [`KubeApiserver::start_with`]'s.
    kas_flags: Vec<String>,
    egress: crate::kube_cluster::Egress,
    restarts: usize,
    pub images: Images,
    _etcd: Logged,
    pub certs: KubeCerts,
    pub env: Env,
    pub net: crate::kube_cluster::Net,
    _dirs: HostDirs,
}

/// What each node bind-mounts over the host's paths (besides
/// `/var/lib/kubelet`).
pub(crate) const NODE_PATHS: [&str; 3] =
    ["/etc/kubernetes", "/etc/edgetunnel", "/var/lib/edgetunnel"];

impl Cluster {
    /// Starts it all; `kas_flags` are added to kube-apiserver's. With
    /// `egress_selector`, its egress until an `--egress-selector-config-file`
    /// is added is a socket nobody serves; without, it dials kubelets
    /// itself. `None` when the peers are absent (after the skip line);
    /// fails when they are here but the runtime is not.
    pub(crate) fn start(kas_flags: &[String], egress_selector: bool) -> Option<Cluster> {
        use crate::kube_cluster::{start_etcd, Net, KUBELET_IP};
        let p = crate::common::peers()?;
        let bins = [
            "kube-apiserver",
            "kubelet",
            "kube-controller-manager",
            "kube-scheduler",
        ];
        if let Some(b) = bins.iter().find(|b| !p.has(b)) {
            println!("skipped: no {b} among the peers");
            return None;
        }
        if let Some(why) = runtime_missing() {
            panic!("the peers are here but the runtime is not: {why}");
        }
        let dirs = HostDirs::note();
        let net = Net::new();
        let env = Env::new();
        let certs = KubeCerts::new(&env);
        let etcd = start_etcd(&net, &env);
        let dir = env.path("images");
        std::fs::create_dir_all(&dir).unwrap();
        let bin = Path::new(crate::support::BIN);
        let (edgetunnel, stage) = crate::node_image::edgetunnel(&dir, bin, "edgetunnel:0.1.0");
        let images = Images {
            pause: crate::node_image::pause(&dir, PAUSE_IMAGE),
            workload: crate::node_image::busybox(&dir, "localhost/busybox:test"),
            edgetunnel,
            stage,
            dir,
        };
        // kube-apiserver as a static pod: the control-plane node's files.
        let cp_fs = env.path(&format!("node-{CP_NODE}/fs"));
        let kas_bin = env.path("kube-apiserver-on-cp");
        let mut wrapper = String::from("#!/bin/sh\nexec unshare -m --propagation private sh -c '");
        for d in ["/etc/kubernetes", "/var/lib/kubelet"] {
            let s = cp_fs.join(d.trim_start_matches('/'));
            std::fs::create_dir_all(&s).unwrap();
            std::fs::create_dir_all(d).unwrap();
            wrapper.push_str(&format!("mount --bind {} {d} && ", s.display()));
        }
        wrapper.push_str(&format!(
            "exec \"$0\" \"$@\"' {} \"$@\"\n",
            p.bin("kube-apiserver").display()
        ));
        std::fs::write(&kas_bin, wrapper).unwrap();
        std::fs::set_permissions(&kas_bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut kas_flags = kas_flags.to_vec();
        kas_flags.push("--enable-admission-plugins=ServiceAccount".to_string());
        let egress = match egress_selector {
            true => crate::kube_cluster::Egress::GrpcUds(env.path("no-egress-yet.socket")),
            false => crate::kube_cluster::Egress::Direct,
        };
        let kas = KubeApiserver::start_with(&kas_bin, &net, &env, &certs, &egress, 0, &kas_flags);
        let control_plane = ControlPlane::start(&env, &net.cloud.0, &kas, &certs);
        let imgs = [&images.pause, &images.workload, &images.edgetunnel];
        let cp = RealNode::start(
            &env,
            &kas,
            &certs,
            CP_NODE,
            CLOUD_IP,
            "10.244.0.0/24",
            &net.cloud.0,
            &NODE_PATHS,
            &imgs,
        );
        let edge = RealNode::start(
            &env,
            &kas,
            &certs,
            EDGE_NODE,
            KUBELET_IP,
            "10.244.1.0/24",
            &net.node.0,
            &NODE_PATHS,
            &imgs,
        );
        assert_eq!(cp.fs, cp_fs);
        Some(Cluster {
            edge,
            cp,
            control_plane,
            kas: Some(kas),
            kas_bin,
            kas_flags,
            egress,
            restarts: 0,
            images,
            _etcd: etcd,
            certs,
            env,
            net,
            _dirs: dirs,
        })
    }

    pub(crate) fn kas(&self) -> &KubeApiserver {
        self.kas.as_ref().expect("kube-apiserver")
    }

    /// Restarts kube-apiserver with `more` flags added (as an operator
    /// edits its static pod).
    pub(crate) fn restart_apiserver(&mut self, more: &[String]) {
        self.kas.take().expect("kube-apiserver").stop();
        self.kas_flags.extend(more.iter().cloned());
        self.restarts += 1;
        self.kas = Some(KubeApiserver::start_with(
            &self.kas_bin,
            &self.net,
            &self.env,
            &self.certs,
            &self.egress,
            self.restarts,
            &self.kas_flags,
        ));
    }

    /// Labels and taints the control-plane node as kubeadm does.
    pub(crate) fn mark_control_plane(&self) {
        let kas = self.kas();
        kas.kubectl_ok(&[
            "label",
            "node",
            CP_NODE,
            "node-role.kubernetes.io/control-plane=",
        ]);
        kas.kubectl_ok(&[
            "taint",
            "node",
            CP_NODE,
            "node-role.kubernetes.io/control-plane:NoSchedule",
        ]);
    }

    pub(crate) fn nodes(&self) -> [&RealNode; 2] {
        [&self.cp, &self.edge]
    }
}

/// Waits for `f` to be true, for up to `within`.
pub(crate) fn wait_until(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> bool,
    log: impl Fn() -> String,
) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what} not within {within:?}:\n{}",
            log()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// What pod `name`'s containers wrote, from `node`'s pod log directory
/// (CRI log lines, the message after the timestamp, stream and tag).
pub(crate) fn pod_log(node: &RealNode, name: &str) -> String {
    let mut out = String::new();
    let Ok(dirs) = std::fs::read_dir(node.dir.join("logs")) else {
        return out;
    };
    for d in dirs.flatten() {
        if !d
            .file_name()
            .to_string_lossy()
            .contains(&format!("_{name}_"))
        {
            continue;
        }
        for c in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
                for line in std::fs::read_to_string(f.path())
                    .unwrap_or_default()
                    .lines()
                {
                    let msg = line.splitn(4, ' ').nth(3).unwrap_or("");
                    out.push_str(msg);
                    out.push('\n');
                }
            }
        }
    }
    out
}
