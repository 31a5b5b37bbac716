//! One agent's connection: mutual TLS, HTTP/2, the `AgentService/Connect`
//! stream, and the parts that move Packets: the reader (agent ->
//! frontends) and the writer (frontends -> agent), beside the connection's
//! driver (keepalive PINGs, GOAWAY on drain, extra streams refused).
//!
//! HTTP/2 is our own sans-I/O server ([`protocol::h2_server`],
//! driven by [`H2Conn`]), as on the gRPC frontend: it takes any
//! `:authority` and an idle link holds no buffer of its own. Reads go
//! through the thread's buffer ([`SharedReadAhead`] under rustls, the
//! driver's read buffer above it); what only the handshake needs (the TLS
//! handshake, its timer, the wait for the first request) is boxed and
//! gone once the link is up.
//!
//! What the real Go agent sends (ANP v0.36.0 with grpc-go 1.81.1; seen
//! with `--log edgetunnel=trace`, which logs each Connect request head,
//! and read in their source): the client preface and a SETTINGS frame
//! with only non-default values, here none (grpc-go's
//! `internal/transport/http2_client.go`, `newHTTP2Client`: its windows are
//! the 64 KiB defaults, and no connection WINDOW_UPDATE follows); one
//! Connect stream, `POST /AgentService/Connect` (the proto has no package,
//! `proto/agent/agent.proto`), whose `:authority` is
//! `--proxy-server-host` without the port (seen: `127.0.0.1`; grpc-go's
//! `clientconn.go` takes the TLS credentials' ServerName, which ANP's
//! `pkg/util/certificates.go` `GetClientTLSConfig` sets to that host),
//! then `content-type: application/grpc`, `user-agent: grpc-go/1.81.1`,
//! `te: trailers` (http2_client.go, `createHeaderFields`), `agentid` and
//! `agentidentifiers` (`pkg/agent/client.go`, `Connect`) and, with
//! `--service-account-token-path`, `authorization: Bearer ...`
//! (`initializeAuthContext`); BDP PINGs and WINDOW_UPDATEs as it receives
//! DATA (`bdp_estimator.go`); keepalive PINGs every `--keepalive-time`
//! (1 h by default, `PermitWithoutStream`; `cmd/agent/app/server.go`); it
//! answers our PINGs (seen: a link kept with `--keepalive-secs 1`); and at
//! its end a GOAWAY (NO_ERROR, "client transport shutdown") before it
//! closes the socket (http2_client.go, `Close`).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use http::{HeaderMap, HeaderName, HeaderValue};
use monoio::io::IntoPollIo;
use tokio_rustls::TlsAcceptor;

use super::session::{AgentCmd, AgentHandle, FrontendEvent, FrontendSink};
use super::ServerState;
use crate::metrics::{self, DialFailure, DialResult, KeepalivePeer, Segment};
use engine::accept;
use engine::admission::Permit;
use engine::budget::Budget;
use engine::fd_ref::FdRef;
use engine::grpc::{self, code, PacketReceiver, StreamSender};
use engine::h2_conn::{H2Conn, H2Error, Incoming, StreamRecv, StreamSend};
use engine::h2_keepalive::{KeepaliveError, PingSchedule};
use engine::link_window::TunedRecv;
use engine::read_ahead::SharedReadAhead;
use engine::tls_records;
use engine::window::{self, ConnWindow, LinkPath};
use protocol::anp::agent_identifiers::Identifiers;
use protocol::anp::agent_identity::{self, CertNames, IdentityError};
use protocol::anp::agent_links::{self, LinkRequest};
use protocol::anp::packet::{self, Frame};
use protocol::anp::pb::PacketType;
use protocol::anp::server_tunnel::{ServerAction, ServerTunnel};
use protocol::h2_server::{self, RequestHead};
use protocol::spare::ReleaseSpare;
use protocol::{self as proto};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
const COMMAND_QUEUE: usize = 256;
/// Payload from one agent connection that may wait in frontends' queues.
const FRONTEND_BUDGET: usize = 64 * 1024 * 1024;
/// Extra streams an agent may open (each is refused).
const MAX_STREAMS: u32 = 16;
/// How long a refused agent may take to read its answer and close.
const REFUSAL_FLUSH: Duration = Duration::from_secs(5);

/// The link's TLS: our record layer, or rustls (TLS 1.2, or
/// `EDGETUNNEL_TLS_RECORDS=rustls`).
type AgentIo = tls_records::Link<
    tokio_rustls::server::TlsStream<SharedReadAhead<TcpPoll>>,
    tls_records::RecordStream<TcpPoll>,
>;

/// How agent links' TLS is accepted: rustls' acceptor, and the
/// configuration for our record layer unless it is switched off.
#[derive(Clone)]
struct Acceptors {
    rustls: TlsAcceptor,
    own: Option<Arc<rustls::ServerConfig>>,
}
type TcpPoll = monoio::net::tcp::stream_poll::TcpStreamPoll;

/// The HTTP/2 settings of an agent link: the Connect stream carries every
/// tunnel of the agent, so it gets large windows (as with the h2 crate
/// before: a 16 MiB stream window, 32 MiB for the connection, 256 KiB
/// frames), or larger, to hold a whole message of `max_message` bytes;
/// the request's metadata is kept.
fn agent_h2_config(max_message: usize) -> h2_server::Config {
    let stream_window = grpc::stream_window_for(max_message, grpc::STREAM_WINDOW);
    h2_server::Config {
        stream_window,
        conn_window: grpc::H2_CONNECTION_WINDOW.max(stream_window),
        max_frame: grpc::MAX_FRAME,
        max_streams: MAX_STREAMS,
        keep_fields: true,
        ..h2_server::Config::default()
    }
}

