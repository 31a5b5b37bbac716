//! Answers made here rather than upstream: redirects, 404s, bad requests,
//! `--www` static files, upstream failures (kubectl's 500), and draining
//! the request bodies such answers leave unread.

use tokio::io::AsyncWriteExt;

use crate::forward;
use crate::gourl::{html_escape, RequestUrl};
use crate::mux::{redirect_location, Route};
use crate::static_files::{self, StaticReply};

use super::body::BodyReader;
use super::{send, Client, Core, Next, ProxySettings};
use protocol::http1::{Framing, RequestHead};

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
        Framing::Length(n) if n > DRAIN_LIMIT => return false,
        Framing::UntilClose => return false,
        _ => {}
    }
    let mut body = BodyReader::request(framing);
    let mut drained = 0u64;
    loop {
        match body.next(&mut client.io, &mut client.buf).await {
            Ok(Some(piece)) => drained += piece.raw().len() as u64,
            Ok(None) => return true,
            Err(_) => return false,
        }
        if body.is_done() {
            return true;
        }
        if drained > DRAIN_LIMIT {
            return false;
        }
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
    core.shared.metrics.upstream_errors.inc_by(1);
    tracing::warn!("error while proxying request: {text}");
    let method = if client.head_request { "HEAD" } else { "GET" };
    send(
        client,
        &forward::error_response_to(method, 500, text, false),
        false,
    )
    .await
}
