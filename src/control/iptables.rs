//! The iptables rules that send kubelet traffic for edge nodes to the tunnel
//! server, planned sans-I/O (yurt-tunnel's layout, in our own chains):
//!
//! ```text
//! -A OUTPUT -p tcp -m comment --comment "edgetunnel: kubelet ports" -j TUNNEL-PORT
//! -A TUNNEL-PORT -p tcp --dport 10250 -j TUNNEL-PORT-10250
//! -A TUNNEL-PORT-10250 -d 127.0.0.0/8 -j RETURN            (loopback)
//! -A TUNNEL-PORT-10250 -d 10.0.0.7/32 -j RETURN            (a Ready node without agent)
//! -A TUNNEL-PORT-10250 -p tcp -j DNAT --to-destination 10.0.0.2:10263
//! ```
//!
//! or, standalone (no node list), a DNAT per edge node address instead of the
//! RETURN-then-DNAT-all tail. Rendering produces `iptables-restore --noflush`
//! input from the desired plan and the current `iptables-save` text, so a
//! sync is one atomic transaction that never duplicates a rule, repairs
//! chains deleted by hand and removes chains of ports no longer wanted.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

pub const JUMP_CHAIN: &str = "TUNNEL-PORT";
pub const JUMP_COMMENT: &str = "edgetunnel: kubelet ports";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    pub fn save_cmd(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }

    pub fn restore_cmd(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }

    fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.0/8",
            Family::V6 => "::1/128",
        }
    }

    fn host_prefix(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// Which destinations a port's chain sends to the tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Everything except these addresses (Ready nodes reachable directly,
    /// i.e. with no agent) and loopback: yurt-tunnel's layout.
    AllExcept(BTreeSet<IpAddr>),
    /// Only these addresses (edge nodes known from agents' identifiers).
    Only(BTreeSet<IpAddr>),
}

/// One intercepted port and where its traffic goes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortRule {
    pub port: u16,
    pub to: SocketAddr,
}

/// The desired rules of one address family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub family: Family,
    pub ports: Vec<PortRule>,
    pub scope: Scope,
}

impl Plan {
    fn chain(port: u16) -> String {
        format!("{JUMP_CHAIN}-{port}")
    }

    /// Addresses of this family in the scope.
    fn scoped(&self) -> impl Iterator<Item = &IpAddr> {
        let set = match &self.scope {
            Scope::AllExcept(s) | Scope::Only(s) => s,
        };
        set.iter().filter(move |ip| Family::of(ip) == self.family)
    }

    /// The chains this plan owns.
    pub fn chains(&self) -> Vec<String> {
        let mut v = vec![JUMP_CHAIN.to_string()];
        v.extend(self.ports.iter().map(|p| Self::chain(p.port)));
        v
    }
}

/// What matters of the current `iptables-save -t nat` output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Current {
    /// Our chains present (`TUNNEL-PORT` and `TUNNEL-PORT-*`).
    pub chains: BTreeSet<String>,
    /// OUTPUT rules jumping to `TUNNEL-PORT`, as written by iptables-save
    /// (after `-A `).
    pub jumps: Vec<String>,
}

/// Parses the nat table of `iptables-save` output.
pub fn parse_save(text: &str) -> Current {
    let mut cur = Current::default();
    let mut in_nat = false;
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(table) = line.strip_prefix('*') {
            in_nat = table == "nat";
            continue;
        }
        if !in_nat {
            continue;
        }
        if line == "COMMIT" {
            in_nat = false;
        } else if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or("");
            if is_ours(name) {
                cur.chains.insert(name.to_string());
            }
        } else if let Some(rule) = line.strip_prefix("-A OUTPUT ") {
            let words: Vec<&str> = rule.split_whitespace().collect();
            if words.windows(2).any(|w| w == ["-j", JUMP_CHAIN]) {
                cur.jumps.push(rule.to_string());
            }
        }
    }
    cur
}

fn is_ours(chain: &str) -> bool {
    chain == JUMP_CHAIN
        || chain
            .strip_prefix(JUMP_CHAIN)
            .and_then(|r| r.strip_prefix('-'))
            .is_some_and(|p| p.parse::<u16>().is_ok())
}

