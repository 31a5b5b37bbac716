//! Agent identity bound to its client certificate (the server's
//! `--bind-agent-identity`), sans-I/O: what a leaf certificate names
//! ([`CertNames::from_der`]), whether an agent's ID and identifiers stay
//! within those names ([`check`]), and which certificate holds each agent
//! ID while it is connected ([`Holders`]).
//!
//! The rules:
//! - the certificate must carry the client-auth extended key usage (a
//!   serving certificate, or one with no EKU at all, is not an agent's);
//! - the agent ID must be one of the certificate's names: a DNS SAN or the
//!   CN, where a Kubernetes node client CN `system:node:<name>` names
//!   `<name>`; wildcard DNS SANs name nothing; names compare ASCII
//!   case-insensitively (DNS names and Kubernetes node names are lower case);
//! - every `host` identifier must be one of those names, every `ipv4` and
//!   `ipv6` identifier an IP SAN;
//! - a `cidr` identifier only when every address of the range is an IP SAN
//!   (in practice a /32 or /128 of one): certificates name addresses, not
//!   ranges, so a wider claim cannot be backed by one;
//! - `default-route` is refused: it claims every destination no route
//!   matches, which no certificate can back;
//! - one agent ID is held by one certificate (its public key) at a time:
//!   several connections with the same key are one agent (one per server,
//!   reconnects, a renewal that kept the key), another key is refused until
//!   the holder's last connection ends.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use super::agent_identifiers::{Cidr, Identifiers};

/// Kubernetes node client certificates: CN `system:node:<node name>`.
const NODE_CN_PREFIX: &str = "system:node:";

/// What a leaf certificate says about its holder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertNames {
    /// The subject CN, when there is exactly one.
    pub cn: Option<String>,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    /// The extended key usage extension lists id-kp-clientAuth.
    pub client_auth: bool,
    /// The DER SubjectPublicKeyInfo: which key the holder proved it has.
    pub spki: Vec<u8>,
}

impl CertNames {
    /// Reads the names of a DER certificate (already verified by TLS).
    pub fn from_der(der: &[u8]) -> Result<Self, IdentityError> {
        let bad = |e: &dyn fmt::Display| IdentityError::BadCertificate(e.to_string());
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| bad(&e))?;
        let mut cns = cert.subject().iter_common_name();
        let cn = match (cns.next(), cns.next()) {
            (Some(one), None) => one.as_str().ok().map(str::to_string),
            // None, or several: which one names the holder is ambiguous.
            _ => None,
        };
        let mut names = CertNames {
            cn,
            spki: cert.public_key().raw.to_vec(),
            ..CertNames::default()
        };
        if let Some(san) = cert.subject_alternative_name().map_err(|e| bad(&e))? {
            use x509_parser::extensions::GeneralName;
            for n in &san.value.general_names {
                match n {
                    GeneralName::DNSName(d) => names.dns.push(d.to_string()),
                    GeneralName::IPAddress(raw) => {
                        if let Ok(a) = <[u8; 4]>::try_from(*raw) {
                            names.ips.push(IpAddr::from(a));
                        } else if let Ok(a) = <[u8; 16]>::try_from(*raw) {
                            names.ips.push(IpAddr::from(a));
                        }
                        // Any other length is a name constraint's form, not
                        // an address: it names nothing.
                    }
                    _ => {}
                }
            }
        }
        names.client_auth = cert
            .extended_key_usage()
            .map_err(|e| bad(&e))?
            .is_some_and(|eku| eku.value.client_auth);
        Ok(names)
    }

    /// The names an agent ID or a `host` identifier may be: the CN (a node
    /// client CN as its node name) and the DNS SANs, wildcards left out.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let cn = self
            .cn
            .as_deref()
            .map(|cn| cn.strip_prefix(NODE_CN_PREFIX).unwrap_or(cn));
        cn.into_iter()
            .chain(self.dns.iter().map(String::as_str))
            .filter(|n| !n.is_empty() && !n.starts_with("*."))
    }

    fn has_name(&self, name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name);
        self.names()
            .any(|n| n.strip_suffix('.').unwrap_or(n).eq_ignore_ascii_case(name))
    }

    fn has_ip(&self, ip: IpAddr) -> bool {
        self.ips.iter().any(|a| canonical(*a) == canonical(ip))
    }

    /// Every address of `c` is an IP SAN.
    fn covers(&self, c: &Cidr) -> bool {
        let bits = if c.addr.is_ipv4() { 32 } else { 128 };
        let host_bits = bits - u32::from(c.prefix);
        if host_bits >= 16 {
            // 65,536 addresses or more: no certificate lists them all.
            return false;
        }
        let mut inside: Vec<IpAddr> = self
            .ips
            .iter()
            .map(|a| canonical(*a))
            .filter(|a| c.contains(*a))
            .collect();
        inside.sort();
        inside.dedup();
        inside.len() == 1usize << host_bits
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The names a certificate allows, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    pub names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl Allowed {
    fn of(c: &CertNames) -> Self {
        Allowed {
            names: c.names().map(str::to_string).collect(),
            ips: c.ips.clone(),
        }
    }
}

impl fmt::Display for Allowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ips: Vec<String> = self.ips.iter().map(IpAddr::to_string).collect();
        write!(
            f,
            "the certificate names [{}] and addresses [{}]",
            self.names.join(", "),
            ips.join(", ")
        )
    }
}

