//! A role's part in a listener handover ([`super::handover`] is the
//! exchange), shared by the server and the agent: at start, take the
//! listeners a running process of the same role offers at the handover
//! socket for this role's listener specs ([`Successor`]); once running,
//! offer this process's own ([`Successor::offering`]); and turn SIGTERM/SIGINT into
//! the role's drain with a pause for a successor that may still come
//! ([`signal_bridge`]).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::handover::{self as wire, Want};

use super::handover::{self as exchange, Offering, HANDOVER_LISTENER};
use super::listener::{self, Endpoint, Spec};
use super::signals::Shutdown;

/// A listener endpoint as the exchange names it.
fn wire_endpoint(e: &Endpoint) -> wire::Endpoint {
    match e {
        Endpoint::Tcp(a) => wire::Endpoint::Tcp(*a),
        Endpoint::Unix(p) => wire::Endpoint::Unix(p.clone()),
    }
}

/// What a starting process got from its predecessor, if anything.
pub struct Successor {
    /// The handover socket's path (`None`: no handover socket configured).
    pub path: Option<PathBuf>,
    /// The exchange, to confirm once this process serves.
    pub taken: Option<exchange::Takeover>,
    /// Per listener spec, the sockets passed for it.
    sockets: Vec<Vec<OwnedFd>>,
    /// The handover socket itself, when passed.
    pub handover: Option<OwnedFd>,
    /// Whether a socket file at the path may be replaced (nobody answered
    /// there); not after a failed exchange with a live process.
    pub may_replace: bool,
}

impl Successor {
    /// Takes the listeners of the `role` process ("server", "agent")
    /// running at `path`, if one runs there. A failed exchange is logged
    /// and the process binds its own listeners (which fails clearly while
    /// the other one holds them).
    pub fn try_from_predecessor<K>(path: Option<&Path>, specs: &[Spec<K>], role: &str) -> Self {
        let mut t = Successor {
            path: path.map(Path::to_path_buf),
            taken: None,
            sockets: Vec::new(),
            handover: None,
            may_replace: true,
        };
        let Some(path) = path else {
            return t;
        };
        let mut endpoints: Vec<wire::Endpoint> =
            specs.iter().map(|s| wire_endpoint(&s.at)).collect();
        endpoints.push(wire::Endpoint::Unix(path.to_path_buf()));
        let mut wanted: Vec<Want<'_>> = specs
            .iter()
            .zip(&endpoints)
            .map(|(s, e)| Want {
                name: s.name,
                endpoint: e,
            })
            .collect();
        wanted.push(Want {
            name: HANDOVER_LISTENER,
            endpoint: &endpoints[specs.len()],
        });
        match exchange::take_over(path, &wanted) {
            Ok(None) => {
                tracing::info!(path = %path.display(), "handover: no {role} to take over from; binding the listeners");
            }
            Ok(Some(mut taken)) => {
                let mut sockets = std::mem::take(&mut taken.sockets);
                t.handover = sockets.pop().and_then(|v| v.into_iter().next());
                tracing::info!(
                    incumbent = taken.incumbent,
                    version = taken.version,
                    taken = ?taken.taken(),
                    "handover: took the listening sockets of the running {role}"
                );
                t.sockets = sockets;
                t.taken = Some(taken);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "{e}; binding the listeners");
                t.may_replace = false;
            }
        }
        t
    }

    /// The sockets passed for each spec, for [`listener::bind_all_with`].
    pub fn listener_sockets(&mut self) -> Vec<Vec<OwnedFd>> {
        std::mem::take(&mut self.sockets)
    }

    /// Whether the listeners came from a predecessor.
    pub fn taken(&self) -> bool {
        self.taken.is_some()
    }

    /// What this process offers a successor: per listener of `specs` its
    /// distinct sockets (a TCP listener's SO_REUSEPORT group, one socket
    /// of a unix listener), duplicated for the handover thread; nothing
    /// without a handover socket.
    pub fn offering<K>(
        &self,
        specs: &[Spec<K>],
        bound: &listener::Bound<K>,
    ) -> std::io::Result<Vec<Offering>> {
        if self.path.is_none() {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            let mut seen = Vec::new();
            let mut sockets = Vec::new();
            let mut endpoint = wire_endpoint(&spec.at);
            for l in bound
                .per_worker
                .iter()
                .flatten()
                .filter(|l| l.name == spec.name)
            {
                let (id, fd) = match &l.socket {
                    listener::Socket::Tcp(s) => {
                        // The port the kernel chose for port 0.
                        endpoint = wire::Endpoint::Tcp(s.local_addr()?);
                        (
                            super::fd_ref::Identity::of(s),
                            OwnedFd::from(s.try_clone()?),
                        )
                    }
                    listener::Socket::Unix(s) => (
                        super::fd_ref::Identity::of(s),
                        OwnedFd::from(s.try_clone()?),
                    ),
                };
                if id.is_some() && seen.contains(&id) {
                    continue;
                }
                seen.push(id);
                sockets.push(fd);
            }
            out.push(Offering {
                name: spec.name.to_string(),
                endpoint,
                sockets,
            });
        }
        Ok(out)
    }
}

