//! The compatibility entry end to end: the argument lists of real
//! manifests, run through symlinks named after the Go binaries (as a
//! manifest's `command: ["/proxy-server"]` does in an image) or the
//! `edgetunnel proxy-server ...` subcommand form, must start a server and an
//! agent that carry traffic.
//!
//! - The Kubernetes documentation's konnectivity-server and
//!   konnectivity-agent (`content/en/examples/admin/konnectivity/`, grpc
//!   over a unix socket, agents authenticated by ServiceAccount token
//!   against a fake Kubernetes API that answers TokenReviews): a grpcio
//!   ProxyService client (as `tests/interop.rs` uses) dials an echo target
//!   through them.
//! - ANP's `examples/kubernetes/konnectivity-server.yaml` (http-connect
//!   over a unix socket, `--logtostderr=false`: its log file gets klog
//!   lines) with
//!   `examples/kind/konnectivity-agent-ds.yaml` (token authentication, as
//!   above): CONNECT to an echo target.
//! - OpenYurt's last chart (v1.1.1 `charts/openyurt/templates/
//!   yurt-tunnel-{server,agent}.yaml`) in a network namespace (the server
//!   keeps iptables rules), against a fake Kubernetes API that signs the
//!   CSRs: an HTTP request for the edge node through the interception
//!   listener.
//!
//! What is changed in those lists, and only that: file paths move under a
//! temp dir (the certificates there come from `edgetunnel certs init`);
//! ports the test cannot hold on a shared machine become free ones (0 where
//! the listener may pick); addresses outside this machine
//! (`35.225.206.7`, `konnectivity-server.kube-system.svc.cluster.local`,
//! `$(HOST_IP)`, `$(NODE_IP)`) become loopback; the kubeconfig files the
//! servers name point at the fake API. One addition, for a reason given
//! where it is made: the yurt-tunnel processes get `--kube-config`/
//! `--cert-dir` (their defaults are the pod's service account and
//! `/var/lib`).
#![allow(unsafe_code)] // system calls the test/bench harness makes directly

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::fake_kube::{self, node, FakeKube};
use support::netns::{save, Netns};
use support::*;

/// Symlinks named after the Go binaries, pointing at edgetunnel.
fn go_binaries(env: &Env) -> PathBuf {
    let dir = env.path("bin");
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "proxy-server",
        "proxy-agent",
        "yurt-tunnel-server",
        "yurt-tunnel-agent",
    ] {
        std::os::unix::fs::symlink(BIN, dir.join(name)).unwrap();
    }
    dir
}

/// A port free right now.
/// `args` with every `(from, to)` replaced inside each argument.
fn substitute(args: &[&str], subs: &[(&str, String)]) -> Vec<String> {
    args.iter()
        .map(|a| {
            let mut a = a.to_string();
            for (from, to) in subs {
                a = a.replace(from, to);
            }
            a
        })
        .collect()
}