/// Why an agent may not register what it asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("client certificate unreadable: {0}")]
    BadCertificate(String),
    #[error("the client certificate is not for client authentication (no clientAuth extended key usage)")]
    NotClientAuth,
    #[error("agent identity binding needs a client certificate and the agent presented none")]
    NoCertificate,
    #[error("agent ID {id:?} is not named by its client certificate ({allowed})")]
    AgentId { id: String, allowed: Allowed },
    #[error("agent identifier host={host} is not named by its client certificate ({allowed})")]
    Host { host: String, allowed: Allowed },
    #[error(
        "agent identifier {key}={ip} is not an IP address of its client certificate ({allowed})"
    )]
    Ip {
        key: &'static str,
        ip: IpAddr,
        allowed: Allowed,
    },
    #[error("agent identifier cidr={cidr} is refused: not every address of it is an IP address of its client certificate ({allowed})")]
    Cidr { cidr: Cidr, allowed: Allowed },
    #[error("agent identifier default-route=true is refused: a client certificate cannot back a claim on every destination")]
    DefaultRoute,
    #[error("agent ID {0:?} is held by a connected agent with a different client certificate")]
    Taken(String),
}

impl IdentityError {
    /// The `reason` label of the refusal counter.
    pub fn reason(&self) -> &'static str {
        match self {
            IdentityError::BadCertificate(_) => "bad_certificate",
            IdentityError::NotClientAuth => "not_client_auth",
            IdentityError::NoCertificate => "no_certificate",
            IdentityError::AgentId { .. } => "agent_id",
            IdentityError::Host { .. } => "host",
            IdentityError::Ip { key: "ipv4", .. } => "ipv4",
            IdentityError::Ip { .. } => "ipv6",
            IdentityError::Cidr { .. } => "cidr",
            IdentityError::DefaultRoute => "default_route",
            IdentityError::Taken(_) => "agent_id_taken",
        }
    }
}

impl IdentityError {
    /// What an operator changes so that the agent gets in: sent to the
    /// agent with the refusal and logged by the server.
    pub fn hint(&self) -> &'static str {
        match self {
            IdentityError::BadCertificate(_) | IdentityError::NotClientAuth => {
                "give the agent a client certificate (clientAuth usage) whose CN or DNS SAN is \
                 its agent ID, e.g. `edgetunnel certs issue agent OUT --ca-dir CA --name <ID>`"
            }
            IdentityError::NoCertificate => {
                "give the agent a client certificate (--cert/--key) naming its agent ID, or \
                 authenticate agents by token (--agent-namespace ...)"
            }
            IdentityError::AgentId { .. } | IdentityError::Host { .. } => {
                "the agent's certificate must name its --agent-id and each host identifier as CN \
                 (`system:node:<ID>` counts as <ID>) or DNS SAN: issue one per node with \
                 `edgetunnel certs issue agent OUT --ca-dir CA --name <ID>` (CN and SAN <ID>), \
                 or start the server with --bind-agent-identity=false to accept any \
                 certificate of the CA (ANP's behaviour)"
            }
            IdentityError::Ip { .. } | IdentityError::Cidr { .. } => {
                "put the agent's ipv4/ipv6 identifiers in its certificate as IP SANs (a cidr \
                 only as every address of it), or drop them from --agent-identifiers, or start \
                 the server with --bind-agent-identity=false"
            }
            IdentityError::DefaultRoute => {
                "drop default-route=true from --agent-identifiers (route by host or address), \
                 or start the server with --bind-agent-identity=false"
            }
            IdentityError::Taken(_) => {
                "another certificate's agent holds this ID: give every node its own agent ID and \
                 certificate"
            }
        }
    }
}

