//! Per-connection flow control between edgetunnel peers (the negotiated
//! `window` extension, see [`protocol::FEATURE_WINDOW`]).
//!
//! ANP multiplexes every tunneled connection of an agent on one gRPC stream
//! and has no per-connection flow control: a connection whose reader stalls
//! can only be buffered (without bound) or make the shared stream wait,
//! which stalls every other connection of the agent. With the extension,
//! a sender keeps at most [`TUNNEL_WINDOW`] bytes of one connection
//! unacknowledged, and the receiver acknowledges payload once it has been
//! written to the local socket, so it can always accept what arrives
//! without waiting and without unbounded memory.
//!
//! One [`ConnWindow`] serves both directions of one tunneled connection:
//! the send half is charged by the task reading the local socket and
//! credited when the peer's window update arrives; the receive half counts
//! payload written to the local socket and sends the peer a window update
//! each time a quarter of the window has been consumed. Atomics, so either
//! half may be touched from whichever core holds the other end.
//!
//! Where both ends negotiated `window-growth`
//! ([`protocol::FEATURE_WINDOW_GROWTH`]), the receiver grows the
//! window it grants while the sender is held by it
//! ([`protocol::anp::window_tuning`], with the agent link's round
//! trip from the kernel, [`LinkPath`]): a window update then acknowledges
//! more than was consumed, and the sender's credit grows by the surplus.
//! Growth is drawn from the link's budget ([`LINK_GROWTH_BUDGET`]) and
//! returned when the connection ends; no window passes
//! [`MAX_TUNNEL_WINDOW`], and a sender never lets a peer's surplus take it
//! past that either. A fixed 2 MiB window moves 2 MiB a round trip: 21 MB/s
//! at 100 ms, 7 MB/s at 300 ms.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use futures::task::AtomicWaker;

use protocol::anp::packet::{self, Frame};
use protocol::anp::window_tuning::Epoch;

/// Unacknowledged bytes one connection may have in flight per direction
/// at its start (and for good without `window-growth`).
pub const TUNNEL_WINDOW: u64 = 2 * 1024 * 1024;

/// The largest window one connection grows to: 64 MiB, a round trip of
/// 300 ms at 1.7 Gbit/s.
pub const MAX_TUNNEL_WINDOW: u64 = 64 * 1024 * 1024;

/// Growth all the connections of one agent link may hold at once, past
/// their first [`TUNNEL_WINDOW`]: what a link's readers may have to buffer
/// beyond today's windows if all of them stalled after growing.
pub const LINK_GROWTH_BUDGET: u64 = 256 * 1024 * 1024;

/// What a peer may send past the window it was granted before it counts
/// as ignoring it: a sender checks the window, then reads and sends one
/// chunk (at most 256 KiB, a gRPC frontend's message), so a conforming
/// peer stays within the window plus a chunk.
pub const OVERRUN_SLACK: u64 = 1024 * 1024;

/// How often a link's round trip is read from the kernel, at most.
pub const RTT_SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// Upper bounds (seconds) of `edgetunnel_agent_link_rtt_seconds`: a
/// loopback or rack link to a satellite one.
const RTT_BUCKETS: [f64; 14] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0,
];

/// Every link round trip sampled by this process
/// (`edgetunnel_agent_link_rtt_seconds`).
pub fn link_rtt_histogram() -> &'static prometheus_client::metrics::histogram::Histogram {
    static H: OnceLock<prometheus_client::metrics::histogram::Histogram> = OnceLock::new();
    H.get_or_init(|| prometheus_client::metrics::histogram::Histogram::new(RTT_BUCKETS))
}

/// Window growth held now by every connection of the process
/// (`edgetunnel_tunnel_window_growth_bytes`).
static GROWN: AtomicU64 = AtomicU64::new(0);

/// Bytes by which the windows of every open connection have grown.
pub fn window_growth_bytes() -> u64 {
    GROWN.load(Ordering::Relaxed)
}

/// What the connections of one agent link share: the queue their window
/// updates take, the link's round-trip time (sampled from the kernel) and
/// the budget their windows grow from.
#[derive(Debug)]
pub struct LinkPath {
    ctl: UnboundedSender<Frame>,
    /// Both ends negotiated `window-growth`.
    grows: bool,
    rtt_us: AtomicU64,
    sampled_at_us: AtomicU64,
    grown: AtomicU64,
    budget: u64,
}

