//! kube-apiserver (v1.36, from `EDGETUNNEL_PEERS`) end to end through
//! edgetunnel: etcd, kube-apiserver and our server in a "cloud" network
//! namespace; our agent and a fake kubelet (HTTPS, on an address only the
//! node namespace has) in a "node" namespace; a veth pair between them
//! and no route from the cloud to the kubelet but the tunnel. Through
//! `--egress-selector-config-file` in GRPC and HTTPConnect modes over unix
//! sockets, and HTTPConnect over TCP with mutual TLS: `kubectl logs`,
//! `logs --tail`, `logs -f` cancelled (the tunnel closes), node proxy,
//! service proxy, 50 parallel `kubectl logs`, `kubectl exec` and
//! `port-forward` (kube-apiserver speaks SPDY/3.1 to the fake kubelet),
//! a 16 MiB log read to its last byte many times over. Then once more
//! with the Kubernetes docs' konnectivity-server and agent command lines
//! through `edgetunnel proxy-server` / `proxy-agent`: agents with a
//! ServiceAccount token checked by TokenReview against this
//! kube-apiserver, two servers that agents count by their leases.
//!
//! Without kube-apiserver among the peers the cases print
//! `skipped: kube-apiserver not in EDGETUNNEL_PEERS`.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{peers, serial, tail, Peers};
use crate::kube_cluster::{
    in_netns, run_bounded, start_etcd, write_kubeconfig, Egress, KubeApiserver, KubeCerts, Net,
    BACKEND_IP, BACKEND_PORT, CLOUD_IP, KUBELET_CLIENT_CN, KUBELET_IP, KUBELET_PORT,
};
use crate::kubelet::{big_log, small_log, Backend, FakeKubelet, BIG_LEN};
use crate::support::netns::sh;
use crate::support::{first_difference, metric_at, Agent, Binds, Env, Proc, Server, BIN, WAIT};

/// Printed when the peers are there but kube-apiserver is not.
const SKIPPED_NO_KAS: &str = "skipped: kube-apiserver not in EDGETUNNEL_PEERS";

/// The 16 MiB read, this many times per egress mode.
const BIG_READS: usize = 20;
/// Parallel `kubectl logs`.
const PARALLEL: usize = 50;

fn kube_peers() -> Option<&'static Peers> {
    let p = peers()?;
    if !p.has("kube-apiserver") {
        static SAID: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        SAID.get_or_init(|| {
            use std::io::Write;
            // Straight to the file descriptor: libtest captures eprintln!.
            let _ = writeln!(std::io::stderr(), "{SKIPPED_NO_KAS}");
        });
        return None;
    }
    Some(p)
}

/// Our server in the cloud namespace, our agent in the node namespace.
struct Tunnel {
    server: Server,
    agent: Agent,
    cloud: String,
}

impl Tunnel {
    fn start(net: &Net, env: &Env) -> Tunnel {
        let certs = env.certs();
        let binds = Binds {
            agent: format!("{CLOUD_IP}:0"),
            ..Binds::default()
        };
        let (server_crt, server_key, ca) = (
            certs.join("server.crt").display().to_string(),
            certs.join("server.key").display().to_string(),
            certs.join("ca.crt").display().to_string(),
        );
        let (cmd, n, connect_uds, grpc_uds) = Server::command(
            env,
            &["--certs-dir", &certs.display().to_string()],
            &binds,
            &[
                "--frontend-cert",
                &server_crt,
                "--frontend-key",
                &server_key,
                "--frontend-ca",
                &ca,
            ],
        );
        let server = Server::spawn(env, net.cloud.exec(&cmd), n, connect_uds, grpc_uds);
        let cmd = Agent::command(
            env,
            server.agent,
            "node-1",
            &format!("host=node-1&ipv4={KUBELET_IP}"),
            &[],
        );
        let agent = Agent {
            proc: Proc::spawn(net.node.exec(&cmd), env.path("agent-node-1.log")),
        };
        agent.proc.wait_line("CONNECTED");
        Tunnel {
            server,
            agent,
            cloud: net.cloud.0.clone(),
        }
    }

    fn watch(&self) -> Watch<'_> {
        Watch {
            cloud: &self.cloud,
            admin: self.server.admin,
            logs: vec![&self.server.proc, &self.agent.proc],
        }
    }
}

