//! Choosing an agent for a dial (sans-I/O): ANP's proxy strategies.
//!
//! Strategies are tried in the configured order until one yields an agent:
//! - `destHost`: the dial address's host (port stripped) equals one of an
//!   agent's `host`, `ipv4` or `ipv6` identifiers; failing that, the agent
//!   with the longest `cidr` range containing the host's IP (ANP parses cidr
//!   but never routes by it; we do).
//! - `defaultRoute`: agents that announced `default-route=true`.
//! - `default`: any agent.
//!
//! Among candidates, agents that are not draining are preferred, and load is
//! spread round-robin over agents. An edgetunnel agent may hold several
//! connections ("links", one per server worker, see
//! [`super::agent_links`]): it counts as one agent, and among its links the
//! one on the caller's worker is preferred, so a tunnel stays on one core.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use super::identifiers::Identifiers;

/// One proxy strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    DestHost,
    DefaultRoute,
    Default,
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "destHost" => Ok(Strategy::DestHost),
            "defaultRoute" => Ok(Strategy::DefaultRoute),
            "default" => Ok(Strategy::Default),
            other => Err(format!(
                "unknown proxy strategy {other:?} (expected destHost, defaultRoute or default)"
            )),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::DestHost => "destHost",
            Strategy::DefaultRoute => "defaultRoute",
            Strategy::Default => "default",
        })
    }
}

/// Parses a comma-separated strategy list such as `destHost,default`.
pub fn parse_strategies(s: &str) -> Result<Vec<Strategy>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(Strategy::from_str)
        .collect()
}

/// Strips the port from `host:port`, `[v6]:port`, `[v6]` or a bare host.
pub fn dest_host(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        if let Some(end) = rest.find(']') {
            return &rest[..end];
        }
        return address;
    }
    match address.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((host, _)) if !host.contains(':') => host,
        _ => address,
    }
}

struct Entry<H> {
    agent_id: String,
    ids: Identifiers,
    draining: bool,
    handle: H,
    /// The server worker holding this connection.
    core: usize,
    /// The agent instance this connection is a link of (edgetunnel agents).
    instance: Option<String>,
}

/// Connections of one agent: the links of one instance, or a connection
/// of its own (agents that do not speak links).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Group<'a> {
    Instance(&'a str, &'a str),
    Single(u64),
}

/// The set of connected agents, keyed by a server-chosen connection key
/// (one agent may hold several connections).
pub struct Registry<H> {
    entries: HashMap<u64, Entry<H>>,
    next_rr: usize,
}

impl<H> Default for Registry<H> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            next_rr: 0,
        }
    }
}

impl<H: Clone> Registry<H> {
    pub fn insert(&mut self, key: u64, agent_id: String, ids: Identifiers, handle: H) {
        self.insert_link(key, agent_id, ids, handle, 0, None);
    }

    /// Registers a connection held by worker `core`, a link of `instance`
    /// when the agent speaks links. Returns whether it is the agent's first.
    pub fn insert_link(
        &mut self,
        key: u64,
        agent_id: String,
        ids: Identifiers,
        handle: H,
        core: usize,
        instance: Option<String>,
    ) -> bool {
        let first = match &instance {
            Some(i) => self.linked_cores(&agent_id, i).is_empty(),
            None => true,
        };
        self.entries.insert(
            key,
            Entry {
                agent_id,
                ids,
                draining: false,
                handle,
                core,
                instance,
            },
        );
        first
    }

    /// The workers holding links of `agent_id`'s `instance`.
    pub fn linked_cores(&self, agent_id: &str, instance: &str) -> Vec<usize> {
        let mut cores: Vec<usize> = self
            .entries
            .values()
            .filter(|e| e.agent_id == agent_id && e.instance.as_deref() == Some(instance))
            .map(|e| e.core)
            .collect();
        cores.sort_unstable();
        cores
    }

    pub fn remove(&mut self, key: u64) -> Option<H> {
        self.remove_link(key).map(|(h, _)| h)
    }

    /// Removes a connection; the flag tells whether it was its agent's last.
    pub fn remove_link(&mut self, key: u64) -> Option<(H, bool)> {
        let e = self.entries.remove(&key)?;
        let last = match &e.instance {
            Some(i) => self.linked_cores(&e.agent_id, i).is_empty(),
            None => true,
        };
        Some((e.handle, last))
    }