fn dnat_target(to: SocketAddr) -> String {
    match to {
        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

const JUMP_RULE: &str = "-p tcp -m comment --comment \"edgetunnel: kubelet ports\" -j TUNNEL-PORT";

/// `iptables-restore --noflush` input that turns `current` into `plan`.
pub fn render_sync(plan: &Plan, current: &Current) -> String {
    let mut out = String::from("*nat\n");
    let wanted = plan.chains();
    // Declaring a chain creates it or, under --noflush, empties it.
    for c in &wanted {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    let stale: Vec<&String> = current
        .chains
        .iter()
        .filter(|c| !wanted.contains(c))
        .collect();
    for c in &stale {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    for p in &plan.ports {
        let _ = writeln!(
            out,
            "-A {JUMP_CHAIN} -p tcp -m tcp --dport {} -j {}",
            p.port,
            Plan::chain(p.port)
        );
    }
    let bits = plan.family.host_prefix();
    for p in &plan.ports {
        let chain = Plan::chain(p.port);
        let to = dnat_target(p.to);
        match &plan.scope {
            Scope::AllExcept(_) => {
                let _ = writeln!(out, "-A {chain} -d {} -j RETURN", plan.family.loopback());
                for ip in plan.scoped() {
                    let _ = writeln!(out, "-A {chain} -d {ip}/{bits} -j RETURN");
                }
                let _ = writeln!(out, "-A {chain} -p tcp -j DNAT --to-destination {to}");
            }
            Scope::Only(_) => {
                for ip in plan.scoped() {
                    let _ = writeln!(
                        out,
                        "-A {chain} -d {ip}/{bits} -p tcp -j DNAT --to-destination {to}"
                    );
                }
            }
        }
    }
    for c in &stale {
        let _ = writeln!(out, "-X {c}");
    }
    // Exactly one jump from OUTPUT: add it when missing, drop duplicates.
    match current.jumps.len() {
        0 => {
            let _ = writeln!(out, "-I OUTPUT 1 {JUMP_RULE}");
        }
        n => {
            for extra in &current.jumps[1..n] {
                let _ = writeln!(out, "-D OUTPUT {extra}");
            }
        }
    }
    out.push_str("COMMIT\n");
    out
}

/// `iptables-restore --noflush` input that removes every rule and chain of
/// ours present in `current`.
pub fn render_cleanup(current: &Current) -> String {
    let mut out = String::from("*nat\n");
    for c in &current.chains {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    for j in &current.jumps {
        let _ = writeln!(out, "-D OUTPUT {j}");
    }
    // Per-port chains first: TUNNEL-PORT is emptied above, so nothing
    // refers to them any more.
    for c in current.chains.iter().filter(|c| c.as_str() != JUMP_CHAIN) {
        let _ = writeln!(out, "-X {c}");
    }
    if current.chains.contains(JUMP_CHAIN) {
        let _ = writeln!(out, "-X {JUMP_CHAIN}");
    }
    out.push_str("COMMIT\n");
    out
}

/// Destinations whose NAT decision changed between two plans, as
/// (address, port) pairs for `conntrack -D --orig-dst A -p tcp --orig-port-dst P`,
/// so that existing flows follow the new rules.
pub fn conntrack_flushes(old: Option<&Plan>, new: &Plan) -> Vec<(IpAddr, u16)> {
    let Some(old) = old else {
        return Vec::new();
    };
    let set = |p: &Plan| -> BTreeSet<IpAddr> { p.scoped().copied().collect() };
    let (a, b) = (set(old), set(new));
    let changed: BTreeSet<IpAddr> = a.symmetric_difference(&b).copied().collect();
    let mut ports: BTreeSet<u16> = old.ports.iter().map(|p| p.port).collect();
    ports.extend(new.ports.iter().map(|p| p.port));
    // A port whose DNAT target moved changes every flow on it; that is rare
    // (a restart with new flags) and handled by the caller flushing the port.
    let mut out = Vec::new();
    for ip in &changed {
        for port in &ports {
            out.push((*ip, *port));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(scope: Scope) -> Plan {
        Plan {
            family: Family::V4,
            ports: vec![
                PortRule {
                    port: 10250,
                    to: "10.0.0.2:10263".parse().unwrap(),
                },
                PortRule {
                    port: 10255,
                    to: "10.0.0.2:10264".parse().unwrap(),
                },
            ],
            scope,
        }
    }

    fn ips(v: &[&str]) -> BTreeSet<IpAddr> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    const SAVED: &str = "# Generated\n*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j TUNNEL-PORT\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:TUNNEL-PORT - [0:0]\n:TUNNEL-PORT-10250 - [0:0]\n:TUNNEL-PORT-9999 - [0:0]\n:OTHER - [0:0]\n-A OUTPUT -p tcp -m comment --comment \"edgetunnel: kubelet ports\" -j TUNNEL-PORT\n-A OUTPUT -p tcp -m comment --comment \"edgetunnel: kubelet ports\" -j TUNNEL-PORT\n-A OUTPUT -j OTHER\nCOMMIT\n";

    #[test]
    fn parses_only_our_nat_state() {
        let c = parse_save(SAVED);
        assert_eq!(
            c.chains,
            ["TUNNEL-PORT", "TUNNEL-PORT-10250", "TUNNEL-PORT-9999"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        );
        assert_eq!(c.jumps.len(), 2);
    }

    #[test]
    fn sync_from_scratch_adds_the_jump_once() {
        let out = render_sync(
            &plan(Scope::AllExcept(ips(&["10.0.0.7", "fd00::1"]))),
            &Current::default(),
        );
        assert!(out.contains(":TUNNEL-PORT-10255 - [0:0]\n"));
        assert!(out.contains("-A TUNNEL-PORT -p tcp -m tcp --dport 10250 -j TUNNEL-PORT-10250\n"));
        assert!(out.contains("-A TUNNEL-PORT-10250 -d 127.0.0.0/8 -j RETURN\n"));
        assert!(out.contains("-A TUNNEL-PORT-10250 -d 10.0.0.7/32 -j RETURN\n"));
        assert!(!out.contains("fd00::1"), "other family leaked: {out}");
        assert!(
            out.contains("-A TUNNEL-PORT-10255 -p tcp -j DNAT --to-destination 10.0.0.2:10264\n")
        );
        assert_eq!(out.matches("-I OUTPUT 1").count(), 1);
        assert!(out.ends_with("COMMIT\n"));
    }

    #[test]
    fn sync_over_existing_state_drops_duplicates_and_stale_chains() {
        let out = render_sync(&plan(Scope::Only(ips(&["10.99.0.5"]))), &parse_save(SAVED));
        assert!(!out.contains("-I OUTPUT"));
        assert_eq!(out.matches("-D OUTPUT").count(), 1);
        assert!(out.contains("-X TUNNEL-PORT-9999\n"));
        assert!(!out.contains("-X TUNNEL-PORT-10250"));
        assert!(out.contains(
            "-A TUNNEL-PORT-10250 -d 10.99.0.5/32 -p tcp -j DNAT --to-destination 10.0.0.2:10263\n"
        ));
    }

    #[test]
    fn cleanup_removes_everything_of_ours() {
        let out = render_cleanup(&parse_save(SAVED));
        assert_eq!(out.matches("-D OUTPUT").count(), 2);
        assert!(out.contains("-X TUNNEL-PORT-9999\n") && out.contains("-X TUNNEL-PORT\n"));
        assert!(!out.contains("OTHER"));
        let x = out.find("-X TUNNEL-PORT\n").unwrap();
        assert!(out.find("-X TUNNEL-PORT-10250").unwrap() < x);
    }

    #[test]
    fn ipv6_targets_are_bracketed() {
        let p = Plan {
            family: Family::V6,
            ports: vec![PortRule {
                port: 10250,
                to: "[fd00::2]:10263".parse().unwrap(),
            }],
            scope: Scope::Only(ips(&["fd00::5", "10.0.0.1"])),
        };
        let out = render_sync(&p, &Current::default());
        assert!(
            out.contains("-d fd00::5/128 -p tcp -j DNAT --to-destination [fd00::2]:10263"),
            "{out}"
        );
        assert!(!out.contains("10.0.0.1"));
    }

    #[test]
    fn conntrack_follows_changed_addresses() {
        let a = plan(Scope::Only(ips(&["10.0.0.5", "10.0.0.6"])));
        let b = plan(Scope::Only(ips(&["10.0.0.6", "10.0.0.8"])));
        let f = conntrack_flushes(Some(&a), &b);
        assert_eq!(f.len(), 4);
        assert!(f.contains(&("10.0.0.5".parse().unwrap(), 10250)));
        assert!(f.contains(&("10.0.0.8".parse().unwrap(), 10255)));
        assert!(conntrack_flushes(None, &b).is_empty());
    }
}
