//! The HTTP CONNECT frontend (kube-apiserver's EgressSelector, yurt-tunnel's
//! interceptor): read the request head, pick an agent, move the socket to
//! the agent's core, dial, answer `200 Connection Established`, relay.
//!
//! Status codes follow ANP: no agent 500 `currently no tunnels available`,
//! dial timeout 504, agent out of file descriptors 503, other dial errors
//! 502 with the agent's message, a non-CONNECT method 405, a malformed
//! request 400.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use futures::StreamExt;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use tracing::Instrument;

use super::session::{AgentCmd, AgentHandle, FrontendEvent, FrontendSink};
use super::{Handoff, ServerState};
use crate::metrics::DialResult;
use engine::abort;
use engine::accept;
use engine::fd_ref::FdRef;
use engine::relay::{self, ChunkReader, LocalSocket, MovedSocket};
use engine::tunnel_relay::{self, DownEnd, Incoming, UpEnd};
use engine::window::{self, ConnWindow};
use protocol::anp::http_connect;

const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// How a tunneled client socket is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// HTTP CONNECT: `200 Connection Established` after the dial, HTTP
    /// errors otherwise.
    Connect,
    /// An intercepted connection relayed as is: nothing is written before
    /// the target's bytes. On failure, `http_errors` answers an HTTP error
    /// (the client spoke plain HTTP), else the socket just closes.
    Transparent { http_errors: bool },
}

impl Mode {
    fn fail(self) -> bool {
        matches!(
            self,
            Mode::Connect | Mode::Transparent { http_errors: true }
        )
    }
}

pub(super) use protocol::NO_TUNNEL;

/// The TCP listener; with `tls`, callers speak TLS (see [`tls_front`]).
pub(super) async fn accept_tcp(
    core: usize,
    shared: Arc<ServerState>,
    l: monoio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    accept::serve(l, shared.accept_options("connect"), move |c| {
        let shared = shared.clone();
        let tls = tls.clone();
        async move {
            match tls {
                Some(t) => tls_front(core, shared, c.stream, c.peer, t).await,
                None => front(core, shared, c.stream, MovedSocket::from_tcp).await,
            }
        }
    })
    .await
}

/// A TLS caller (ANP's TCP frontend with `--server-cert`): the handshake
/// (and the client certificate check) happens here, on the accepting core;
/// the plaintext then goes through a socket pair whose other end is served
/// as an ordinary CONNECT socket, so that routing, the socket handoff to
/// the agent's core and the tunnel are the same code as for plaintext
/// callers. The TLS records stay on this core.
async fn tls_front(
    core: usize,
    shared: Arc<ServerState>,
    sock: monoio::net::TcpStream,
    peer: std::net::SocketAddr,
    tls: tokio_rustls::TlsAcceptor,
) {
    use monoio::io::IntoPollIo;
    let Ok(io) = sock.into_poll_io() else { return };
    let caller = match monoio::time::timeout(HEAD_TIMEOUT, tls.accept(io)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            shared.metrics.frontend_errors.inc();
            tracing::info!(%peer, "CONNECT frontend TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            shared.metrics.frontend_errors.inc();
            tracing::info!(%peer, "CONNECT frontend TLS handshake timed out");
            return;
        }
    };
    let Ok((plain, ours)) = socket_pair() else {
        return;
    };
    // Declared before `ours`: dropped after it.
    let watch = abort::watch(&plain);
    monoio::spawn(front(core, shared, plain, MovedSocket::from_unix));
    let Ok(ours) = ours.into_poll_io() else {
        return;
    };
    if relay_tls(caller, ours, &watch).await {
        tracing::debug!(%peer, "TLS CONNECT caller reset: its tunnel ended abnormally");
    }
}

