//! Whether a failed upstream request may be sent again on a new
//! connection, as Go's transport decides for kubectl's reverse proxy: only
//! on a reused (kept-alive) connection, and only when the upstream cannot
//! have acted on it — nothing of it was written, or no byte of an answer
//! came and the request is replayable (idempotent method, no body). A
//! request whose answer was being read is never sent again.
//!
//! Facts from Go's `net/http/transport.go` (`persistConn.shouldRetryRequest`,
//! `nothingWrittenError`, `transportReadFromServerError`: the first
//! response byte could not be read; `errServerClosedIdle`),
//! `net/http/request.go` (`isReplayable`: GET, HEAD, OPTIONS, TRACE, or an
//! `Idempotency-Key`/`X-Idempotency-Key` header, and no body unless it can
//! be rewound) and `net/http/httputil/reverseproxy.go` (a request with
//! `ContentLength == 0` goes out with no body; others cannot be rewound).

use crate::http1::{self, Header};

/// How the exchange failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Writing the request failed before any byte of it was written.
    NothingWritten,
    /// The request went out; the connection ended or failed before the
    /// first byte of an answer.
    NoAnswerByte,
    /// Anything else: part of the request written and then an error, or
    /// an answer (or part of one) read and refused.
    Other,
}

/// Go's `isReplayable` for a proxied request (`has_body`: the client sent
/// a non-empty body).
pub fn replayable(method: &str, headers: &[Header], has_body: bool) -> bool {
    if has_body {
        return false;
    }
    matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE")
        || http1::get(headers, "idempotency-key").is_some()
        || http1::get(headers, "x-idempotency-key").is_some()
}

/// Go's `shouldRetryRequest`. `body_at_hand`: the whole body is still held
/// here, so a request never written can go again with it (Go's proxy cannot
/// rewind a body; this one buffered it, and the upstream saw nothing).
pub fn may_retry(
    reused: bool,
    failure: Failure,
    method: &str,
    headers: &[Header],
    has_body: bool,
    body_at_hand: bool,
) -> bool {
    if !reused {
        return false;
    }
    match failure {
        Failure::NothingWritten => !has_body || body_at_hand,
        Failure::NoAnswerByte => replayable(method, headers, has_body),
        Failure::Other => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: &str) -> Vec<Header> {
        vec![Header {
            name: n.into(),
            value: b"k".to_vec(),
        }]
    }

    #[test]
    fn only_untouched_requests_go_again() {
        let none = Vec::new();
        // A fresh connection: never.
        assert!(!may_retry(
            false,
            Failure::NoAnswerByte,
            "GET",
            &none,
            false,
            true
        ));
        // The answer was being read: never, whatever the method.
        assert!(!may_retry(true, Failure::Other, "GET", &none, false, true));
        // No answer byte: GET yes, POST no (the upstream may have acted).
        assert!(may_retry(
            true,
            Failure::NoAnswerByte,
            "GET",
            &none,
            false,
            true
        ));
        assert!(!may_retry(
            true,
            Failure::NoAnswerByte,
            "POST",
            &none,
            true,
            true
        ));
        assert!(!may_retry(
            true,
            Failure::NoAnswerByte,
            "POST",
            &none,
            false,
            true
        ));
        assert!(may_retry(
            true,
            Failure::NoAnswerByte,
            "POST",
            &h("Idempotency-Key"),
            false,
            true
        ));
        // A GET with a body cannot be replayed by Go's proxy.
        assert!(!may_retry(
            true,
            Failure::NoAnswerByte,
            "GET",
            &none,
            true,
            true
        ));
        // Nothing written: safe when the body is still here.
        assert!(may_retry(
            true,
            Failure::NothingWritten,
            "POST",
            &none,
            true,
            true
        ));
        assert!(!may_retry(
            true,
            Failure::NothingWritten,
            "POST",
            &none,
            true,
            false
        ));
    }
}