/// Microseconds since the first call (a monotonic clock in one word).
fn clock_us(now: Instant) -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    now.duration_since(*BASE.get_or_init(Instant::now))
        .as_micros() as u64
}

impl LinkPath {
    /// A link's path: `ctl`, the link's queue of control packets (window
    /// updates go there); `grows`, both ends negotiated `window-growth`.
    pub fn new(ctl: UnboundedSender<Frame>, grows: bool) -> Arc<Self> {
        Self::with_budget(ctl, grows, LINK_GROWTH_BUDGET)
    }

    pub fn with_budget(ctl: UnboundedSender<Frame>, grows: bool, budget: u64) -> Arc<Self> {
        Arc::new(LinkPath {
            ctl,
            grows,
            rtt_us: AtomicU64::new(0),
            sampled_at_us: AtomicU64::new(0),
            grown: AtomicU64::new(0),
            budget,
        })
    }

    /// Reads the round trip of the link's TCP connection from the kernel
    /// (`TCP_INFO`), at most every `every`; the new sample, if one was
    /// taken.
    pub fn sample(&self, sock: &impl AsRawFd, every: Duration) -> Option<Duration> {
        let now = clock_us(Instant::now()) + 1;
        let last = self.sampled_at_us.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < every.as_micros() as u64 {
            return None;
        }
        self.sampled_at_us.store(now, Ordering::Relaxed);
        let rtt = crate::sys::tcp_rtt(sock)?;
        self.set_rtt(rtt);
        link_rtt_histogram().observe(rtt.as_secs_f64());
        Some(rtt)
    }

    pub fn set_rtt(&self, rtt: Duration) {
        self.rtt_us
            .store((rtt.as_micros() as u64).max(1), Ordering::Relaxed);
    }

    /// The link's smoothed round trip, once sampled.
    pub fn rtt(&self) -> Option<Duration> {
        match self.rtt_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Growth held by this link's connections now.
    pub fn grown(&self) -> u64 {
        self.grown.load(Ordering::Relaxed)
    }

    /// Takes up to `want` bytes of the growth budget.
    fn reserve(&self, want: u64) -> u64 {
        let mut got = 0;
        let _ = self
            .grown
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |g| {
                got = want.min(self.budget.saturating_sub(g));
                Some(g + got)
            });
        GROWN.fetch_add(got, Ordering::Relaxed);
        got
    }