/// Relays a TLS caller and the socket pair end of its tunnel both ways.
/// When the tunnel end closes, the caller gets close_notify and FIN, or,
/// when the tunnel ended abnormally (`watch`), a reset: returns whether it
/// was reset.
async fn relay_tls<C, P>(caller: C, pair: P, watch: &abort::Watch) -> bool
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + CallerSocket,
    P: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use engine::tls_copy::{self, CopyEnd};
    use tokio::io::AsyncWriteExt;
    let fd = caller.tcp_fd();
    let (mut caller_r, mut caller_w) = tokio::io::split(caller);
    let (mut pair_r, mut pair_w) = tokio::io::split(pair);
    let up = async {
        let _ = tokio::io::copy(&mut caller_r, &mut pair_w).await;
        let _ = pair_w.shutdown().await;
    };
    let down = async {
        // Flushed whenever the tunnel end has nothing more for now: a write
        // may leave its last records in the TLS session (the caller's
        // socket was full), and a target that keeps its connection open
        // after an answer sends nothing that would push them out.
        let mut buf = vec![0u8; 64 * 1024];
        if let CopyEnd::Write(_) = tls_copy::copy(&mut pair_r, &mut caller_w, &mut buf).await {
            return false;
        }
        if watch.aborted() {
            abort::reset(&fd);
            return true;
        }
        let _ = caller_w.shutdown().await;
        false
    };
    futures::pin_mut!(up, down);
    match futures::future::select(down, up).await {
        futures::future::Either::Left((reset, _)) => reset,
        futures::future::Either::Right(((), down)) => down.await,
    }
}

/// The TCP descriptor under a TLS caller.
trait CallerSocket {
    fn tcp_fd(&self) -> FdRef;
}

impl<T: std::os::fd::AsRawFd> CallerSocket for tokio_rustls::server::TlsStream<T> {
    fn tcp_fd(&self) -> FdRef {
        FdRef::of(self.get_ref().0)
    }
}

/// A connected pair of unix sockets on this core's runtime.
pub(super) fn socket_pair() -> std::io::Result<(monoio::net::UnixStream, monoio::net::UnixStream)> {
    let (a, b) = std::os::unix::net::UnixStream::pair()?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    Ok((
        monoio::net::UnixStream::from_std(a)?,
        monoio::net::UnixStream::from_std(b)?,
    ))
}

/// The forward socket (`--handover-socket`): the successor's dials while
/// this server drains, served like the unix CONNECT frontend's, and never
/// closed by the drain.
pub(super) async fn accept_forwarded(
    core: usize,
    shared: Arc<ServerState>,
    l: monoio::net::UnixListener,
) {
    accept::serve(l, accept::Options::named("forward"), move |c| {
        front_as(core, shared.clone(), c.stream, MovedSocket::from_unix, true)
    })
    .await
}

pub(super) async fn accept_unix(
    core: usize,
    shared: Arc<ServerState>,
    l: monoio::net::UnixListener,
) {
    accept::serve(l, shared.accept_options("connect-uds"), move |c| {
        front(core, shared.clone(), c.stream, MovedSocket::from_unix)
    })
    .await
}

/// Reads the head; answers errors; otherwise runs or hands off the tunnel.
fn front<S>(
    core: usize,
    shared: Arc<ServerState>,
    sock: S,
    moved: fn(S) -> MovedSocket,
) -> impl Future<Output = ()>
where
    S: relay::Duplex,
{
    // Not an `async fn`: a wrapper's task would keep the arguments beside
    // the inner future.
    front_as(core, shared, sock, moved, false)
}

