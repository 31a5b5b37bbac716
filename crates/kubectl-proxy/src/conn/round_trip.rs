//! What surrounds one upstream exchange, over either HTTP version: fresh
//! credentials before it, client-go's -v6 log line and the 401 note after.

use std::time::Instant;

use super::ProxySettings;
use crate::credentials::Used;
use protocol::http1::{self, RequestHead};

/// Makes refreshed credentials (exec plugin, token file) current before a
/// head is built and a connection chosen; awaits only when they must be
/// fetched, never blocking the core. Returns what the request uses (for
/// [`note_refused`]); nothing when the client brought its own
/// `Authorization` (client-go's exec round tripper leaves it alone).
pub(super) async fn fresh_auth(
    head: &RequestHead,
    shared: &ProxySettings,
) -> Result<Option<Used>, String> {
    let Some(d) = shared.upstream.auth.dynamic() else {
        return Ok(None);
    };
    if http1::get(&head.headers, "authorization").is_some_and(|v| !v.is_empty()) {
        return Ok(None);
    }
    d.ready().await.map(Some)
}

/// client-go's -v6 line for one round trip (URL as sent upstream).
pub(super) fn log_round_trip(
    shared: &ProxySettings,
    method: &str,
    target: &str,
    status: u16,
    reason: &str,
    started: Instant,
) {
    if shared.log_round_trips {
        let scheme = if shared.upstream.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let url = format!("{scheme}://{}{target}", shared.upstream.host_header);
        let ms = started.elapsed().as_millis();
        tracing::info!(
            target: "edgetunnel::proxy::round_trip",
            "{}",
            crate::klog::round_trip_line(method, &url, status, reason, ms)
        );
    }
}

/// A 401 to a request that used our refreshed credentials: fetch them again.
pub(super) async fn note_refused(shared: &ProxySettings, used: &Option<Used>, status: u16) {
    if status == 401 {
        if let (Some(d), Some(used)) = (shared.upstream.auth.dynamic(), used) {
            d.refused(used).await;
        }
    }
}
