//! Forwarding one request over this core's HTTP/2 upstream connection:
//! the request body onto a stream, the answer back as HTTP/1.1.

use std::rc::Rc;
use std::time::Instant;

use tokio::io::AsyncWriteExt;

use super::body::{write_piece, BodyError, BodyReader};
use super::core::StreamSlot;
use super::gunzip::Gunzip;
use super::hangup::{unless_hung_up, HungUp};
use super::local::proxy_error;
use super::round_trip::{log_round_trip, note_refused};
use super::{continue_if_expected, send, Client, Core, Next, ProxyMetrics};
use crate::credentials::Used;
use crate::forward::{self, ClientBody};
use protocol::http1::{self, Framing, RequestHead};

/// Forwards one request over this core's HTTP/2 upstream connection.
#[allow(clippy::too_many_arguments)]
pub(super) async fn forward_h2(
    client: &mut Client,
    head: &RequestHead,
    target: &str,
    framing: Framing,
    keep: bool,
    core: &Rc<Core>,
    (mut sender, slot): (h2::client::SendRequest<bytes::Bytes>, StreamSlot),
    used: Option<Used>,
) -> Next {
    use super::h2_upstream;
    let shared = &core.shared;
    shared.metrics.upstream_reused.inc_by(1);
    let started = Instant::now();
    let gzip = forward::wants_gzip(head, false, shared.disable_compression);
    let headers =
        forward::upstream_headers(head, framing, client.peer, &shared.upstream, false, gzip);
    let req =
        match h2_upstream::request(&head.method, &shared.upstream.host_header, target, &headers) {
            Ok(r) => r,
            Err(e) => return send(client, &forward::error_response(400, &e, false), false).await,
        };
    if !continue_if_expected(client, head, framing).await {
        return Next::Close;
    }
    let (resp_fut, mut tx) = match sender.send_request(req, framing == Framing::None) {
        Ok(x) => x,
        Err(e) => {
            core.drop_h2(slot.conn);
            return proxy_error(client, core, &format!("http2: {e}")).await;
        }
    };
    if framing != Framing::None {
        if let Err(e) = h2_request_body(client, &mut tx, framing, &shared.metrics).await {
            tx.send_reset(h2::Reason::CANCEL);
            return proxy_error(client, core, &e).await;
        }
    }
    // From here a client that hangs up resets the stream.
    client.watch_hangup = true;
    let resp = match unless_hung_up(client, resp_fut).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return proxy_error(client, core, &format!("http2: {e}")).await,
        Err(HungUp) => return cancel(tx),
    };
    let (parts, mut body) = resp.into_parts();
    let rhead = h2_upstream::response_head(&parts);
    log_round_trip(
        shared,
        &head.method,
        target,
        parts.status.as_u16(),
        parts.status.canonical_reason().unwrap_or(""),
        started,
    );
    note_refused(shared, &used, parts.status.as_u16()).await;
    let no_body = head.method == "HEAD"
        || parts.status.as_u16() == 204
        || parts.status.as_u16() == 304
        || body.is_end_stream();
    let length =
        http1::get(&rhead.headers, "content-length").and_then(|v| v.trim().parse::<u64>().ok());
    // Our own framing toward the client: the length when given, else chunks.
    let rframing = match (no_body, length) {
        (true, _) => Framing::None,
        (false, Some(n)) => Framing::Length(n),
        (false, None) => Framing::Chunked,
    };
    let gunzip = gzip && forward::is_gzipped(&rhead);
    let mut rhead = rhead;
    // The first DATA frame, read ahead when its bytes are sniffed.
    let mut first: Option<bytes::Bytes> = None;
    if forward::sniff_wanted(&head.method, &rhead, rframing) {
        match unless_hung_up(client, body.data()).await {
            Ok(Some(Ok(chunk))) => {
                forward::add_sniffed_type(&mut rhead, &chunk);
                first = Some(chunk);
            }
            Ok(Some(Err(e))) => return proxy_error(client, core, &format!("http2: {e}")).await,
            Ok(None) => {}
            Err(HungUp) => return cancel(tx),
        }
    }
    let (client_head, mode, keep) =
        forward::response_head(&rhead, rframing, head.minor, keep, gunzip);
    if client.io.write_all(&client_head).await.is_err() {
        return Next::Close;
    }
    let chunked_out = matches!((mode, rframing), (ClientBody::Verbatim, Framing::Chunked))
        || (mode == ClientBody::Gunzip && head.minor >= 1);
    let mut gz = (mode == ClientBody::Gunzip).then(|| Gunzip::new(head.minor >= 1));
    if mode != ClientBody::None {
        loop {
            let next = match first.take() {
                Some(chunk) => Some(Ok(chunk)),
                None => match unless_hung_up(client, body.data()).await {
                    Ok(next) => next,
                    Err(HungUp) => return cancel(tx),
                },
            };
            match next {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    let r = match gz.as_mut() {
                        Some(g) => g.feed(client, &chunk, &shared.metrics).await,
                        None => {
                            shared.metrics.bytes_down.inc_by(chunk.len() as u64);
                            write_piece(client, &chunk, chunked_out).await
                        }
                    };
                    if r.is_err() {
                        return Next::Close;
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!("upstream http2 body: {e}");
                    return Next::Close;
                }
                None => break,
            }
        }
        let end = match gz {
            Some(g) => g.finish(client).await,
            None if chunked_out => client.io.write_all(b"0\r\n\r\n").await,
            None => Ok(()),
        };
        if end.is_err() {
            return Next::Close;
        }
    }
    let _ = client.io.flush().await;
    drop(slot);
    if keep {
        Next::KeepAlive
    } else {
        Next::Close
    }
}

/// The client hung up: the stream is reset (RST_STREAM CANCEL, as Go's
/// transport does when the request's context ends).
fn cancel(mut tx: h2::SendStream<bytes::Bytes>) -> Next {
    tx.send_reset(h2::Reason::CANCEL);
    Next::Close
}

/// Copies a request body from the client onto an HTTP/2 stream (payload
/// only: chunked framing is HTTP/1.1's, not HTTP/2's), then ends it.
pub(super) async fn h2_request_body(
    client: &mut Client,
    tx: &mut h2::SendStream<bytes::Bytes>,
    framing: Framing,
    metrics: &ProxyMetrics,
) -> Result<(), String> {
    use super::h2_upstream::send_data;
    let mut body = BodyReader::request(framing);
    loop {
        let piece = match body.next(&mut client.io, &mut client.buf).await {
            Ok(Some(piece)) => piece,
            Ok(None) => break,
            Err(BodyError::Eof) => return Err("client closed during the request body".into()),
            Err(e) => return Err(e.to_string()),
        };
        for data in piece.data() {
            metrics.bytes_up.inc_by(data.len() as u64);
            send_data(tx, data).await?;
        }
    }
    tx.send_data(bytes::Bytes::new(), true)
        .map_err(|e| e.to_string())
}