    fn group(&self, key: u64) -> Group<'_> {
        let e = &self.entries[&key];
        match &e.instance {
            Some(i) => Group::Instance(&e.agent_id, i),
            None => Group::Single(key),
        }
    }

    pub fn set_draining(&mut self, key: u64) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.draining = true;
        }
    }

    /// Agents registered (an agent with several links counts once).
    pub fn len(&self) -> usize {
        let mut groups: Vec<Group<'_>> = self.entries.keys().map(|k| self.group(*k)).collect();
        groups.sort_unstable();
        groups.dedup();
        groups.len()
    }

    /// Connections (links) registered.
    pub fn links(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Distinct agent IDs connected.
    pub fn agent_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.entries.values().map(|e| e.agent_id.clone()).collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The IP addresses connected agents announced (ipv4 and ipv6
    /// identifiers): the edge nodes whose traffic the tunnel carries.
    pub fn addresses(&self) -> std::collections::BTreeSet<std::net::IpAddr> {
        self.entries
            .values()
            .flat_map(|e| {
                e.ids
                    .ipv4
                    .iter()
                    .map(|a| std::net::IpAddr::V4(*a))
                    .chain(e.ids.ipv6.iter().map(|a| std::net::IpAddr::V6(*a)))
            })
            .collect()
    }

    /// Node names (host identifiers) connected agents announced.
    pub fn hosts(&self) -> std::collections::BTreeSet<String> {
        self.entries
            .values()
            .flat_map(|e| e.ids.hosts.iter().cloned())
            .collect()
    }

    /// The first address announced by an agent with host identifier `host`.
    pub fn address_of_host(&self, host: &str) -> Option<std::net::IpAddr> {
        self.entries
            .values()
            .filter(|e| e.ids.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)))
            .find_map(|e| {
                e.ids
                    .ipv4
                    .first()
                    .map(|a| std::net::IpAddr::V4(*a))
                    .or_else(|| e.ids.ipv6.first().map(|a| std::net::IpAddr::V6(*a)))
            })
    }

    /// Picks an agent for a dial to `address`, trying `strategies` in order.
    pub fn pick(&mut self, address: &str, strategies: &[Strategy]) -> Option<H> {
        self.pick_near(address, strategies, None)
    }

    /// [`pick`](Self::pick), preferring the chosen agent's link on worker
    /// `near` (the caller's).
    pub fn pick_near(
        &mut self,
        address: &str,
        strategies: &[Strategy],
        near: Option<usize>,
    ) -> Option<H> {
        let host = dest_host(address);
        for s in strategies {
            let mut keys: Vec<u64> = match s {
                Strategy::DestHost => self.dest_host_candidates(host),
                Strategy::DefaultRoute => self
                    .entries
                    .iter()
                    .filter(|(_, e)| e.ids.default_route)
                    .map(|(k, _)| *k)
                    .collect(),
                Strategy::Default => self.entries.keys().copied().collect(),
            };
            if keys.is_empty() {
                continue;
            }
            keys.sort_unstable();
            if keys.iter().any(|k| !self.entries[k].draining) {
                keys.retain(|k| !self.entries[k].draining);
            }
            self.next_rr = self.next_rr.wrapping_add(1);
            let mut groups: Vec<Group<'_>> = keys.iter().map(|k| self.group(*k)).collect();
            groups.sort_unstable();
            groups.dedup();
            let chosen = groups[self.next_rr % groups.len()].clone();
            keys.retain(|k| self.group(*k) == chosen);
            if keys.iter().any(|k| Some(self.entries[k].core) == near) {
                keys.retain(|k| Some(self.entries[k].core) == near);
            }
            let key = keys[(self.next_rr / groups.len()) % keys.len()];
            return Some(self.entries[&key].handle.clone());
        }
        None
    }

    fn dest_host_candidates(&self, host: &str) -> Vec<u64> {
        let ip: Option<IpAddr> = host.parse().ok();
        let exact: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.ids.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
                    || ip.is_some_and(|ip| match ip {
                        IpAddr::V4(v4) => e.ids.ipv4.contains(&v4),
                        IpAddr::V6(v6) => e.ids.ipv6.contains(&v6),
                    })
            })
            .map(|(k, _)| *k)
            .collect();
        if !exact.is_empty() {
            return exact;
        }
        let Some(ip) = ip else { return exact };
        let mut best: Option<u8> = None;
        let mut keys = Vec::new();
        for (k, e) in &self.entries {
            for c in e.ids.cidrs.iter().filter(|c| c.contains(ip)) {
                match best {
                    Some(b) if c.prefix < b => {}
                    Some(b) if c.prefix == b => keys.push(*k),
                    _ => {
                        best = Some(c.prefix);
                        keys.clear();
                        keys.push(*k);
                    }
                }
            }
        }
        keys.dedup();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> Registry<&'static str> {
        let mut r = Registry::default();
        r.insert(
            1,
            "a".into(),
            Identifiers::parse("host=node1&ipv4=10.0.0.5").unwrap(),
            "a",
        );
        r.insert(
            2,
            "b".into(),
            Identifiers::parse("cidr=10.1.0.0/16").unwrap(),
            "b",
        );
        r.insert(
            3,
            "c".into(),
            Identifiers::parse("cidr=10.1.2.0/24").unwrap(),
            "c",
        );
        r.insert(
            4,
            "d".into(),
            Identifiers::parse("default-route=true").unwrap(),
            "d",
        );
        r
    }

    #[test]
    fn strips_ports() {
        assert_eq!(dest_host("node1:10250"), "node1");
        assert_eq!(dest_host("[fd00::1]:443"), "fd00::1");
        assert_eq!(dest_host("fd00::1"), "fd00::1");
        assert_eq!(dest_host("node1"), "node1");
    }

    #[test]
    fn dest_host_exact_then_longest_cidr() {
        let mut r = reg();
        let s = [Strategy::DestHost];
        assert_eq!(r.pick("node1:10250", &s), Some("a"));
        assert_eq!(r.pick("NODE1:1", &s), Some("a"));
        assert_eq!(r.pick("10.0.0.5:10250", &s), Some("a"));
        assert_eq!(r.pick("10.1.2.9:80", &s), Some("c"));
        assert_eq!(r.pick("10.1.3.9:80", &s), Some("b"));
        assert_eq!(r.pick("other:80", &s), None);
    }

    #[test]
    fn strategies_fall_through_in_order() {
        let mut r = reg();
        assert_eq!(
            r.pick("other:80", &[Strategy::DestHost, Strategy::DefaultRoute]),
            Some("d")
        );
        assert!(r.pick("other:80", &[Strategy::Default]).is_some());
        let mut empty: Registry<&str> = Registry::default();
        assert_eq!(empty.pick("x:1", &[Strategy::Default]), None);
    }

    #[test]
    fn balances_and_avoids_draining() {
        let mut r: Registry<u32> = Registry::default();
        for k in 0..3 {
            r.insert(
                k,
                format!("n{k}"),
                Identifiers::parse("host=same").unwrap(),
                k as u32,
            );
        }
        let mut seen = std::collections::HashSet::new();
        for _ in 0..6 {
            seen.insert(r.pick("same:1", &[Strategy::DestHost]).unwrap());
        }
        assert_eq!(seen.len(), 3);
        r.set_draining(0);
        r.set_draining(1);
        for _ in 0..6 {
            assert_eq!(r.pick("same:1", &[Strategy::DestHost]), Some(2));
        }
        r.set_draining(2);
        assert!(r.pick("same:1", &[Strategy::DestHost]).is_some());
        assert_eq!(r.remove(2), Some(2));
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn links_count_once_and_prefer_the_callers_worker() {
        let mut r: Registry<u32> = Registry::default();
        let ids = || Identifiers::parse("host=edge").unwrap();
        assert!(r.insert_link(1, "a".into(), ids(), 10, 0, Some("i1".into())));
        assert!(!r.insert_link(2, "a".into(), ids(), 11, 1, Some("i1".into())));
        // A Go agent with the same ID: an agent of its own.
        assert!(r.insert_link(3, "a".into(), ids(), 30, 0, None));
        assert_eq!((r.len(), r.links()), (2, 3));
        assert_eq!(r.linked_cores("a", "i1"), vec![0, 1]);
        let s = [Strategy::DestHost];
        let mut seen = std::collections::HashSet::new();
        for _ in 0..8 {
            let h = r.pick_near("edge:1", &s, Some(1)).unwrap();
            // The link agent always answers from worker 1 (handle 11).
            assert_ne!(h, 10);
            seen.insert(h);
        }
        assert_eq!(seen, [11, 30].into_iter().collect());
        // Without a preference both links serve.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..16 {
            seen.insert(r.pick("edge:1", &s).unwrap());
        }
        assert_eq!(seen, [10, 11, 30].into_iter().collect());
        assert_eq!(r.remove_link(2), Some((11, false)));
        assert!(r.pick_near("edge:1", &s, Some(1)).is_some());
        assert_eq!(r.remove_link(1), Some((10, true)));
        assert_eq!((r.len(), r.links()), (1, 1));
    }

    #[test]
    fn parses_strategy_lists() {
        assert_eq!(
            parse_strategies("destHost, defaultRoute,default").unwrap(),
            vec![
                Strategy::DestHost,
                Strategy::DefaultRoute,
                Strategy::Default
            ]
        );
        assert!(parse_strategies("bogus").is_err());
    }
}
