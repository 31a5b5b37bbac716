//! The proxy's settings and counters, and one core's state: its pool of
//! kept-alive HTTP/1.1 upstream connections, its HTTP/2 upstream
//! connection, and dialing the upstream (TCP, an HTTP proxy, TLS).

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use monoio::io::IntoPollIo;

use super::READ_CHUNK;
use crate::proxy::filter::Filter;
use crate::proxy::io::{go_error_text, UpstreamIo};
use crate::proxy::mux::Mux;
use crate::proxy::upstream_config::Upstream;

/// Pooled upstream connections idle longer than this are dropped.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Counters for `/metrics`.
#[derive(Default)]
pub(crate) struct ProxyMetrics {
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
    pub(crate) fn render(&self) -> String {
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
pub(crate) struct ProxySettings {
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
pub(crate) struct Core {
    pub shared: Arc<ProxySettings>,
    pool: RefCell<Vec<(UpConn, Instant)>>,
    /// This core's HTTP/2 connection to the upstream, once negotiated,
    /// with the client-certificate generation it was made under.
    pub(super) h2: RefCell<Option<(h2::client::SendRequest<bytes::Bytes>, u64)>>,
    /// Whether the upstream accepted HTTP/2 (None: not asked yet).
    h2_ok: std::cell::Cell<Option<bool>>,
    /// One HTTP/2 dial at a time per core; the others wait and share it.
    h2_dial: futures::lock::Mutex<()>,
}

impl Core {
    pub(crate) fn new(shared: Arc<ProxySettings>) -> Rc<Core> {
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
    pub(super) async fn h2_sender(&self) -> Option<h2::client::SendRequest<bytes::Bytes>> {
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

    pub(super) fn checkout(&self) -> Option<UpConn> {
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
    pub(super) fn checkin(&self, mut c: UpConn) {
        let generation = self.cert_generation();
        let mut pool = self.pool.borrow_mut();
        if pool.len() < self.shared.idle_per_core && c.cert_generation == generation && c.is_quiet()
        {
            c.reused = true;
            pool.push((c, Instant::now()));
        }
    }

    pub(super) async fn dial(&self) -> Result<UpConn, String> {
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
                            crate::proxy::proxy_dial::through_proxy(
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
pub(super) struct UpConn {
    pub(super) io: UpstreamIo,
    pub(super) buf: BytesMut,
    pub(super) reused: bool,
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