pub(super) async fn accept_loop(
    core: usize,
    shared: Arc<ServerState>,
    l: monoio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
) {
    let acceptor = Acceptors {
        own: (tls_records::Mode::from_env() == tls_records::Mode::Own)
            .then(|| tls_records::server_config(&tls)),
        rustls: TlsAcceptor::from(tls),
    };
    let mut opts = shared.accept_options("agent");
    opts.admission = Some(shared.handshakes.clone());
    accept::serve(l, opts, move |c| {
        // Built out here, not in an async block around it: the block would
        // keep the socket and the permit beside the connection's future.
        serve(core, shared.clone(), acceptor.clone(), c.stream, c.permit).map(|r| {
            // Refusals and the ends of registered agents are logged where
            // they happen; what is left failed before the Connect request
            // (TLS, HTTP/2): worth a line, not a warning (probes do it).
            if let Err(e) = r {
                tracing::info!(error = %e, "agent connection failed before its Connect request");
            }
        })
    })
    .await
}

use crate::BoxError;

/// What an agent said about itself in its Connect request.
struct AgentHello {
    agent_id: String,
    ids: Identifiers,
    half_close: bool,
    window: bool,
    /// Per-connection windows grow with the path (`window-growth`).
    window_growth: bool,
    /// The agent's link metadata, when it speaks links.
    link: Option<LinkRequest>,
}

/// A Connect request's path and metadata.
struct ConnectHead {
    path: String,
    headers: HeaderMap,
}

impl ConnectHead {
    /// The metadata as a header map; a field that is not a valid HTTP field
    /// (the h2 crate refused such a request too) refuses the agent.
    fn new(head: RequestHead) -> Result<Self, (u32, String)> {
        let mut headers = HeaderMap::with_capacity(head.fields.len());
        for (name, value) in head.fields {
            let name = HeaderName::from_bytes(name.as_bytes());
            let value = HeaderValue::from_bytes(&value);
            match (name, value) {
                (Ok(n), Ok(v)) => {
                    headers.append(n, v);
                }
                _ => {
                    return Err((
                        code::INVALID_ARGUMENT,
                        "malformed metadata in the Connect request".into(),
                    ))
                }
            }
        }
        Ok(ConnectHead {
            path: head.path,
            headers,
        })
    }
}

/// Compares a presented secret with the expected one in time that does not
/// depend on where they differ (only on the lengths), so that timing does
/// not reveal the `--agent-token-file` token a byte at a time.
fn same_secret(given: &[u8], want: &[u8]) -> bool {
    if given.len() != want.len() {
        return false;
    }
    let diff = given
        .iter()
        .zip(want)
        .fold(0u8, |acc, (a, b)| acc | std::hint::black_box(a ^ b));
    diff == 0
}

/// Checks the Connect request: method, token, agentID, identifiers.
fn validate(shared: &ServerState, head: &ConnectHead) -> Result<AgentHello, (u32, String)> {
    if head.path != proto::AGENT_CONNECT_PATH {
        return Err((code::UNIMPLEMENTED, format!("unknown method {}", head.path)));
    }
    if let Some(token) = &shared.cfg.agent_token {
        let given = head
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let want = format!("Bearer {token}");
        if !given.is_some_and(|g| same_secret(g.as_bytes(), want.as_bytes())) {
            return Err((code::UNAUTHENTICATED, "bad or missing bearer token".into()));
        }
    }
    let agent_id = match grpc::single(&head.headers, proto::AGENT_ID_HEADER) {
        Ok(Some(id)) if !id.is_empty() => id,
        Ok(_) => {
            return Err((
                code::INVALID_ARGUMENT,
                "expected one agentID in metadata".into(),
            ))
        }
        Err(e) => return Err((code::INVALID_ARGUMENT, e)),
    };
    let ids = grpc::single(&head.headers, proto::AGENT_IDENTIFIERS_HEADER)
        .and_then(|v| Identifiers::parse(v.as_deref().unwrap_or("")).map_err(|e| e.to_string()))
        .map_err(|e| (code::INVALID_ARGUMENT, e))?;
    let features = head
        .headers
        .get(proto::FEATURES_HEADER)
        .and_then(|v| v.to_str().ok());
    let one = |name| grpc::single(&head.headers, name).map_err(|e| (code::INVALID_ARGUMENT, e));
    let link = agent_links::parse_request(
        one(agent_links::LINK_HEADER)?.as_deref(),
        one(agent_links::LINK_OF_HEADER)?.as_deref(),
    )
    .map_err(|e| (e.grpc_code(), e.to_string()))?;
    Ok(AgentHello {
        agent_id,
        ids,
        half_close: proto::has_feature(features, proto::FEATURE_HALF_CLOSE),
        window: proto::has_feature(features, proto::FEATURE_WINDOW),
        window_growth: proto::has_feature(features, proto::FEATURE_WINDOW)
            && proto::has_feature(features, proto::FEATURE_WINDOW_GROWTH),
        link,
    })
}

/// An agent ID held by a certificate's key while a connection lives.
struct Claim {
    shared: Arc<ServerState>,
    agent_id: String,
    spki: Vec<u8>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.shared
            .holders
            .lock()
            .expect("holders lock")
            .release(&self.agent_id, &self.spki);
    }
}

