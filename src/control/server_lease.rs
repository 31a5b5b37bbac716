//! Server leases in ANP's format (`--enable-lease-controller`): every
//! server keeps a coordination.k8s.io/v1 Lease named
//! `konnectivity-proxy-server-<server ID>` (holder identity: the server
//! ID, `leaseDurationSeconds` 30, renewed every 15 s, labelled with
//! `--lease-label`), and every server deletes, every 15 s, the leases with
//! those labels that expired (renewTime + duration <= now), with the
//! lease's resourceVersion as a precondition so a lease renewed meanwhile
//! survives. Agents count the live ones (`super::lease_count`). On a clean
//! exit the server deletes its own lease, as ANP's does.
//!
//! The decisions are sans-I/O ([`is_valid`], [`new_lease`], [`renewed`],
//! [`expired`]); [`run`] does the API calls on the control thread.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::Client;

use crate::metrics::LeaseMetrics;

/// ANP's lease name prefix (`cmd/server/app/server.go`).
pub const LEASE_NAME_PREFIX: &str = "konnectivity-proxy-server-";
/// ANP's defaults: namespace, labels, duration, renew and GC periods.
pub const DEFAULT_NAMESPACE: &str = "kube-system";
pub const DEFAULT_LABEL: &str = "k8s-app=konnectivity-server";
pub const DEFAULT_DURATION_SECS: i32 = 30;
pub const DEFAULT_RENEW: Duration = Duration::from_secs(15);
pub const DEFAULT_GC: Duration = Duration::from_secs(15);

/// What the server's lease controller is told.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerLeaseSpec {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// The server ID: the lease's holder identity and its name's suffix.
    pub holder: String,
    pub duration_secs: i32,
    pub renew: Duration,
    pub gc_period: Duration,
}

impl ServerLeaseSpec {
    /// ANP's timings for `holder` in `namespace` with `labels`.
    pub fn new(namespace: &str, labels: BTreeMap<String, String>, holder: &str) -> Self {
        ServerLeaseSpec {
            namespace: namespace.to_string(),
            labels,
            holder: holder.to_string(),
            duration_secs: DEFAULT_DURATION_SECS,
            renew: DEFAULT_RENEW,
            gc_period: DEFAULT_GC,
        }
    }

    pub fn name(&self) -> String {
        lease_name(&self.holder)
    }
}

/// The lease a server with ID `server_id` keeps.
pub fn lease_name(server_id: &str) -> String {
    format!("{LEASE_NAME_PREFIX}{server_id}")
}

/// `--lease-label` as ANP reads it: `k=v` pairs separated by commas, each
/// side trimmed; empty or a pair without exactly one `=` is an error.
pub fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    if s.is_empty() {
        return Err("--lease-label: empty string provided".into());
    }
    let mut out = BTreeMap::new();
    for pair in s.split(',') {
        let mut kv = pair.split('=');
        match (kv.next(), kv.next(), kv.next()) {
            (Some(k), Some(v), None) => {
                out.insert(k.trim().to_string(), v.trim().to_string());
            }
            _ => return Err(format!("--lease-label: invalid label format: {pair}")),
        }
    }
    Ok(out)
}

/// The labels as a selector string, keys sorted (Kubernetes'
/// `labels.FormatLabels`): what the GC lists with.
pub fn format_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// ANP's `util.IsLeaseValid`: the last renewal (renewTime, else
/// acquireTime; neither: expired) plus leaseDurationSeconds is after
/// `now`. A lease without a duration counts as expired (ANP would crash).
pub fn is_valid(spec: Option<&LeaseSpec>, now: Timestamp) -> bool {
    let Some(spec) = spec else { return false };
    let Some(last) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return false;
    };
    let Some(secs) = spec.lease_duration_seconds else {
        return false;
    };
    last.0 + SignedDuration::from_secs(secs as i64) > now
}

