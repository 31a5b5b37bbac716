//! HTTP/2 keepalive for long-lived connections whose peer may vanish
//! without a FIN (agent links on both ends, gRPC frontend callers): a PING
//! every interval, and the connection given up when one stays unanswered.
//! The callers count [`KeepaliveError::Timeout`] in their /metrics
//! (`edgetunnel_keepalive_timeouts_total{peer}`).

use std::time::Duration;

/// Why a connection's keepalive gave up.
#[derive(Debug, thiserror::Error)]
pub enum KeepaliveError {
    /// The connection failed under the PING.
    #[error("keepalive ping failed: {0}")]
    Ping(#[from] h2::Error),
    /// The peer did not answer in time: it is silent (frozen, or its path
    /// is gone).
    #[error("keepalive ping timed out (not answered within {0:?})")]
    Timeout(Duration),
}

/// Sends an HTTP/2 PING every `every` and fails when one is not answered
/// within twice that. Never returns otherwise; without a `PingPong`
/// (already taken) it waits forever.
pub async fn keep_alive(ping: Option<h2::PingPong>, every: Duration) -> KeepaliveError {
    let Some(mut p) = ping else {
        return futures::future::pending().await;
    };
    loop {
        monoio::time::sleep(every).await;
        match monoio::time::timeout(every * 2, p.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return e.into(),
            Err(_) => return KeepaliveError::Timeout(every * 2),
        }
    }
}