/// With `--bind-agent-identity` (the default), the agent's ID and identifiers must be
/// named by its client certificate (see [`agent_identity`]) and the ID not
/// held by another certificate. Token-authenticated agents without a
/// certificate are not bound (a ServiceAccount token names no node).
fn bind_identity(
    shared: &Arc<ServerState>,
    leaf: Option<&[u8]>,
    hello: &AgentHello,
) -> Result<Option<Claim>, (u32, String)> {
    if !shared.cfg.bind_agent_identity {
        return Ok(None);
    }
    let bound = match leaf {
        None if shared.reviewer.is_some() => return Ok(None),
        None => Err(IdentityError::NoCertificate),
        Some(der) => CertNames::from_der(der).and_then(|names| {
            agent_identity::check(&names, &hello.agent_id, &hello.ids)?;
            shared
                .holders
                .lock()
                .expect("holders lock")
                .claim(&hello.agent_id, &names.spki)?;
            Ok(Claim {
                shared: shared.clone(),
                agent_id: hello.agent_id.clone(),
                spki: names.spki,
            })
        }),
    };
    bound.map(Some).map_err(|e| {
        shared.metrics.identity_refused(e.reason());
        (code::PERMISSION_DENIED, format!("{e}; {}", e.hint()))
    })
}

/// How long an agent's token review may take (the control thread sends
/// no review that would wait longer than this for its turn).
const REVIEW_TIMEOUT: Duration = crate::control::token_review::REVIEW_WAIT;

/// With agent authentication on, the Connect request's ServiceAccount token
/// must pass a TokenReview (see [`crate::control::token_review`]).
async fn authenticate(shared: &ServerState, head: &ConnectHead) -> Result<(), (u32, String)> {
    let Some(reviewer) = &shared.reviewer else {
        return Ok(());
    };
    let refused = |e: String| {
        (
            code::UNAUTHENTICATED,
            format!("Failed to validate authentication token, err:{e}"),
        )
    };
    let values: Vec<&str> = head
        .headers
        .get_all("authorization")
        .iter()
        .map(|v| v.to_str().unwrap_or(""))
        .collect();
    let token = crate::control::token_review::bearer_token(&values)
        .map_err(|e| (code::UNAUTHENTICATED, e))?;
    let review = crate::control::token_review::review(reviewer, token);
    match monoio::time::timeout(REVIEW_TIMEOUT, review).await {
        Ok(Ok(user)) => {
            tracing::debug!(%user, "agent authenticated by token");
            Ok(())
        }
        Ok(Err(e)) => Err(refused(e)),
        Err(_) => Err(refused("token review timed out".into())),
    }
}

/// [`authenticate`] while the agent stays: `None` when a newcomer over the
/// handshake caps sheds this connection (a token under review proves
/// nothing yet) or the agent goes away first. Either drops the review's
/// answer channel, so the control thread sends no review that nobody waits
/// for any more, as ANP's review ends with the Connect stream's context
/// (issue 39, finding 7). Requests and frames the agent sends meanwhile are
/// not served.
async fn authenticate_while_connected(
    shared: &ServerState,
    head: &ConnectHead,
    conn: &mut H2Conn<AgentIo>,
    permit: &Option<Permit>,
) -> Option<Result<(), (u32, String)>> {
    let shed = async {
        match permit {
            Some(p) => p.shed().await,
            None => std::future::pending().await,
        }
    };
    let gone = async { while let Some(Ok(_)) = conn.next().await {} };
    monoio::select! {
        r = authenticate(shared, head) => Some(r),
        _ = shed => {
            tracing::debug!("agent shed while its token was reviewed");
            None
        }
        _ = gone => {
            tracing::debug!("agent went away while its token was reviewed");
            None
        }
    }
}

/// What the handshake leaves: the connection, its Connect request and the
/// verified leaf certificate. The connection is boxed: moved out of here
/// into the link's task, its 1.3 KB (mostly rustls' state) would take room
/// twice there.
struct Setup {
    conn: Box<H2Conn<AgentIo>>,
    head: RequestHead,
    recv: StreamRecv,
    send: StreamSend,
    leaf: Option<Vec<u8>>,
    /// Who seals the link's records, and the TLS version.
    link_tls: tls_records::LinkTls,
}

/// TLS, HTTP/2 and the first request, within [`HANDSHAKE_TIMEOUT`] and
/// while the admission permit is not shed; `None` when it was shed.
async fn handshake(
    shared: &ServerState,
    acceptor: Acceptors,
    io: TcpPoll,
    peer: std::net::SocketAddr,
    permit: &Option<Permit>,
) -> Result<Option<Setup>, BoxError> {
    let setup = async {
        let explain = |e: std::io::Error| {
            let files = &shared.cfg.tls;
            engine::tls::explain_agent_handshake(&e, peer, &files.ca, &files.cert)
        };
        // The verified leaf certificate, for --bind-agent-identity.
        let (tls, leaf, link_tls) = match acceptor.own {
            Some(own) => {
                let mut io = io;
                let (tls13, first) = tls_records::sniff_client_hello(&mut io)
                    .await
                    .map_err(explain)?;
                if tls13 {
                    let done = Box::pin(tls_records::accept(io, first, own))
                        .await
                        .map_err(explain)?;
                    let leaf = done
                        .peer_certificates
                        .as_ref()
                        .and_then(|c| c.first())
                        .map(|c| c.as_ref().to_vec());
                    (
                        tls_records::Link::Own(done.stream),
                        leaf,
                        tls_records::LinkTls::Own,
                    )
                } else {
                    let io = SharedReadAhead::with_rest(io, first);
                    rustls_accept(&acceptor.rustls, io).await.map_err(explain)?
                }
            }
            None => rustls_accept(&acceptor.rustls, SharedReadAhead::new(io))
                .await
                .map_err(explain)?,
        };
        shared.metrics.agent_link_tls(link_tls);
        // TLS done with a verified client certificate (a certificate of the
        // CA proved): a newcomer over the handshake caps no longer sheds
        // this one. Without one (token mode asks for none) a finished TLS
        // handshake proves nothing: the connection stays sheddable until
        // its token is reviewed (the permit is dropped then).
        if let (Some(p), Some(_)) = (permit, &leaf) {
            p.advance();
        }
        let mut conn = Box::new(H2Conn::new(tls, agent_h2_config(shared.cfg.max_message)));
        loop {
            match conn.next().await {
                None => return Err("agent closed before its first request".into()),
                Some(Err(e)) => return Err(BoxError::from(e)),
                Some(Ok(Incoming::Request {
                    head, recv, send, ..
                })) => {
                    return Ok(Setup {
                        conn,
                        head,
                        recv,
                        send,
                        leaf,
                        link_tls,
                    })
                }
                // The start, a PONG, the agent's GOAWAY: still waiting.
                Some(Ok(_)) => {}
            }
        }
    };
    // A newcomer over the handshake caps may take this connection's slot
    // while its TLS is unfinished (see `engine::admission`): then it ends.
    let shed = async {
        match permit {
            Some(p) => p.shed().await,
            None => std::future::pending().await,
        }
    };
    let setup = monoio::time::timeout(HANDSHAKE_TIMEOUT, setup);
    monoio::select! {
        r = setup => r.map_err(|_| "agent handshake timed out")?.map(Some),
        _ = shed => {
            // Counted (edgetunnel_agent_handshakes_shed_total); a flood
            // would make a line each.
            tracing::debug!(%peer, "handshake shed: a newer connection took its slot");
            Ok(None)
        }
    }
}

