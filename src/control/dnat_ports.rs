//! yurt-tunnel's `dnat-PORT` Service ports, sans-I/O: for every extra
//! proxy port of the server ConfigMap (`yurt-tunnel-server-cfg`), the
//! tunnel Service (`x-tunnel-server-internal-svc`) carries a TCP port
//! named `dnat-PORT` whose target is the interception listener that
//! serves it, so that a cloud component dialing `EDGE-NODE:PORT` (the
//! name resolves to that Service's ClusterIP) lands on the tunnel server.
//! This module only computes ports; `kube_sync` reads and writes them.
//!
//! Facts from openyurt (master, fbefb6ba):
//! - `pkg/yurttunnel/util/util.go` `resolveProxyPortsAndMappings` and
//!   `resolvePorts`: `dnat-ports-pair` (`P=Q,...`, deprecated) counts a
//!   pair only when `Q` is the insecure listener's port, and maps `P` to
//!   the insecure listener; `http-proxy-ports` (`P,...`) to the insecure
//!   listener; `https-proxy-ports` to the secure one (later fields win);
//!   a value with a `=` anywhere is read as pairs; a port that is not a
//!   number in 1..=65535 is skipped; 10250 and 10255 never count.
//! - `pkg/yurttunnel/trafficforward/dns/dns.go` `resolveServicePorts`:
//!   ports are keyed by protocol and port; a wanted port absent as TCP is
//!   added as `{name: dnat-P, port: P, protocol: TCP, targetPort: T}`; a
//!   present one whose targetPort differs gets the new targetPort and
//!   keeps its name, port and protocol; a TCP port named `dnat-...` that
//!   is no longer wanted is removed; other ports are left alone. Go's map
//!   iteration leaves the order random; here existing ports keep theirs
//!   and new ones follow by port number.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServicePort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The name prefix of the ports this module owns.
pub const PREFIX: &str = "dnat-";

/// The kubelet ports, never proxied this way (`KubeletHTTPSPort`,
/// `KubeletHTTPPort`).
const KUBELET_PORTS: [u16; 2] = [10250, 10255];

/// The server ConfigMap's extra ports and the listener port each goes to:
/// `insecure` is the plain interception listener's port (yurt's
/// `--insecure-port`, 10264), `secure` the TLS one's (10263).
pub fn proxy_ports(
    data: &BTreeMap<String, String>,
    insecure: u16,
    secure: u16,
) -> BTreeMap<u16, u16> {
    let field = |k: &str| data.get(k).map(String::as_str).unwrap_or("");
    let insecure_s = insecure.to_string();
    let mut out = BTreeMap::new();
    for p in ports_of(field("dnat-ports-pair"), &insecure_s) {
        out.insert(p, insecure);
    }
    for p in ports_of(field("http-proxy-ports"), "") {
        out.insert(p, insecure);
    }
    for p in ports_of(field("https-proxy-ports"), "") {
        out.insert(p, secure);
    }
    for k in KUBELET_PORTS {
        out.remove(&k);
    }
    out
}

/// The ports of one field: `P,...`, or pairs `P=Q,...` of which only
/// those with `Q == pair_to` count (`resolvePorts`).
fn ports_of(s: &str, pair_to: &str) -> Vec<u16> {
    if s.trim().is_empty() {
        return Vec::new();
    }
    let pairs = s.contains('=');
    s.split(',')
        .filter_map(|part| {
            let p = if pairs {
                let sub: Vec<&str> = part.split('=').collect();
                (sub.len() == 2 && sub[1].trim() == pair_to).then(|| sub[0].trim())?
            } else {
                part.trim()
            };
            match p.parse::<i64>() {
                Ok(n) if (1..=65535).contains(&n) => Some(n as u16),
                _ => {
                    if !p.is_empty() {
                        tracing::debug!(port = %p, "skipping a proxy port that is not in 1..=65535");
                    }
                    None
                }
            }
        })
        .collect()
}

fn is_tcp(p: &ServicePort) -> bool {
    // The API server defaults an absent protocol to TCP.
    p.protocol.as_deref().is_none_or(|x| x == "TCP")
}

/// `targetPort` as Go's `IntOrString.String()` prints it.
fn target_text(t: &Option<IntOrString>) -> String {
    match t {
        Some(IntOrString::Int(n)) => n.to_string(),
        Some(IntOrString::String(s)) => s.clone(),
        None => "0".into(),
    }
}

