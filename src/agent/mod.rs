//! `edgetunnel agent`: dials out to one or more servers over mutual TLS,
//! registers its identifiers on the `AgentService/Connect` stream, dials the
//! local targets it is asked for and relays bytes. Reconnects with
//! exponential backoff and jitter (reset once a connection stayed up for a
//! while, see [`backoff`]); on SIGTERM sends DRAIN, lets open connections
//! finish (up to a grace period), then closes cleanly.

pub mod args;
pub mod backoff;
mod connection;
mod handover;
mod link_window;
mod links;

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use backoff::{Attempt, Backoff};

use engine::runtime::{self, Driver};
use engine::{listener, signals, takeover, tls};
use protocol::anp::agent_identifiers::Identifiers;

/// Everything `edgetunnel agent` is told at start.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Where readiness is reported (listeners bound, links up).
    pub announce: crate::readiness::Announce,
    pub servers: Vec<String>,
    /// With no `servers`: the Service the server address is read from at
    /// start (`control::tunnel_addr`; needs `kube`).
    pub server_service: Option<crate::control::manager::ObjectRef>,
    pub server_name: Option<String>,
    pub tls: tls::TlsFiles,
    pub agent_id: String,
    pub identifiers: Identifiers,
    /// The bearer token's file, read at every connect (a projected
    /// ServiceAccount token rotates).
    pub token_file: Option<std::path::PathBuf>,
    /// Present `tls.cert`/`tls.key` as client certificate (false: an agent
    /// that authenticates with its token only).
    pub client_cert: bool,
    pub keepalive: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// A connection up this long resets the backoff.
    pub backoff_reset_after: Duration,
    pub drain_grace: Duration,
    pub dial_timeout: Duration,
    /// Which destinations may be dialed (`--allow-destinations`,
    /// `--deny-destinations`).
    pub policy: protocol::anp::agent_dest_policy::Policy,
    pub driver: Driver,
    pub max_message: usize,
    /// Offer the half-close extension to servers.
    pub half_close: bool,
    /// How long a half-closed connection waits for its other side to finish.
    pub half_close_linger: Duration,
    /// Offer per-connection flow control (`engine::window`) to servers.
    pub window: bool,
    /// Kubernetes access, for certificates from CSRs.
    pub kube: Option<crate::control::manager::KubeSpec>,
    /// The agent certificate kept signed through a CSR.
    pub csr: Vec<crate::control::csr::Job>,
    /// Server count from ANP-format server leases (`--count-server-leases`).
    pub lease_count: Option<crate::control::lease_count::LeaseCountSpec>,
    /// Health listener (/healthz, /ready, /readyz, /metrics).
    pub health_bind: Option<std::net::SocketAddr>,
    /// Admin listener (/metrics and the health paths).
    pub admin_bind: Option<std::net::SocketAddr>,
    /// Where a running agent hands its listeners to a successor
    /// (`--handover-socket`, [`handover`]).
    pub handover_socket: Option<std::path::PathBuf>,
    /// With `handover_socket`: how long a signalled agent serves on while
    /// a successor may still come.
    pub handover_wait: Duration,
    /// Threads (monoio runtimes) the links are spread over.
    pub workers: usize,
    /// Most links kept to one server (1: no secondary links).
    pub max_links: usize,
}

use crate::BoxError;

