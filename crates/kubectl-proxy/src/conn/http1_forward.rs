//! Forwarding one request over HTTP/1.1: a pooled or new upstream
//! connection, the request head and body, interim and final answers, and
//! the response body streamed back.

use std::io;
use std::rc::Rc;
use std::time::Instant;

use bytes::Buf;
use tokio::io::AsyncWriteExt;

use super::body::BodyReader;
use super::core::UpConn;
use super::gunzip::relay_gunzip;
use super::h2_forward::forward_h2;
use super::hangup::{unless_hung_up, HungUp};
use super::local::proxy_error;
use super::round_trip::{fresh_auth, log_round_trip, note_refused};
use super::{continue_if_expected, read_more, Client, Core, Next, ProxyMetrics};
use crate::forward::{self, ClientBody};
use protocol::http1::{self, Framing, RequestHead};
use protocol::kubectl::retry;

/// Request bodies up to this size are read before the upstream is picked,
/// so a stale pooled connection can be retried.
pub(super) const BUFFERED_BODY: u64 = 64 * 1024;

/// Reads a request body of known small length completely.
pub(super) async fn read_small_body(client: &mut Client, n: u64) -> io::Result<bytes::Bytes> {
    while (client.buf.len() as u64) < n {
        if read_more(&mut client.io, &mut client.buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(client.buf.split_to(n as usize).freeze())
}

/// Copies a request body from the client to the upstream as it arrives.
pub(super) async fn stream_body(
    client: &mut Client,
    up: &mut UpConn,
    framing: Framing,
    metrics: &ProxyMetrics,
) -> io::Result<()> {
    // As it came: chunk framing is relayed, not redone.
    let mut body = BodyReader::request(framing);
    while let Some(piece) = body.next(&mut client.io, &mut client.buf).await? {
        up.io.write_all(piece.raw()).await?;
        // Before waiting for more from the client, push out what TLS
        // holds: a write returns once the session has the bytes, even when
        // the socket would block (kubectl proxy writes through as well).
        if !body.is_done() && client.buf.is_empty() {
            up.io.flush().await?;
        }
        metrics.bytes_up.inc_by(piece.raw().len() as u64);
    }
    Ok(())
}

pub(super) async fn read_response_head(up: &mut UpConn) -> io::Result<http1::ResponseHead> {
    loop {
        if !up.buf.is_empty() {
            match http1::parse_response(&up.buf, forward::UPSTREAM_HEAD_LIMIT) {
                Ok(Some((head, n))) => {
                    up.buf.advance(n);
                    return Ok(head);
                }
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
        }
        if read_more(&mut up.io, &mut up.buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                if up.buf.is_empty() {
                    "EOF"
                } else {
                    "unexpected EOF"
                },
            ));
        }
    }
}

pub(super) async fn forward_request(
    client: &mut Client,
    head: &RequestHead,
    target: &str,
    framing: Framing,
    keep: bool,
    core: &Rc<Core>,
) -> Next {
    let shared = &core.shared;
    let started = Instant::now();
    // First: a rotated client certificate retires pooled connections
    // before one is chosen.
    let used = match fresh_auth(head, shared).await {
        Ok(u) => u,
        Err(e) => return proxy_error(client, core, &e).await,
    };
    if let Some((send, slot)) = core.h2_sender().await {
        return forward_h2(
            client,
            head,
            target,
            framing,
            keep,
            core,
            (send, slot),
            used,
        )
        .await;
    }
    let gzip = forward::wants_gzip(head, false, shared.disable_compression);
    let upstream_head = forward::request_head(
        head,
        target,
        framing,
        client.peer,
        &shared.upstream,
        false,
        gzip,
    );
    if !continue_if_expected(client, head, framing).await {
        return Next::Close;
    }
    // Small bodies are read first so that a stale pooled connection can be
    // retried with the whole request.
    let small_body = match framing {
        Framing::Length(n) if n <= BUFFERED_BODY => match read_small_body(client, n).await {
            Ok(b) => Some(b),
            Err(_) => return Next::Close,
        },
        Framing::None => Some(bytes::Bytes::new()),
        _ => None,
    };
    // Go's `isReplayable` counts a body only when one was sent (kubectl's
    // reverse proxy sends none for `Content-Length: 0`).
    let has_body = !matches!(framing, Framing::None | Framing::Length(0));
    let mut attempt = 0;
    // Interim answers go on to HTTP/1.1 clients only (RFC 9110 15.2: never
    // a 1xx to an HTTP/1.0 client); once one went out, no retry.
    let mut relayed = false;
    let (mut up, resp) = loop {
        attempt += 1;
        let mut up = match core.checkout() {
            Some(c) => c,
            None => match core.dial().await {
                Ok(c) => c,
                Err(e) => return proxy_error(client, core, &e).await,
            },
        };
        let reused = up.reused;
        if reused {
            shared.metrics.upstream_reused.inc_by(1);
        }
        // Go's transport goes again for as long as the connection that
        // failed was a pooled one (a fresh dial failing ends it): several
        // pooled connections the upstream closed while idle are each
        // tried and dropped. Bounded by the pool, which only shrinks here.
        let may_retry = |failure| {
            attempt <= shared.idle_per_core + 1
                && retry::may_retry(
                    reused,
                    failure,
                    &head.method,
                    &head.headers,
                    has_body,
                    small_body.is_some(),
                )
        };
        let mut written = 0usize;
        let sent: io::Result<()> = async {
            match &small_body {
                Some(body) => {
                    let mut all = Vec::with_capacity(upstream_head.len() + body.len());
                    all.extend_from_slice(&upstream_head);
                    all.extend_from_slice(body);
                    write_counted(&mut up, &all, &mut written).await?;
                    shared.metrics.bytes_up.inc_by(body.len() as u64);
                }
                None => {
                    write_counted(&mut up, &upstream_head, &mut written).await?;
                    stream_body(client, &mut up, framing, &shared.metrics).await?;
                }
            }
            up.io.flush().await
        }
        .await;
        if let Err(e) = sent {
            let failure = if written == 0 {
                retry::Failure::NothingWritten
            } else {
                retry::Failure::Other
            };
            if may_retry(failure) {
                continue;
            }
            return proxy_error(client, core, &e.to_string()).await;
        }
        // From here a client that hangs up cancels the request.
        client.watch_hangup = true;
        match read_final_head(&mut up, client, head.minor >= 1, &mut relayed).await {
            Ok(resp) => break (up, resp),
            // Dropping `up` closes the upstream connection.
            Err(HeadFailure::HungUp) => return Next::Close,
            Err(HeadFailure::Upstream {
                error,
                answer_began,
            }) => {
                // Only a request the upstream cannot have answered goes
                // again: never one whose answer was being read.
                let failure = if answer_began || relayed {
                    retry::Failure::Other
                } else {
                    retry::Failure::NoAnswerByte
                };
                if may_retry(failure) {
                    continue;
                }
                return proxy_error(client, core, &error.to_string()).await;
            }
        }
    };
    if resp.status == 101 {
        // Not an upgrade request: the connection now speaks something else
        // and is dropped (Go's ReverseProxy answers with this error).
        let to = http1::get(&resp.headers, "upgrade").unwrap_or("");
        let text = format!("backend tried to switch protocol {to:?} when \"\" was requested");
        return proxy_error(client, core, &text).await;
    }

    log_round_trip(
        shared,
        &head.method,
        target,
        resp.status,
        &resp.reason,
        started,
    );
    note_refused(shared, &used, resp.status).await;
    let mut rframing = match http1::response_framing(&head.method, &resp) {
        Ok(f) => f,
        Err(e) => return proxy_error(client, core, &e.to_string()).await,
    };
    let upstream_reusable = resp.minor >= 1
        && !http1::has_token(&resp.headers, "connection", "close")
        && rframing != Framing::UntilClose;
    let gunzip = gzip && forward::is_gzipped(&resp);
    let mut resp = resp;
    if forward::sniff_wanted(&head.method, &resp, rframing) {
        // Go sniffs what its first read of the body gave.
        if up.buf.is_empty() {
            match unless_hung_up(client, read_more(&mut up.io, &mut up.buf)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return proxy_error(client, core, &e.to_string()).await,
                Err(HungUp) => return Next::Close,
            }
        }
        let n = match rframing {
            Framing::Length(n) => (n as usize).min(up.buf.len()),
            _ => 0,
        };
        forward::add_sniffed_type(&mut resp, &up.buf[..n]);
    }
    let (client_head, body, keep) =
        forward::response_head(&resp, rframing, head.minor, keep, gunzip);
    // A small answer already read whole goes out in one write with its head.
    let mut client_head = client_head;
    if let (ClientBody::Verbatim, Framing::Length(n)) = (body, rframing) {
        if n <= BUFFERED_BODY && up.buf.len() as u64 >= n {
            client_head.extend_from_slice(&up.buf[..n as usize]);
            up.buf.advance(n as usize);
            shared.metrics.bytes_down.inc_by(n);
            rframing = Framing::None;
        }
    }
    if client.io.write_all(&client_head).await.is_err() {
        return Next::Close;
    }
    let done = if body == ClientBody::Gunzip {
        relay_gunzip(client, &mut up, rframing, head.minor >= 1, &shared.metrics).await
    } else {
        relay_response(client, &mut up, rframing, body, &shared.metrics).await
    };
    match done {
        Ok(()) => {
            let _ = client.io.flush().await;
            if upstream_reusable {
                core.checkin(up);
            }
            if keep {
                Next::KeepAlive
            } else {
                Next::Close
            }
        }
        Err(e) => {
            tracing::debug!("response relay ended: {e}");
            Next::Close
        }
    }
}

/// Interim answers Go's transport reads before it gives up.
pub(super) const MAX_1XX: usize = 5;

/// Why no final answer head was read.
pub(super) enum HeadFailure {
    /// The client hung up meanwhile.
    HungUp,
    /// The upstream failed; `answer_began`: some of an answer had come.
    Upstream {
        error: io::Error,
        answer_began: bool,
    },
}

/// Reads the final answer to a request: every 1xx but 101 is interim
/// (RFC 9110 15.2), relayed to the client when `relay` (an HTTP/1.1 client,
/// as Go's `ReverseProxy` does through `Got1xxResponse`) and skipped
/// otherwise; more than [`MAX_1XX`] of them is an error, as in Go. A client
/// that hangs up meanwhile ends the wait.
pub(super) async fn read_final_head(
    up: &mut UpConn,
    client: &mut Client,
    relay: bool,
    relayed: &mut bool,
) -> Result<http1::ResponseHead, HeadFailure> {
    let mut interim = 0;
    let upstream = |error: io::Error, up: &UpConn, interim: usize| HeadFailure::Upstream {
        error,
        answer_began: interim > 0 || !up.buf.is_empty(),
    };
    loop {
        let r = match unless_hung_up(client, read_response_head(up)).await {
            Err(HungUp) => return Err(HeadFailure::HungUp),
            Ok(Err(e)) => return Err(upstream(e, up, interim)),
            Ok(Ok(r)) => r,
        };
        if !(100..200).contains(&r.status) || r.status == 101 {
            return Ok(r);
        }
        interim += 1;
        if interim > MAX_1XX {
            return Err(upstream(
                io::Error::other(
                    "net/http: HTTP/1.x transport connection broken: net/http: too many 1xx informational responses",
                ),
                up,
                interim,
            ));
        }
        if relay {
            *relayed = true;
            let sent = async {
                client
                    .io
                    .write_all(&forward::informational_head(&r))
                    .await?;
                client.io.flush().await
            }
            .await;
            if sent.is_err() {
                return Err(HeadFailure::HungUp);
            }
        }
    }
}

/// Writes `bytes` upstream, counting what was written.
async fn write_counted(up: &mut UpConn, bytes: &[u8], written: &mut usize) -> io::Result<()> {
    while *written < bytes.len() {
        match up.io.write(&bytes[*written..]).await? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => *written += n,
        }
    }
    Ok(())
}

/// Streams the response body to the client as it arrives.
pub(super) async fn relay_response(
    client: &mut Client,
    up: &mut UpConn,
    framing: Framing,
    mode: ClientBody,
    metrics: &ProxyMetrics,
) -> io::Result<()> {
    if mode == ClientBody::None {
        return Ok(());
    }
    let count = |n: usize| {
        metrics.bytes_down.inc_by(n as u64);
    };
    let mut body = BodyReader::response(framing);
    while let Some(piece) = unless_hung_up(client, body.next(&mut up.io, &mut up.buf)).await?? {
        if mode == ClientBody::Dechunk {
            // Payload only, to an HTTP/1.0 client.
            for data in piece.data() {
                client.io.write_all(&data).await?;
                count(data.len());
            }
        } else {
            client.io.write_all(piece.raw()).await?;
            count(piece.raw().len());
        }
    }
    Ok(())
}
