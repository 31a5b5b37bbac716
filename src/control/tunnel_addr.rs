//! Where an agent finds its server when it is given none: the address
//! yurt-tunnel-agent derives from the `x-tunnel-server-svc` Service
//! (openyurt v1.3 `cmd/yurt-tunnel-agent/app/start.go` `Run` step 1, and
//! `pkg/yurttunnel/server/serveraddr/addr.go` `GetTunnelServerAddr`,
//! `extractTunnelServerDNSandIPs`, `getTunnelServerResources`).
//!
//! [`pick`] is that rule, sans-I/O; [`discover`] reads the Service, its
//! Endpoints and (for a NodePort Service) the cloud nodes, then picks.
//!
//! The rule: candidate addresses by Service type (LoadBalancer: its
//! ingress IPs and host names, none yet is an error; ClusterIP: the
//! `x-tunnel-server-external-addr` annotation's host; NodePort: the
//! InternalIPs and Hostnames of nodes labelled
//! `openyurt.io/is-edge-worker=false`, none is an error), then the
//! Service's ClusterIP, 127.0.0.1 and ::1, then the Endpoints' addresses.
//! The first IP other than 127.0.0.1 and ::1 wins, else the first DNS name
//! (the annotation's or ingress' names, then the Service's own names);
//! the port is that of the Service port named `tcp` (its nodePort for a
//! NodePort Service).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Endpoints, Node, Service};

use super::manager::ObjectRef;

/// The Service yurt-tunnel-agent reads.
pub const DEFAULT_SERVICE: &str = "kube-system/x-tunnel-server-svc";
/// The annotation of a ClusterIP Service naming the address agents use.
pub const EXTERNAL_ADDR_ANNOTATION: &str = "x-tunnel-server-external-addr";
/// The name of the Service port agents connect to.
pub const AGENT_PORT_NAME: &str = "tcp";
/// The cloud nodes' label selector (`projectinfo.GetEdgeWorkerLabelKey()=false`).
pub const CLOUD_NODES: &str = "openyurt.io/is-edge-worker=false";

/// `host:port` (`[v6]:port`) of the server, or why there is none.
pub fn pick(svc: &Service, endpoints: &Endpoints, cloud_nodes: &[Node]) -> Result<String, String> {
    let spec = svc.spec.clone().unwrap_or_default();
    let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    match kind {
        "LoadBalancer" => {
            let ingress = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.clone())
                .unwrap_or_default();
            if ingress.is_empty() {
                return Err("load balancer is not ready".into());
            }
            for i in ingress {
                ips.extend(i.ip.and_then(|ip| ip.parse::<IpAddr>().ok()));
                names.extend(i.hostname.filter(|h| !h.is_empty()));
            }
        }
        "ClusterIP" => {
            let annotation = svc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(EXTERNAL_ADDR_ANNOTATION));
            if let Some(addr) = annotation {
                let host = split_host(addr).ok_or_else(|| {
                    format!("annotation {EXTERNAL_ADDR_ANNOTATION}={addr:?}: expected host:port")
                })?;
                match host.parse::<IpAddr>() {
                    Ok(ip) => ips.push(ip),
                    Err(_) => names.push(host.to_string()),
                }
            }
        }
        "NodePort" => {
            if cloud_nodes.is_empty() {
                return Err("there is no cloud node".into());
            }
            let mut found = false;
            for n in cloud_nodes {
                let addrs = n.status.as_ref().and_then(|s| s.addresses.clone());
                for a in addrs.unwrap_or_default() {
                    match a.type_.as_str() {
                        "InternalIP" => {
                            found = true;
                            ips.extend(a.address.parse::<IpAddr>().ok());
                        }
                        "Hostname" => names.push(a.address),
                        _ => {}
                    }
                }
            }
            if !found {
                return Err("can't find node IP".into());
            }
        }
        other => return Err(format!("unsupported service type: {other}")),
    }
    let (ns, name) = (
        svc.metadata.namespace.clone().unwrap_or_default(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    if !ns.is_empty() && !name.is_empty() {
        names.extend([
            name.clone(),
            format!("{name}.{ns}"),
            format!("{name}.{ns}.svc"),
            format!("{name}.{ns}.svc.cluster.local"),
        ]);
    }
    if let Some(ip) = spec.cluster_ip.as_deref().filter(|ip| *ip != "None") {
        ips.extend(ip.parse::<IpAddr>().ok());
    }
    ips.push(IpAddr::from([127, 0, 0, 1]));
    ips.push(std::net::Ipv6Addr::LOCALHOST.into());
    for subset in endpoints.subsets.iter().flatten() {
        for a in subset.addresses.iter().flatten() {
            ips.extend(a.ip.parse::<IpAddr>().ok());
        }
    }
    // Go compares the text with "127.0.0.1" and "::1" only.
    let loopback =
        |ip: &IpAddr| *ip == IpAddr::from([127, 0, 0, 1]) || *ip == std::net::Ipv6Addr::LOCALHOST;
    let host = match ips.iter().find(|ip| !loopback(ip)) {
        Some(ip) => ip.to_string(),
        None => names.first().cloned().ok_or("there is no available ip")?,
    };
    let port = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(AGENT_PORT_NAME))
        .map(|p| {
            if kind == "NodePort" {
                p.node_port.unwrap_or(0)
            } else {
                p.port
            }
        })
        .filter(|p| *p > 0)
        .ok_or("fail to get the port number")?;
    Ok(protocol::go::net::join_host_port(&host, port))
}

