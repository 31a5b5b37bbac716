//! The README's "From zero to a cluster", followed as written against the
//! peers' kube-apiserver. The shell block under that heading is parsed
//! (so the README cannot drift from this test) and every command in it
//! runs through `sh -c` on a "control-plane node" (the cloud network
//! namespace of `kube_cluster`, with its own `/etc/kubernetes` and
//! `/var/lib/kubelet` bind-mounted in a private mount namespace) or, for
//! the per-node step, on the edge node too. Only documented placeholders
//! are replaced (`<server address>`, `<edge node>`, `<ns>`, `<pod on an
//! edge node>`, the agent manifest's `--server-addr` that step 4 says to
//! set), `sudo` is dropped (root here), and `edgetunnel` on PATH is the
//! built binary (the image's ENTRYPOINT). Step 1 (`docker build`) is
//! skipped: there is no container runtime (the README says so).
//!
//! No kubelet either, so this test plays the kubelet for the two pods the
//! DaemonSets would start: it reads the DaemonSets back from the API
//! server, checks their node selectors against the nodes, and runs each
//! pod's init containers and container with exactly their command and
//! args (`$(VAR)` from the env and fieldRefs, as the kubelet expands it),
//! as their `runAsUser`/`runAsGroup`/`fsGroup` (setpriv), under their
//! Localhost seccomp profile from the node's `/var/lib/kubelet/seccomp`
//! (tests/seccomp/run_under_profile.py, when python3-seccomp is there),
//! with their volumes bind-mounted at their mount paths: Secrets as files
//! read back from the API server (mode and group as the kubelet writes
//! them), hostPaths from the node's directories, and the ServiceAccount's
//! token (TokenRequest), `ca.crt` and `namespace`. `KUBERNETES_SERVICE_HOST`
//! is kube-apiserver's address (no kube-proxy for the `kubernetes`
//! Service's ClusterIP). Nor is there a kube-controller-manager: after the
//! README's approval the test signs the agent's CSR with the cluster CA,
//! as its `kubernetes.io/kube-apiserver-client` signer would.
//!
//! Checked on the way: the Secrets hold the keys the pods mount; each
//! Service selects its DaemonSet's pods in the same namespace; each
//! ServiceAccount can do what its role needs and not more (`kubectl auth
//! can-i --as`); both liveness probes answer 200; and at the end step 7's
//! `kubectl logs` reaches the fake kubelet on the edge node through the
//! egress selector file step 6 installed, the server's unix socket, and
//! the agent, the only way from the cloud to that node.
//!
//! The mount points are made on the host where missing (empty
//! directories, removed again at the end).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{peers, serial, tail};
use crate::kube_cluster::{
    run_bounded, start_etcd, Egress, KubeApiserver, KubeCerts, Net, CLOUD_IP, KUBELET_CLIENT_CN,
    KUBELET_IP, KUBELET_PORT,
};
use crate::kubelet::{small_log, FakeKubelet};
use crate::support::{repo, Env, Proc, ALLOW_ENV, BIN};

/// The control-plane node and the edge node.
const CP_NODE: &str = "cp-1";
const EDGE_NODE: &str = "edge-1";
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

/// Plays the kubelet for DaemonSet `ds` (as read from the API server) on
/// `node`: init containers to their end, then the one container, as a
/// [`Proc`].
struct PodRun<'a> {
    kas: &'a KubeApiserver,
    env: &'a Env,
    node: &'a Node,
    node_name: &'a str,
    node_ip: &'a str,
    ds: Value,
}

