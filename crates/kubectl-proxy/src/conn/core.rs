//! The proxy's settings and counters, and one core's state: its pool of
//! kept-alive HTTP/1.1 upstream connections, its HTTP/2 upstream
//! connections (another opened when their stream limits are used up), and
//! dialing the upstream (TCP, an HTTP proxy, TLS).

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use h2::client::SendRequest;
use monoio::io::IntoPollIo;
use prometheus_client::metrics::counter::Counter;

use super::READ_CHUNK;
use crate::filter::Filter;
use crate::io::{go_error_text, UpstreamIo};
use crate::mux::Mux;
use crate::upstream_config::Upstream;
use engine::exposition::{Exact, Exposition};
use protocol::kubectl::h2_pool;

/// Pooled upstream connections idle longer than this are dropped.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Counters for `/metrics`, on prometheus-client like the server's and
/// the agent's (and with the same process and build families).
pub(crate) struct ProxyMetrics {
    pub requests: Counter,
    pub forwarded: Counter,
    pub rejected: Counter,
    pub upgrades: Counter,
    pub upstream_dials: Counter,
    pub upstream_reused: Counter,
    pub upstream_errors: Counter,
    pub bytes_up: Counter,
    pub bytes_down: Counter,
    exposition: Exposition,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        let mut x = Exact::default();
        // Named without "_total": the text encoder adds it to counters.
        let mut counter = |name: &str, help: &'static str| {
            let c = Counter::default();
            x.add(format!("edgetunnel_proxy_{name}"), help, c.clone());
            c
        };
        let requests = counter("requests", "Requests read from clients.");
        let forwarded = counter("forwarded", "Requests forwarded upstream.");
        let rejected = counter("rejected", "Requests refused by the filter.");
        let upgrades = counter("upgrades", "Upgraded connections relayed.");
        let upstream_dials = counter("upstream_dials", "Upstream connections opened.");
        let upstream_reused = counter(
            "upstream_reused",
            "Requests sent on a pooled upstream connection.",
        );
        let upstream_errors = counter("upstream_errors", "Requests that failed upstream.");
        let bytes_up = counter("bytes_up", "Body bytes sent upstream.");
        let bytes_down = counter("bytes_down", "Body bytes sent to clients.");
        x.add(
            "edgetunnel_log_write_errors",
            "Log lines lost: their write failed (stderr closed, disk full) or the log queue was full (stderr not read).",
            engine::logging::write_errors(),
        );
        ProxyMetrics {
            requests,
            forwarded,
            rejected,
            upgrades,
            upstream_dials,
            upstream_reused,
            upstream_errors,
            bytes_up,
            bytes_down,
            exposition: Exposition::new(x),
        }
    }
}

