//! The pre-authentication cap: how many accepted connections may be in
//! their handshake (TLS, HTTP/2, first request, token review) at once, in
//! total and per source address, so that an unauthenticated flood holds at
//! most `total` descriptors and cannot take the ones other listeners need.
//!
//! Fair admission: a full cap sheds, it does not refuse. Edge nodes behind
//! one NAT share an address, and a server restart makes them all reconnect
//! at once; a flood from that address (or from everywhere) must not lock a
//! real agent out for as long as it lasts, as first-come refusal did. So a
//! newcomer over a cap takes the slot of the *oldest connection that has
//! not finished its TLS handshake*:
//! - over the per-address cap, the oldest such connection of the same
//!   address;
//! - over the total cap, the oldest such connection of the address holding
//!   the most of them (a flooding address pays for its own flood before
//!   anyone else does).
//!
//! A connection that completed TLS with a verified client certificate
//! ([`Permit::advance`]: it proved a certificate of the CA; without one, as
//! in token mode, a finished handshake proves nothing and the connection
//! stays sheddable until it is authenticated) is never shed by a newcomer, and neither
//! is one younger than [`SHED_GRACE`] (time to complete TLS, so that a
//! flood that reconnects in a tight loop cannot shed a real agent before
//! its handshake is done, and churns at most one cap's worth of slots per
//! grace period); only when every slot in the way is such a connection is
//! the newcomer refused. A real agent completes TLS within a round trip or
//! two, while the connections a flood holds open (nothing sent, half a
//! ClientHello) stay at the first stage and are the ones shed, oldest
//! first. What a flood can still do: a flood that reconnects in a tight
//! loop competes with a real agent of its address for the slots freed each
//! grace period (the agent gets in on one of its retries, not at once);
//! holding client certificates, it can fill the cap with completed TLS
//! (the handshake timeout ends those).
//!
//! The grace follows the server's own pace: it is at least twice the
//! recent time a real handshake took to complete TLS (an average of the
//! completed ones, [`Table::typical`]), up to [`MAX_GRACE`]. A server busy
//! with a burst of real agents (a restart: thousands reconnect at once, and
//! a handshake waits seconds for a core) then does not shed handshakes it
//! has started working on for newcomers that would wait just as long: it
//! refuses the newcomers, which costs it nothing, instead of throwing away
//! the work done on the old ones. A flood of connections that never finish
//! does not move the average (only completed handshakes count), so its
//! slots are shed after the usual grace.
//!
//! What a refused connection is answered ([`refuse`]): before reading its
//! ClientHello (no TLS work, no task, three system calls at accept time),
//! one plaintext TLS alert record, fatal `user_canceled` (RFC 8446 §6.1: the
//! handshake is cancelled for a reason unrelated to a protocol failure),
//! then the connection is closed. What is already queued from the client
//! (its ClientHello, usually there when the server accepts) is read and
//! dropped first, so that the close is a FIN after the alert, not a reset
//! that could overtake it. A TLS client fails its handshake at once with a
//! clear error instead of waiting for a timeout: rustls reports
//! `AlertReceived(UserCanceled)`, which edgetunnel's agent recognises as
//! "server busy" (the agent's backoff, `agent/backoff.rs`) and backs off from
//! (growing, jittered delays); Go's crypto/tls reports `remote error: tls:
//! user canceled`, and ANP's Go agent backs off from any failed connect
//! (its `ClientSet.sync` in pkg/agent/clientset.go: `backoff.Step()`,
//! factor 1.5, jitter 0.1, from `--sync-interval` up to
//! `--sync-interval-cap`; pkg/agent/client.go `Connect` fails as soon as
//! gRPC's transport handshake fails). A connection shed after it was
//! admitted is only closed: its TLS may have started, and a plaintext
//! alert would then be a protocol error.
//!
//! What a handshake in flight costs the server is bounded by the total cap:
//! measured with 400 held at once (release build, mimalloc), 26 KiB each
//! for a connection that sent half a ClientHello and 40 KiB for one that
//! completed TLS while the memory is fresh, but 180-210 KiB each once it is
//! recycled from earlier connections (a restart: shed and failed
//! handshakes free theirs), because the 256 KiB read-ahead buffer under
//! rustls (`engine::read_ahead`) is zeroed when reused. At the default cap
//! of 1,024 that is up to about 210 MB in flight; without that buffer
//! during the handshake, about 40 MB.
//!
//! [`Table`] is the pure bookkeeping (no clock, no I/O); [`Admission`]
//! shares it between the cores (one short lock per accept) and hands out
//! [`Permit`]s that give their slot back when dropped and resolve
//! [`Permit::shed`] when a newcomer took their slot.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use protocol::spare::ReleaseSpare;

