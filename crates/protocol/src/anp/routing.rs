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
//!
//! [`Registry`] keeps indexes so that choosing an agent and (un)registering
//! one cost the same with 10 agents as with 10,000.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use super::agent_identifiers::Identifiers;

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

impl<H> Entry<H> {
    fn group(&self, key: u64) -> GroupKey {
        match &self.instance {
            Some(i) => GroupKey::Instance(self.agent_id.clone(), i.clone()),
            None => GroupKey::Single(key),
        }
    }
}

/// Connections of one agent: the links of one instance, or a connection
/// of its own (agents that do not speak links).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum GroupKey {
    Instance(String, String),
    Single(u64),
}

/// The set of connected agents, keyed by a server-chosen connection key
/// (one agent may hold several connections).
///
/// Every operation on the dial path and on (un)registration is O(1) in the
/// number of agents, or O(k) in the number of candidates a strategy yields
/// (a fleet of 10,000 edge nodes must not make each dial or each
/// reconnection scan them all): indexes by host name, by announced IP, of
/// the agents announcing CIDRs or `default-route`, and of the groups (an
/// agent's links) in round-robin order.
pub struct Registry<H> {
    entries: HashMap<u64, Entry<H>>,
    /// The connections of each agent (group).
    groups: HashMap<GroupKey, Vec<u64>>,
    /// Every group once, for round-robin over all agents: `order[i]`'s
    /// position is `pos[&order[i]] == i` (removal swaps the last in).
    order: Vec<GroupKey>,
    pos: HashMap<GroupKey, usize>,
    /// Connections by announced host (ASCII-lowercased).
    by_host: HashMap<String, BTreeSet<u64>>,
    /// Connections by announced `ipv4` / `ipv6` identifier.
    by_ip: HashMap<IpAddr, BTreeSet<u64>>,
    /// Connections that announced at least one CIDR.
    with_cidrs: BTreeSet<u64>,
    /// Connections that announced `default-route=true`.
    default_route: BTreeSet<u64>,
    next_rr: usize,
}

impl<H> Default for Registry<H> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            groups: HashMap::new(),
            order: Vec::new(),
            pos: HashMap::new(),
            by_host: HashMap::new(),
            by_ip: HashMap::new(),
            with_cidrs: BTreeSet::new(),
            default_route: BTreeSet::new(),
            next_rr: 0,
        }
    }
}

fn announced_ips(ids: &Identifiers) -> impl Iterator<Item = IpAddr> + '_ {
    ids.ipv4
        .iter()
        .map(|a| IpAddr::V4(*a))
        .chain(ids.ipv6.iter().map(|a| IpAddr::V6(*a)))
}

