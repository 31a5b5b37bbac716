//! Answers made here rather than upstream: redirects, 404s, bad requests,
//! `--www` static files, upstream failures (kubectl's 500), and draining
//! the request bodies such answers leave unread.

use std::sync::atomic::Ordering;

use bytes::Buf;
use tokio::io::AsyncWriteExt;

use crate::proxy::forward;
use crate::proxy::gourl::{html_escape, RequestUrl};
use crate::proxy::mux::{redirect_location, Route};
use crate::proxy::static_files::{self, StaticReply};

use super::{read_more, send, Client, Core, Next, ProxySettings};
use crate::protocol::http1::{ChunkedDecoder, Framing, RequestHead};

/// Unread request bodies up to this size are drained to keep the client
/// connection (as Go's server does); larger ones close it.
pub(super) const DRAIN_LIMIT: u64 = 256 * 1024;

/// Go's answer to a request it could not read: status, text, close.
pub(super) fn bad_request(status: u16, text: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n{text}",
        forward::reason(status)
    )
    .into_bytes()
}

/// Reads and throws away a request body we do not forward.
pub(super) async fn discard_body(client: &mut Client, framing: Framing) -> bool {
    match framing {
        Framing::None => true,
        Framing::Length(n) if n <= DRAIN_LIMIT => {
            let mut left = n;
            while left > 0 {
                if client.buf.is_empty()
                    && !matches!(read_more(&mut client.io, &mut client.buf).await, Ok(n) if n > 0)
                {
                    return false;
                }
                let take = (left as usize).min(client.buf.len());
                client.buf.advance(take);
                left -= take as u64;
            }
            true
        }
        Framing::Chunked => {
            let mut dec = ChunkedDecoder::new();
            let mut total = 0usize;
            loop {
                if client.buf.is_empty()
                    && !matches!(read_more(&mut client.io, &mut client.buf).await, Ok(n) if n > 0)
                {
                    return false;
                }
                let Ok(p) = dec.advance(&client.buf) else {
                    return false;
                };
                client.buf.advance(p.consumed);
                total += p.consumed;
                if p.done {
                    return true;
                }
                if total as u64 > DRAIN_LIMIT {
                    return false;
                }
            }
        }
        _ => false,
    }
}

pub(super) async fn answer_locally(
    client: &mut Client,
    head: &RequestHead,
    url: &RequestUrl,
    route: Route,
    shared: &ProxySettings,
    keep: bool,
) -> Next {
    match route {
        Route::Redirect(to) => {
            let loc = redirect_location(&to);
            let get_or_head = head.method == "GET" || head.method == "HEAD";
            let body = if head.method == "GET" {
                format!(
                    "<a href=\"{}\">Moved Permanently</a>.\n\n",
                    html_escape(&loc)
                )
            } else {
                String::new()
            };
            let resp = forward::local_response(
                &head.method,
                301,
                get_or_head.then_some("text/html; charset=utf-8"),
                &[("Location", &loc)],
                body.as_bytes(),
                keep,
            );
            send(client, &resp, keep).await
        }
        Route::NotFound => {
            send(
                client,
                &forward::error_response_to(&head.method, 404, "404 page not found", keep),
                keep,
            )
            .await
        }
        Route::BadRequest => {
            send(
                client,
                &forward::local_response(&head.method, 400, None, &[], b"", false),
                false,
            )
            .await
        }
        Route::Static(p) => {
            let Some(root) = &shared.www else {
                return send(
                    client,
                    &forward::error_response_to(&head.method, 404, "404 page not found", keep),
                    keep,
                )
                .await;
            };
            let req = static_files::StaticRequest {
                path: p,
                raw_query: url.raw_query.clone(),
                method: head.method.clone(),
                headers: head.headers.clone(),
                keep_alive: keep,
            };
            let StaticReply { head, body } = static_files::serve(root.clone(), req).await;
            if client.io.write_all(&head).await.is_err()
                || static_files::write_body(&mut client.io, body)
                    .await
                    .is_err()
            {
                return Next::Close;
            }
            if keep {
                Next::KeepAlive
            } else {
                Next::Close
            }
        }
        Route::Proxy(_) => Next::Close,
    }
}

/// Upstream failures answer 500 with the error text, as kubectl's responder.
pub(super) async fn proxy_error(client: &mut Client, core: &Core, text: &str) -> Next {
    core.shared
        .metrics
        .upstream_errors
        .fetch_add(1, Ordering::Relaxed);
    tracing::warn!("error while proxying request: {text}");
    let method = if client.head_request { "HEAD" } else { "GET" };
    send(
        client,
        &forward::error_response_to(method, 500, text, false),
        false,
    )
    .await
}