/// Runs the agent until SIGTERM/SIGINT (and the drain) completes.
pub fn run(mut cfg: AgentConfig) -> Result<(), BoxError> {
    // First the server's address, then certificates, as yurt-tunnel-agent
    // (`cmd/yurt-tunnel-agent/app/start.go` `Run`); an error ends the start.
    if let (true, Some(svc), Some(kube)) = (cfg.servers.is_empty(), &cfg.server_service, &cfg.kube)
    {
        let addr = crate::control::tunnel_addr::discover_blocking(kube, svc)?;
        tracing::info!(service = %format!("{}/{}", svc.namespace, svc.name), server = %addr, "server address from the Service");
        cfg.servers = vec![addr];
    }
    if let (Some(kube), false) = (&cfg.kube, cfg.csr.is_empty()) {
        crate::control::kube_sync::obtain_missing(kube, &cfg.csr, Duration::from_secs(900))?;
    }
    let (client_tls, certs) = if cfg.client_cert {
        let (c, cert) = tls::client_config(&cfg.tls)?;
        (c, vec![cert])
    } else {
        (tls::client_config_without_cert(&cfg.tls.ca)?, Vec::new())
    };
    let (shutdown, handed_over) = takeover::install_signals(
        cfg.handover_socket.as_ref().map(|_| cfg.handover_wait),
        signals::reload_certs(certs.clone()),
    )?;
    // The control thread swaps in a renewed agent certificate.
    let control = crate::control::manager::spawn(
        crate::control::manager::ControlSpec {
            certs,
            kube: cfg.kube.clone(),
            csr: cfg.csr.clone(),
            lease_count: cfg.lease_count.clone(),
            ..Default::default()
        },
        crate::control::manager::Sources::none(),
        shutdown.clone(),
    )?;
    tracing::info!(
        agent_id = %cfg.agent_id,
        identifiers = %cfg.identifiers.encode(),
        servers = ?cfg.servers,
        driver = cfg.driver.name(),
        "edgetunnel agent starting"
    );
    let admin = Mutex::new(Some(AdminListeners::bind(&cfg, &shutdown, &handed_over)?));
    let cfg = Arc::new(cfg);
    // Secondary links (one per server worker) spread over our workers;
    // worker 0 also runs the primary links and the admin listeners.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ (u64::from(std::process::id()) << 32);
    let (links, queues) = links::new(cfg.workers, seed);
    let queues: Vec<_> = queues.into_iter().map(|q| Mutex::new(Some(q))).collect();
    let ctx = links::WorkerCtx {
        cfg: cfg.clone(),
        tls: client_tls.clone(),
        shutdown: shutdown.clone(),
    };
    runtime::run_workers(queues.len(), cfg.driver, move |idx| {
        let queue = queues[idx].lock().expect("queue").take().expect("once");
        let (ctx, links) = (ctx.clone(), links.clone());
        let first = (idx == 0).then(|| Primary {
            cfg: cfg.clone(),
            tls: client_tls.clone(),
            shutdown: shutdown.clone(),
            admin: admin.lock().expect("admin").take().expect("once"),
        });
        async move {
            let jobs = monoio::spawn(links::serve_jobs(ctx, links.clone(), queue));
            if let Some(p) = first {
                p.run(links).await;
            }
            jobs.await;
            Ok(())
        }
    })?;
    let _ = control.join();
    tracing::info!("agent stopped");
    Ok(())
}

/// What worker 0 runs besides its share of the secondary links: the
/// health and admin listeners and, per server address, the primary
/// connections (slots).
struct Primary {
    cfg: Arc<AgentConfig>,
    tls: Arc<rustls::ClientConfig>,
    shutdown: Arc<signals::Shutdown>,
    admin: AdminListeners,
}

/// The health and admin listeners, and what their accept loops follow.
struct AdminListeners {
    /// Worker 0's sockets.
    sockets: Vec<listener::Listening<()>>,
    /// Raised when a successor took the listeners over.
    handed_over: Arc<signals::Shutdown>,
    /// The accept loops running (a successor waits for them to end).
    accepting: Arc<AtomicUsize>,
    /// Raised once the listeners may accept (after a predecessor, if any,
    /// stopped accepting on them).
    serving: Arc<signals::Shutdown>,
}

impl AdminListeners {
    /// Bound now so a bad address fails the start, or taken from an agent
    /// running at the handover socket; then [`handover::Handover`] runs.
    fn bind(
        cfg: &AgentConfig,
        shutdown: &Arc<signals::Shutdown>,
        handed_over: &Arc<signals::Shutdown>,
    ) -> Result<Self, BoxError> {
        let specs: Vec<_> = [("health", cfg.health_bind), ("admin", cfg.admin_bind)]
            .into_iter()
            .filter_map(|(name, addr)| {
                Some(listener::Spec {
                    kind: (),
                    name,
                    at: listener::Endpoint::Tcp(addr?),
                    spread: listener::Spread::FirstWorker,
                })
            })
            .collect();
        let mut successor = takeover::Successor::try_from_predecessor(
            cfg.handover_socket.as_deref(),
            &specs,
            "agent",
        );
        let bound = listener::bind_all_with(
            &specs,
            cfg.workers,
            Default::default(),
            successor.listener_sockets(),
        )?;
        let offer = successor.offering(&specs, &bound)?;
        for (what, addr) in &bound.addresses {
            cfg.announce.send(crate::readiness::Ready::Listen {
                what: what.to_string(),
                addr: addr.clone(),
            });
        }
        let admin = AdminListeners {
            sockets: bound.per_worker.into_iter().next().unwrap_or_default(),
            handed_over: handed_over.clone(),
            accepting: Arc::new(AtomicUsize::new(0)),
            serving: signals::Shutdown::new(),
        };
        handover::Handover {
            successor,
            offer,
            shutdown: shutdown.clone(),
            handed_over: handed_over.clone(),
            accepting: admin.accepting.clone(),
            linked: || crate::metrics::agent::metrics().linked_to_every_server(),
            serving: admin.serving.clone(),
        }
        .spawn()?;
        Ok(admin)
    }
}

