//! The Kubernetes side of the control thread, with the `kube` crate: a node
//! list-and-watch that keeps a local view, yurt-tunnel's server ConfigMap
//! for extra ports, and the DNS records ConfigMap. Everything runs as tasks
//! on the control thread's runtime; the data plane never waits for it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::Client;

use super::manager::{KubeSpec, LeaderLease, ObjectRef};
use super::nodes::{parse_ports, NodeInfo};

/// The DNS records ConfigMap's key, as yurt-tunnel names it.
pub const DNS_KEY: &str = "tunnel-nodes";

/// A snapshot of what the cluster says.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// True once the first node list arrived.
    pub synced: bool,
    pub nodes: BTreeMap<String, NodeInfo>,
    pub extra_http: Vec<u16>,
    pub extra_https: Vec<u16>,
    /// The server ConfigMap's data once read (empty when it does not
    /// exist), for yurt's `dnat-PORT` Service ports.
    pub server_cfg: Option<BTreeMap<String, String>>,
}

/// Handle to the running Kubernetes tasks.
pub struct Kube {
    client: Client,
    spec: KubeSpec,
    view: Arc<Mutex<View>>,
    generation: Arc<AtomicU64>,
    published: Mutex<Option<String>>,
    /// Whether this server may publish (always, without an election).
    leader: Arc<AtomicBool>,
}

pub(crate) async fn client(spec: &KubeSpec) -> Result<Client, String> {
    let config = match &spec.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| e.to_string())?
        }
        None => kube::Config::infer().await.map_err(|e| e.to_string())?,
    };
    Client::try_from(config).map_err(|e| e.to_string())
}

/// Connects and starts the node watch and the server ConfigMap poll.
pub async fn start(spec: KubeSpec) -> Option<Kube> {
    let client = match client(&spec).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("Kubernetes client: {e}; running without the cluster's view");
            return None;
        }
    };
    let view = Arc::new(Mutex::new(View::default()));
    let generation = Arc::new(AtomicU64::new(0));
    if spec.watch_nodes {
        tokio::spawn(watch_nodes(
            client.clone(),
            spec.edge_label.clone(),
            view.clone(),
            generation.clone(),
        ));
    }
    if let Some(cfg) = spec.server_configmap.clone() {
        tokio::spawn(poll_server_cfg(
            client.clone(),
            cfg.namespace,
            cfg.name,
            view.clone(),
            generation.clone(),
        ));
    }
    let leader = Arc::new(AtomicBool::new(spec.lease.is_none()));
    if let Some(lease) = spec.lease.clone() {
        tokio::spawn(elect(
            client.clone(),
            lease,
            leader.clone(),
            generation.clone(),
        ));
    }
    Some(Kube {
        client,
        spec,
        view,
        generation,
        published: Mutex::new(None),
        leader,
    })
}

