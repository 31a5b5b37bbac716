//! The gRPC `ProxyService/Proxy` frontend (konnectivity-client): each HTTP/2
//! stream carries DIAL_REQ/DATA/CLOSE_REQ/DIAL_CLS from the client; the
//! server answers DIAL_RSP/DATA/CLOSE_RSP. What each packet means is decided
//! by the sans-I/O [`ProxyStream`]; this module routes its dials, moves its
//! packets and payload, and keeps reading the client while the client does
//! not read.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use futures::future::Either;
use futures::StreamExt;
use monoio::io::IntoPollIo;

use super::session::{AgentCmd, AgentHandle, FrontendEvent, FrontendSink};
use super::ServerState;
use crate::metrics::{self, DialResult, KeepalivePeer, Segment};
use engine::accept;
use engine::budget::Credit;
use engine::deadline::Deadline;
use engine::grpc::{self, code, GrpcError, PacketReceiver, StreamSender};
use engine::h2_conn::{H2Conn, H2Error, Incoming, RecvError, StreamRecv};
use engine::h2_keepalive::{KeepaliveError, PingSchedule};
use engine::window::{self, ConnWindow};
use protocol::anp::packet::{self, Frame};
use protocol::anp::pb::PacketType;
use protocol::anp::proxy_service_stream::{Abandoned, AgentEvent, ProxyStream, StreamAction};
use protocol::h2_server;
use protocol::{PROXY_PATH, ROUTE_ATTEMPTS};

use crate::BoxError;

/// How long a TLS caller may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// HTTP/2 window of one caller's stream (a stream carries one tunnel).
const FRONTEND_STREAM_WINDOW: u32 = 4 * 1024 * 1024;

/// The TCP listener; with `tls`, callers speak TLS (ALPN h2).
pub(super) async fn accept_tcp(
    shared: Arc<ServerState>,
    l: monoio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    accept::serve(l, shared.accept_options("grpc"), move |c| {
        // The connection's future is built out here, not in an async block
        // around it: the block would keep the accepted socket, the peer
        // and the TLS config (about 130 bytes) for the connection's life.
        let peer = c.peer;
        let io = match c.stream.into_poll_io() {
            Ok(io) => io,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "poll-io conversion failed");
                return Either::Left(std::future::ready(()));
            }
        };
        let shared = shared.clone();
        Either::Right(match tls.clone() {
            None => Either::Left(serve_conn(shared, io, peer.to_string())),
            // Boxed: a plaintext caller's task does not reserve room for
            // TLS (the handshake, its timer and the TLS connection state).
            Some(tls) => Either::Right(Box::pin(serve_tls(shared, io, peer, tls))),
        })
    })
    .await
}

/// A TLS caller: the handshake, then the connection.
async fn serve_tls(
    shared: Arc<ServerState>,
    io: monoio::net::tcp::stream_poll::TcpStreamPoll,
    peer: std::net::SocketAddr,
    tls: tokio_rustls::TlsAcceptor,
) {
    match Box::pin(monoio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(io))).await {
        Ok(Ok(io)) => serve_conn(shared, io, peer.to_string()).await,
        Ok(Err(e)) => {
            shared.metrics.frontend_errors.inc();
            tracing::info!(%peer, "gRPC frontend TLS handshake failed: {e}");
        }
        Err(_) => {
            shared.metrics.frontend_errors.inc();
            tracing::info!(%peer, "gRPC frontend TLS handshake timed out");
        }
    }
}

pub(super) async fn accept_unix(shared: Arc<ServerState>, l: monoio::net::UnixListener) {
    accept::serve(l, shared.accept_options("grpc-uds"), move |c| {
        match c.stream.into_poll_io() {
            Ok(io) => Either::Left(serve_conn(shared.clone(), io, "unix".to_string())),
            Err(e) => {
                tracing::warn!(error = %e, "poll-io conversion failed");
                Either::Right(std::future::ready(()))
            }
        }
    })
    .await
}