    fn release(&self, n: u64) {
        self.grown.fetch_sub(n, Ordering::AcqRel);
        GROWN.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Where a connection's window updates go, once it has its connectID.
#[derive(Debug)]
struct Peer {
    connect_id: i64,
    path: Arc<LinkPath>,
}

/// Both halves of one connection's window.
///
/// Every idle tunnel holds one at each end, so its size is memory per
/// idle tunnel: 80 bytes, 96 with the `Arc`'s counts (an allocator size
/// class), as before windows grew. Hence 32-bit counts where the window
/// bounds them (no window passes [`MAX_TUNNEL_WINDOW`]), the tuning state
/// in one word ([`Epoch`]) and the link's queue in the [`LinkPath`].
#[derive(Debug)]
pub struct ConnWindow {
    /// Bytes sent to the peer and not yet acknowledged; below 0 when the
    /// peer granted more (its window grew), down to
    /// `limit - MAX_TUNNEL_WINDOW`.
    in_flight: AtomicI64,
    waiter: AtomicWaker,
    peer: OnceLock<Peer>,
    /// The first window, both ways.
    limit: u32,
    /// Bytes received from the peer, written locally, not yet acknowledged
    /// (less than a quarter window once bound).
    consumed: AtomicU32,
    /// The window granted to the peer now (acknowledgements go out a
    /// quarter of it at a time).
    recv_window: AtomicU32,
    /// Payload bytes received from the peer less those acknowledged to it
    /// (the growth granted included; saturating): a peer past its window
    /// is told apart.
    unacknowledged: AtomicI32,
    /// The receive window's tuning epoch ([`Epoch::to_bits`]).
    epoch: AtomicU64,
}

/// Microseconds of [`clock_us`] in the 32 bits an [`Epoch`] keeps.
fn epoch_clock(now: Instant) -> u32 {
    clock_us(now) as u32
}

impl ConnWindow {
    /// A window of `limit` bytes each way (at most [`MAX_TUNNEL_WINDOW`]:
    /// the counts are 32 bits).
    pub fn new(limit: u64) -> Arc<Self> {
        let limit = limit.clamp(1, MAX_TUNNEL_WINDOW) as u32;
        Arc::new(Self {
            in_flight: AtomicI64::new(0),
            waiter: AtomicWaker::new(),
            peer: OnceLock::new(),
            limit,
            consumed: AtomicU32::new(0),
            recv_window: AtomicU32::new(limit),
            unacknowledged: AtomicI32::new(0),
            epoch: AtomicU64::new(0),
        })
    }

    /// Names the connection and the link it crosses (where its window
    /// updates go); the receive window's tuning starts.
    pub fn bind(&self, connect_id: i64, path: Arc<LinkPath>) {
        if path.grows {
            let start = Epoch::starting(epoch_clock(Instant::now()));
            self.epoch.store(start.to_bits(), Ordering::Release);
        }
        let _ = self.peer.set(Peer { connect_id, path });
    }

    /// Waits until the peer has room for more of this connection's data.
    /// A sender reads at most one chunk after this returns, so in-flight
    /// data stays below the window plus one chunk. Only the one task that
    /// reads the connection's local socket may wait.
    pub async fn ready(&self) {
        futures::future::poll_fn(|cx| self.poll_ready(cx)).await
    }

    /// [`Self::ready`] as a poll function.
    pub fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let limit = i64::from(self.limit);
        if self.in_flight.load(Ordering::Acquire) < limit {
            return Poll::Ready(());
        }
        self.waiter.register(cx.waker());
        if self.in_flight.load(Ordering::Acquire) < limit {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Records `n` payload bytes handed to the peer.
    pub fn sent(&self, n: usize) {
        self.in_flight.fetch_add(n as i64, Ordering::AcqRel);
    }

    /// The peer acknowledged `n` bytes (more than it was sent when its
    /// window grew). However much a peer grants, the unacknowledged bytes
    /// allowed stay within [`MAX_TUNNEL_WINDOW`].
    pub fn granted(&self, n: u64) {
        let limit = u64::from(self.limit);
        let floor = limit as i64 - MAX_TUNNEL_WINDOW.max(limit) as i64;
        let n = n.min(i64::MAX as u64) as i64;
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(n).max(floor))
            });
        self.waiter.wake();
    }

    /// Bytes sent and not yet acknowledged (below 0: credit granted past
    /// the first window).
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// The window granted to the peer now.
    pub fn recv_window(&self) -> u64 {
        u64::from(self.recv_window.load(Ordering::Acquire))
    }

    /// `n` received bytes were written to the local socket (or dropped):
    /// acknowledges them to the peer in batches of a quarter window, with
    /// the window's growth when the tuning decides on it.
    pub fn consumed(&self, n: usize) {
        // Below a quarter window (a few MiB) plus one write once bound;
        // nothing is received before.
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        let total = u64::from(self.consumed.fetch_add(n, Ordering::AcqRel)) + u64::from(n);
        let Some(peer) = self.peer.get() else {
            return;
        };
        if total < (self.recv_window() / 4).max(1) {
            return;
        }
        let taken = u64::from(self.consumed.swap(0, Ordering::AcqRel));
        if taken > 0 {
            let grant = taken + self.grow(taken, &peer.path);
            self.count_unacknowledged(-(grant.min(i32::MAX as u64) as i64));
            let _ = peer
                .path
                .ctl
                .unbounded_send(packet::window_update(peer.connect_id, grant));
        }
    }