/// Every `reason` [`IdentityError::reason`] gives.
pub const REASONS: [&str; 10] = [
    "bad_certificate",
    "not_client_auth",
    "no_certificate",
    "agent_id",
    "host",
    "ipv4",
    "ipv6",
    "cidr",
    "default_route",
    "agent_id_taken",
];

/// Whether an agent holding `cert` may register `agent_id` with `ids`;
/// the first thing refused otherwise.
pub fn check(cert: &CertNames, agent_id: &str, ids: &Identifiers) -> Result<(), IdentityError> {
    if !cert.client_auth {
        return Err(IdentityError::NotClientAuth);
    }
    let allowed = || Allowed::of(cert);
    if !cert.has_name(agent_id) {
        return Err(IdentityError::AgentId {
            id: agent_id.to_string(),
            allowed: allowed(),
        });
    }
    if let Some(h) = ids.hosts.iter().find(|h| !cert.has_name(h)) {
        return Err(IdentityError::Host {
            host: h.clone(),
            allowed: allowed(),
        });
    }
    let v4 = ids.ipv4.iter().map(|a| ("ipv4", IpAddr::V4(*a)));
    let v6 = ids.ipv6.iter().map(|a| ("ipv6", IpAddr::V6(*a)));
    if let Some((key, ip)) = v4.chain(v6).find(|(_, ip)| !cert.has_ip(*ip)) {
        return Err(IdentityError::Ip {
            key,
            ip,
            allowed: allowed(),
        });
    }
    if let Some(c) = ids.cidrs.iter().find(|c| !cert.covers(c)) {
        return Err(IdentityError::Cidr {
            cidr: *c,
            allowed: allowed(),
        });
    }
    if ids.default_route {
        return Err(IdentityError::DefaultRoute);
    }
    Ok(())
}

/// Which key holds each agent ID, and by how many connections.
#[derive(Debug, Default)]
pub struct Holders {
    held: HashMap<String, (Vec<u8>, usize)>,
}

impl Holders {
    /// One more connection of `agent_id` with the key `spki`: refused when
    /// another key holds the ID.
    pub fn claim(&mut self, agent_id: &str, spki: &[u8]) -> Result<(), IdentityError> {
        let entry = self
            .held
            .entry(agent_id.to_ascii_lowercase())
            .or_insert_with(|| (spki.to_vec(), 0));
        if entry.0 != spki {
            return Err(IdentityError::Taken(agent_id.to_string()));
        }
        entry.1 += 1;
        Ok(())
    }

    /// A connection that [`claim`](Self::claim)ed ended.
    pub fn release(&mut self, agent_id: &str, spki: &[u8]) {
        let key = agent_id.to_ascii_lowercase();
        if let Some(e) = self.held.get_mut(&key) {
            if e.0 == spki {
                e.1 = e.1.saturating_sub(1);
                if e.1 == 0 {
                    self.held.remove(&key);
                }
            }
        }
    }

