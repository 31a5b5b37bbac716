//! The one accept loop every listener runs ([`serve`]): it accepts, sets
//! TCP_NODELAY on TCP sockets, applies the optional pre-authentication cap
//! ([`super::admission`]), and spawns the connection's task inside a
//! tracing span naming the listener and the peer. A connection over the
//! cap is answered in the accept loop itself, without a task: a TLS
//! `user_canceled` alert and a close ([`super::admission::refuse`]; the cap
//! is for TLS listeners), which tells the client to back off.
//!
//! Accept errors never make it spin or flood the log: out of descriptors
//! or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) it backs off, doubling from
//! 50 ms to 1 s; other errors pause 50 ms. The first error is logged, then
//! at most one line every [`LOG_EVERY`] with the count of the ones not
//! logged ([`RateLimitedLog`], pure). Running out of descriptors or memory
//! is one condition of the whole process, met by every listener of every
//! core at once: those errors share one log ([`RESOURCE_LOG`]), so an
//! operator reads one line and one summary per period, not one per
//! listener and core (a server with six listeners on two cores wrote
//! twelve). Other accept errors, and refusals by the cap, are logged per
//! listener and core.
//!
//! Stopping: with [`Options::stop`], the loop ends once the latch is
//! raised, and loses no connection doing so. An accept under way is
//! cancelled and then awaited: on io_uring a cancelled accept can still
//! complete with a connection (it raced the cancel), and that connection is
//! served like any other. Dropping the future instead would drop such a
//! connection unserved (monoio discards a dropped operation's result, so
//! the descriptor stayed open, unanswered, until the process exited): a
//! failed dial at every drain or listener handover. Dropping the future
//! still stops accepting; spawned connections go on either way. The
//! listener closes when the loop ends, unless another process holds the
//! same socket (a successor after a handover).
//!
//! Fair to what is already open: on the epoll driver an accept with a
//! connection waiting completes without ever returning to the scheduler,
//! and monoio has no cooperative budget, so a flood that keeps the backlog
//! full (every connection refused by the cap and opened again) would hold
//! the core: the links and tunnels already on it would wait, keepalive
//! PINGs unanswered until agents dropped their links (seen under a traced
//! server in `tests/descriptor_churn.rs`). The loop yields to the core's
//! other tasks after every [`ACCEPT_BURST`] connections.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::io::CancelHandle;
use tracing::Instrument;

use super::admission::{Admission, Permit};
use super::signals::Shutdown;

/// At most one log line per listener and kind this often.
pub const LOG_EVERY: Duration = Duration::from_secs(5);
const PAUSE: Duration = Duration::from_millis(50);
/// The log of resource errors (see the module documentation), shared by
/// every listener and core.
pub static RESOURCE_LOG: std::sync::Mutex<RateLimitedLog> =
    std::sync::Mutex::new(RateLimitedLog::new(LOG_EVERY));

/// Connections accepted in a row before the loop lets the core's other
/// tasks run.
pub const ACCEPT_BURST: u32 = 16;
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Who connected: a TCP listener's peers are `SocketAddr`s, a unix
/// listener's [`UnixPeer`].
pub trait Peer: std::fmt::Display + Copy + 'static {
    /// The source address the pre-authentication cap counts by.
    fn ip(&self) -> Option<IpAddr>;
}

impl Peer for SocketAddr {
    fn ip(&self) -> Option<IpAddr> {
        Some(SocketAddr::ip(self))
    }
}

/// A unix socket's peer (unnamed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnixPeer;

impl Peer for UnixPeer {
    fn ip(&self) -> Option<IpAddr> {
        None
    }
}

impl std::fmt::Display for UnixPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("unix")
    }
}

/// A listening socket [`serve`] can run.
pub trait Listen {
    type Stream: std::os::fd::AsRawFd + 'static;
    type Peer: Peer;
    /// The next connection, tuned (TCP_NODELAY on TCP); cancelled through
    /// `cancel` (it may still complete with a connection, see the module
    /// docs).
    fn next(
        &self,
        cancel: CancelHandle,
    ) -> impl Future<Output = io::Result<(Self::Stream, Self::Peer)>>;
}

impl Listen for monoio::net::TcpListener {
    type Stream = monoio::net::TcpStream;
    type Peer = SocketAddr;
    async fn next(&self, cancel: CancelHandle) -> io::Result<(Self::Stream, SocketAddr)> {
        let (s, a) = self.cancelable_accept(cancel).await?;
        super::listener::nodelay(&s);
        Ok((s, a))
    }
}

impl Listen for monoio::net::UnixListener {
    type Stream = monoio::net::UnixStream;
    type Peer = UnixPeer;
    async fn next(&self, cancel: CancelHandle) -> io::Result<(Self::Stream, UnixPeer)> {
        let (s, _) = self.cancelable_accept(cancel).await?;
        Ok((s, UnixPeer))
    }
}