impl Kube {
    /// Bumped whenever the view changes.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    pub fn view(&self) -> View {
        self.view.lock().expect("view lock").clone()
    }

    /// The ClusterIP of Service `svc` (yurt-tunnel's DNS controller points
    /// edge node names at `x-tunnel-server-internal-svc`'s, openyurt
    /// `pkg/yurttunnel/trafficforward/dns/dns.go` `getTunnelServerIP`).
    pub async fn cluster_ip(&self, svc: &ObjectRef) -> Result<std::net::IpAddr, String> {
        let api: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(self.client.clone(), &svc.namespace);
        let s = api
            .get_opt(&svc.name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no such Service")?;
        let ip = s.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
        ip.parse()
            .map_err(|_| format!("no ClusterIP (spec.clusterIP {ip:?})"))
    }

    /// Gives Service `svc` a `dnat-PORT` port for each extra port of the
    /// server ConfigMap (yurt-tunnel's DNS controller, `dns.go`
    /// `updateTunnelServerSvcDnatPorts`); only the elected writer does,
    /// and only once the ConfigMap was read.
    pub async fn sync_dnat_ports(&self, dnat: &super::manager::ServiceDnat) {
        if !self.leader.load(Ordering::Relaxed) {
            return;
        }
        let Some(data) = self.view().server_cfg else {
            return;
        };
        let wanted = super::dnat_ports::proxy_ports(&data, dnat.insecure_port, dnat.secure_port);
        let ObjectRef { namespace, name } = &dnat.service;
        let api: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(self.client.clone(), namespace);
        let mut svc = match api.get_opt(name).await {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(service = %format!("{namespace}/{name}"), "reading for dnat ports: {e}");
                return;
            }
        };
        let spec = svc.spec.get_or_insert_with(Default::default);
        let current = spec.ports.clone().unwrap_or_default();
        let Some(ports) = super::dnat_ports::resolve(&current, &wanted) else {
            return;
        };
        spec.ports = Some(ports);
        match api.replace(name, &PostParams::default(), &svc).await {
            Ok(_) => {
                tracing::info!(service = %format!("{namespace}/{name}"), ports = ?wanted, "dnat ports synced")
            }
            Err(e) => {
                tracing::warn!(service = %format!("{namespace}/{name}"), "updating dnat ports: {e}")
            }
        }
    }

    /// Writes the DNS records to their ConfigMap when they changed.
    pub async fn publish_records(&self, text: &str) {
        let Some(ObjectRef {
            namespace: ns,
            name,
        }) = &self.spec.dns_configmap
        else {
            return;
        };
        if !self.leader.load(Ordering::Relaxed) {
            // Followers forget what they published: on taking over they
            // write again.
            *self.published.lock().expect("lock") = None;
            return;
        }
        if self.published.lock().expect("lock").as_deref() == Some(text) {
            return;
        }
        match write_configmap(&self.client, ns, name, DNS_KEY, text).await {
            Ok(()) => {
                tracing::info!(configmap = %format!("{ns}/{name}"), records = text.lines().count(), "DNS records published");
                *self.published.lock().expect("lock") = Some(text.to_string());
            }
            Err(e) => {
                tracing::warn!(configmap = %format!("{ns}/{name}"), "publishing DNS records: {e}")
            }
        }
    }
}

fn bump(generation: &AtomicU64) {
    generation.fetch_add(1, Ordering::Relaxed);
}

/// List, then watch from the list's version; on any error, list again.
async fn watch_nodes(
    client: Client,
    label: super::manager::EdgeLabel,
    view: Arc<Mutex<View>>,
    generation: Arc<AtomicU64>,
) {
    let api: Api<Node> = Api::all(client);
    let label = (label.key.as_str(), label.value.as_str());
    loop {
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("listing nodes: {e}");
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        };
        let version = list.metadata.resource_version.clone().unwrap_or_default();
        {
            let mut v = view.lock().expect("view lock");
            v.nodes = list
                .items
                .iter()
                .filter_map(|n| NodeInfo::from_node(n, label))
                .map(|n| (n.name.clone(), n))
                .collect();
            v.synced = true;
        }
        bump(&generation);
        let stream = match api
            .watch(&WatchParams::default().timeout(290), &version)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("watching nodes: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        futures::pin_mut!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(WatchEvent::Added(n))) | Ok(Some(WatchEvent::Modified(n))) => {
                    if let Some(info) = NodeInfo::from_node(&n, label) {
                        view.lock()
                            .expect("view lock")
                            .nodes
                            .insert(info.name.clone(), info);
                        bump(&generation);
                    }
                }
                Ok(Some(WatchEvent::Deleted(n))) => {
                    if let Some(name) = n.metadata.name {
                        view.lock().expect("view lock").nodes.remove(&name);
                        bump(&generation);
                    }
                }
                Ok(Some(WatchEvent::Bookmark(_))) => {}
                Ok(Some(WatchEvent::Error(e))) => {
                    tracing::debug!("node watch: {e}");
                    break;
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!("node watch ended: {e}");
                    break;
                }
            }
        }
    }
}

