//! The agent's destination policy (sans-I/O): the `--allow-destinations` /
//! `--deny-destinations` entries, their parser, and the decision for one
//! resolved address.
//!
//! An entry is a CIDR with an optional port or port range:
//!
//! ```text
//! 10.0.0.0/8            every port of 10.0.0.0/8
//! 0.0.0.0/0:10250       port 10250 of every IPv4 address
//! 127.0.0.1/32:10255    one loopback port
//! 127.0.0.1:10266-10267 a bare address is a /32 (/128)
//! fd00::/8              IPv6 without a port: brackets optional
//! [fd00::/8]:1-1024     IPv6 with a port: brackets required
//! ```
//!
//! Host bits must be zero (`10.0.0.1/8` is refused); ports are 1-65535, a
//! range `lo-hi` with lo <= hi. IPv4-mapped IPv6 (`::ffff:a.b.c.d`, in
//! entries with a prefix of at least 96 and in addresses) counts as IPv4.
//!
//! The decision, for an address and port:
//! 1. an explicit deny entry that matches refuses;
//! 2. loopback (127.0.0.0/8, ::1), link-local (169.254.0.0/16, fe80::/10:
//!    cloud metadata) and unspecified (0.0.0.0, ::) addresses are refused
//!    unless an allow entry that matches lies inside that range
//!    (`127.0.0.1/32:10266` lifts it for one port, `0.0.0.0/0` does not);
//! 3. with an allow list, only what an entry matches is allowed.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// A bad `--allow-destinations` / `--deny-destinations` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("empty destination entry")]
    Empty,
    #[error("{0:?}: not an address or CIDR")]
    BadAddress(String),
    #[error("{0:?}: prefix length out of range")]
    BadPrefix(String),
    #[error("{entry:?}: host bits set (did you mean {network}?)")]
    HostBits { entry: String, network: String },
    #[error("{0:?}: port must be N or LO-HI with 1 <= LO <= HI <= 65535")]
    BadPort(String),
    #[error("{0:?}: an IPv6 entry with a port needs brackets, e.g. [fd00::/8]:443")]
    Unbracketed(String),
}

/// An IPv4 or IPv6 network; IPv4-mapped IPv6 is kept as IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    V4(u32, u8),
    V6(u128, u8),
}

impl Net {
    const fn v4(a: [u8; 4], prefix: u8) -> Net {
        Net::V4(u32::from_be_bytes(a), prefix)
    }

    fn contains(self, ip: IpAddr) -> bool {
        match (self, canonical(ip)) {
            (Net::V4(net, p), IpAddr::V4(a)) => u32::from(a) & mask32(p) == net,
            (Net::V6(net, p), IpAddr::V6(a)) => u128::from(a) & mask128(p) == net,
            _ => false,
        }
    }

    /// Whether all of `other` lies inside this network.
    fn covers(self, other: Net) -> bool {
        match (self, other) {
            (Net::V4(n, p), Net::V4(o, q)) => q >= p && o & mask32(p) == n,
            (Net::V6(n, p), Net::V6(o, q)) => q >= p && o & mask128(p) == n,
            _ => false,
        }
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Net::V4(a, p) => write!(f, "{}/{p}", Ipv4Addr::from(a)),
            Net::V6(a, p) => write!(f, "{}/{p}", Ipv6Addr::from(a)),
        }
    }
}

fn mask32(p: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(p)).unwrap_or(0)
}

fn mask128(p: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(p)).unwrap_or(0)
}

/// The address as the policy sees it: IPv4-mapped IPv6 becomes IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// One entry: a network and, optionally, an inclusive port range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub net: Net,
    pub ports: Option<(u16, u16)>,
}

impl Entry {
    pub fn matches(&self, addr: SocketAddr) -> bool {
        self.net.contains(addr.ip())
            && self
                .ports
                .is_none_or(|(lo, hi)| (lo..=hi).contains(&addr.port()))
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.net, self.ports) {
            (net, None) => write!(f, "{net}"),
            (Net::V4(..), Some(p)) => write!(f, "{}:{}", self.net, Ports(p)),
            (Net::V6(..), Some(p)) => write!(f, "[{}]:{}", self.net, Ports(p)),
        }
    }
}

struct Ports((u16, u16));

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            (lo, hi) if lo == hi => write!(f, "{lo}"),
            (lo, hi) => write!(f, "{lo}-{hi}"),
        }
    }
}

impl FromStr for Entry {
    type Err = EntryError;