fn unindex<K: std::hash::Hash + Eq>(map: &mut HashMap<K, BTreeSet<u64>>, k: &K, key: u64) {
    if let Some(set) = map.get_mut(k) {
        set.remove(&key);
        if set.is_empty() {
            map.remove(k);
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
        // A key is registered once; a second insert replaces the first.
        self.remove_link(key);
        let entry = Entry {
            agent_id,
            ids,
            draining: false,
            handle,
            core,
            instance,
        };
        for h in &entry.ids.hosts {
            self.by_host
                .entry(h.to_ascii_lowercase())
                .or_default()
                .insert(key);
        }
        for ip in announced_ips(&entry.ids) {
            self.by_ip.entry(ip).or_default().insert(key);
        }
        if !entry.ids.cidrs.is_empty() {
            self.with_cidrs.insert(key);
        }
        if entry.ids.default_route {
            self.default_route.insert(key);
        }
        let group = entry.group(key);
        self.entries.insert(key, entry);
        let links = self.groups.entry(group.clone()).or_default();
        links.push(key);
        let first = links.len() == 1;
        if first {
            self.pos.insert(group.clone(), self.order.len());
            self.order.push(group);
        }
        first
    }

    /// The workers holding links of `agent_id`'s `instance`.
    pub fn linked_cores(&self, agent_id: &str, instance: &str) -> Vec<usize> {
        let group = GroupKey::Instance(agent_id.to_string(), instance.to_string());
        let mut cores: Vec<usize> = self
            .groups
            .get(&group)
            .into_iter()
            .flatten()
            .map(|k| self.entries[k].core)
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
        for h in &e.ids.hosts {
            unindex(&mut self.by_host, &h.to_ascii_lowercase(), key);
        }
        for ip in announced_ips(&e.ids) {
            unindex(&mut self.by_ip, &ip, key);
        }
        self.with_cidrs.remove(&key);
        self.default_route.remove(&key);
        let group = e.group(key);
        let last = match self.groups.get_mut(&group) {
            Some(links) => {
                links.retain(|k| *k != key);
                links.is_empty()
            }
            None => true,
        };
        if last {
            self.groups.remove(&group);
            if let Some(i) = self.pos.remove(&group) {
                self.order.swap_remove(i);
                if let Some(moved) = self.order.get(i) {
                    self.pos.insert(moved.clone(), i);
                }
            }
        }
        Some((e.handle, last))
    }

    pub fn set_draining(&mut self, key: u64) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.draining = true;
        }
    }

    /// Agents registered (an agent with several links counts once).
    pub fn len(&self) -> usize {
        self.groups.len()
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
    pub fn addresses(&self) -> BTreeSet<IpAddr> {
        self.by_ip.keys().copied().collect()
    }

    /// Node names (host identifiers) connected agents announced.
    pub fn hosts(&self) -> BTreeSet<String> {
        self.entries
            .values()
            .flat_map(|e| e.ids.hosts.iter().cloned())
            .collect()
    }

    /// The first address announced by an agent with host identifier `host`
    /// (of the oldest such connection).
    pub fn address_of_host(&self, host: &str) -> Option<IpAddr> {
        self.by_host
            .get(&host.to_ascii_lowercase())?
            .iter()
            .find_map(|k| announced_ips(&self.entries[k].ids).next())
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
            let keys: Vec<u64> = match s {
                Strategy::DestHost => self.dest_host_candidates(host),
                Strategy::DefaultRoute => self.default_route.iter().copied().collect(),
                Strategy::Default => match self.pick_any(near) {
                    Some(h) => return Some(h),
                    None => continue,
                },
            };
            if let Some(h) = self.pick_among(keys, near) {
                return Some(h);
            }
        }
        None
    }

    /// Round-robin over the agents among `keys` (few: a strategy's
    /// candidates), not draining ones when there are others.
    fn pick_among(&mut self, mut keys: Vec<u64>, near: Option<usize>) -> Option<H> {
        if keys.is_empty() {
            return None;
        }
        keys.sort_unstable();
        if keys.iter().any(|k| !self.entries[k].draining) {
            keys.retain(|k| !self.entries[k].draining);
        }
        self.next_rr = self.next_rr.wrapping_add(1);
        let mut groups: Vec<GroupKey> = keys.iter().map(|k| self.entries[k].group(*k)).collect();
        groups.sort_unstable();
        groups.dedup();
        let chosen = groups[self.next_rr % groups.len()].clone();
        keys.retain(|k| self.entries[k].group(*k) == chosen);
        self.pick_link(keys, groups.len(), near)
    }

    /// Of one agent's `keys` (one or a few links), the one on worker
    /// `near` when there is one, else round-robin.
    fn pick_link(&self, mut keys: Vec<u64>, spread: usize, near: Option<usize>) -> Option<H> {
        if keys.iter().any(|k| Some(self.entries[k].core) == near) {
            keys.retain(|k| Some(self.entries[k].core) == near);
        }
        let key = *keys.get((self.next_rr / spread.max(1)) % keys.len().max(1))?;
        Some(self.entries[&key].handle.clone())
    }

    /// Round-robin over every agent (the `default` strategy) without
    /// looking at all of them: the next group in [`Registry::order`] with
    /// a link that is not draining (the first one tried when all drain).
    fn pick_any(&mut self, near: Option<usize>) -> Option<H> {
        if self.order.is_empty() {
            return None;
        }
        self.next_rr = self.next_rr.wrapping_add(1);
        let n = self.order.len();
        let start = self.next_rr % n;
        let live = |links: &Vec<u64>| -> Vec<u64> {
            links
                .iter()
                .copied()
                .filter(|k| !self.entries[k].draining)
                .collect()
        };
        let mut chosen = None;
        for i in 0..n {
            let links = &self.groups[&self.order[(start + i) % n]];
            let up = live(links);
            if !up.is_empty() {
                chosen = Some(up);
                break;
            }
        }
        let keys = chosen.unwrap_or_else(|| self.groups[&self.order[start]].clone());
        self.pick_link(keys, n, near)
    }

    fn dest_host_candidates(&self, host: &str) -> Vec<u64> {
        let ip: Option<IpAddr> = host.parse().ok();
        let mut exact: BTreeSet<u64> = self
            .by_host
            .get(&host.to_ascii_lowercase())
            .cloned()
            .unwrap_or_default();
        if let Some(set) = ip.and_then(|ip| self.by_ip.get(&ip)) {
            exact.extend(set.iter().copied());
        }
        if !exact.is_empty() {
            return exact.into_iter().collect();
        }
        let Some(ip) = ip else { return Vec::new() };
        let mut best: Option<u8> = None;
        let mut keys = Vec::new();
        for k in &self.with_cidrs {
            for c in self.entries[k].ids.cidrs.iter().filter(|c| c.contains(ip)) {
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

    /// A fleet: 10,000 agents register (the registration reads the agent
    /// count each time, as the server does), every one is dialled by name
    /// and by address, half leave. Each step is O(1) in the fleet's size;
    /// before the indexes, each registration counted the agents by sorting
    /// them all and each dial scanned them all (minutes here, in a debug
    /// build).
    #[test]
    fn a_fleet_of_ten_thousand_routes_by_index() {
        const N: u64 = 10_000;
        let t0 = std::time::Instant::now();
        let mut r: Registry<u64> = Registry::default();
        let ids = |k: u64| {
            Identifiers::parse(&format!(
                "host=Node-{k}&ipv4=10.{}.{}.{}",
                k >> 16,
                (k >> 8) & 255,
                k & 255
            ))
            .unwrap()
        };
        for k in 0..N {
            // Half speak links (two each), half are Go agents.
            let instance = (k % 2 == 0).then(|| format!("i{k}"));
            assert!(r.insert_link(k * 2, format!("a{k}"), ids(k), k, 0, instance.clone()));
            if instance.is_some() {
                assert!(!r.insert_link(k * 2 + 1, format!("a{k}"), ids(k), k, 1, instance));
            }
            assert_eq!(r.len() as u64, k + 1);
        }
        assert_eq!(r.links() as u64, N + N / 2);
        let s = [Strategy::DestHost, Strategy::Default];
        for k in 0..N {
            assert_eq!(r.pick(&format!("node-{k}:10250"), &s), Some(k));
            let ip = format!("10.{}.{}.{}:1", k >> 16, (k >> 8) & 255, k & 255);
            assert_eq!(r.pick_near(&ip, &s, Some(1)), Some(k));
        }
        assert_eq!(
            r.address_of_host("NODE-258"),
            Some("10.0.1.2".parse().unwrap())
        );
        // `default` spreads over agents, not links.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..N {
            seen.insert(r.pick("elsewhere:1", &[Strategy::Default]).unwrap());
        }
        assert_eq!(seen.len() as u64, N);
        for k in (0..N).filter(|k| k % 4 < 2) {
            let mut last_of = |key| r.remove_link(key).map(|(_, last)| last);
            if k % 2 == 0 {
                assert_eq!(last_of(k * 2), Some(false));
                assert_eq!(last_of(k * 2 + 1), Some(true));
            } else {
                assert_eq!(last_of(k * 2), Some(true));
            }
        }
        assert_eq!(r.len() as u64, N / 2);
        assert_eq!(r.pick("node-1:1", &[Strategy::DestHost]), None);
        assert_eq!(r.pick("node-3:1", &[Strategy::DestHost]), Some(3));
        assert_eq!(r.addresses().len() as u64, N / 2);
        for k in 0..N * 2 + 2 {
            r.remove(k);
        }
        assert!(r.is_empty() && r.by_host.is_empty() && r.by_ip.is_empty());
        assert!(r.order.is_empty() && r.pos.is_empty() && r.groups.is_empty());
        assert_eq!(r.pick("x:1", &[Strategy::Default]), None);
        let took = t0.elapsed();
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }

    #[test]
    fn default_skips_draining_agents_and_falls_back_to_them() {
        let mut r: Registry<u32> = Registry::default();
        for k in 0..4 {
            r.insert(k, format!("n{k}"), Identifiers::default(), k as u32);
        }
        r.set_draining(0);
        r.set_draining(2);
        for _ in 0..8 {
            let h = r.pick("x:1", &[Strategy::Default]).unwrap();
            assert!(h == 1 || h == 3, "{h}");
        }
        r.set_draining(1);
        r.set_draining(3);
        assert!(r.pick("x:1", &[Strategy::Default]).is_some());
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
