//! One client connection: read request heads, route, filter, forward to the
//! upstream over a per-core pool of kept-alive connections, stream the
//! answer back as it arrives, relay upgraded connections both ways.

use std::cell::RefCell;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use monoio::io::IntoPollIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::credentials::Used;
use super::filter::Filter;
use super::forward::{self, ClientBody};
use super::gourl::{html_escape, RequestUrl};
use super::io::{go_error_text, ClientIo, UpstreamIo};
use super::mux::{redirect_location, Mux, Route};
use super::static_files::{self, StaticReply};
use super::upstream_config::Upstream;
use crate::protocol::http1::{self, ChunkedDecoder, Framing, HeadError, RequestHead};

/// Time allowed between bytes of a request head (and idle keep-alive).
const HEAD_TIMEOUT: Duration = Duration::from_secs(120);
/// Pooled upstream connections idle longer than this are dropped.
const POOL_IDLE: Duration = Duration::from_secs(60);
/// Request bodies up to this size are read before the upstream is picked,
/// so a stale pooled connection can be retried.
const BUFFERED_BODY: u64 = 64 * 1024;
/// Unread request bodies up to this size are drained to keep the client
/// connection (as Go's server does); larger ones close it.
const DRAIN_LIMIT: u64 = 256 * 1024;
const READ_CHUNK: usize = 64 * 1024;

/// Counters for `/metrics`.
#[derive(Default)]
pub struct ProxyMetrics {
    pub requests: AtomicU64,
    pub forwarded: AtomicU64,
    pub rejected: AtomicU64,
    pub upgrades: AtomicU64,
    pub upstream_dials: AtomicU64,
    pub upstream_reused: AtomicU64,
    pub upstream_errors: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
}

impl ProxyMetrics {
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = String::new();
        for (name, help, v) in [
            (
                "edgetunnel_proxy_requests_total",
                "Requests read from clients.",
                g(&self.requests),
            ),
            (
                "edgetunnel_proxy_forwarded_total",
                "Requests forwarded upstream.",
                g(&self.forwarded),
            ),
            (
                "edgetunnel_proxy_rejected_total",
                "Requests refused by the filter.",
                g(&self.rejected),
            ),
            (
                "edgetunnel_proxy_upgrades_total",
                "Upgraded connections relayed.",
                g(&self.upgrades),
            ),
            (
                "edgetunnel_proxy_upstream_dials_total",
                "Upstream connections opened.",
                g(&self.upstream_dials),
            ),
            (
                "edgetunnel_proxy_upstream_reused_total",
                "Requests sent on a pooled upstream connection.",
                g(&self.upstream_reused),
            ),
            (
                "edgetunnel_proxy_upstream_errors_total",
                "Requests that failed upstream.",
                g(&self.upstream_errors),
            ),
            (
                "edgetunnel_proxy_bytes_up_total",
                "Body bytes sent upstream.",
                g(&self.bytes_up),
            ),
            (
                "edgetunnel_proxy_bytes_down_total",
                "Body bytes sent to clients.",
                g(&self.bytes_down),
            ),
        ] {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
            ));
        }
        s
    }
}

/// The proxy's settings, shared read-only by every core.
pub struct ProxySettings {
    pub mux: Mux,
    pub filter: Option<Filter>,
    pub upstream: Upstream,
    pub dial_addrs: Vec<std::net::SocketAddr>,
    pub append_server_path: bool,
    pub disable_compression: bool,
    pub keepalive: Option<Duration>,
    pub www: Option<PathBuf>,
    pub idle_per_core: usize,
    /// kubectl -v6: one log line per upstream round trip.
    pub log_round_trips: bool,
    pub metrics: ProxyMetrics,
}