/// [`front`]; `forwarded`: a successor's dial on the forward socket, which
/// this server answers from its own agents at once (no waiting for one,
/// no forwarding on: the successor asks the older servers itself).
async fn front_as<S>(
    core: usize,
    shared: Arc<ServerState>,
    sock: S,
    moved: fn(S) -> MovedSocket,
    forwarded: bool,
) where
    S: relay::Duplex,
{
    let mut reader = ChunkReader::new(sock);
    // Boxed: the head's read lives only until the tunnel starts, and a
    // task's allocation is its largest state (an idle tunnel's is kept small).
    let head = Box::pin(monoio::time::timeout(HEAD_TIMEOUT, read_head(&mut reader))).await;
    let mut sock = reader.into_inner();
    let (address, leftover) = match head {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => return, // closed before a full head: nothing to answer
        Ok(Err(ConnectHeadError::Refused(status, msg))) => {
            shared.metrics.frontend_errors.inc();
            tracing::info!(status, reason = %msg, "CONNECT request refused");
            let _ = sock
                .write_all(http_connect::error_response(status, &msg))
                .await;
            return;
        }
        Ok(Err(ConnectHeadError::Io(e))) => {
            tracing::debug!(error = %e, "CONNECT client read failed");
            return;
        }
        Err(_) => {
            shared.metrics.frontend_errors.inc();
            let _ = sock
                .write_all(http_connect::error_response(
                    408,
                    "request head not received in time\n",
                ))
                .await;
            return;
        }
    };
    let agent = match shared.pick(&address) {
        Some(a) if !forwarded || shared.takes_forwarded() => a,
        // Boxed, in one piece: the rare ways (no agent, a wait after a
        // takeover, a forwarded dial refused) must not widen every
        // tunnel's task.
        picked => {
            match Box::pin(rare_pick(&shared, &mut sock, &address, forwarded, picked)).await {
                Some(a) => a,
                None => return,
            }
        }
    };
    let mut dial = Pending::new(address, leftover, agent, Mode::Connect);
    // A forwarded dial is the successor's caller, not one of ours (see
    // `ServerState::takes_forwarded`).
    dial.http = (!forwarded).then(|| shared.metrics.http_connection());
    run_on_agent_core(core, shared, sock, moved, dial).await;
}

/// The agent for a dial that [`ServerState::pick`] did not settle at once:
/// after a takeover a dial of our own waits for one; a forwarded dial
/// (`picked`: the agent found) is refused once this server, handed over,
/// has no caller of its own left; a dial with no agent is answered so.
/// None when the caller was answered.
async fn rare_pick<S: relay::Duplex>(
    shared: &ServerState,
    sock: &mut S,
    address: &str,
    forwarded: bool,
    picked: Option<AgentHandle>,
) -> Option<AgentHandle> {
    let agent = match (forwarded, picked) {
        (false, _) => shared.pick_or_wait(address).await,
        (true, None) => None,
        (true, Some(_)) => {
            // The agent's link is to end; the successor waits for the
            // agent to link there.
            tracing::debug!(%address, "forwarded dial refused: no caller of our own left");
            refuse(sock, Mode::Connect, shared.cfg.no_agent_status, NO_TUNNEL).await;
            return None;
        }
    };
    if agent.is_none() {
        no_agent(shared, sock, Mode::Connect, address).await;
    }
    agent
}

use protocol::ROUTE_ATTEMPTS;

/// A dial routed to an agent and not yet answered.
pub(crate) struct Pending {
    address: String,
    /// Client bytes read past the CONNECT head.
    leftover: Bytes,
    agent: AgentHandle,
    mode: Mode,
    attempt: u8,
    /// Counts an HTTP CONNECT connection (ANP's `http_connections`) while
    /// the dial and its tunnel last, on whichever core they run.
    http: Option<crate::metrics::GaugeGuard>,
}

impl Pending {
    pub(super) fn new(address: String, leftover: Bytes, agent: AgentHandle, mode: Mode) -> Self {
        Self {
            address,
            leftover,
            agent,
            mode,
            attempt: 0,
            http: None,
        }
    }
}

/// Answers that no agent can take the dial (the status is configurable:
/// ANP's 500 or 503).
async fn no_agent<S: relay::Duplex>(shared: &ServerState, sock: &mut S, mode: Mode, address: &str) {
    shared
        .metrics
        .dial_done(DialResult::NoAgent, Duration::ZERO);
    tracing::info!(%address, "dial refused: no agent available");
    refuse(sock, mode, shared.cfg.no_agent_status, NO_TUNNEL).await;
}