impl PodRun<'_> {
    fn ns(&self) -> &str {
        self.ds["metadata"]["namespace"].as_str().unwrap()
    }

    fn spec(&self) -> &Value {
        &self.ds["spec"]["template"]["spec"]
    }

    fn dir(&self, what: &str) -> PathBuf {
        let name = self.ds["metadata"]["name"].as_str().unwrap();
        let d = self.env.path(&format!("pods/{name}/{what}"));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Each volume's directory on the host: Secret files as the kubelet
    /// writes them (`defaultMode`, group `fsGroup`), hostPaths created.
    fn volumes(&self) -> Vec<(String, PathBuf)> {
        let fs_group = self.spec()["securityContext"]["fsGroup"].as_u64();
        let mut out = Vec::new();
        for v in self.spec()["volumes"].as_array().unwrap() {
            let name = v["name"].as_str().unwrap().to_string();
            if let Some(s) = v["secret"].as_object() {
                use base64::Engine as _;
                use std::os::unix::fs::PermissionsExt;
                let secret = s["secretName"].as_str().unwrap();
                let obj = get_json(self.kas, &["secret", secret, "-n", self.ns()]);
                let dir = self.dir(&format!("volumes/{name}"));
                let mode = s
                    .get("defaultMode")
                    .and_then(Value::as_u64)
                    .unwrap_or(0o644);
                let data = obj["data"].as_object().cloned().unwrap_or_default();
                for (k, b64) in data {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(b64.as_str().unwrap())
                        .unwrap();
                    let f = dir.join(&k);
                    std::fs::write(&f, bytes).unwrap();
                    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode as u32))
                        .unwrap();
                    if let Some(g) = fs_group {
                        std::os::unix::fs::chown(&f, Some(0), Some(g as u32)).unwrap();
                    }
                }
                out.push((name, dir));
            } else if let Some(h) = v["hostPath"]["path"].as_str() {
                let dir = self.node.host(h);
                std::fs::create_dir_all(&dir).unwrap();
                out.push((name, dir));
            } else {
                panic!("a volume kind this test does not play: {v}");
            }
        }
        out
    }

    /// The ServiceAccount volume: a fresh token, the cluster CA, the
    /// namespace.
    fn service_account(&self, certs: &KubeCerts) -> PathBuf {
        let sa = self.spec()["serviceAccountName"].as_str().unwrap();
        let dir = self.dir("serviceaccount");
        let token = self
            .kas
            .kubectl_ok(&["create", "token", sa, "-n", self.ns()]);
        std::fs::write(dir.join("token"), String::from_utf8_lossy(&token).trim()).unwrap();
        std::fs::copy(&certs.ca, dir.join("ca.crt")).unwrap();
        std::fs::write(dir.join("namespace"), self.ns()).unwrap();
        dir
    }

    /// A container's environment with `$(VAR)` values resolved.
    fn env_of(&self, c: &Value) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for e in c["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap().to_string();
            let value = match (
                e["value"].as_str(),
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
            ) {
                (Some(v), _) => v.to_string(),
                (None, Some("spec.nodeName")) => self.node_name.to_string(),
                (None, Some("status.hostIP")) => self.node_ip.to_string(),
                other => panic!("an env source this test does not play: {other:?}"),
            };
            out.push((name, value));
        }
        out
    }

    /// Runs container `c`: its argv (the image's ENTRYPOINT, /usr/local/bin/edgetunnel, is
    /// `BIN`), mounts, user and seccomp profile.
    fn command(&self, c: &Value, mounts: &[(PathBuf, String)]) -> Command {
        let env = self.env_of(c);
        let expand = |s: &str| {
            let mut s = s.to_string();
            for (k, v) in &env {
                s = s.replace(&format!("$({k})"), v);
            }
            s
        };
        let mut argv: Vec<OsString> = match c["command"].as_array() {
            Some(cmd) => cmd
                .iter()
                .map(|x| expand(x.as_str().unwrap()).into())
                .collect(),
            None => vec![BIN.into()],
        };
        argv.extend(
            c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| OsString::from(expand(x.as_str().unwrap()))),
        );
        let pod_sc = &self.spec()["securityContext"];
        let sc = &c["securityContext"];
        let uid = sc["runAsUser"]
            .as_u64()
            .or(pod_sc["runAsUser"].as_u64())
            .unwrap_or(0);
        let gid = sc["runAsGroup"]
            .as_u64()
            .or(pod_sc["runAsGroup"].as_u64())
            .unwrap_or(0);
        let mut full: Vec<OsString> = Vec::new();
        if uid != 0 {
            let groups = pod_sc["fsGroup"].as_u64().unwrap_or(gid);
            full.extend(
                [
                    "setpriv".to_string(),
                    format!("--reuid={uid}"),
                    format!("--regid={gid}"),
                    format!("--groups={groups}"),
                ]
                .map(OsString::from),
            );
        }
        let seccomp = sc["seccompProfile"]
            .as_object()
            .or(pod_sc["seccompProfile"].as_object());
        if let Some(p) = seccomp {
            assert_eq!(p["type"], "Localhost", "{p:?}");
            let file = self
                .node
                .host("/var/lib/kubelet/seccomp")
                .join(p["localhostProfile"].as_str().unwrap());
            assert!(
                file.is_file(),
                "{} not installed on the node: the pod would not start",
                file.display()
            );
            if have_seccomp() {
                full.extend([
                    "/usr/bin/python3".into(),
                    repo().join("tests/seccomp/run_under_profile.py").into(),
                    file.into(),
                ]);
            }
        }
        full.extend(argv);
        let mut cmd = in_mounts(&self.node.netns, mounts, &full);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("KUBERNETES_SERVICE_HOST", CLOUD_IP)
            .env("KUBERNETES_SERVICE_PORT", "6443")
            .env_remove(ALLOW_ENV);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Init containers to their end, then the container.
    fn start(&self, certs: &KubeCerts) -> Proc {
        let volumes = self.volumes();
        let sa = self.service_account(certs);
        let mounts_of = |c: &Value| -> Vec<(PathBuf, String)> {
            let mut m: Vec<(PathBuf, String)> = c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|vm| {
                    let name = vm["name"].as_str().unwrap();
                    let dir = &volumes.iter().find(|(n, _)| n == name).unwrap().1;
                    (dir.clone(), vm["mountPath"].as_str().unwrap().to_string())
                })
                .collect();
            m.push((
                sa.clone(),
                "/var/run/secrets/kubernetes.io/serviceaccount".into(),
            ));
            m
        };
        for c in self.spec()["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let out = run_bounded(
                self.command(c, &mounts_of(c)),
                None,
                Duration::from_secs(20),
            );
            assert!(
                out.status.success(),
                "init container {}: {}",
                c["name"],
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cs = self.spec()["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 1);
        let name = self.ds["metadata"]["name"].as_str().unwrap();
        Proc::spawn(
            self.command(&cs[0], &mounts_of(&cs[0])),
            self.env.path(&format!("{name}.log")),
        )
    }

    /// The container's liveness probe, run from the node: its status.
    fn liveness(&self) -> u16 {
        let p = &self.spec()["containers"][0]["livenessProbe"]["httpGet"];
        let addr: std::net::SocketAddr = format!(
            "{}:{}",
            p["host"].as_str().unwrap(),
            p["port"].as_u64().unwrap()
        )
        .parse()
        .unwrap();
        let path = p["path"].as_str().unwrap().to_string();
        crate::kube_cluster::in_netns(&self.node.netns, move || {
            crate::support::http_get(addr, &path).0
        })
    }
}