/// How long a connection told GOAWAY for idleness (or a drain) may stay
/// once it has no stream open, at most.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// A connection's open proxy streams and since when it has had none: a
/// connection without a stream for `--frontend-idle-secs` is closed, as
/// the CONNECT frontend closes a caller that sends no request head.
struct Idle {
    active: Cell<usize>,
    since: Cell<Instant>,
}

impl Idle {
    fn new(now: Instant) -> Rc<Self> {
        Rc::new(Idle {
            active: Cell::new(0),
            since: Cell::new(now),
        })
    }

    /// When the connection has been idle for `limit`; `None` while a
    /// stream is open.
    fn deadline(&self, limit: Duration) -> Option<Instant> {
        (self.active.get() == 0).then(|| self.since.get() + limit)
    }

    fn open(self: &Rc<Self>) -> OpenStream {
        self.active.set(self.active.get() + 1);
        OpenStream(self.clone())
    }
}

/// A proxy stream counted by [`Idle`] while it lives.
struct OpenStream(Rc<Idle>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        let n = self.0.active.get().saturating_sub(1);
        self.0.active.set(n);
        if n == 0 {
            self.0.since.set(Instant::now());
        }
    }
}

/// The HTTP/2 settings of a caller's connection: the stream window and
/// frame size the h2-based frontend had (the stream window grows to hold
/// a whole message of `max_message` bytes). The connection's window is two
/// streams' worth (it was 32 MiB): konnectivity-client opens one stream per
/// connection, and the windows bound what a caller can make us hold: the
/// bytes it sent that were not handed on yet (copied out of the read
/// buffer, and a message gathered whole gives its window back only once
/// decoded), and no more (issue 39, finding 4).
fn frontend_h2_config(max_message: usize) -> h2_server::Config {
    let stream_window = grpc::stream_window_for(max_message, FRONTEND_STREAM_WINDOW);
    h2_server::Config {
        stream_window,
        conn_window: stream_window.saturating_mul(2).min(grpc::MAX_WINDOW),
        max_frame: grpc::MAX_FRAME,
        ..h2_server::Config::default()
    }
}