/// Runs the tunnel here when this core owns the dial's agent, else moves
/// the socket (its descriptor) to the agent's core. A dial whose agent
/// connection ends before answering goes to another agent, up to
/// [`ROUTE_ATTEMPTS`] in all.
pub(super) async fn run_on_agent_core<S>(
    core: usize,
    shared: Arc<ServerState>,
    mut sock: S,
    moved: fn(S) -> MovedSocket,
    mut dial: Pending,
) where
    S: relay::Duplex,
{
    loop {
        if dial.agent.core != core {
            hand_off(&shared, moved(sock), dial);
            return;
        }
        let Some((back, mut again)) = tunnel(&shared, sock, dial).await else {
            return;
        };
        sock = back;
        again.attempt += 1;
        tracing::info!(address = %again.address, agent = %again.agent.agent_id, attempt = again.attempt,
            "agent connection ended before answering a dial");
        // Rare paths, boxed so that they do not widen the tunnel's task.
        let next = if again.attempt < ROUTE_ATTEMPTS {
            Box::pin(shared.repick(&again.address, again.agent.key)).await
        } else {
            None
        };
        let Some(agent) = next else {
            Box::pin(no_agent(&shared, &mut sock, again.mode, &again.address)).await;
            return;
        };
        again.agent = agent;
        dial = again;
    }
}

fn hand_off(shared: &ServerState, socket: MovedSocket, dial: Pending) {
    let target = dial.agent.core;
    let inboxes = shared
        .inboxes
        .get()
        .expect("inboxes are set before workers start");
    if let Err(e) = inboxes[target].unbounded_send(Handoff { socket, dial }) {
        // The owning core is gone (shutting down): the socket closes on drop.
        tracing::warn!(core = target, "handoff failed: {e}");
    }
}

/// Runs a handed-off dial on this (the agent's) core.
pub(super) async fn adopt(core: usize, shared: Arc<ServerState>, h: Handoff) {
    match h.socket.adopt() {
        Ok(LocalSocket::Tcp(s)) => {
            run_on_agent_core(core, shared, s, MovedSocket::from_tcp, h.dial).await
        }
        Ok(LocalSocket::Unix(s)) => {
            run_on_agent_core(core, shared, s, MovedSocket::from_unix, h.dial).await
        }
        Err(e) => tracing::warn!(error = %e, "could not adopt a handed-off socket"),
    }
}

/// Why no CONNECT head came: refused with this status and text, or the
/// read failed.
enum ConnectHeadError {
    Refused(u16, String),
    Io(std::io::Error),
}

/// Reads until a complete CONNECT head: (address, bytes after the head).
async fn read_head<R: AsyncReadRent + relay::Readable>(
    r: &mut ChunkReader<R>,
) -> Result<Option<(String, Bytes)>, ConnectHeadError> {
    let mut acc: Vec<u8> = Vec::new();
    loop {
        let Some(chunk) = r.next().await.map_err(ConnectHeadError::Io)? else {
            return Ok(None);
        };
        let (buf, single): (&[u8], bool) = if acc.is_empty() {
            (&chunk, true)
        } else {
            acc.extend_from_slice(&chunk);
            (&acc, false)
        };
        match http_connect::parse(buf) {
            Ok(Some(req)) => {
                let leftover = if single {
                    chunk.slice(req.head_len..)
                } else {
                    Bytes::copy_from_slice(&acc[req.head_len..])
                };
                return Ok(Some((req.address, leftover)));
            }
            Ok(None) => {
                if single {
                    acc.extend_from_slice(&chunk);
                }
            }
            Err(e) => {
                let status = e.status();
                return Err(ConnectHeadError::Refused(status, format!("{e}\n")));
            }
        }
    }
}

/// Writes an HTTP error to the client when the mode answers errors.
async fn refuse<S: relay::Duplex>(sock: &mut S, mode: Mode, status: u16, body: &str) {
    if mode.fail() {
        let _ = sock
            .write_all(http_connect::error_response(status, body))
            .await;
    }
}