/// One of our servers seen through its admin listener (in the cloud
/// namespace), with the logs to show when a wait fails.
struct Watch<'a> {
    cloud: &'a str,
    admin: std::net::SocketAddr,
    logs: Vec<&'a Proc>,
}

impl Watch<'_> {
    /// A sample of the server's /metrics.
    fn metric(&self, sample: &str) -> f64 {
        let (admin, sample) = (self.admin, sample.to_string());
        in_netns(self.cloud, move || metric_at(admin, &sample))
    }

    /// The agent links the server holds, summed over its workers.
    fn agent_links(&self) -> f64 {
        let admin = self.admin;
        let text = in_netns(self.cloud, move || {
            crate::support::http_get(admin, "/metrics").1
        });
        text.lines()
            .filter(|l| l.starts_with("edgetunnel_worker_agent_links{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until `sample` is `want`.
    fn wait_metric(&self, sample: &str, want: f64, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let v = self.metric(sample);
            if v == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{sample} stayed {v}, not {want}, for {within:?}\n{}",
                self.logs
                    .iter()
                    .map(|p| format!("--- {}:\n{}", p.log.display(), tail(&p.log_text(), 30)))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Node `node-1` (InternalIP = the kubelet's address, kubelet port),
/// pod `default/p1` on it with containers `c` and `big`, and service
/// `default/echo` (no selector) whose Endpoints name the backend in the
/// node namespace as pod p1's address (kube-apiserver's service proxy
/// takes only addresses with a pod `targetRef` whose pod has that IP).
pub(crate) fn create_objects(kas: &KubeApiserver, env: &Env) {
    kas.create(
        env,
        "node",
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}),
    );
    kas.patch_status(
        &["node", "node-1"],
        &json!({"status": {
            "addresses": [{"type": "InternalIP", "address": KUBELET_IP},
                          {"type": "Hostname", "address": "node-1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "fake kubelet"}]
        }}),
    );
    kas.create(
        env,
        "pod",
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p1", "namespace": "default"},
            "spec": {"nodeName": "node-1", "containers": [
                {"name": "c", "image": "none"}, {"name": "big", "image": "none"}]}}),
    );
    kas.patch_status(
        &["pod", "p1"],
        &json!({"status": {"phase": "Running", "podIP": BACKEND_IP,
                           "podIPs": [{"ip": BACKEND_IP}], "hostIP": KUBELET_IP}}),
    );
    kas.create(
        env,
        "service",
        &json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "echo", "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": BACKEND_PORT}]}}),
    );
    kas.create(
        env,
        "endpoints",
        &json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "echo", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": BACKEND_IP, "nodeName": "node-1",
                           "targetRef": {"kind": "Pod", "namespace": "default", "name": "p1"}}],
                         "ports": [{"name": "http", "port": BACKEND_PORT}]}]}),
    );
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `kubectl logs`, `--tail`, node proxy and service proxy.
fn logs_and_proxies(kas: &KubeApiserver, kubelet: &FakeKubelet, backend: &Backend) {
    let got = kas.kubectl_ok(&["logs", "p1", "-c", "c"]);
    assert_eq!(text(&got), small_log("default", "p1", "c", None));
    let got = kas.kubectl_ok(&["logs", "p1", "-c", "c", "--tail=5"]);
    assert_eq!(text(&got), small_log("default", "p1", "c", Some(5)));
    let last = kubelet.requests().last().cloned().unwrap_or_default();
    assert!(
        last.starts_with("GET /containerLogs/default/p1/c?")
            && last.contains("tailLines=5")
            && last.ends_with(&format!("cn={KUBELET_CLIENT_CN}")),
        "{last}"
    );
    // Node proxy: kube-apiserver -> https://KUBELET_IP:10250/healthz.
    let got = kas.kubectl_ok(&["get", "--raw", "/api/v1/nodes/node-1/proxy/healthz"]);
    assert_eq!(text(&got), "ok");
    let got = kas.kubectl_ok(&["get", "--raw", "/api/v1/nodes/node-1/proxy/pods"]);
    assert!(text(&got).contains("\"PodList\""), "{}", text(&got));
    // Service proxy: kube-apiserver -> http://BACKEND_IP:8080 (an
    // endpoint of the service) through the same tunnel.
    let before = backend.requests.load(Ordering::SeqCst);
    let got = kas.kubectl_ok(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/services/echo:http/proxy/hello?x=1",
    ]);
    assert_eq!(text(&got), "backend saw GET /hello?x=1");
    assert_eq!(backend.requests.load(Ordering::SeqCst), before + 1);
}

