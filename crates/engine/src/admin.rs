//! The admin and health listeners: `/metrics`, `/healthz`, `/readyz` (and
//! `/ready`, ANP's deprecated name kept for old probes) over HTTP/1.1.
//! Tiny and self-contained; one request per connection.

use std::net::SocketAddr;
use std::rc::Rc;

use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpListener;

use crate::accept;
use crate::head_reader::{read_request_head, ReadHeadError};
use protocol::http1::{HeadLimit, RequestHead};

/// What the admin endpoints report.
pub trait AdminState: 'static {
    fn metrics(&self) -> String;
    /// `Ok(text)` when ready, `Err(reason)` otherwise.
    fn ready(&self) -> Result<String, String>;
}

/// Serves the admin endpoints on `listener` (called `name` in logs)
/// until the task is dropped or `stop` is raised.
pub async fn serve(
    listener: TcpListener,
    name: &'static str,
    state: Rc<dyn AdminState>,
    stop: Option<std::sync::Arc<crate::signals::Shutdown>>,
) {
    let mut opts = accept::Options::named(name);
    opts.stop = stop;
    accept::serve(listener, opts, move |c| {
        let state = state.clone();
        let (mut stream, peer) = (c.stream, c.peer);
        async move {
            let head = monoio::time::timeout(
                HEAD_TIMEOUT,
                read_request_head(&mut stream, HeadLimit::ADMIN),
            )
            .await;
            let response = match head {
                Ok(Ok(got)) => respond(&got.head, &*state, peer),
                Ok(Err(ReadHeadError::Head(_))) => reply(400, "text/plain", "bad request\n"),
                Ok(Err(_)) | Err(_) => return,
            };
            let _ = stream.write_all(response.into_bytes()).await;
        }
    })
    .await
}

const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Answers one request head.
fn respond(req: &RequestHead, state: &dyn AdminState, peer: SocketAddr) -> String {
    let path = req.target.split('?').next().unwrap_or("/");
    tracing::trace!(%peer, path, "admin request");
    match path {
        "/metrics" => reply(200, crate::exposition::CONTENT_TYPE, &state.metrics()),
        "/healthz" => reply(200, "text/plain", "ok"),
        "/readyz" | "/ready" => match state.ready() {
            Ok(t) => reply(200, "text/plain", &t),
            Err(t) => reply(500, "text/plain", &t),
        },
        _ => reply(404, "text/plain", "404 page not found\n"),
    }
}

fn reply(status: u16, content_type: &str, body: &str) -> String {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Internal Server Error",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
