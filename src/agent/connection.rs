//! One agent-to-server connection: TLS, HTTP/2, the Connect stream, and the
//! relays for the local connections dialed on the server's behalf.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::{mpsc, oneshot};
use futures::{SinkExt, StreamExt};
use monoio::io::{IntoPollIo, Splitable};
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use super::link_window::{Growing, GrowingBody, Wanted};
use super::{BoxError, ServerSlots};
use crate::metrics::agent::{metrics as agent_metrics, Direction, EndpointDialFailure};
use crate::metrics::Segment;
use crate::readiness::Ready;
use engine::budget::{Budget, Credit};
use engine::fd_ref::FdRef;
use engine::grpc::{self, PacketReceiver, PacketSender, SendBuf};
use engine::h2_keepalive::{self, KeepaliveError};
use engine::link_window::TunedRecv;
use engine::listener;
use engine::relay::{self, ChunkReader};
use engine::tls_records;
use engine::tunnel_relay::{self, DownEnd, Incoming, UpEnd};
use engine::window::{self, ConnWindow, LinkPath};
use protocol::anp::agent_dest_policy::{self as dest_policy, Policy};
use protocol::anp::agent_links;
use protocol::anp::agent_tunnel::{AgentAction, AgentTunnel, DialOutcome};
use protocol::anp::packet::{self, Encoded, Frame};
use protocol::spare::ReleaseSpare;
use protocol::{self as proto};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const OUT_QUEUE: usize = 1024;
/// Payload from one server connection that may wait for local targets.
const TARGET_BUDGET: usize = 64 * 1024 * 1024;

/// How a connection ended without an error.
pub(crate) enum Ended {
    /// Served until the server went away.
    Served,
    /// The server was already connected through another slot.
    Duplicate,
    /// We shut down (SIGTERM).
    Shutdown,
    /// A secondary link landed on a server worker already linked: try again.
    WorkerTaken,
    /// The server does not want this secondary link (another server, or
    /// no primary link there).
    NotWanted,
}

#[derive(Clone)]
struct ConnHandle {
    tx: mpsc::UnboundedSender<ConnEvent>,
    /// Flow-control window, when the server negotiated it.
    window: Option<Arc<ConnWindow>>,
}

enum ConnEvent {
    Data(Credit),
    ShutdownWrite,
    Close,
    /// The server connection ended under the tunnel: reset the target.
    Abort,
}

/// One server link's state, shared by its tasks on this core: the tunnel
/// table, the packet senders, the policy and budgets.
struct LinkState {
    tunnel: RefCell<AgentTunnel<ConnHandle>>,
    ctl: mpsc::UnboundedSender<Frame>,
    out: mpsc::Sender<Encoded>,
    half_close: bool,
    /// How long a half-closed connection may stay idle.
    half_close_linger: Duration,
    window: bool,
    /// The link's round trip and the budget its connections' windows grow
    /// from.
    path: Arc<LinkPath>,
    /// The link's TCP socket (owned by the HTTP/2 connection, which
    /// outlives every task that reads this).
    link_fd: FdRef,
    dial_timeout: Duration,
    policy: Policy,
    /// Dials in progress by connectID: sending (or dropping) aborts one.
    cancels: RefCell<HashMap<i64, oneshot::Sender<()>>>,
    /// Payload queued toward local connections and not yet written.
    budget: Arc<Budget>,
    /// Set when the server said it drains.
    server_draining: Cell<bool>,
    /// Wakes the connection's task when the server drains.
    drain_notice: mpsc::UnboundedSender<()>,
}

impl LinkState {
    /// Takes a dial's abort handle out of the table (the dial ended or is
    /// to be aborted), giving back the room a burst of dials grew.
    fn forget_cancel(&self, connect_id: i64) -> Option<oneshot::Sender<()>> {
        let mut cancels = self.cancels.borrow_mut();
        let cancel = cancels.remove(&connect_id);
        cancels.release_spare();
        cancel
    }
}