    /// Adds `d` to the bytes received and not acknowledged (saturating);
    /// the count after.
    fn count_unacknowledged(&self, d: i64) -> i64 {
        let mut now = 0;
        let _ = self
            .unacknowledged
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                now = (i64::from(v) + d).clamp(i64::from(i32::MIN), i64::from(i32::MAX));
                Some(now as i32)
            });
        now
    }

    /// `n` payload bytes arrived from the peer. `false` when the peer has
    /// sent past the window it was granted (its sender reads one chunk past
    /// the window at most: [`OVERRUN_SLACK`] allows for it): a peer that
    /// ignores the window would make us buffer without bound.
    pub fn received(&self, n: usize) -> bool {
        let outstanding = self.count_unacknowledged(n.min(i32::MAX as usize) as i64);
        outstanding <= (u64::from(self.limit) + OVERRUN_SLACK) as i64
    }

    /// How much the window grows with this acknowledgement (0: none).
    fn grow(&self, taken: u64, path: &LinkPath) -> u64 {
        if !path.grows {
            return 0;
        }
        let (now, rtt, window) = (epoch_clock(Instant::now()), path.rtt(), self.recv_window());
        let mut want = 0;
        let _ = self
            .epoch
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                let (next, w) =
                    Epoch::from_bits(bits).on_ack(taken, window, now, rtt, MAX_TUNNEL_WINDOW);
                want = w;
                Some(next.to_bits())
            });
        if want == 0 {
            return 0;
        }
        let got = path.reserve(want);
        // Within MAX_TUNNEL_WINDOW (the tuning's cap): a u32.
        self.recv_window.fetch_add(got as u32, Ordering::AcqRel);
        got
    }
}

impl Drop for ConnWindow {
    fn drop(&mut self) {
        let grown = u64::from(self.recv_window.load(Ordering::Acquire) - self.limit);
        if let Some(peer) = self.peer.get() {
            if grown > 0 {
                peer.path.release(grown);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    #[test]
    fn sender_waits_at_the_limit_and_resumes_on_grant() {
        let w = ConnWindow::new(100);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(pin!(w.ready()).poll(&mut cx).is_ready());
        w.sent(60);
        assert!(pin!(w.ready()).poll(&mut cx).is_ready());
        w.sent(60);
        let mut waiting = pin!(w.ready());
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        w.granted(30);
        assert_eq!(w.in_flight(), 90);
        assert!(waiting.as_mut().poll(&mut cx).is_ready());
        // Acknowledging more than was sent is credit (the peer's window
        // grew), up to MAX_TUNNEL_WINDOW unacknowledged and no further.
        w.granted(1_000);
        assert_eq!(w.in_flight(), -910);
        w.granted(u64::MAX);
        assert_eq!(w.in_flight(), 100 - MAX_TUNNEL_WINDOW as i64);
        w.sent(MAX_TUNNEL_WINDOW as usize);
        assert!(pin!(w.ready()).poll(&mut cx).is_pending());
    }

    #[test]
    fn receiver_acknowledges_in_quarter_window_batches() {
        let w = ConnWindow::new(100);
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        // Not yet bound: counting is harmless, nothing is sent.
        w.consumed(10);
        w.bind(7, LinkPath::new(tx, false));
        w.consumed(10);
        assert!(rx.try_recv().is_err(), "below a quarter window");
        w.consumed(5);
        assert_eq!(rx.try_recv().ok(), Some(packet::window_update(7, 25)));
        w.consumed(24);
        assert!(rx.try_recv().is_err());
    }

    /// With `window-growth`, a window consumed within round trips grows:
    /// the acknowledgement carries the surplus, the link's budget holds
    /// it, and it comes back when the connection ends.
    #[test]
    fn a_window_consumed_fast_grows_within_the_links_budget() {
        let mib = 1024 * 1024;
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        let path = LinkPath::with_budget(tx, true, 5 * mib);
        path.set_rtt(Duration::from_secs(10));
        let w = ConnWindow::new(2 * mib);
        w.bind(9, path.clone());
        let mut granted = Vec::new();
        for _ in 0..12 {
            w.consumed(mib as usize / 2);
            while let Ok(Frame::Data(d)) = rx.try_recv() {
                granted.push(packet::window_grant(&d).expect("a window update"));
            }
        }
        // 2 MiB, then 4 (2 granted past what was consumed), then 5 (the
        // budget's last MiB).
        assert_eq!(w.recv_window(), 5 * mib + 2 * mib);
        assert_eq!(path.grown(), 5 * mib);
        // Everything consumed is acknowledged but the last part of a
        // quarter window, and the growth besides.
        let consumed = 12 * mib / 2;
        let acked = granted.iter().sum::<u64>() - 5 * mib;
        assert!(acked <= consumed && consumed - acked < w.recv_window() / 4);
        let before = window_growth_bytes();
        drop(w);
        assert_eq!(path.grown(), 0);
        assert!(window_growth_bytes() <= before - 5 * mib);
        // Without the feature nothing grows.
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        let path = LinkPath::new(tx, false);
        path.set_rtt(Duration::from_secs(10));
        let w = ConnWindow::new(2 * mib);
        w.bind(9, path.clone());
        for _ in 0..12 {
            w.consumed(mib as usize / 2);
        }
        assert_eq!(w.recv_window(), 2 * mib);
        let mut total = 0;
        while let Ok(Frame::Data(d)) = rx.try_recv() {
            total += packet::window_grant(&d).expect("a window update");
        }
        assert_eq!(total, 12 * mib / 2);
    }

    /// A window whose reader is slow (a half window over several round
    /// trips) keeps its size.
    #[test]
    fn a_window_consumed_slowly_keeps_its_size() {
        let mib = 1024 * 1024;
        let (tx, _rx) = futures::channel::mpsc::unbounded();
        let path = LinkPath::new(tx, true);
        path.set_rtt(Duration::from_micros(1));
        let w = ConnWindow::new(2 * mib);
        w.bind(9, path.clone());
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(1));
            w.consumed(mib as usize / 2);
        }
        assert_eq!(w.recv_window(), 2 * mib);
        assert_eq!(path.grown(), 0);
    }

    #[test]
    fn the_kernel_gives_a_tcp_connections_round_trip() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let path = LinkPath::new(futures::channel::mpsc::unbounded().0, true);
        let rtt = path.sample(&c, Duration::ZERO).expect("a sample");
        assert!(rtt < Duration::from_secs(1), "{rtt:?}");
        assert_eq!(path.rtt(), Some(rtt));
        // Not again within the interval.
        assert_eq!(path.sample(&c, Duration::from_secs(60)), None);
        // Not a TCP socket: no sample.
        let (u, _) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(path.sample(&u, Duration::ZERO), None);
    }

