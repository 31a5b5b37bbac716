//! What the control thread remembers of TokenReview verdicts, and how fast
//! it may ask for new ones, without I/O (told the time, so tested without a
//! clock).
//!
//! A restart of the server brings every agent back at once, each with the
//! token it had; a reconnect wave repeats the tokens of agents whose first
//! attempt failed. Without memory that is N reviews times the retries
//! toward the kube-apiserver (ANP issue 237: TokenReview throttling during
//! reconnect spikes). So:
//! - a verdict is kept under the SHA-256 of the token (never the token),
//!   an acceptance for `accepted_ttl` but never past the token's own `exp`
//!   claim when it has one, a refusal for `denied_ttl` (a bad agent that
//!   retries does not cost a review per retry); an error of the review
//!   itself (timeout, apiserver down) is not kept;
//! - at most `capacity` acceptances and `capacity` refusals, the oldest of
//!   each dropped first (refusals never push acceptances out);
//! - [`Pacer`] spaces the reviews that do go out: `qps` per second, bursts
//!   of `burst`.
//!
//! kube-apiserver's own webhook token authenticator keeps accepted tokens
//! for 2 minutes by default (`--authentication-token-webhook-cache-ttl`);
//! [`DEFAULT_ACCEPTED_TTL`] is the same.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long an accepted token is believed by default.
pub const DEFAULT_ACCEPTED_TTL: Duration = Duration::from_secs(120);
/// How long a refused token stays refused without a new review.
pub const DEFAULT_DENIED_TTL: Duration = Duration::from_secs(10);
/// Verdicts kept at most by default (about 100 bytes each).
pub const DEFAULT_CAPACITY: usize = 65_536;

/// The cache key: SHA-256 of the token.
pub type TokenKey = [u8; 32];

pub fn key_of(token: &str) -> TokenKey {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut k = [0u8; 32];
    k.copy_from_slice(d.as_ref());
    k
}

/// What one review said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated as this user.
    Accepted(String),
    /// The apiserver answered, and the answer is no (why).
    Denied(String),
    /// No answer (why): not kept.
    Failed(String),
}

impl Verdict {
    /// As the data plane takes it: the user, or why not.
    pub fn into_result(self) -> Result<String, String> {
        match self {
            Verdict::Accepted(u) => Ok(u),
            Verdict::Denied(e) | Verdict::Failed(e) => Err(e),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub accepted_ttl: Duration,
    pub denied_ttl: Duration,
    pub capacity: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            accepted_ttl: DEFAULT_ACCEPTED_TTL,
            denied_ttl: DEFAULT_DENIED_TTL,
            capacity: DEFAULT_CAPACITY,
        }
    }
}

struct Entry {
    verdict: Verdict,
    expires: Instant,
    /// Which insertion this is, to match its place in `order`.
    seq: u64,
}

/// Verdicts by token hash, bounded in count and age: acceptances and
/// refusals on shelves of their own, each of `capacity` at most, so that
/// a flood of random tokens (each refused) evicts only refusals, never the
/// acceptances of the fleet (issue 39, finding 9).
pub struct ReviewCache {
    config: CacheConfig,
    accepted: Shelf,
    denied: Shelf,
}

/// One kind of verdict, oldest first.
#[derive(Default)]
struct Shelf {
    entries: HashMap<TokenKey, Entry>,
    /// Insertion order; a key re-inserted leaves a stale place behind,
    /// skipped when met (and compacted when they pile up).
    order: VecDeque<(TokenKey, u64)>,
    seq: u64,
}

