//! One client connection: read request heads, route, filter, forward to the
//! upstream over a per-core pool of kept-alive connections, stream the
//! answer back as it arrives, relay upgraded connections both ways.
//!
//! This module owns the request loop ([`serve`]) and the routing of each
//! request; the rest lives beside it:
//! - `core`: settings, metrics, per-core state, the upstream pool and dialing;
//! - `local`: answers made here (redirects, 404, static files, errors) and
//!   draining the bodies they leave unread;
//! - `round_trip`: credentials before an upstream exchange, its log line and
//!   401 handling after;
//! - `http1_forward` / `h2_forward` (with `h2_upstream`): forwarding over
//!   HTTP/1.1 and HTTP/2;
//! - `body`: the one reader of HTTP/1 message bodies every body pump uses;
//! - `gunzip`: undoing the gzip we asked for; `upgrade`: upgraded connections;
//! - `hangup`: noticing a client gone while its answer is awaited.

use std::io;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::forward;
use super::gourl::RequestUrl;
use super::io::ClientIo;
use super::mux::Route;
use protocol::http1::{self, Framing, HeadError, RequestHead};

mod body;
mod core;
mod gunzip;
mod h2_forward;
mod h2_upstream;
mod hangup;
mod http1_forward;
mod local;
mod round_trip;
mod upgrade;

pub(super) use self::core::{Core, ProxyMetrics, ProxySettings};
use http1_forward::forward_request;
use local::{answer_locally, bad_request, discard_body};
use upgrade::upgrade;

/// Time allowed between bytes of a request head (and idle keep-alive).
const HEAD_TIMEOUT: Duration = Duration::from_secs(120);
/// What one read asks room for.
const READ_CHUNK: usize = 64 * 1024;

/// The client side: the socket and unparsed bytes.
struct Client {
    io: ClientIo,
    buf: BytesMut,
    peer: Option<IpAddr>,
    /// The request being answered is HEAD (error answers carry no body).
    head_request: bool,
    /// While the answer is awaited: an EOF from the client cancels the
    /// upstream request (see `hangup`); off once the client sent more.
    watch_hangup: bool,
}

enum Next {
    KeepAlive,
    Close,
    /// Relay the connection raw after sending this head upstream.
    Upgrade {
        head: RequestHead,
        target: String,
        framing: Framing,
    },
}

async fn read_more<R: tokio::io::AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
) -> io::Result<usize> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(READ_CHUNK);
    }
    io.read_buf(buf).await
}

/// Serves one client connection until it closes.
pub(super) async fn serve(io: ClientIo, peer: Option<IpAddr>, core: Rc<Core>) {
    let mut client = Client {
        io,
        buf: BytesMut::with_capacity(8192),
        peer,
        head_request: false,
        watch_hangup: false,
    };
    loop {
        let head = match read_request_head(&mut client).await {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                let (status, text) = match e {
                    HeadError::TooLarge => (431, "431 Request Header Fields Too Large".to_string()),
                    HeadError::Malformed(m) => {
                        tracing::debug!(peer = ?client.peer, "malformed request: {m}");
                        (400, "400 Bad Request".to_string())
                    }
                };
                let _ = client.io.write_all(&bad_request(status, &text)).await;
                lingering_close(&mut client).await;
                return;
            }
        };
        core.shared.metrics.requests.inc_by(1);
        match handle(&mut client, head, &core).await {
            Next::KeepAlive => continue,
            Next::Close => {
                lingering_close(&mut client).await;
                return;
            }
            Next::Upgrade {
                head,
                target,
                framing,
            } => {
                upgrade(client, &head, &target, framing, &core).await;
                return;
            }
        }
    }
}

/// Closes our side for writing, then reads and drops what the client still
/// sends for a moment, so that unread input does not turn our close into a
/// reset that destroys the answer in flight (Go's `closeWriteAndWait`).
async fn lingering_close(client: &mut Client) {
    let _ = client.io.flush().await;
    let _ = client.io.shutdown().await;
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut drained = 0usize;
    while drained < (16 << 20) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        client.buf.clear();
        match monoio::time::timeout(left, read_more(&mut client.io, &mut client.buf)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => return,
        }
    }
}