/// Serves one caller's HTTP/2 connection on our own sans-I/O HTTP/2
/// server ([`H2Conn`]): an idle caller holds no buffer (h2 kept 28 KiB of
/// buffers per connection, and konnectivity-client opens a connection per
/// tunnel).
///
/// Returns an async block rather than being an `async fn`: the connection
/// is built out here, so the task holds it once, not the socket beside it
/// (a task is allocated at its largest state for as long as it lives).
#[allow(clippy::manual_async_fn)] // deliberate: see above
fn serve_conn<T>(shared: Arc<ServerState>, io: T, peer: String) -> impl Future<Output = ()>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    // Used in place by the block (a `let` inside would keep it twice).
    let mut conn = H2Conn::new(io, frontend_h2_config(shared.cfg.max_message));
    async move {
        let idle_for = shared.cfg.frontend_idle;
        let started = Instant::now();
        let idle = Idle::new(started);
        // PINGs toward callers that stay connected (ANP's
        // --frontend-keepalive-time): a caller gone without a FIN is noticed
        // and its streams end. Driven by the loop's one timer.
        let mut keepalive = PingSchedule::new(shared.cfg.frontend_keepalive, started);
        // A draining server sends GOAWAY (grpc-go's GracefulStop): the caller
        // opens new streams elsewhere, the open ones finish here.
        let mut draining = std::pin::pin!(shared.draining());
        // The idle limit, the handshake limit and the keepalive, on this
        // worker's deadline table: a timer of its own would be 640 bytes
        // held by every idle caller.
        let mut deadline = Deadline::new();
        let mut told = false;
        // The client's preface and SETTINGS came.
        let mut up = false;
        loop {
            enum Next {
                Conn(Option<Result<Incoming, H2Error>>),
                Drain,
                Tick,
            }
            // Told GOAWAY: the connection may stay a short while without a
            // stream (for the caller to see the GOAWAY and close).
            let limit = if told {
                CLOSE_GRACE.min(idle_for)
            } else {
                idle_for
            };
            // While streams are open, look again every `idle_for`; and when
            // the next PING or PONG is due.
            let wake_at = {
                // (In a block: `now` is not kept across the wait.)
                let now = Instant::now();
                let at = idle.deadline(limit).unwrap_or(now + idle_for);
                if up {
                    at.min(keepalive.deadline())
                } else {
                    at.min(started + idle_for)
                }
            };
            let next = monoio::select! {
                next = conn.next() => Next::Conn(next),
                _ = &mut draining, if !told => Next::Drain,
                _ = deadline.until(wake_at) => Next::Tick,
            };
            let next = match next {
                Next::Conn(n) => n,
                Next::Drain => {
                    told = true;
                    conn.go_away();
                    continue;
                }
                Next::Tick => {
                    let now = Instant::now();
                    if !up {
                        if now.duration_since(started) >= idle_for {
                            tracing::debug!(
                                %peer,
                                "gRPC frontend closed: no HTTP/2 preface in {idle_for:?}"
                            );
                            return;
                        }
                        continue;
                    }
                    let send_ping = || {
                        conn.ping();
                        Ok(())
                    };
                    if let Err(e) = keepalive.drive(send_ping, now) {
                        if let KeepaliveError::Timeout(_) = e {
                            shared.metrics.keepalive_timeout(KeepalivePeer::Frontend);
                        }
                        tracing::info!(%peer, error = %e, "gRPC frontend caller lost");
                        return;
                    }
                    if idle.deadline(limit).is_none_or(|d| now < d) {
                        continue;
                    }
                    if told {
                        tracing::debug!(%peer, "gRPC frontend connection closed: no stream");
                        return;
                    }
                    tracing::debug!(%peer, "gRPC frontend connection idle for {idle_for:?}: GOAWAY");
                    told = true;
                    idle.since.set(now);
                    conn.go_away();
                    continue;
                }
            };
            let (head, recv, mut send) = match next {
                None => return,
                Some(Err(e)) => {
                    if let H2Error::Protocol(h2_server::ConnError {
                        flood: Some(kind), ..
                    }) = &e
                    {
                        shared.metrics.frontend_h2_flood(*kind);
                    }
                    tracing::info!(%peer, error = %e, "gRPC frontend connection failed");
                    return;
                }
                Some(Ok(Incoming::Started)) => {
                    up = true;
                    keepalive = PingSchedule::new(shared.cfg.frontend_keepalive, Instant::now());
                    continue;
                }
                Some(Ok(Incoming::Pong)) => {
                    keepalive.on_pong(Instant::now());
                    continue;
                }
                Some(Ok(Incoming::GoAway)) => {
                    // The caller opens no new stream: close once idle.
                    told = true;
                    continue;
                }
                Some(Ok(Incoming::Request {
                    head, recv, send, ..
                })) => (head, recv, send),
            };
            let is_grpc = head
                .content_type
                .as_deref()
                .is_some_and(grpc::is_grpc_content_type);
            if head.path != PROXY_PATH || !is_grpc {
                let msg = format!("unknown method {}", head.path);
                StreamSender::refuse(&mut send, code::UNIMPLEMENTED, &msg);
                continue;
            }
            let Ok(mut tx) = StreamSender::start(send) else {
                continue;
            };
            let shared = shared.clone();
            let open = idle.open();
            monoio::spawn(async move {
                let _open = open;
                let _stream = shared.metrics.proxy_stream();
                match proxy_stream(&shared, recv, &mut tx).await {
                    Ok(()) => {
                        let _ = tx.finish_with_status(code::OK, "");
                    }
                    // A caller that cancels its stream or closes its
                    // connection ends normally (konnectivity-client does
                    // so when its tunnel closes).
                    Err(e) if caller_left(&*e) => {
                        tracing::debug!(error = %e, "proxy stream ended by the caller");
                        let _ = tx.finish_with_status(code::INVALID_ARGUMENT, &e.to_string());
                    }
                    Err(e) => {
                        tracing::info!(error = %e, "proxy stream failed");
                        let _ = tx.finish_with_status(code::INVALID_ARGUMENT, &e.to_string());
                    }
                }
            });
        }
    }
}

