//! Which HTTP/2 upstream connection takes a new request, as Go's HTTP/2
//! transport decides (kubectl's client-go uses it when the API server
//! offers h2): the first usable connection with a free concurrency slot;
//! none, and a new connection is dialed.
//!
//! Facts from golang.org/x/net `http2/transport.go`
//! (`ClientConn.idleStateLocked`, `currentRequestCountLocked`,
//! `initialMaxConcurrentStreams`, `defaultMaxConcurrentStreams`, the
//! `SettingMaxConcurrentStreams` case of `processSettings`) and
//! `http2/client_conn_pool.go` (`getClientConn`: every pooled connection is
//! asked `ReserveNewRequest`; on a miss one dial per address is started and
//! shared by the requests waiting on it). Without `StrictMaxConcurrentStreams`
//! (client-go does not set it) a connection whose slots are all taken is
//! passed over, never waited on.

/// Go's limit on a connection before the server's first SETTINGS arrived.
pub const INITIAL_MAX_STREAMS: usize = 100;
/// Go's limit when the server's SETTINGS do not name one.
pub const DEFAULT_MAX_STREAMS: usize = 1000;

/// The concurrency limit of a connection, from what the HTTP/2 library
/// reports as the peer's current SETTINGS_MAX_CONCURRENT_STREAMS
/// (`usize::MAX` when the SETTINGS named none: Go's default then).
pub fn stream_limit(peer_max: usize) -> usize {
    if peer_max == usize::MAX {
        DEFAULT_MAX_STREAMS
    } else {
        peer_max
    }
}

/// What the pool knows about one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnView {
    /// Not closed, no GOAWAY, made under the current client certificate.
    pub usable: bool,
    /// Requests on it now, reservations included (Go's
    /// `currentRequestCountLocked`).
    pub in_use: usize,
    /// The peer's current SETTINGS_MAX_CONCURRENT_STREAMS, as reported.
    pub peer_max: usize,
}

impl ConnView {
    /// Go's `canTakeNewRequest` (non-strict).
    pub fn can_take(&self) -> bool {
        self.usable && self.in_use < stream_limit(self.peer_max)
    }
}

/// The connection a new request goes on; `None`: dial another.
pub fn pick(conns: &[ConnView]) -> Option<usize> {
    conns.iter().position(ConnView::can_take)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(usable: bool, in_use: usize, peer_max: usize) -> ConnView {
        ConnView {
            usable,
            in_use,
            peer_max,
        }
    }

    #[test]
    fn full_connections_are_passed_over() {
        assert_eq!(pick(&[]), None);
        assert_eq!(pick(&[c(true, 5, 5)]), None);
        assert_eq!(pick(&[c(true, 5, 5), c(true, 4, 5)]), Some(1));
        assert_eq!(pick(&[c(false, 0, 5), c(true, 0, 5)]), Some(1));
    }

    #[test]
    fn limits_follow_go() {
        // Before SETTINGS: the library starts from Go's 100.
        assert!(c(true, 99, INITIAL_MAX_STREAMS).can_take());
        assert!(!c(true, 100, INITIAL_MAX_STREAMS).can_take());
        // SETTINGS without a limit: Go's 1000.
        assert!(c(true, 999, usize::MAX).can_take());
        assert!(!c(true, 1000, usize::MAX).can_take());
        // A limit lowered below what runs: no new request.
        assert!(!c(true, 3, 2).can_take());
        // A limit of zero: none.
        assert!(!c(true, 0, 0).can_take());
    }
}