    /// Agent IDs held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str, dns: &[&str], ips: &[&str]) -> CertNames {
        CertNames {
            cn: (!cn.is_empty()).then(|| cn.to_string()),
            dns: dns.iter().map(|s| s.to_string()).collect(),
            ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            client_auth: true,
            spki: b"key-a".to_vec(),
        }
    }

    fn ids(q: &str) -> Identifiers {
        Identifiers::parse(q).unwrap()
    }

    #[test]
    fn agent_id_is_the_cn_or_a_dns_san() {
        let c = cert("node-a", &["node-a.example", "*.wild.example"], &[]);
        assert_eq!(check(&c, "node-a", &ids("")), Ok(()));
        assert_eq!(check(&c, "NODE-A", &ids("")), Ok(()));
        assert_eq!(check(&c, "node-a.example.", &ids("")), Ok(()));
        let e = check(&c, "node-b", &ids("")).unwrap_err();
        assert_eq!(e.reason(), "agent_id");
        assert!(e.to_string().contains("\"node-b\""), "{e}");
        assert!(e.to_string().contains("node-a.example"), "{e}");
        // Wildcards name nothing, not even themselves.
        assert!(check(&c, "x.wild.example", &ids("")).is_err());
        assert!(check(&c, "*.wild.example", &ids("")).is_err());
        assert!(check(&c, "", &ids("")).is_err());
    }

    #[test]
    fn node_client_cn_names_the_node() {
        let c = cert("system:node:edge-1", &[], &[]);
        assert_eq!(check(&c, "edge-1", &ids("host=edge-1")), Ok(()));
        assert!(check(&c, "system:node:edge-1", &ids("")).is_err());
        assert!(check(&c, "edge-2", &ids("")).is_err());
    }

    #[test]
    fn csr_mode_agent_certificate_names_its_node_and_addresses() {
        // control::csr::Profile::agent: CN tunnel-agent-client, DNS SAN the
        // agent ID, IP SANs its ipv4/ipv6 identifiers.
        let c = cert(
            "tunnel-agent-client",
            &["edge-1"],
            &["192.168.1.10", "fd00::10"],
        );
        assert_eq!(
            check(
                &c,
                "edge-1",
                &ids("host=edge-1&ipv4=192.168.1.10&ipv6=fd00%3A%3A10")
            ),
            Ok(())
        );
        assert!(check(&c, "edge-2", &ids("")).is_err());
    }

    #[test]
    fn hosts_and_addresses_must_be_named() {
        let c = cert("node-a", &[], &["10.0.0.1", "fd00::1"]);
        assert_eq!(
            check(
                &c,
                "node-a",
                &ids("host=node-a&ipv4=10.0.0.1&ipv6=fd00%3A%3A1")
            ),
            Ok(())
        );
        let e = check(&c, "node-a", &ids("host=node-b")).unwrap_err();
        assert_eq!(e.reason(), "host");
        assert!(e.to_string().contains("host=node-b"), "{e}");
        let e = check(&c, "node-a", &ids("ipv4=10.0.0.2")).unwrap_err();
        assert_eq!(e.reason(), "ipv4");
        assert!(e.to_string().contains("ipv4=10.0.0.2"), "{e}");
        assert!(e.to_string().contains("10.0.0.1"), "{e}");
        let e = check(&c, "node-a", &ids("ipv6=fd00%3A%3A2")).unwrap_err();
        assert_eq!(e.reason(), "ipv6");
        // An IP SAN is not a host name, a host name is not an address.
        assert!(check(&c, "node-a", &ids("host=10.0.0.1")).is_err());
        assert!(check(&c, "10.0.0.1", &ids("")).is_err());
        // An IPv4-mapped SAN is its IPv4 address.
        let m = cert("node-a", &[], &["::ffff:10.0.0.1"]);
        assert_eq!(check(&m, "node-a", &ids("ipv4=10.0.0.1")), Ok(()));
    }

    #[test]
    fn cidr_only_when_every_address_is_named() {
        let c = cert(
            "node-a",
            &[],
            &["10.0.0.1", "10.0.0.4", "10.0.0.5", "fd00::1"],
        );
        for ok in ["10.0.0.1/32", "10.0.0.4/31", "fd00::1/128"] {
            let q = format!("cidr={ok}");
            assert_eq!(check(&c, "node-a", &ids(&q)), Ok(()), "{ok}");
        }
        for bad in [
            "10.0.0.2/32",
            "10.0.0.0/31",
            "10.0.0.4/30",
            "10.0.0.0/8",
            "0.0.0.0/0",
            "fd00::/64",
            "::/0",
        ] {
            let q = format!("cidr={bad}");
            let e = check(&c, "node-a", &ids(&q)).unwrap_err();
            assert_eq!(e.reason(), "cidr", "{bad}");
            assert!(e.to_string().contains(bad), "{e}");
        }
        // Duplicated SANs do not count twice.
        let d = cert("node-a", &[], &["10.0.0.4", "10.0.0.4"]);
        assert!(check(&d, "node-a", &ids("cidr=10.0.0.4/31")).is_err());
    }

    #[test]
    fn default_route_and_non_client_certificates_are_refused() {
        let c = cert("node-a", &[], &[]);
        let e = check(&c, "node-a", &ids("default-route=true")).unwrap_err();
        assert_eq!(e, IdentityError::DefaultRoute);
        let mut s = cert("node-a", &[], &[]);
        s.client_auth = false;
        assert_eq!(
            check(&s, "node-a", &ids("")),
            Err(IdentityError::NotClientAuth)
        );
        // No CN, no SANs: nothing can be registered.
        assert!(check(&cert("", &[], &[]), "node-a", &ids("")).is_err());
    }

    #[test]
    fn refusals_say_what_to_change() {
        let allowed = Allowed {
            names: vec!["edgetunnel-agent".into()],
            ips: vec![],
        };
        let e = IdentityError::AgentId {
            id: "node1".into(),
            allowed,
        };
        let text = format!("{e}; {}", e.hint());
        for want in [
            "node1",
            "edgetunnel-agent",
            "edgetunnel certs",
            "--bind-agent-identity=false",
        ] {
            assert!(text.contains(want), "{want:?} not in {text:?}");
        }
        assert!(IdentityError::Taken("n".into())
            .hint()
            .contains("its own agent ID"));
    }

    #[test]
    fn reasons_are_listed() {
        let a = Allowed {
            names: vec![],
            ips: vec![],
        };
        let all = [
            IdentityError::BadCertificate(String::new()),
            IdentityError::NotClientAuth,
            IdentityError::NoCertificate,
            IdentityError::AgentId {
                id: String::new(),
                allowed: a.clone(),
            },
            IdentityError::Host {
                host: String::new(),
                allowed: a.clone(),
            },
            IdentityError::Ip {
                key: "ipv4",
                ip: "10.0.0.1".parse().unwrap(),
                allowed: a.clone(),
            },
            IdentityError::Ip {
                key: "ipv6",
                ip: "::1".parse().unwrap(),
                allowed: a.clone(),
            },
            IdentityError::Cidr {
                cidr: Cidr::parse("10.0.0.0/8").unwrap(),
                allowed: a,
            },
            IdentityError::DefaultRoute,
            IdentityError::Taken(String::new()),
        ];
        let reasons: Vec<&str> = all.iter().map(IdentityError::reason).collect();
        assert_eq!(reasons, REASONS);
    }

    #[test]
    fn one_key_holds_an_agent_id() {
        let mut h = Holders::default();
        h.claim("node-a", b"key-a").unwrap();
        h.claim("node-a", b"key-a").unwrap();
        assert_eq!(
            h.claim("NODE-A", b"key-b"),
            Err(IdentityError::Taken("NODE-A".into()))
        );
        h.claim("node-b", b"key-b").unwrap();
        h.release("node-a", b"key-a");
        assert!(h.claim("node-a", b"key-b").is_err(), "one connection left");
        // A release by the refused key changes nothing.
        h.release("node-a", b"key-b");
        h.release("node-a", b"key-a");
        h.claim("node-a", b"key-b").unwrap();
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn names_from_a_real_certificate() {
        let mut p = rcgen::CertificateParams::new(vec![
            "node-a.example".to_string(),
            "10.0.0.1".to_string(),
            "fd00::1".to_string(),
        ])
        .unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:node-a");
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().unwrap();
        let der = p.clone().self_signed(&key).unwrap().der().to_vec();
        let n = CertNames::from_der(&der).unwrap();
        assert_eq!(n.cn.as_deref(), Some("system:node:node-a"));
        assert_eq!(n.dns, ["node-a.example"]);
        assert_eq!(
            n.ips,
            [
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        assert!(n.client_auth);
        assert_eq!(n.spki, key.public_key_der());
        assert_eq!(n.names().collect::<Vec<_>>(), ["node-a", "node-a.example"]);

        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let der = p.clone().self_signed(&key).unwrap().der().to_vec();
        assert!(!CertNames::from_der(&der).unwrap().client_auth);
        p.extended_key_usages = vec![];
        let der = p.clone().self_signed(&key).unwrap().der().to_vec();
        assert!(!CertNames::from_der(&der).unwrap().client_auth);

        assert!(matches!(
            CertNames::from_der(b"not a certificate"),
            Err(IdentityError::BadCertificate(_))
        ));
    }
}
