//! The control thread: its own tokio runtime, off the data-plane cores. It
//! keeps the iptables rules and the DNS records in step with the connected
//! agents (on change, checked every second, and fully on a period of at
//! least 15 s) and removes the rules on exit unless told to keep them.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::iptables::{self, Family, Plan, PortRule, Scope};
use super::iptables_sync;
use engine::signals::Shutdown;

/// The shortest full-sync period (yurt-tunnel's floor).
pub const MIN_SYNC_PERIOD: Duration = Duration::from_secs(15);

/// How often records held back for want of the tunnel Service's address
/// are tried again.
const DNS_RETRY: Duration = Duration::from_secs(3);

/// The server's interception listeners, as DNAT destinations.
#[derive(Debug, Clone)]
pub struct DnatTarget {
    pub addrs: Vec<IpAddr>,
    /// Port of the plain listener (yurt's `http-proxy-ports`).
    pub plain_port: u16,
    /// Port of the TLS listener (yurt's `https-proxy-ports`).
    pub tls_port: u16,
}

#[derive(Debug, Clone)]
pub struct IptablesSpec {
    /// Intercepted ports and where each goes (one entry per address family).
    pub ports: Vec<PortRule>,
    /// Where extra ports from the cluster's ConfigMap go.
    pub dnat: DnatTarget,
    /// Ready nodes to leave alone (RETURN); with none, only edge addresses
    /// are redirected.
    pub cloud_nodes: Option<BTreeSet<IpAddr>>,
    pub period: Duration,
    pub keep_rules: bool,
}

/// Where the edge-node addresses come from (the server's agent registry).
pub type EdgeSource = Arc<dyn Fn() -> BTreeSet<IpAddr> + Send + Sync>;

fn plans(spec: &IptablesSpec, edges: &BTreeSet<IpAddr>) -> Vec<Plan> {
    let mut out = Vec::new();
    for family in [Family::V4, Family::V6] {
        let ports: Vec<PortRule> = spec
            .ports
            .iter()
            .filter(|p| Family::of(&p.to.ip()) == family)
            .cloned()
            .collect();
        if ports.is_empty() {
            continue;
        }
        let scope = match &spec.cloud_nodes {
            Some(cloud) => Scope::AllExcept(cloud.clone()),
            None => Scope::Only(edges.clone()),
        };
        out.push(Plan {
            family,
            ports,
            scope,
        });
    }
    out
}

/// One sync of every family; returns the plans applied.
pub fn sync_once(spec: &IptablesSpec, edges: &BTreeSet<IpAddr>, previous: &[Plan]) -> Vec<Plan> {
    let started = Instant::now();
    let plans = plans(spec, edges);
    for plan in &plans {
        match iptables_sync::sync(plan) {
            Ok(()) => {
                let old = previous.iter().find(|p| p.family == plan.family);
                for (ip, port) in iptables::conntrack_flushes(old, plan) {
                    iptables_sync::conntrack_delete(ip, port);
                }
            }
            Err(e) => tracing::warn!("iptables sync: {e}"),
        }
    }
    tracing::debug!(elapsed = ?started.elapsed(), edges = edges.len(), "iptables synced");
    plans
}

/// One sync of every family, failing on the first error (for the CLI).
pub fn try_sync_once(
    spec: &IptablesSpec,
    edges: &BTreeSet<IpAddr>,
) -> Result<(), iptables_sync::SyncError> {
    for plan in plans(spec, edges) {
        iptables_sync::sync(&plan)?;
    }
    Ok(())
}

/// Kubernetes, when the server runs in a cluster: nodes (list and watch)
/// decide the iptables scope and the DNS records, the records are also
/// written to a ConfigMap, and extra ports come from yurt-tunnel's server
/// ConfigMap.
#[derive(Debug, Clone)]
pub struct KubeSpec {
    /// A kubeconfig file; None: in-cluster or the default kubeconfig.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The label (`key=value`) that marks edge nodes.
    pub edge_label: EdgeLabel,
    /// The DNS records ConfigMap (key `tunnel-nodes`).
    pub dns_configmap: Option<ObjectRef>,
    /// The server ConfigMap (`http-proxy-ports`, `https-proxy-ports`).
    pub server_configmap: Option<ObjectRef>,
    /// Keep a node list-and-watch (the server; an agent only needs the
    /// client for its certificate).
    pub watch_nodes: bool,
    /// The Lease that elects the one server publishing the DNS records.
    pub lease: Option<LeaderLease>,
}