/// How a listener is run.
pub struct Options {
    /// The listener's name in logs and spans ("agent", "connect", ...).
    pub name: &'static str,
    /// The pre-authentication cap; a connection over it is answered with a
    /// TLS alert and closed at once.
    pub admission: Option<Arc<Admission>>,
    /// The loop ends, without losing a connection, once this latch has
    /// been raised (see the module docs).
    pub stop: Option<Arc<Shutdown>>,
}

impl Options {
    pub fn named(name: &'static str) -> Self {
        Options {
            name,
            admission: None,
            stop: None,
        }
    }

    /// The same, ending once `stop` is raised.
    pub fn until(mut self, stop: Arc<Shutdown>) -> Self {
        self.stop = Some(stop);
        self
    }
}

/// The next connection of `l`, or `None` once `stop` was raised and the
/// accept under way (if any) came back without one.
async fn next_until<L: Listen>(
    l: &L,
    stop: Option<&Arc<Shutdown>>,
) -> Option<io::Result<(L::Stream, L::Peer)>> {
    let Some(stop) = stop else {
        return Some(l.next(monoio::io::Canceller::new().handle()).await);
    };
    if stop.requested() > 0 {
        return None;
    }
    let canceller = monoio::io::Canceller::new();
    let mut next = std::pin::pin!(l.next(canceller.handle()));
    let mut raised = std::pin::pin!(stop.wait(1));
    monoio::select! {
        r = &mut next => return Some(r),
        _ = &mut raised => {}
    }
    let _ = canceller.cancel();
    // Cancelled, or a connection that raced the cancel: serve that one.
    next.await.ok().map(Ok)
}

/// An accepted connection.
pub struct Conn<S, P> {
    pub stream: S,
    pub peer: P,
    /// The connection's pre-authentication slot (with
    /// [`Options::admission`]): drop it when the handshake is done.
    pub permit: Option<Permit>,
}

/// Accepts on `l` until dropped, running `handle` for every connection as
/// a task of its own.
pub async fn serve<L, F, Fut>(l: L, opts: Options, mut handle: F)
where
    L: Listen,
    F: FnMut(Conn<L::Stream, L::Peer>) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let name = opts.name;
    let mut errors = RateLimitedLog::new(LOG_EVERY);
    let mut refusals = RateLimitedLog::new(LOG_EVERY);
    let mut backoff = Backoff::default();
    let mut burst = 0u32;
    loop {
        burst += 1;
        if burst >= ACCEPT_BURST {
            burst = 0;
            yield_now().await;
        }
        let Some(next) = next_until(&l, opts.stop.as_ref()).await else {
            tracing::debug!(listener = name, "accept loop stopped");
            return;
        };
        let (stream, peer) = match next {
            Ok(c) => c,
            Err(e) => {
                let now = Instant::now();
                let report = if is_resource_error(&e) {
                    RESOURCE_LOG
                        .lock()
                        .map_or(Report::Quiet, |mut l| l.event(now))
                } else {
                    errors.event(now)
                };
                if let Report::Log { suppressed } = report {
                    tracing::warn!(
                        listener = name,
                        error = %e,
                        suppressed,
                        "accept failed (further failures are summarised every {LOG_EVERY:?})"
                    );
                }
                monoio::time::sleep(backoff.after_error(&e)).await;
                continue;
            }
        };
        backoff.reset();
        let resource_quiet = RESOURCE_LOG
            .lock()
            .ok()
            .and_then(|mut l| l.quiet(Instant::now()));
        if let Some(n) = errors.quiet(Instant::now()).or(resource_quiet) {
            tracing::warn!(
                listener = name,
                suppressed = n,
                "accepting again; accept failures not logged"
            );
        }
        let permit = match &opts.admission {
            None => None,
            Some(a) => match a.admit(peer.ip()) {
                Ok(p) => Some(p),
                Err(why) => {
                    super::admission::refuse(&stream);
                    drop(stream);
                    if let Report::Log { suppressed } = refusals.event(Instant::now()) {
                        tracing::warn!(
                            listener = name,
                            %peer,
                            suppressed,
                            "connection refused (busy alert, closed): {why} (further refusals are summarised every {LOG_EVERY:?})"
                        );
                    }
                    continue;
                }
            },
        };
        let span = tracing::info_span!("conn", listener = name, %peer);
        monoio::spawn(
            handle(Conn {
                stream,
                peer,
                permit,
            })
            .instrument(span),
        );
    }
}

