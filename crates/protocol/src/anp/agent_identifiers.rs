//! Agent identifiers: the `agentIdentifiers` metadata value, in URL query
//! form (`host=node1&ipv4=10.0.0.5&cidr=10.1.0.0/16&default-route=true`),
//! each key repeatable. Malformed addresses are errors. Unknown keys are
//! ignored where a peer sends them ([`Identifiers::parse`]: a newer peer may
//! add some, as ANP's server `proto/header/header.go` `GenAgentIdentifiers`
//! fails open) and refused where an operator writes them
//! ([`Identifiers::parse_known`], the agent's flag, as ANP's agent
//! `cmd/agent/app/options/options.go` `validateAgentIdentifiers` refuses
//! them: a mistyped `hostname=` would register nothing).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::go::percent::{self, Plus};

/// An IP network such as `10.1.0.0/16` or `fd00::/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Self, IdentifierError> {
        let bad = || IdentifierError::BadCidr(s.to_string());
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let prefix: u8 = p.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad());
        }
        Ok(Self { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask_u32(self.prefix);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask_u128(self.prefix);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

fn mask_u32(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    }
}

fn mask_u128(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifierError {
    #[error("agent identifier ipv4={0:?} is not an IPv4 address")]
    BadIpv4(String),
    #[error("agent identifier ipv6={0:?} is not an IPv6 address")]
    BadIpv6(String),
    #[error("agent identifier cidr={0:?} is not a CIDR range")]
    BadCidr(String),
    #[error("agent identifiers: bad percent-encoding in {0:?}")]
    BadEncoding(String),
    /// ANP's agent's words, with the keys it knows.
    #[error("agent identifiers: unknown address type: {0} (known: host, ipv4, ipv6, cidr, default-route)")]
    UnknownKey(String),
}

/// The keys ANP's agent accepts (`header.IPv4`, `IPv6`, `CIDR`, `Host`,
/// `DefaultRoute`; `uid` is a header type its agent refuses).
pub const KNOWN_KEYS: [&str; 5] = ["host", "ipv4", "ipv6", "cidr", "default-route"];

/// What an agent says it can reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identifiers {
    pub hosts: Vec<String>,
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
    pub cidrs: Vec<Cidr>,
    pub default_route: bool,
}

impl Identifiers {
    /// Parses an operator's `--agent-identifiers`: as [`Identifiers::parse`],
    /// and every key must be one of [`KNOWN_KEYS`].
    pub fn parse_known(query: &str) -> Result<Self, IdentifierError> {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let k = percent_decode(pair.split_once('=').map_or(pair, |(k, _)| k))?;
            if !KNOWN_KEYS.contains(&k.as_str()) {
                return Err(IdentifierError::UnknownKey(k));
            }
        }
        Self::parse(query)
    }

    /// Parses the URL-query form used in the `agentIdentifiers` header;
    /// unknown keys are skipped.
    pub fn parse(query: &str) -> Result<Self, IdentifierError> {
        let mut ids = Identifiers::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = percent_decode(k)?;
            let v = percent_decode(v)?;
            match k.as_str() {
                "host" => ids.hosts.push(v),
                "ipv4" => ids
                    .ipv4
                    .push(v.parse().map_err(|_| IdentifierError::BadIpv4(v.clone()))?),
                "ipv6" => ids
                    .ipv6
                    .push(v.parse().map_err(|_| IdentifierError::BadIpv6(v.clone()))?),
                "cidr" => ids.cidrs.push(Cidr::parse(&v)?),
                "default-route" => ids.default_route |= v.eq_ignore_ascii_case("true"),
                _ => {}
            }
        }
        Ok(ids)
    }

    /// Encodes in the same query form, keys in Go's `url.Values.Encode`
    /// order (sorted by key).
    pub fn encode(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        for c in &self.cidrs {
            parts.push(format!("cidr={}", percent::query_escape(&c.to_string())));
        }
        if self.default_route {
            parts.push("default-route=true".to_string());
        }
        for h in &self.hosts {
            parts.push(format!("host={}", percent::query_escape(h)));
        }
        for a in &self.ipv4 {
            parts.push(format!("ipv4={a}"));
        }
        for a in &self.ipv6 {
            parts.push(format!("ipv6={}", percent::query_escape(&a.to_string())));
        }
        parts.join("&")
    }
}

/// A query key or value (`+` is a space), refused when an escape is bad
/// or the bytes are not UTF-8.
fn percent_decode(s: &str) -> Result<String, IdentifierError> {
    percent::decode_utf8(s, Plus::Space).ok_or_else(|| IdentifierError::BadEncoding(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key_and_repeats() {
        let ids = Identifiers::parse(
            "host=node1&host=node-1.example&ipv4=10.0.0.5&ipv6=fd00%3A%3A1&cidr=10.1.0.0%2F16&default-route=true&future=x",
        )
        .unwrap();
        assert_eq!(ids.hosts, vec!["node1", "node-1.example"]);
        assert_eq!(ids.ipv4, vec![Ipv4Addr::new(10, 0, 0, 5)]);
        assert_eq!(ids.ipv6, vec!["fd00::1".parse::<Ipv6Addr>().unwrap()]);
        assert_eq!(ids.cidrs, vec![Cidr::parse("10.1.0.0/16").unwrap()]);
        assert!(ids.default_route);
        assert_eq!(Identifiers::parse(&ids.encode()).unwrap(), ids);
    }

    #[test]
    fn operators_get_only_known_keys() {
        let all = "host=n1&ipv4=10.0.0.5&ipv6=fd00%3A%3A1&cidr=10.1.0.0%2F16&default-route=true";
        assert_eq!(
            Identifiers::parse_known(all).unwrap(),
            Identifiers::parse(all).unwrap()
        );
        for (q, key) in [
            ("hostname=node-1", "hostname"),
            ("host=n1&zone=a", "zone"),
            ("uid=1", "uid"),
            ("h%6Fst2=x", "host2"),
            ("flag", "flag"),
        ] {
            assert_eq!(
                Identifiers::parse_known(q),
                Err(IdentifierError::UnknownKey(key.into())),
                "{q}"
            );
        }
        // The peer-side parser still fails open.
        assert_eq!(
            Identifiers::parse("hostname=node-1").unwrap(),
            Identifiers::default()
        );
        assert!(Identifiers::parse_known("").unwrap() == Identifiers::default());
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(Identifiers::parse("ipv4=node1").is_err());
        assert!(Identifiers::parse("cidr=10.0.0.0/33").is_err());
        assert!(Identifiers::parse("host=%zz").is_err());
        assert!(Identifiers::parse("host=%+1").is_err());
        assert_eq!(Identifiers::parse("").unwrap(), Identifiers::default());
    }

    #[test]
    fn cidr_contains() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains("10.1.200.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
        assert!(Cidr::parse("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
    }
}