/// A namespaced object, written `namespace/name` on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    pub namespace: String,
    pub name: String,
}

impl std::str::FromStr for ObjectRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => Ok(ObjectRef {
                namespace: namespace.to_string(),
                name: name.to_string(),
            }),
            _ => Err(format!("{s:?}: expected namespace/name")),
        }
    }
}

/// The node label that marks edge nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeLabel {
    pub key: String,
    pub value: String,
}

/// The Lease a server takes to become the one that publishes DNS records.
#[derive(Debug, Clone)]
pub struct LeaderLease {
    pub lease: ObjectRef,
    /// This server's identity (the lease's holder).
    pub holder: String,
    pub duration_secs: i32,
}

/// The DNS record set the control thread keeps (standalone: a hosts file
/// that CoreDNS's `hosts` plugin or dnsmasq serves).
#[derive(Debug, Clone)]
pub struct DnsSpec {
    /// None: only the ConfigMap (Kubernetes mode).
    pub hosts_file: Option<std::path::PathBuf>,
    /// Where edge node names point (the tunnel server's address).
    pub tunnel: DnsTunnel,
    /// Cloud nodes and their addresses.
    pub cloud_nodes: std::collections::BTreeMap<String, IpAddr>,
    /// yurt's `dnat-PORT` ports on the tunnel Service (needs `kube`).
    pub service_dnat: Option<ServiceDnat>,
}

/// The Service that gets a `dnat-PORT` port per extra port of the server
/// ConfigMap, and the listener ports they target (`dnat_ports`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceDnat {
    pub service: ObjectRef,
    /// The plain interception listener's port (yurt's insecure port).
    pub insecure_port: u16,
    /// The TLS interception listener's port (yurt's secure port).
    pub secure_port: u16,
}

/// The address edge node names resolve to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsTunnel {
    Ip(IpAddr),
    /// The ClusterIP of this Service (yurt-tunnel's
    /// `x-tunnel-server-internal-svc`), read before each full sync; no
    /// records are written while it cannot be read (needs `kube`).
    Service(ObjectRef),
}

/// What the control thread looks after.
#[derive(Debug, Clone, Default)]
pub struct ControlSpec {
    pub iptables: Option<IptablesSpec>,
    pub dns: Option<DnsSpec>,
    pub kube: Option<KubeSpec>,
    /// Certificate files watched and swapped into the TLS configs when
    /// they change (checked every second).
    pub certs: Vec<Arc<engine::cert_reload::ReloadingCert>>,
    /// Certificates kept signed through Kubernetes CSRs (needs `kube`).
    pub csr: Vec<super::csr::Job>,
    /// The server's ANP-format Lease, renewed, with expired ones culled
    /// (needs `kube`).
    pub server_lease: Option<super::server_lease::ServerLeaseSpec>,
    /// The agent's server count from leases (needs `kube`).
    pub lease_count: Option<super::lease_count::LeaseCountSpec>,
    /// Agents' ServiceAccount tokens to review (needs `kube`).
    pub token_review: Option<super::token_review::ReviewQueue>,
}

/// Readers of the data plane's state: agents' addresses and node names.
#[derive(Clone)]
pub struct Sources {
    pub addresses: EdgeSource,
    pub hosts: Arc<dyn Fn() -> BTreeSet<String> + Send + Sync>,
    /// Where the server lease GC counts its calls (ANP's lease families).
    pub lease_metrics: crate::metrics::LeaseMetrics,
    /// Raised when a successor took the server's listeners over: the
    /// iptables rules and the server lease are the successor's then, and
    /// stay when this thread ends.
    pub handed_over: Arc<Shutdown>,
}

impl Sources {
    /// For a process without an agent registry (the agent itself).
    pub fn none() -> Sources {
        Sources {
            addresses: Arc::new(BTreeSet::new),
            hosts: Arc::new(BTreeSet::new),
            lease_metrics: Default::default(),
            handed_over: Shutdown::new(),
        }
    }
}

