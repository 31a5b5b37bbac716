//! HTTP/2 toward the upstream, as client-go uses when the API server offers
//! it: multiplexed connections per core carry the proxied requests of that
//! core (another is opened when the server's stream limit is reached). Heads are translated from the HTTP/1.1 side and back.

use bytes::Bytes;
use h2::client::SendRequest;
use h2::SendStream;

use crate::io::UpstreamIo;
use protocol::http1::{self, Header, ResponseHead};

const STREAM_WINDOW: u32 = 4 << 20;
const UPSTREAM_H2_CONNECTION_WINDOW: u32 = 16 << 20;
const MAX_FRAME: u32 = 64 * 1024;

/// How long a new connection waits for the server's first SETTINGS.
const SETTINGS_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the HTTP/2 handshake on a negotiated connection, spawns its driver
/// on this core, and waits (one round trip, a PING) until the server's
/// first SETTINGS were applied: the requests waiting for this connection
/// then see its real stream limit, not the 100 assumed before, and those it
/// cannot take open another connection instead of queueing on this one.
pub(super) async fn handshake(io: UpstreamIo) -> Result<SendRequest<Bytes>, String> {
    let (send, mut conn) = h2::client::Builder::new()
        // Go's `initialMaxConcurrentStreams` until the server's SETTINGS
        // say otherwise (golang.org/x/net http2/transport.go).
        .initial_max_send_streams(protocol::kubectl::h2_pool::INITIAL_MAX_STREAMS)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(UPSTREAM_H2_CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(|e| format!("http2: {e}"))?;
    let ping = conn.ping_pong();
    monoio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("upstream http2 connection ended: {e}");
        }
    });
    // The server's SETTINGS come first on its side of the connection, so
    // they have been applied once the PONG is read.
    if let Some(mut ping) = ping {
        match monoio::time::timeout(SETTINGS_WAIT, ping.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(e)) => return Err(format!("http2: {e}")),
            Err(_) => tracing::debug!("upstream http2: no PING answer within {SETTINGS_WAIT:?}"),
        }
    }
    Ok(send)
}

/// Headers HTTP/2 forbids (connection-specific), besides `te` other than
/// `trailers`.
fn connection_specific(name: &str) -> bool {
    [
        "connection",
        "proxy-connection",
        "keep-alive",
        "transfer-encoding",
        "upgrade",
        "host",
    ]
    .iter()
    .any(|n| name.eq_ignore_ascii_case(n))
}

/// The HTTP/2 request for a proxied HTTP/1.1 request.
pub(super) fn request(
    method: &str,
    authority: &str,
    target: &str,
    headers: &[Header],
) -> Result<http::Request<()>, String> {
    let uri = format!("https://{authority}{target}");
    let mut b = http::Request::builder()
        .method(method)
        .uri(uri)
        .version(http::Version::HTTP_2);
    for h in headers {
        if connection_specific(&h.name)
            || (h.name.eq_ignore_ascii_case("te") && !h.value.eq_ignore_ascii_case(b"trailers"))
        {
            continue;
        }
        b = b.header(h.name.as_str(), h.value.as_slice());
    }
    b.body(())
        .map_err(|e| format!("invalid request for http2: {e}"))
}

/// The HTTP/1.1 view of an HTTP/2 response head (names canonicalized, as
/// Go's transport does).
pub(super) fn response_head(parts: &http::response::Parts) -> ResponseHead {
    ResponseHead {
        status: parts.status.as_u16(),
        reason: parts
            .status
            .canonical_reason()
            .unwrap_or("Unknown")
            .to_string(),
        minor: 1,
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| Header {
                name: http1::canonical_name(n.as_str()),
                value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

/// Sends `data` on `tx`, waiting for flow-control capacity as needed.
pub(super) async fn send_data(tx: &mut SendStream<Bytes>, mut data: Bytes) -> Result<(), String> {
    while !data.is_empty() {
        tx.reserve_capacity(data.len());
        let cap = loop {
            let cap = tx.capacity();
            if cap > 0 {
                break cap;
            }
            match futures::future::poll_fn(|cx| tx.poll_capacity(cx)).await {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("upstream stream closed".into()),
            }
        };
        let piece = data.split_to(cap.min(data.len()));
        tx.send_data(piece, false).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_drops_connection_headers() {
        let h = |n: &str, v: &str| Header {
            name: n.into(),
            value: v.as_bytes().to_vec(),
        };
        let r = request(
            "GET",
            "127.0.0.1:6443",
            "/api?x=1",
            &[
                h("X-A", "1"),
                h("Transfer-Encoding", "chunked"),
                h("Te", "gzip"),
                h("Authorization", "Bearer t"),
            ],
        )
        .unwrap();
        assert_eq!(r.uri().path_and_query().unwrap().as_str(), "/api?x=1");
        assert_eq!(r.uri().authority().unwrap().as_str(), "127.0.0.1:6443");
        assert!(r.headers().get("transfer-encoding").is_none());
        assert!(r.headers().get("te").is_none());
        assert_eq!(r.headers()["x-a"], "1");
    }
}
