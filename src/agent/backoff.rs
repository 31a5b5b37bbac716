//! The reconnect policy of one agent slot, without I/O: it is told how each
//! attempt went (with the instants that matter) and answers how long to
//! wait before the next one, so it is tested without a clock.
//!
//! - Attempts that fail, and connections that end before they were healthy
//!   for `reset_after`, back off exponentially with full jitter: the n-th in
//!   a row waits uniformly in `[0, min(max, initial * 2^n))`.
//! - A connection that stayed up for `reset_after` resets that: the next
//!   retry waits uniformly in `[0, initial)`, however it ended (a server that
//!   dies usually ends it with an error, not cleanly).
//! - A duplicate (the server behind this address was already connected
//!   through another slot, `serverCount > 1` behind one address) retries in
//!   `[0.5, 1.5) * min(initial, DUPLICATE_BASE_MAX)` (and not past `max`),
//!   and leaves the exponent alone: the server answered, it is not an
//!   outage, and the load balancer may send the next attempt elsewhere.
//! - A server that said it is busy (its handshake caps are full: it
//!   answered the TLS handshake with a fatal `user_canceled` alert before
//!   any TLS work, see [`engine::admission::refuse`]; [`is_busy`]
//!   recognises it) grows the exponent like a failure, but waits at least
//!   half the ceiling: uniformly in `[ceiling / 2, ceiling)` ("equal
//!   jitter"), so that one agent's attempts on a busy server are at least
//!   `initial / 2`, then `initial`, `2 * initial`, ... apart, and a fleet
//!   refused at once still spreads over each window. [`BusyNotice`] logs
//!   the first refusal of a run at info and counts every one
//!   (`edgetunnel_agent_server_busy_total`).

use std::time::{Duration, Instant};

/// Default healthy period: a connection that stayed up this long resets the
/// backoff. Long enough that a server which accepts and then drops agents
/// (crash loop, rejecting after the handshake, shedding load) still meets a
/// growing delay, as those end within a second or two; short enough that
/// any real session, even one that ended soon after a restart, makes the
/// next blip cheap. It bounds a flapping server to one connection per slot
/// every 5 s plus the delay.
pub const DEFAULT_RESET_AFTER: Duration = Duration::from_secs(5);

/// The base of the wait after a duplicate is `initial`, but no more than
/// this: a slow `initial` does not slow down filling the slots, and the
/// wait stays jittered.
pub const DUPLICATE_BASE_MAX: Duration = Duration::from_secs(2);

/// How one attempt of a slot went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// No connection: TCP, TLS, HTTP/2 or the Connect stream failed.
    Failed,
    /// The server was already connected through another slot.
    Duplicate,
    /// The server refused the handshake because it is busy ([`is_busy`]).
    Busy,
    /// Established at `established`, over (cleanly or not) at `ended`.
    Ended {
        established: Instant,
        ended: Instant,
    },
}

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    reset_after: Duration,
    /// Attempts in a row that did not give a healthy connection.
    failures: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration, reset_after: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            reset_after,
            failures: 0,
        }
    }

    /// The upper bound of the next failure's delay.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32 << self.failures.min(31);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// Records `attempt`; the delay before the next, drawn with `u` (uniform
    /// in [0, 1)).
    pub fn next_delay_with(&mut self, attempt: Attempt, u: f64) -> Duration {
        let u = u.clamp(0.0, 1.0);
        match attempt {
            Attempt::Duplicate => {
                let base = self.initial.min(DUPLICATE_BASE_MAX);
                return base.mul_f64(0.5 + u).min(self.max);
            }
            Attempt::Ended { established, ended }
                if ended.saturating_duration_since(established) >= self.reset_after =>
            {
                self.failures = 0;
            }
            Attempt::Busy => {
                let ceiling = self.ceiling();
                self.failures = (self.failures + 1).min(32);
                return ceiling / 2 + (ceiling / 2).mul_f64(u);
            }
            Attempt::Ended { .. } | Attempt::Failed => {}
        }
        let delay = self.ceiling().mul_f64(u);
        // Past 2^31 the ceiling is the cap anyway.
        self.failures = (self.failures + 1).min(32);
        delay
    }

    /// Records `attempt`; the delay before the next, with fresh jitter.
    pub fn next_delay(&mut self, attempt: Attempt) -> Duration {
        self.next_delay_with(attempt, fastrand::f64())
    }
}