impl ProxyMetrics {
    pub(crate) fn render(&self) -> String {
        self.exposition.render()
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
    /// This core's HTTP/2 connections to the upstream, once negotiated:
    /// another is opened when every one has its concurrency slots taken.
    h2: RefCell<Vec<H2Conn>>,
    /// The last [`H2Conn::id`] given.
    h2_ids: Cell<u64>,
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
            h2: RefCell::new(Vec::new()),
            h2_ids: Cell::new(0),
            h2_ok: std::cell::Cell::new(None),
            h2_dial: futures::lock::Mutex::new(()),
        })
    }

    /// A sender on one of this core's HTTP/2 connections with a slot
    /// reserved on it, dialing a new connection when none can take the
    /// request (as Go's transport does, see [`h2_pool`]). `None`: the
    /// upstream does not speak HTTP/2 (or has not been asked yet and does
    /// not): use HTTP/1.1.
    pub(super) async fn h2_sender(&self) -> Option<(SendRequest<Bytes>, StreamSlot)> {
        if self.shared.upstream.tls_h2.is_none() || self.h2_ok.get() == Some(false) {
            return None;
        }
        if let Some(found) = self.h2_reserve().await {
            return Some(found);
        }
        // One dial at a time per core; the others wait, then look again
        // (Go's `getStartDialLocked` shares one dial per address).
        let _dialing = self.h2_dial.lock().await;
        if self.h2_ok.get() == Some(false) {
            return None;
        }
        if let Some(found) = self.h2_reserve().await {
            return Some(found);
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
                let id = self.h2_ids.get() + 1;
                self.h2_ids.set(id);
                let c = H2Conn {
                    send,
                    id,
                    generation,
                    in_use: Rc::new(Cell::new(0)),
                };
                let slot = StreamSlot::take(&c);
                let send = c.send.clone();
                self.h2.borrow_mut().push(c);
                Some((send.ready().await.ok()?, slot))
            }
            Err(e) => {
                tracing::warn!("upstream http2 handshake: {e}");
                None
            }
        }
    }

    /// A slot on the first connection that can take a request; closed
    /// connections found on the way are dropped.
    async fn h2_reserve(&self) -> Option<(SendRequest<Bytes>, StreamSlot)> {
        self.drop_h2_if_rotated();
        loop {
            let (send, slot) = {
                let conns = self.h2.borrow();
                let views: Vec<h2_pool::ConnView> = conns
                    .iter()
                    .map(|c| h2_pool::ConnView {
                        usable: true,
                        in_use: c.in_use.get(),
                        peer_max: c.send.current_max_send_streams(),
                    })
                    .collect();
                let i = h2_pool::pick(&views)?;
                (conns[i].send.clone(), StreamSlot::take(&conns[i]))
            };
            match send.ready().await {
                Ok(s) => return Some((s, slot)),
                Err(e) => {
                    tracing::debug!("upstream http2 connection unusable: {e}");
                    self.drop_h2(slot.conn);
                }
            }
        }
    }

    /// Forgets a connection that failed a request (a GOAWAY, a broken
    /// connection): new requests go elsewhere.
    pub(super) fn drop_h2(&self, conn: u64) {
        self.h2.borrow_mut().retain(|c| c.id != conn);
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
        self.h2.borrow_mut().retain(|c| {
            let keep = c.generation == now;
            if !keep {
                tracing::debug!(
                    "upstream http2 connection made with an older client certificate: dropped"
                );
            }
            keep
        });
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
            // Idle, it holds no buffer: a read reserved 64 KiB, and a pool
            // of 64 connections a core kept 4 MiB of them.
            c.buf = BytesMut::new();
            pool.push((c, Instant::now()));
        }
    }

    pub(super) async fn dial(&self) -> Result<UpConn, String> {
        self.dial_with(false).await
    }

    /// Dials the upstream; with `offer_h2`, TLS offers HTTP/2 first.
    async fn dial_with(&self, offer_h2: bool) -> Result<UpConn, String> {
        let s = &self.shared;
        s.metrics.upstream_dials.inc_by(1);
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
                        engine::sys::with_sock(&tcp, |sock| {
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
                            crate::proxy_dial::through_proxy(
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
                                        .connect(name, engine::read_ahead::ReadAhead::new(io))
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

/// One HTTP/2 connection to the upstream.
struct H2Conn {
    send: SendRequest<Bytes>,
    /// Names it among this core's connections.
    id: u64,
    /// The client-certificate generation it was made under.
    generation: u64,
    /// Requests on it now (Go's `currentRequestCountLocked`), held by
    /// their [`StreamSlot`]s.
    in_use: Rc<Cell<usize>>,
}

/// A request's place on an HTTP/2 connection, from before its stream opens
/// until its forwarding ends (the stream is closed or reset by then).
pub(super) struct StreamSlot {
    in_use: Rc<Cell<usize>>,
    /// The connection's [`H2Conn::id`].
    pub(super) conn: u64,
}

impl StreamSlot {
    fn take(c: &H2Conn) -> StreamSlot {
        c.in_use.set(c.in_use.get() + 1);
        StreamSlot {
            in_use: c.in_use.clone(),
            conn: c.id,
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.in_use.set(self.in_use.get().saturating_sub(1));
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
