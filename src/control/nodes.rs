//! What the control thread needs to know about the cluster's nodes, sans-I/O:
//! readiness, the edge label, addresses; and the decisions made from them
//! (which nodes iptables leaves alone, which DNS record each node gets).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

/// The label yurt-tunnel uses for edge nodes.
pub const EDGE_LABEL: (&str, &str) = ("openyurt.io/is-edge-worker", "true");

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub ready: bool,
    pub edge: bool,
    pub internal_ip: Option<IpAddr>,
    pub external_ip: Option<IpAddr>,
}

impl NodeInfo {
    pub fn from_node(node: &Node, edge_label: (&str, &str)) -> Option<NodeInfo> {
        let name = node.metadata.name.clone()?;
        let edge = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(edge_label.0))
            .is_some_and(|v| v == edge_label.1);
        let status = node.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let addr = |kind: &str| {
            status
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.iter().find(|a| a.type_ == kind))
                .and_then(|a| a.address.parse().ok())
        };
        Some(NodeInfo {
            name,
            ready,
            edge,
            internal_ip: addr("InternalIP"),
            external_ip: addr("ExternalIP"),
        })
    }

    /// InternalIP, else ExternalIP.
    pub fn address(&self) -> Option<IpAddr> {
        self.internal_ip.or(self.external_ip)
    }
}

/// Ready nodes with no connected agent: iptables leaves their traffic alone
/// (RETURN), as yurt-tunnel does.
pub fn direct_nodes(
    nodes: &BTreeMap<String, NodeInfo>,
    with_agent: &BTreeSet<String>,
) -> BTreeSet<IpAddr> {
    nodes
        .values()
        .filter(|n| n.ready && !with_agent.contains(&n.name))
        .filter_map(|n| n.address())
        .collect()
}

/// (edge node names, cloud node name -> address) for the DNS records: a
/// node is an edge node when it carries the edge label or has an agent.
pub fn dns_split(
    nodes: &BTreeMap<String, NodeInfo>,
    with_agent: &BTreeSet<String>,
) -> (BTreeSet<String>, BTreeMap<String, IpAddr>) {
    let mut edge: BTreeSet<String> = with_agent.clone();
    let mut cloud = BTreeMap::new();
    for n in nodes.values() {
        if n.edge || with_agent.contains(&n.name) {
            edge.insert(n.name.clone());
        } else if let Some(ip) = n.address() {
            cloud.insert(n.name.clone(), ip);
        }
    }
    (edge, cloud)
}

/// Ports from yurt-tunnel's server ConfigMap value (`"10266, 9100"`).
pub fn parse_ports(v: &str) -> Vec<u16> {
    v.split(',')
        .filter_map(|p| p.trim().parse().ok())
        .filter(|p| *p != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> NodeInfo {
        let n: Node = serde_json::from_value(json).unwrap();
        NodeInfo::from_node(&n, EDGE_LABEL).unwrap()
    }

    #[test]
    fn classifies_nodes() {
        let edge = node(serde_json::json!({
            "metadata": {"name": "e1", "labels": {"openyurt.io/is-edge-worker": "true"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.21"}]}
        }));
        assert!(edge.edge && edge.ready);
        let cloud = node(serde_json::json!({
            "metadata": {"name": "c1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "ExternalIP", "address": "192.0.2.1"}]}
        }));
        let down = node(serde_json::json!({
            "metadata": {"name": "c2"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}],
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.12"}]}
        }));
        let nodes: BTreeMap<_, _> = [edge, cloud, down]
            .into_iter()
            .map(|n| (n.name.clone(), n))
            .collect();
        let agents: BTreeSet<String> = ["e1".to_string()].into();
        let direct = direct_nodes(&nodes, &agents);
        assert_eq!(direct, ["192.0.2.1".parse().unwrap()].into());
        let (e, c) = dns_split(&nodes, &agents);
        assert_eq!(e, agents);
        assert_eq!(c.len(), 2);
        assert_eq!(parse_ports("10266, 9100,x,0"), vec![10266, 9100]);
    }
}