/// Lets the core's other ready tasks run once before this one goes on.
/// A task that wakes itself while it is being polled goes back to the
/// *front* of monoio's run queue (its scheduler's `yield_now`), so it would
/// run again at once; the wake is made by a small task spawned behind the
/// others instead, which puts this one at the back.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        super::runtime::wake_behind_others(cx.waker());
        std::task::Poll::Pending
    })
    .await
}

/// Whether an accept error means the process or system is out of a
/// resource (more retries at once would fail the same way).
pub fn is_resource_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The pause after an accept error.
#[derive(Debug, Default)]
pub struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    pub fn after_error(&mut self, e: &io::Error) -> Duration {
        if !is_resource_error(e) {
            return PAUSE;
        }
        let d = self.next.unwrap_or(PAUSE);
        self.next = Some((d * 2).min(MAX_PAUSE));
        d
    }

    pub fn reset(&mut self) {
        self.next = None;
    }
}

/// What to do with one event of a rate-limited kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// Log it, with the number of events not logged since the last line.
    Log {
        suppressed: u64,
    },
    Quiet,
}

/// One line, then at most one line per period with the count of the
/// events in between.
#[derive(Debug)]
pub struct RateLimitedLog {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedLog {
    pub const fn new(every: Duration) -> Self {
        RateLimitedLog {
            every,
            last: None,
            suppressed: 0,
        }
    }

    fn due(&self, now: Instant) -> bool {
        self.last
            .is_none_or(|t| now.saturating_duration_since(t) >= self.every)
    }

    /// An event happened at `now`.
    pub fn event(&mut self, now: Instant) -> Report {
        if self.due(now) {
            self.last = Some(now);
            Report::Log {
                suppressed: std::mem::take(&mut self.suppressed),
            }
        } else {
            self.suppressed += 1;
            Report::Quiet
        }
    }

    /// Things went well at `now`: the count of events not logged yet, when
    /// there are some and a line is due.
    pub fn quiet(&mut self, now: Instant) -> Option<u64> {
        if self.suppressed == 0 || !self.due(now) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_then_summaries() {
        let t0 = Instant::now();
        let s = Duration::from_millis;
        let mut log = RateLimitedLog::new(Duration::from_secs(5));
        assert_eq!(log.event(t0), Report::Log { suppressed: 0 });
        // 30 a second for 5 s: quiet ...
        let mut logged = 1;
        for i in 1..150 {
            if log.event(t0 + s(33 * i)) != Report::Quiet {
                logged += 1;
            }
        }
        assert_eq!(logged, 1);
        assert_eq!(log.quiet(t0 + s(4000)), None, "not due yet");
        // ... then one line with the count.
        assert_eq!(log.event(t0 + s(5000)), Report::Log { suppressed: 149 });
        assert_eq!(log.event(t0 + s(5001)), Report::Quiet);
        assert_eq!(log.quiet(t0 + s(9000)), None);
        assert_eq!(log.quiet(t0 + s(10_000)), Some(1));
        assert_eq!(log.quiet(t0 + s(20_000)), None, "nothing left to report");
        assert_eq!(log.event(t0 + s(20_001)), Report::Log { suppressed: 0 });
    }

    #[test]
    fn backoff_grows_on_resource_errors_only() {
        let mut b = Backoff::default();
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let aborted = io::Error::from_raw_os_error(libc::ECONNABORTED);
        let pauses: Vec<_> = (0..7).map(|_| b.after_error(&emfile)).collect();
        assert_eq!(pauses[0], PAUSE);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(pauses[6], MAX_PAUSE);
        assert_eq!(b.after_error(&aborted), PAUSE);
        b.reset();
        assert_eq!(
            b.after_error(&io::Error::from_raw_os_error(libc::ENFILE)),
            PAUSE
        );
    }

    /// A yield lets a task that became ready meanwhile run before the
    /// yielding one goes on, on both drivers.
    #[test]
    fn yield_now_runs_the_other_ready_tasks_first() {
        use crate::runtime::{block_on, Driver};
        use std::cell::RefCell;
        use std::rc::Rc;
        for driver in [Driver::Auto, Driver::Legacy] {
            block_on(driver, async {
                let order = Rc::new(RefCell::new(Vec::new()));
                let o = order.clone();
                let other = monoio::spawn(async move { o.borrow_mut().push("other") });
                order.borrow_mut().push("before");
                yield_now().await;
                order.borrow_mut().push("after");
                other.await;
                assert_eq!(*order.borrow(), ["before", "other", "after"]);
            })
            .unwrap();
        }
    }

    #[test]
    fn peers() {
        let p: SocketAddr = "10.0.0.1:5".parse().unwrap();
        assert_eq!(Peer::ip(&p), Some("10.0.0.1".parse().unwrap()));
        assert_eq!((UnixPeer.ip(), UnixPeer.to_string()), (None, "unix".into()));
    }
}