/// Starts the control thread; it runs until `shutdown` and then cleans up.
pub fn spawn(
    spec: ControlSpec,
    sources: Sources,
    shutdown: Arc<Shutdown>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("edgetunnel-control".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("control runtime: {e}");
                    return;
                }
            };
            rt.block_on(run(spec, sources, shutdown));
        })
}

/// Writes the hosts file when its content changed (atomically: a
/// temporary file renamed over it).
fn write_hosts(file: &std::path::Path, text: &str) {
    if std::fs::read_to_string(file).is_ok_and(|old| old == text) {
        return;
    }
    let tmp = file.with_extension("edgetunnel-tmp");
    let r = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, file));
    match r {
        Ok(()) => {
            tracing::info!(file = %file.display(), records = text.lines().count(), "DNS records written")
        }
        Err(e) => tracing::warn!(file = %file.display(), "writing DNS records: {e}"),
    }
}

/// The control loop's pause between rounds: a second, or until the
/// server starts to stop (a restart must not wait for the next round).
async fn pause(shutdown: &Arc<Shutdown>) {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        _ = shutdown.wait(1) => {}
    }
}

async fn run(spec: ControlSpec, sources: Sources, shutdown: Arc<Shutdown>) {
    let period = spec
        .iptables
        .as_ref()
        .map_or(MIN_SYNC_PERIOD, |i| i.period.max(MIN_SYNC_PERIOD));
    let kube = match &spec.kube {
        Some(k) => super::kube_sync::start(k.clone()).await,
        None => None,
    };
    if let Some(k) = &kube {
        super::kube_sync::start_renewals(k.client(), spec.csr.clone());
    }
    let mut kube_tasks = Vec::new();
    if let Some(k) = &kube {
        if let Some(sl) = &spec.server_lease {
            kube_tasks.extend(super::server_lease::start(
                k.client(),
                sl.clone(),
                sources.lease_metrics.clone(),
            ));
        }
        if let Some(lc) = &spec.lease_count {
            kube_tasks.push(tokio::spawn(super::lease_count::run(
                k.client(),
                lc.clone(),
            )));
        }
    }
    if let Some(q) = &spec.token_review {
        kube_tasks.push(match &kube {
            Some(k) => tokio::spawn(super::token_review::serve(k.client(), q.clone())),
            None => tokio::spawn(super::token_review::refuse_all(
                q.clone(),
                "token review unavailable: no Kubernetes client".into(),
            )),
        });
    }
    if kube.is_none() && (spec.server_lease.is_some() || spec.lease_count.is_some()) {
        tracing::error!("server leases need a Kubernetes client; not publishing or counting them");
    }
    let mut applied: Vec<Plan> = Vec::new();
    let mut last: Option<(BTreeSet<IpAddr>, BTreeSet<String>, u64)> = None;
    let mut last_full = Instant::now();
    let mut tunnel_warned = false;
    let (mut dns_pending, mut last_dns_try) = (false, Instant::now());
    loop {
        if shutdown.requested() > 0 {
            break;
        }
        for cert in &spec.certs {
            match cert.reload_if_changed() {
                Ok(true) => {
                    tracing::info!(file = %cert.path().display(), "certificate reloaded; new handshakes use it")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(file = %cert.path().display(), "certificate not reloaded (old one stays): {e}")
                }
            }
        }
        if spec.iptables.is_none() && spec.dns.is_none() {
            pause(&shutdown).await;
            continue;
        }
        let generation = kube.as_ref().map_or(0, |k| k.generation());
        let now = ((sources.addresses)(), (sources.hosts)(), generation);
        let due = last.as_ref() != Some(&now) || last_full.elapsed() >= period;
        // Records held back for want of the tunnel address: try again
        // every few seconds, without a full iptables sync.
        let dns_retry = dns_pending && last_dns_try.elapsed() >= DNS_RETRY;
        if due || dns_retry {
            let view = kube.as_ref().map(|k| k.view());
            if let Some(ipt) = spec.iptables.as_ref().filter(|_| due) {
                let mut ipt = ipt.clone();
                if let Some(v) = view.as_ref().filter(|v| v.synced) {
                    // The cluster decides: Ready nodes without an agent go direct.
                    let mut direct = super::nodes::direct_nodes(&v.nodes, &now.1);
                    direct.extend(ipt.cloud_nodes.iter().flatten().copied());
                    ipt.cloud_nodes = Some(direct);
                    let to = &ipt.dnat;
                    ipt.ports
                        .extend(port_rules(&v.extra_http, &to.addrs, to.plain_port));
                    ipt.ports
                        .extend(port_rules(&v.extra_https, &to.addrs, to.tls_port));
                }
                applied = sync_once(&ipt, &now.0, &applied);
            }
            let tunnel_ip = match spec.dns.as_ref().map(|d| &d.tunnel) {
                Some(DnsTunnel::Ip(ip)) => Some(*ip),
                Some(DnsTunnel::Service(svc)) => {
                    let ip = match &kube {
                        Some(k) => k.cluster_ip(svc).await,
                        None => Err("no Kubernetes client".to_string()),
                    };
                    match ip {
                        Ok(ip) => {
                            tunnel_warned = false;
                            Some(ip)
                        }
                        Err(e) => {
                            // Once per outage, as each sync would repeat it.
                            if !tunnel_warned {
                                tracing::warn!(service = %format!("{}/{}", svc.namespace, svc.name), "DNS records not published: no tunnel address: {e}");
                                tunnel_warned = true;
                            }
                            None
                        }
                    }
                }
                None => None,
            };
            last_dns_try = Instant::now();
            dns_pending = spec.dns.is_some() && tunnel_ip.is_none();
            if let (Some(dns), Some(tunnel_ip)) = (&spec.dns, tunnel_ip) {
                let mut edge = now.1.clone();
                let mut cloud = dns.cloud_nodes.clone();
                if let Some(v) = view.as_ref().filter(|v| v.synced) {
                    let (e, c) = super::nodes::dns_split(&v.nodes, &now.1);
                    edge.extend(e);
                    cloud.extend(c);
                }
                let text = super::dns::render_hosts(edge, tunnel_ip, &cloud);
                if let Some(file) = &dns.hosts_file {
                    write_hosts(file, &text);
                }
                if let Some(k) = &kube {
                    k.publish_records(&text).await;
                }
            }
            if let (Some(dnat), Some(k)) = (
                spec.dns.as_ref().and_then(|d| d.service_dnat.as_ref()),
                &kube,
            ) {
                if due {
                    k.sync_dnat_ports(dnat).await;
                }
            }
            if due {
                last = Some(now);
                last_full = Instant::now();
            }
        }
        pause(&shutdown).await;
    }
    for t in &kube_tasks {
        t.abort();
    }
    if sources.handed_over.requested() > 0 {
        tracing::info!("a successor took over: leaving iptables rules and the server lease to it");
        return;
    }
    if let (Some(k), Some(sl)) = (&kube, &spec.server_lease) {
        super::server_lease::release(k.client(), sl).await;
    }
    let Some(ipt) = &spec.iptables else { return };
    if ipt.keep_rules {
        tracing::info!("leaving iptables rules in place (--iptables-keep-rules)");
        return;
    }
    for plan in &applied {
        if let Err(e) = iptables_sync::cleanup(plan.family) {
            tracing::warn!("iptables cleanup: {e}");
        }
    }
    tracing::info!("iptables rules removed");
}

/// The DNAT target of each intercepted port on each address given.
pub fn port_rules(ports: &[u16], to_ips: &[IpAddr], to_port: u16) -> Vec<PortRule> {
    let mut v = Vec::new();
    for ip in to_ips {
        for p in ports {
            v.push(PortRule {
                port: *p,
                to: SocketAddr::new(*ip, to_port),
            });
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::ObjectRef;

    #[test]
    fn object_refs_need_namespace_and_name() {
        let r: ObjectRef = "kube-system/edgetunnel-dns".parse().unwrap();
        assert_eq!(
            (r.namespace.as_str(), r.name.as_str()),
            ("kube-system", "edgetunnel-dns")
        );
        for bad in ["kube-system", "/name", "ns/", ""] {
            assert!(bad.parse::<ObjectRef>().is_err(), "{bad:?}");
        }
    }
}