impl Shelf {
    fn get(&mut self, key: &TokenKey, now: Instant) -> Option<Verdict> {
        match self.entries.get(key) {
            Some(e) if e.expires > now => Some(e.verdict.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn put(&mut self, key: TokenKey, verdict: &Verdict, expires: Instant, capacity: usize) {
        while self.entries.len() >= capacity && !self.entries.contains_key(&key) {
            self.evict_oldest();
        }
        self.seq += 1;
        self.entries.insert(
            key,
            Entry {
                verdict: verdict.clone(),
                expires,
                seq: self.seq,
            },
        );
        self.order.push_back((key, self.seq));
        if self.order.len() > 2 * capacity.max(16) {
            let entries = &self.entries;
            self.order
                .retain(|(k, s)| entries.get(k).is_some_and(|e| e.seq == *s));
        }
    }

    fn evict_oldest(&mut self) {
        while let Some((k, s)) = self.order.pop_front() {
            if self.entries.get(&k).is_some_and(|e| e.seq == s) {
                self.entries.remove(&k);
                return;
            }
        }
    }
}

impl ReviewCache {
    pub fn new(config: CacheConfig) -> Self {
        ReviewCache {
            config,
            accepted: Shelf::default(),
            denied: Shelf::default(),
        }
    }

    /// A verdict still in force for `key`.
    pub fn get(&mut self, key: &TokenKey, now: Instant) -> Option<Verdict> {
        self.accepted
            .get(key, now)
            .or_else(|| self.denied.get(key, now))
    }

    /// Keeps what a review of `token` said (not a failure to review).
    pub fn put(&mut self, key: TokenKey, token: &str, verdict: &Verdict, now: Instant) {
        let ttl = match verdict {
            Verdict::Accepted(_) => {
                let ttl = self.config.accepted_ttl;
                match jwt_lifetime_left(token, SystemTime::now()) {
                    Some(left) => ttl.min(left),
                    None => ttl,
                }
            }
            Verdict::Denied(_) => self.config.denied_ttl,
            Verdict::Failed(_) => return,
        };
        // The newest verdict is the one kept.
        self.accepted.entries.remove(&key);
        self.denied.entries.remove(&key);
        if ttl.is_zero() || self.config.capacity == 0 {
            return;
        }
        let shelf = match verdict {
            Verdict::Accepted(_) => &mut self.accepted,
            _ => &mut self.denied,
        };
        shelf.put(key, verdict, now + ttl, self.config.capacity);
    }

    pub fn len(&self) -> usize {
        self.accepted.entries.len() + self.denied.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Time left before a JWT's `exp` claim (read, not verified: the
/// apiserver verified it; this only keeps a cached acceptance from
/// outliving the token). None when the token is not a JWT with `exp`.
pub fn jwt_lifetime_left(token: &str, now: SystemTime) -> Option<Duration> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_f64()?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
    // An absurd `exp` (1e300) is no lifetime, not a panic.
    Duration::try_from_secs_f64((exp - now).max(0.0)).ok()
}

/// Spaces reviews to `qps` per second with bursts of `burst` (a token
/// bucket); `qps` 0 means no limit.
#[derive(Debug, Clone)]
pub struct Pacer {
    interval: Duration,
    burst: u32,
    /// When the bucket is full again; a review takes `interval` off it.
    full_at: Option<Instant>,
}

impl Pacer {
    pub fn new(qps: f64, burst: u32) -> Self {
        let interval = if qps > 0.0 {
            Duration::from_secs_f64(1.0 / qps)
        } else {
            Duration::ZERO
        };
        Pacer {
            interval,
            burst: burst.max(1),
            full_at: None,
        }
    }

    /// When the next review may go (now, or later when the bucket is
    /// empty); taking it is [`Self::take`].
    pub fn ready_at(&self, now: Instant) -> Instant {
        if self.interval.is_zero() {
            return now;
        }
        let depth = self.interval * self.burst;
        let full_at = self.full_at.filter(|t| *t > now).unwrap_or(now);
        (full_at + self.interval)
            .checked_sub(depth)
            .map_or(now, |t| t.max(now))
    }

    /// Takes a slot for one review: how long to wait before sending it.
    pub fn take(&mut self, now: Instant) -> Duration {
        if self.interval.is_zero() {
            return Duration::ZERO;
        }
        let depth = self.interval * self.burst;
        // The bucket's level is how far `full_at` lies in the future.
        let full_at = self.full_at.filter(|t| *t > now).unwrap_or(now);
        let next_full = full_at + self.interval;
        self.full_at = Some(next_full);
        // Waiting until the bucket holds one slot again.
        (next_full - now).saturating_sub(depth)
    }
}

#[cfg(test)]
mod tests {

    /// A token whose `exp` no Duration holds gives no lifetime (it
    /// panicked in `Duration::from_secs_f64`).
    #[test]
    fn an_absurd_jwt_expiry_is_no_lifetime() {
        use base64::Engine;
        let enc = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let token = format!("{}.{}.sig", enc("{}"), enc(r#"{"exp":1e300}"#));
        assert_eq!(jwt_lifetime_left(&token, SystemTime::now()), None);
        let token = format!("{}.{}.sig", enc("{}"), enc(r#"{"exp":4102444800}"#));
        assert!(jwt_lifetime_left(&token, SystemTime::now()).is_some());
    }

    use super::*;

    fn accepted() -> Verdict {
        Verdict::Accepted("system:serviceaccount:kube-system:konnectivity-agent".into())
    }

    /// The queue of reviews (issue 39, finding 7) asks the pacer when the
    /// next turn is, and takes it only when a review goes.
    #[test]
    fn ready_at_says_when_the_next_review_may_go_without_taking_it() {
        let t0 = Instant::now();
        let mut p = Pacer::new(2.0, 1);
        assert_eq!(p.ready_at(t0), t0);
        assert_eq!(p.ready_at(t0), t0, "asking takes nothing");
        assert!(p.take(t0).is_zero());
        assert_eq!(p.ready_at(t0), t0 + Duration::from_millis(500));
        assert_eq!(p.take(t0), Duration::from_millis(500));
        assert_eq!(p.ready_at(t0), t0 + Duration::from_secs(1));
        // A quiet while later the bucket is full again.
        let later = t0 + Duration::from_secs(5);
        assert_eq!(p.ready_at(later), later);
        assert_eq!(Pacer::new(0.0, 1).ready_at(t0), t0);
    }

    #[test]
    fn keeps_verdicts_for_their_ttl_and_not_failures() {
        let t0 = Instant::now();
        let mut c = ReviewCache::new(CacheConfig::default());
        let (a, b, f) = (key_of("a"), key_of("b"), key_of("f"));
        c.put(a, "a", &accepted(), t0);
        c.put(b, "b", &Verdict::Denied("no".into()), t0);
        c.put(f, "f", &Verdict::Failed("timeout".into()), t0);
        assert_eq!(c.get(&a, t0 + Duration::from_secs(119)), Some(accepted()));
        assert_eq!(
            c.get(&b, t0 + Duration::from_secs(9)),
            Some(Verdict::Denied("no".into()))
        );
        assert_eq!(c.get(&b, t0 + Duration::from_secs(10)), None);
        assert_eq!(c.get(&f, t0), None);
        assert_eq!(c.get(&a, t0 + Duration::from_secs(120)), None);
        assert!(c.is_empty());
    }

    #[test]
    fn bounded_dropping_the_oldest() {
        let t0 = Instant::now();
        let mut c = ReviewCache::new(CacheConfig {
            capacity: 3,
            ..Default::default()
        });
        for i in 0..1000 {
            let t = i.to_string();
            c.put(key_of(&t), &t, &accepted(), t0);
            // Re-putting a key leaves stale places; they stay bounded.
            c.put(key_of("0"), "0", &accepted(), t0);
            assert!(c.len() <= 3);
            assert!(c.accepted.order.len() <= 32, "{}", c.accepted.order.len());
        }
        assert!(c.get(&key_of("999"), t0).is_some());
        assert!(c.get(&key_of("0"), t0).is_some(), "refreshed, so young");
        assert!(c.get(&key_of("1"), t0).is_none());
    }

    /// Issue 39, finding 9: random tokens at the review rate (each one
    /// refused) no longer evict the fleet's acceptances.
    #[test]
    fn refusals_never_push_acceptances_out() {
        let t0 = Instant::now();
        let mut c = ReviewCache::new(CacheConfig {
            capacity: 100,
            ..Default::default()
        });
        for i in 0..50 {
            let t = format!("agent-{i}");
            c.put(key_of(&t), &t, &accepted(), t0);
        }
        for i in 0..10_000 {
            let t = format!("random-{i}");
            c.put(key_of(&t), &t, &Verdict::Denied("no".into()), t0);
        }
        assert!((0..50).all(|i| c.get(&key_of(&format!("agent-{i}")), t0) == Some(accepted())));
        assert_eq!(c.len(), 150);
        // A token refused after it was accepted is refused (one verdict).
        c.put(
            key_of("agent-0"),
            "agent-0",
            &Verdict::Denied("revoked".into()),
            t0,
        );
        assert_eq!(
            c.get(&key_of("agent-0"), t0),
            Some(Verdict::Denied("revoked".into()))
        );
    }

    fn jwt(claims: &str) -> String {
        use base64::Engine;
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            e.encode(r#"{"alg":"RS256"}"#),
            e.encode(claims)
        )
    }

    #[test]
    fn an_acceptance_does_not_outlive_the_token() {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let token = jwt(&format!(r#"{{"exp":{},"sub":"x"}}"#, secs + 30));
        let left = jwt_lifetime_left(&token, now).unwrap();
        assert!(left <= Duration::from_secs(30) && left > Duration::from_secs(28));
        assert_eq!(jwt_lifetime_left("opaque-token", now), None);
        assert_eq!(jwt_lifetime_left(&jwt(r#"{"sub":"x"}"#), now), None);

        let t0 = Instant::now();
        let mut c = ReviewCache::new(CacheConfig::default());
        c.put(key_of(&token), &token, &accepted(), t0);
        assert!(c
            .get(&key_of(&token), t0 + Duration::from_secs(25))
            .is_some());
        assert!(c
            .get(&key_of(&token), t0 + Duration::from_secs(31))
            .is_none());
        // Expired already: not kept at all.
        let old = jwt(&format!(r#"{{"exp":{}}}"#, secs - 5));
        c.put(key_of(&old), &old, &accepted(), t0);
        assert!(c.get(&key_of(&old), t0).is_none());
    }

    #[test]
    fn pacer_lets_a_burst_through_then_spaces() {
        let t0 = Instant::now();
        let mut p = Pacer::new(10.0, 5);
        let waits: Vec<Duration> = (0..8).map(|_| p.take(t0)).collect();
        assert!(waits[..5].iter().all(|w| w.is_zero()), "{waits:?}");
        let ms: Vec<u128> = waits[5..].iter().map(|w| w.as_millis()).collect();
        assert_eq!(ms, [100, 200, 300]);
        // After a quiet second the burst is back.
        let later = t0 + Duration::from_millis(1300);
        assert!((0..5).all(|_| p.take(later).is_zero()));
        assert!(!p.take(later).is_zero());
        // qps 0: no limit.
        let mut free = Pacer::new(0.0, 1);
        assert!((0..100).all(|_| free.take(t0).is_zero()));
    }
}
