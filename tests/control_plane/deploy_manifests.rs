//! The Kubernetes manifests in deploy/ are correct on a real cluster, as far
//! as reading them can tell: every container's command line translates (the
//! Go binaries' flags) and parses (edgetunnel's own); Services select pods
//! of their own namespace on ports those pods serve; probes hit ports the
//! container serves; an egress selector file and the server whose socket it
//! names speak the same protocol; several servers behind one address are
//! counted; hostNetwork pods that can share a node bind different ports;
//! no pod runs Unconfined; RBAC grants each identity exactly what its flags
//! make it call; images are pinned; roles run as non-root where they can,
//! and those that need root say so (the image's own user is 65532).
//! `image` (tests/control_plane/deploy_manifests/image.rs) checks that the
//! Dockerfile builds each architecture's binary.
//! `dry_run` (tests/control_plane/deploy_manifests/dry_run.rs) then
//! applies every manifest with `kubectl apply --dry-run=server` against a
//! real kube-apiserver when ../shared/peers has one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;
use edgetunnel::cli::{AgentArgs, CertMode, Cli, Command, ServerArgs};
use edgetunnel::compat::{self, Binary, Host};
use serde_json::Value;

mod dry_run;
mod image;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Every `*.yaml` under deploy/, sorted.
fn manifest_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                out.push(p);
            }
        }
    }
    let mut all = Vec::new();
    walk(&root().join("deploy"), &mut all);
    all.sort();
    all
}

/// One document of a manifest file.
#[derive(Clone)]
struct Doc {
    file: PathBuf,
    v: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.v["kind"].as_str().unwrap_or("")
    }
    fn name(&self) -> &str {
        self.v["metadata"]["name"].as_str().unwrap_or("")
    }
    /// The namespace; the default one when unset.
    fn namespace(&self) -> &str {
        self.v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
    }
    fn id(&self) -> String {
        format!("{}/{}/{}", self.kind(), self.namespace(), self.name())
    }
    fn short(&self) -> String {
        format!(
            "{}: {}",
            self.file.strip_prefix(root()).unwrap().display(),
            self.id()
        )
    }
}

fn docs() -> Vec<Doc> {
    let mut out = Vec::new();
    for f in manifest_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let vs: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for v in vs {
            if !v.is_null() {
                out.push(Doc { file: f.clone(), v });
            }
        }
    }
    out
}

/// A pod template (or a Pod) of a workload.
struct Workload {
    doc: Doc,
    labels: BTreeMap<String, String>,
    spec: Value,
}