    fn from_str(s: &str) -> Result<Self, EntryError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(EntryError::Empty);
        }
        let (cidr, ports) = if let Some(rest) = s.strip_prefix('[') {
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| EntryError::BadAddress(s.to_string()))?;
            match after {
                "" => (inner, None),
                _ => match after.strip_prefix(':') {
                    Some(p) => (inner, Some(p)),
                    None => return Err(EntryError::BadAddress(s.to_string())),
                },
            }
        } else if s.matches(':').count() > 1 {
            // Unbracketed IPv6: every colon belongs to the address.
            let port_like =
                s.contains('-') || s.split_once('/').is_some_and(|(_, p)| p.contains(':'));
            if port_like {
                return Err(EntryError::Unbracketed(s.to_string()));
            }
            (s, None)
        } else {
            match s.split_once(':') {
                Some((c, p)) => (c, Some(p)),
                None => (s, None),
            }
        };
        let net = parse_net(cidr, s)?;
        let ports = ports.map(|p| parse_ports(p, s)).transpose()?;
        Ok(Entry { net, ports })
    }
}

fn parse_net(cidr: &str, entry: &str) -> Result<Net, EntryError> {
    let (a, p) = match cidr.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (cidr, None),
    };
    let addr: IpAddr = a
        .parse()
        .map_err(|_| EntryError::BadAddress(entry.to_string()))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match p {
        None => max,
        // Digits only: u8::from_str would take "+8".
        Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => p
            .parse::<u8>()
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| EntryError::BadPrefix(entry.to_string()))?,
        Some(_) => return Err(EntryError::BadPrefix(entry.to_string())),
    };
    let net = match addr {
        IpAddr::V4(a) => Net::V4(u32::from(a), prefix),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) if prefix >= 96 => Net::V4(u32::from(v4), prefix - 96),
            _ => Net::V6(u128::from(a), prefix),
        },
    };
    let masked = match net {
        Net::V4(a, p) => Net::V4(a & mask32(p), p),
        Net::V6(a, p) => Net::V6(a & mask128(p), p),
    };
    if masked != net {
        return Err(EntryError::HostBits {
            entry: entry.to_string(),
            network: masked.to_string(),
        });
    }
    Ok(net)
}

fn parse_ports(p: &str, entry: &str) -> Result<(u16, u16), EntryError> {
    let bad = || EntryError::BadPort(entry.to_string());
    let one = |s: &str| -> Result<u16, EntryError> {
        if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<u16>().ok().filter(|&n| n > 0).ok_or_else(bad)
    };
    let (lo, hi) = match p.split_once('-') {
        Some((lo, hi)) => (one(lo)?, one(hi)?),
        None => {
            let n = one(p)?;
            (n, n)
        }
    };
    if lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// Parses a list of entries (each of them may itself be a comma list).
pub fn parse_list<S: AsRef<str>>(items: &[S]) -> Result<Vec<Entry>, EntryError> {
    items
        .iter()
        .flat_map(|s| s.as_ref().split(','))
        .map(str::parse)
        .collect()
}

/// Ranges refused unless an allow entry inside them lifts it.
const RESERVED: [(Net, &str); 6] = [
    (Net::v4([127, 0, 0, 0], 8), "loopback"),
    (Net::V6(1, 128), "loopback"),
    (Net::v4([169, 254, 0, 0], 16), "link-local"),
    (Net::V6(0xfe80 << 112, 10), "link-local"),
    (Net::v4([0, 0, 0, 0], 32), "unspecified"),
    (Net::V6(0, 128), "unspecified"),
];

/// Why a destination was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// An explicit `--deny-destinations` entry matched.
    Denied(Entry),
    /// A loopback, link-local or unspecified address no allow entry lifts.
    Reserved(&'static str),
    /// An allow list is given and no entry matched.
    NotAllowed,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Denied(e) => write!(f, "matches --deny-destinations {e}"),
            Refusal::Reserved(kind) => write!(
                f,
                "{kind} addresses are refused unless --allow-destinations lists them"
            ),
            Refusal::NotAllowed => write!(f, "not in --allow-destinations"),
        }
    }
}

/// The agent's policy: allow and deny entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub allow: Vec<Entry>,
    pub deny: Vec<Entry>,
}

impl Policy {
    pub fn new(allow: Vec<Entry>, deny: Vec<Entry>) -> Self {
        Self { allow, deny }
    }

    /// The decision for one resolved address.
    pub fn check(&self, addr: SocketAddr) -> Result<(), Refusal> {
        let addr = SocketAddr::new(canonical(addr.ip()), addr.port());
        if let Some(e) = self.deny.iter().find(|e| e.matches(addr)) {
            return Err(Refusal::Denied(*e));
        }
        let reserved = RESERVED.iter().find(|(net, _)| net.contains(addr.ip()));
        if self.allow.is_empty() {
            return match reserved {
                Some((_, kind)) => Err(Refusal::Reserved(kind)),
                None => Ok(()),
            };
        }
        let lifted = |e: &&Entry| reserved.is_none_or(|(net, _)| net.covers(e.net));
        match self.allow.iter().filter(|e| e.matches(addr)).find(lifted) {
            Some(_) => Ok(()),
            None => match reserved {
                Some((_, kind)) => Err(Refusal::Reserved(kind)),
                None => Err(Refusal::NotAllowed),
            },
        }
    }
}