/// Runs one connection to `slots.addr`: a primary one (a slot), or with
/// `secondary_of` a secondary link for that server ID (see [`super::links`]).
pub(crate) async fn run(
    slots: Rc<ServerSlots>,
    slot: &super::Slot,
    secondary_of: Option<&str>,
) -> Result<Ended, BoxError> {
    let cfg = &slots.cfg;
    let addr = slots.addr.clone();
    let setup = async {
        let host = cfg
            .server_name
            .clone()
            .unwrap_or_else(|| protocol::anp::routing::dest_host(&addr).to_string());
        let name = ServerName::try_from(host)?;
        let (tls, link_tls, link_fd) = link_tls(&addr, name, &slots.tls).await?;
        agent_metrics().link_tls(link_tls);
        let (client, conn) = grpc::h2_client(grpc::stream_window_for(
            cfg.max_message,
            grpc::STREAM_WINDOW,
        ))
        .handshake::<_, SendBuf>(tls)
        .await?;
        Ok::<_, BoxError>((client, conn, link_tls, link_fd))
    };
    let (client, mut conn, link_tls, link_fd) = monoio::time::timeout(CONNECT_TIMEOUT, setup)
        .await
        .map_err(|_| "connect/handshake timed out")??;
    let ping = conn.ping_pong();
    let mut metadata = vec![
        (proto::AGENT_ID_HEADER, cfg.agent_id.clone()),
        (proto::AGENT_IDENTIFIERS_HEADER, cfg.identifiers.encode()),
    ];
    let offered: Vec<&str> = [
        (cfg.half_close, proto::FEATURE_HALF_CLOSE),
        (cfg.window, proto::FEATURE_WINDOW),
        (cfg.window, proto::FEATURE_WINDOW_GROWTH),
    ]
    .into_iter()
    .filter_map(|(on, f)| on.then_some(f))
    .collect();
    if !offered.is_empty() {
        metadata.push((proto::FEATURES_HEADER, offered.join(",")));
    }
    if cfg.max_links > 1 {
        metadata.push((agent_links::LINK_HEADER, slots.links.instance.clone()));
        if let Some(of) = secondary_of {
            metadata.push((agent_links::LINK_OF_HEADER, of.to_string()));
        }
    }
    if let Some(path) = &cfg.token_file {
        // Read at every connect: projected ServiceAccount tokens rotate.
        let t = std::fs::read_to_string(path)
            .map_err(|e| format!("reading token {}: {e}", path.display()))?;
        metadata.push(("authorization", format!("Bearer {}", t.trim())));
    }
    let req = grpc::request_head(&addr, proto::AGENT_CONNECT_PATH, &metadata)?;
    let mut client = client.ready().await?;
    let (resp, send) = client.send_request(req, false)?;
    // Biased: a refusal (trailers-only answer) and the server's GOAWAY
    // come in one write, so both branches can be ready at once; the
    // answer must win, or a refused secondary link reads as a failure
    // (five of those give the link up).
    let resp = futures::select_biased! {
        r = futures::FutureExt::fuse(resp) => r?,
        c = futures::FutureExt::fuse(&mut conn) => { c?; return Err("server closed during setup".into()) }
    };
    if resp.status() != 200 {
        return Err(format!("server answered HTTP {}", resp.status()).into());
    }
    if let Some(e) = grpc::status_error(resp.headers()) {
        if secondary_of.is_some() {
            match e {
                grpc::GrpcError::Status {
                    code: grpc::code::ALREADY_EXISTS,
                    ..
                } => return Ok(Ended::WorkerTaken),
                grpc::GrpcError::Status {
                    code: grpc::code::FAILED_PRECONDITION,
                    ..
                } => return Ok(Ended::NotWanted),
                _ => {}
            }
        }
        return Err(e.into());
    }
    let answer = Answer::read(cfg, resp.headers());
    if answer.window && answer.window_growth {
        // The tunnels' windows grow with the path: the link's must not
        // hold them first.
        conn.set_target_window_size(grpc::GROWN_LINK_WINDOW);
        conn.set_initial_window_size(grpc::GROWN_LINK_WINDOW)?;
    }
    let role = match secondary_of {
        None => Role::Primary,
        Some(_) => Role::Secondary,
    };
    let server_id = answer.server_id.clone();
    // A primary connection holds its server ID while it lives: another
    // slot that reaches the same server closes as a duplicate.
    let _registered = match role {
        Role::Primary
            if !server_id.is_empty() && !slots.connected.borrow_mut().insert(server_id.clone()) =>
        {
            tracing::debug!(server = %addr, %server_id, "already connected to this server; closing duplicate");
            return Ok(Ended::Duplicate);
        }
        Role::Primary => Some(Registered(&slots, server_id.clone(), Cell::new(true))),
        Role::Secondary => None,
    };
    match role {
        Role::Primary => {
            slots.want_slots(answer.server_count);
            let instance = &slots.links.instance;
            let (server_count, half_close, window, link) = (
                answer.server_count,
                answer.half_close,
                answer.window,
                answer.link,
            );
            let (record_layer, tls) = (link_tls.record_layer(), link_tls.version());
            tracing::info!(server = %addr, %server_id, server_count, half_close, window, ?link, %instance, record_layer, tls, "connected to server");
            cfg.announce.send(Ready::Connected {
                server: addr.to_string(),
                server_id: server_id.clone(),
            });
        }
        Role::Secondary => {
            let worker = answer.link.map(|(_, w)| w);
            tracing::debug!(server = %addr, %server_id, ?worker, record_layer = link_tls.record_layer(), "secondary link up");
            cfg.announce.send(Ready::Linked {
                server: addr.to_string(),
                server_id: server_id.clone(),
                worker,
            });
        }
    }
    slot.mark_established();
    let _up = (role == Role::Primary).then(|| agent_metrics().server_connection());
    if let (Role::Primary, Some((workers, _))) = (role, answer.link) {
        let wanted = agent_links::secondaries_wanted(workers, cfg.max_links);
        slots.links.ensure(&addr, &server_id, wanted);
    }
    serve(
        &slots,
        slot,
        resp.into_body(),
        send,
        conn,
        ping,
        &answer,
        role,
        link_fd,
        _registered.as_ref(),
    )
    .await
}