/// The handshake through rustls: the stream, the peer's leaf
/// certificate and the TLS version.
async fn rustls_accept(
    acceptor: &TlsAcceptor,
    io: SharedReadAhead<TcpPoll>,
) -> std::io::Result<(AgentIo, Option<Vec<u8>>, tls_records::LinkTls)> {
    let tls = acceptor.accept(io).await?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec());
    let link_tls = tls_records::LinkTls::rustls(tls.get_ref().1.protocol_version());
    Ok((tls_records::Link::Rustls(tls), leaf, link_tls))
}

/// Logs a Connect request's head at TRACE (tokens left out).
fn trace_head(peer: std::net::SocketAddr, head: &RequestHead) {
    if !tracing::enabled!(tracing::Level::TRACE) {
        return;
    }
    let fields: Vec<String> = head
        .fields
        .iter()
        .map(|(n, v)| match n.as_str() {
            "authorization" => format!("{n}: (left out)"),
            _ => format!("{n}: {}", String::from_utf8_lossy(v)),
        })
        .collect();
    tracing::trace!(
        %peer,
        method = %head.method,
        path = %head.path,
        authority = ?head.authority,
        content_type = ?head.content_type,
        fields = ?fields,
        "agent Connect request"
    );
}

async fn serve(
    core: usize,
    shared: Arc<ServerState>,
    acceptor: Acceptors,
    stream: monoio::net::TcpStream,
    permit: Option<Permit>,
) -> Result<(), BoxError> {
    let peer = stream.peer_addr()?;
    let link_fd = FdRef::of(&stream);
    let io = stream.into_poll_io()?;
    // Boxed: the handshake's state (rustls' handshake, the timer) is gone
    // once the link is up; a task is allocated at its largest state.
    let setup = Box::pin(handshake(&shared, acceptor, io, peer, &permit)).await?;
    let Some(Setup {
        mut conn,
        head,
        recv: mut body,
        send: mut respond,
        leaf,
        link_tls,
    }) = setup
    else {
        return Ok(());
    };
    trace_head(peer, &head);

    let checked = match ConnectHead::new(head) {
        Ok(head) => match validate(&shared, &head) {
            Ok(h) => {
                let review = authenticate_while_connected(&shared, &head, &mut conn, &permit);
                match Box::pin(review).await {
                    Some(r) => r.map(|_| h),
                    None => return Ok(()),
                }
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    let key = shared.next_key();
    let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_QUEUE);
    let checked = checked.and_then(|h| {
        let claim = bind_identity(&shared, leaf.as_deref(), &h)?;
        // Registered under one lock with the check, so two links racing
        // for one worker cannot both win.
        let handle = AgentHandle {
            key,
            core,
            agent_id: h.agent_id.clone().into(),
            half_close: h.half_close,
            window: h.window,
            cmds: cmd_tx.clone(),
        };
        let mut reg = shared.registry.lock().expect("registry lock");
        if let Some(link) = &h.link {
            let linked = reg.linked_cores(&h.agent_id, &link.instance);
            agent_links::admit(link, &shared.cfg.server_id, core, &linked)
                .map_err(|e| (e.grpc_code(), e.to_string()))?;
        }
        let instance = h.link.as_ref().map(|l| l.instance.clone());
        let first = reg.insert_link(
            key,
            h.agent_id.clone(),
            h.ids.clone(),
            handle,
            core,
            instance,
        );
        Ok((h, claim, first, reg.len()))
    });
    drop(cmd_tx);
    drop(leaf);
    // Held until this connection ends: the agent ID stays with this key.
    let (hello, _claim, first, registered) = match checked {
        Ok(h) => {
            // Authenticated: no longer counted against --max-handshakes.
            drop(permit);
            h
        }
        Err((c, m)) => {
            shared.metrics.agent_refused(c);
            if c == code::ALREADY_EXISTS {
                // A secondary link on a worker already linked: the agent
                // tries again; not worth a warning.
                tracing::debug!(%peer, reason = %m, "agent link refused");
            } else {
                tracing::warn!(%peer, code = c, reason = %m, "agent refused");
            }
            StreamSender::refuse(&mut respond, c, &m);
            drop((respond, body));
            // The refusal and a GOAWAY go out; the agent reads its answer
            // and closes (as it did with the h2 crate, which waited for the
            // refused stream to end). Closing first would race its read of
            // the answer: our agent takes a connection closed under a
            // pending Connect as a failure, not as the refusal it retries
            // at once. Boxed: a timer inline would make the whole task
            // 128-byte aligned (and it is 640 bytes).
            conn.go_away();
            let linger = async { while let Some(Ok(_)) = conn.next().await {} };
            let _ = Box::pin(monoio::time::timeout(REFUSAL_FLUSH, linger)).await;
            // Logged above.
            return Ok(());
        }
    };
    let AgentHello {
        agent_id,
        ids,
        half_close,
        window,
        window_growth,
        link,
    } = hello;
    let mut answer = vec![
        (proto::SERVER_ID_HEADER, shared.cfg.server_id.clone()),
        (
            proto::SERVER_COUNT_HEADER,
            shared.cfg.server_count.to_string(),
        ),
        (proto::FEATURES_HEADER, proto::our_features()),
    ];
    if link.is_some() {
        answer.push((
            agent_links::WORKERS_HEADER,
            shared.cfg.workers.max(1).to_string(),
        ));
        answer.push((agent_links::WORKER_HEADER, core.to_string()));
    }
    let sent = StreamSender::start_with(respond, &answer);
    drop(answer);
    let worker_metrics = shared.metrics.worker(core);
    worker_metrics.links.inc();
    if first {
        shared.metrics.agent_connected(registered);
    } else {
        shared.metrics.links_changed(registered);
    }

    let span = tracing::info_span!("agent", id = %agent_id, %peer, key);
    let secondary = link.as_ref().is_some_and(|l| l.secondary_of.is_some());
    drop(link);
    // One line per agent at INFO; its further links (one per server
    // worker) at DEBUG.
    if first {
        tracing::info!(parent: &span, identifiers = %ids.encode(), half_close, window, core, secondary, record_layer = link_tls.record_layer(), tls = link_tls.version(), "agent connected");
    } else {
        tracing::debug!(parent: &span, identifiers = %ids.encode(), half_close, window, core, secondary, record_layer = link_tls.record_layer(), tls = link_tls.version(), "agent link up");
    }
    drop(ids);
    drop(agent_id);
    let send = match sent {
        Ok(s) => s,
        Err(e) => {
            unregister(&shared, key, &worker_metrics);
            return Err(e.into());
        }
    };

    if window && window_growth {
        // The tunnels' windows grow with the path: the link's must not
        // hold them first.
        let grow = |have: u32| grpc::GROWN_LINK_WINDOW.saturating_sub(have);
        let cfg = agent_h2_config(shared.cfg.max_message);
        body.grow_windows(grow(cfg.stream_window), grow(cfg.conn_window));
    }
    let (ctl_tx, ctl_rx) = mpsc::unbounded();
    let state = Rc::new(AgentState {
        shared: shared.clone(),
        key,
        tunnel: RefCell::new(ServerTunnel::default()),
        dial_started: RefCell::new(std::collections::HashMap::new()),
        last_open: std::cell::Cell::new(0),
        last_pending: std::cell::Cell::new(0),
        budget: Budget::new(FRONTEND_BUDGET),
        window,
        path: LinkPath::new(ctl_tx.clone(), window && window_growth),
        link_fd,
        worker: worker_metrics.clone(),
        primary: first,
    });
    // An edgetunnel agent names its features; ANP's Go agent names none.
    let follows_goaway = half_close || window;
    let idle = {
        let state = state.clone();
        move || {
            let t = state.tunnel.borrow();
            t.open_connections() == 0 && t.pending_dials() == 0
        }
    };
    let driver = drive(&shared, &mut conn, ctl_tx.clone(), follows_goaway, idle);
    // Without tunnel windows that grow, the link's own windows are sized
    // to the path (engine::link_window).
    let body = if window && window_growth {
        TunedRecv::fixed(body)
    } else {
        let stream_window = agent_h2_config(shared.cfg.max_message).stream_window;
        TunedRecv::tuned(body, stream_window, state.path.clone())
    };
    let reader = read_loop(
        state.clone(),
        PacketReceiver::new(body, shared.cfg.max_message),
        ctl_tx,
    );
    let writer = write_loop(state.clone(), send, cmd_rx, ctl_rx);
    let result: Result<(), BoxError> = monoio::select! {
        r = driver => r,
        r = reader => r,
        r = writer => r,
    };
    // Teardown: unregister, then tell every frontend.
    let gone = unregister(&shared, key, &worker_metrics);
    let orphans = state.tunnel.borrow_mut().drain_all();
    state.sync_gauges();
    let n = orphans.len();
    for sink in orphans {
        sink.deliver(FrontendEvent::AgentGone);
    }
    // The agent's last link: INFO (with the cause when the link failed);
    // one of several, or a link ended by the server's own drain: DEBUG.
    let draining = shared.shutdown.requested() > 0;
    match (&result, gone && !draining) {
        (Ok(()), true) => tracing::info!(parent: &span, connections = n, "agent disconnected"),
        (Err(e), true) => {
            tracing::info!(parent: &span, connections = n, error = %e, "agent disconnected")
        }
        (Ok(()), false) => tracing::debug!(parent: &span, connections = n, "agent link ended"),
        (Err(e), false) => {
            tracing::debug!(parent: &span, connections = n, error = %e, "agent link ended")
        }
    }
    // Logged here.
    Ok(())
}

/// The connection's own work while the link's packets move: reading and
/// writing HTTP/2 (in [`H2Conn::next`]), keepalive PINGs on one timer
/// (`--keepalive-secs`; an unanswered one ends the link, counted in
/// `edgetunnel_keepalive_timeouts_total{peer="agent"}`), extra streams
/// refused, and the server's drain: the agent is told twice, an HTTP/2
/// GOAWAY (grpc-go's GracefulStop, what ANP's agents see) and a DRAIN
/// packet, on which edgetunnel's agents open a replacement connection at
/// once (ANP's agents log an unknown packet at V(5) and ignore it) while
/// this one carries the tunnels still open. `Ok` when the agent closed.
///
/// After a listener handover, an agent that does not follow a GOAWAY that
/// way (`follows_goaway` false: ANP's Go agent, which drops the link and its
/// tunnels at a GOAWAY) is told nothing; its link is ended the first moment
/// it carries no tunnel and no dial (`idle`), and it links to the successor
/// at its next sync (see [`super::predecessor`]). `Ok` then too.
async fn drive<I: Fn() -> bool>(
    shared: &ServerState,
    conn: &mut H2Conn<AgentIo>,
    ctl: mpsc::UnboundedSender<Frame>,
    follows_goaway: bool,
    idle: I,
) -> Result<(), BoxError> {
    enum Next {
        Conn(Option<Result<Incoming, H2Error>>),
        Drain,
        Tick,
    }
    let mut keepalive = PingSchedule::new(shared.cfg.keepalive, Instant::now());
    let mut draining = std::pin::pin!(shared.draining());
    let mut told = false;
    // Ends the link when idle (a Go agent after a handover).
    let mut end_when_idle = false;
    loop {
        if end_when_idle && idle() {
            tracing::info!("handed over: the Go agent's link carries nothing now; closing it so that the agent links to the successor");
            conn.go_away();
            return Ok(());
        }
        let mut wait = keepalive
            .deadline()
            .saturating_duration_since(Instant::now());
        if end_when_idle {
            wait = wait.min(IDLE_CHECK);
        }
        let next = monoio::select! {
            n = conn.next() => Next::Conn(n),
            _ = &mut draining, if !told => Next::Drain,
            // Boxed: a timer is 640 bytes and 128-byte aligned, and the
            // link's task is allocated at its largest state.
            _ = Box::pin(monoio::time::sleep(wait)) => Next::Tick,
        };
        match next {
            Next::Drain if !follows_goaway && shared.handed_over.requested() > 0 => {
                told = true;
                end_when_idle = true;
            }
            Next::Drain => {
                told = true;
                tracing::debug!("server draining: agent told (GOAWAY, DRAIN)");
                conn.go_away();
                let _ = ctl.unbounded_send(Frame::Drain);
            }
            Next::Tick => {
                let send_ping = || {
                    conn.ping();
                    Ok(())
                };
                if let Err(e) = keepalive.drive(send_ping, Instant::now()) {
                    if let KeepaliveError::Timeout(_) = e {
                        shared.metrics.keepalive_timeout(KeepalivePeer::Agent);
                    }
                    return Err(e.into());
                }
            }
            Next::Conn(None) => return Ok(()),
            Next::Conn(Some(Err(e))) => return Err(e.into()),
            Next::Conn(Some(Ok(Incoming::Pong))) => keepalive.on_pong(Instant::now()),
            Next::Conn(Some(Ok(Incoming::Request { mut send, .. }))) => {
                StreamSender::refuse(
                    &mut send,
                    code::UNIMPLEMENTED,
                    "one Connect stream per agent connection",
                );
            }
            // The agent's GOAWAY concerns streams we would open: its
            // Connect stream goes on until it closes.
            Next::Conn(Some(Ok(Incoming::Started | Incoming::GoAway))) => {}
        }
    }
}

/// How often a Go agent's link is looked at after a handover, to end it
/// once it carries nothing.
const IDLE_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// Removes a link from the registry; the agent is gone with its last link
/// (then returns true).
fn unregister(shared: &ServerState, key: u64, worker: &metrics::WorkerMetrics) -> bool {
    let (removed, registered) = {
        let mut r = shared.registry.lock().expect("registry lock");
        let removed = r.remove_link(key);
        (removed, r.len())
    };
    worker.links.dec();
    match removed {
        Some((_, true)) => {
            shared.metrics.agent_disconnected(registered);
            true
        }
        _ => {
            shared.metrics.links_changed(registered);
            false
        }
    }
}

struct AgentState {
    /// This link's worker counters.
    worker: metrics::WorkerMetrics,
    shared: Arc<ServerState>,
    key: u64,
    tunnel: RefCell<ServerTunnel<FrontendSink>>,
    dial_started: RefCell<std::collections::HashMap<i64, Instant>>,
    last_open: std::cell::Cell<usize>,
    last_pending: std::cell::Cell<usize>,
    /// Payload queued toward frontends and not yet written by them.
    budget: Arc<Budget>,
    /// The agent negotiated per-connection windows.
    window: bool,
    /// The link's round trip and the budget its connections' windows grow
    /// from.
    path: Arc<LinkPath>,
    /// The link's TCP socket (owned by the HTTP/2 connection, which
    /// outlives every task that reads this).
    link_fd: FdRef,
    /// The agent's first link registered here (ANP's agents have only
    /// one).
    primary: bool,
}

impl AgentState {
    /// A connection's window, if this agent negotiated windows (a gRPC
    /// frontend's sink carries one whichever agent its dial lands on).
    fn window_of<'a>(&self, frontend: &'a FrontendSink) -> Option<&'a Arc<ConnWindow>> {
        frontend.window.as_ref().filter(|_| self.window)
    }

    /// Publishes this connection's changes to the shared gauges.
    fn sync_gauges(&self) {
        let t = self.tunnel.borrow();
        let (open, pending) = (t.open_connections(), t.pending_dials());
        let m = &self.shared.metrics;
        m.open_delta(open as i64 - self.last_open.replace(open) as i64);
        m.pending_delta(pending as i64 - self.last_pending.replace(pending) as i64);
    }

    /// When the dial `random` started, if it was pending; giving back the
    /// room a burst of dials grew.
    fn forget_dial_start(&self, random: i64) -> Option<Instant> {
        let mut started = self.dial_started.borrow_mut();
        let at = started.remove(&random);
        started.release_spare();
        at
    }

    fn dial_finished(&self, random: Option<i64>, result: DialResult) {
        let started = random.and_then(|r| self.forget_dial_start(r));
        let elapsed = started.map(|s| s.elapsed()).unwrap_or_default();
        self.shared.metrics.dial_done(result, elapsed);
    }
}

