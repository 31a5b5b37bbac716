//! A byte budget shared by one multiplexed stream and the connections it
//! feeds: the stream's reader takes credit before queueing payload for a
//! connection, and the credit comes back when the payload is written (or
//! dropped). One slow connection can buffer up to the budget without
//! stalling its neighbours; only past the budget does the reader wait, which
//! bounds memory per stream.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use futures::task::AtomicWaker;

use super::sharded_count::ShardedCount;
use super::window::ConnWindow;

/// Payload bytes held under every budget of the process (queued for a
/// connection or a stream and not yet written): `edgetunnel_buffered_bytes`.
static BUFFERED: ShardedCount = ShardedCount::new();

/// Payload bytes held under every [`Budget`] of the process now.
pub fn buffered_bytes() -> usize {
    BUFFERED.get()
}

#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
    waiter: AtomicWaker,
}

impl Budget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
            waiter: AtomicWaker::new(),
        })
    }

    /// Bytes taken and not yet given back.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Wraps `bytes` in a credit, waiting while the budget is spent. A single
    /// payload larger than the whole budget is let through when nothing else
    /// is outstanding. Only one task (the stream reader) may wait.
    pub async fn charge(self: &Arc<Self>, bytes: Bytes) -> Credit {
        let n = bytes.len();
        futures::future::poll_fn(|cx| {
            let used = self.used.load(Ordering::Acquire);
            if used == 0 || used + n <= self.limit {
                return Poll::Ready(());
            }
            self.waiter.register(cx.waker());
            let used = self.used.load(Ordering::Acquire);
            if used == 0 || used + n <= self.limit {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        self.charge_now(bytes)
    }

    /// Charges payload received for one tunneled connection. With the
    /// connection's negotiated window ([`crate::window`]) the peer
    /// already bounds it: never wait (that would stall the shared stream),
    /// and acknowledge it to the window once written. Without one, wait past
    /// the budget: that is the backpressure toward the peer, and below the
    /// budget a slow local reader stalls nobody.
    pub async fn charge_for(
        self: &Arc<Self>,
        bytes: Bytes,
        window: Option<&Arc<ConnWindow>>,
    ) -> Credit {
        match window {
            Some(w) => {
                let mut credit = self.charge_now(bytes);
                credit.window = Some(w.clone());
                credit
            }
            None => self.charge(bytes).await,
        }
    }

    /// Wraps `bytes` in a credit without waiting.
    fn charge_now(self: &Arc<Self>, bytes: Bytes) -> Credit {
        self.used.fetch_add(bytes.len(), Ordering::AcqRel);
        BUFFERED.add(bytes.len() as isize);
        Credit {
            bytes,
            budget: self.clone(),
            window: None,
        }
    }
}

/// Payload holding its share of a [`Budget`] until dropped.
#[derive(Debug)]
pub struct Credit {
    bytes: Bytes,
    budget: Arc<Budget>,
    window: Option<Arc<ConnWindow>>,
}

impl Credit {
    /// The payload, for writing. The credit is returned when `self` drops.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

impl Deref for Credit {
    type Target = Bytes;
    fn deref(&self) -> &Bytes {
        &self.bytes
    }
}

impl Drop for Credit {
    fn drop(&mut self) {
        let n = self.bytes.len();
        let before = self.budget.used.fetch_sub(n, Ordering::AcqRel);
        BUFFERED.add(-(n as isize));
        if before - n <= self.budget.limit / 2 || before - n == 0 {
            self.budget.waiter.wake();
        }
        if let Some(w) = &self.window {
            w.consumed(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::anp::packet;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    #[test]
    fn waits_past_the_limit_and_resumes_on_release() {
        let b = Budget::new(10);
        let mut cx = Context::from_waker(Waker::noop());
        let first = match pin!(b.charge(Bytes::from_static(b"12345678"))).poll(&mut cx) {
            Poll::Ready(c) => c,
            Poll::Pending => panic!("budget is free"),
        };
        let mut second = pin!(b.charge(Bytes::from_static(b"12345")));
        assert!(second.as_mut().poll(&mut cx).is_pending());
        drop(first);
        assert_eq!(b.used(), 0);
        let c = match second.as_mut().poll(&mut cx) {
            Poll::Ready(c) => c,
            Poll::Pending => panic!("released"),
        };
        assert_eq!(b.used(), 5);
        drop(c);
        // Larger than the whole budget: allowed when nothing is outstanding.
        let big = match pin!(b.charge(Bytes::from(vec![0u8; 50]))).poll(&mut cx) {
            Poll::Ready(c) => c,
            Poll::Pending => panic!("empty budget admits anything"),
        };
        assert_eq!(big.len(), 50);
    }

    #[test]
    fn windowed_payload_never_waits_and_is_acknowledged_when_written() {
        let b = Budget::new(10);
        let w = ConnWindow::new(8);
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        w.bind(3, crate::window::LinkPath::new(tx, false));
        let mut cx = Context::from_waker(Waker::noop());
        let first = match pin!(b.charge(Bytes::from_static(b"12345678"))).poll(&mut cx) {
            Poll::Ready(c) => c,
            Poll::Pending => panic!("budget is free"),
        };
        // Past the budget, yet admitted: the peer's window bounds it.
        let windowed =
            match pin!(b.charge_for(Bytes::from_static(b"12345"), Some(&w))).poll(&mut cx) {
                Poll::Ready(c) => c,
                Poll::Pending => panic!("windowed payload waited on the budget"),
            };
        assert_eq!(b.used(), 13);
        assert!(rx.try_recv().is_err());
        drop(windowed);
        assert_eq!(rx.try_recv().ok(), Some(packet::window_update(3, 5)));
        drop(first);
        assert!(
            rx.try_recv().is_err(),
            "unwindowed payload is not acknowledged"
        );
        assert_eq!(b.used(), 0);
    }
}