fn listen(p: &Proc, what: &str) -> SocketAddr {
    p.wait_line(&format!("LISTEN {what} "))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Copies the `certs init` files to the names a manifest uses.
fn place(env: &Env, files: &[(&str, &Path)]) {
    for (from, to) in files {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(env.certs().join(from), to).unwrap();
    }
}

/// Each of `wants` logged (waited for: the lines reach the log file
/// through the log thread, maybe after the process announced READY).
fn assert_logged(p: &Proc, wants: &[&str]) {
    for w in wants {
        p.wait_log(w);
    }
}

/// kubernetes/website `content/en/examples/admin/konnectivity/
/// konnectivity-server.yaml` (image v0.0.37), verbatim.
const DOCS_SERVER: &[&str] = &[
    "--logtostderr=true",
    "--uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket",
    "--delete-existing-uds-file",
    "--cluster-cert=/etc/kubernetes/pki/apiserver.crt",
    "--cluster-key=/etc/kubernetes/pki/apiserver.key",
    "--mode=grpc",
    "--server-port=0",
    "--agent-port=8132",
    "--admin-port=8133",
    "--health-port=8134",
    "--agent-namespace=kube-system",
    "--agent-service-account=konnectivity-agent",
    "--kubeconfig=/etc/kubernetes/konnectivity-server.conf",
    "--authentication-audience=system:konnectivity-server",
];

/// kubernetes/website `.../konnectivity-agent.yaml` (image v0.0.37),
/// verbatim.
const DOCS_AGENT: &[&str] = &[
    "--logtostderr=true",
    "--ca-cert=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
    "--proxy-server-host=35.225.206.7",
    "--proxy-server-port=8132",
    "--admin-server-port=8133",
    "--health-server-port=8134",
    "--service-account-token-path=/var/run/secrets/tokens/konnectivity-agent-token",
];

/// The projected token the kubelet writes for the agent's pod.
const POD_TOKEN: &str = "token-from-the-kubelet";

/// A fake API server that authenticates [`POD_TOKEN`] as the docs' agent
/// ServiceAccount for the docs' audience, with a kubeconfig for it at
/// `kubeconfig`.
fn token_api(kubeconfig: &Path) -> FakeKube {
    let kube = FakeKube::start(None);
    kube.put_token(
        POD_TOKEN,
        "system:serviceaccount:kube-system:konnectivity-agent",
        &["system:konnectivity-server"],
    );
    std::fs::create_dir_all(kubeconfig.parent().unwrap()).unwrap();
    fake_kube::kubeconfig(kubeconfig, kube.addr);
    kube
}

/// The fake API reviewed the pod's token as ANP's server does.
fn assert_reviewed(kube: &FakeKube) {
    let reviews = kube.token_reviews();
    assert!(!reviews.is_empty(), "no TokenReview");
    for r in &reviews {
        assert_eq!(r["apiVersion"], "authentication.k8s.io/v1", "{r}");
        assert_eq!(r["kind"], "TokenReview", "{r}");
        assert_eq!(r["spec"]["token"], POD_TOKEN, "{r}");
        assert_eq!(
            r["spec"]["audiences"],
            serde_json::json!(["system:konnectivity-server"]),
            "{r}"
        );
    }
}

fn assert_not_logged(p: &Proc, unwanted: &[&str]) {
    let log = p.log_text();
    for u in unwanted {
        assert!(!log.contains(u), "{u:?} logged:\n{log}");
    }
}

/// A pod's service-account and projected token files under `root`.
fn pod_secrets(env: &Env, root: &Path) {
    place(
        env,
        &[("ca.crt", &root.join("kubernetes.io/serviceaccount/ca.crt"))],
    );
    let tokens = root.join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    std::fs::write(
        tokens.join("konnectivity-agent-token"),
        format!("{POD_TOKEN}\n"),
    )
    .unwrap();
}

#[test]
fn kubernetes_docs_konnectivity_server_and_agent_carry_grpc() {
    let env = Env::new();
    let bin = go_binaries(&env);
    // The control plane's /etc/kubernetes. No --cluster-ca-cert: the
    // server asks agents for no certificate and reviews their tokens with
    // the API server named by konnectivity-server.conf.
    let etc = env.path("etc-kubernetes");
    place(
        &env,
        &[
            ("server.crt", &etc.join("pki/apiserver.crt")),
            ("server.key", &etc.join("pki/apiserver.key")),
        ],
    );
    let kube = token_api(&etc.join("konnectivity-server.conf"));
    // The hostPath volume (DirectoryOrCreate) the socket lives in.
    std::fs::create_dir_all(etc.join("konnectivity-server")).unwrap();
    let server_args = substitute(
        DOCS_SERVER,
        &[
            ("/etc/kubernetes/", format!("{}/", etc.display())),
            // Free ports: the listeners pick their own.
            ("--agent-port=8132", "--agent-port=0".into()),
            ("--admin-port=8133", "--admin-port=0".into()),
            ("--health-port=8134", "--health-port=0".into()),
        ],
    );
    let mut cmd = Command::new(bin.join("proxy-server"));
    cmd.args(&server_args).env_remove("PROXY_SERVER_ID");
    let server = Proc::spawn(cmd, env.path("proxy-server.log"));
    let agent_port = listen(&server, "agent").port();
    let admin = listen(&server, "admin");
    let health = listen(&server, "health");
    server.wait_line("READY");
    assert_logged(
        &server,
        &[
            "--agent-namespace kube-system --agent-service-account konnectivity-agent --authentication-audience system:konnectivity-server",
            "/konnectivity-server.conf`",
        ],
    );
    assert_not_logged(
        &server,
        &[
            "no effect: --agent-namespace",
            "no effect: --kubeconfig",
            "no --cluster-ca-cert",
            " --ca ",
        ],
    );
    let (status, body) = http_get(health, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert!(admin.ip().is_loopback(), "ANP's admin default is 127.0.0.1");
    assert_eq!(http_get(admin, "/metrics").0, 200);

    // The agent's pod: service-account CA and projected token.
    let secrets = env.path("var-run-secrets");
    pod_secrets(&env, &secrets);
    let (agent_health, agent_admin) = (free_port(), free_port());
    let agent_args = substitute(
        DOCS_AGENT,
        &[
            ("/var/run/secrets/", format!("{}/", secrets.display())),
            ("35.225.206.7", "127.0.0.1".into()),
            (
                "--proxy-server-port=8132",
                format!("--proxy-server-port={agent_port}"),
            ),
            (
                "--admin-server-port=8133",
                format!("--admin-server-port={agent_admin}"),
            ),
            (
                "--health-server-port=8134",
                format!("--health-server-port={agent_health}"),
            ),
        ],
    );
    // Verbatim: no agent certificate, the projected token alone.
    let mut cmd = Command::new(bin.join("proxy-agent"));
    cmd.args(&agent_args).env_remove("PROXY_AGENT_ID");
    let agent = Proc::spawn(cmd, env.path("proxy-agent.log"));
    agent.wait_line("CONNECTED");
    assert_reviewed(&kube);
    let (status, _) = http_get(SocketAddr::from(([127, 0, 0, 1], agent_health)), "/healthz");
    assert_eq!(status, 200, "{}", agent.log_text());

    // kube-apiserver's side: a grpc ProxyService client on the socket.
    let echo = echo_server("127.0.0.1");
    let sock = etc.join("konnectivity-server/konnectivity-server.socket");
    let mut cmd = Command::new(python());
    cmd.arg(repo().join("tests/interop/proxy_client.py")).args([
        "--target".to_string(),
        format!("unix:{}", sock.display()),
        "--dial".into(),
        echo.addr.to_string(),
        "--payload-size".into(),
        (1 << 20).to_string(),
        "--connections".into(),
        "2".into(),
    ]);
    let mut client = Proc::spawn(cmd, env.path("proxy_client.log"));
    let last = client.wait_line_any(&["OK", "FAIL"], Duration::from_secs(60));
    let status = client
        .wait_exit(Duration::from_secs(30))
        .expect("client exits");
    assert!(
        last.starts_with("OK") && status.success(),
        "{last}\n{}\nserver:\n{}\nagent:\n{}",
        client.log_text(),
        server.log_text(),
        agent.log_text()
    );
    assert_only_anp_requests(&kube);
}

/// ANP's server asks Kubernetes only for TokenReviews (and, with
/// `--enable-lease-controller`, its leases): never Nodes or yurt-tunnel's
/// ConfigMap, which the docs' RBAC (`system:auth-delegator`) does not
/// allow.
fn assert_only_anp_requests(kube: &FakeKube) {
    let requests = kube.requests();
    assert!(!requests.is_empty(), "no request to the API");
    for r in &requests {
        assert!(
            r.contains("/tokenreviews") || r.contains("/leases"),
            "{r} (all: {requests:#?})"
        );
    }
}

/// ANP `examples/kubernetes/konnectivity-server.yaml`, verbatim.
const ANP_EXAMPLE_SERVER: &[&str] = &[
    "--log-file=/var/log/konnectivity-server.log",
    "--logtostderr=false",
    "--log-file-max-size=0",
    "--uds-name=/etc/srv/kubernetes/konnectivity-server/konnectivity-server.socket",
    "--cluster-cert=/etc/srv/kubernetes/pki/apiserver.crt",
    "--cluster-key=/etc/srv/kubernetes/pki/apiserver.key",
    "--server-port=0",
    "--agent-port=8091",
    "--health-port=8092",
    "--admin-port=8093",
    "--keepalive-time=1h",
    "--mode=http-connect",
    "--agent-namespace=kube-system",
    "--agent-service-account=konnectivity-agent",
    "--kubeconfig=/etc/srv/kubernetes/konnectivity-server/kubeconfig",
    "--authentication-audience=system:konnectivity-server",
];

/// ANP `examples/kind/konnectivity-agent-ds.yaml`, verbatim.
const ANP_KIND_AGENT: &[&str] = &[
    "--logtostderr=true",
    "--ca-cert=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
    "--proxy-server-host=konnectivity-server.kube-system.svc.cluster.local",
    "--proxy-server-port=8091",
    "--sync-interval=5s",
    "--sync-interval-cap=30s",
    "--probe-interval=5s",
    "--service-account-token-path=/var/run/secrets/tokens/konnectivity-agent-token",
    "--agent-identifiers=ipv4=$(HOST_IP)",
];

#[test]
fn anp_examples_http_connect_through_the_subcommand_form() {
    let env = Env::new();
    let srv = env.path("etc-srv-kubernetes");
    place(
        &env,
        &[
            ("server.crt", &srv.join("pki/apiserver.crt")),
            ("server.key", &srv.join("pki/apiserver.key")),
        ],
    );
    std::fs::create_dir_all(srv.join("konnectivity-server")).unwrap();
    let kube = token_api(&srv.join("konnectivity-server/kubeconfig"));
    let server_args = substitute(
        ANP_EXAMPLE_SERVER,
        &[
            ("/etc/srv/kubernetes/", format!("{}/", srv.display())),
            ("/var/log/", format!("{}/", env.dir.path().display())),
            ("--agent-port=8091", "--agent-port=0".into()),
            ("--health-port=8092", "--health-port=0".into()),
            ("--admin-port=8093", "--admin-port=0".into()),
        ],
    );
    let mut cmd = Command::new(BIN);
    cmd.arg("proxy-server").args(&server_args);
    let server = Proc::spawn(cmd, env.path("proxy-server.log"));
    let agent_port = listen(&server, "agent").port();
    server.wait_line("READY");
    // `--logtostderr=false --log-file=...`: the log goes to that file in
    // klog's format (the manifest mounts it), not to stderr.
    let log_file = env.path("konnectivity-server.log");
    // Lines reach the file from the log thread, soon after they are logged.
    let starting = |t: &str| {
        t.lines()
            .any(|l| l.starts_with('I') && l.contains("] \"edgetunnel server starting\""))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut text = String::new();
    while std::time::Instant::now() < deadline {
        text = std::fs::read_to_string(&log_file).unwrap_or_default();
        if starting(&text) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        starting(&text),
        "{}:\n{text}\nstderr:\n{}",
        log_file.display(),
        server.log_text()
    );
    assert!(!server.log_text().contains("edgetunnel server starting"));

    let secrets = env.path("var-run-secrets");
    pod_secrets(&env, &secrets);
    let mut agent_args = substitute(
        ANP_KIND_AGENT,
        &[
            ("/var/run/secrets/", format!("{}/", secrets.display())),
            (
                "konnectivity-server.kube-system.svc.cluster.local",
                "127.0.0.1".into(),
            ),
            (
                "--proxy-server-port=8091",
                format!("--proxy-server-port={agent_port}"),
            ),
            ("$(HOST_IP)", "127.0.0.1".into()),
        ],
    );
    // Ports: the Go defaults (8093, 8094) may be taken on a shared machine.
    agent_args.push(format!("--health-server-port={}", free_port()));
    agent_args.push(format!("--admin-server-port={}", free_port()));
    let mut cmd = Command::new(BIN);
    cmd.arg("proxy-agent").args(&agent_args);
    let agent = Proc::spawn(cmd, env.path("proxy-agent.log"));
    agent.wait_line("CONNECTED");
    assert_logged(&agent, &["accepted, no effect: --probe-interval=5s"]);
    assert_reviewed(&kube);

    let echo = echo_server("127.0.0.1");
    let sock = srv.join("konnectivity-server/konnectivity-server.socket");
    let data = random_bytes(300_000, 7);
    let (status, body, st) = connect_unix(&sock, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}\n{}", server.log_text());
    assert!(echo_roundtrip(st, &data) == data);
    assert_only_anp_requests(&kube);
}

/// Runs `f` on a thread inside network namespace `ns` (sockets it makes
/// stay there).
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("open netns");
        // SAFETY: setns on this thread only.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// A kubeconfig for the fake API server, with the test CA as
/// `certificate-authority-data` (where yurt-tunnel-server takes its CA).
fn kubeconfig_with_ca(path: &Path, api: SocketAddr, ca_pem: &[u8]) {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{api}\n    certificate-authority-data: {ca}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\n"
    );
    std::fs::write(path, text).unwrap();
}

/// Signs every pending CSR with the test CA until dropped.
struct Signer(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Signer {
    fn start(kube: &FakeKube, certs: PathBuf) -> Signer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (kube, flag) = (kube.clone(), stop.clone());
        std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                kube.sign_pending(&certs, 3600);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Signer(stop)
    }
}

impl Drop for Signer {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// OpenYurt v1.1.1 `charts/openyurt/templates/yurt-tunnel-server.yaml`,
/// with `$(NODE_IP)` and the chart's `certDnsNames`/`certIps` values
/// filled in below.
const YURT_SERVER: &[&str] = &[
    "--bind-address=$(NODE_IP)",
    "--insecure-bind-address=$(NODE_IP)",
    "--proxy-strategy=destHost",
    "--cert-dns-names={{ .Values.yurtTunnelServer.parameters.certDnsNames }}",
    "--cert-ips={{ .Values.yurtTunnelServer.parameters.certIps }}",
    "--v=2",
];

/// OpenYurt v1.1.1 `charts/openyurt/templates/yurt-tunnel-agent.yaml`.
const YURT_AGENT: &[&str] = &[
    "--node-name=$(NODE_NAME)",
    "--node-ip=$(POD_IP)",
    "--tunnelserver-addr={{ .Values.yurtTunnelAgent.parameters.tunnelserverAddr }}",
    "--v=2",
];

#[test]
fn openyurt_chart_server_and_agent_in_a_network_namespace() {
    let ns = Netns::new(&format!("etcompat{}", std::process::id() % 100_000));
    let env = Env::new();
    let bin = go_binaries(&env);
    let kube = FakeKube::start(Some(&ns.0));
    kube.put_node(node("edge-1", "127.0.0.1", true, true));
    let kc = env.path("kubeconfig");
    kubeconfig_with_ca(
        &kc,
        kube.addr,
        &std::fs::read(env.certs().join("ca.crt")).unwrap(),
    );
    let _signer = Signer::start(&kube, env.certs());

    // The namespace has only loopback: it is the node's address, and the
    // name the agent checks on the server certificate. The default ports
    // (10262-10265) are free in a fresh namespace.
    let values = [
        ("$(NODE_IP)", "127.0.0.1".to_string()),
        (
            "{{ .Values.yurtTunnelServer.parameters.certDnsNames }}",
            String::new(),
        ),
        (
            "{{ .Values.yurtTunnelServer.parameters.certIps }}",
            "127.0.0.1".into(),
        ),
    ];
    let mut server_args = substitute(YURT_SERVER, &values);
    // In a pod these default to the service account (fixed paths) and
    // /var/lib/yurttunnel-server/pki.
    server_args.push(format!("--kube-config={}", kc.display()));
    server_args.push(format!("--cert-dir={}", env.path("server-pki").display()));
    let mut cmd = ns.cmd(bin.join("yurt-tunnel-server").to_str().unwrap());
    cmd.args(&server_args);
    let server = Proc::spawn(cmd, env.path("yurt-tunnel-server.log"));
    assert_eq!(listen(&server, "agent").to_string(), "127.0.0.1:10262");
    server.wait_line("READY");
    assert_not_logged(&server, &["no effect: --enable-dns-controller"]);
    // yurt-tunnel's DNS controller, on by default: once the internal
    // Service has a ClusterIP, the records land where CoreDNS's `hosts`
    // plugin reads them (edge nodes at that ClusterIP, others at their
    // InternalIP), written by the holder of Go's lock.
    kube.put_node(node("cloud-1", "10.0.0.11", true, false));
    kube.put_service(
        "kube-system",
        "x-tunnel-server-internal-svc",
        "10.96.0.50",
        "",
    );
    let records = || {
        kube.configmap("kube-system", "yurt-tunnel-nodes")
            .and_then(|cm| cm["data"]["tunnel-nodes"].as_str().map(str::to_string))
    };
    let deadline = Instant::now() + WAIT;
    while records().as_deref() != Some("10.0.0.11\tcloud-1\n10.96.0.50\tedge-1") {
        assert!(
            Instant::now() < deadline,
            "DNS records {:?}\n{}",
            records(),
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let lease = kube
        .object("leases", "kube-system", "tunnel-dns-controller")
        .expect("the DNS controller's lease");
    assert!(lease["spec"]["holderIdentity"].is_string(), "{lease}");
    let deadline = Instant::now() + WAIT;
    while !save(&ns).contains("TUNNEL-PORT") {
        assert!(
            Instant::now() < deadline,
            "no iptables rules:\n{}\n{}",
            save(&ns),
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let agent_values = [
        ("$(NODE_NAME)", "edge-1".to_string()),
        ("$(POD_IP)", "127.0.0.1".into()),
        (
            "{{ .Values.yurtTunnelAgent.parameters.tunnelserverAddr }}",
            "127.0.0.1:10262".into(),
        ),
    ];
    let mut agent_args = substitute(YURT_AGENT, &agent_values);
    // In a pod: /etc/kubernetes/kubelet.conf and /var/lib/yurttunnel-agent/pki.
    agent_args.push(format!("--kube-config={}", kc.display()));
    agent_args.push(format!("--cert-dir={}", env.path("agent-pki").display()));
    let mut cmd = ns.cmd(bin.join("yurt-tunnel-agent").to_str().unwrap());
    cmd.args(&agent_args)
        // The pod's service-account ca.crt, which verifies the server.
        .env("EDGETUNNEL_COMPAT_SERVICEACCOUNT_DIR", env.certs());
    let agent = Proc::spawn(cmd, env.path("yurt-tunnel-agent.log"));
    agent.wait_line("CONNECTED");

    // A kubelet stand-in on the node, and a cloud client asking the plain
    // interception listener for it by node name.
    // On 10267, a localhost-proxy port: the node address is loopback here,
    // which the agent refuses but for the ports the yurt translation
    // allows (its --allow-destinations wins over the tests' environment).
    let kubelet = in_netns(&ns.0, || {
        let l = TcpListener::bind("127.0.0.1:10267").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\nkubelet says!");
            }
        });
        addr
    });
    let port = kubelet.port();
    let answer = in_netns(&ns.0, move || {
        let mut c = TcpStream::connect("127.0.0.1:10264").unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        write!(
            c,
            "GET /healthz HTTP/1.1\r\nHost: edge-1:{port}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        let _ = c.read_to_string(&mut text);
        text
    });
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("kubelet says!"),
        "{answer:?}\nserver:\n{}\nagent:\n{}",
        server.log_text(),
        agent.log_text()
    );
    assert_eq!(
        kube.csrs().len(),
        3,
        "serving, proxy-client and agent certificates"
    );
}

/// OpenYurt v1.0 `config/setup/yurt-tunnel-agent.yaml`: no
/// `--tunnelserver-addr`; yurt-tunnel-agent reads the address from the
/// `x-tunnel-server-svc` Service.
const YURT_SETUP_AGENT: &[&str] = &["--node-name=$(NODE_NAME)", "--node-ip=$(POD_IP)", "--v=2"];

/// The setup manifest's agent finds the server as yurt-tunnel-agent does:
/// the Service is a NodePort one (as in that manifest), so the address is
/// a cloud node's InternalIP (127.0.0.2 here: Go passes over only the text
/// 127.0.0.1 and ::1) with the Service's nodePort (the server's agent port
/// here). The server is edgetunnel's own, with a certificate for
/// 127.0.0.2 from `certs issue` (the agent checks the address it found).
#[test]
fn openyurt_setup_agent_finds_the_server_through_its_service() {
    let env = Env::new();
    let bin = go_binaries(&env);
    let server_pki = env.path("server-pki");
    let out = Command::new(BIN)
        .args(["certs", "issue", "server"])
        .arg(&server_pki)
        .arg("--ca-dir")
        .arg(env.path("certs-ca"))
        .args(["--name", "127.0.0.2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::copy(
        env.certs().join("proxy-client.crt"),
        server_pki.join("proxy-client.crt"),
    )
    .unwrap();
    std::fs::copy(
        env.certs().join("proxy-client.key"),
        server_pki.join("proxy-client.key"),
    )
    .unwrap();
    let pki = server_pki.display().to_string();
    let server = Server::start_with_tls(&env, "127.0.0.2:0", &["--certs-dir", &pki], &[]);
    let port = server.agent.port();

    let kube = FakeKube::start(None);
    kube.put_node(node("edge-1", "127.0.0.1", true, true));
    let mut master = node("master", "127.0.0.2", true, false);
    master["metadata"]["labels"]["openyurt.io/is-edge-worker"] = serde_json::json!("false");
    kube.put_node(master);
    kube.put_object(
        "services",
        "kube-system",
        "x-tunnel-server-svc",
        serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.9",
                "ports": [{"name": "tcp", "port": 10262, "targetPort": 10262, "nodePort": port}]}}),
    );
    kube.put_object(
        "endpoints",
        "kube-system",
        "x-tunnel-server-svc",
        serde_json::json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {},
            "subsets": [{"addresses": [{"ip": "127.0.0.1"}]}]}),
    );
    let kc = env.path("kubeconfig");
    kubeconfig_with_ca(
        &kc,
        kube.addr,
        &std::fs::read(env.certs().join("ca.crt")).unwrap(),
    );
    let _signer = Signer::start(&kube, env.certs());

    let mut args = substitute(
        YURT_SETUP_AGENT,
        &[
            ("$(NODE_NAME)", "edge-1".into()),
            ("$(POD_IP)", "127.0.0.1".into()),
        ],
    );
    // In a pod: /etc/kubernetes/kubelet.conf and /var/lib/yurttunnel-agent/pki.
    args.push(format!("--kube-config={}", kc.display()));
    args.push(format!("--cert-dir={}", env.path("agent-pki").display()));
    args.push(format!("--meta-port={}", free_port()));
    let mut cmd = Command::new(bin.join("yurt-tunnel-agent"));
    cmd.args(&args)
        .env("EDGETUNNEL_COMPAT_SERVICEACCOUNT_DIR", env.certs());
    let agent = Proc::spawn(cmd, env.path("yurt-tunnel-agent.log"));
    // The server found through the Service's NodePort on the master's
    // address: `CONNECTED <server> <server ID>`.
    let connected = agent.wait_line("CONNECTED");
    assert_eq!(
        connected.split(' ').nth(1),
        Some(format!("127.0.0.2:{port}").as_str()),
        "{connected}"
    );
    let asked = kube.requests();
    assert!(
        asked
            .iter()
            .any(|r| r.contains("labelSelector=openyurt.io%2Fis-edge-worker%3Dfalse")),
        "{asked:#?}"
    );
}
