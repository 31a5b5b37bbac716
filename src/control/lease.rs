//! Leader election on a coordination.k8s.io Lease, decided sans-I/O: when
//! several servers run, only the holder publishes the DNS records. A lease
//! is taken when absent or expired, renewed by its holder, and otherwise
//! left alone.

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// No lease yet: create it, holding it.
    Create(LeaseSpec),
    /// Ours, or expired: write this spec (a conflict means someone else won).
    Update(LeaseSpec),
    /// Another holder's live lease.
    Follow { holder: String },
}

fn spec(
    me: &str,
    duration_secs: i32,
    now: Timestamp,
    acquired: Timestamp,
    transitions: i32,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(duration_secs),
        acquire_time: Some(MicroTime(acquired)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// What `me` does with `current` at `now`.
pub fn decide(current: Option<&LeaseSpec>, me: &str, duration_secs: i32, now: Timestamp) -> Step {
    let Some(cur) = current else {
        return Step::Create(spec(me, duration_secs, now, now, 0));
    };
    let holder = cur.holder_identity.clone().unwrap_or_default();
    let transitions = cur.lease_transitions.unwrap_or(0);
    if holder == me {
        let acquired = cur.acquire_time.as_ref().map_or(now, |t| t.0);
        return Step::Update(spec(me, duration_secs, now, acquired, transitions));
    }
    let renewed = cur
        .renew_time
        .as_ref()
        .or(cur.acquire_time.as_ref())
        .map(|t| t.0);
    let lasts = SignedDuration::from_secs(
        cur.lease_duration_seconds.unwrap_or(duration_secs).max(1) as i64,
    );
    let expired = holder.is_empty() || renewed.is_none_or(|r| r + lasts < now);
    if expired {
        Step::Update(spec(me, duration_secs, now, now, transitions + 1))
    } else {
        Step::Follow { holder }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_renew_follow_and_take_over() {
        let t0: Timestamp = "2026-12-03T00:00:00Z".parse().unwrap();
        let Step::Create(mine) = decide(None, "a", 15, t0) else {
            panic!()
        };
        assert_eq!(mine.holder_identity.as_deref(), Some("a"));
        let t1 = t0 + SignedDuration::from_secs(5);
        assert!(matches!(decide(Some(&mine), "a", 15, t1), Step::Update(_)));
        assert_eq!(
            decide(Some(&mine), "b", 15, t1),
            Step::Follow { holder: "a".into() }
        );
        let t2 = t0 + SignedDuration::from_secs(16);
        match decide(Some(&mine), "b", 15, t2) {
            Step::Update(s) => {
                assert_eq!(s.holder_identity.as_deref(), Some("b"));
                assert_eq!(s.lease_transitions, Some(1));
            }
            other => panic!("{other:?}"),
        }
    }
}