/// Whether a proxy stream ended because its caller left: RST_STREAM with
/// CANCEL (0x8) or NO_ERROR, or the connection closed.
fn caller_left(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        e.downcast_ref::<GrpcError>(),
        Some(
            GrpcError::Recv(RecvError::Reset(0 | 0x8) | RecvError::ConnClosed) | GrpcError::Closed
        )
    )
}

/// An agent one of this stream's dials went to.
struct Route {
    handle: AgentHandle,
    /// This stream's own sender to the agent (a clone per packet would
    /// allocate).
    cmds: RefCell<mpsc::Sender<AgentCmd>>,
    /// The connection's flow-control window (used when the agent negotiated
    /// windows).
    window: Arc<ConnWindow>,
}

type Machine = ProxyStream<Rc<Route>, Credit>;
type Action = StreamAction<Rc<Route>, Credit>;

/// What goes to the client, in order.
enum Out {
    Frame(Frame),
    Data(i64, Credit),
}

/// Packets (not payload, which agent budgets and windows bound) queued
/// toward a client that does not read: past this the stream stops reading
/// the client's requests.
const MAX_QUEUED_FRAMES: usize = 1024;
/// How long answers already queued may take to reach a client whose stream
/// ended cleanly.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Client payload for an agent, waiting for the connection's window or the
/// agent's queue.
struct Parked {
    route: Rc<Route>,
    connect_id: i64,
    payload: Bytes,
    /// Held once the payload had to wait: ANP's `full_receive_channels`
    /// (Proxy).
    full: Option<crate::metrics::GaugeGuard>,
}

impl Parked {
    /// Ready once the payload went to the agent (or the agent is gone).
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let route = &self.route;
        if route.handle.window {
            // Past the window this stream waits for this connection: the
            // client multiplexes on it, the agent's other connections do not.
            ready!(route.window.poll_ready(cx));
        }
        let mut cmds = route.cmds.borrow_mut();
        if ready!(cmds.poll_ready(cx)).is_ok() {
            let payload = std::mem::take(&mut self.payload);
            if route.handle.window {
                route.window.sent(payload.len());
            }
            let _ = cmds.start_send(AgentCmd::Data {
                connect_id: self.connect_id,
                payload,
            });
        }
        Poll::Ready(())
    }
}

/// The queue toward the client, between the stream's two halves (one
/// task: a queue on this thread, not a channel, whose shared state and
/// stub node an idle tunnel would keep).
struct ToClient {
    out: RefCell<VecDeque<Out>>,
    /// No more will be queued: the writer ends once the queue is empty.
    closed: Cell<bool>,
    /// The writer waiting for something to send.
    writer: RefCell<Option<Waker>>,
    /// Packets queued and not yet taken by the writer.
    queued: Cell<usize>,
    /// The reader waiting for the queue to shrink.
    reader: RefCell<Option<Waker>>,
}

impl ToClient {
    fn new() -> Self {
        ToClient {
            out: RefCell::new(VecDeque::new()),
            closed: Cell::new(false),
            writer: RefCell::new(None),
            queued: Cell::new(0),
            reader: RefCell::new(None),
        }
    }

    fn push(&self, o: Out) {
        self.out.borrow_mut().push_back(o);
        if let Some(w) = self.writer.borrow_mut().take() {
            w.wake();
        }
    }

    fn frame(&self, f: Frame) {
        self.queued.set(self.queued.get() + 1);
        self.push(Out::Frame(f));
    }

    fn close(&self) {
        self.closed.set(true);
        if let Some(w) = self.writer.borrow_mut().take() {
            w.wake();
        }
    }

    /// The next thing to send; `None` once closed and empty. An emptied
    /// queue gives its room back (an idle tunnel keeps none).
    fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<Out>> {
        let mut out = self.out.borrow_mut();
        if let Some(o) = out.pop_front() {
            if out.is_empty() {
                *out = VecDeque::new();
            }
            return Poll::Ready(Some(o));
        }
        if self.closed.get() {
            return Poll::Ready(None);
        }
        *self.writer.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }

    fn taken(&self) {
        self.queued.set(self.queued.get().saturating_sub(1));
        if self.queued.get() < MAX_QUEUED_FRAMES {
            if let Some(w) = self.reader.borrow_mut().take() {
                w.wake();
            }
        }
    }

    fn has_room(&self, cx: &mut Context<'_>) -> bool {
        if self.queued.get() < MAX_QUEUED_FRAMES {
            return true;
        }
        *self.reader.borrow_mut() = Some(cx.waker().clone());
        false
    }
}

/// Sends a close or cancel to an agent without making the stream wait.
fn tell_agent(route: &Route, cmd: AgentCmd) {
    if let Err(e) = route.cmds.borrow_mut().try_send(cmd) {
        if e.is_full() {
            let handle = route.handle.clone();
            let cmd = e.into_inner();
            monoio::spawn(async move {
                handle.send(cmd).await;
            });
        }
    }
}

/// Carries out an action that needs no waiting.
fn carry_out(shared: &ServerState, to_client: &ToClient, parked: &mut Option<Parked>, a: Action) {
    match a {
        // Only the stream loop routes dials; the end of a stream makes none.
        StreamAction::Dial { token, .. } => tracing::error!(token, "dial outside the stream loop"),
        StreamAction::ToClient(f) => to_client.frame(f),
        StreamAction::ToClientData {
            connect_id,
            payload,
        } => {
            to_client.push(Out::Data(connect_id, payload));
        }
        StreamAction::ToAgentData {
            agent,
            connect_id,
            payload,
        } => {
            debug_assert!(parked.is_none(), "one client packet at a time");
            *parked = Some(Parked {
                route: agent,
                connect_id,
                payload,
                full: None,
            });
        }
        StreamAction::CloseAtAgent { agent, connect_id } => {
            tell_agent(&agent, AgentCmd::Close { connect_id })
        }
        StreamAction::CancelAtAgent {
            agent,
            agent_random,
        } => tell_agent(
            &agent,
            AgentCmd::CancelDial {
                random: agent_random,
            },
        ),
        StreamAction::DialAbandoned { why, after } => match why {
            Abandoned::NoAgent => shared.metrics.dial_done(DialResult::NoAgent, after),
            Abandoned::ByClient => shared.metrics.dial_done(DialResult::FrontendClose, after),
        },
        StreamAction::Ignored(reason) => tracing::debug!(%reason, "proxy stream: ignored"),
    }
}

/// Routes dial `token` and reports the outcome to the machine.
async fn route_dial(
    shared: &ServerState,
    machine: &mut Machine,
    events: &mpsc::UnboundedSender<(u64, FrontendEvent)>,
    (token, address, agent_random, avoid): (u64, String, i64, Option<Rc<Route>>),
) {
    let window = avoid
        .as_ref()
        .map(|r| r.window.clone())
        .unwrap_or_else(|| ConnWindow::new(window::TUNNEL_WINDOW));
    let sink = FrontendSink {
        tx: events.clone(),
        token,
        window: Some(window.clone()),
    };
    let gone = avoid.map(|r| r.handle.key);
    match dial_agent(shared, &address, agent_random, sink, gone).await {
        Some(handle) => {
            let route = Route {
                cmds: RefCell::new(handle.cmds.clone()),
                handle,
                window,
            };
            machine.dial_sent(token, Rc::new(route), agent_random);
        }
        None => machine.no_agent(token),
    }
}

/// Picks an agent for `address` (not `gone`, whose connection just ended)
/// and sends it the dial; tries again while sends find the agent gone.
async fn dial_agent(
    shared: &ServerState,
    address: &str,
    random: i64,
    reply: FrontendSink,
    mut gone: Option<u64>,
) -> Option<AgentHandle> {
    for _ in 0..ROUTE_ATTEMPTS {
        let agent = match gone {
            Some(key) => shared.repick(address, key).await?,
            None => shared.pick_or_wait(address).await?,
        };
        let cmd = AgentCmd::Dial {
            random,
            address: address.to_string(),
            reply: reply.clone(),
        };
        if agent.send(cmd).await {
            return Some(agent);
        }
        gone = Some(agent.key);
    }
    None
}