/// One core's state: the shared settings and this core's upstream pool.
pub struct Core {
    pub shared: Arc<ProxySettings>,
    pool: RefCell<Vec<(UpConn, Instant)>>,
    /// This core's HTTP/2 connection to the upstream, once negotiated,
    /// with the client-certificate generation it was made under.
    h2: RefCell<Option<(h2::client::SendRequest<bytes::Bytes>, u64)>>,
    /// Whether the upstream accepted HTTP/2 (None: not asked yet).
    h2_ok: std::cell::Cell<Option<bool>>,
    /// One HTTP/2 dial at a time per core; the others wait and share it.
    h2_dial: futures::lock::Mutex<()>,
}

impl Core {
    pub fn new(shared: Arc<ProxySettings>) -> Rc<Core> {
        Rc::new(Core {
            shared,
            pool: RefCell::new(Vec::new()),
            h2: RefCell::new(None),
            h2_ok: std::cell::Cell::new(None),
            h2_dial: futures::lock::Mutex::new(()),
        })
    }

    /// A sender on this core's HTTP/2 connection, dialing it when the
    /// upstream speaks HTTP/2 (or has not been asked yet). `None`: use
    /// HTTP/1.1.
    async fn h2_sender(&self) -> Option<h2::client::SendRequest<bytes::Bytes>> {
        if self.shared.upstream.tls_h2.is_none() || self.h2_ok.get() == Some(false) {
            return None;
        }
        self.drop_h2_if_rotated();
        let live = self.h2.borrow().clone().map(|(s, _)| s);
        if let Some(send) = live {
            match send.ready().await {
                Ok(s) => return Some(s),
                Err(e) => {
                    tracing::debug!("upstream http2 connection unusable: {e}");
                    *self.h2.borrow_mut() = None;
                }
            }
        }
        let _dialing = self.h2_dial.lock().await;
        if self.h2_ok.get() == Some(false) {
            return None;
        }
        self.drop_h2_if_rotated();
        let live = self.h2.borrow().clone().map(|(s, _)| s);
        if let Some(send) = live {
            if let Ok(s) = send.ready().await {
                return Some(s);
            }
        }
        let conn = self.dial_with(true).await.ok()?;
        let is_h2 = conn.io.alpn() == Some(b"h2");
        self.h2_ok.set(Some(is_h2));
        if !is_h2 {
            self.checkin(conn);
            return None;
        }
        let generation = conn.cert_generation;
        match super::h2_upstream::handshake(conn.io).await {
            Ok(send) => {
                *self.h2.borrow_mut() = Some((send.clone(), generation));
                send.ready().await.ok()
            }
            Err(e) => {
                tracing::warn!("upstream http2 handshake: {e}");
                None
            }
        }
    }

    /// The generation of the exec plugin's client certificate (0 when
    /// there is none): connections made under another one presented an
    /// older certificate and are not used for new requests.
    fn cert_generation(&self) -> u64 {
        self.shared
            .upstream
            .auth
            .dynamic()
            .map_or(0, |d| d.cert_generation())
    }

    /// Forgets the HTTP/2 connection when the client certificate changed
    /// since it was made (streams on it run to their end).
    fn drop_h2_if_rotated(&self) {
        let now = self.cert_generation();
        let mut h2 = self.h2.borrow_mut();
        if h2.as_ref().is_some_and(|(_, g)| *g != now) {
            tracing::debug!(
                "upstream http2 connection made with an older client certificate: dropped"
            );
            *h2 = None;
        }
    }

    fn checkout(&self) -> Option<UpConn> {
        let generation = self.cert_generation();
        let mut pool = self.pool.borrow_mut();
        while let Some((mut c, at)) = pool.pop() {
            if at.elapsed() < POOL_IDLE && c.cert_generation == generation && c.is_quiet() {
                return Some(c);
            }
        }
        None
    }

    /// Keeps a connection for the next request, only when nothing of it is
    /// left unread: bytes the upstream sent past the answer would otherwise
    /// be taken for the next client's answer.
    fn checkin(&self, mut c: UpConn) {
        let generation = self.cert_generation();
        let mut pool = self.pool.borrow_mut();
        if pool.len() < self.shared.idle_per_core && c.cert_generation == generation && c.is_quiet()
        {
            c.reused = true;
            pool.push((c, Instant::now()));
        }
    }

