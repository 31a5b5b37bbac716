//! The agent side of `engine::link_window`: on a link whose tunnels have
//! no growing windows (a Go server, or ours without `window-growth`), what
//! the server sends is paced by this agent's HTTP/2 windows alone, so they
//! grow with the path as the server grows its own. The h2 crate changes a
//! connection's windows only through its `Connection`, which the link's
//! task drives: the body asks ([`GrowingBody`]), the driver applies
//! ([`Growing`]) before it next polls the connection.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;

use engine::grpc::{self, Body, GrpcError};
use engine::link_window::GrowWindows;

/// The stream window the link's body asks for; the connection's follows.
#[derive(Clone)]
pub(super) struct Wanted(Rc<Cell<u32>>);

impl Wanted {
    /// A link whose stream window starts at `window` bytes.
    pub(super) fn new(window: u32) -> Self {
        Wanted(Rc::new(Cell::new(window)))
    }
}

/// The link's response body: grows by asking [`Growing`].
pub(super) struct GrowingBody {
    pub(super) body: h2::RecvStream,
    pub(super) wanted: Wanted,
}

impl Body for GrowingBody {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, GrpcError>>> {
        self.body.poll_chunk(cx)
    }

    fn consumed(&mut self, n: usize) {
        self.body.consumed(n)
    }

    fn poll_status(&mut self, cx: &mut Context<'_>) -> Poll<Option<GrpcError>> {
        self.body.poll_status(cx)
    }
}

impl GrowWindows for GrowingBody {
    fn grow_windows_by(&mut self, by: u32) {
        let w = &self.wanted.0;
        w.set(w.get().saturating_add(by).min(grpc::MAX_WINDOW));
    }
}

/// Drives the link's connection, applying the windows its body asked
/// for first.
pub(super) struct Growing<'a, C> {
    pub(super) conn: &'a mut C,
    pub(super) wanted: Wanted,
    pub(super) applied: u32,
}

/// What [`Growing`] needs of the connection (the h2 crate's client
/// connection; a trait so that the rule is tested without one).
pub(super) trait Windows {
    /// Settles the stream window at `stream` and the connection's at
    /// `conn`; `false`: not now (a SETTINGS frame still waits for its
    /// acknowledgement), try again later.
    fn set_windows(&mut self, stream: u32, conn: u32) -> bool;
}

impl<T, B> Windows for h2::client::Connection<T, B>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: bytes::Buf,
{
    fn set_windows(&mut self, stream: u32, conn: u32) -> bool {
        if self.set_initial_window_size(stream).is_err() {
            return false;
        }
        self.set_target_window_size(conn);
        true
    }
}

impl<C: Windows + Future + Unpin> Future for Growing<'_, C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let want = self.wanted.0.get();
        if want > self.applied {
            let conn = want.max(grpc::H2_CONNECTION_WINDOW);
            if self.conn.set_windows(want, conn) {
                self.applied = want;
            }
        }
        Pin::new(&mut *self.conn).poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that refuses new settings while `busy`.
    struct Fake {
        busy: bool,
        set: Vec<(u32, u32)>,
    }

    impl Windows for Fake {
        fn set_windows(&mut self, stream: u32, conn: u32) -> bool {
            if self.busy {
                return false;
            }
            self.set.push((stream, conn));
            true
        }
    }

    impl Future for Fake {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
    }

    fn poll_once(g: &mut Growing<'_, Fake>) {
        let waker = futures::task::noop_waker();
        let _ = Pin::new(g).poll(&mut Context::from_waker(&waker));
    }

    #[test]
    fn windows_asked_for_are_applied_once_and_retried_when_refused() {
        const MIB: u32 = 1024 * 1024;
        let wanted = Wanted::new(16 * MIB);
        let mut fake = Fake {
            busy: false,
            set: Vec::new(),
        };
        let mut body_side = wanted.clone();
        let mut g = Growing {
            conn: &mut fake,
            wanted,
            applied: 16 * MIB,
        };
        poll_once(&mut g);
        assert!(g.conn.set.is_empty(), "nothing asked, nothing set");
        body_side.0.set(32 * MIB);
        g.conn.busy = true;
        poll_once(&mut g);
        assert!(g.conn.set.is_empty(), "refused while busy");
        g.conn.busy = false;
        poll_once(&mut g);
        poll_once(&mut g);
        // The connection's window is never set below its start.
        assert_eq!(g.conn.set, [(32 * MIB, 32 * MIB)]);
        body_side.0.set(64 * MIB);
        poll_once(&mut g);
        assert_eq!(g.conn.set[1], (64 * MIB, 64 * MIB));
        let _ = &mut body_side;
    }
}