async fn read_loop(
    state: Rc<AgentState>,
    mut rx: PacketReceiver<TunedRecv<StreamRecv>>,
    ctl: mpsc::UnboundedSender<Frame>,
) -> Result<(), BoxError> {
    loop {
        let frame = match rx.next().await {
            Ok(Some(f)) => {
                state.path.sample(&state.link_fd, window::RTT_SAMPLE_EVERY);
                f
            }
            Ok(None) => return Ok(()),
            Err(e) => {
                state.shared.metrics.agent_protocol_errors.inc();
                state.shared.metrics.stream_error(
                    Segment::FromAgent,
                    engine::grpc::recv_error_code(&e),
                    "Unknown",
                );
                tracing::warn!(error = %e, "closing agent connection: bad input");
                return Err(e.into());
            }
        };
        // The dial a packet ends (its start time is forgotten with it: a
        // DIAL_CLS left it behind, one entry for every dial an agent
        // refused that way, for the link's life).
        let random = match &frame {
            Frame::DialResponse(r) => Some(r.random),
            Frame::DialClose(c) => Some(c.random),
            _ => None,
        };
        let kind = metrics::packet_type(&frame);
        if !rx.continued() {
            state.shared.metrics.packet(Segment::FromAgent, kind);
        }
        let action = state.tunnel.borrow_mut().on_agent_frame(frame);
        state.sync_gauges();
        match action {
            ServerAction::DialSucceeded {
                frontend,
                connect_id,
            } => {
                state.dial_finished(random, DialResult::Success);
                if let Some(w) = state.window_of(&frontend) {
                    w.bind(connect_id, state.path.clone());
                }
                if !frontend.deliver(FrontendEvent::DialOk { connect_id }) {
                    state.shared.metrics.dial_failure(DialFailure::SendResponse);
                    // The frontend left: close what the agent opened.
                    if let Some(f) = state.tunnel.borrow_mut().close(connect_id) {
                        let _ = ctl.unbounded_send(f);
                    }
                    state.sync_gauges();
                }
            }
            ServerAction::DialFailed { frontend, error } => {
                let result = match kind {
                    PacketType::DialCls => DialResult::BackendClose,
                    _ => DialResult::Failure,
                };
                state.dial_finished(random, result);
                frontend.deliver(FrontendEvent::DialErr(error));
            }
            ServerAction::Data {
                frontend,
                connect_id,
                payload,
            } => {
                if let Some(w) = state.window_of(&frontend) {
                    if !w.received(payload.len()) {
                        // It ignores the window it negotiated: this
                        // connection ends (buffering it would be without
                        // bound); the link and its other connections live.
                        tracing::warn!(
                            connect_id,
                            "agent sent past a connection's window: closing it"
                        );
                        if let Some(f) = state.tunnel.borrow_mut().close(connect_id) {
                            let _ = ctl.unbounded_send(f);
                        }
                        state.sync_gauges();
                        frontend.deliver(FrontendEvent::Closed(
                            "agent sent past the connection's window".into(),
                        ));
                        continue;
                    }
                }
                state
                    .shared
                    .metrics
                    .bytes_from_agent
                    .inc_by(payload.len() as u64);
                state.worker.bytes_from_agent.inc_by(payload.len() as u64);
                let charge = state.budget.charge_for(payload, state.window_of(&frontend));
                let mut charge = std::pin::pin!(charge);
                let credit = match futures::poll!(charge.as_mut()) {
                    std::task::Poll::Ready(c) => c,
                    std::task::Poll::Pending => {
                        // ANP's full_receive_channels (Connect): this
                        // agent's stream is not read until there is room.
                        let _full = state
                            .shared
                            .metrics
                            .full_receive_channel(crate::metrics::ServiceMethod::Connect);
                        charge.await
                    }
                };
                frontend.deliver(FrontendEvent::Data(credit));
            }
            ServerAction::Window { frontend, bytes } => {
                if let Some(w) = state.window_of(&frontend) {
                    w.granted(bytes);
                }
            }
            ServerAction::PeerFinished { frontend } => {
                frontend.deliver(FrontendEvent::Finished);
            }
            ServerAction::Closed { frontend, error } => {
                frontend.deliver(FrontendEvent::Closed(error));
            }
            ServerAction::Drain => {
                // Each link says so; the agent's first one at INFO.
                if state.primary {
                    tracing::info!("agent is draining: no new dials go to it");
                } else {
                    tracing::debug!("agent link is draining");
                }
                state
                    .shared
                    .registry
                    .lock()
                    .expect("registry lock")
                    .set_draining(state.key);
                // Counted once in effect: a test (or operator) that sees the
                // count move knows new dials avoid the agent.
                state.shared.metrics.agent_drains.inc();
            }
            ServerAction::Reply(f) => {
                if kind == PacketType::DialRsp {
                    // A DIAL_RSP for a dial no longer pending.
                    state
                        .shared
                        .metrics
                        .dial_failure(DialFailure::UnrecognizedResponse);
                }
                let _ = ctl.unbounded_send(f);
            }
            ServerAction::Ignored(reason) => {
                if kind == PacketType::DialRsp {
                    state
                        .shared
                        .metrics
                        .dial_failure(DialFailure::UnrecognizedResponse);
                }
                tracing::debug!(%reason, "agent packet ignored")
            }
        }
    }
}