/// Whether `e` (or an error it wraps, through `io::Error`s and sources)
/// is a server's "busy" answer: a fatal TLS `user_canceled` alert received
/// during the handshake. A rustls server never sends that alert on its
/// own; edgetunnel's sends it when its handshake caps are full.
pub fn is_busy(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    // Bounded: error chains are short, and a cycle must not hang us.
    for _ in 0..16 {
        let Some(err) = cur else { return false };
        if let Some(rustls::Error::AlertReceived(rustls::AlertDescription::UserCanceled)) =
            err.downcast_ref::<rustls::Error>()
        {
            return true;
        }
        // io::Error's `source` skips the error it wraps: look inside.
        cur = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    false
}

/// What an agent slot says about "busy" answers: the first of a run at
/// info (later ones at debug, until a connection is established), every
/// one counted (`edgetunnel_agent_server_busy_total`).
#[derive(Debug, Default)]
pub struct BusyNotice {
    in_run: u64,
}

impl BusyNotice {
    /// A busy answer from `server`; we wait `delay` before the next try.
    pub fn busy(&mut self, server: &str, delay: Duration) {
        crate::metrics::agent::metrics().server_busy();
        self.in_run += 1;
        if self.in_run == 1 {
            tracing::info!(
                %server,
                ?delay,
                "server busy (its handshake queue is full): backing off; further busy answers are not logged until a connection is up"
            );
        } else {
            tracing::debug!(%server, ?delay, refusals = self.in_run, "server still busy");
        }
    }

    /// A connection was established: the next busy answer is logged again.
    pub fn reset(&mut self) {
        self.in_run = 0;
    }

    /// Busy answers since the last established connection.
    pub fn in_run(&self) -> u64 {
        self.in_run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy() -> Backoff {
        Backoff::new(100 * MS, 10 * 1000 * MS, DEFAULT_RESET_AFTER)
    }

    /// Delays for `attempt` with u = 1 (the ceiling) and u = 0.
    fn top(b: &mut Backoff, attempt: Attempt) -> Duration {
        b.next_delay_with(attempt, 1.0)
    }

    fn ended(up: Duration) -> Attempt {
        let established = Instant::now();
        Attempt::Ended {
            established,
            ended: established + up,
        }
    }

    #[test]
    fn failures_double_with_full_jitter_up_to_the_cap() {
        let mut b = policy();
        let tops: Vec<u64> = (0..10)
            .map(|_| top(&mut b, Attempt::Failed).as_millis() as u64)
            .collect();
        assert_eq!(
            tops,
            [100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000, 10000]
        );
        // Full jitter: anywhere from 0 to the ceiling.
        assert_eq!(b.next_delay_with(Attempt::Failed, 0.0), Duration::ZERO);
        assert_eq!(b.next_delay_with(Attempt::Failed, 0.5), 5000 * MS);
        for _ in 0..1000 {
            assert!(b.next_delay(Attempt::Failed) <= 10000 * MS);
        }
        // Many more failures do not overflow.
        for _ in 0..100 {
            top(&mut b, Attempt::Failed);
        }
        assert_eq!(b.ceiling(), 10000 * MS);
    }

    #[test]
    fn healthy_connection_resets_however_it_ended() {
        let mut b = policy();
        for _ in 0..8 {
            top(&mut b, Attempt::Failed);
        }
        assert_eq!(b.ceiling(), 10000 * MS);
        // Up for the healthy period (an error or a clean end look the same
        // here): the first retry within `initial`, then doubling again.
        assert_eq!(top(&mut b, ended(DEFAULT_RESET_AFTER)), 100 * MS);
        assert_eq!(top(&mut b, Attempt::Failed), 200 * MS);
        assert_eq!(top(&mut b, Attempt::Failed), 400 * MS);
        for _ in 0..8 {
            top(&mut b, Attempt::Failed);
        }
        assert_eq!(top(&mut b, ended(75 * 1000 * MS)), 100 * MS);
        for _ in 0..1000 {
            let mut b = policy();
            for _ in 0..8 {
                top(&mut b, Attempt::Failed);
            }
            assert!(b.next_delay(ended(DEFAULT_RESET_AFTER)) <= 100 * MS);
        }
    }

    #[test]
    fn short_connections_keep_climbing() {
        let mut b = policy();
        assert_eq!(top(&mut b, Attempt::Failed), 100 * MS);
        assert_eq!(top(&mut b, ended(DEFAULT_RESET_AFTER - MS)), 200 * MS);
        assert_eq!(top(&mut b, ended(Duration::ZERO)), 400 * MS);
        assert_eq!(top(&mut b, Attempt::Failed), 800 * MS);
        // An end instant before the establishment (clock oddities) is a
        // zero-length connection, not a panic.
        let now = Instant::now();
        let odd = Attempt::Ended {
            established: now + MS,
            ended: now,
        };
        assert_eq!(top(&mut b, odd), 1600 * MS);
    }

    #[test]
    fn the_five_restarts_then_a_blip_case() {
        // The issue: backoff climbed through restarts, then a long healthy
        // connection, then a 0.5 s blip.
        let mut b = Backoff::new(500 * MS, 30 * 1000 * MS, DEFAULT_RESET_AFTER);
        for _ in 0..5 {
            for _ in 0..3 {
                top(&mut b, Attempt::Failed);
            }
            top(&mut b, ended(Duration::from_secs(1)));
        }
        assert_eq!(b.ceiling(), 30 * 1000 * MS);
        // 75 s healthy, then the blip: retries at most 0.5 s, 1 s, 2 s apart.
        let up = ended(Duration::from_secs(75));
        let first = top(&mut b, up);
        let second = top(&mut b, Attempt::Failed);
        let third = top(&mut b, Attempt::Failed);
        assert_eq!((first, second, third), (500 * MS, 1000 * MS, 2000 * MS));
    }

    #[test]
    fn duplicates_retry_soon_with_jitter_and_keep_the_exponent() {
        let mut b = policy();
        for _ in 0..3 {
            top(&mut b, Attempt::Failed);
        }
        let ceiling = b.ceiling();
        assert_eq!(b.next_delay_with(Attempt::Duplicate, 0.0), 50 * MS);
        assert_eq!(b.next_delay_with(Attempt::Duplicate, 0.5), 100 * MS);
        assert_eq!(b.next_delay_with(Attempt::Duplicate, 1.0), 150 * MS);
        for _ in 0..1000 {
            let d = b.next_delay(Attempt::Duplicate);
            assert!(d >= 50 * MS && d <= 150 * MS, "{d:?}");
        }
        // Neither grown nor reset.
        assert_eq!(b.ceiling(), ceiling);
        // Small and still jittered whatever `initial` is.
        let mut slow = Backoff::new(20000 * MS, 60000 * MS, DEFAULT_RESET_AFTER);
        assert_eq!(slow.next_delay_with(Attempt::Duplicate, 0.0), 1000 * MS);
        assert_eq!(slow.next_delay_with(Attempt::Duplicate, 1.0), 3000 * MS);
        // Never past `max`.
        let mut tight = Backoff::new(100 * MS, 100 * MS, DEFAULT_RESET_AFTER);
        assert_eq!(tight.next_delay_with(Attempt::Duplicate, 1.0), 100 * MS);
    }

    #[test]
    fn busy_grows_with_equal_jitter() {
        let mut b = policy();
        let lows: Vec<u64> = (0..9)
            .map(|_| b.next_delay_with(Attempt::Busy, 0.0).as_millis() as u64)
            .collect();
        assert_eq!(lows, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(b.next_delay_with(Attempt::Busy, 1.0), 10000 * MS);
        for _ in 0..1000 {
            let d = b.next_delay(Attempt::Busy);
            assert!((5000 * MS..=10000 * MS).contains(&d), "{d:?}");
        }
        // A failure after busy answers keeps the grown ceiling, and a
        // healthy connection resets both.
        assert_eq!(top(&mut b, Attempt::Failed), 10000 * MS);
        assert_eq!(top(&mut b, ended(DEFAULT_RESET_AFTER)), 100 * MS);
        assert_eq!(b.next_delay_with(Attempt::Busy, 0.0), 100 * MS);
    }

    #[test]
    fn busy_is_the_user_canceled_alert_however_wrapped() {
        use rustls::{AlertDescription as A, Error as E};
        let alert = E::AlertReceived(A::UserCanceled);
        assert!(is_busy(&alert));
        // tokio-rustls hands it over inside an io::Error, the agent boxes it.
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, alert.clone());
        assert!(is_busy(&io));
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(io);
        assert!(is_busy(&*boxed));
        // Other alerts and failures are not "busy".
        assert!(!is_busy(&E::AlertReceived(A::InternalError)));
        assert!(!is_busy(&E::AlertReceived(A::BadCertificate)));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!is_busy(&reset));
        let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "tls handshake eof");
        assert!(!is_busy(&eof));
    }

    #[test]
    fn odd_settings() {
        // max below initial: initial wins; zero initial: zero delays.
        let mut b = Backoff::new(200 * MS, 100 * MS, DEFAULT_RESET_AFTER);
        assert_eq!(top(&mut b, Attempt::Failed), 200 * MS);
        assert_eq!(top(&mut b, Attempt::Failed), 200 * MS);
        let mut z = Backoff::new(Duration::ZERO, Duration::ZERO, Duration::ZERO);
        assert_eq!(top(&mut z, Attempt::Failed), Duration::ZERO);
        assert_eq!(top(&mut z, ended(Duration::ZERO)), Duration::ZERO);
    }
}