/// `kubectl logs -f` read for a few lines, then killed: the kubelet's
/// stream ends (its writes fail), so the tunnel closed end to end, and
/// our server's `edgetunnel_open_connections` returns to 0.
fn follow_cancelled(kas: &KubeApiserver, kubelet: &FakeKubelet, tunnel: &Watch) {
    let ended = kubelet.stats.follow_ended.load(Ordering::SeqCst);
    let mut child = kas
        .kubectl_cmd(&["logs", "-f", "p1", "-c", "c"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for i in 0..5 {
        let l = lines.next().expect("a follow line").expect("read");
        assert_eq!(l, format!("follow default/p1/c {i}"));
    }
    assert_eq!(kubelet.stats.follow_open.load(Ordering::SeqCst), 1);
    assert!(tunnel.metric("edgetunnel_open_connections") >= 1.0);
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + WAIT;
    while kubelet.stats.follow_ended.load(Ordering::SeqCst) == ended {
        assert!(
            Instant::now() < deadline,
            "the kubelet's follow stream did not end after kubectl was killed"
        );
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(kubelet.stats.follow_open.load(Ordering::SeqCst), 0);
    // Nothing else is open: the kubelet and the backend close every
    // connection after its answer, so kube-apiserver keeps none idle.
    tunnel.wait_metric("edgetunnel_open_connections", 0.0, WAIT);
}

/// 50 `kubectl logs --tail=N` at once, each N different, each answer
/// exactly its own.
fn parallel_logs(kas: &KubeApiserver) {
    let children: Vec<_> = (1..=PARALLEL)
        .map(|n| {
            let c = kas
                .kubectl_cmd(&["logs", "p1", "-c", "c", &format!("--tail={n}")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("kubectl logs");
            (n, c)
        })
        .collect();
    for (n, c) in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "parallel kubectl logs --tail={n}: {}",
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), small_log("default", "p1", "c", Some(n)));
    }
}

/// `kubectl exec` through kube-apiserver's websocket-to-SPDY translation
/// and the tunnel to the fake kubelet's SPDY/3.1: output, an exit code,
/// 1 MiB of stdin copied back by `cat`.
fn exec(kas: &KubeApiserver, kubelet: &FakeKubelet) {
    let done = kubelet.stats.exec_done.load(Ordering::SeqCst);
    let got = kas.kubectl_ok(&["exec", "p1", "-c", "c", "--", "echo", "hello", "world"]);
    assert_eq!(text(&got), "hello world\n");
    let out = kas.kubectl(&["exec", "p1", "-c", "c", "--", "exit", "3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let input: Vec<u8> = (0..1 << 20).map(|i| b'a' + (i % 26) as u8).collect();
    let out = kas.kubectl_stdin(&["exec", "-i", "p1", "-c", "c", "--", "cat"], input.clone());
    assert!(out.status.success(), "exec -i cat: {}", text(&out.stderr));
    assert!(
        out.stdout == input,
        "exec -i cat: {}",
        first_difference(&out.stdout, &input)
    );
    assert_eq!(kubelet.stats.exec_done.load(Ordering::SeqCst), done + 3);
}

/// `kubectl port-forward` (websocket-tunnelled SPDY from kubectl, SPDY to
/// the kubelet): three connections, each echoing 256 KiB.
fn port_forward(kas: &KubeApiserver, kubelet: &FakeKubelet, cloud: &str) {
    let done = kubelet.stats.portforward_done.load(Ordering::SeqCst);
    let mut child = kas
        .kubectl_cmd(&["port-forward", "pod/p1", ":9999"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("kubectl port-forward said nothing"));
    // "Forwarding from 127.0.0.1:PORT -> 9999"
    let local: std::net::SocketAddr = line
        .strip_prefix("Forwarding from ")
        .and_then(|r| r.split(' ').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    for n in 0..3u8 {
        let data: Vec<u8> = (0..256 * 1024).map(|i| (i as u8) ^ n).collect();
        let got = in_netns(cloud, move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(local).expect("connect port-forward");
            s.set_read_timeout(Some(WAIT)).unwrap();
            let mut w = s.try_clone().unwrap();
            let d = data.clone();
            let t = thread::spawn(move || w.write_all(&d));
            let mut back = vec![0u8; data.len()];
            let r = s.read_exact(&mut back);
            t.join().unwrap().expect("write");
            r.map(|_| back == data).map_err(|e| e.to_string())
        });
        assert_eq!(got, Ok(true), "port-forward connection {n}");
    }
    let deadline = Instant::now() + WAIT;
    while kubelet.stats.portforward_done.load(Ordering::SeqCst) < done + 3 {
        assert!(Instant::now() < deadline, "port-forward streams not ended");
        thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The 16 MiB log, `n` times, each to its last byte. Every
/// failed read is reported at the end (size, first difference).
fn big_reads(kas: &KubeApiserver, mode: &str, n: usize) -> f64 {
    let want = big_log();
    assert_eq!(want.len(), BIG_LEN);
    let t0 = Instant::now();
    let mut failures = Vec::new();
    for i in 0..n {
        let out = run_bounded(
            kas.kubectl_cmd(&["logs", "p1", "-c", "big"]),
            None,
            Duration::from_secs(20),
        );
        if !out.status.success() || out.stdout != want {
            failures.push(format!(
                "read {i}: exit {:?}, {} {}",
                out.status.code(),
                first_difference(&out.stdout, &want),
                text(&out.stderr).trim()
            ));
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    assert!(
        failures.is_empty(),
        "{mode}: {} of {n} 16 MiB reads wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    secs
}

/// Every check through one kube-apiserver and the server `w` watches;
/// the seconds the 16 MiB reads took.
fn exercise(
    kas: &KubeApiserver,
    kubelet: &FakeKubelet,
    backend: &Backend,
    w: &Watch,
    cloud: &str,
    mode: &str,
    big: usize,
) -> f64 {
    logs_and_proxies(kas, kubelet, backend);
    follow_cancelled(kas, kubelet, w);
    parallel_logs(kas);
    exec(kas, kubelet);
    port_forward(kas, kubelet, cloud);
    big_reads(kas, mode, big)
}

/// The three egress modes against one etcd, one server, one agent, one
/// fake kubelet; kube-apiserver restarted with each configuration.
#[test]
fn kube_apiserver_logs_proxies_through_three_egress_modes() {
    let Some(p) = kube_peers() else { return };
    let _g = serial();
    let t0 = Instant::now();
    let net = Net::new();
    let env = Env::new();
    let certs = KubeCerts::new(&env);
    let _etcd = start_etcd(&net, &env);
    let tunnel = Tunnel::start(&net, &env);
    let kubelet = FakeKubelet::start(
        &net.node.0,
        &format!("{KUBELET_IP}:{KUBELET_PORT}"),
        &certs.kubelet.0,
        &certs.kubelet.1,
        &certs.ca,
    );
    let backend = Backend::start(&net.node.0, &format!("{BACKEND_IP}:{BACKEND_PORT}"));
    // The tunnel is the only way from the cloud to the node.
    for addr in [kubelet.addr, backend.addr] {
        if let Err(e) = net.cloud_cannot_reach(addr) {
            panic!("{e}");
        }
    }
    let envc = env.certs();
    let modes = [
        Egress::GrpcUds(tunnel.server.grpc_uds.clone()),
        Egress::ConnectUds(tunnel.server.connect_uds.clone()),
        Egress::ConnectTls {
            url: format!("https://{}", tunnel.server.connect),
            ca: envc.join("ca.crt"),
            cert: certs.egress_client.0.clone(),
            key: certs.egress_client.1.clone(),
        },
    ];
    let mut report = Vec::new();
    for (run, mode) in modes.iter().enumerate() {
        let t = Instant::now();
        let kas = KubeApiserver::start(&p.bin("kube-apiserver"), &net, &env, &certs, mode, run);
        let started = t.elapsed().as_secs_f64();
        if run == 0 {
            create_objects(&kas, &env);
        }
        let w = tunnel.watch();
        let big = exercise(
            &kas,
            &kubelet,
            &backend,
            &w,
            &net.cloud.0,
            mode.name(),
            BIG_READS,
        );
        kas.stop();
        // With kube-apiserver gone nothing of it may stay in the tunnel.
        w.wait_metric("edgetunnel_open_connections", 0.0, WAIT);
        w.wait_metric("edgetunnel_pending_dials", 0.0, WAIT);
        report.push(format!(
            "{}: ready in {started:.1} s, all in {:.1} s, {BIG_READS} x 16 MiB in {big:.1} s",
            mode.name(),
            t.elapsed().as_secs_f64()
        ));
    }
    let all = kubelet.requests();
    assert!(
        all.iter()
            .all(|r| r.ends_with(&format!("cn={KUBELET_CLIENT_CN}"))),
        "a kubelet request without kube-apiserver's client certificate"
    );
    eprintln!(
        "kube-apiserver through edgetunnel, {:.1} s:\n{}",
        t0.elapsed().as_secs_f64(),
        report.join("\n")
    );
}

/// One of the docs' konnectivity-server command lines, run as
/// `edgetunnel proxy-server`, with its admin port.
struct DocsServer {
    proc: Proc,
    admin: std::net::SocketAddr,
}

/// The Kubernetes docs' "Set up Konnectivity service" command lines
/// (kubernetes.io/docs/tasks/extend-kubernetes/setup-konnectivity/),
/// through `edgetunnel proxy-server` / `proxy-agent`: GRPC over a unix
/// socket, agents with a ServiceAccount token (audience
/// `system:konnectivity-server`) that the servers check by TokenReview
/// against this kube-apiserver, and two servers publishing leases
/// (`--enable-lease-controller`) that the agent counts
/// (`--count-server-leases`) to connect to both, behind one address (a
/// round-robin DNAT in the cloud namespace stands for the load balancer).
/// kube-apiserver goes through one server, then, restarted, the other.
#[test]
fn kube_apiserver_konnectivity_docs_token_review_two_servers_by_leases() {
    let Some(p) = kube_peers() else { return };
    let _g = serial();
    let t0 = Instant::now();
    let net = Net::new();
    let env = Env::new();
    let certs = KubeCerts::new(&env);
    let _etcd = start_etcd(&net, &env);
    let uds = [
        env.path("konnectivity-server-a.socket"),
        env.path("konnectivity-server-b.socket"),
    ];
    let kas_bin = p.bin("kube-apiserver");
    // An audit log of every request the servers make.
    let policy = env.path("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: Metadata\n  users: [\"system:konnectivity-server\"]\n- level: None\n",
    )
    .unwrap();
    let audit = env.path("audit.log");
    let audit_flags = [
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", audit.display()),
    ];
    let kas = KubeApiserver::start_with(
        &kas_bin,
        &net,
        &env,
        &certs,
        &Egress::GrpcUds(uds[0].clone()),
        0,
        &audit_flags,
    );
    create_objects(&kas, &env);
    // The docs' RBAC: the server may create TokenReviews; here it and the
    // agent's ServiceAccount also use the leases in kube-system.
    for args in [
        &[
            "create",
            "serviceaccount",
            "konnectivity-agent",
            "-n",
            "kube-system",
        ][..],
        &[
            "create",
            "clusterrolebinding",
            "system:konnectivity-server",
            "--clusterrole=system:auth-delegator",
            "--user=system:konnectivity-server",
        ],
        &[
            "create",
            "role",
            "konnectivity-leases",
            "-n",
            "kube-system",
            "--verb=get,list,watch,create,update,patch,delete",
            "--resource=leases.coordination.k8s.io",
        ],
        &[
            "create",
            "rolebinding",
            "konnectivity-leases",
            "-n",
            "kube-system",
            "--role=konnectivity-leases",
            "--user=system:konnectivity-server",
            "--serviceaccount=kube-system:konnectivity-agent",
        ],
    ] {
        kas.kubectl_ok(args);
    }
    let token = text(&kas.kubectl_ok(&[
        "create",
        "token",
        "konnectivity-agent",
        "-n",
        "kube-system",
        "--audience=system:konnectivity-server",
        "--duration=1h",
    ]));
    let token_file = env.path("konnectivity-agent-token");
    std::fs::write(&token_file, token.trim()).unwrap();
    let server_kubeconfig = env.path("konnectivity-server.conf");
    write_kubeconfig(
        &server_kubeconfig,
        crate::kube_cluster::APISERVER,
        &certs.ca,
        &format!(
            "client-certificate: {}\n    client-key: {}",
            certs.konnectivity.0.display(),
            certs.konnectivity.1.display()
        ),
    );
    let agent_kubeconfig = env.path("konnectivity-agent.conf");
    write_kubeconfig(
        &agent_kubeconfig,
        &format!("{CLOUD_IP}:6443"),
        &certs.ca,
        &format!("token: {}", token.trim()),
    );
    // The load balancer: every other new connection to :8132 goes to the
    // second server's :8142 (nat rules see a connection's first packet
    // only), so the agent's second dial reaches the server it lacks.
    sh(
        &net.cloud.0,
        &format!(
            "iptables -t nat -A PREROUTING -p tcp -d {CLOUD_IP} --dport 8132 -m statistic \
             --mode nth --every 2 --packet 1 -j DNAT --to-destination {CLOUD_IP}:8142"
        ),
    );
    let servers: Vec<DocsServer> = uds
        .iter()
        .zip([8132u16, 8142])
        .enumerate()
        .map(|(i, (uds, port))| {
            let mut cmd = net.cloud_cmd(BIN);
            cmd.arg("proxy-server").args([
                "--logtostderr=true".to_string(),
                format!("--uds-name={}", uds.display()),
                "--delete-existing-uds-file".to_string(),
                format!("--cluster-cert={}", certs.apiserver.0.display()),
                format!("--cluster-key={}", certs.apiserver.1.display()),
                "--mode=grpc".to_string(),
                "--server-port=0".to_string(),
                format!("--agent-port={port}"),
                format!("--admin-port={}", port + 1),
                format!("--health-port={}", port + 2),
                "--agent-namespace=kube-system".to_string(),
                "--agent-service-account=konnectivity-agent".to_string(),
                format!("--kubeconfig={}", server_kubeconfig.display()),
                "--authentication-audience=system:konnectivity-server".to_string(),
                "--enable-lease-controller".to_string(),
            ]);
            let proc = Proc::spawn(cmd, env.path(&format!("proxy-server-{i}.log")));
            proc.wait_line("READY");
            DocsServer {
                proc,
                admin: format!("127.0.0.1:{}", port + 1).parse().unwrap(),
            }
        })
        .collect();
    // Both servers' leases first, so that the agent's first count finds
    // two.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let leases = text(&kas.kubectl_ok(&[
            "get",
            "leases",
            "-n",
            "kube-system",
            "-l",
            "k8s-app=konnectivity-server",
            "-o",
            "name",
        ]));
        if leases.lines().count() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "leases {leases:?}\n--- server a:\n{}\n--- server b:\n{}",
            tail(&servers[0].proc.log_text(), 20),
            tail(&servers[1].proc.log_text(), 20)
        );
        thread::sleep(Duration::from_millis(200));
    }
    let mut cmd = net.node_cmd(BIN);
    cmd.arg("proxy-agent").args([
        "--logtostderr=true".to_string(),
        format!("--ca-cert={}", certs.ca.display()),
        format!("--proxy-server-host={CLOUD_IP}"),
        "--proxy-server-port=8132".to_string(),
        "--admin-server-port=8133".to_string(),
        "--health-server-port=8134".to_string(),
        format!("--service-account-token-path={}", token_file.display()),
        "--count-server-leases".to_string(),
        format!("--kubeconfig={}", agent_kubeconfig.display()),
    ]);
    let agent = Proc::spawn(cmd, env.path("proxy-agent.log"));
    let t_agent = Instant::now();
    let kubelet = FakeKubelet::start(
        &net.node.0,
        &format!("{KUBELET_IP}:{KUBELET_PORT}"),
        &certs.kubelet.0,
        &certs.kubelet.1,
        &certs.ca,
    );
    let backend = Backend::start(&net.node.0, &format!("{BACKEND_IP}:{BACKEND_PORT}"));
    let watches: Vec<Watch> = servers
        .iter()
        .map(|s| Watch {
            cloud: &net.cloud.0,
            admin: s.admin,
            logs: vec![&s.proc, &agent],
        })
        .collect();
    // The agent counts two leases and links to both servers.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let links: Vec<f64> = watches.iter().map(Watch::agent_links).collect();
        if links.iter().all(|&l| l >= 1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "agent links {links:?}\n--- agent:\n{}\n--- server a:\n{}\n--- server b:\n{}",
            tail(&agent.log_text(), 30),
            tail(&servers[0].proc.log_text(), 20),
            tail(&servers[1].proc.log_text(), 20)
        );
        thread::sleep(Duration::from_millis(100));
    }
    let linked = t_agent.elapsed().as_secs_f64();
    // The agent has no client certificate: it got in by its token. One
    // with a token for another audience is refused (kube-apiserver's
    // TokenReview says unauthenticated), by whichever server it reaches.
    let bad = text(&kas.kubectl_ok(&[
        "create",
        "token",
        "konnectivity-agent",
        "-n",
        "kube-system",
        "--audience=https://kubernetes.default.svc",
        "--duration=1h",
    ]));
    let bad_file = env.path("wrong-audience-token");
    std::fs::write(&bad_file, bad.trim()).unwrap();
    let mut cmd = net.node_cmd(BIN);
    cmd.arg("proxy-agent").args([
        format!("--ca-cert={}", certs.ca.display()),
        format!("--proxy-server-host={CLOUD_IP}"),
        "--proxy-server-port=8132".to_string(),
        "--admin-server-port=8135".to_string(),
        "--health-server-port=8136".to_string(),
        format!("--service-account-token-path={}", bad_file.display()),
    ]);
    let intruder = Proc::spawn(cmd, env.path("proxy-agent-wrong-audience.log"));
    let refused = "edgetunnel_agents_refused_total{code=\"Unauthenticated\"}";
    let deadline = Instant::now() + WAIT;
    while watches.iter().map(|w| w.metric(refused)).sum::<f64>() < 1.0 {
        assert!(
            Instant::now() < deadline,
            "an agent with a wrong-audience token was not refused:\n{}",
            tail(&intruder.log_text(), 20)
        );
        thread::sleep(Duration::from_millis(100));
    }
    drop(intruder);
    let links: Vec<f64> = watches.iter().map(Watch::agent_links).collect();
    assert!(links.iter().all(|&l| l >= 1.0), "{links:?}");
    let big_a = exercise(
        &kas,
        &kubelet,
        &backend,
        &watches[0],
        &net.cloud.0,
        "server a",
        5,
    );
    kas.stop();
    watches[0].wait_metric("edgetunnel_open_connections", 0.0, WAIT);
    let kas = KubeApiserver::start_with(
        &kas_bin,
        &net,
        &env,
        &certs,
        &Egress::GrpcUds(uds[1].clone()),
        1,
        &audit_flags,
    );
    logs_and_proxies(&kas, &kubelet, &backend);
    follow_cancelled(&kas, &kubelet, &watches[1]);
    let big_b = big_reads(&kas, "server b", 2);
    kas.stop();
    watches[1].wait_metric("edgetunnel_open_connections", 0.0, WAIT);
    // The servers asked kube-apiserver for what ANP's proxy-server asks:
    // TokenReviews and leases, nothing the docs' RBAC does not grant.
    let log = std::fs::read_to_string(&audit).expect("audit log");
    let mut asked = std::collections::BTreeMap::<String, usize>::new();
    for line in log.lines() {
        let e: serde_json::Value = serde_json::from_str(line).expect("audit event");
        let what = format!(
            "{} {}",
            e["verb"].as_str().unwrap_or(""),
            e["objectRef"]["resource"]
                .as_str()
                .unwrap_or(e["requestURI"].as_str().unwrap_or(""))
        );
        *asked.entry(what).or_default() += 1;
    }
    assert!(
        asked.keys().any(|k| k.ends_with(" tokenreviews"))
            && asked.keys().any(|k| k.ends_with(" leases")),
        "{asked:?}"
    );
    assert!(
        asked
            .keys()
            .all(|k| k.ends_with(" tokenreviews") || k.ends_with(" leases")),
        "the servers asked kube-apiserver for more than TokenReviews and leases: {asked:?}"
    );
    eprintln!(
        "konnectivity docs' command lines, two servers: agent on both in {linked:.1} s, \
         5 x 16 MiB via a in {big_a:.1} s, 2 via b in {big_b:.1} s, all {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