async fn write_loop(
    state: Rc<AgentState>,
    mut tx: StreamSender,
    mut cmds: mpsc::Receiver<AgentCmd>,
    mut ctl: mpsc::UnboundedReceiver<Frame>,
) -> Result<(), BoxError> {
    loop {
        let next = futures::select_biased! {
            f = ctl.next() => f.map(Err),
            c = cmds.next() => c.map(Ok),
        };
        let Some(next) = next else { return Ok(()) };
        let msg = match next {
            Err(frame) => packet::encode(frame),
            Ok(cmd) => match handle_cmd(&state, cmd).await {
                Some(m) => m,
                None => continue,
            },
        };
        let kind = metrics::encoded_packet_type(&msg.head);
        state.shared.metrics.packet(Segment::ToAgent, kind);
        if let Err(e) = tx.send(msg).await {
            state
                .shared
                .metrics
                .stream_error(Segment::ToAgent, "Unavailable", kind.as_str_name());
            cmds.close();
            // Fail the dials that were queued behind the broken stream.
            while let Ok(cmd) = cmds.try_recv() {
                if let AgentCmd::Dial { reply, .. } = cmd {
                    reply.deliver(FrontendEvent::DialErr(format!(
                        "agent connection failed: {e}"
                    )));
                }
            }
            return Err(e.into());
        }
    }
}