/// The DIAL_RSP error for a refused dial of `dest` (as the server asked for
/// it) that resolved to `addr`.
pub fn refusal_message(dest: &str, addr: SocketAddr, why: &Refusal) -> String {
    let canon = SocketAddr::new(canonical(addr.ip()), addr.port());
    if dest == addr.to_string() || dest == canon.to_string() {
        format!("destination {dest} refused by agent policy: {why}")
    } else {
        format!("destination {dest} ({canon}) refused by agent policy: {why}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str) -> Entry {
        s.parse().unwrap_or_else(|err| panic!("{s}: {err}"))
    }

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn syntax() {
        for (input, shown) in [
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("0.0.0.0/0:10250", "0.0.0.0/0:10250"),
            ("[fd00::/8]:1-1024", "[fd00::/8]:1-1024"),
            ("127.0.0.1/32:10255", "127.0.0.1/32:10255"),
            ("127.0.0.1:10266-10267", "127.0.0.1/32:10266-10267"),
            ("fd00::/8", "fd00::/8"),
            ("[fd00::/8]", "fd00::/8"),
            ("::1", "::1/128"),
            ("[::1]:80", "[::1/128]:80"),
            (" 10.1.0.0/16 ", "10.1.0.0/16"),
            ("::ffff:127.0.0.0/104", "127.0.0.0/8"),
            ("[::ffff:169.254.169.254]:80", "169.254.169.254/32:80"),
            ("::/0", "::/0"),
            ("0.0.0.0/0:1-65535", "0.0.0.0/0:1-65535"),
        ] {
            let got = e(input);
            assert_eq!(got.to_string(), shown, "{input}");
            assert_eq!(e(shown), got, "round trip of {input}");
        }
        use EntryError::*;
        for (input, err) in [
            ("", Empty),
            ("   ", Empty),
            ("10.0.0.0/33", BadPrefix("10.0.0.0/33".into())),
            ("10.0.0.0/", BadPrefix("10.0.0.0/".into())),
            ("10.0.0.0/+8", BadPrefix("10.0.0.0/+8".into())),
            ("::/129", BadPrefix("::/129".into())),
            (
                "10.0.0.1/8",
                HostBits {
                    entry: "10.0.0.1/8".into(),
                    network: "10.0.0.0/8".into(),
                },
            ),
            ("10.0.0.0/8:0", BadPort("10.0.0.0/8:0".into())),
            ("10.0.0.0/8:", BadPort("10.0.0.0/8:".into())),
            ("10.0.0.0/8:65536", BadPort("10.0.0.0/8:65536".into())),
            ("10.0.0.0/8:20-10", BadPort("10.0.0.0/8:20-10".into())),
            ("10.0.0.0/8:+1", BadPort("10.0.0.0/8:+1".into())),
            ("10.0.0.0/8:1-2-3", BadPort("10.0.0.0/8:1-2-3".into())),
            ("fd00::/8:1-1024", Unbracketed("fd00::/8:1-1024".into())),
            ("fd00::/8:443", Unbracketed("fd00::/8:443".into())),
            ("example.com/8", BadAddress("example.com/8".into())),
            ("[fd00::/8", BadAddress("[fd00::/8".into())),
            ("[fd00::/8]x", BadAddress("[fd00::/8]x".into())),
            ("[fd00::/8]:", BadPort("[fd00::/8]:".into())),
        ] {
            assert_eq!(input.parse::<Entry>(), Err(err), "{input:?}");
        }
        assert_eq!(
            parse_list(&["10.0.0.0/8,127.0.0.1:80", "::1"]).unwrap(),
            [e("10.0.0.0/8"), e("127.0.0.1:80"), e("::1")]
        );
        assert_eq!(parse_list(&["10.0.0.0/8,"]), Err(Empty));
    }

    #[test]
    fn defaults_refuse_loopback_link_local_and_unspecified() {
        let p = Policy::default();
        for (dest, kind) in [
            ("127.0.0.1:80", "loopback"),
            ("127.255.0.9:80", "loopback"),
            ("[::1]:80", "loopback"),
            ("[::ffff:127.0.0.1]:80", "loopback"),
            ("169.254.169.254:80", "link-local"),
            ("[::ffff:169.254.169.254]:80", "link-local"),
            ("[fe80::1]:80", "link-local"),
            ("[febf::1]:80", "link-local"),
            ("0.0.0.0:80", "unspecified"),
            ("[::]:80", "unspecified"),
            ("[::ffff:0.0.0.0]:80", "unspecified"),
        ] {
            assert_eq!(p.check(a(dest)), Err(Refusal::Reserved(kind)), "{dest}");
        }
        for ok in [
            "10.0.0.5:10250",
            "8.8.8.8:53",
            "169.253.255.255:80",
            "[fd00::1]:80",
            "[fec0::1]:80",
            "[::2]:80",
            "128.0.0.1:80",
        ] {
            assert_eq!(p.check(a(ok)), Ok(()), "{ok}");
        }
    }

    #[test]
    fn allow_list_is_exclusive_and_lifts_only_from_inside() {
        let p = Policy::new(
            parse_list(&["0.0.0.0/0:10250", "127.0.0.1/32:10255", "[fd00::/8]:1-1024"]).unwrap(),
            Vec::new(),
        );
        assert_eq!(p.check(a("10.0.0.5:10250")), Ok(()));
        assert_eq!(p.check(a("10.0.0.5:10251")), Err(Refusal::NotAllowed));
        assert_eq!(p.check(a("127.0.0.1:10255")), Ok(()));
        assert_eq!(p.check(a("[::ffff:127.0.0.1]:10255")), Ok(()));
        // 0.0.0.0/0 matches, but does not lift the loopback refusal.
        assert_eq!(
            p.check(a("127.0.0.1:10250")),
            Err(Refusal::Reserved("loopback"))
        );
        assert_eq!(
            p.check(a("169.254.169.254:10250")),
            Err(Refusal::Reserved("link-local"))
        );
        assert_eq!(p.check(a("[fd00::1]:1024")), Ok(()));
        assert_eq!(p.check(a("[fd00::1]:1025")), Err(Refusal::NotAllowed));
        assert_eq!(
            p.check(a("[fe80::1]:80")),
            Err(Refusal::Reserved("link-local"))
        );
        // ::/0 is IPv6 only: a mapped address is IPv4.
        let v6 = Policy::new(parse_list(&["::/0"]).unwrap(), Vec::new());
        assert_eq!(
            v6.check(a("[::ffff:10.0.0.1]:80")),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(v6.check(a("[2001:db8::1]:80")), Ok(()));
        assert_eq!(v6.check(a("[::1]:80")), Err(Refusal::Reserved("loopback")));
        let lo = Policy::new(
            parse_list(&["127.0.0.0/8", "::1", "0.0.0.0"]).unwrap(),
            vec![],
        );
        assert_eq!(lo.check(a("127.0.0.2:1")), Ok(()));
        assert_eq!(lo.check(a("[::1]:1")), Ok(()));
        assert_eq!(lo.check(a("0.0.0.0:1")), Ok(()));
        assert_eq!(lo.check(a("[::]:1")), Err(Refusal::Reserved("unspecified")));
        let meta = Policy::new(parse_list(&["169.254.169.254/32:80"]).unwrap(), vec![]);
        assert_eq!(meta.check(a("169.254.169.254:80")), Ok(()));
    }

    #[test]
    fn explicit_deny_wins() {
        let p = Policy::new(
            parse_list(&["0.0.0.0/0", "127.0.0.0/8"]).unwrap(),
            parse_list(&["10.0.0.0/8:22", "127.0.0.1/32:9000-9100"]).unwrap(),
        );
        assert_eq!(
            p.check(a("10.1.2.3:22")),
            Err(Refusal::Denied(e("10.0.0.0/8:22")))
        );
        assert_eq!(p.check(a("10.1.2.3:23")), Ok(()));
        assert_eq!(
            p.check(a("[::ffff:127.0.0.1]:9050")),
            Err(Refusal::Denied(e("127.0.0.1/32:9000-9100")))
        );
        assert_eq!(p.check(a("127.0.0.1:8080")), Ok(()));
        // Deny without an allow list: everything else as by default.
        let d = Policy::new(Vec::new(), parse_list(&["192.168.0.0/16"]).unwrap());
        assert!(d.check(a("192.168.1.1:80")).is_err());
        assert_eq!(d.check(a("10.0.0.1:80")), Ok(()));
        assert!(d.check(a("127.0.0.1:80")).is_err());
    }

    #[test]
    fn messages() {
        let p = Policy::default();
        let why = p.check(a("169.254.169.254:80")).unwrap_err();
        assert_eq!(
            refusal_message("169.254.169.254:80", a("169.254.169.254:80"), &why),
            "destination 169.254.169.254:80 refused by agent policy: link-local addresses are refused unless --allow-destinations lists them"
        );
        let why = p.check(a("[::1]:8080")).unwrap_err();
        assert_eq!(
            refusal_message("localhost:8080", a("[::1]:8080"), &why),
            "destination localhost:8080 ([::1]:8080) refused by agent policy: loopback addresses are refused unless --allow-destinations lists them"
        );
        assert_eq!(
            Refusal::Denied(e("10.0.0.0/8:22")).to_string(),
            "matches --deny-destinations 10.0.0.0/8:22"
        );
    }
}