/// Dials through the chosen agent, answers the client and starts the relay
/// on a task of its own. Gives the socket and the dial back, untouched,
/// when the agent connection ended before answering.
async fn tunnel<S>(
    shared: &Arc<ServerState>,
    mut sock: S,
    mut dial: Pending,
) -> Option<(S, Pending)>
where
    S: relay::Duplex,
{
    // The dial and the answer run boxed: they are over before the relay
    // starts.
    let (connect_id, window, events) = match Box::pin(dial_agent(shared, &mut sock, &dial)).await {
        Dialed::Ok(id, window, events) => (id, window, events),
        Dialed::Again => return Some((sock, dial)),
        Dialed::Done => return None,
    };
    if !Box::pin(start_tunnel(
        &mut sock,
        &mut dial,
        connect_id,
        window.as_deref(),
    ))
    .await
    {
        return None;
    }
    // A task's allocation is its largest state for as long as it lives:
    // this one's (head read, routing, dial) ends here, and an idle tunnel
    // keeps only the relay's.
    let relay = Relay {
        shared: shared.clone(),
        address: dial.address.into(),
        agent: dial.agent,
        _http: dial.http,
        connect_id,
        window,
        events,
    };
    let fd = FdRef::of(&sock);
    let (rd, wr) = sock.into_split();
    monoio::spawn(relay.run(fd, rd, wr).in_current_span());
    None
}

/// Answers the client (`200 Connection Established` for CONNECT) and
/// passes on the bytes it sent past its head; `false` when the client is
/// gone (the agent is told to close).
async fn start_tunnel<S: relay::Duplex>(
    sock: &mut S,
    dial: &mut Pending,
    connect_id: i64,
    window: Option<&ConnWindow>,
) -> bool {
    tracing::debug!(address = %dial.address, connect_id, agent = %dial.agent.agent_id, "tunnel established");
    if dial.mode == Mode::Connect {
        let (res, _) = sock.write_all(http_connect::ESTABLISHED).await;
        if res.is_err() {
            dial.agent.send(AgentCmd::Close { connect_id }).await;
            return false;
        }
    }
    // Taken, not cloned: the chunk it was read into is not kept.
    let leftover = std::mem::take(&mut dial.leftover);
    if !leftover.is_empty() {
        if let Some(w) = window {
            w.sent(leftover.len());
        }
        dial.agent
            .send(AgentCmd::Data {
                connect_id,
                payload: leftover,
            })
            .await;
    }
    true
}

/// How [`dial_agent`] ended.
enum Dialed {
    /// The agent connected: the connection ID, its window, its events.
    Ok(i64, Option<Arc<ConnWindow>>, Events),
    /// The agent connection ended before answering: route again.
    Again,
    /// The dial failed and the client was answered.
    Done,
}

type Events = mpsc::UnboundedReceiver<(u64, FrontendEvent)>;

