//! `edgetunnel server`: accepts agents (gRPC AgentService over mutual TLS)
//! and tunnel requests from the cloud side (HTTP CONNECT and gRPC
//! ProxyService frontends), and routes each dial to an agent.
//!
//! Threading: every worker core accepts on every listener. An agent's
//! connection lives on the core that accepted it; a CONNECT frontend socket
//! accepted elsewhere is moved to that core, so one tunneled connection is
//! handled on one core end to end. gRPC frontend streams (many dials on one
//! HTTP/2 connection) exchange `Bytes` with the agent's core by channel.

mod agent_conn;
pub mod args;
mod connect_frontend;
mod grpc_frontend;
mod handover;
mod intercept_frontend;
mod listeners;
mod predecessor;
mod session;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::channel::mpsc;
use futures::StreamExt;

use crate::metrics::Metrics;
use crate::readiness::{Announce, Ready};
use engine::runtime::{self, Driver};
use engine::{listener, relay::MovedSocket, signals, tls};
use protocol::anp::routing::{Registry, Strategy};

pub use session::{AgentCmd, AgentHandle, FrontendEvent, FrontendSink};

/// Everything `edgetunnel server` is told at start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where readiness is reported (listeners bound, serving).
    pub announce: Announce,
    pub agent_bind: SocketAddr,
    pub connect_bind: Option<SocketAddr>,
    pub connect_uds: Option<PathBuf>,
    pub grpc_bind: Option<SocketAddr>,
    pub grpc_uds: Option<PathBuf>,
    /// Mode of the unix socket files and what to do with an existing path.
    pub uds: listener::UdsOptions,
    pub admin_bind: Option<SocketAddr>,
    /// Health listener (ANP's `--health-port`): the same endpoints as the
    /// admin listener, usually bound where kubelet probes reach it.
    pub health_bind: Option<SocketAddr>,
    pub tls: tls::TlsFiles,
    /// TLS on the TCP frontends (CONNECT and gRPC); `None`: plaintext.
    pub frontend_tls: Option<FrontendTls>,
    /// Versions and TLS 1.2 suites of the agent and frontend listeners.
    pub tls_policy: tls::TlsPolicy,
    pub agent_token: Option<String>,
    pub strategies: Vec<Strategy>,
    pub server_id: String,
    pub server_count: u32,
    pub workers: usize,
    pub driver: Driver,
    pub dial_timeout: Duration,
    /// Status of the CONNECT answer when no agent can take a dial.
    pub no_agent_status: u16,
    pub max_message: usize,
    pub keepalive: Duration,
    /// HTTP/2 PING interval toward gRPC frontend callers.
    pub frontend_keepalive: Duration,
    /// On SIGTERM, how long open tunnels may take to finish (listeners
    /// closed, agents and gRPC callers told) before the server exits;
    /// zero: exit at once.
    pub graceful_shutdown: Duration,
    /// The handover socket (see [`engine::handover`]); `None`: no
    /// handover.
    pub handover_socket: Option<PathBuf>,
    /// After a takeover, how long dials wait for an agent to connect.
    pub takeover_dial_wait: Duration,
    /// With a handover socket: on SIGTERM, how long to serve on while a
    /// successor may still take over.
    pub handover_wait: Duration,
    /// Agent connections in their handshake at once, in total and per
    /// source address (see [`engine::admission`]).
    pub handshake_limits: engine::admission::Limits,
    /// How long a gRPC frontend connection may go without an HTTP/2
    /// preface or without an open stream.
    pub frontend_idle: Duration,
    /// How long a half-closed tunnel waits for its other side to finish.
    pub half_close_linger: Duration,
    pub interception_bind: Option<SocketAddr>,
    pub interception_tls: Option<InterceptionTls>,
    pub localhost_proxy_ports: Vec<u16>,
    pub control: crate::control::manager::ControlSpec,
    /// Agents authenticate with ServiceAccount tokens (TokenReview); they
    /// then need no client certificate.
    pub agent_auth: Option<crate::control::token_review::AgentAuthSpec>,
    /// Agents may register only the ID and identifiers their client
    /// certificate names (see [`protocol::anp::agent_identity`]).
    pub bind_agent_identity: bool,
}