async fn handle_cmd(state: &AgentState, cmd: AgentCmd) -> Option<packet::Encoded> {
    let frame = match cmd {
        AgentCmd::Dial {
            random,
            address,
            reply,
        } => {
            let r = state
                .tunnel
                .borrow_mut()
                .begin_dial(random, &address, reply.clone());
            match r {
                Ok(f) => {
                    state.worker.dials.inc();
                    state
                        .dial_started
                        .borrow_mut()
                        .insert(random, Instant::now());
                    f
                }
                Err(e) => {
                    reply.deliver(FrontendEvent::DialErr(e.to_string()));
                    return None;
                }
            }
        }
        AgentCmd::Data {
            connect_id,
            payload,
        } => {
            if !state.tunnel.borrow().is_open(connect_id) {
                return None;
            }
            state
                .shared
                .metrics
                .bytes_to_agent
                .inc_by(payload.len() as u64);
            state.worker.bytes_to_agent.inc_by(payload.len() as u64);
            return Some(packet::encode_data(connect_id, payload));
        }
        AgentCmd::HalfClose { connect_id } => {
            if !state.tunnel.borrow().is_open(connect_id) {
                return None;
            }
            packet::half_close(connect_id)
        }
        AgentCmd::Close { connect_id } => state.tunnel.borrow_mut().close(connect_id)?,
        AgentCmd::CancelDial { random } => {
            let (f, frontend) = state.tunnel.borrow_mut().cancel_dial(random)?;
            state.forget_dial_start(random);
            frontend.deliver(FrontendEvent::DialCancelled);
            f
        }
    };
    state.sync_gauges();
    Some(packet::encode(frame))
}