/// The host of `host:port` (`[v6]:port`), as Go's `net.SplitHostPort`.
fn split_host(addr: &str) -> Option<&str> {
    if let Some(rest) = addr.strip_prefix('[') {
        let (host, port) = rest.split_once(']')?;
        return port.strip_prefix(':').map(|_| host);
    }
    let (host, _port) = addr.rsplit_once(':')?;
    (!host.contains(':')).then_some(host)
}

/// Reads `svc`, its Endpoints (same name) and, for a NodePort Service, the
/// cloud nodes, and picks the address.
pub async fn discover(client: &kube::Client, svc: &ObjectRef) -> Result<String, String> {
    use kube::api::{Api, ListParams};
    let what = format!("{}/{}", svc.namespace, svc.name);
    let service = Api::<Service>::namespaced(client.clone(), &svc.namespace)
        .get(&svc.name)
        .await
        .map_err(|e| format!("getting Service {what}: {e}"))?;
    let endpoints = Api::<Endpoints>::namespaced(client.clone(), &svc.namespace)
        .get(&svc.name)
        .await
        .map_err(|e| format!("getting Endpoints {what}: {e}"))?;
    let is_node_port = service
        .spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_some_and(|t| t == "NodePort");
    let nodes = if is_node_port {
        Api::<Node>::all(client.clone())
            .list(&ListParams::default().labels(CLOUD_NODES))
            .await
            .map_err(|e| format!("listing cloud nodes ({CLOUD_NODES}): {e}"))?
            .items
    } else {
        Vec::new()
    };
    pick(&service, &endpoints, &nodes).map_err(|e| format!("Service {what}: {e}"))
}

/// [`discover`] on a short-lived runtime of the calling thread, before the
/// data plane starts.
pub fn discover_blocking(
    spec: &super::manager::KubeSpec,
    svc: &ObjectRef,
) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = super::kube_sync::client(spec).await?;
        discover(&client, svc).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn eps(ips: &[&str]) -> Endpoints {
        let addrs: Vec<_> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        serde_json::from_value(json!({"metadata": {"name": "x-tunnel-server-svc"},
            "subsets": [{"addresses": addrs}]}))
        .unwrap()
    }

    fn node(ip: &str, host: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": host},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": host}]}}))
        .unwrap()
    }

    fn meta() -> serde_json::Value {
        json!({"name": "x-tunnel-server-svc", "namespace": "kube-system"})
    }

    #[test]
    fn node_port_uses_a_cloud_node_and_the_node_port() {
        // openyurt v1.0 config/setup/yurt-tunnel-server.yaml's Service.
        let s = svc(
            json!({"metadata": meta(), "spec": {"type": "NodePort", "clusterIP": "10.96.0.9",
            "ports": [{"name": "tcp", "port": 10262, "targetPort": 10262, "nodePort": 31008}]}}),
        );
        let got = pick(&s, &eps(&["10.244.0.5"]), &[node("192.168.0.10", "master")]);
        assert_eq!(got.unwrap(), "192.168.0.10:31008");
        // A loopback node address is passed over: the ClusterIP comes next.
        let got = pick(&s, &eps(&[]), &[node("127.0.0.1", "master")]);
        assert_eq!(got.unwrap(), "10.96.0.9:31008");
        assert_eq!(
            pick(&s, &eps(&[]), &[]).unwrap_err(),
            "there is no cloud node"
        );
    }

    #[test]
    fn load_balancer_and_annotation_and_names() {
        let lb = svc(
            json!({"metadata": meta(), "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.9",
            "ports": [{"name": "tcp", "port": 10262}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}),
        );
        assert_eq!(pick(&lb, &eps(&[]), &[]).unwrap(), "203.0.113.7:10262");
        let mut pending = lb.clone();
        pending.status = None;
        assert_eq!(
            pick(&pending, &eps(&[]), &[]).unwrap_err(),
            "load balancer is not ready"
        );
        let ann = svc(
            json!({"metadata": {"name": "x-tunnel-server-svc", "namespace": "kube-system",
            "annotations": {"x-tunnel-server-external-addr": "[fd00::7]:443"}},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.9", "ports": [{"name": "tcp", "port": 10262}]}}),
        );
        assert_eq!(pick(&ann, &eps(&[]), &[]).unwrap(), "[fd00::7]:10262");
        // Headless, loopback only: the first name.
        let named = svc(
            json!({"metadata": {"name": "x-tunnel-server-svc", "namespace": "kube-system",
            "annotations": {"x-tunnel-server-external-addr": "tunnel.example:443"}},
            "spec": {"type": "ClusterIP", "clusterIP": "None", "ports": [{"name": "tcp", "port": 10262}]}}),
        );
        assert_eq!(
            pick(&named, &eps(&["127.0.0.1"]), &[]).unwrap(),
            "tunnel.example:10262"
        );
        let headless = svc(json!({"metadata": meta(), "spec": {"clusterIP": "None",
            "ports": [{"name": "tcp", "port": 10262}]}}));
        assert_eq!(
            pick(&headless, &eps(&[]), &[]).unwrap(),
            "x-tunnel-server-svc:10262"
        );
        // The endpoints' pod address when nothing else is.
        assert_eq!(
            pick(&headless, &eps(&["10.244.0.5"]), &[]).unwrap(),
            "10.244.0.5:10262"
        );
        let no_port = svc(
            json!({"metadata": meta(), "spec": {"clusterIP": "10.96.0.9",
            "ports": [{"name": "https", "port": 443}]}}),
        );
        assert_eq!(
            pick(&no_port, &eps(&[]), &[]).unwrap_err(),
            "fail to get the port number"
        );
        let ext = svc(json!({"metadata": meta(), "spec": {"type": "ExternalName"}}));
        assert!(pick(&ext, &eps(&[]), &[])
            .unwrap_err()
            .contains("unsupported service type"));
    }
}