impl Primary {
    /// Until every slot ended (shutdown and drain).
    async fn run(self, links: Arc<links::Links>) {
        let AdminListeners {
            sockets,
            handed_over,
            accepting,
            serving,
        } = self.admin;
        for l in sockets {
            let listener::Socket::Tcp(socket) = l.socket else {
                continue;
            };
            match monoio::net::TcpListener::from_std(socket) {
                Ok(socket) => {
                    let serve = crate::admin::serve(
                        socket,
                        l.name,
                        Rc::new(AgentAdmin),
                        Some(handed_over.clone()),
                    );
                    let (accepting, serving) = (accepting.clone(), serving.clone());
                    accepting.fetch_add(1, Ordering::SeqCst);
                    monoio::spawn(async move {
                        serving.wait(1).await;
                        serve.await;
                        accepting.fetch_sub(1, Ordering::SeqCst);
                    });
                }
                Err(e) => tracing::error!(listener = l.name, error = %e, "agent admin listener"),
            }
        }
        let mut tasks = Vec::new();
        for addr in self.cfg.servers.clone() {
            let ctx = Rc::new(ServerSlots {
                cfg: self.cfg.clone(),
                tls: self.tls.clone(),
                addr,
                connected: RefCell::new(HashSet::new()),
                slots: RefCell::new(0),
                reported: Cell::new(0),
                shutdown: self.shutdown.clone(),
                links: links.clone(),
            });
            if ctx.cfg.lease_count.is_some() {
                // The lease count changes without any server saying so.
                monoio::spawn(ServerSlots::follow_leases(ctx.clone()));
            }
            tasks.push(monoio::spawn(ServerSlots::start_slot(ctx)));
        }
        for t in tasks {
            t.await;
        }
        // Wait for late slots (spawned for serverCount > 1) to finish.
        while SLOTS_RUNNING.with(|s| *s.borrow()) > 0 {
            monoio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What the agent's health and admin listeners report.
struct AgentAdmin;

impl crate::admin::AdminState for AgentAdmin {
    fn metrics(&self) -> String {
        crate::metrics::agent::metrics().render()
    }

    fn ready(&self) -> Result<String, String> {
        match crate::metrics::agent::metrics().open_server_connections() {
            0 => Err("no connection to any proxy server".to_string()),
            n => Ok(format!("ok: {n} server connection(s)")),
        }
    }
}

thread_local! {
    static SLOTS_RUNNING: RefCell<usize> = const { RefCell::new(0) };
}

/// The connections an agent keeps to one server address: as many as the
/// server reports in `serverCount`, each to a distinct `serverID` (behind a
/// load balancer one address can reach several servers).
pub(crate) struct ServerSlots {
    cfg: Arc<AgentConfig>,
    tls: Arc<rustls::ClientConfig>,
    addr: String,
    connected: RefCell<HashSet<String>>,
    slots: RefCell<usize>,
    /// The last `serverCount` a server reported (0: none yet).
    reported: Cell<usize>,
    shutdown: Arc<signals::Shutdown>,
    /// The agent's secondary links (every server).
    links: Arc<links::Links>,
}

impl ServerSlots {
    async fn start_slot(self: Rc<Self>) {
        *self.slots.borrow_mut() += 1;
        SLOTS_RUNNING.with(|s| *s.borrow_mut() += 1);
        self.clone().slot_loop().await;
        SLOTS_RUNNING.with(|s| *s.borrow_mut() -= 1);
    }

    async fn slot_loop(self: Rc<Self>) {
        let mut backoff = Backoff::new(
            self.cfg.backoff_initial,
            self.cfg.backoff_max,
            self.cfg.backoff_reset_after,
        );
        let slot = Slot::default();
        let mut busy = backoff::BusyNotice::default();
        loop {
            if self.shutdown.requested() > 0 {
                return;
            }
            slot.established.set(None);
            let result = connection::run(self.clone(), &slot, None).await;
            if slot.established.get().is_some() {
                busy.reset();
            }
            if slot.replaced.get() {
                // A replacement slot took over when the server drained.
                return;
            }
            let ended = || match slot.established.get() {
                Some(established) => Attempt::Ended {
                    established,
                    ended: Instant::now(),
                },
                None => Attempt::Failed,
            };
            let attempt = match result {
                Ok(connection::Ended::Shutdown) => return,
                Ok(connection::Ended::Duplicate) => {
                    crate::metrics::agent::metrics().server_duplicate();
                    Attempt::Duplicate
                }
                // Only secondary links are refused this way.
                Ok(connection::Ended::WorkerTaken | connection::Ended::NotWanted) => {
                    Attempt::Failed
                }
                Ok(connection::Ended::Served) => ended(),
                // The server's handshake caps are full: back off quietly.
                Err(e) if slot.established.get().is_none() && backoff::is_busy(&*e) => {
                    Attempt::Busy
                }
                Err(e) => {
                    tracing::warn!(server = %self.addr, error = %e, "connection to server failed");
                    ended()
                }
            };
            let delay = backoff.next_delay(attempt);
            let up = match attempt {
                Attempt::Ended { established, ended } => {
                    Some(ended.saturating_duration_since(established))
                }
                _ => None,
            };
            // A duplicate (a second way to a server already connected)
            // is normal behind a load balancer.
            if matches!(attempt, Attempt::Busy) {
                busy.busy(&self.addr, delay);
            } else if matches!(attempt, Attempt::Duplicate) {
                tracing::debug!(server = %self.addr, ?delay, "reconnecting: duplicate of a connected server");
            } else {
                tracing::info!(server = %self.addr, ?delay, ?up, "reconnecting");
            }
            monoio::select! {
                _ = monoio::time::sleep(delay) => {}
                _ = self.shutdown.wait(1) => return,
            }
        }
    }

    /// The server of `slot`'s connection drains: a new slot connects in its
    /// place; `slot` ends with its connection.
    pub(crate) fn replace(self: &Rc<Self>, slot: &Slot) {
        if slot.replaced.replace(true) || self.shutdown.requested() > 0 {
            return;
        }
        *self.slots.borrow_mut() -= 1;
        monoio::spawn(ServerSlots::start_slot(self.clone()));
    }

    /// Called when a server reports its count: start more slots if needed.
    /// With `--count-server-leases` the lease count decides (or the larger
    /// of both with `--server-count-source max`), as with ANP's agent.
    fn want_slots(self: &Rc<Self>, reported: usize) {
        self.reported.set(reported);
        let server_count = match &self.cfg.lease_count {
            Some(lc) => lc.wanted(reported),
            None => reported,
        };
        crate::metrics::agent::metrics().set_known_servers(server_count);
        let have = *self.slots.borrow();
        for _ in have..server_count.min(64) {
            monoio::spawn(ServerSlots::start_slot(self.clone()));
        }
    }
}

impl ServerSlots {
    /// Rechecks the lease count every second until shutdown.
    async fn follow_leases(self: Rc<Self>) {
        loop {
            monoio::select! {
                _ = monoio::time::sleep(Duration::from_secs(1)) => {}
                _ = self.shutdown.wait(1) => return,
            }
            self.want_slots(self.reported.get());
        }
    }
}

/// What one slot (one of the connections to an address) carries from one
/// attempt to the next; `connection::run` reports into it. Each slot loop
/// has its own, as one `ServerSlots` runs several (serverCount > 1).
#[derive(Default)]
pub(crate) struct Slot {
    /// When the current attempt's connection was established.
    established: Cell<Option<Instant>>,
    /// Another slot took over (the server drains): do not reconnect.
    replaced: Cell<bool>,
}

impl Slot {
    /// The connection of this slot is up (TLS, HTTP/2 and the Connect
    /// stream accepted, not a duplicate).
    pub(crate) fn mark_established(&self) {
        self.established.set(Some(Instant::now()));
    }
}