/// How long a new connection keeps its slot whatever comes after it, on
/// average: each slot's grace is spread from half to one and a half times
/// this ([`Table::grace`]), so that a flood's slots, taken in bursts, do
/// not all come free at the same moment (a real agent retrying then finds
/// one far more often than in one narrow window per period).
pub const SHED_GRACE: Duration = Duration::from_secs(1);

/// The longest mean grace, however slow recent handshakes were (well
/// under the server's 15 s handshake timeout).
pub const MAX_GRACE: Duration = Duration::from_secs(8);

/// The plaintext TLS record a refused connection is answered with: an
/// alert (content type 21), record version TLS 1.2 (0x0303, what a first
/// flight uses), length 2, level fatal (2), description `user_canceled`
/// (90).
pub const BUSY_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 90];

/// Answers a connection refused by the caps, before any TLS work: reads
/// and drops what the client already sent (its ClientHello, at most 64
/// KiB, without waiting), writes [`BUSY_ALERT`] (without waiting: a new
/// socket's send buffer is empty). The caller then closes it. Errors are
/// ignored: the connection is being closed anyway.
pub fn refuse(sock: &impl std::os::fd::AsRawFd) {
    crate::sys::with_sock(sock, |s| {
        let flags = libc::MSG_DONTWAIT;
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 16 * 1024];
        for _ in 0..4 {
            match s.recv_with_flags(&mut buf, flags) {
                Ok(n) if n == buf.len() => continue,
                _ => break,
            }
        }
        let _ = s.send_with_flags(&BUSY_ALERT, flags | libc::MSG_NOSIGNAL);
    });
}

/// The caps; 0 means no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_ip: usize,
}

/// Why a connection was not admitted (or, for a shed one, which cap made
/// room for a newcomer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("too many connections in their handshake")]
    Total,
    #[error("too many connections in their handshake from this address")]
    PerIp,
}

impl Refused {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Total => "total",
            Refused::PerIp => "per_ip",
        }
    }
}

/// How far a connection's handshake has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Accepted; TLS not complete. May be shed for a newcomer.
    Accepted,
    /// TLS complete. Never shed.
    Tls,
}

/// One handshake's slot.
pub type Slot = u64;

/// A slot taken: its number and the slot shed to make room, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub slot: Slot,
    pub shed: Option<(Slot, Refused)>,
}

#[derive(Debug)]
struct Entry {
    ip: Option<IpAddr>,
    stage: Stage,
    since: Instant,
}

/// Connections in their handshake, in total and by source address.
#[derive(Debug)]
pub struct Table {
    limits: Limits,
    /// Slots are handed out in increasing order: a smaller one is older.
    entries: HashMap<Slot, Entry>,
    by_ip: HashMap<IpAddr, usize>,
    next: Slot,
    /// The recent time to complete TLS (a moving average), if any
    /// completed yet.
    typical: Option<Duration>,
}

/// The "address" the per-address cap counts: an IPv4 address (IPv4-mapped
/// IPv6 addresses count as the IPv4 address), or an IPv6 address's /64. A
/// single host or site is routinely given a whole /64 (SLAAC, RFC 4291's
/// interface identifiers), so counting whole IPv6 addresses would give one
/// flooding peer 2^64 "addresses", each with a cap of its own.
pub const IPV6_PREFIX: u32 = 64;