/// Sends the dial to the agent and waits for its answer; answers the
/// client when it failed.
async fn dial_agent<S>(shared: &Arc<ServerState>, sock: &mut S, dial: &Pending) -> Dialed
where
    S: relay::Duplex,
{
    let (tx, mut events) = mpsc::unbounded();
    let random = loop {
        let r = fastrand::i64(..);
        if r != 0 {
            break r;
        }
    };
    let started = Instant::now();
    let window = dial
        .agent
        .window
        .then(|| ConnWindow::new(window::TUNNEL_WINDOW));
    let cmd = AgentCmd::Dial {
        random,
        address: dial.address.clone(),
        reply: FrontendSink {
            tx,
            token: 0,
            window: window.clone(),
        },
    };
    if !dial.agent.send(cmd).await {
        return Dialed::Again;
    }
    let timeout = shared.cfg.dial_timeout;
    let first = monoio::time::timeout(timeout, events.next()).await;
    let connect_id = match first {
        // The agent went away before answering: another may serve the dial.
        Ok(Some((_, FrontendEvent::AgentGone))) | Ok(None) => return Dialed::Again,
        Ok(Some((_, FrontendEvent::DialOk { connect_id }))) => connect_id,
        Ok(Some((_, FrontendEvent::DialErr(e)))) | Ok(Some((_, FrontendEvent::Closed(e)))) => {
            let status = http_connect::dial_error_status(&e);
            tracing::info!(address = %dial.address, agent = %dial.agent.agent_id, status, error = %e, "dial failed");
            let body = http_connect::truncate_error_body(&e);
            refuse(sock, dial.mode, status, &body).await;
            return Dialed::Done;
        }
        Ok(Some((_, other))) => {
            tracing::warn!(?other, "unexpected event before the dial answer");
            refuse(sock, dial.mode, 502, "unexpected answer from agent").await;
            return Dialed::Done;
        }
        Err(_) => {
            shared
                .metrics
                .dial_done(DialResult::Timeout, started.elapsed());
            dial.agent.send(AgentCmd::CancelDial { random }).await;
            tracing::info!(address = %dial.address, agent = %dial.agent.agent_id, "dial timed out");
            let body = format!(
                "Backend dial timeout: dial {} timed out after {timeout:?}\r\n",
                dial.address
            );
            refuse(sock, dial.mode, 504, &body).await;
            return Dialed::Done;
        }
    };
    Dialed::Ok(connect_id, window, events)
}

/// An answered tunnel, relayed both ways until either side ends: only what
/// the relay uses (an idle tunnel keeps it for its whole life).
struct Relay {
    shared: Arc<ServerState>,
    /// For the log line at the end (a `Box<str>`: 8 bytes less than a
    /// `String` in every tunnel's task).
    address: Box<str>,
    agent: AgentHandle,
    /// Counts the connection (ANP's `http_connections`) while it lasts.
    _http: Option<crate::metrics::GaugeGuard>,
    connect_id: i64,
    window: Option<Arc<ConnWindow>>,
    events: Events,
}

impl Relay {
    /// Relays the socket `fd`, split in `rd` and `wr`.
    ///
    /// An async block, not an `async fn`, with the fields used in place: a
    /// task keeps its future's arguments for its whole life, and an
    /// `async fn` (or moving fields out) would keep a second copy of them.
    #[allow(clippy::manual_async_fn)] // deliberate: see above
    fn run<R, W>(mut self, fd: FdRef, rd: R, mut wr: W) -> impl Future<Output = ()>
    where
        R: AsyncReadRent + relay::Readable,
        W: AsyncWriteRent,
    {
        async move {
            // The whole `Relay` is moved in, not just the fields used below
            // (an async block captures the places it names): the
            // connection gauge must live as long as the tunnel.
            let this = &mut self;
            let connect_id = this.connect_id;
            let agent = &this.agent;
            // An abnormal end (agent connection or target gone, not a clean
            // close) resets the caller; so does the server stopping under the
            // tunnel.
            let _tracked = abort::track(&fd);
            let aborted = Cell::new(false);
            // Read where used: a local would widen every state of the task.
            let cfg = &this.shared.cfg;
            let events = &mut this.events;
            // Chunks moved each way, so that a half-closed tunnel's linger
            // counts idle time only.
            let (up_moved, down_moved) = (Cell::new(0u32), Cell::new(0u32));
            // The reader and the sink are built in the call: named locals
            // would keep room in every state of the task after moving.
            let up = tunnel_relay::pump_up(
                ChunkReader::new(rd).with_flow_control(this.window.clone()),
                // One sender for the whole stream (a clone per chunk would
                // allocate).
                ToAgent {
                    cmds: agent.cmds.clone(),
                    connect_id,
                },
                &up_moved,
            );
            let down = tunnel_relay::pump_down(&mut wr, events, agent_event, &down_moved);
            futures::pin_mut!(up, down);
            let first = futures::future::select(up, down).await;
            // Boxed: a tunnel's end, not its idle state. `true`: the agent
            // side ended it, nothing more to do.
            let ended = Box::pin(async {
                let linger = cfg.half_close_linger;
                let ends = Ends {
                    agent,
                    connect_id,
                    aborted: &aborted,
                    linger,
                };
                match first {
                    futures::future::Either::Left((up_end, down)) => {
                        let rest = async {
                            let (end, events) = down.await;
                            ends.agent_side(end, events, &up_moved).await
                        };
                        ends.client_done(up_end, rest, &down_moved).await
                    }
                    futures::future::Either::Right(((DownEnd::Finished, events), up)) => {
                        // The target is done; the client gets `linger` to
                        // finish too, then the tunnel closes. It may still
                        // finish first.
                        let finish = finish_client(events, linger, &up_moved);
                        futures::pin_mut!(finish);
                        match futures::future::select(up, finish).await {
                            futures::future::Either::Left((up_end, finish)) => {
                                ends.client_done(up_end, finish, &down_moved).await
                            }
                            futures::future::Either::Right((agent_closed, _up)) => {
                                ends.agent_done(agent_closed).await
                            }
                        }
                    }
                    futures::future::Either::Right(((end, events), _up)) => {
                        let agent_closed = ends.agent_side(end, events, &up_moved).await;
                        ends.agent_done(agent_closed).await
                    }
                }
            })
            .await;
            if ended {
                return;
            }
            // The span is made here, not held: the task would keep it (40
            // bytes) for the tunnel's whole life.
            let span = tracing::debug_span!("tunnel", address = %this.address, connect_id, agent = %agent.agent_id);
            if aborted.get() {
                tracing::debug!(parent: &span, "tunnel ended abnormally: resetting the caller");
                abort::abort(&fd);
            } else {
                tracing::debug!(parent: &span, "tunnel closed");
            }
        }
    }
}