impl Workload {
    fn host_network(&self) -> bool {
        self.spec["hostNetwork"].as_bool() == Some(true)
    }
    fn node_selector(&self) -> BTreeMap<String, String> {
        string_map(&self.spec["nodeSelector"])
    }
    fn containers(&self) -> Vec<Value> {
        self.spec["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn workloads(all: &[Doc]) -> Vec<Workload> {
    let mut out = Vec::new();
    for d in all {
        let (meta, spec) = match d.kind() {
            "Pod" => (&d.v["metadata"], &d.v["spec"]),
            "DaemonSet" | "Deployment" | "StatefulSet" => (
                &d.v["spec"]["template"]["metadata"],
                &d.v["spec"]["template"]["spec"],
            ),
            _ => continue,
        };
        out.push(Workload {
            doc: d.clone(),
            labels: string_map(&meta["labels"]),
            spec: spec.clone(),
        });
    }
    out
}

/// A pod's view for the Go flags' translation: the container's `env`
/// (fieldRefs as a node would give them), every file present.
struct Pod(BTreeMap<String, String>);

impl Host for Pod {
    fn env(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
    fn uuid(&self) -> String {
        "00000000-0000-4000-8000-000000000000".into()
    }
    fn exists(&self, _: &Path) -> bool {
        true
    }
    fn read(&self, _: &Path) -> std::io::Result<Vec<u8>> {
        Ok(Vec::new())
    }
}

fn container_env(c: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("spec.nodeName") => "node-1".into(),
                Some("status.hostIP") => "192.0.2.10".into(),
                Some("status.podIP") => "198.18.0.10".into(),
                Some(other) => format!("field-{other}"),
                None => panic!("env {name}: no value"),
            }
        };
        env.insert(name, value);
    }
    env
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| match s {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The edgetunnel command line a container runs (the image's entry point
/// or one of the Go binaries' names the Dockerfile links), with `$(VAR)`
/// expanded as the kubelet would; None for a container that runs
/// something else (an init container's `chown`).
fn argv(c: &Value, dockerfile: &str) -> Option<Vec<String>> {
    let env = container_env(c);
    let command = strings(&c["command"]);
    let args = strings(&c["args"]);
    let expand = |a: &str| {
        let mut a = a.to_string();
        for (k, v) in &env {
            a = a.replace(&format!("$({k})"), v);
        }
        assert!(!a.contains("$("), "{a}: a variable the container has not");
        a
    };
    let args: Vec<String> = args.iter().map(|a| expand(a)).collect();
    match command.first().map(|c| c.trim_start_matches('/')) {
        None => Some(
            std::iter::once("edgetunnel".to_string())
                .chain(args)
                .collect(),
        ),
        Some(name) => {
            let binary = Binary::from_name(name)?;
            assert!(
                dockerfile.contains(&format!("/{name}")) || dockerfile.contains(name),
                "the image has no {name} entry point"
            );
            let t = compat::translate(binary, &args, &Pod(env)).unwrap_or_else(|e| panic!("{e}"));
            Some(t.argv)
        }
    }
}

enum Role {
    Server(Box<ServerArgs>),
    Agent(Box<AgentArgs>),
}

fn dockerfile() -> String {
    std::fs::read_to_string(root().join("Dockerfile")).unwrap()
}

/// Every edgetunnel container: (workload, container, its parsed role).
fn roles(all: &[Doc]) -> Vec<(Workload, Value, Role)> {
    let df = dockerfile();
    let mut out = Vec::new();
    for w in workloads(all) {
        for c in w.containers() {
            let Some(argv) = argv(&c, &df) else { continue };
            let cli = Cli::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("{}: {argv:?}: {e}", w.doc.short()));
            let role = match cli.command {
                Command::Server(s) => Role::Server(s),
                Command::Agent(a) => Role::Agent(a),
                _ => panic!("{}: neither server nor agent", w.doc.short()),
            };
            out.push((
                Workload {
                    doc: w.doc.clone(),
                    labels: w.labels.clone(),
                    spec: w.spec.clone(),
                },
                c,
                role,
            ));
        }
    }
    out
}

/// TCP addresses a role listens on.
fn listens(role: &Role) -> Vec<SocketAddr> {
    match role {
        Role::Server(s) => [
            Some(s.agent_bind),
            Some(s.admin_bind),
            s.health_bind,
            s.connect_bind,
            s.grpc_bind,
            s.interception_bind,
            s.interception_tls_bind,
        ]
        .into_iter()
        .flatten()
        .collect(),
        Role::Agent(a) => [a.health_bind, a.admin_bind]
            .into_iter()
            .flatten()
            .collect(),
    }
}

/// Unix sockets a role serves.
fn sockets(role: &Role) -> Vec<PathBuf> {
    match role {
        Role::Server(s) => [s.connect_uds.clone(), s.grpc_uds.clone()]
            .into_iter()
            .flatten()
            .collect(),
        Role::Agent(_) => Vec::new(),
    }
}

/// The address a probe's (or Service's) port number resolves to, given the
/// container's named ports.
fn port_number(c: &Value, port: &Value) -> u16 {
    match port {
        Value::Number(n) => n.as_u64().unwrap() as u16,
        Value::String(name) => c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no container port named {name}"))
            as u16,
        other => panic!("port {other}"),
    }
}

#[test]
fn every_manifest_container_command_line_is_accepted() {
    let all = docs();
    let roles = roles(&all);
    assert!(roles.len() >= 5, "only {} containers found", roles.len());
}

#[test]
fn services_select_pods_of_their_namespace_on_ports_they_serve() {
    let all = docs();
    let roles = roles(&all);
    let mut checked = 0;
    for svc in all.iter().filter(|d| d.kind() == "Service") {
        let selector = string_map(&svc.v["spec"]["selector"]);
        assert!(!selector.is_empty(), "{}: no selector", svc.short());
        let selected: Vec<_> = roles
            .iter()
            .filter(|(w, _, _)| {
                w.doc.namespace() == svc.namespace()
                    && selector.iter().all(|(k, v)| w.labels.get(k) == Some(v))
            })
            .collect();
        // A workload defined in the Service's own file is the one deployed
        // with it (the same DaemonSet may be defined by an alternative file).
        let same_file: Vec<_> = selected
            .iter()
            .copied()
            .filter(|(w, _, _)| w.doc.file == svc.file)
            .collect();
        let pods = if same_file.is_empty() {
            selected
        } else {
            same_file
        };
        assert!(
            !pods.is_empty(),
            "{}: selects {selector:?}, which no pod in namespace {} carries: it has no endpoints",
            svc.short(),
            svc.namespace()
        );
        for p in svc.v["spec"]["ports"].as_array().unwrap() {
            for (w, c, role) in &pods {
                let target = port_number(c, p.get("targetPort").unwrap_or(&p["port"]));
                assert!(
                    listens(role)
                        .iter()
                        .any(|a| a.port() == target && !a.ip().is_loopback()),
                    "{}: port {target} is not served (on a non-loopback address) by {}",
                    svc.short(),
                    w.doc.short()
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} Services");
}

#[test]
fn probes_hit_ports_the_container_serves() {
    let all = docs();
    for (w, c, role) in roles(&all) {
        let live = &c["livenessProbe"];
        assert!(
            live.is_object(),
            "{}: {} has no liveness probe",
            w.doc.short(),
            c["name"]
        );
        for kind in ["livenessProbe", "readinessProbe", "startupProbe"] {
            let probe = &c[kind];
            if probe.is_null() {
                continue;
            }
            let get = &probe["httpGet"];
            assert!(get.is_object(), "{}: {kind} is not httpGet", w.doc.short());
            let port = port_number(&c, &get["port"]);
            let path = get["path"].as_str().unwrap_or("/");
            assert!(
                ["/healthz", "/readyz", "/ready"].contains(&path),
                "{}: {kind} path {path} is not served",
                w.doc.short()
            );
            // The kubelet probes the pod's address unless told a host.
            let host = get["host"].as_str();
            let served = listens(&role).into_iter().any(|a| {
                a.port() == port
                    && match host {
                        Some(h) => a.ip().is_unspecified() || a.ip().to_string() == h,
                        None => !a.ip().is_loopback(),
                    }
                    && (!a.ip().is_loopback() || w.host_network())
            });
            assert!(
                served,
                "{}: {kind} probes {}:{port}{path}, which the container does not serve ({:?})",
                w.doc.short(),
                host.unwrap_or("<pod IP>"),
                listens(&role)
            );
            if let Role::Server(_) = role {
                // A server's /readyz fails until an agent is connected, and
                // agents come in through the Service that readiness gates.
                assert!(
                    !(kind == "readinessProbe" && path != "/healthz"),
                    "{}: a readiness probe on {path} keeps a fresh cluster's server out of \
                     its Service until an agent connects, and agents connect through it",
                    w.doc.short()
                );
            }
        }
    }
}

#[test]
fn containers_have_resources_pinned_images_and_least_privilege() {
    let all = docs();
    let version = env!("CARGO_PKG_VERSION");
    for w in workloads(&all) {
        let pod_sc = &w.spec["securityContext"];
        let inits = w.spec["initContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for c in w.containers().iter().chain(inits.iter()) {
            let what = format!("{}: container {}", w.doc.short(), c["name"]);
            let image = c["image"].as_str().unwrap();
            assert_eq!(
                image,
                format!("edgetunnel:{version}"),
                "{what}: images are pinned to the crate's version"
            );
            let r = &c["resources"];
            for (k, res) in [
                ("requests", "cpu"),
                ("requests", "memory"),
                ("limits", "memory"),
            ] {
                assert!(r[k][res].is_string(), "{what}: no resources.{k}.{res}");
            }
            let sc = &c["securityContext"];
            assert_eq!(
                sc["allowPrivilegeEscalation"],
                Value::Bool(false),
                "{what}: allowPrivilegeEscalation must be false"
            );
            let drop = strings(&sc["capabilities"]["drop"]);
            assert_eq!(drop, ["ALL"], "{what}: capabilities are not dropped");
            let seccomp = if sc["seccompProfile"].is_object() {
                &sc["seccompProfile"]
            } else {
                &pod_sc["seccompProfile"]
            };
            let t = seccomp["type"].as_str().unwrap_or("unset");
            assert!(
                t == "Localhost" || t == "RuntimeDefault",
                "{what}: seccomp profile {t}: Unconfined (or none) lets it do anything"
            );
            if t == "Localhost" {
                let profile = seccomp["localhostProfile"].as_str().unwrap();
                check_profile(&root().join("deploy/seccomp").join(profile));
            }
            // Root only for a role that needs it: iptables (NET_ADMIN) or
            // reading kube-apiserver's root-only key, or chown-ing a host
            // directory for the non-root container.
            let adds = strings(&sc["capabilities"]["add"]);
            let non_root = sc["runAsNonRoot"]
                .as_bool()
                .or(pod_sc["runAsNonRoot"].as_bool());
            let reads_pki = c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["mountPath"].as_str() == Some("/etc/kubernetes/pki"));
            if adds.is_empty() && !reads_pki {
                assert_eq!(
                    non_root,
                    Some(true),
                    "{what}: runs as root without needing it"
                );
            } else {
                // The image runs as 65532 (Dockerfile `USER`): a role that
                // needs root asks for uid 0.
                let uid = sc["runAsUser"].as_i64().or(pod_sc["runAsUser"].as_i64());
                assert_eq!(
                    uid,
                    Some(0),
                    "{what}: needs root but would run as the image's user"
                );
                let allowed = ["NET_ADMIN", "NET_RAW", "CHOWN"];
                assert!(
                    adds.iter().all(|a| allowed.contains(&a.as_str())),
                    "{what}: capabilities {adds:?}"
                );
            }
        }
    }
}

/// A Localhost seccomp profile: flat OCI format (what the kubelet hands
/// the runtime), errno by default, io_uring allowed, nothing that needs a
/// capability edgetunnel does not have.
fn check_profile(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let p: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
    for moby_only in ["archMap", "includes", "excludes"] {
        assert!(
            !text.contains(&format!("\"{moby_only}\"")),
            "{}: `{moby_only}` is Docker's syntax; the runtime ignores it",
            path.display()
        );
    }
    let mut allowed = BTreeSet::new();
    for s in p["syscalls"].as_array().unwrap() {
        if s["action"] == "SCMP_ACT_ALLOW" && s["args"].as_array().is_none_or(|a| a.is_empty()) {
            allowed.extend(strings(&s["names"]));
        }
    }
    for need in [
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "epoll_wait",
    ] {
        assert!(
            allowed.contains(need),
            "{}: {need} not allowed",
            path.display()
        );
    }
    for never in [
        "mount",
        "bpf",
        "kexec_load",
        "init_module",
        "unshare",
        "setns",
    ] {
        assert!(
            !allowed.contains(never),
            "{}: {never} allowed",
            path.display()
        );
    }
}

/// Every EgressSelectorConfiguration under deploy/: (file, udsName,
/// proxyProtocol).
fn egress_selections() -> Vec<(PathBuf, String, String)> {
    let mut out = Vec::new();
    for f in manifest_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let Ok(v) = serde_saphyr::from_str::<Value>(&text) else {
            continue;
        };
        if v["kind"] != "EgressSelectorConfiguration" {
            continue;
        }
        for sel in v["egressSelections"].as_array().unwrap() {
            let conn = &sel["connection"];
            if let Some(uds) = conn["transport"]["uds"]["udsName"].as_str() {
                let protocol = conn["proxyProtocol"].as_str().unwrap().to_string();
                out.push((f.clone(), uds.to_string(), protocol));
            }
        }
    }
    out
}

#[test]
fn egress_selector_files_agree_with_the_servers_they_name() {
    let all = docs();
    let selections = egress_selections();
    let mut checked = 0;
    for (w, c, r) in roles(&all) {
        let Role::Server(s) = r else { continue };
        for (uds, serves) in [(&s.connect_uds, "HTTPConnect"), (&s.grpc_uds, "GRPC")] {
            let Some(uds) = uds else { continue };
            let naming: Vec<_> = selections
                .iter()
                .filter(|(_, u, _)| Path::new(u) == uds)
                .collect();
            assert!(
                !naming.is_empty(),
                "{}: serves {} and no egress selector file in deploy/ names it",
                w.doc.short(),
                uds.display()
            );
            for (f, _, protocol) in naming {
                assert_eq!(
                    protocol,
                    serves,
                    "{}: proxyProtocol {protocol} for {}, but {} serves {serves} there: \
                     every egress dial would fail",
                    f.display(),
                    uds.display(),
                    w.doc.short()
                );
                checked += 1;
            }
            // kube-apiserver reaches the socket on the host.
            let dir = uds.parent().unwrap();
            assert!(
                c["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["mountPath"].as_str() == dir.to_str()),
                "{}: {} is not a host directory",
                w.doc.short(),
                dir.display()
            );
        }
    }
    assert!(checked >= 2, "only {checked} egress selections checked");
}

/// Whether a workload may run more than one server at a time.
fn several(w: &Workload) -> bool {
    match w.doc.kind() {
        "DaemonSet" => true,
        "Deployment" | "StatefulSet" => w.doc.v["spec"]["replicas"].as_u64().unwrap_or(1) > 1,
        // konnectivity's static pod: one per control-plane node.
        "Pod" => true,
        _ => false,
    }
}

fn label_set(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn several_servers_behind_one_address_are_all_found_by_agents() {
    let all = docs();
    let roles = roles(&all);
    let mut servers = 0;
    for (w, _, r) in &roles {
        let Role::Server(s) = r else { continue };
        if !several(w) {
            continue;
        }
        servers += 1;
        assert!(
            s.enable_lease_controller,
            "{}: several servers with --server-count {} and no lease controller: an agent \
             behind one address finds one server only and the others answer 500",
            w.doc.short(),
            s.server_count
        );
        assert!(s.kube.is_some(), "{}: leases need --kube", w.doc.short());
        // The agents of the same deployment (directory) count those leases.
        let lease_labels = label_set(&s.lease_label);
        let agents: Vec<_> = roles
            .iter()
            .filter(|(a, _, _)| a.doc.file.parent() == w.doc.file.parent())
            .filter_map(|(a, _, r)| match r {
                Role::Agent(x) => Some((a, x)),
                _ => None,
            })
            .collect();
        assert!(!agents.is_empty(), "{}: no agents beside it", w.doc.short());
        for (a, x) in agents {
            assert!(
                x.count_server_leases && x.kube.is_some(),
                "{}: does not count server leases",
                a.doc.short()
            );
            assert_eq!(x.lease_namespace, s.lease_namespace, "{}", a.doc.short());
            let sel = label_set(&x.lease_label_selector);
            assert!(
                sel.iter().all(|(k, v)| lease_labels.get(k) == Some(v)),
                "{}: selector {sel:?} misses the leases labelled {lease_labels:?}",
                a.doc.short()
            );
        }
    }
    assert!(servers >= 2, "only {servers} server workloads");
}

/// Whether two workloads' node selectors could both match one node.
fn may_share_a_node(a: &Workload, b: &Workload) -> bool {
    let (sa, sb) = (a.node_selector(), b.node_selector());
    !sa.iter().any(|(k, v)| sb.get(k).is_some_and(|w| w != v))
}

#[test]
fn host_network_pods_that_may_share_a_node_bind_different_ports() {
    let all = docs();
    let roles = roles(&all);
    for (i, (a, ca, ra)) in roles.iter().enumerate() {
        for (b, cb, rb) in roles.iter().skip(i + 1) {
            if !a.host_network() || !b.host_network() || !may_share_a_node(a, b) {
                continue;
            }
            // The same object in two files (applying one replaces the
            // other), or the same server as a static Pod and as a
            // DaemonSet (konnectivity's: its files say to run one).
            if a.doc.namespace() == b.doc.namespace() && a.doc.name() == b.doc.name() {
                continue;
            }
            let ports = |r: &Role, c: &Value| -> BTreeSet<u16> {
                let mut p: BTreeSet<u16> = listens(r).iter().map(|a| a.port()).collect();
                for hp in c["ports"].as_array().into_iter().flatten() {
                    if let Some(h) = hp["hostPort"].as_u64() {
                        p.insert(h as u16);
                    }
                }
                p
            };
            let both: Vec<_> = ports(ra, ca)
                .intersection(&ports(rb, cb))
                .copied()
                .collect();
            assert!(
                both.is_empty(),
                "{} and {} both bind {both:?} on a node that matches both",
                a.doc.short(),
                b.doc.short()
            );
            let sa: BTreeSet<_> = sockets(ra).into_iter().collect();
            let shared: Vec<_> = sockets(rb).into_iter().filter(|s| sa.contains(s)).collect();
            assert!(
                shared.is_empty(),
                "{} and {} both serve {shared:?}",
                a.doc.short(),
                b.doc.short()
            );
        }
    }
}

/// (apiGroup, resource, verb, namespace; "" for cluster-wide).
type Grant = (String, String, String, String);

fn grant(group: &str, resource: &str, verb: &str, ns: &str) -> Grant {
    (group.into(), resource.into(), verb.into(), ns.into())
}

fn ns_of(r: &str) -> &str {
    r.split_once('/').unwrap().0
}

/// What a role's flags make it call, read from src/control/*.rs: the
/// node list-and-watch (kube_sync.rs, with --iptables or DNS records) and
/// the server ConfigMap poll (with --iptables or --dns-service-dnat-ports),
/// the tunnel Service (read; updated for its dnat ports), the DNS records
/// ConfigMap and its leader Lease, the server
/// leases (server_lease.rs: get/create/update, list and delete for the
/// expired ones), lease counting (lease_count.rs: list), TokenReviews
/// (token_review.rs), CSRs (csr.rs: create, then get until signed; the
/// server's also reads its Services for SANs).
fn needs(role: &Role) -> BTreeSet<Grant> {
    let mut n = BTreeSet::new();
    match role {
        Role::Server(s) => {
            if s.kube.is_none() {
                return n;
            }
            // Nodes feed the iptables rules and the DNS records only; the
            // server ConfigMap's ports, the iptables rules only
            // (server/args.rs).
            if s.iptables || s.dns_hosts_file.is_some() || s.dns_configmap.is_some() {
                n.insert(grant("", "nodes", "list", ""));
                n.insert(grant("", "nodes", "watch", ""));
            }
            if s.iptables || s.dns_service_dnat_ports {
                n.insert(grant("", "configmaps", "get", ns_of(&s.server_configmap)));
            }
            // The tunnel Service's ClusterIP for the records; its dnat-PORT
            // ports (kube_sync.rs `sync_dnat_ports`).
            if let Some(svc) = &s.dns_tunnel_service {
                n.insert(grant("", "services", "get", ns_of(svc)));
                if s.dns_service_dnat_ports {
                    n.insert(grant("", "services", "update", ns_of(svc)));
                }
            }
            if let Some(dns) = &s.dns_configmap {
                for v in ["get", "create", "update"] {
                    n.insert(grant("", "configmaps", v, ns_of(dns)));
                    n.insert(grant(
                        "coordination.k8s.io",
                        "leases",
                        v,
                        ns_of(&s.leader_lease),
                    ));
                }
            }
            if s.enable_lease_controller {
                for v in ["get", "create", "update", "list", "delete"] {
                    n.insert(grant(
                        "coordination.k8s.io",
                        "leases",
                        v,
                        &s.lease_namespace,
                    ));
                }
            }
            if s.agent_namespace.is_some() {
                n.insert(grant("authentication.k8s.io", "tokenreviews", "create", ""));
            }
            if s.cert_mode == CertMode::Csr {
                for v in ["create", "get"] {
                    n.insert(grant(
                        "certificates.k8s.io",
                        "certificatesigningrequests",
                        v,
                        "",
                    ));
                }
                for svc in &s.csr_service {
                    n.insert(grant("", "services", "get", ns_of(svc)));
                }
            }
        }
        Role::Agent(a) => {
            if a.kube.is_none() {
                return n;
            }
            if a.cert_mode == CertMode::Csr {
                for v in ["create", "get"] {
                    n.insert(grant(
                        "certificates.k8s.io",
                        "certificatesigningrequests",
                        v,
                        "",
                    ));
                }
            }
            if a.count_server_leases {
                n.insert(grant(
                    "coordination.k8s.io",
                    "leases",
                    "list",
                    &a.lease_namespace,
                ));
            }
        }
    }
    n
}

/// What the manifests grant a subject (`ServiceAccount:ns/name` or
/// `User:name`), with a Role's grants scoped to its namespace. A grant
/// cluster-wide counts for every namespace.
fn granted(all: &[Doc], subject: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for b in all
        .iter()
        .filter(|d| d.kind() == "RoleBinding" || d.kind() == "ClusterRoleBinding")
    {
        let has = b.v["subjects"].as_array().unwrap().iter().any(|s| {
            let id = match s["kind"].as_str().unwrap() {
                "ServiceAccount" => format!(
                    "ServiceAccount:{}/{}",
                    s["namespace"].as_str().unwrap(),
                    s["name"].as_str().unwrap()
                ),
                k => format!("{k}:{}", s["name"].as_str().unwrap()),
            };
            id == subject
        });
        if !has {
            continue;
        }
        let scope = if b.kind() == "RoleBinding" {
            b.namespace().to_string()
        } else {
            String::new()
        };
        let rk = b.v["roleRef"]["kind"].as_str().unwrap();
        let rn = b.v["roleRef"]["name"].as_str().unwrap();
        let role = all
            .iter()
            .find(|d| {
                d.kind() == rk
                    && d.name() == rn
                    && (rk == "ClusterRole" || d.namespace() == b.namespace())
            })
            .unwrap_or_else(|| {
                panic!(
                    "{}: role {rk} {rn} is not in deploy/ (its rights cannot be checked)",
                    b.short()
                )
            });
        for rule in role.v["rules"].as_array().unwrap() {
            assert!(
                rule["resourceNames"].is_null(),
                "{}: resourceNames are not checked here",
                role.short()
            );
            for g in strings(&rule["apiGroups"]) {
                for r in strings(&rule["resources"]) {
                    for v in strings(&rule["verbs"]) {
                        assert!(
                            g != "*" && r != "*" && v != "*",
                            "{}: wildcard",
                            role.short()
                        );
                        out.insert((g.clone(), r.clone(), v, scope.clone()));
                    }
                }
            }
        }
    }
    out
}

/// The identity a container talks to the API as: its ServiceAccount with
/// `--kube in-cluster`; with a kubeconfig, the user the Kubernetes docs
/// put in it (konnectivity-server.conf: system:konnectivity-server).
fn subject(w: &Workload, kube: &str) -> String {
    match kube {
        "in-cluster" => format!(
            "ServiceAccount:{}/{}",
            w.doc.namespace(),
            w.spec["serviceAccountName"].as_str().unwrap_or("default")
        ),
        "/etc/kubernetes/konnectivity-server.conf" => "User:system:konnectivity-server".into(),
        other => panic!("{}: kubeconfig {other}: whose?", w.doc.short()),
    }
}

#[test]
fn rbac_grants_each_identity_what_it_uses_and_no_more() {
    let all = docs();
    let mut checked = 0;
    // Each manifest file stands alone (an identity may be defined in two
    // alternative files), so compare per file.
    for file in manifest_files() {
        let in_file: Vec<Doc> = all.iter().filter(|d| d.file == file).cloned().collect();
        let mut need: BTreeMap<String, BTreeSet<Grant>> = BTreeMap::new();
        for (w, _, r) in roles(&in_file) {
            let kube = match &r {
                Role::Server(s) => s.kube.clone(),
                Role::Agent(a) => a.kube.clone(),
            };
            if let Some(kube) = kube {
                need.entry(subject(&w, &kube))
                    .or_default()
                    .extend(needs(&r));
            }
        }
        for (who, need) in need {
            let have = granted(&in_file, &who);
            // Exact: a cluster-wide grant for a namespaced need is wider
            // than the need, and shows as both missing and unused.
            let missing: Vec<_> = need.difference(&have).collect();
            let extra: Vec<_> = have.difference(&need).collect();
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{}: {who}: missing {missing:?}, granted but unused {extra:?}",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "only {checked} identities checked");
}

/// The manifests that yurt-tunnel's DNS records use: the records point
/// edge node names at the internal Service's ClusterIP.
#[test]
fn dns_records_point_at_the_internal_service() {
    let all = docs();
    let mut checked = 0;
    for (w, _, r) in roles(&all) {
        let Role::Server(s) = r else { continue };
        if s.dns_configmap.is_none() {
            continue;
        }
        let ip = s.dns_tunnel_ip.expect("--dns-tunnel-ip");
        let svc = all
            .iter()
            .find(|d| {
                d.file == w.doc.file
                    && d.kind() == "Service"
                    && d.v["spec"]["clusterIP"].as_str() == Some(&ip.to_string())
            })
            .unwrap_or_else(|| panic!("{}: no Service with ClusterIP {ip}", w.doc.short()));
        assert_eq!(svc.namespace(), w.doc.namespace(), "{}", svc.short());
        checked += 1;
    }
    assert!(checked >= 1);
}

/// A caller speaking the other protocol than the socket (kube-apiserver
/// told HTTPConnect for a gRPC socket, or GRPC for a CONNECT one) gets an
/// error naming the mismatch, in the server's log and, on the CONNECT
/// socket, in the 400 answer: a real server, both unix sockets.
#[test]
fn a_protocol_mismatch_on_the_egress_socket_is_named() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    let bin = env!("CARGO_BIN_EXE_edgetunnel");
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let out = Command::new(bin)
        .args(["certs", "init"])
        .arg(d.join("certs"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (grpc, connect) = (d.join("grpc.sock"), d.join("connect.sock"));
    let log = d.join("server.log");
    let mut server = Command::new(bin)
        .arg("server")
        .arg("--certs-dir")
        .arg(d.join("certs"))
        .args(["--agent-bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
        .arg("--grpc-uds")
        .arg(&grpc)
        .arg("--connect-uds")
        .arg(&connect)
        .env("EDGETUNNEL_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let wait_for = |what: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !what() {
            assert!(Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for(&|| UnixStream::connect(&grpc).is_ok() && UnixStream::connect(&connect).is_ok());

    // kube-apiserver with proxyProtocol: HTTPConnect, on the gRPC socket.
    let mut s = UnixStream::connect(&grpc).unwrap();
    s.write_all(b"CONNECT 192.0.2.1:10250 HTTP/1.1\r\nHost: 192.0.2.1:10250\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.read_to_end(&mut Vec::new());

    // konnectivity-client (proxyProtocol: GRPC) on the CONNECT socket.
    let mut s = UnixStream::connect(&connect).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("proxyProtocol: GRPC"), "{answer}");

    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for(&|| {
        let l = read_log();
        l.contains("CONNECT request arrived on a gRPC (HTTP/2) listener")
            && l.contains(
                "HTTP/2 client preface (a gRPC caller) arrived on the HTTP CONNECT frontend",
            )
            || l.contains("bad client preface") && l.contains("invalid HTTP version")
    });
    let l = read_log();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        l.contains("proxyProtocol: HTTPConnect") && l.contains("proxyProtocol: GRPC"),
        "the log does not name the mismatch:\n{l}"
    );
}

/// A server or agent that hands over (`--handover-socket`) must be
/// deployed so that old and new pods overlap on a node: its DaemonSet
/// rolls with `maxSurge: 1, maxUnavailable: 0`, declares no port (with
/// hostNetwork a declared port is a host port, which would keep the new
/// pod off the node), finds the handover socket on a hostPath both pods
/// mount, and has time to drain before it is killed. An agent on the pod
/// network needs no handover (its ports are its own) but rolls the same
/// way, with a readiness probe that passes once it linked, so that the old
/// pod goes only then.
#[test]
fn servers_and_agents_roll_with_overlapping_pods() {
    let all = docs();
    let (mut servers, mut agents) = (0, 0);
    for (w, c, role) in roles(&all) {
        let name = w.doc.short();
        let (sock, needs) = match &role {
            Role::Server(s) => (
                s.handover_socket.clone(),
                s.graceful_shutdown_timeout_secs + s.handover_wait_secs,
            ),
            Role::Agent(a) => (
                a.handover_socket.clone(),
                a.drain_grace_secs + a.handover_wait_secs,
            ),
        };
        let agent = matches!(role, Role::Agent(_));
        let Some(sock) = sock else {
            if agent {
                assert!(
                    !w.host_network(),
                    "{name}: an agent on the host network needs --handover-socket to overlap"
                );
                let ready = &c["readinessProbe"]["httpGet"];
                assert_eq!(
                    ready["path"].as_str(),
                    Some("/readyz"),
                    "{name}: the old agent must go only once the new one linked"
                );
                overlaps(&w, &name);
                agents += 1;
            }
            continue;
        };
        overlaps(&w, &name);
        if agent {
            agents += 1;
        } else {
            servers += 1;
        }
        if w.host_network() {
            assert!(
                c["ports"].as_array().is_none_or(|p| p.is_empty()),
                "{name}: declared ports are host ports under hostNetwork"
            );
        }
        let dir = sock.parent().expect("a socket path in a directory");
        let mount = c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["mountPath"].as_str().map(Path::new) == Some(dir))
            .unwrap_or_else(|| panic!("{name}: nothing mounted at {}", dir.display()));
        let volume = w.spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("{name}: no volume {}", mount["name"]));
        assert!(
            volume["hostPath"]["path"].is_string(),
            "{name}: the handover socket's directory must be on the host (both pods meet there)"
        );
        let grace = w.spec["terminationGracePeriodSeconds"]
            .as_f64()
            .unwrap_or(30.0);
        assert!(
            grace > needs,
            "{name}: terminationGracePeriodSeconds {grace} leaves no time for the wait and the drain ({needs} s)"
        );
    }
    assert!(servers >= 3, "only {servers} servers hand over");
    assert!(
        agents >= 2,
        "only {agents} agents roll with overlapping pods"
    );
}

/// A DaemonSet that rolls with a new pod beside the old one.
fn overlaps(w: &Workload, name: &str) {
    assert_eq!(
        w.doc.kind(),
        "DaemonSet",
        "{name}: overlapping pods need a DaemonSet's surge"
    );
    let roll = &w.doc.v["spec"]["updateStrategy"];
    assert_eq!(roll["type"].as_str(), Some("RollingUpdate"), "{name}");
    assert_eq!(
        roll["rollingUpdate"]["maxSurge"].as_u64(),
        Some(1),
        "{name}: maxSurge"
    );
    assert_eq!(
        roll["rollingUpdate"]["maxUnavailable"].as_u64(),
        Some(0),
        "{name}: maxUnavailable"
    );
}
