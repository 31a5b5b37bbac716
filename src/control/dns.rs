//! DNS records for yurt-tunnel's CoreDNS `hosts` setup, sans-I/O: edge node
//! names resolve to the tunnel server (so cloud components dialing a node by
//! name land on the interception listener), cloud node names to their own
//! address. Rendered as yurt-tunnel did: `IP<TAB>name` lines, sorted, joined
//! by newlines.

use std::collections::BTreeMap;
use std::net::IpAddr;

/// Renders the record set: every edge node to `tunnel`, every cloud node to
/// its address (a name that is both is an edge node: it has an agent).
pub fn render_hosts(
    edge_nodes: impl IntoIterator<Item = String>,
    tunnel: IpAddr,
    cloud_nodes: &BTreeMap<String, IpAddr>,
) -> String {
    let mut names: BTreeMap<String, IpAddr> = cloud_nodes.clone();
    for n in edge_nodes {
        if valid_name(&n) {
            names.insert(n, tunnel);
        }
    }
    let mut lines: Vec<String> = names
        .iter()
        .filter(|(n, _)| valid_name(n))
        .map(|(n, ip)| format!("{ip}\t{n}"))
        .collect();
    lines.sort();
    lines.join("\n")
}

/// A DNS name a hosts file can carry (no whitespace, no comment start).
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'.' || c == b'_')
}

/// Parses `name=ip` pairs (`--dns-cloud-node`).
pub fn parse_node(s: &str) -> Result<(String, IpAddr), String> {
    let (n, ip) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected name=ip"))?;
    let ip: IpAddr = ip.parse().map_err(|_| format!("{s:?}: bad address"))?;
    if !valid_name(n) {
        return Err(format!("{s:?}: bad node name"));
    }
    Ok((n.to_string(), ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_tab_separated_lines() {
        let mut cloud = BTreeMap::new();
        cloud.insert("cloud-b".to_string(), "10.0.0.12".parse().unwrap());
        cloud.insert("edge-1".to_string(), "10.0.0.99".parse().unwrap());
        let out = render_hosts(
            vec![
                "edge-2".to_string(),
                "edge-1".to_string(),
                "bad name".to_string(),
            ],
            "10.96.0.50".parse().unwrap(),
            &cloud,
        );
        assert_eq!(
            out,
            "10.0.0.12\tcloud-b\n10.96.0.50\tedge-1\n10.96.0.50\tedge-2"
        );
        assert!(parse_node("a=1.2.3.4").is_ok());
        assert!(
            parse_node("a").is_err()
                && parse_node("a=x").is_err()
                && parse_node("a b=1.1.1.1").is_err()
        );
    }
}