/// The lease created when none exists (component-helpers' lease
/// controller: holder, duration, renewTime = now; labels set by ANP's
/// post-processing hook; no acquireTime).
pub fn new_lease(spec: &ServerLeaseSpec, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(spec.name()),
            namespace: Some(spec.namespace.clone()),
            labels: Some(spec.labels.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(spec.holder.clone()),
            lease_duration_seconds: Some(spec.duration_secs),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// The existing lease renewed: renewTime = now and the labels replaced;
/// the rest (resourceVersion included) kept, as the Go controller does.
pub fn renewed(mut lease: Lease, spec: &ServerLeaseSpec, now: Timestamp) -> Lease {
    lease.metadata.labels = Some(spec.labels.clone());
    let s = lease.spec.get_or_insert_with(Default::default);
    if s.holder_identity.is_none() {
        s.holder_identity = Some(spec.holder.clone());
    }
    if s.lease_duration_seconds.is_none() {
        s.lease_duration_seconds = Some(spec.duration_secs);
    }
    s.renew_time = Some(MicroTime(now));
    lease
}

/// The leases to delete: (name, resourceVersion) of each expired one.
pub fn expired(leases: &[Lease], now: Timestamp) -> Vec<(String, String)> {
    leases
        .iter()
        .filter(|l| !is_valid(l.spec.as_ref(), now))
        .filter_map(|l| {
            Some((
                l.metadata.name.clone()?,
                l.metadata.resource_version.clone().unwrap_or_default(),
            ))
        })
        .collect()
}

/// `d` with up to +4% jitter (the Go controller's JitterUntil factor).
fn jittered(d: Duration) -> Duration {
    d.mul_f64(1.0 + 0.04 * fastrand::f64())
}

/// Renews one time: replaces the cached lease, or (no cache, or that
/// failed) gets it and creates or renews it. Returns the stored lease.
async fn renew_once(
    api: &Api<Lease>,
    spec: &ServerLeaseSpec,
    cached: Option<Lease>,
) -> Result<Lease, kube::Error> {
    let name = spec.name();
    let pp = PostParams::default();
    if let Some(l) = cached {
        match api
            .replace(&name, &pp, &renewed(l, spec, Timestamp::now()))
            .await
        {
            Ok(l) => return Ok(l),
            Err(e) => tracing::debug!(lease = %name, "renewing the cached lease: {e}"),
        }
    }
    match api.get_opt(&name).await? {
        None => api.create(&pp, &new_lease(spec, Timestamp::now())).await,
        Some(l) => {
            api.replace(&name, &pp, &renewed(l, spec, Timestamp::now()))
                .await
        }
    }
}

/// Keeps this server's lease renewed (every `renew`).
async fn keep_renewed(api: Api<Lease>, spec: ServerLeaseSpec) {
    let mut cached: Option<Lease> = None;
    let mut ok = false;
    loop {
        match renew_once(&api, &spec, cached.take()).await {
            Ok(l) => {
                if !ok {
                    tracing::info!(lease = %format!("{}/{}", spec.namespace, spec.name()), holder = %spec.holder, "server lease held");
                }
                ok = true;
                cached = Some(l);
            }
            Err(e) => {
                ok = false;
                tracing::warn!(lease = %format!("{}/{}", spec.namespace, spec.name()), "server lease: {e}");
            }
        }
        tokio::time::sleep(jittered(spec.renew)).await;
    }
}

/// Deletes expired leases carrying our labels (every `gc_period`).
/// ANP's lease metrics of a call's outcome: 200, or the API status's code
/// and reason (pkg/server/leases/gc_controller.go counts only API
/// statuses; a call that got no answer is counted here as code 0).
fn call_outcome<T>(r: &Result<T, kube::Error>) -> (u16, String) {
    match r {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(e)) => (e.code, e.reason.clone()),
        Err(_) => (0, String::new()),
    }
}

async fn collect_garbage(api: Api<Lease>, spec: ServerLeaseSpec, metrics: LeaseMetrics) {
    let lp = ListParams::default().labels(&format_labels(&spec.labels));
    loop {
        let t0 = std::time::Instant::now();
        let listed = api.list(&lp).await;
        let (code, reason) = call_outcome(&listed);
        metrics.list(code, &reason, t0.elapsed());
        match listed {
            Ok(list) => {
                for (name, rv) in expired(&list.items, Timestamp::now()) {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            resource_version: Some(rv),
                            uid: None,
                        }),
                        ..Default::default()
                    };
                    let t0 = std::time::Instant::now();
                    let deleted = api.delete(&name, &dp).await;
                    let (code, reason) = call_outcome(&deleted);
                    metrics.delete(code, &reason, t0.elapsed());
                    match deleted {
                        Ok(_) => {
                            metrics.culled();
                            tracing::info!(lease = %name, "expired server lease culled")
                        }
                        Err(kube::Error::Api(e)) if e.code == 404 => {
                            tracing::debug!(lease = %name, "already deleted")
                        }
                        Err(e) => tracing::warn!(lease = %name, "deleting expired lease: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("listing leases to garbage collect: {e}"),
        }
        tokio::time::sleep(spec.gc_period).await;
    }
}

/// Starts renewal and garbage collection as tasks of the current runtime.
pub fn start(
    client: Client,
    spec: ServerLeaseSpec,
    metrics: LeaseMetrics,
) -> Vec<tokio::task::JoinHandle<()>> {
    let api: Api<Lease> = Api::namespaced(client, &spec.namespace);
    vec![
        tokio::spawn(keep_renewed(api.clone(), spec.clone())),
        tokio::spawn(collect_garbage(api, spec, metrics)),
    ]
}

/// Deletes this server's lease (on a clean exit).
pub async fn release(client: Client, spec: &ServerLeaseSpec) {
    let api: Api<Lease> = Api::namespaced(client, &spec.namespace);
    let name = spec.name();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        api.delete(&name, &DeleteParams::default()),
    )
    .await;
    match r {
        Ok(Ok(_)) => tracing::info!(lease = %name, "server lease released"),
        Ok(Err(e)) => tracing::warn!(lease = %name, "releasing server lease: {e}"),
        Err(_) => tracing::warn!(lease = %name, "releasing server lease: timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn spec() -> ServerLeaseSpec {
        ServerLeaseSpec::new("kube-system", parse_labels(DEFAULT_LABEL).unwrap(), "s1")
    }

    #[test]
    fn labels_parse_like_anp() {
        let l = parse_labels(" k8s-app = konnectivity-server ,b=c").unwrap();
        assert_eq!(
            l.get("k8s-app").map(String::as_str),
            Some("konnectivity-server")
        );
        assert_eq!(l.get("b").map(String::as_str), Some("c"));
        assert_eq!(format_labels(&l), "b=c,k8s-app=konnectivity-server");
        assert!(parse_labels("").is_err());
        assert!(parse_labels("a").is_err());
        assert!(parse_labels("a=b=c").is_err());
        assert!(parse_labels("a=b,").is_err());
    }

    #[test]
    fn validity_is_renew_plus_duration_after_now() {
        let now = t("2026-12-03T00:00:30Z");
        let mut s = LeaseSpec {
            lease_duration_seconds: Some(30),
            renew_time: Some(MicroTime(t("2026-12-03T00:00:01Z"))),
            ..Default::default()
        };
        assert!(is_valid(Some(&s), now));
        // Exactly at renew + duration: expired (strictly after, as Go's After).
        s.renew_time = Some(MicroTime(t("2026-12-03T00:00:00Z")));
        assert!(!is_valid(Some(&s), now));
        // acquireTime stands in for a missing renewTime.
        s.renew_time = None;
        s.acquire_time = Some(MicroTime(t("2026-12-03T00:00:10Z")));
        assert!(is_valid(Some(&s), now));
        s.acquire_time = None;
        assert!(!is_valid(Some(&s), now));
        let no_duration = LeaseSpec {
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        };
        assert!(!is_valid(Some(&no_duration), now));
        assert!(!is_valid(None, now));
    }

    #[test]
    fn created_and_renewed_leases_have_anps_shape() {
        let now = t("2026-12-03T00:00:00Z");
        let l = new_lease(&spec(), now);
        assert_eq!(
            l.metadata.name.as_deref(),
            Some("konnectivity-proxy-server-s1")
        );
        assert_eq!(l.metadata.namespace.as_deref(), Some("kube-system"));
        let s = l.spec.clone().unwrap();
        assert_eq!(s.holder_identity.as_deref(), Some("s1"));
        assert_eq!(s.lease_duration_seconds, Some(30));
        assert_eq!(s.renew_time, Some(MicroTime(now)));
        assert_eq!(s.acquire_time, None);
        let later = t("2026-12-03T00:00:15Z");
        let mut stored = l.clone();
        stored.metadata.resource_version = Some("7".into());
        stored.metadata.labels = Some(BTreeMap::from([("x".into(), "y".into())]));
        let r = renewed(stored, &spec(), later);
        assert_eq!(r.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(r.metadata.labels, Some(spec().labels));
        assert_eq!(r.spec.unwrap().renew_time, Some(MicroTime(later)));
    }

    #[test]
    fn gc_picks_only_expired_leases() {
        let now = t("2026-12-03T00:01:00Z");
        let mut live = new_lease(&spec(), t("2026-12-03T00:00:45Z"));
        live.metadata.resource_version = Some("1".into());
        let mut dead = new_lease(&spec(), t("2026-12-03T00:00:10Z"));
        dead.metadata.name = Some("konnectivity-proxy-server-s2".into());
        dead.metadata.resource_version = Some("2".into());
        assert_eq!(
            expired(&[live, dead], now),
            vec![("konnectivity-proxy-server-s2".to_string(), "2".to_string())]
        );
    }
}