fn have_seccomp() -> bool {
    Command::new("/usr/bin/python3")
        .args(["-c", "import seccomp"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Signs every approved, unsigned `kubernetes.io/kube-apiserver-client`
/// CSR with the cluster CA (kube-controller-manager's job); how many.
fn sign_approved(kas: &KubeApiserver, env: &Env) -> usize {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let certs = env.certs();
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(crate::support::ca_key(&certs)).unwrap())
            .unwrap();
    let ca = rcgen::CertificateParams::from_ca_cert_pem(
        &std::fs::read_to_string(certs.join("ca.crt")).unwrap(),
    )
    .unwrap()
    .self_signed(&ca_key)
    .unwrap();
    let list = get_json(kas, &["csr"]);
    let mut n = 0;
    for mut csr in list["items"].as_array().cloned().unwrap_or_default() {
        let approved = csr["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Approved");
        if !approved
            || csr["status"]["certificate"].is_string()
            || csr["spec"]["signerName"] != "kubernetes.io/kube-apiserver-client"
        {
            continue;
        }
        let pem = String::from_utf8(
            b64.decode(csr["spec"]["request"].as_str().unwrap())
                .unwrap(),
        )
        .unwrap();
        let mut req = rcgen::CertificateSigningRequestParams::from_pem(&pem).unwrap();
        let now = std::time::SystemTime::now();
        req.params.not_before = (now - Duration::from_secs(60)).into();
        req.params.not_after = (now + Duration::from_secs(3600)).into();
        // The signer takes the usages from the request's spec, not its PEM
        // (kube-controller-manager's `pkg/controller/certificates/authority`).
        for u in csr["spec"]["usages"].as_array().into_iter().flatten() {
            use rcgen::{ExtendedKeyUsagePurpose as E, KeyUsagePurpose as K};
            match u.as_str().unwrap() {
                "client auth" => req.params.extended_key_usages.push(E::ClientAuth),
                "server auth" => req.params.extended_key_usages.push(E::ServerAuth),
                "digital signature" => req.params.key_usages.push(K::DigitalSignature),
                "key encipherment" => req.params.key_usages.push(K::KeyEncipherment),
                other => panic!("usage {other:?} in {}", csr["metadata"]["name"]),
            }
        }
        let cert = req.signed_by(&ca, &ca_key).unwrap();
        csr["status"]["certificate"] = json!(b64.encode(cert.pem()));
        let name = csr["metadata"]["name"].as_str().unwrap().to_string();
        let f = env.path(&format!("{name}.signed.json"));
        std::fs::write(&f, csr.to_string()).unwrap();
        kas.kubectl_ok(&[
            "replace",
            "--raw",
            &format!("/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}/status"),
            "-f",
            &f.display().to_string(),
        ]);
        n += 1;
    }
    n
}

/// Waits for `f` to be true, for up to `within`.
fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool, log: impl Fn() -> String) {
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

#[test]
fn the_readmes_deploy_path_as_written_reaches_an_edge_kubelet() {
    let Some(p) = peers() else { return };
    if !p.has("kube-apiserver") {
        return;
    }
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
    let net = Net::new();
    let env = Env::new();
    let certs = KubeCerts::new(&env);
    let _etcd = start_etcd(&net, &env);
    let cp = Node {
        root: env.path("node-cp"),
        netns: net.cloud.0.clone(),
    };
    let edge = Node {
        root: env.path("node-edge"),
        netns: net.node.0.clone(),
    };
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
    // kube-apiserver as a static pod: /etc/kubernetes is the node's.
    let kas_real = p.bin("kube-apiserver");
    let kas_bin = env.path("kube-apiserver-on-cp");
    {
        let mut wrapper = String::from("#!/bin/sh\nexec unshare -m --propagation private sh -c '");
        for (s, d) in cp.binds() {
            wrapper.push_str(&format!("mount --bind {} {d} && ", s.display()));
        }
        wrapper.push_str(&format!(
            "exec \"$0\" \"$@\"' {} \"$@\"\n",
            kas_real.display()
        ));
        std::fs::write(&kas_bin, wrapper).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&kas_bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (_, d) in cp.binds() {
            std::fs::create_dir_all(d).unwrap();
        }
    }
    // Before step 6, kube-apiserver has no egress to the tunnel: a socket
    // nobody serves (replaced by the README's file in step 6).
    let before = Egress::GrpcUds(env.path("no-egress-yet.socket"));
    let kas = KubeApiserver::start(&kas_bin, &net, &env, &certs, &before, 0);
    let kubeconfig = kas.kubeconfig.clone();
    let run = |node: &Node, cmd: &str| run_step(node, &work, &kubeconfig, &bin_dir, cmd);
    // The nodes as their kubelets register them.
    for (name, labels, ip) in [
        (
            CP_NODE,
            json!({"node-role.kubernetes.io/control-plane": ""}),
            CLOUD_IP,
        ),
        (EDGE_NODE, json!({}), KUBELET_IP),
    ] {
        kas.create(
            &env,
            &format!("node-{name}"),
            &json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": if name == CP_NODE {
                    json!({"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]})
                } else { json!({}) }}),
        );
        kas.patch_status(
            &["node", name],
            &json!({"status": {
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake"}]
            }}),
        );
        // kube-controller-manager's node lifecycle controller lifts this
        // once the node is Ready.
        kas.kubectl_ok(&[
            "taint",
            "node",
            name,
            "node.kubernetes.io/not-ready:NoSchedule-",
        ]);
    }
    let mut said = Vec::new();

    // 1. The image: no container runtime here.
    let s1 = step(1);
    assert_eq!(
        s1.commands,
        ["docker build -t edgetunnel:0.1.0 ."],
        "{s1:?}"
    );
    assert!(
        s1.comments
            .iter()
            .any(|c| c.contains("without a container runtime")),
        "step 1 should say what to do without a container runtime: {s1:?}"
    );
    said.push("1: skipped (no container runtime)".to_string());

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
        &kas,
        &["daemonset", "edgetunnel-server", "-n", "kube-system"],
    );
    let ds_agent = get_json(
        &kas,
        &["daemonset", "edgetunnel-agent", "-n", "kube-system"],
    );
    let svc = get_json(&kas, &["service", "edgetunnel-server", "-n", "kube-system"]);
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
    // Each DaemonSet's pod lands on its node, and only there.
    let nodes = get_json(&kas, &["nodes"]);
    let fits = |ds: &Value, node: &Value| {
        let spec = &ds["spec"]["template"]["spec"];
        let sel = spec["nodeSelector"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let labels = &node["metadata"]["labels"];
        let tolerated = node["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|t| {
                spec["tolerations"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|tol| tol["key"] == t["key"])
            });
        sel.iter().all(|(k, v)| labels[k] == *v) && tolerated
    };
    let placed = |ds: &Value| -> Vec<String> {
        nodes["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| fits(ds, n))
            .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        placed(&ds_server),
        [CP_NODE],
        "the server DaemonSet's nodes: {}\n{}",
        ds_server["spec"]["template"]["spec"],
        nodes["items"]
    );
    assert_eq!(
        placed(&ds_agent),
        [EDGE_NODE],
        "the agent DaemonSet's nodes (label the edge node)"
    );
    // The Secrets hold what the pods mount.
    for (secret, keys) in [
        ("edgetunnel-server-certs", &["server.crt", "server.key"][..]),
        ("edgetunnel-agent-certs", &["ca.crt"][..]),
    ] {
        let s = get_json(&kas, &["secret", secret, "-n", "kube-system"]);
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
                &kas,
                server_sa,
                verb,
                "leases.coordination.k8s.io",
                "kube-system"
            ),
            "server {verb} leases"
        );
    }
    assert!(!can_i(&kas, server_sa, "watch", "nodes", "kube-system"));
    assert!(!can_i(&kas, server_sa, "get", "secrets", "kube-system"));
    assert!(!can_i(
        &kas,
        server_sa,
        "create",
        "leases.coordination.k8s.io",
        "default"
    ));
    for verb in ["create", "get"] {
        assert!(
            can_i(
                &kas,
                agent_sa,
                verb,
                "certificatesigningrequests.certificates.k8s.io",
                "default"
            ),
            "agent {verb} csr"
        );
    }
    assert!(can_i(
        &kas,
        agent_sa,
        "list",
        "leases.coordination.k8s.io",
        "kube-system"
    ));
    assert!(!can_i(
        &kas,
        agent_sa,
        "create",
        "leases.coordination.k8s.io",
        "kube-system"
    ));
    assert!(!can_i(&kas, agent_sa, "get", "secrets", "kube-system"));
    said.push("4: applied; selectors, node placement, Secrets and RBAC checked".to_string());

    // The kubelets start the pods.
    let server_pod = PodRun {
        kas: &kas,
        env: &env,
        node: &cp,
        node_name: CP_NODE,
        node_ip: CLOUD_IP,
        ds: ds_server.clone(),
    };
    let server = server_pod.start(&certs);
    server.wait_line("READY");
    let agent_pod = PodRun {
        kas: &kas,
        env: &env,
        node: &edge,
        node_name: EDGE_NODE,
        node_ip: KUBELET_IP,
        ds: ds_agent.clone(),
    };
    // An operator quick off the mark runs step 5 before any agent has
    // asked: it must do no harm.
    for c in &step(5).commands {
        run(&cp, &substitute(c));
    }
    let agent = agent_pod.start(&certs);

    // 5. Approve the agent's request once it is there.
    wait_until(
        "the agent's CSR",
        Duration::from_secs(30),
        || text(&kas.kubectl(&["get", "csr", "-o", "name"])).contains("edgetunnel-agent"),
        || agent.log_text(),
    );
    for c in &step(5).commands {
        let out = run(&cp, &substitute(c));
        assert!(out.contains("approved"), "{out}");
    }
    assert_eq!(
        sign_approved(&kas, &env),
        1,
        "one approved agent CSR to sign"
    );
    agent.wait_line("CONNECTED");
    said.push("5: run; the test signed the approved CSR".to_string());
    assert_eq!(server_pod.liveness(), 200, "the server's liveness probe");
    assert_eq!(agent_pod.liveness(), 200, "the agent's liveness probe");

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
    kas.stop();
    let kas = KubeApiserver::start_with(&kas_bin, &net, &env, &certs, &before, 1, &[flag]);

    // 7. Logs of a pod on the edge node.
    kas.create(
        &env,
        "pod-p1",
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p1", "namespace": "default"},
            "spec": {"nodeName": EDGE_NODE, "containers": [{"name": "c", "image": "none"}]}}),
    );
    kas.patch_status(
        &["pod", "p1"],
        &json!({"status": {"phase": "Running", "hostIP": KUBELET_IP}}),
    );
    let kubelet = FakeKubelet::start(
        &net.node.0,
        &format!("{KUBELET_IP}:{KUBELET_PORT}"),
        &certs.kubelet.0,
        &certs.kubelet.1,
        &certs.ca,
    );
    if let Err(e) = net.cloud_cannot_reach(kubelet.addr) {
        panic!("{e}");
    }
    let s7 = step(7);
    assert_eq!(s7.commands.len(), 1, "{s7:?}");
    let got = run(&cp, &substitute(&s7.commands[0]));
    assert_eq!(got, small_log("default", "p1", "c", None), "step 7's logs");
    let seen = kubelet.requests();
    assert!(
        seen.iter()
            .any(|r| r.starts_with("GET /containerLogs/default/p1/c")
                && r.ends_with(&format!("cn={KUBELET_CLIENT_CN}"))),
        "{seen:?}\n--- server:\n{}",
        tail(&server.log_text(), 20)
    );
    said.push("6, 7: run; kubectl logs came through the tunnel".to_string());
    if have_seccomp() {
        // Under the Localhost profile both pods kept io_uring (the `auto`
        // driver would have fallen back to epoll had it been refused).
        for (what, p) in [("server", &server), ("agent", &agent)] {
            assert!(
                p.log_text().contains("driver=\"io_uring\""),
                "the {what} pod is not on io_uring under edgetunnel.json:\n{}",
                tail(&p.log_text(), 10)
            );
        }
    }
    eprintln!(
        "README deploy path ({}seccomp) in {:.1} s: {}",
        if have_seccomp() { "" } else { "no " },
        t0.elapsed().as_secs_f64(),
        said.join("; ")
    );
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
