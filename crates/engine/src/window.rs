//! Per-connection flow control between edgetunnel peers (the negotiated
//! `window` extension, see [`crate::protocol::FEATURE_WINDOW`]).
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;

use futures::channel::mpsc::UnboundedSender;
use futures::task::AtomicWaker;

use crate::protocol::anp::packet::{self, Frame};

/// Unacknowledged bytes one connection may have in flight per direction.
pub const TUNNEL_WINDOW: u64 = 2 * 1024 * 1024;

/// Both halves of one connection's window.
#[derive(Debug)]
pub struct ConnWindow {
    limit: u64,
    /// Bytes sent to the peer and not yet acknowledged.
    in_flight: AtomicU64,
    waiter: AtomicWaker,
    /// Bytes received from the peer, written locally, not yet acknowledged.
    consumed: AtomicU64,
    /// Where window updates go, once the connection has its connectID.
    peer: OnceLock<(i64, UnboundedSender<Frame>)>,
}

impl ConnWindow {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            in_flight: AtomicU64::new(0),
            waiter: AtomicWaker::new(),
            consumed: AtomicU64::new(0),
            peer: OnceLock::new(),
        })
    }

    /// Names the connection and the queue its window updates take.
    pub fn bind(&self, connect_id: i64, ctl: UnboundedSender<Frame>) {
        let _ = self.peer.set((connect_id, ctl));
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
        if self.in_flight.load(Ordering::Acquire) < self.limit {
            return Poll::Ready(());
        }
        self.waiter.register(cx.waker());
        if self.in_flight.load(Ordering::Acquire) < self.limit {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Records `n` payload bytes handed to the peer.
    pub fn sent(&self, n: usize) {
        self.in_flight.fetch_add(n as u64, Ordering::AcqRel);
    }

    /// The peer acknowledged `n` bytes. A peer that acknowledges more than
    /// was sent only reopens the window; it cannot make it negative.
    pub fn granted(&self, n: u64) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(n))
            });
        self.waiter.wake();
    }

    /// Bytes sent and not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// `n` received bytes were written to the local socket (or dropped):
    /// acknowledges them to the peer in batches of a quarter window.
    pub fn consumed(&self, n: usize) {
        let total = self.consumed.fetch_add(n as u64, Ordering::AcqRel) + n as u64;
        let Some((id, ctl)) = self.peer.get() else {
            return;
        };
        if total < (self.limit / 4).max(1) {
            return;
        }
        let taken = self.consumed.swap(0, Ordering::AcqRel);
        if taken > 0 {
            let _ = ctl.unbounded_send(packet::window_update(*id, taken));
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
        // Over-acknowledging only reopens the window.
        w.granted(1_000);
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn receiver_acknowledges_in_quarter_window_batches() {
        let w = ConnWindow::new(100);
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        // Not yet bound: counting is harmless, nothing is sent.
        w.consumed(10);
        w.bind(7, tx);
        w.consumed(10);
        assert!(rx.try_recv().is_err(), "below a quarter window");
        w.consumed(5);
        assert_eq!(rx.try_recv().ok(), Some(packet::window_update(7, 25)));
        w.consumed(24);
        assert!(rx.try_recv().is_err());
    }
}