/// How an agent's event for a tunnel reads to the relay; an end says
/// whether it was abnormal (the agent reports a target that failed with an
/// error; a clean close has none).
fn agent_event((_, ev): (u64, FrontendEvent)) -> Incoming<bool> {
    match ev {
        FrontendEvent::Data(c) => Incoming::Data(c),
        FrontendEvent::Finished => Incoming::Finish,
        FrontendEvent::Closed(e) => Incoming::End(!e.is_empty()),
        FrontendEvent::AgentGone => Incoming::End(true),
        FrontendEvent::DialOk { .. } | FrontendEvent::DialErr(_) | FrontendEvent::DialCancelled => {
            Incoming::Skip
        }
    }
}

/// What a tunnel's end needs (built only once it ends: an idle tunnel's
/// task does not keep it).
struct Ends<'a> {
    agent: &'a AgentHandle,
    connect_id: i64,
    /// Set when the tunnel ended abnormally: the caller is reset.
    aborted: &'a Cell<bool>,
    linger: Duration,
}

impl Ends<'_> {
    /// The client finished sending first (`up_end`); `rest` is what remains
    /// of the agent side (`true`: it ended the tunnel, see
    /// [`Ends::agent_side`]). With half-close the target gets `linger`
    /// (idle) to finish too; then the tunnel closes. `true`: nothing more
    /// to do.
    async fn client_done(
        &self,
        up_end: UpEnd,
        rest: impl Future<Output = bool>,
        down_moved: &Cell<u32>,
    ) -> bool {
        let connect_id = self.connect_id;
        let clean_eof = match up_end {
            UpEnd::Eof => true,
            // The agent connection is gone.
            UpEnd::SinkGone => {
                self.aborted.set(true);
                false
            }
            UpEnd::Failed(_) => false,
        };
        if clean_eof && self.agent.half_close {
            self.agent.send(AgentCmd::HalfClose { connect_id }).await;
            if let Some(true) = relay::linger(self.linger, down_moved, rest).await {
                return true;
            }
        }
        self.agent.send(AgentCmd::Close { connect_id }).await;
        false
    }

    /// The agent side's end, as [`tunnel_relay::pump_down`] gave it:
    /// `true` when the tunnel ends without another CLOSE to send. A target
    /// that finished sending leaves the client `linger` to finish too.
    async fn agent_side(
        &self,
        end: DownEnd<bool>,
        events: &mut Events,
        up_moved: &Cell<u32>,
    ) -> bool {
        match end {
            // The agent reports a target that failed (reset) with an
            // error; a clean close has none. An agent connection gone (or
            // its channel closed) is abnormal too.
            DownEnd::Ended(abnormal) => {
                self.aborted.set(abnormal.unwrap_or(true));
                true
            }
            DownEnd::Failed(_) => false,
            DownEnd::Finished => finish_client(events, self.linger, up_moved).await,
        }
    }

    /// The agent side ended first; the agent is told to close unless it
    /// closed. `false`: the tunnel's end is logged (and the caller reset
    /// when it was abnormal).
    async fn agent_done(&self, agent_closed: bool) -> bool {
        if !agent_closed {
            let connect_id = self.connect_id;
            self.agent.send(AgentCmd::Close { connect_id }).await;
        }
        false
    }
}