fn key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mask = u128::MAX << (128 - IPV6_PREFIX);
            IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & mask))
        }
        v4 => v4,
    }
}

impl Table {
    pub fn new(limits: Limits) -> Self {
        Table {
            limits,
            entries: HashMap::new(),
            by_ip: HashMap::new(),
            next: 0,
            typical: None,
        }
    }

    /// The recent time a handshake took to complete TLS: a moving average
    /// (weight 1/8 for each new one) of the completed ones.
    pub fn typical(&self) -> Option<Duration> {
        self.typical
    }

    /// The mean grace now: [`SHED_GRACE`], or twice the typical time to
    /// complete TLS when that is longer, at most [`MAX_GRACE`].
    pub fn mean_grace(&self) -> Duration {
        let paced = self.typical.unwrap_or_default() * 2;
        paced.clamp(SHED_GRACE, MAX_GRACE)
    }

    /// The grace of `slot` for a mean grace of [`SHED_GRACE`]: from half
    /// to one and a half of it, spread by a hash of the slot number
    /// (deterministic).
    pub fn grace(slot: Slot) -> Duration {
        Self::spread(slot, SHED_GRACE)
    }

    /// From half to one and a half `mean`, spread by a hash of `slot`.
    fn spread(slot: Slot, mean: Duration) -> Duration {
        // splitmix64's finaliser.
        let mut z = slot.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        mean / 2 + mean.mul_f64((z % 1024) as f64 / 1024.0)
    }

    /// Whether a newcomer may take `slot`'s place at `now`.
    fn sheddable(&self, slot: Slot, e: &Entry, now: Instant) -> bool {
        e.stage == Stage::Accepted
            && now.saturating_duration_since(e.since) >= Self::spread(slot, self.mean_grace())
    }

    /// The oldest sheddable slot among those `pick` accepts.
    fn oldest_sheddable(&self, now: Instant, pick: impl Fn(&Entry) -> bool) -> Option<Slot> {
        self.entries
            .iter()
            .filter(|(s, e)| self.sheddable(**s, e, now) && pick(e))
            .map(|(s, _)| *s)
            .min()
    }

    /// What to shed for a newcomer over the total cap: the oldest
    /// sheddable handshake of the address holding the most of them (no
    /// address: counted as one more address).
    fn total_victim(&self, now: Instant) -> Option<Slot> {
        let mut sheddable: HashMap<Option<IpAddr>, usize> = HashMap::new();
        for (_, e) in self
            .entries
            .iter()
            .filter(|(s, e)| self.sheddable(**s, e, now))
        {
            *sheddable.entry(e.ip).or_default() += 1;
        }
        let (&worst, _) = sheddable.iter().max_by_key(|(ip, n)| (**n, **ip))?;
        self.oldest_sheddable(now, |e| e.ip == worst)
    }

    /// Takes a slot for a connection from `ip` (`None`: no address, only
    /// the total counts) at `now`, shedding an unfinished handshake when a
    /// cap is full; refuses only when no slot in the way may be shed.
    pub fn admit(&mut self, ip: Option<IpAddr>, now: Instant) -> Result<Admitted, Refused> {
        let ip = ip.map(key);
        let mut shed = None;
        if let Some(ip) = ip {
            let n = self.by_ip.get(&ip).copied().unwrap_or(0);
            if self.limits.per_ip != 0 && n >= self.limits.per_ip {
                let victim = self
                    .oldest_sheddable(now, |e| e.ip == Some(ip))
                    .ok_or(Refused::PerIp)?;
                shed = Some((victim, Refused::PerIp));
            }
        }
        if shed.is_none() && self.limits.total != 0 && self.entries.len() >= self.limits.total {
            let victim = self.total_victim(now).ok_or(Refused::Total)?;
            shed = Some((victim, Refused::Total));
        }
        if let Some((victim, _)) = shed {
            self.release(victim);
        }
        let slot = self.next;
        self.next += 1;
        self.entries.insert(
            slot,
            Entry {
                ip,
                stage: Stage::Accepted,
                since: now,
            },
        );
        if let Some(ip) = ip {
            *self.by_ip.entry(ip).or_insert(0) += 1;
        }
        Ok(Admitted { slot, shed })
    }