    async fn dial(&self) -> Result<UpConn, String> {
        self.dial_with(false).await
    }

    /// Dials the upstream; with `offer_h2`, TLS offers HTTP/2 first.
    async fn dial_with(&self, offer_h2: bool) -> Result<UpConn, String> {
        let s = &self.shared;
        s.metrics.upstream_dials.fetch_add(1, Ordering::Relaxed);
        // The exec plugin's certificate, current before the handshake asks
        // for it (awaits the credential thread when it must run).
        if let (Some(_), Some(d)) = (&s.upstream.tls, s.upstream.auth.dynamic()) {
            d.ready_for_handshake().await?;
        }
        let cert_generation = self.cert_generation();
        let mut last = String::from("no address");
        for addr in &s.dial_addrs {
            match monoio::net::TcpStream::connect_addr(*addr).await {
                Ok(tcp) => {
                    let _ = tcp.set_nodelay(true);
                    if let Some(ka) = s.keepalive {
                        crate::engine::sys::with_sock(&tcp, |sock| {
                            let _ = sock.set_tcp_keepalive(
                                &socket2::TcpKeepalive::new().with_time(ka).with_interval(ka),
                            );
                        });
                    }
                    let io = tcp
                        .into_poll_io()
                        .map_err(|e| format!("dial tcp {addr}: {}", go_error_text(&e)))?;
                    let cfg = if offer_h2 {
                        s.upstream.tls_h2.as_ref()
                    } else {
                        s.upstream.tls.as_ref()
                    };
                    let up = &s.upstream;
                    let io = match &up.proxy {
                        None => UpstreamIo::Plain(io),
                        Some(p) => {
                            let (host, port) = up.target_host_port();
                            super::proxy_dial::through_proxy(
                                io,
                                p,
                                host,
                                port,
                                cfg.is_some(),
                                up.tls.as_ref(),
                            )
                            .await?
                        }
                    };
                    let io = match cfg {
                        None => io,
                        Some(cfg) => {
                            let name = rustls::pki_types::ServerName::try_from(
                                s.upstream.server_name.clone(),
                            )
                            .map_err(|e| {
                                format!("invalid server name {:?}: {e}", s.upstream.server_name)
                            })?;
                            let connector = tokio_rustls::TlsConnector::from(cfg.clone());
                            match io {
                                UpstreamIo::Plain(io) => UpstreamIo::Tls(Box::new(
                                    connector
                                        .connect(
                                            name,
                                            crate::engine::read_ahead::ReadAhead::new(io),
                                        )
                                        .await
                                        .map_err(|e| format!("tls: {e}"))?,
                                )),
                                inner => UpstreamIo::Nested(Box::new(
                                    connector
                                        .connect(name, inner)
                                        .await
                                        .map_err(|e| format!("tls: {e}"))?,
                                )),
                            }
                        }
                    };
                    return Ok(UpConn {
                        io,
                        buf: BytesMut::with_capacity(READ_CHUNK),
                        reused: false,
                        cert_generation,
                    });
                }
                Err(e) => last = format!("dial tcp {addr}: connect: {}", go_error_text(&e)),
            }
        }
        Err(last)
    }
}

/// An upstream connection and what was read from it beyond the last message.
pub struct UpConn {
    io: UpstreamIo,
    buf: BytesMut,
    reused: bool,
    /// The client-certificate generation it was made under.
    cert_generation: u64,
}

impl UpConn {
    /// Whether the connection is idle and clean: nothing buffered, and a
    /// read attempted now would block. Unsolicited bytes, an EOF or an error
    /// make it unusable (Go's transport closes an idle connection that
    /// receives anything: "Unsolicited response received on idle HTTP
    /// channel"). A byte read here is dropped with the connection.
    fn is_quiet(&mut self) -> bool {
        use std::task::{Context, Poll, Waker};
        use tokio::io::{AsyncRead, ReadBuf};
        if !self.buf.is_empty() {
            return false;
        }
        let mut byte = [0u8; 1];
        let mut rb = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(Waker::noop());
        matches!(
            std::pin::Pin::new(&mut self.io).poll_read(&mut cx, &mut rb),
            Poll::Pending
        )
    }
}

