//! The admin and health listeners: `/metrics`, `/healthz`, `/readyz` (and
//! `/ready`, ANP's deprecated name kept for old probes) over HTTP/1.1.
//! Tiny and self-contained; one request per connection.

use std::net::SocketAddr;
use std::rc::Rc;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpListener;

use crate::engine::accept;

/// What the admin endpoints report.
pub trait AdminState: 'static {
    fn metrics(&self) -> String;
    /// `Ok(text)` when ready, `Err(reason)` otherwise.
    fn ready(&self) -> Result<String, String>;
}

/// Serves the admin endpoints on `listener` (called `name` in logs)
/// until the task is dropped.
pub async fn serve(listener: TcpListener, name: &'static str, state: Rc<dyn AdminState>) {
    accept::serve(listener, accept::Options::named(name), move |c| {
        let state = state.clone();
        let (mut stream, peer) = (c.stream, c.peer);
        async move {
            let head = monoio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await;
            let Ok(Some(head)) = head else { return };
            let response = respond(&head, &*state, peer);
            let _ = stream.write_all(response.into_bytes()).await;
        }
    })
    .await
}

const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
const MAX_HEAD: usize = 8192;

/// Reads until the end of the request head (or MAX_HEAD bytes).
async fn read_head(stream: &mut monoio::net::TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    loop {
        let buf = Vec::with_capacity(2048);
        let (res, buf) = stream.read(buf).await;
        let n = res.ok()?;
        if n == 0 {
            return (!head.is_empty()).then_some(head);
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.len() >= MAX_HEAD {
            return Some(head);
        }
    }
}

fn respond(req: &[u8], state: &dyn AdminState, peer: SocketAddr) -> String {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Request::new(&mut headers);
    let path = match r.parse(req) {
        Ok(_) => r.path.unwrap_or("/").split('?').next().unwrap_or("/"),
        Err(_) => return reply(400, "text/plain", "bad request\n"),
    };
    tracing::trace!(%peer, path, "admin request");
    match path {
        "/metrics" => reply(200, crate::metrics::CONTENT_TYPE, &state.metrics()),
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