fn agent_event(ev: FrontendEvent) -> AgentEvent<Credit> {
    match ev {
        FrontendEvent::DialOk { connect_id } => AgentEvent::DialOk { connect_id },
        FrontendEvent::DialErr(e) => AgentEvent::DialErr(e),
        FrontendEvent::Data(c) => AgentEvent::Data(c),
        FrontendEvent::Finished => AgentEvent::Finished,
        FrontendEvent::Closed(e) => AgentEvent::Closed(e),
        FrontendEvent::AgentGone => AgentEvent::AgentGone,
        FrontendEvent::DialCancelled => AgentEvent::DialCancelled,
    }
}

enum Next {
    Agent(u64, FrontendEvent),
    Client(Result<Option<Frame>, GrpcError>),
    Unparked,
}

/// One Proxy stream: any number of dials, each to its own agent. The
/// client's packets and the agents' events are handled by one task while
/// another writes to the client, so a client that stops reading never
/// keeps its own CLOSE_REQ, its disconnect or anybody's close from being
/// handled.
///
/// Takes the stream's body, not its [`PacketReceiver`]: an argument stays
/// in the task beside the local it is moved to, and the receiver is 88
/// bytes to the body's 16.
async fn proxy_stream(
    shared: &ServerState,
    body: StreamRecv,
    tx: &mut StreamSender,
) -> Result<(), BoxError> {
    let mut rx = PacketReceiver::new(body, shared.cfg.max_message);
    let (ev_tx, mut events) = mpsc::unbounded::<(u64, FrontendEvent)>();
    let mut machine: Machine = ProxyStream::new(fastrand::u64(..));
    let to_client = ToClient::new();
    let mut parked: Option<Parked> = None;

    let handle = async {
        loop {
            while let Some(a) = machine.poll_action() {
                match a {
                    StreamAction::Dial {
                        token,
                        address,
                        agent_random,
                        avoid,
                    } => {
                        let dial = (token, address, agent_random, avoid);
                        // Boxed: a dial's wait (its timer is 640 bytes) is
                        // over before the tunnel idles, and a task's
                        // allocation is its largest state.
                        Box::pin(route_dial(shared, &mut machine, &ev_tx, dial)).await
                    }
                    a => carry_out(shared, &to_client, &mut parked, a),
                }
            }
            let next = futures::future::poll_fn(|cx| {
                if let Poll::Ready(Some((token, ev))) = events.poll_next_unpin(cx) {
                    return Poll::Ready(Next::Agent(token, ev));
                }
                if let Some(p) = &mut parked {
                    if p.poll_send(cx).is_ready() {
                        return Poll::Ready(Next::Unparked);
                    }
                    if p.full.is_none() {
                        p.full = Some(
                            shared
                                .metrics
                                .full_receive_channel(crate::metrics::ServiceMethod::Proxy),
                        );
                    }
                } else if to_client.has_room(cx) {
                    if let Poll::Ready(r) = rx.poll_next(cx) {
                        return Poll::Ready(Next::Client(r));
                    }
                }
                Poll::Pending
            })
            .await;
            match next {
                Next::Agent(token, ev) => machine.on_agent_event(token, agent_event(ev)),
                Next::Unparked => parked = None,
                Next::Client(Ok(Some(frame))) => match frame {
                    Frame::Data(d) if rx.continued() => machine.on_client_data_piece(d),
                    frame => {
                        let kind = metrics::packet_type(&frame);
                        shared.metrics.packet(Segment::FromClient, kind);
                        machine.on_client_frame(frame, Instant::now())
                    }
                },
                Next::Client(Err(e)) => {
                    let code = engine::grpc::recv_error_code(&e);
                    shared
                        .metrics
                        .stream_error(Segment::FromClient, code, "Unknown");
                    return Err(e);
                }
                Next::Client(end) => return end.map(|_| ()),
            }
        }
    };
    let write = async {
        loop {
            let next = futures::future::poll_fn(|cx| {
                if let Poll::Ready(o) = to_client.poll_next(cx) {
                    return Poll::Ready(Ok(o));
                }
                tx.poll_reset(cx).map(|r| match r {
                    Ok(code) => Err(GrpcError::Recv(RecvError::Reset(code))),
                    Err(e) => Err(e),
                })
            })
            .await?;
            match next {
                None => return Ok::<(), GrpcError>(()),
                Some(Out::Frame(f)) => {
                    to_client.taken();
                    let kind = metrics::packet_type(&f);
                    shared.metrics.packet(Segment::ToClient, kind);
                    let t0 = Instant::now();
                    let sent = tx.send_frame(f).await;
                    shared.metrics.frontend_write(t0.elapsed());
                    if let Err(e) = sent {
                        let t = kind.as_str_name();
                        shared
                            .metrics
                            .stream_error(Segment::ToClient, "Unavailable", t);
                        return Err(e);
                    }
                }
                Some(Out::Data(connect_id, credit)) => {
                    shared.metrics.packet(Segment::ToClient, PacketType::Data);
                    let m = packet::encode_data(connect_id, credit.bytes().clone());
                    let t0 = Instant::now();
                    let sent = tx.send(m).await;
                    shared.metrics.frontend_write(t0.elapsed());
                    if let Err(e) = sent {
                        let t = PacketType::Data.as_str_name();
                        shared
                            .metrics
                            .stream_error(Segment::ToClient, "Unavailable", t);
                        return Err(e);
                    }
                }
            }
        }
    };
    let mut write = std::pin::pin!(write);
    let (result, writing) = {
        let handle = std::pin::pin!(handle);
        match futures::future::select(handle, write.as_mut()).await {
            futures::future::Either::Left((r, _)) => (r, true),
            futures::future::Either::Right((w, _)) => {
                tracing::debug!(result = ?w.err(), "proxy client stream broke");
                (Ok(()), false)
            }
        }
    };
    // The stream is over: release everything it held at the agents; queue
    // the last answers for the client.
    machine.finish();
    while let Some(a) = machine.poll_action() {
        carry_out(shared, &to_client, &mut parked, a);
    }
    to_client.close();
    if writing {
        match Box::pin(monoio::time::timeout(FLUSH_TIMEOUT, write)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "proxy client stream broke"),
            Err(_) => tracing::debug!("proxy client did not take its last answers in time"),
        }
    }
    result.map_err(Into::into)
}

