//! An agent link's own HTTP/2 receive windows, tuned to the path, for
//! links whose tunnels have no windows that grow: with ANP's Go agent or
//! Go server (ANP has no per-connection flow control), and between our
//! ends when they did not negotiate `window-growth`. The server tunes what
//! its agents send it, the agent what its server sends.
//!
//! On such a link the HTTP/2 stream window is all that paces the peer's
//! payload: fixed at 16 MiB, a 100 ms path moves at most 160 MB/s and a
//! 300 ms one 53 MB/s, whatever the link could carry.
//! grpc-go sizes its windows from a bandwidth-delay product estimate
//! (`internal/transport/bdp_estimator.go`); here the same rule that grows
//! a tunnel's window ([`protocol::anp::window_tuning`], quic-go's)
//! grows the link's: while a window's worth is taken within a few round
//! trips of the link (its RTT read from the kernel, [`LinkPath`]), the
//! stream and connection windows double, up to [`GO_LINK_WINDOW_CAP`].
//!
//! The cap is what such a link may make its receiver hold: a reader that
//! stops stops the link's reader (the payload budget), and what the peer
//! already sent, at most a window, waits in the connection. A
//! window only grows while the link's payload is taken quickly, so a
//! stalled reader never grows one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;

use crate::grpc::{Body, GrpcError};
use crate::window::LinkPath;
use protocol::anp::window_tuning::Epoch;

/// The largest HTTP/2 stream window a link without tunnel windows grows
/// to: 64 MiB a round trip is 213 MB/s (1.7 Gbit/s) at 300 ms.
pub const GO_LINK_WINDOW_CAP: u64 = 64 * 1024 * 1024;

/// Growth of every such link's windows now
/// (`edgetunnel_agent_link_window_growth_bytes`).
static GROWN: AtomicU64 = AtomicU64::new(0);

/// Bytes by which agent links' own HTTP/2 windows have grown.
pub fn link_window_growth_bytes() -> u64 {
    GROWN.load(Ordering::Relaxed)
}

/// A body whose HTTP/2 windows (stream and connection) can grow.
pub trait GrowWindows {
    /// Grows both windows by `by` bytes.
    fn grow_windows_by(&mut self, by: u32);
}

impl GrowWindows for crate::h2_conn::StreamRecv {
    fn grow_windows_by(&mut self, by: u32) {
        self.grow_windows(by, by);
    }
}

/// An agent link's body, its windows tuned when set up with
/// [`TunedRecv::tuned`].
pub struct TunedRecv<B> {
    body: B,
    /// Boxed: an agent link's task holds its reader, and most links (ours
    /// with `window-growth`) tune nothing.
    tuning: Option<Box<Tuning>>,
}

struct Tuning {
    /// The stream window granted now.
    window: u64,
    epoch: Epoch,
    /// The epochs' clock starts here.
    base: Instant,
    path: Arc<LinkPath>,
    /// What this link added to [`GROWN`].
    grown: u64,
}

impl<B> TunedRecv<B> {
    /// `body` with windows as they are (its tunnels' windows grow).
    pub fn fixed(body: B) -> Self {
        TunedRecv { body, tuning: None }
    }

    /// `body`, whose stream window starts at `window` bytes, tuned to
    /// `path`.
    pub fn tuned(body: B, window: u32, path: Arc<LinkPath>) -> Self {
        TunedRecv {
            body,
            tuning: Some(Box::new(Tuning {
                window: u64::from(window),
                epoch: Epoch::starting(0),
                base: Instant::now(),
                path,
                grown: 0,
            })),
        }
    }

    /// The stream window granted now, when tuned.
    pub fn window(&self) -> Option<u64> {
        self.tuning.as_ref().map(|t| t.window)
    }
}

impl<B> Drop for TunedRecv<B> {
    fn drop(&mut self) {
        if let Some(t) = &self.tuning {
            GROWN.fetch_sub(t.grown, Ordering::Relaxed);
        }
    }
}

impl<B: Body + GrowWindows> Body for TunedRecv<B> {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, GrpcError>>> {
        self.body.poll_chunk(cx)
    }

    fn consumed(&mut self, n: usize) {
        self.body.consumed(n);
        let Some(t) = &mut self.tuning else { return };
        // Microseconds on a clock that wraps every 71.6 minutes: an epoch
        // idle that long may look fast once (one step of growth at most).
        let now_us = t.base.elapsed().as_micros() as u32;
        let (epoch, grow) =
            t.epoch
                .on_ack(n as u64, t.window, now_us, t.path.rtt(), GO_LINK_WINDOW_CAP);
        t.epoch = epoch;
        if grow == 0 {
            return;
        }
        // The tuner never asks past the cap, which fits a window's u32.
        let by = grow.min(u64::from(u32::MAX)) as u32;
        self.body.grow_windows_by(by);
        t.window += u64::from(by);
        t.grown += u64::from(by);
        GROWN.fetch_add(u64::from(by), Ordering::Relaxed);
        tracing::debug!(
            window = t.window,
            rtt_ms = t.path.rtt().map(|r| r.as_secs_f64() * 1e3),
            "agent link's HTTP/2 windows grew"
        );
    }

    fn poll_status(&mut self, cx: &mut Context<'_>) -> Poll<Option<GrpcError>> {
        self.body.poll_status(cx)
    }
}