/// The client side: the socket and unparsed bytes.
struct Client {
    io: ClientIo,
    buf: BytesMut,
    peer: Option<IpAddr>,
    /// The request being answered is HEAD (error answers carry no body).
    head_request: bool,
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
pub async fn serve(io: ClientIo, peer: Option<IpAddr>, core: Rc<Core>) {
    let mut client = Client {
        io,
        buf: BytesMut::with_capacity(8192),
        peer,
        head_request: false,
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
        core.shared.metrics.requests.fetch_add(1, Ordering::Relaxed);
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

/// Go's answer to a request it could not read: status, text, close.
fn bad_request(status: u16, text: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n{text}",
        forward::reason(status)
    )
    .into_bytes()
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

/// Reads and throws away a request body we do not forward.
async fn discard_body(client: &mut Client, framing: Framing) -> bool {
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

async fn handle(client: &mut Client, head: RequestHead, core: &Rc<Core>) -> Next {
    let shared = core.shared.clone();
    let keep = forward::client_keep_alive(&head);
    client.head_request = head.method == "HEAD";
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
            shared.metrics.rejected.fetch_add(1, Ordering::Relaxed);
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
    shared.metrics.forwarded.fetch_add(1, Ordering::Relaxed);
    let target = forward::upstream_target(&proxied, &shared.upstream, shared.append_server_path);
    if forward::is_upgrade(&head) {
        shared.metrics.upgrades.fetch_add(1, Ordering::Relaxed);
        return Next::Upgrade {
            head,
            target,
            framing,
        };
    }
    forward_request(client, &head, &target, framing, keep, core).await
}

async fn answer_locally(
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

/// Upstream failures answer 500 with the error text, as kubectl's responder.
async fn proxy_error(client: &mut Client, core: &Core, text: &str) -> Next {
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

/// Makes refreshed credentials (exec plugin, token file) current before a
/// head is built and a connection chosen; awaits only when they must be
/// fetched, never blocking the core. Returns what the request uses (for
/// [`note_refused`]); nothing when the client brought its own
/// `Authorization` (client-go's exec round tripper leaves it alone).
async fn fresh_auth(head: &RequestHead, shared: &ProxySettings) -> Result<Option<Used>, String> {
    let Some(d) = shared.upstream.auth.dynamic() else {
        return Ok(None);
    };
    if http1::get(&head.headers, "authorization").is_some_and(|v| !v.is_empty()) {
        return Ok(None);
    }
    d.ready().await.map(Some)
}

/// client-go's -v6 line for one round trip (URL as sent upstream).
fn log_round_trip(
    shared: &ProxySettings,
    method: &str,
    target: &str,
    status: u16,
    reason: &str,
    started: Instant,
) {
    if shared.log_round_trips {
        let scheme = if shared.upstream.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let url = format!("{scheme}://{}{target}", shared.upstream.host_header);
        let ms = started.elapsed().as_millis();
        tracing::info!(
            target: "edgetunnel::proxy::round_trip",
            "{}",
            super::klog::round_trip_line(method, &url, status, reason, ms)
        );
    }
}

/// A 401 to a request that used our refreshed credentials: fetch them again.
async fn note_refused(shared: &ProxySettings, used: &Option<Used>, status: u16) {
    if status == 401 {
        if let (Some(d), Some(used)) = (shared.upstream.auth.dynamic(), used) {
            d.refused(used).await;
        }
    }
}

/// Reads a request body of known small length completely.
async fn read_small_body(client: &mut Client, n: u64) -> io::Result<bytes::Bytes> {
    while (client.buf.len() as u64) < n {
        if read_more(&mut client.io, &mut client.buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(client.buf.split_to(n as usize).freeze())
}

/// Copies a request body from the client to the upstream as it arrives.
async fn stream_body(
    client: &mut Client,
    up: &mut UpConn,
    framing: Framing,
    metrics: &ProxyMetrics,
) -> io::Result<()> {
    match framing {
        Framing::None | Framing::UntilClose => Ok(()),
        Framing::Length(mut left) => {
            while left > 0 {
                if client.buf.is_empty() && read_more(&mut client.io, &mut client.buf).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let take = (left as usize).min(client.buf.len());
                up.io.write_all(&client.buf[..take]).await?;
                client.buf.advance(take);
                left -= take as u64;
                metrics.bytes_up.fetch_add(take as u64, Ordering::Relaxed);
            }
            Ok(())
        }
        Framing::Chunked => {
            let mut dec = ChunkedDecoder::new();
            loop {
                if client.buf.is_empty() && read_more(&mut client.io, &mut client.buf).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let p = dec
                    .advance(&client.buf)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                up.io.write_all(&client.buf[..p.consumed]).await?;
                client.buf.advance(p.consumed);
                metrics
                    .bytes_up
                    .fetch_add(p.consumed as u64, Ordering::Relaxed);
                if p.done {
                    return Ok(());
                }
            }
        }
    }
}

async fn read_response_head(up: &mut UpConn) -> io::Result<http1::ResponseHead> {
    loop {
        if !up.buf.is_empty() {
            match http1::parse_response(&up.buf, http1::HeadLimit::GO_SERVER) {
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

async fn forward_request(
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
    if let Some(send) = core.h2_sender().await {
        return forward_h2(client, head, target, framing, keep, core, send, used).await;
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
            shared
                .metrics
                .upstream_reused
                .fetch_add(1, Ordering::Relaxed);
        }
        let sent: io::Result<()> = async {
            match &small_body {
                Some(body) => {
                    if body.is_empty() {
                        up.io.write_all(&upstream_head).await?;
                    } else {
                        let mut all = Vec::with_capacity(upstream_head.len() + body.len());
                        all.extend_from_slice(&upstream_head);
                        all.extend_from_slice(body);
                        up.io.write_all(&all).await?;
                        shared
                            .metrics
                            .bytes_up
                            .fetch_add(body.len() as u64, Ordering::Relaxed);
                    }
                }
                None => {
                    up.io.write_all(&upstream_head).await?;
                    stream_body(client, &mut up, framing, &shared.metrics).await?;
                }
            }
            up.io.flush().await
        }
        .await;
        let result = match sent {
            Ok(()) => read_final_head(&mut up, client, head.minor >= 1, &mut relayed).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(resp) => break (up, resp),
            // A pooled connection the upstream closed meanwhile: retry once
            // on a new one when the whole request is still at hand.
            Err(_) if reused && small_body.is_some() && attempt == 1 && !relayed => continue,
            Err(e) => return proxy_error(client, core, &e.to_string()).await,
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
            if let Err(e) = read_more(&mut up.io, &mut up.buf).await {
                return proxy_error(client, core, &e.to_string()).await;
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
            shared.metrics.bytes_down.fetch_add(n, Ordering::Relaxed);
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
const MAX_1XX: usize = 5;

/// Reads the final answer to a request: every 1xx but 101 is interim
/// (RFC 9110 15.2), relayed to the client when `relay` (an HTTP/1.1 client,
/// as Go's `ReverseProxy` does through `Got1xxResponse`) and skipped
/// otherwise; more than [`MAX_1XX`] of them is an error, as in Go.
async fn read_final_head(
    up: &mut UpConn,
    client: &mut Client,
    relay: bool,
    relayed: &mut bool,
) -> io::Result<http1::ResponseHead> {
    let mut interim = 0;
    loop {
        let r = read_response_head(up).await?;
        if !(100..200).contains(&r.status) || r.status == 101 {
            return Ok(r);
        }
        interim += 1;
        if interim > MAX_1XX {
            return Err(io::Error::other(
                "net/http: HTTP/1.x transport connection broken: net/http: too many 1xx informational responses",
            ));
        }
        if relay {
            *relayed = true;
            client
                .io
                .write_all(&forward::informational_head(&r))
                .await?;
            client.io.flush().await?;
        }
    }
}

/// Streams the response body to the client as it arrives.
async fn relay_response(
    client: &mut Client,
    up: &mut UpConn,
    framing: Framing,
    body: ClientBody,
    metrics: &ProxyMetrics,
) -> io::Result<()> {
    let count = |n: usize| {
        metrics.bytes_down.fetch_add(n as u64, Ordering::Relaxed);
    };
    match (framing, body) {
        (Framing::None, _) | (_, ClientBody::None) => Ok(()),
        (Framing::Length(mut left), _) => {
            while left > 0 {
                if up.buf.is_empty() && read_more(&mut up.io, &mut up.buf).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let take = (left as usize).min(up.buf.len());
                client.io.write_all(&up.buf[..take]).await?;
                up.buf.advance(take);
                left -= take as u64;
                count(take);
            }
            Ok(())
        }
        (Framing::Chunked, mode) => {
            let mut dec = ChunkedDecoder::new();
            loop {
                if up.buf.is_empty() && read_more(&mut up.io, &mut up.buf).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let p = dec
                    .advance(&up.buf)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                if mode == ClientBody::Dechunk {
                    for r in &p.data {
                        client.io.write_all(&up.buf[r.clone()]).await?;
                        count(r.len());
                    }
                } else {
                    client.io.write_all(&up.buf[..p.consumed]).await?;
                    count(p.consumed);
                }
                up.buf.advance(p.consumed);
                if p.done {
                    return Ok(());
                }
            }
        }
        (Framing::UntilClose, _) => loop {
            if up.buf.is_empty() && read_more(&mut up.io, &mut up.buf).await? == 0 {
                return Ok(());
            }
            client.io.write_all(&up.buf).await?;
            count(up.buf.len());
            up.buf.clear();
        },
    }
}

/// Decompresses a gzip body we asked for, streaming it to the client in
/// chunks (or raw to an HTTP/1.0 client). Input goes in small steps so a
/// compression bomb cannot grow memory past a few MiB.
async fn relay_gunzip(
    client: &mut Client,
    up: &mut UpConn,
    framing: Framing,
    chunked: bool,
    metrics: &ProxyMetrics,
) -> io::Result<()> {
    let mut gz = Gunzip::new(chunked);
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    let mut dec = ChunkedDecoder::new();
    let mut finished = false;
    while !finished {
        if left == 0 {
            break;
        }
        if up.buf.is_empty() && read_more(&mut up.io, &mut up.buf).await? == 0 {
            if framing == Framing::UntilClose {
                break;
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // The compressed payload in what we have.
        let (ranges, consumed) = match framing {
            Framing::Chunked => {
                let p = dec
                    .advance(&up.buf)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                finished = p.done;
                (p.data, p.consumed)
            }
            _ => {
                let take = (left.min(up.buf.len() as u64)) as usize;
                left -= take as u64;
                (std::iter::once(0..take).collect::<Vec<_>>(), take)
            }
        };
        for r in ranges {
            gz.feed(client, &up.buf[r], metrics).await?;
        }
        up.buf.advance(consumed);
    }
    gz.finish(client).await
}

/// Streaming gzip decompression toward the client, in small steps.
struct Gunzip {
    gz: flate2::write::GzDecoder<Vec<u8>>,
    chunked: bool,
}

impl Gunzip {
    const STEP: usize = 4096;

    fn new(chunked: bool) -> Self {
        Gunzip {
            gz: flate2::write::GzDecoder::new(Vec::with_capacity(READ_CHUNK)),
            chunked,
        }
    }

    async fn feed(
        &mut self,
        client: &mut Client,
        data: &[u8],
        metrics: &ProxyMetrics,
    ) -> io::Result<()> {
        use std::io::Write as _;
        for piece in data.chunks(Self::STEP) {
            self.gz.write_all(piece)?;
            let out = std::mem::take(self.gz.get_mut());
            write_body_piece(client, &out, self.chunked).await?;
            metrics
                .bytes_down
                .fetch_add(out.len() as u64, Ordering::Relaxed);
            *self.gz.get_mut() = out;
            self.gz.get_mut().clear();
        }
        Ok(())
    }

    async fn finish(mut self, client: &mut Client) -> io::Result<()> {
        self.gz.try_finish()?;
        let out = std::mem::take(self.gz.get_mut());
        write_body_piece(client, &out, self.chunked).await?;
        if self.chunked {
            client.io.write_all(b"0\r\n\r\n").await?;
        }
        Ok(())
    }
}

/// Forwards one request over this core's HTTP/2 upstream connection.
#[allow(clippy::too_many_arguments)]
async fn forward_h2(
    client: &mut Client,
    head: &RequestHead,
    target: &str,
    framing: Framing,
    keep: bool,
    core: &Rc<Core>,
    mut sender: h2::client::SendRequest<bytes::Bytes>,
    used: Option<Used>,
) -> Next {
    use super::h2_upstream;
    let shared = &core.shared;
    shared
        .metrics
        .upstream_reused
        .fetch_add(1, Ordering::Relaxed);
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
            *core.h2.borrow_mut() = None;
            return proxy_error(client, core, &format!("http2: {e}")).await;
        }
    };
    if framing != Framing::None {
        if let Err(e) = h2_request_body(client, &mut tx, framing, &shared.metrics).await {
            tx.send_reset(h2::Reason::CANCEL);
            return proxy_error(client, core, &e).await;
        }
    }
    let resp = match resp_fut.await {
        Ok(r) => r,
        Err(e) => return proxy_error(client, core, &format!("http2: {e}")).await,
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
        match body.data().await {
            Some(Ok(chunk)) => {
                forward::add_sniffed_type(&mut rhead, &chunk);
                first = Some(chunk);
            }
            Some(Err(e)) => return proxy_error(client, core, &format!("http2: {e}")).await,
            None => {}
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
                None => body.data().await,
            };
            match next {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    let r = match gz.as_mut() {
                        Some(g) => g.feed(client, &chunk, &shared.metrics).await,
                        None => {
                            shared
                                .metrics
                                .bytes_down
                                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            write_body_piece(client, &chunk, chunked_out).await
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
    if keep {
        Next::KeepAlive
    } else {
        Next::Close
    }
}

/// Copies a request body from the client onto an HTTP/2 stream (payload
/// only: chunked framing is HTTP/1.1's, not HTTP/2's), then ends it.
async fn h2_request_body(
    client: &mut Client,
    tx: &mut h2::SendStream<bytes::Bytes>,
    framing: Framing,
    metrics: &ProxyMetrics,
) -> Result<(), String> {
    use super::h2_upstream::send_data;
    let fill = |r: io::Result<usize>| match r {
        Ok(0) => Err("client closed during the request body".to_string()),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    };
    match framing {
        Framing::Length(mut left) => {
            while left > 0 {
                if client.buf.is_empty() {
                    fill(read_more(&mut client.io, &mut client.buf).await)?;
                }
                let take = (left as usize).min(client.buf.len());
                let piece = client.buf.split_to(take).freeze();
                left -= take as u64;
                metrics.bytes_up.fetch_add(take as u64, Ordering::Relaxed);
                send_data(tx, piece).await?;
            }
        }
        Framing::Chunked => {
            let mut dec = ChunkedDecoder::new();
            loop {
                if client.buf.is_empty() {
                    fill(read_more(&mut client.io, &mut client.buf).await)?;
                }
                let p = dec.advance(&client.buf).map_err(|e| e.to_string())?;
                let consumed = client.buf.split_to(p.consumed).freeze();
                for r in p.data {
                    metrics
                        .bytes_up
                        .fetch_add(r.len() as u64, Ordering::Relaxed);
                    send_data(tx, consumed.slice(r)).await?;
                }
                if p.done {
                    break;
                }
            }
        }
        Framing::None | Framing::UntilClose => {}
    }
    tx.send_data(bytes::Bytes::new(), true)
        .map_err(|e| e.to_string())
}

async fn write_body_piece(client: &mut Client, data: &[u8], chunked: bool) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    if chunked {
        let mut framed = Vec::with_capacity(data.len() + 16);
        framed.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        framed.extend_from_slice(data);
        framed.extend_from_slice(b"\r\n");
        client.io.write_all(&framed).await
    } else {
        client.io.write_all(data).await
    }
}

/// Relays an upgrade request (exec, attach, port-forward, websockets) on a
/// new upstream connection, raw in both directions from the request on.
/// Without TLS on either side the two sockets are spliced in the kernel.
async fn upgrade(
    mut client: Client,
    head: &RequestHead,
    target: &str,
    framing: Framing,
    core: &Rc<Core>,
) {
    let shared = &core.shared;
    if let Err(e) = fresh_auth(head, shared).await {
        proxy_error(&mut client, core, &e).await;
        return;
    }
    let upstream_head = forward::request_head(
        head,
        target,
        framing,
        client.peer,
        &shared.upstream,
        true,
        false,
    );
    let mut up = match core.dial().await {
        Ok(c) => c,
        Err(e) => {
            proxy_error(&mut client, core, &e).await;
            return;
        }
    };
    let mut first = upstream_head;
    first.extend_from_slice(&client.buf);
    client.buf.clear();
    if up.io.write_all(&first).await.is_err() || up.io.flush().await.is_err() {
        return;
    }
    if let Err(e) = relay_upgraded(client.io, up.io).await {
        tracing::debug!("upgraded connection ended: {e}");
    }
}

async fn relay_upgraded(client: ClientIo, up: UpstreamIo) -> io::Result<()> {
    match (client, up) {
        (ClientIo::Tcp(c), UpstreamIo::Plain(u)) => {
            let c = c.try_into_comp_io().map_err(|(e, _)| e)?;
            let u = u.try_into_comp_io().map_err(|(e, _)| e)?;
            splice_both(c, u).await
        }
        (ClientIo::Unix(c), UpstreamIo::Plain(u)) => {
            let c = c.try_into_comp_io().map_err(|(e, _)| e)?;
            let u = u.try_into_comp_io().map_err(|(e, _)| e)?;
            splice_both(c, u).await
        }
        (mut c, mut u) => tokio::io::copy_bidirectional(&mut c, &mut u)
            .await
            .map(|_| ()),
    }
}

/// Splices two sockets both ways, half-closing each direction at its EOF.
async fn splice_both<A, B>(a: A, b: B) -> io::Result<()>
where
    A: monoio::io::Splitable,
    B: monoio::io::Splitable,
    A::OwnedRead: monoio::io::as_fd::AsReadFd,
    A::OwnedWrite: monoio::io::as_fd::AsWriteFd + monoio::io::AsyncWriteRent,
    B::OwnedRead: monoio::io::as_fd::AsReadFd,
    B::OwnedWrite: monoio::io::as_fd::AsWriteFd + monoio::io::AsyncWriteRent,
{
    use monoio::io::AsyncWriteRent;
    let (mut ar, mut aw) = a.into_split();
    let (mut br, mut bw) = b.into_split();
    let ab = async {
        let r = monoio::io::zero_copy(&mut ar, &mut bw).await;
        let _ = bw.shutdown().await;
        r
    };
    let ba = async {
        let r = monoio::io::zero_copy(&mut br, &mut aw).await;
        let _ = aw.shutdown().await;
        r
    };
    let (x, y) = futures::join!(ab, ba);
    x.and(y).map(|_| ())
}