    /// A peer may have the window it was granted in flight (and a chunk
    /// past it), no more: grants made, grown ones included, count.
    #[test]
    fn a_peer_past_its_window_is_told_apart() {
        let mib = 1024 * 1024;
        let w = ConnWindow::new(2 * mib);
        let (tx, _rx) = futures::channel::mpsc::unbounded();
        w.bind(4, LinkPath::new(tx, false));
        assert!(w.received(2 * mib as usize + OVERRUN_SLACK as usize));
        assert!(!w.received(1), "past the window and the slack");
        // Acknowledged (written locally): room again.
        let w = ConnWindow::new(2 * mib);
        let (tx, _rx) = futures::channel::mpsc::unbounded();
        w.bind(4, LinkPath::new(tx, false));
        for _ in 0..100 {
            assert!(w.received(mib as usize));
            w.consumed(mib as usize);
        }
    }

    /// Every idle tunnel holds a window at each end: it stays in the
    /// allocator's size class of the window before windows grew (96 bytes
    /// with the `Arc`'s two counts; 160 with the tuning's mutex and 64-bit
    /// counts, which was 128 bytes more per idle tunnel).
    #[test]
    fn a_window_stays_small() {
        let size = std::mem::size_of::<ConnWindow>();
        assert!(size <= 80, "a window is {size} bytes");
    }

    /// A peer's grants and sends are counted saturating: a hostile one
    /// wraps nothing.
    #[test]
    fn counts_saturate() {
        let (tx, _rx) = futures::channel::mpsc::unbounded();
        let w = ConnWindow::new(2 * 1024 * 1024);
        w.bind(5, LinkPath::new(tx, false));
        for _ in 0..3 {
            assert!(!w.received(usize::MAX));
        }
        assert_eq!(w.count_unacknowledged(0), i64::from(i32::MAX));
        w.granted(u64::MAX);
        w.granted(u64::MAX);
        assert_eq!(w.in_flight(), 2 * 1024 * 1024 - MAX_TUNNEL_WINDOW as i64);
    }
}