/// Waits until every accept loop counted by `accepting` ended, for up to
/// `within`: a successor starts accepting once told that this process
/// drains. On io_uring an accept waits on the listening socket with an
/// exclusive wake-up: a connection that woke an accept of ours as it was
/// being cancelled wakes nobody else, and would wait in the queue until the
/// next connection came. Once ours are gone, the successor's first accept
/// finds it there.
pub fn await_accept_loops(accepting: &[Arc<std::sync::atomic::AtomicUsize>], within: Duration) {
    let running = || {
        accepting
            .iter()
            .map(|a| a.load(std::sync::atomic::Ordering::SeqCst))
            .sum::<usize>()
    };
    let deadline = Instant::now() + within;
    while running() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let left = running();
    if left > 0 {
        tracing::warn!(
            accept_loops = left,
            "handover: accept loops still running after {within:?}"
        );
    }
}

/// The process's shutdown latches: `(shutdown, handed_over)`. SIGTERM and
/// SIGINT raise `shutdown` directly, or with `handover` (a handover
/// socket's wait, `--handover-wait-secs`) through [`signal_bridge`];
/// SIGHUP calls `on_hangup`. `handed_over` is raised when a successor took
/// over.
pub fn install_signals(
    handover: Option<Duration>,
    on_hangup: impl Fn() + Send + 'static,
) -> std::io::Result<(Arc<Shutdown>, Arc<Shutdown>)> {
    let shutdown = Shutdown::new();
    let handed_over = Shutdown::new();
    // With a handover socket the signals go through a thread of their own
    // (started after the signals are blocked, which its mask inherits).
    let signalled = match handover {
        None => shutdown.clone(),
        Some(_) => Shutdown::new(),
    };
    super::signals::install(signalled.clone(), on_hangup)?;
    if let Some(wait) = handover {
        signal_bridge(signalled, shutdown.clone(), handed_over.clone(), wait)?;
    }
    Ok((shutdown, handed_over))
}

/// Signals of a process with a handover socket: SIGTERM/SIGINT raise
/// `s`, and this thread turns them into the process's drain. The
/// first one, when no successor took over yet, keeps the process serving
/// for up to `wait` while a successor may still come (a DaemonSet rolled
/// with `maxSurge` deletes the old pod once the new one runs, which may be
/// a moment before the new one took over); past it the process drains as
/// without a handover socket. After a handover the process already drains,
/// and the first signal changes nothing. The second one ends the drain.
fn signal_bridge(
    s: Arc<Shutdown>,
    shutdown: Arc<Shutdown>,
    handed_over: Arc<Shutdown>,
    wait: Duration,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("edgetunnel-handover-wait".into())
        .spawn(move || {
            s.wait_blocking(1);
            if handed_over.requested() == 0 && shutdown.requested() == 0 {
                tracing::info!(wait = ?wait, "shutdown signal: serving on while a successor may still take over");
                let deadline = Instant::now() + wait;
                while handed_over.requested() == 0
                    && s.requested() < 2
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if handed_over.requested() == 0 {
                    shutdown.trigger();
                }
            }
            s.wait_blocking(2);
            while shutdown.requested() < 2 {
                shutdown.trigger();
            }
        })?;
    Ok(())
}