async fn read_request_head(client: &mut Client) -> Result<Option<RequestHead>, HeadError> {
    loop {
        if !client.buf.is_empty() {
            if let Some((head, n)) = http1::parse_request(&client.buf, http1::HeadLimit::GO_SERVER)?
            {
                client.buf.advance(n);
                return Ok(Some(head));
            }
        }
        match monoio::time::timeout(HEAD_TIMEOUT, read_more(&mut client.io, &mut client.buf)).await
        {
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
            Ok(Ok(_)) => {}
            Err(_) => {
                if !client.buf.is_empty() {
                    let _ = client
                        .io
                        .write_all(&bad_request(408, "408 Request Timeout"))
                        .await;
                }
                return Ok(None);
            }
        }
    }
}

async fn send(client: &mut Client, bytes: &[u8], keep: bool) -> Next {
    match client.io.write_all(bytes).await {
        Ok(()) if keep => Next::KeepAlive,
        _ => Next::Close,
    }
}

async fn handle(client: &mut Client, head: RequestHead, core: &Rc<Core>) -> Next {
    let shared = core.shared.clone();
    let keep = forward::client_keep_alive(&head);
    client.head_request = head.method == "HEAD";
    client.watch_hangup = false;
    let hosts = http1::values(&head.headers, "host").count();
    if hosts > 1 {
        return send(
            client,
            &bad_request(400, "400 Bad Request: too many Host headers"),
            false,
        )
        .await;
    }
    if hosts == 0 && head.minor >= 1 {
        return send(
            client,
            &bad_request(400, "400 Bad Request: missing required Host header"),
            false,
        )
        .await;
    }
    let framing = match http1::request_framing(&head) {
        Ok(f) => f,
        Err(HeadError::Malformed(m)) if m.starts_with("unsupported transfer encoding") => {
            return send(
                client,
                &bad_request(501, "Unsupported transfer encoding"),
                false,
            )
            .await;
        }
        Err(_) => return send(client, &bad_request(400, "400 Bad Request"), false).await,
    };
    let url = if head.method == "CONNECT" && !head.target.starts_with('/') {
        RequestUrl {
            host: head.target.clone(),
            ..Default::default()
        }
    } else {
        match RequestUrl::parse(&head.target) {
            Ok(u) => u,
            Err(_) => return send(client, &bad_request(400, "400 Bad Request"), false).await,
        }
    };
    let host_header = http1::get(&head.headers, "host").unwrap_or("").to_string();
    let host = if url.host.is_empty() {
        host_header
    } else {
        url.host.clone()
    };

    // A body announced with `Expect: 100-continue` that we answer without
    // reading is never asked for: the answer goes out at once and the
    // connection closes after it (Go's server: no 100, closeAfterReply).
    let awaits_continue =
        framing != Framing::None && http1::has_token(&head.headers, "expect", "100-continue");
    let route = shared.mux.route(&head.method, &head.target, &url);
    let proxied = match route {
        Route::Proxy(u) => u,
        other => {
            let keep = keep && !awaits_continue && discard_body(client, framing).await;
            return answer_locally(client, &head, &url, other, &shared, keep).await;
        }
    };
    if let Some(f) = &shared.filter {
        if !f.allows(&head.method, &proxied.path, &host) {
            shared.metrics.rejected.inc_by(1);
            tracing::debug!(method = %head.method, path = %proxied.path, %host, "filter rejecting");
            let keep = keep && !awaits_continue && discard_body(client, framing).await;
            return send(
                client,
                &forward::error_response_to(&head.method, 403, "Forbidden", keep),
                keep,
            )
            .await;
        }
    }
    shared.metrics.forwarded.inc_by(1);
    let target = forward::upstream_target(&proxied, &shared.upstream, shared.append_server_path);
    if forward::is_upgrade(&head) {
        shared.metrics.upgrades.inc_by(1);
        return Next::Upgrade {
            head,
            target,
            framing,
        };
    }
    forward_request(client, &head, &target, framing, keep, core).await
}

/// Answers `100 Continue` when the client waits for it before its body, as
/// Go's server does once the handler reads. False when the client is gone.
async fn continue_if_expected(client: &mut Client, head: &RequestHead, framing: Framing) -> bool {
    if framing == Framing::None || !http1::has_token(&head.headers, "expect", "100-continue") {
        return true;
    }
    client
        .io
        .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        .await
        .is_ok()
}