/// What the server answered a Connect with (response metadata).
struct Answer {
    server_id: String,
    server_count: usize,
    /// Both sides speak the half-close extension.
    half_close: bool,
    /// Both sides speak the per-connection window extension.
    window: bool,
    /// Both ends grow per-connection windows with the path.
    window_growth: bool,
    /// The server's worker count and the worker this link landed on.
    link: Option<(usize, usize)>,
}

impl Answer {
    fn read(cfg: &super::AgentConfig, headers: &http::HeaderMap) -> Self {
        let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
        let features = header(proto::FEATURES_HEADER);
        Answer {
            server_id: header(proto::SERVER_ID_HEADER)
                .unwrap_or_default()
                .to_string(),
            server_count: header(proto::SERVER_COUNT_HEADER)
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
            half_close: cfg.half_close && proto::has_feature(features, proto::FEATURE_HALF_CLOSE),
            window: cfg.window && proto::has_feature(features, proto::FEATURE_WINDOW),
            window_growth: cfg.window
                && proto::has_feature(features, proto::FEATURE_WINDOW)
                && proto::has_feature(features, proto::FEATURE_WINDOW_GROWTH),
            link: agent_links::parse_answer(
                header(agent_links::WORKERS_HEADER),
                header(agent_links::WORKER_HEADER),
            ),
        }
    }
}

/// The server ID a primary connection holds in [`ServerSlots::connected`].
struct Registered<'a>(&'a ServerSlots, String, Cell<bool>);