    /// The connection in `slot` completed TLS at `now`: it is no longer
    /// shed, and the time it took counts in [`Table::typical`].
    pub fn advance(&mut self, slot: Slot, now: Instant) {
        if let Some(e) = self.entries.get_mut(&slot) {
            if e.stage == Stage::Accepted {
                // One straggler moves the average by at most MAX_GRACE / 8.
                let took = now.saturating_duration_since(e.since).min(MAX_GRACE);
                self.typical = Some(match self.typical {
                    None => took,
                    Some(t) => (t * 7 + took) / 8,
                });
            }
            e.stage = Stage::Tls;
        }
    }

    /// Gives back a slot (nothing if it was shed already); whether it was
    /// still held.
    pub fn release(&mut self, slot: Slot) -> bool {
        let Some(e) = self.entries.remove(&slot) else {
            return false;
        };
        self.entries.release_spare();
        if let Some(ip) = e.ip {
            if let Some(n) = self.by_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    self.by_ip.remove(&ip);
                    self.by_ip.release_spare();
                }
            }
        }
        true
    }

    /// Connections in their handshake.
    pub fn in_progress(&self) -> usize {
        self.entries.len()
    }

    /// Addresses with a connection in its handshake.
    pub fn addresses(&self) -> usize {
        self.by_ip.len()
    }
}

/// Where the cap reports: the in-progress gauge, refusals and sheddings
/// by cap.
#[derive(Debug, Clone, Default)]
pub struct AdmissionMetrics {
    pub in_progress: Gauge,
    /// The caps in force (0: none), set once at start.
    pub cap_total: Gauge,
    pub cap_per_ip: Gauge,
    pub refused_total: Counter,
    pub refused_per_ip: Counter,
    pub shed_total: Counter,
    pub shed_per_ip: Counter,
}

/// Tells a connection its slot was taken.
#[derive(Debug, Default)]
struct ShedSignal {
    shed: AtomicBool,
    waker: AtomicWaker,
}

#[derive(Debug)]
struct Shared {
    table: Table,
    signals: HashMap<Slot, Arc<ShedSignal>>,
}

/// A [`Table`] shared by every core.
#[derive(Debug)]
pub struct Admission {
    inner: Mutex<Shared>,
    metrics: AdmissionMetrics,
}

impl Admission {
    pub fn new(limits: Limits, metrics: AdmissionMetrics) -> Arc<Self> {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        metrics.cap_total.set(gauge(limits.total));
        metrics.cap_per_ip.set(gauge(limits.per_ip));
        Arc::new(Admission {
            inner: Mutex::new(Shared {
                table: Table::new(limits),
                signals: HashMap::new(),
            }),
            metrics,
        })
    }