/// A tunnel's client bytes, as DATA commands to its agent connection.
struct ToAgent {
    cmds: mpsc::Sender<AgentCmd>,
    connect_id: i64,
}

impl tunnel_relay::ChunkSink for ToAgent {
    fn send(&mut self, payload: Bytes) -> impl Future<Output = bool> {
        let cmd = AgentCmd::Data {
            connect_id: self.connect_id,
            payload,
        };
        futures::FutureExt::map(futures::SinkExt::send(&mut self.cmds, cmd), |r| r.is_ok())
    }
}

/// The target finished sending (the client's write side is shut down):
/// gives the client `linger` (idle) to finish too. `true`: the tunnel ends
/// without another CLOSE to send.
async fn finish_client(events: &mut Events, linger: Duration, up_moved: &Cell<u32>) -> bool {
    let closed = async {
        while let Some((_, ev)) = events.next().await {
            if let FrontendEvent::Closed(_) | FrontendEvent::AgentGone = ev {
                return;
            }
        }
    };
    relay::linger(linger, up_moved, closed).await.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn future_of<A, B, C, D, R>(_: fn(A, B, C, D) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    fn future_of3<A, B, C, R>(_: fn(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    fn instrumented_future_of<A, B, C, D, R>(_: fn(A, B, C, D) -> R) -> usize {
        std::mem::size_of::<tracing::instrument::Instrumented<R>>()
    }

    /// A task is allocated at its largest state for as long as it lives.
    /// A tunnel's relay runs as a task of its own, so an idle tunnel keeps
    /// the relay's state alone: not the head read, routing and dial of
    /// `front`/`adopt`, whose task ends when the relay starts. The relay's
    /// end (half-close timers, 640 bytes each) and its writes are boxed.
    /// Before, an idle tunnel kept `front`'s task (4,608 bytes at first,
    /// 3,464 once its timers were boxed; issue 15, memory per idle
    /// connection).
    #[test]
    fn an_idle_tunnels_task_stays_small() {
        type T = monoio::net::TcpStream;
        type R = monoio::io::OwnedReadHalf<T>;
        type W = monoio::io::OwnedWriteHalf<T>;
        // With its span: the task allocation adds monoio's 40-byte header
        // and trailer, and 768 bytes is an allocator size class (769 takes
        // 896). The write's event is taken apart before its await, so the
        // task keeps no copy of it (it kept two: 848 bytes, 896 with the
        // header). Since the relay's two directions are shared
        // with the agent (`engine::tunnel_relay`) and the end's handling is
        // built only once the tunnel ends, it is 680 bytes.
        let relay = instrumented_future_of(Relay::run::<R, W>);
        assert!(relay <= 728, "the relay's task future is {relay} bytes");
        let front = future_of(front::<T>);
        let adopt = future_of3(adopt);
        assert!(front <= 1_700, "front's future is {front} bytes");
        assert!(adopt <= 1_700, "adopt's future is {adopt} bytes");
    }
}