/// Holds or follows the Lease; renews at a third of its duration. Any API
/// error drops leadership (a follower never writes).
async fn elect(
    client: Client,
    lease: LeaderLease,
    leader: Arc<AtomicBool>,
    generation: Arc<AtomicU64>,
) {
    use super::lease::{decide, Step};
    let LeaderLease {
        lease: ObjectRef {
            namespace: ns,
            name,
        },
        holder: me,
        duration_secs: secs,
    } = lease;
    let api: Api<Lease> = Api::namespaced(client, &ns);
    let pp = PostParams::default();
    loop {
        let now = k8s_openapi::jiff::Timestamp::now();
        let holds = match api.get_opt(&name).await {
            Ok(current) => match decide(
                current.as_ref().and_then(|l| l.spec.as_ref()),
                &me,
                secs,
                now,
            ) {
                Step::Create(spec) => {
                    let l = Lease {
                        metadata: kube::api::ObjectMeta {
                            name: Some(name.clone()),
                            namespace: Some(ns.clone()),
                            ..Default::default()
                        },
                        spec: Some(spec),
                    };
                    api.create(&pp, &l).await.is_ok()
                }
                Step::Update(spec) => match current {
                    Some(mut l) => {
                        l.spec = Some(spec);
                        api.replace(&name, &pp, &l).await.is_ok()
                    }
                    None => false,
                },
                Step::Follow { holder } => {
                    tracing::trace!(%holder, "following the lease holder");
                    false
                }
            },
            Err(e) => {
                tracing::debug!("reading lease {ns}/{name}: {e}");
                false
            }
        };
        if leader.swap(holds, Ordering::Relaxed) != holds {
            tracing::info!(lease = %format!("{ns}/{name}"), identity = %me, leader = holds, "leadership changed");
            bump(&generation);
        }
        tokio::time::sleep(Duration::from_secs((secs as u64 / 3).max(1))).await;
    }
}

/// Reads `http-proxy-ports` and `https-proxy-ports` now and then.
async fn poll_server_cfg(
    client: Client,
    ns: String,
    name: String,
    view: Arc<Mutex<View>>,
    generation: Arc<AtomicU64>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    loop {
        match api.get_opt(&name).await {
            Ok(cm) => {
                let data = cm.and_then(|c| c.data).unwrap_or_default();
                {
                    let mut v = view.lock().expect("view lock");
                    if v.server_cfg.as_ref() != Some(&data) {
                        v.server_cfg = Some(data.clone());
                        drop(v);
                        bump(&generation);
                    }
                }
                let http = data
                    .get("http-proxy-ports")
                    .map(|v| parse_ports(v))
                    .unwrap_or_default();
                let https = data
                    .get("https-proxy-ports")
                    .map(|v| parse_ports(v))
                    .unwrap_or_default();
                let mut v = view.lock().expect("view lock");
                if v.extra_http != http || v.extra_https != https {
                    tracing::info!(?http, ?https, "extra intercepted ports from {ns}/{name}");
                    v.extra_http = http;
                    v.extra_https = https;
                    drop(v);
                    bump(&generation);
                }
            }
            Err(e) => tracing::debug!("reading {ns}/{name}: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Creates or updates `ns/name` so that `data[key] == value`.
async fn write_configmap(
    client: &Client,
    ns: &str,
    name: &str,
    key: &str,
    value: &str,
) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await? {
        Some(mut cm) => {
            let data = cm.data.get_or_insert_with(BTreeMap::new);
            if data.get(key).map(String::as_str) == Some(value) {
                return Ok(());
            }
            data.insert(key.to_string(), value.to_string());
            api.replace(name, &PostParams::default(), &cm).await?;
        }
        None => {
            let cm = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(ns.to_string()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await?;
        }
    }
    Ok(())
}

/// Node names with an edge label among `nodes` (for logs and tests).
pub fn edge_names(nodes: &BTreeMap<String, NodeInfo>) -> BTreeSet<String> {
    nodes
        .values()
        .filter(|n| n.edge)
        .map(|n| n.name.clone())
        .collect()
}

/// Obtains every missing certificate of `jobs` before the data plane starts
/// (on a short-lived runtime of the calling thread).
pub fn obtain_missing(
    spec: &KubeSpec,
    jobs: &[super::csr::Job],
    wait: Duration,
) -> Result<(), String> {
    let missing: Vec<&super::csr::Job> = jobs
        .iter()
        .filter(|j| !j.cert.exists() || !j.key.exists())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = client(spec).await?;
        for job in missing {
            super::csr::obtain(&client, job, wait)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })
}

/// Renews each certificate when due, one request at a time per job.
pub fn start_renewals(client: Client, jobs: Vec<super::csr::Job>) {
    for job in jobs {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                if job.due(std::time::SystemTime::now()) {
                    if let Err(e) =
                        super::csr::obtain(&client, &job, Duration::from_secs(900)).await
                    {
                        tracing::warn!(cn = %job.profile.common_name, "certificate renewal: {e}");
                    }
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
    }
}

impl Kube {
    pub fn client(&self) -> Client {
        self.client.clone()
    }
}