/// TLS of the TCP frontends (ANP's `--server-cert/--server-key/
/// --server-ca-cert`).
#[derive(Debug, Clone)]
pub struct FrontendTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Callers must present a certificate this CA signed; `None`: no client
    /// certificate is asked.
    pub ca: Option<PathBuf>,
}

/// The TCP frontends' TLS acceptors, one per protocol (their ALPN differs).
#[derive(Clone)]
pub(crate) struct FrontendAcceptors {
    connect: tokio_rustls::TlsAcceptor,
    grpc: tokio_rustls::TlsAcceptor,
}

/// A worker's TLS configurations.
struct WorkerTls {
    agent: Arc<rustls::ServerConfig>,
    intercept: Option<intercept_frontend::InterceptTls>,
    frontend: Option<FrontendAcceptors>,
}

/// The TLS interception listener's settings.
#[derive(Debug, Clone)]
pub struct InterceptionTls {
    pub bind: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub kubelet_cert: PathBuf,
    pub kubelet_key: PathBuf,
    /// None: kubelet certificates are not verified.
    pub kubelet_ca: Option<PathBuf>,
}

/// A frontend socket moved to the core that owns its agent.
pub(crate) struct Handoff {
    socket: MovedSocket,
    dial: connect_frontend::Pending,
}

/// The server's state, shared by every core: configuration, agent
/// registry, metrics, the handoff inboxes.
pub(crate) struct ServerState {
    cfg: ServerConfig,
    registry: Mutex<Registry<AgentHandle>>,
    inboxes: OnceLock<Vec<mpsc::UnboundedSender<Handoff>>>,
    metrics: Arc<Metrics>,
    next_key: AtomicU64,
    /// Sends agents' tokens to the control thread for review.
    reviewer: Option<crate::control::token_review::Reviewer>,
    /// SIGTERM/SIGINT: the first starts the drain, the second ends it.
    shutdown: Arc<signals::Shutdown>,
    /// With `bind_agent_identity`: which certificate holds each agent ID.
    holders: Mutex<protocol::anp::agent_identity::Holders>,
    /// Agent connections not yet authenticated, capped.
    handshakes: Arc<engine::admission::Admission>,
    /// Raised when a successor took the listeners over (the admin and
    /// health listeners stop accepting too).
    handed_over: Arc<signals::Shutdown>,
    /// Accept loops running on the listeners a successor may take (each
    /// ends, losing no connection, when the server drains).
    accepting: Arc<AtomicUsize>,
    /// The admin and health listeners' accept loops (they end only when a
    /// successor takes their sockets).
    accepting_admin: Arc<AtomicUsize>,
    /// When this server took its listeners over from a predecessor.
    took_over_at: Option<std::time::Instant>,
    /// The predecessor, while it drains (see [`predecessor`]).
    predecessor: Arc<predecessor::Predecessor>,
    /// Intercepted connections being served (CONNECT callers and gRPC
    /// streams are counted in the metrics): see [`Self::takes_forwarded`].
    intercepted: prometheus_client::metrics::gauge::Gauge,
}