/// The Service's ports with `wanted` (port -> target port) applied, or
/// None when nothing changes.
pub fn resolve(current: &[ServicePort], wanted: &BTreeMap<u16, u16>) -> Option<Vec<ServicePort>> {
    let mut changed = false;
    let mut out: Vec<ServicePort> = Vec::with_capacity(current.len() + wanted.len());
    for p in current {
        let tcp_port = u16::try_from(p.port).ok().filter(|_| is_tcp(p));
        match tcp_port.and_then(|n| wanted.get(&n)) {
            Some(&target) if target_text(&p.target_port) != target.to_string() => {
                out.push(ServicePort {
                    name: p.name.clone(),
                    port: p.port,
                    protocol: p.protocol.clone(),
                    target_port: Some(IntOrString::Int(target.into())),
                    ..Default::default()
                });
                changed = true;
            }
            Some(_) => out.push(p.clone()),
            None if tcp_port.is_some()
                && p.name.as_deref().is_some_and(|n| n.starts_with(PREFIX)) =>
            {
                changed = true;
            }
            None => out.push(p.clone()),
        }
    }
    for (&port, &target) in wanted {
        let present = current
            .iter()
            .any(|p| is_tcp(p) && p.port == i32::from(port));
        if !present {
            out.push(ServicePort {
                name: Some(format!("{PREFIX}{port}")),
                port: port.into(),
                protocol: Some("TCP".into()),
                target_port: Some(IntOrString::Int(target.into())),
                ..Default::default()
            });
            changed = true;
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn port(name: &str, port: i32, target: i32) -> ServicePort {
        ServicePort {
            name: Some(name.into()),
            port,
            protocol: Some("TCP".into()),
            target_port: Some(IntOrString::Int(target)),
            ..Default::default()
        }
    }

    #[test]
    fn proxy_ports_follow_yurts_fields() {
        let d = data(&[
            ("dnat-ports-pair", "9100=10264, 9200=10999 ,x=10264,0=10264"),
            ("http-proxy-ports", "9300, 10250,70000"),
            ("https-proxy-ports", "9400,9300"),
        ]);
        let got = proxy_ports(&d, 10264, 10263);
        assert_eq!(
            got,
            BTreeMap::from([(9100, 10264), (9300, 10263), (9400, 10263)])
        );
        // A value with a '=' is read as pairs: bare ports in it count not.
        assert!(proxy_ports(
            &data(&[("dnat-ports-pair", "9100,9200=10264")]),
            10264,
            10263
        )
        .contains_key(&9200));
        assert!(!proxy_ports(
            &data(&[("dnat-ports-pair", "9100,9200=10264")]),
            10264,
            10263
        )
        .contains_key(&9100));
        assert!(proxy_ports(&data(&[]), 10264, 10263).is_empty());
    }

    #[test]
    fn ports_are_added_retargeted_and_removed() {
        let base = vec![port("https", 10250, 10263), port("http", 10255, 10264)];
        let wanted = BTreeMap::from([(9100, 10264), (9400, 10263)]);
        let got = resolve(&base, &wanted).expect("changed");
        assert_eq!(got.len(), 4);
        assert_eq!(got[..2], base[..]);
        assert_eq!(got[2], port("dnat-9100", 9100, 10264));
        assert_eq!(got[3], port("dnat-9400", 9400, 10263));
        // Applied again: nothing to do.
        assert_eq!(resolve(&got, &wanted), None);
        // 9100 moves to the TLS listener, 9400 goes away; a port of
        // someone else's keeps its name and gets the new target.
        let mut mine = got.clone();
        mine.push(port("metrics", 9500, 8080));
        let wanted = BTreeMap::from([(9100, 10263), (9500, 10264)]);
        let got = resolve(&mine, &wanted).expect("changed");
        assert_eq!(
            got,
            vec![
                base[0].clone(),
                base[1].clone(),
                port("dnat-9100", 9100, 10263),
                port("metrics", 9500, 10264),
            ]
        );
        // Nothing wanted: every dnat- port goes, the others stay.
        let got = resolve(&got, &BTreeMap::new()).expect("changed");
        assert_eq!(
            got,
            vec![
                base[0].clone(),
                base[1].clone(),
                port("metrics", 9500, 10264)
            ]
        );
        // A UDP port of the same number is not ours: a TCP one is added.
        let mut udp = port("dnat-9100", 9100, 10264);
        udp.protocol = Some("UDP".into());
        let got = resolve(&[udp.clone()], &BTreeMap::from([(9100, 10264)])).unwrap();
        assert_eq!(got, vec![udp, port("dnat-9100", 9100, 10264)]);
    }
}