impl Registered<'_> {
    /// Gives the server ID up before the link ends: the server drains,
    /// and its successor (the same ID after a listener handover) must not
    /// be closed as a duplicate.
    fn release(&self) {
        if self.2.replace(false) {
            self.0.connected.borrow_mut().remove(&self.1);
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Connects to `addr` and runs TLS: our record layer unless it is
/// switched off or the server chose TLS 1.2 (then rustls, from then on);
/// the stream and what it came to.
async fn link_tls(
    addr: &str,
    name: ServerName<'static>,
    config: &Arc<rustls::ClientConfig>,
) -> Result<(LinkIo, tls_records::LinkTls, FdRef), BoxError> {
    // The TCP socket's number, kept to read its round trip from the
    // kernel while the link (which owns the socket) lives.
    let fd = std::cell::Cell::new(None);
    let tcp = || async {
        let tcp = monoio::net::TcpStream::connect(addr).await?;
        listener::nodelay(&tcp);
        fd.set(Some(FdRef::of(&tcp)));
        tcp.into_poll_io()
    };
    if tls_records::Mode::from_env() == tls_records::Mode::Own && !tls_records::server_chose_tls12()
    {
        let config = tls_records::client_config(config);
        match tls_records::connect(tcp().await?, name.clone(), config).await {
            Ok(done) => {
                return Ok((
                    tls_records::Link::Own(done.stream),
                    tls_records::LinkTls::Own,
                    fd.get().expect("connected"),
                ))
            }
            Err(e) if e.get_ref().is_some_and(|i| i.is::<tls_records::NotTls13>()) => {
                tracing::info!(
                    server = addr,
                    "the server chose TLS 1.2: connecting again with rustls' record layer"
                );
                tls_records::note_server_chose_tls12();
            }
            Err(e) => return Err(e.into()),
        }
    }
    let tls = TlsConnector::from(config.clone())
        .connect(name, engine::read_ahead::ReadAhead::new(tcp().await?))
        .await?;
    let link_tls = tls_records::LinkTls::rustls(tls.get_ref().1.protocol_version());
    Ok((
        tls_records::Link::Rustls(tls),
        link_tls,
        fd.get().expect("connected"),
    ))
}

/// The link's TLS stream.
type LinkIo = tls_records::Link<
    tokio_rustls::client::TlsStream<
        engine::read_ahead::ReadAhead<monoio::net::tcp::stream_poll::TcpStreamPoll>,
    >,
    tls_records::RecordStream<monoio::net::tcp::stream_poll::TcpStreamPoll>,
>;

/// Which connection [`serve`] runs.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    Primary,
    Secondary,
}

type Conn = h2::client::Connection<LinkIo, SendBuf>;

/// Serves an established connection until it ends.
#[allow(clippy::too_many_arguments)]
async fn serve(
    slots: &Rc<ServerSlots>,
    slot: &super::Slot,
    body: h2::RecvStream,
    send: h2::SendStream<SendBuf>,
    mut conn: Conn,
    ping: Option<h2::PingPong>,
    answer: &Answer,
    role: Role,
    link_fd: FdRef,
    registered: Option<&Registered<'_>>,
) -> Result<Ended, BoxError> {
    let cfg = &slots.cfg;
    let addr = slots.addr.clone();
    let server_id = &answer.server_id;
    let (half_close, window) = (answer.half_close, answer.window);

    let (ctl_tx, ctl_rx) = mpsc::unbounded();
    let (out_tx, out_rx) = mpsc::channel(OUT_QUEUE);
    let (drain_tx, mut drain_rx) = mpsc::unbounded();
    let shared = Rc::new(LinkState {
        tunnel: RefCell::new(AgentTunnel::default()),
        ctl: ctl_tx.clone(),
        out: out_tx,
        half_close,
        half_close_linger: cfg.half_close_linger,
        window,
        path: LinkPath::new(ctl_tx, window && answer.window_growth),
        link_fd,
        dial_timeout: cfg.dial_timeout,
        policy: cfg.policy.clone(),
        cancels: RefCell::new(HashMap::new()),
        budget: Budget::new(TARGET_BUDGET),
        server_draining: Cell::new(false),
        drain_notice: drain_tx,
    });
    // Without tunnel windows that grow, the link's own windows are sized
    // to the path (link_window).
    let stream_window = grpc::stream_window_for(cfg.max_message, grpc::STREAM_WINDOW);
    let wanted = Wanted::new(stream_window);
    let body = GrowingBody {
        body,
        wanted: wanted.clone(),
    };
    let body = if window && answer.window_growth {
        TunedRecv::fixed(body)
    } else {
        TunedRecv::tuned(body, stream_window, shared.path.clone())
    };
    let reader = read_loop(shared.clone(), PacketReceiver::new(body, cfg.max_message));
    let mut driven = Growing {
        conn: &mut conn,
        wanted,
        applied: stream_window,
    };
    let mut sender = PacketSender::new(send);
    let writer = write_loop(&mut sender, ctl_rx, out_rx);
    let keepalive = async {
        let e = h2_keepalive::keep_alive(ping, cfg.keepalive).await;
        if let KeepaliveError::Timeout(_) = e {
            agent_metrics().keepalive_timeout();
        }
        Err::<(), BoxError>(e.into())
    };
    let drain = async {
        slots.shutdown.wait(1).await;
        if role == Role::Primary {
            tracing::info!(server = %addr, "draining: no new dials will be accepted by the server");
        }
        let _ = shared.ctl.unbounded_send(Frame::Drain);
        let sent = monoio::time::Instant::now();
        let deadline = sent + cfg.drain_grace;
        // A dial the server sent before it read the DRAIN arrives up to a
        // round trip after it: the link ends only once that much time
        // passed with no tunnel and no dial in progress (else such a dial
        // would find the link gone and its caller reset).
        let quiet = drain_quiet(shared.path.rtt());
        loop {
            let idle = shared.tunnel.borrow().open_connections() == 0
                && shared.cancels.borrow().is_empty();
            if idle && sent.elapsed() >= quiet {
                break;
            }
            if monoio::time::Instant::now() >= deadline || slots.shutdown.requested() >= 2 {
                break;
            }
            monoio::time::sleep(Duration::from_millis(50)).await;
        }
        // Give the writer a moment to flush the DRAIN and last packets.
        monoio::time::sleep(Duration::from_millis(50)).await;
    };
    // The server drains: another connection (through the same address,
    // usually to another server) takes new dials at once; this one stays
    // for the tunnels it carries until the server closes it.
    let server_drains = async {
        if drain_rx.next().await.is_some() {
            agent_metrics().server_drain();
            if role == Role::Primary {
                tracing::info!(server = %addr, %server_id, "server is draining: connecting again for new dials");
                if let Some(r) = registered {
                    r.release();
                }
                slots.replace(slot);
            } else {
                // Not reconnected: the primary link's replacement asks
                // the next server for links.
                slot.replaced.set(true);
            }
        }
        futures::future::pending::<()>().await
    };
    let outcome: Result<Ended, BoxError> = monoio::select! {
        _ = server_drains => unreachable!("pending forever"),
        r = &mut driven => r.map(|_| Ended::Served).map_err(Into::into),
        r = reader => r.map(|_| Ended::Served),
        r = writer => r.map(|_| Ended::Served),
        r = keepalive => r.map(|_| Ended::Served),
        _ = drain => Ok(Ended::Shutdown),
    };
    if let Ok(Ended::Shutdown) = outcome {
        let _ = sender.finish();
        // Let h2 send the end of stream before the connection drops.
        let _ = monoio::time::timeout(Duration::from_millis(200), &mut driven).await;
    }
    // Dropping the senders aborts the dials still in progress.
    shared.cancels.borrow_mut().clear();
    let orphans = shared.tunnel.borrow_mut().drain_all();
    for c in orphans {
        let _ = c.tx.unbounded_send(ConnEvent::Abort);
    }
    // One line per server at INFO; each further link's end at DEBUG.
    if role == Role::Primary {
        tracing::info!(server = %addr, "disconnected from server");
    } else {
        tracing::debug!(server = %addr, "secondary link ended");
    }
    outcome
}

async fn write_loop(
    tx: &mut PacketSender,
    mut ctl: mpsc::UnboundedReceiver<Frame>,
    mut out: mpsc::Receiver<Encoded>,
) -> Result<(), BoxError> {
    loop {
        let msg = futures::select_biased! {
            f = ctl.next() => f.map(packet::encode),
            m = out.next() => m,
        };
        let Some(msg) = msg else { return Ok(()) };
        let kind = crate::metrics::encoded_packet_type(&msg.head);
        agent_metrics().packet(Segment::FromAgent, kind);
        if let Err(e) = tx.send(msg).await {
            let t = kind.as_str_name();
            agent_metrics().server_failure(Direction::ToServer, "Unavailable", t);
            return Err(e.into());
        }
    }
}

async fn read_loop(
    shared: Rc<LinkState>,
    mut rx: PacketReceiver<TunedRecv<GrowingBody>>,
) -> Result<(), BoxError> {
    loop {
        let frame = match rx.next().await {
            Ok(Some(f)) => {
                shared
                    .path
                    .sample(&shared.link_fd, window::RTT_SAMPLE_EVERY);
                f
            }
            Ok(None) => return Ok(()),
            Err(e) => {
                agent_metrics().server_failure(Direction::FromServer, "Unknown", "Unknown");
                return Err(e.into());
            }
        };
        let action = match frame {
            Frame::Data(d) if rx.continued() => shared.tunnel.borrow_mut().on_server_data_piece(d),
            frame => {
                agent_metrics().packet(Segment::ToAgent, crate::metrics::packet_type(&frame));
                shared.tunnel.borrow_mut().on_server_frame(frame)
            }
        };
        match action {
            AgentAction::Dial {
                random,
                connect_id,
                protocol,
                address,
            } => {
                // Registered before the task runs: a DIAL_CLS right behind
                // the DIAL_REQ still finds it.
                let (cancel_tx, cancel_rx) = oneshot::channel();
                shared.cancels.borrow_mut().insert(connect_id, cancel_tx);
                let d = Dial {
                    random,
                    connect_id,
                    protocol,
                    address,
                    cancelled: cancel_rx,
                };
                monoio::spawn(dial(shared.clone(), d));
            }
            AgentAction::Write { conn, payload } => {
                let credit = shared
                    .budget
                    .charge_for(payload, conn.window.as_ref())
                    .await;
                let _ = conn.tx.unbounded_send(ConnEvent::Data(credit));
            }
            AgentAction::Window { conn, bytes } => {
                if let Some(w) = &conn.window {
                    w.granted(bytes);
                }
            }
            AgentAction::ShutdownWrite { conn } => {
                let _ = conn.tx.unbounded_send(ConnEvent::ShutdownWrite);
            }
            AgentAction::Close { conn, reply } => {
                let _ = conn.tx.unbounded_send(ConnEvent::Close);
                let _ = shared.ctl.unbounded_send(reply);
            }
            AgentAction::Reply(f) => {
                let _ = shared.ctl.unbounded_send(f);
            }
            AgentAction::CancelDial { connect_id } => {
                tracing::debug!(connect_id, "dial cancelled by server");
                if let Some(cancel) = shared.forget_cancel(connect_id) {
                    let _ = cancel.send(());
                }
            }
            AgentAction::ServerDraining => {
                if !shared.server_draining.replace(true) {
                    let _ = shared.drain_notice.unbounded_send(());
                }
            }
            AgentAction::Ignored(reason) => tracing::debug!(%reason, "server packet ignored"),
        }
    }
}

/// How long a draining link stays after its DRAIN, at least: two round
/// trips (100 ms while none was measured), within [20 ms, 2 s].
fn drain_quiet(rtt: Option<Duration>) -> Duration {
    (rtt.unwrap_or(Duration::from_millis(50)) * 2)
        .clamp(Duration::from_millis(20), Duration::from_secs(2))
}

/// Why a dial produced no connection.
enum DialError {
    /// The destination policy refused every address (no socket opened).
    Refused(String),
    Io(std::io::Error),
}

/// Resolves `address`, keeps the addresses the policy allows and connects
/// to the first of them that answers. The check applies to the resolved
/// addresses, the ones actually dialed, so a name cannot smuggle in a
/// refused address.
async fn connect(policy: &Policy, address: &str) -> Result<monoio::net::TcpStream, DialError> {
    let resolved: Vec<SocketAddr> = match address.parse::<SocketAddr>() {
        Ok(a) => vec![a],
        // A name: resolved here (blocking getaddrinfo, as monoio's own
        // connect does).
        Err(_) => address.to_socket_addrs().map_err(DialError::Io)?.collect(),
    };
    let mut refused = None;
    let allowed: Vec<SocketAddr> = resolved
        .iter()
        .copied()
        .filter(|a| match policy.check(*a) {
            Ok(()) => true,
            Err(why) => {
                tracing::debug!(%address, resolved = %a, %why, "address refused by policy");
                refused.get_or_insert((*a, why));
                false
            }
        })
        .collect();
    if allowed.is_empty() {
        return Err(match refused {
            Some((a, why)) => DialError::Refused(dest_policy::refusal_message(address, a, &why)),
            None => DialError::Io(std::io::Error::other("no addresses")),
        });
    }
    let mut last = None;
    for a in allowed {
        match monoio::net::TcpStream::connect_addr(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(DialError::Io(
        last.unwrap_or_else(|| std::io::Error::other("no addresses")),
    ))
}

/// One DIAL_REQ to carry out.
struct Dial {
    random: i64,
    connect_id: i64,
    protocol: String,
    address: String,
    /// Fires (or is dropped) when the server no longer wants the dial.
    cancelled: oneshot::Receiver<()>,
}

async fn dial(shared: Rc<LinkState>, d: Dial) {
    // The relay is a task of its own: a task's allocation is its largest
    // state for as long as it lives, and this one's (the connect, the
    // answer) ends here, so an idle connection keeps only the relay's.
    if let Some(opened) = open(&shared, d).await {
        monoio::spawn(relay_conn(shared, opened));
    }
}

/// A dialed target, answered to the server: what the relay needs.
struct Opened {
    connect_id: i64,
    /// The target socket, split in `rd` and `wr`.
    fd: engine::fd_ref::FdRef,
    rd: monoio::io::OwnedReadHalf<monoio::net::TcpStream>,
    wr: monoio::io::OwnedWriteHalf<monoio::net::TcpStream>,
    events: mpsc::UnboundedReceiver<ConnEvent>,
    window: Option<Arc<ConnWindow>>,
    /// Counts the open connection (ANP's `open_endpoint_connections`).
    _open: crate::metrics::GaugeGuard,
}

/// Dials the target and answers the server; `None` when the dial failed
/// or was cancelled (the server was told, where it still listens).
async fn open(shared: &Rc<LinkState>, d: Dial) -> Option<Opened> {
    let Dial {
        random,
        connect_id,
        protocol,
        address,
        cancelled,
    } = d;
    if protocol != "tcp" {
        shared.forget_cancel(connect_id);
        let msg = format!("protocol {protocol:?} not supported");
        if let Some(f) = shared.tunnel.borrow_mut().dial_failed(random, &msg) {
            let _ = shared.ctl.unbounded_send(f);
        }
        return None;
    }
    tracing::debug!(%address, connect_id, "dialing");
    let started = std::time::Instant::now();
    let attempt = {
        let _pending = agent_metrics().dial_pending();
        let connecting =
            monoio::time::timeout(shared.dial_timeout, connect(&shared.policy, &address));
        // DIAL_CLS (or the server connection ending) aborts the connect at
        // once: dropping it closes the socket.
        let attempt = async {
            monoio::select! {
                r = connecting => Some(r),
                _ = cancelled => None,
            }
        };
        attempt.await
    };
    shared.forget_cancel(connect_id);
    let fail = |msg: &str| {
        if let Some(f) = shared.tunnel.borrow_mut().dial_failed(random, msg) {
            let _ = shared.ctl.unbounded_send(f);
        }
    };
    let stream = match attempt {
        None => {
            agent_metrics().dial_cancelled();
            tracing::debug!(%address, connect_id, "dial aborted");
            return None;
        }
        Some(Ok(Ok(s))) => {
            agent_metrics().dial_succeeded(started.elapsed());
            s
        }
        Some(Ok(Err(DialError::Refused(msg)))) => {
            agent_metrics().dial_failed(EndpointDialFailure::Policy);
            tracing::info!(%address, connect_id, "{msg}");
            fail(&msg);
            return None;
        }
        Some(Ok(Err(DialError::Io(e)))) => {
            let reason = match e.kind() {
                std::io::ErrorKind::TimedOut => EndpointDialFailure::Timeout,
                _ => EndpointDialFailure::Unknown,
            };
            agent_metrics().dial_failed(reason);
            tracing::info!(%address, error = %e, "dial failed");
            fail(&format!("dial tcp {address}: {e}"));
            return None;
        }
        Some(Err(_)) => {
            agent_metrics().dial_failed(EndpointDialFailure::Timeout);
            fail(&format!("dial tcp {address}: i/o timeout"));
            return None;
        }
    };
    listener::nodelay(&stream);
    let (tx, rx) = mpsc::unbounded();
    let window = shared.window.then(|| {
        let w = ConnWindow::new(window::TUNNEL_WINDOW);
        w.bind(connect_id, shared.path.clone());
        w
    });
    let handle = ConnHandle {
        tx,
        window: window.clone(),
    };
    let outcome = shared
        .tunnel
        .borrow_mut()
        .dial_succeeded(random, connect_id, handle);
    match outcome {
        DialOutcome::Cancelled => None,
        DialOutcome::Respond(f) => {
            let _ = shared.ctl.unbounded_send(f);
            let fd = engine::fd_ref::FdRef::of(&stream);
            let (rd, wr) = stream.into_split();
            Some(Opened {
                connect_id,
                fd,
                rd,
                wr,
                events: rx,
                window,
                _open: agent_metrics().endpoint_connection(),
            })
        }
    }
}

/// How a target's relay hears from the server: a CLOSE (or the channel
/// closing) ends it cleanly, the server connection ending aborts it.
fn server_event(ev: ConnEvent) -> Incoming<Aborted> {
    match ev {
        ConnEvent::Data(c) => Incoming::Data(c),
        ConnEvent::ShutdownWrite => Incoming::Finish,
        ConnEvent::Close => Incoming::End(Aborted(false)),
        ConnEvent::Abort => Incoming::End(Aborted(true)),
    }
}

/// Whether the server's end of a target's relay came with the server
/// connection ending (the target is reset) rather than a CLOSE.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Aborted(bool);

/// A target's bytes, as encoded DATA packets on the server link's queue.
struct ToServer {
    out: mpsc::Sender<Encoded>,
    connect_id: i64,
}

impl tunnel_relay::ChunkSink for ToServer {
    fn send(&mut self, chunk: bytes::Bytes) -> impl Future<Output = bool> {
        let m = packet::encode_data(self.connect_id, chunk);
        futures::FutureExt::map(self.out.send(m), |r| r.is_ok())
    }
}

/// What ended a target's relay, as the CLOSE_RSP tells it: the target's
/// read or write error, if one ended it.
fn failure_of_up(end: &UpEnd) -> Option<Box<str>> {
    match end {
        UpEnd::Failed(e) => Some(format!("read from target: {e}").into()),
        _ => None,
    }
}

fn failure_of_down(end: &DownEnd<Aborted>) -> Option<Box<str>> {
    match end {
        DownEnd::Failed(e) => Some(format!("write to target: {e}").into()),
        _ => None,
    }
}

/// Whether the server closed the connection (its CLOSE_RSP is already
/// sent, or it is gone): nothing more to send.
fn server_closed(end: &DownEnd<Aborted>) -> bool {
    matches!(end, DownEnd::Ended(None | Some(Aborted(false))))
}

/// Relays a dialed target until either side ends.
///
/// An async block, not an `async fn`: a task keeps its future's arguments
/// for its whole life, and an `async fn` would keep a second copy of them.
#[allow(clippy::manual_async_fn)] // deliberate: see above
fn relay_conn(shared: Rc<LinkState>, opened: Opened) -> impl Future<Output = ()> {
    // Taken apart out here, so that the block below holds each field once
    // (moved into it) rather than the struct and a copy of its fields.
    let Opened {
        connect_id,
        fd,
        rd,
        mut wr,
        events,
        window,
        _open,
    } = opened;
    async move {
        // An async block captures only the places it names: the gauge is
        // named, so that it lives as long as the connection.
        let _open = &_open;
        // Chunks moved each way, so that a half-closed connection's linger
        // counts idle time only.
        // (One reference to the pair: each reference is 8 bytes of every
        // state of the task.)
        let moved = &(Cell::new(0u32), Cell::new(0u32));
        // (The linger is read where used: a local would widen every state
        // of the task.)
        // The reader and the sink are built in the call: named locals
        // would keep room in every state of the task after moving.
        let up = tunnel_relay::pump_up(
            ChunkReader::new(rd).with_flow_control(window),
            ToServer {
                out: shared.out.clone(),
                connect_id,
            },
            &moved.0,
        );
        // `down` owns the receiver and hands it back, so the server's CLOSE
        // can still be heard after `down` itself has finished (half-close).
        // It only borrows the write half: dropping that sends a FIN, which
        // must not come before a reset.
        let down = tunnel_relay::pump_down(&mut wr, events, server_event, &moved.1);
        futures::pin_mut!(up, down);
        let ended = futures::future::select(up, down).await;
        // Boxed: a connection's end, not its idle state. An abnormal end
        // (server connection gone) resets the target; a target that fails
        // is reported in the CLOSE_RSP's error, so the server can reset its
        // caller.
        Box::pin(async move {
            let mut failure = None;
            let close = match ended {
                futures::future::Either::Left((up_end, down)) => {
                    failure = failure_of_up(&up_end);
                    if matches!(up_end, UpEnd::Eof) && shared.half_close {
                        let eof = packet::encode(packet::half_close(connect_id));
                        let _ = shared.out.clone().send(eof).await;
                        // The server's side gets `linger` (idle) to finish too.
                        match relay::linger(shared.half_close_linger, &moved.1, down).await {
                            Some((end, _)) => {
                                failure = failure_of_down(&end);
                                !server_closed(&end)
                            }
                            None => true,
                        }
                    } else {
                        true
                    }
                }
                futures::future::Either::Right(((end, mut events), up)) => match end {
                    DownEnd::Ended(Some(Aborted(true))) => {
                        tracing::debug!(connect_id, "server connection gone: resetting the target");
                        engine::abort::reset(&fd);
                        false
                    }
                    DownEnd::Ended(_) => false,
                    DownEnd::Finished => {
                        // The target may still be sending; the server may
                        // still close.
                        let closed = async move {
                            while let Some(ev) = events.next().await {
                                if let ConnEvent::Close | ConnEvent::Abort = ev {
                                    break;
                                }
                            }
                        };
                        futures::pin_mut!(closed);
                        // The target gets `linger` (idle) to finish too.
                        let rest = futures::future::select(up, closed);
                        match relay::linger(shared.half_close_linger, &moved.0, rest).await {
                            Some(futures::future::Either::Left((up_end, _))) => {
                                failure = failure_of_up(&up_end);
                                true
                            }
                            None => true,
                            Some(futures::future::Either::Right(_)) => false,
                        }
                    }
                    DownEnd::Failed(_) => {
                        failure = failure_of_down(&end);
                        true
                    }
                },
            };
            if close {
                let mut frame = shared.tunnel.borrow_mut().local_closed(connect_id);
                if let (Some(Frame::CloseResponse(c)), Some(e)) = (&mut frame, failure) {
                    c.error = e.into();
                }
                if let Some(f) = frame {
                    // Same queue as the data: the CLOSE_RSP must not overtake it.
                    let _ = shared.out.clone().send(packet::encode(f)).await;
                }
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn future_of<A, B, R>(_: fn(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// A task is allocated at its largest state for as long as it lives.
    /// A dialed connection's relay runs as a task of its own, so an idle
    /// connection keeps the relay's state alone, not the connect's (the
    /// dial task ends when the relay starts); the relay's end (half-close
    /// timers) and its writes are boxed. Before, an idle connection kept
    /// the dial task: 2,816 bytes, 2,000 once its timers were boxed
    /// (issue 15, memory per idle connection).
    #[test]
    fn an_idle_connections_task_stays_small() {
        let relay = future_of(relay_conn);
        // monoio's task header and trailer add 48 bytes, and 640 is an
        // allocator size class (641 bytes would take 768). The write's
        // event is taken apart before its await, so the task keeps no copy
        // of it (it kept two: 712 bytes, 760 with the header). Since the relay's two
        // directions are shared with the server (`engine::tunnel_relay`)
        // and a failure's text lives only in the boxed end, it is 536 bytes.
        assert!(relay <= 592, "the relay's future is {relay} bytes");
    }
}