#[cfg(test)]
mod task_size_tests {
    use super::*;

    fn future_of<A, B, C, R>(_: fn(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    fn alignment_of<A, B, C, R>(_: fn(A, B, C) -> R) -> usize {
        std::mem::align_of::<R>()
    }

    /// A caller's connection and stream tasks are allocated at their
    /// largest state for as long as they live: the idle timer, a dial's
    /// wait and the last flush are boxed (a monoio timer is 640 bytes and
    /// 128-byte aligned), the keepalive runs on the connection's one timer
    /// ([`PingSchedule`]), and the HTTP/2 state lives behind one `Rc`
    /// ([`H2Conn`]). With h2 the connection's task was 2,032 bytes (h2's
    /// state inline), before that 3,584 and 7,552; the stream's 1,456, and
    /// before that 2,816 (issue 15, memory per idle connection).
    #[test]
    fn an_idle_callers_tasks_stay_small() {
        type Tcp = monoio::net::tcp::stream_poll::TcpStreamPoll;
        let conn = future_of(serve_conn::<Tcp>);
        let stream = future_of(proxy_stream);
        // The task adds monoio's header and trailer (40 bytes) and the
        // connection's span: 448 and 1,280 bytes are allocator size
        // classes.
        assert!(conn <= 360, "serve_conn's future is {conn} bytes");
        // No timer inline: an alignment of 128 would pad the task.
        let align = alignment_of(serve_conn::<Tcp>);
        assert_eq!(align, 8, "serve_conn's future is {align}-byte aligned");
        // 1,184: 1,160 plus the start of a write to the client (ANP's
        // frontend_write_duration_seconds) and a parked payload's
        // full_receive_channels guard; still in the 1,280-byte class.
        assert!(stream <= 1_184, "proxy_stream's future is {stream} bytes");
    }
}