    /// A permit for a connection from `ip`, or why there is none (counted).
    /// A connection shed to make room is told through its permit.
    pub fn admit(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<Permit, Refused> {
        self.admit_at(ip, Instant::now())
    }

    /// [`Admission::admit`] at `now`.
    pub fn admit_at(self: &Arc<Self>, ip: Option<IpAddr>, now: Instant) -> Result<Permit, Refused> {
        let mut g = self.inner.lock().expect("admission lock");
        match g.table.admit(ip, now) {
            Ok(a) => {
                let signal = Arc::new(ShedSignal::default());
                g.signals.insert(a.slot, signal.clone());
                if let Some((victim, cap)) = a.shed {
                    if let Some(s) = g.signals.remove(&victim) {
                        g.signals.release_spare();
                        s.shed.store(true, Ordering::Release);
                        s.waker.wake();
                    }
                    self.metrics.in_progress.dec();
                    match cap {
                        Refused::Total => self.metrics.shed_total.inc(),
                        Refused::PerIp => self.metrics.shed_per_ip.inc(),
                    };
                }
                drop(g);
                self.metrics.in_progress.inc();
                Ok(Permit {
                    owner: self.clone(),
                    slot: a.slot,
                    signal,
                })
            }
            Err(e) => {
                drop(g);
                match e {
                    Refused::Total => self.metrics.refused_total.inc(),
                    Refused::PerIp => self.metrics.refused_per_ip.inc(),
                };
                Err(e)
            }
        }
    }

    pub fn in_progress(&self) -> usize {
        self.inner
            .lock()
            .expect("admission lock")
            .table
            .in_progress()
    }
}

/// A connection's slot while it is in its handshake; dropping it (the
/// handshake is done, or the connection is gone) frees the slot.
#[derive(Debug)]
pub struct Permit {
    owner: Arc<Admission>,
    slot: Slot,
    signal: Arc<ShedSignal>,
}

impl Permit {
    /// The connection completed TLS: a newcomer can no longer shed it.
    pub fn advance(&self) {
        let now = Instant::now();
        let mut g = self.owner.inner.lock().expect("admission lock");
        g.table.advance(self.slot, now);
    }

