//! The agent's server count from leases (`--count-server-leases`), as
//! ANP's agent does it: the leases in `--lease-namespace` that match
//! `--lease-label-selector` and are valid now (renewTime + duration after
//! now, see [`super::server_lease::is_valid`]) are counted; none counts as
//! 1, and before any successful list the last good count (initially 1)
//! stands. `--server-count-source default` then uses the lease count
//! alone, `max` the larger of it and the count the servers report.
//!
//! The control thread lists the namespace's leases every `poll` and
//! recounts every second against the clock (a lease expires without any
//! API event); the data plane reads the count from an atomic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::Client;

use super::server_lease::is_valid;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A Kubernetes label selector (`a=b,c!=d,e in (f,g),h notin (i),j,!k`;
/// `==` is `=`); empty matches everything.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selector(Vec<Req>);

fn valid_token(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(s: &str) -> bool {
    s.is_empty() || valid_token(s)
}

impl Selector {
    pub fn parse(s: &str) -> Result<Selector, String> {
        // Split on commas outside parentheses.
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0i32, 0usize);
        for (i, c) in s.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&s[start..]);
        if parts.len() == 1 && parts[0].trim().is_empty() {
            return Ok(Selector::default());
        }
        let bad = |p: &str| format!("invalid label selector {s:?}: {p:?}");
        let mut reqs = Vec::new();
        for part in parts {
            let p = part.trim();
            let req = if let Some(k) = p.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                Req::Ne(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some(open) = p.find('(') {
                let list = p[open..]
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| bad(p))?;
                let values: Vec<String> = list.split(',').map(|v| v.trim().to_string()).collect();
                let mut head = p[..open].split_whitespace();
                let (k, op) = (head.next().ok_or_else(|| bad(p))?, head.next());
                if head.next().is_some() || values.iter().any(|v| !valid_value(v)) {
                    return Err(bad(p));
                }
                match op {
                    Some("in") => Req::In(k.to_string(), values),
                    Some("notin") => Req::NotIn(k.to_string(), values),
                    _ => return Err(bad(p)),
                }
            } else {
                Req::Exists(p.to_string())
            };
            let ok = match &req {
                Req::Eq(k, v) | Req::Ne(k, v) => valid_token(k) && valid_value(v),
                Req::In(k, _) | Req::NotIn(k, _) | Req::Exists(k) | Req::NotExists(k) => {
                    valid_token(k)
                }
            };
            if !ok {
                return Err(bad(p));
            }
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::Ne(k, v) => labels.get(k) != Some(v),
            Req::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// `--server-count-source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CountSource {
    /// The lease count alone when counting leases, else the servers'.
    #[default]
    Default,
    /// The larger of the two.
    Max,
}

impl CountSource {
    pub fn parse(s: &str) -> Result<CountSource, String> {
        match s {
            "" | "default" => Ok(CountSource::Default),
            "max" => Ok(CountSource::Max),
            other => Err(format!(
                "--server-count-source must be one of '', 'default', 'max', got {other}"
            )),
        }
    }
}

/// The number of server connections to keep: `leases` is the lease count
/// (None: not counting leases), `reported` the last `serverCount` a server
/// sent (0: none yet). Never below 1.
pub fn combine(source: CountSource, leases: Option<usize>, reported: usize) -> usize {
    let n = match (leases, source) {
        (None, _) => reported,
        (Some(l), CountSource::Default) => l,
        (Some(l), CountSource::Max) => l.max(reported),
    };
    n.max(1)
}

/// Counts the valid leases among `leases` matching `selector` at `now`,
/// keeping ANP's fallback: none counts as 1, and `None` (no list yet)
/// gives the last count.
#[derive(Debug)]
pub struct Counter {
    fallback: usize,
}

impl Default for Counter {
    fn default() -> Self {
        Counter { fallback: 1 }
    }
}

impl Counter {
    pub fn count(
        &mut self,
        leases: Option<&[Lease]>,
        selector: &Selector,
        now: Timestamp,
    ) -> usize {
        let Some(leases) = leases else {
            return self.fallback;
        };
        let empty = BTreeMap::new();
        let n = leases
            .iter()
            .filter(|l| selector.matches(l.metadata.labels.as_ref().unwrap_or(&empty)))
            .filter(|l| is_valid(l.spec.as_ref(), now))
            .count()
            .max(1);
        self.fallback = n;
        n
    }
}

/// What the agent's lease counting is told, and where the count goes.
#[derive(Debug, Clone)]
pub struct LeaseCountSpec {
    pub namespace: String,
    pub selector: Selector,
    pub source: CountSource,
    /// How often the leases are listed (the count is judged every second).
    pub poll: Duration,
    /// The current lease count (1 until known), read by the data plane.
    pub count: Arc<AtomicUsize>,
}

impl LeaseCountSpec {
    pub fn new(namespace: &str, selector: Selector, source: CountSource, poll: Duration) -> Self {
        LeaseCountSpec {
            namespace: namespace.to_string(),
            selector,
            source,
            poll,
            count: Arc::new(AtomicUsize::new(1)),
        }
    }

    /// The connections to keep given a server-reported count (0: none).
    pub fn wanted(&self, reported: usize) -> usize {
        combine(
            self.source,
            Some(self.count.load(Ordering::Relaxed)),
            reported,
        )
    }
}

/// Lists and counts until the runtime stops.
pub async fn run(client: Client, spec: LeaseCountSpec) {
    let api: Api<Lease> = Api::namespaced(client, &spec.namespace);
    let mut counter = Counter::default();
    let mut leases: Option<Vec<Lease>> = None;
    let mut listed: Option<Instant> = None;
    loop {
        if listed.is_none_or(|t| t.elapsed() >= spec.poll) {
            listed = Some(Instant::now());
            match api.list(&ListParams::default()).await {
                // Like ANP's informer: a failed list keeps the last one.
                Ok(l) => leases = Some(l.items),
                Err(e) => {
                    tracing::warn!(namespace = %spec.namespace, "listing leases to count servers: {e}")
                }
            }
        }
        let n = counter.count(leases.as_deref(), &spec.selector, Timestamp::now());
        let old = spec.count.swap(n, Ordering::Relaxed);
        if old != n {
            tracing::info!(servers = n, was = old, "server count from leases");
        }
        tokio::time::sleep(Duration::from_secs(1).min(spec.poll)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::server_lease::{new_lease, parse_labels, ServerLeaseSpec};

    fn labels(s: &str) -> BTreeMap<String, String> {
        parse_labels(s).unwrap()
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        let l = labels("k8s-app=konnectivity-server,tier=control");
        let yes = [
            "",
            "k8s-app=konnectivity-server",
            "k8s-app==konnectivity-server",
            "k8s-app = konnectivity-server , tier",
            "tier in (control, x)",
            "tier notin (edge)",
            "!absent",
            "k8s-app!=other",
            "absent!=x",
        ];
        for s in yes {
            assert!(Selector::parse(s).unwrap().matches(&l), "{s}");
        }
        let no = [
            "k8s-app=other",
            "absent",
            "!tier",
            "tier in (edge)",
            "tier notin (control)",
            "absent in (x)",
        ];
        for s in no {
            assert!(!Selector::parse(s).unwrap().matches(&l), "{s}");
        }
        for bad in ["a in b", "a in (b", "a=b c", "=x", "a foo (b)", "a,,b"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn counting_keeps_anps_fallbacks() {
        let t = |s: &str| -> Timestamp { s.parse().unwrap() };
        let now = t("2026-12-03T00:01:00Z");
        let spec = |id: &str| {
            ServerLeaseSpec::new("kube-system", labels("k8s-app=konnectivity-server"), id)
        };
        let live = |id: &str| new_lease(&spec(id), t("2026-12-03T00:00:45Z"));
        let dead = new_lease(&spec("d"), t("2026-12-03T00:00:10Z"));
        let mut other = live("o");
        other.metadata.labels = Some(labels("k8s-app=other"));
        let sel = Selector::parse("k8s-app=konnectivity-server").unwrap();
        let mut c = Counter::default();
        assert_eq!(c.count(None, &sel, now), 1);
        let all = vec![live("a"), live("b"), live("c"), dead, other];
        assert_eq!(c.count(Some(&all), &sel, now), 3);
        // A failed list (no new list) keeps the last good count.
        assert_eq!(c.count(None, &sel, now), 3);
        // Nothing valid: 1.
        assert_eq!(c.count(Some(&[]), &sel, now), 1);
        assert_eq!(c.count(Some(&all[3..]), &sel, now), 1);
        // Time passing expires leases without a new list.
        assert_eq!(c.count(Some(&all), &sel, t("2026-12-03T00:01:20Z")), 1);
    }

    #[test]
    fn count_sources_combine() {
        assert_eq!(CountSource::parse("").unwrap(), CountSource::Default);
        assert_eq!(CountSource::parse("default").unwrap(), CountSource::Default);
        assert_eq!(CountSource::parse("max").unwrap(), CountSource::Max);
        assert!(CountSource::parse("min").is_err());
        use CountSource::*;
        assert_eq!(combine(Default, None, 0), 1);
        assert_eq!(combine(Default, None, 4), 4);
        assert_eq!(combine(Default, Some(3), 1), 3);
        assert_eq!(combine(Default, Some(2), 5), 2);
        assert_eq!(combine(Max, Some(2), 5), 5);
        assert_eq!(combine(Max, Some(3), 1), 3);
        assert_eq!(combine(Max, Some(3), 0), 3);
        assert_eq!(combine(Max, Some(0), 0), 1);
    }
}