#[cfg(test)]
mod secret_tests {
    use super::same_secret;

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret(b"Bearer abc", b"Bearer abc"));
        assert!(!same_secret(b"Bearer abd", b"Bearer abc"));
        assert!(!same_secret(b"Bearer ab", b"Bearer abc"));
        assert!(!same_secret(b"", b"x"));
        assert!(same_secret(b"", b""));
    }
}

#[cfg(test)]
mod task_size_tests {
    use super::*;

    fn future_of<A, B, C, D, E, R>(_: fn(A, B, C, D, E) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    fn alignment_of<A, B, C, D, E, R>(_: fn(A, B, C, D, E) -> R) -> usize {
        std::mem::align_of::<R>()
    }

    fn future_of3<A, B, C, R>(_: fn(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    fn write_loop_size() -> usize {
        fn of<A, B, C, D, R>(_: fn(A, B, C, D) -> R) -> usize {
            std::mem::size_of::<R>()
        }
        of(write_loop)
    }

    /// An agent link's task is allocated at its largest state for as long
    /// as the link lives, and a server holds one per agent (issue 30: at
    /// most 25 KB of server memory per idle agent). The handshake is boxed
    /// (rustls' handshake, its timer and the wait for the first request
    /// are gone once the link is up), the keepalive runs on the driver's
    /// one boxed timer, and the HTTP/2 state lives behind one `Rc`
    /// ([`H2Conn`], whose TLS state is boxed beside the task). With the h2
    /// crate the task was about 10.5 KB (and h2 held 28 KiB of buffers
    /// beside it); unboxed, the connection took room twice (5,568 bytes).
    #[test]
    fn an_idle_links_task_stays_small() {
        let link = future_of(serve);
        let handshake = future_of(handshake);
        let driver = future_of(drive::<fn() -> bool>);
        let conn = std::mem::size_of::<H2Conn<AgentIo>>();
        let reader = future_of3(read_loop);
        let writer = write_loop_size();
        eprintln!(
            "serve {link}, handshake (boxed) {handshake}, drive {driver}, conn {conn}, \
             reader {reader}, writer {writer}"
        );
        // 2,896 now: the connection (boxed), the reader (656), the writer
        // (448), the driver (184) and the link's state; 3,072 is an
        // allocator size class.
        assert!(link <= 3_000, "serve's future is {link} bytes");
        // Boxed, so not in the task; still worth a ceiling (rustls' accept).
        assert!(
            handshake <= 4_096,
            "the handshake's future is {handshake} bytes"
        );
        assert!(driver <= 256, "the driver's future is {driver} bytes");
        // No timer inline: an alignment of 128 would pad the task.
        let align = alignment_of(serve);
        assert_eq!(align, 8, "serve's future is {align}-byte aligned");
    }
}