    /// Resolves when a newcomer took this connection's slot: close it.
    pub async fn shed(&self) {
        futures::future::poll_fn(|cx| {
            if self.signal.shed.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            self.signal.waker.register(cx.waker());
            if self.signal.shed.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut g = self.owner.inner.lock().expect("admission lock");
        if g.table.release(self.slot) {
            g.signals.remove(&self.slot);
            g.signals.release_spare();
            drop(g);
            self.owner.metrics.in_progress.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    fn limits(total: usize, per_ip: usize) -> Limits {
        Limits { total, per_ip }
    }

    /// A clock for the table: `at(n)` is n grace periods after the start.
    fn at(n: u32) -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now) + SHED_GRACE * n
    }

    /// One /64 is one address for the cap; another /64 is another, and an
    /// IPv4-mapped address is its IPv4 address.
    #[test]
    fn ipv6_addresses_count_by_their_64_prefix() {
        assert_eq!(
            key("2001:db8:1:2::1".parse().unwrap()),
            key("2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap())
        );
        assert_ne!(
            key("2001:db8:1:2::1".parse().unwrap()),
            key("2001:db8:1:3::1".parse().unwrap())
        );
        assert_eq!(
            key("::ffff:10.0.0.1".parse().unwrap()),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
        // The cap holds across a /64: the third connection from any of its
        // addresses sheds the oldest unfinished one of the prefix.
        let mut t = Table::new(limits(100, 2));
        let first = t.admit(ip("2001:db8::1"), at(0)).unwrap().slot;
        t.admit(ip("2001:db8::2"), at(0)).unwrap();
        let third = t.admit(ip("2001:db8::ffff:3"), at(2)).unwrap();
        assert_eq!(third.shed, Some((first, Refused::PerIp)));
        // Another /64 has a cap of its own.
        assert_eq!(t.admit(ip("2001:db8:0:1::1"), at(2)).unwrap().shed, None);
    }

    #[test]
    fn per_address_cap_sheds_the_oldest_unfinished_of_that_address() {
        let mut t = Table::new(limits(10, 2));
        let a = t.admit(ip("10.0.0.1"), at(0)).unwrap().slot;
        let b = t.admit(ip("::ffff:10.0.0.1"), at(0)).unwrap().slot;
        let other = t.admit(ip("10.0.0.2"), at(0)).unwrap().slot;
        // Full for 10.0.0.1, both within their grace: refused.
        assert_eq!(t.admit(ip("10.0.0.1"), at(0)), Err(Refused::PerIp));
        // After it, the oldest of its own goes, not 10.0.0.2's.
        let c = t.admit(ip("10.0.0.1"), at(2)).unwrap();
        assert_eq!(c.shed, Some((a, Refused::PerIp)));
        assert_eq!(t.in_progress(), 3);
        // A finished TLS handshake is never shed, however old...
        t.advance(b, at(0));
        let d = t.admit(ip("10.0.0.1"), at(4)).unwrap();
        assert_eq!(d.shed, Some((c.slot, Refused::PerIp)));
        t.advance(d.slot, at(4));
        // ...and with every slot of the address finished, a newcomer is
        // refused.
        assert_eq!(t.admit(ip("10.0.0.1"), at(9)), Err(Refused::PerIp));
        assert!(!t.release(a), "shed slots are gone already");
        assert!(t.release(other));
        assert!(t.release(b) && t.release(d.slot));
        assert_eq!((t.in_progress(), t.addresses()), (0, 0));
    }

    #[test]
    fn total_cap_sheds_from_the_address_holding_the_most() {
        let mut t = Table::new(limits(4, 0));
        let real = t.admit(ip("10.0.0.9"), at(0)).unwrap().slot;
        let flood: Vec<Slot> = (0..3)
            .map(|_| t.admit(ip("10.0.0.1"), at(0)).unwrap().slot)
            .collect();
        // The flooding address pays, even though `real` is older.
        let n = t.admit(ip("10.0.0.5"), at(2)).unwrap();
        assert_eq!(n.shed, Some((flood[0], Refused::Total)));
        let m = t.admit(ip("10.0.0.1"), at(2)).unwrap();
        assert_eq!(m.shed, Some((flood[1], Refused::Total)));
        assert!(t.release(real));
        // Connections without an address count as one address.
        let mut t = Table::new(limits(2, 0));
        t.admit(None, at(0)).unwrap();
        t.admit(None, at(0)).unwrap();
        assert!(t.admit(ip("10.0.0.1"), at(2)).unwrap().shed.is_some());
    }

    #[test]
    fn refuses_only_when_no_slot_may_be_shed() {
        let mut t = Table::new(limits(2, 0));
        let a = t.admit(ip("10.0.0.1"), at(0)).unwrap().slot;
        let b = t.admit(ip("10.0.0.2"), at(0)).unwrap().slot;
        t.advance(a, at(0));
        t.advance(b, at(0));
        assert_eq!(t.admit(ip("10.0.0.3"), at(5)), Err(Refused::Total));
        assert_eq!(t.admit(None, at(5)), Err(Refused::Total));
        t.release(a);
        assert_eq!(t.admit(None, at(5)).unwrap().shed, None);
    }

    /// A flood that reconnects in a tight loop, keeping every slot of its
    /// address busy, and a real agent of the same address that retries:
    /// it gets a slot once one is past its grace, keeps it for its grace
    /// whatever the flood does, and is in once its TLS is done.
    #[test]
    fn a_real_agent_gets_in_during_a_flood_from_its_address() {
        let mut t = Table::new(limits(64, 8));
        let nat = ip("192.0.2.1");
        let mut admitted = 0;
        for _ in 0..1_000 {
            admitted += usize::from(t.admit(nat, at(0)).is_ok());
        }
        assert_eq!(admitted, 8, "within the grace: the cap, no churn");
        // A grace period later the flood's slots may be shed; the agent
        // retries at some point and takes one.
        let real = t.admit(nat, at(2)).unwrap();
        assert!(real.shed.is_some());
        // The flood keeps hammering: it sheds the other old ones, never
        // the agent's young slot.
        for _ in 0..1_000 {
            let _ = t.admit(nat, at(2));
        }
        t.advance(real.slot, at(2));
        for _ in 0..1_000 {
            let _ = t.admit(nat, at(7));
        }
        assert!(t.release(real.slot), "the real agent kept its slot");
    }

    /// A restart: real handshakes take seconds because the server is busy
    /// with them. A newcomer is refused (cheap) instead of shedding a
    /// handshake the server has started on; a stalled one is still shed
    /// once past the longer grace; the grace comes back down with the pace.
    #[test]
    fn a_server_slow_with_real_handshakes_refuses_rather_than_sheds() {
        let mut t = Table::new(limits(4, 0));
        assert_eq!((t.typical(), t.mean_grace()), (None, SHED_GRACE));
        for _ in 0..8 {
            let s = t.admit(ip("10.0.0.1"), at(0)).unwrap().slot;
            t.advance(s, at(3));
            assert!(t.release(s));
        }
        assert_eq!(t.typical(), Some(SHED_GRACE * 3));
        assert_eq!(t.mean_grace(), SHED_GRACE * 6);
        let held: Vec<Slot> = (0..4)
            .map(|i| t.admit(ip(&format!("10.0.1.{i}")), at(10)).unwrap().slot)
            .collect();
        // Two periods in (past the fixed grace of old): refused.
        assert_eq!(t.admit(ip("10.0.2.1"), at(12)), Err(Refused::Total));
        // Past one and a half of the longer grace: a stall, shed.
        let late = t.admit(ip("10.0.2.1"), at(20)).unwrap();
        assert!(matches!(late.shed, Some((s, Refused::Total)) if held.contains(&s)));
        // Fast handshakes bring the grace back to SHED_GRACE.
        for _ in 0..40 {
            let s = t.admit(ip("10.0.0.1"), at(30)).unwrap();
            t.advance(s.slot, at(30));
            t.release(s.slot);
        }
        assert_eq!(t.mean_grace(), SHED_GRACE);
        // One straggler moves it little; however slow they are, the
        // grace is never past MAX_GRACE.
        let s = t.admit(ip("10.0.0.1"), at(30)).unwrap().slot;
        t.advance(s, at(1000));
        assert!(t.mean_grace() < SHED_GRACE * 3, "{:?}", t.mean_grace());
        // Only the first completion of a slot counts.
        t.advance(s, at(5000));
        assert!(t.mean_grace() < SHED_GRACE * 3);
        for _ in 0..40 {
            let s = t.admit(ip("10.0.0.1"), at(30)).unwrap().slot;
            t.advance(s, at(1000));
            t.release(s);
        }
        assert_eq!(t.mean_grace(), MAX_GRACE);
    }

    #[test]
    fn graces_spread_over_half_to_one_and_a_half_periods() {
        let g: Vec<Duration> = (0..1000).map(Table::grace).collect();
        assert!(g
            .iter()
            .all(|d| *d >= SHED_GRACE / 2 && *d < SHED_GRACE * 3 / 2));
        let early = g.iter().filter(|d| **d < SHED_GRACE).count();
        assert!(
            (400..600).contains(&early),
            "{early} of 1000 below the mean"
        );
    }

    #[test]
    fn zero_means_no_cap() {
        let mut t = Table::new(limits(0, 0));
        for _ in 0..10_000 {
            assert_eq!(t.admit(ip("10.0.0.1"), at(0)).unwrap().shed, None);
        }
    }

    #[test]
    fn permits_release_count_and_hear_they_were_shed() {
        let m = AdmissionMetrics::default();
        let a = Admission::new(limits(1, 1), m.clone());
        let first = a.admit_at(ip("10.0.0.1"), at(0)).unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let second = {
            let mut shed = pin!(first.shed());
            assert!(shed.as_mut().poll(&mut cx).is_pending());
            assert_eq!(
                a.admit_at(ip("10.0.0.2"), at(0)).unwrap_err(),
                Refused::Total
            );
            let second = a.admit_at(ip("10.0.0.2"), at(2)).unwrap();
            assert!(shed.as_mut().poll(&mut cx).is_ready());
            second
        };
        assert_eq!((m.in_progress.get(), m.shed_total.get()), (1, 1));
        drop(first);
        assert_eq!(m.in_progress.get(), 1, "a shed permit frees nothing twice");
        second.advance();
        assert_eq!(
            a.admit_at(ip("10.0.0.3"), at(5)).unwrap_err(),
            Refused::Total
        );
        assert_eq!(m.refused_total.get(), 2);
        drop(second);
        assert_eq!((m.in_progress.get(), a.in_progress()), (0, 0));
    }
}