thread_local! {
    /// The worker this thread runs (set when the worker starts).
    static WORKER: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

impl ServerState {
    /// An agent for `address`; of an agent with several links, the one on
    /// the calling worker when there is one.
    fn pick(&self, address: &str) -> Option<AgentHandle> {
        let near = WORKER.with(|w| w.get());
        self.registry
            .lock()
            .expect("registry lock")
            .pick_near(address, &self.cfg.strategies, near)
    }

    /// An agent for `address`; right after a takeover, when none is
    /// connected yet, waits for one until
    /// [`ServerConfig::takeover_dial_wait`] after the takeover (agents move
    /// over from the old server).
    async fn pick_or_wait(&self, address: &str) -> Option<AgentHandle> {
        if let Some(a) = self.pick(address) {
            return Some(a);
        }
        if !self.awaits_agents() {
            return None;
        }
        // Boxed: a rare wait (with its timer) must not widen every
        // tunnel's task.
        Box::pin(self.route(address, None)).await
    }

    /// [`Self::pick_or_wait`], avoiding the agent `gone` (whose connection
    /// ended, or the predecessor that had no agent for `address`).
    async fn route(&self, address: &str, gone: Option<u64>) -> Option<AgentHandle> {
        let other = |a: &AgentHandle| Some(a.key) != gone;
        if let Some(a) = self.pick(address).filter(other) {
            return Some(a);
        }
        if !self.awaits_agents() {
            return None;
        }
        // The predecessor may still have a link to the agent (a Go agent
        // keeps its old link while it carries tunnels).
        if !gone.is_some_and(predecessor::is_predecessor) {
            let core = WORKER.with(|w| w.get()).unwrap_or(0);
            if let Some(p) = predecessor::handle(self, core) {
                return Some(p);
            }
        }
        let until = std::time::Instant::now() + self.cfg.takeover_dial_wait;
        while std::time::Instant::now() < until && self.shutdown.requested() == 0 {
            monoio::time::sleep(AGENT_POLL).await;
            if let Some(a) = self.pick(address).filter(other) {
                tracing::debug!(%address, "dial waited for an agent after the takeover");
                return Some(a);
            }
        }
        tracing::info!(%address, wait = ?self.cfg.takeover_dial_wait, "no agent connected within the takeover's dial wait");
        None
    }

    /// Whether a dial with no agent waits for one: within
    /// `--takeover-dial-wait-secs` of a takeover, while the predecessor
    /// still runs, and as long again after it was seen gone.
    fn awaits_agents(&self) -> bool {
        let Some(at) = self.took_over_at else {
            return false;
        };
        let wait = self.cfg.takeover_dial_wait;
        at.elapsed() < wait
            || self.predecessor.running()
            || self
                .predecessor
                .gone_since()
                .is_some_and(|g| g.elapsed() < wait)
    }

    /// Accept loop options for listener `name`: the loop ends when the
    /// server drains, losing no connection.
    pub(crate) fn accept_options(&self, name: &'static str) -> engine::accept::Options {
        engine::accept::Options::named(name).until(self.shutdown.clone())
    }

    /// Another agent for `address` than `gone`, whose connection just ended
    /// (it may stay registered for a moment).
    async fn repick(&self, address: &str, gone: u64) -> Option<AgentHandle> {
        if self.awaits_agents() {
            return Box::pin(self.route(address, Some(gone))).await;
        }
        for _ in 0..3 {
            match self.pick(address) {
                Some(a) if a.key == gone => {
                    monoio::time::sleep(std::time::Duration::from_millis(10)).await
                }
                other => return other,
            }
        }
        None
    }

    /// Counts an intercepted connection while it is held.
    fn intercepted(&self) -> crate::metrics::GaugeGuard {
        crate::metrics::GaugeGuard::new(&self.intercepted)
    }

    /// Whether a successor's forwarded dial may still take one of our
    /// agents: before a handover, and after it while callers of our own
    /// frontends (not the successor's, on the forward socket) are still
    /// served. A Go agent's link stays while they are; once none is,
    /// forwarded dials are refused, so that under a steady load they do not
    /// keep the link busy until the graceful timeout: it ends when its last
    /// tunnel does, and the agent links to the successor (see
    /// [`predecessor`]).
    fn takes_forwarded(&self) -> bool {
        self.handed_over.requested() == 0 || self.metrics.own_callers() + self.intercepted.get() > 0
    }

    fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Resolves when the server starts to drain (first SIGTERM/SIGINT).
    fn draining(&self) -> signals::WaitShutdown {
        self.shutdown.wait(1)
    }
}

/// How often a dial waiting for an agent after a takeover looks again.
const AGENT_POLL: Duration = Duration::from_millis(10);

struct AdminView(Arc<ServerState>);

impl crate::admin::AdminState for AdminView {
    fn metrics(&self) -> String {
        self.0.metrics.render()
    }

    fn ready(&self) -> Result<String, String> {
        if self.0.shutdown.requested() > 0 {
            return Err("shutting down".to_string());
        }
        // Agents as `edgetunnel_agents_connected` and ANP's
        // `ready_backend_connections` count them (an edgetunnel agent holds
        // one link per server worker, counted once), then the links.
        let (agents, links) = {
            let r = self.0.registry.lock().expect("registry lock");
            (r.len(), r.links())
        };
        if agents > 0 {
            Ok(format!(
                "ok: {agents} agent(s) connected over {links} link(s)"
            ))
        } else {
            Err("no connection to any proxy agent".to_string())
        }
    }
}

/// Runs the server until SIGTERM/SIGINT.
pub fn run(cfg: ServerConfig) -> Result<(), crate::BoxError> {
    // In `csr` mode, certificates not on disk yet are requested from the
    // cluster before anything listens.
    if let (Some(kube), false) = (&cfg.control.kube, cfg.control.csr.is_empty()) {
        crate::control::kube_sync::obtain_missing(
            kube,
            &cfg.control.csr,
            Duration::from_secs(900),
        )?;
    }
    let client_cert = match cfg.agent_auth {
        Some(_) => tls::ClientCert::Optional,
        None => tls::ClientCert::Required,
    };
    let (tls_config, server_cert) = tls::server_config(&cfg.tls, client_cert, &cfg.tls_policy)?;
    if cfg.bind_agent_identity && cfg.tls.ca.as_os_str().is_empty() {
        tracing::warn!(
            "--bind-agent-identity without a CA: no client certificates are asked for, \
             so token-authenticated agents register what they like"
        );
    }
    let (reviewer, review_queue) = match &cfg.agent_auth {
        Some(spec) => {
            let (r, q) = crate::control::token_review::channel(spec.clone());
            (Some(r), Some(q))
        }
        None => (None, None),
    };
    // Certificates the control thread watches (and SIGHUP reloads).
    let mut watched = vec![server_cert];
    let frontend_tls = frontend_acceptors(&cfg, &mut watched)?;
    let n = cfg.workers.max(1);
    let specs = listeners::specs(&cfg);
    let mut takeover = handover::Takeover::try_from_predecessor(&cfg, &specs);
    let bound = listener::bind_all_with(&specs, n, cfg.uds, takeover.listener_sockets())?;
    let offer = takeover.offering(&specs, &bound)?;
    let intercept_tls = interception_tls(&cfg, &mut watched)?;
    for (what, addr) in &bound.addresses {
        cfg.announce.send(Ready::Listen {
            what: what.to_string(),
            addr: addr.clone(),
        });
    }
    // The socket files are removed when `run` returns (after SIGTERM/SIGINT
    // or on an error), dropping `socket_files`.
    let listener::Bound {
        per_worker,
        files: socket_files,
        ..
    } = bound;
    let socket_files = Arc::new(Mutex::new(socket_files));
    let per_worker: Vec<_> = per_worker
        .into_iter()
        .map(|l| Mutex::new(Some(l)))
        .collect();

    // SIGHUP reloads every certificate the control thread watches.
    let mut hup_certs = cfg.control.certs.clone();
    hup_certs.extend(watched.iter().cloned());
    let (shutdown, handed_over) = engine::takeover::install_signals(
        cfg.handover_socket.as_ref().map(|_| cfg.handover_wait),
        signals::reload_certs(hup_certs),
    )?;
    let metrics = Arc::new(Metrics::new(&cfg.strategies));
    let handshakes =
        engine::admission::Admission::new(cfg.handshake_limits, metrics.handshakes.clone());
    let shared = Arc::new(ServerState {
        cfg: cfg.clone(),
        registry: Mutex::new(Registry::default()),
        inboxes: OnceLock::new(),
        metrics,
        handshakes,
        next_key: AtomicU64::new(0),
        reviewer,
        shutdown: shutdown.clone(),
        holders: Mutex::new(Default::default()),
        handed_over,
        took_over_at: takeover.taken().then(std::time::Instant::now),
        accepting: Arc::new(AtomicUsize::new(0)),
        accepting_admin: Arc::new(AtomicUsize::new(0)),
        predecessor: Default::default(),
        intercepted: Default::default(),
    });
    let mut inbox_rx = Vec::with_capacity(n);
    let mut inbox_tx = Vec::with_capacity(n);
    for _ in 0..n {
        let (tx, rx) = mpsc::unbounded();
        inbox_tx.push(tx);
        inbox_rx.push(Mutex::new(Some(rx)));
    }
    let _ = shared.inboxes.set(inbox_tx);

    // The control thread (iptables, DNS records, certificate renewal): its
    // own runtime, reading the agent registry briefly, never running on a
    // data-plane core.
    let control = {
        let (a, h) = (shared.clone(), shared.clone());
        let sources = crate::control::manager::Sources {
            addresses: Arc::new(move || a.registry.lock().expect("registry lock").addresses()),
            hosts: Arc::new(move || h.registry.lock().expect("registry lock").hosts()),
            lease_metrics: shared.metrics.leases.clone(),
            handed_over: shared.handed_over.clone(),
        };
        let mut spec = cfg.control.clone();
        spec.certs.extend(watched);
        spec.token_review = review_queue.map(|mut q| {
            q.counters = shared.metrics.token_reviews.clone();
            q
        });
        crate::control::manager::spawn(spec, sources, shutdown.clone())?
    };
    tracing::info!(
        workers = n,
        driver = cfg.driver.name(),
        server_id = %cfg.server_id,
        "edgetunnel server starting"
    );
    cfg.announce.send(Ready::Ready);
    // The sockets are ours now (connections queue until the workers
    // accept): the predecessor may stop accepting and drain.
    let successor_watch = takeover.confirm_and_listen(
        &shared,
        listeners::forward_path(&cfg),
        offer,
        socket_files.clone(),
    );

    let per_worker = Arc::new(per_worker);
    let inbox_rx = Arc::new(inbox_rx);
    runtime::run_workers(n, cfg.driver, move |idx| {
        let shared = shared.clone();
        let tls = WorkerTls {
            agent: tls_config.clone(),
            intercept: intercept_tls.clone(),
            frontend: frontend_tls.clone(),
        };
        let listeners = per_worker[idx]
            .lock()
            .expect("listeners")
            .take()
            .expect("once");
        let inbox = inbox_rx[idx].lock().expect("inbox").take().expect("once");
        async move { worker(idx, shared, tls, listeners, inbox).await }
    })?;
    // The control thread removes its rules before it returns.
    let _ = control.join();
    if let Some(t) = successor_watch {
        let _ = t.join();
    }
    // Removes the socket files, except those a successor took over.
    drop(socket_files);
    Ok(())
}

/// The TCP frontends' TLS acceptors (`--frontend-cert`), their
/// certificates added to `watched`.
fn frontend_acceptors(
    cfg: &ServerConfig,
    watched: &mut Vec<Arc<engine::cert_reload::ReloadingCert>>,
) -> Result<Option<FrontendAcceptors>, crate::BoxError> {
    let Some(f) = &cfg.frontend_tls else {
        return Ok(None);
    };
    let build = |alpn: &[u8]| {
        tls::frontend_server_config(&f.cert, &f.key, f.ca.as_deref(), alpn, &cfg.tls_policy)
    };
    let (connect, a) = build(b"http/1.1")?;
    let (grpc, b) = build(b"h2")?;
    watched.extend([a, b]);
    Ok(Some(FrontendAcceptors {
        connect: connect.into(),
        grpc: grpc.into(),
    }))
}

/// The TLS interception listener's two sides (toward callers, toward
/// kubelets), their certificates added to `watched`.
fn interception_tls(
    cfg: &ServerConfig,
    watched: &mut Vec<Arc<engine::cert_reload::ReloadingCert>>,
) -> Result<Option<intercept_frontend::InterceptTls>, crate::BoxError> {
    let Some(t) = &cfg.interception_tls else {
        return Ok(None);
    };
    let (server_side, a) = tls::interception_server_config(&t.cert, &t.key)?;
    let (kubelet, b) =
        tls::kubelet_client_config(&t.kubelet_cert, &t.kubelet_key, t.kubelet_ca.as_deref())?;
    watched.extend([a, b]);
    Ok(Some(intercept_frontend::InterceptTls {
        acceptor: tokio_rustls::TlsAcceptor::from(server_side),
        kubelet,
    }))
}

async fn worker(
    core: usize,
    shared: Arc<ServerState>,
    tls: WorkerTls,
    listening: Vec<listener::Listening<listeners::Kind>>,
    mut inbox: mpsc::UnboundedReceiver<Handoff>,
) -> std::io::Result<()> {
    tracing::debug!(core, "worker started");
    WORKER.with(|w| w.set(Some(core)));
    let s = &shared;
    for l in listening {
        listeners::serve(core, s, &tls, l)?;
    }
    // Sockets handed over by other cores, also while draining (their dials
    // are under way).
    let handoffs = {
        let shared = s.clone();
        async move {
            while let Some(h) = inbox.next().await {
                monoio::spawn(connect_frontend::adopt(core, shared.clone(), h));
            }
        }
    };
    monoio::spawn(handoffs);
    s.draining().await;
    // The accept loops end by themselves, serving a connection that raced
    // their cancel; the worker waits for them (bounded) before it may stop,
    // which would drop such a connection unanswered.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while s.accepting.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(1)).await;
    }
    drain(core, s).await;
    // What is still open ends abnormally: its callers get a reset, not a
    // FIN that looks like a complete answer.
    let reset = engine::abort::reset_open();
    if reset > 0 {
        tracing::info!(core, tunnels = reset, "server stopping: open tunnels reset");
    }
    Ok(())
}

/// The graceful part of a shutdown (ANP's `--graceful-shutdown-timeout`):
/// listeners are closed and agents and gRPC callers told (each connection
/// does that itself on [`ServerState::draining`]); this waits until no caller is
/// served any more, the timeout passes, or a second signal comes.
async fn drain(core: usize, shared: &ServerState) {
    let grace = shared.cfg.graceful_shutdown;
    if grace.is_zero() {
        return;
    }
    let started = std::time::Instant::now();
    if core == 0 {
        tracing::info!(
            timeout = ?grace,
            in_flight = shared.metrics.in_flight(),
            "draining: listeners closed, waiting for open tunnels to finish"
        );
    }
    loop {
        if shared.metrics.in_flight() <= 0 {
            if core == 0 {
                tracing::info!(elapsed = ?started.elapsed(), "drained: no tunnel left");
            }
            return;
        }
        if started.elapsed() >= grace {
            if core == 0 {
                tracing::warn!(
                    in_flight = shared.metrics.in_flight(),
                    "graceful shutdown timed out after {grace:?}, closing what is left"
                );
            }
            return;
        }
        monoio::select! {
            _ = monoio::time::sleep(Duration::from_millis(20)) => {}
            _ = shared.shutdown.wait(2) => return,
        }
    }
}
