//! The server's part in a listener handover (`--handover-socket`; the
//! exchange is [`crate::engine::handover`]): at start, take the listeners
//! of a server running there ([`Takeover::try_from_predecessor`]); once
//! serving, confirm to it and answer the next successor
//! ([`Takeover::confirm_and_listen`]). When a successor takes over, the
//! socket files it took stay in place, the admin listeners stop, the
//! control thread leaves its iptables rules, and the server drains as on
//! SIGTERM.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::engine::handover::{self as engine_handover, Incumbent, Offering, HANDOVER_LISTENER};
use crate::engine::listener::{self, Endpoint, Spec, UnixSocketFile};
use crate::protocol::handover::{self as wire, Want};

use super::listeners::Kind;
use super::ServerConfig;

/// How long a server that handed over waits for its accept loops to end
/// before telling the successor that it drains.
const STOP_ACCEPTING: std::time::Duration = std::time::Duration::from_secs(2);

/// What a starting server got from its predecessor, if anything.
pub(super) struct Takeover {
    path: Option<PathBuf>,
    taken: Option<engine_handover::Takeover>,
    /// Per listener spec, the sockets passed for it.
    sockets: Vec<Vec<OwnedFd>>,
    /// The handover socket itself, when passed.
    handover: Option<OwnedFd>,
    /// Whether a socket file at the path may be replaced (nobody answered
    /// there); not after a failed exchange with a live server.
    may_replace: bool,
}

fn wire_endpoint(e: &Endpoint) -> wire::Endpoint {
    match e {
        Endpoint::Tcp(a) => wire::Endpoint::Tcp(*a),
        Endpoint::Unix(p) => wire::Endpoint::Unix(p.clone()),
    }
}

impl Takeover {
    /// Takes the listeners of the server at `--handover-socket`, if one
    /// runs there. A failed exchange is logged and the server binds its
    /// own listeners (which fails clearly while the other one holds them).
    pub(super) fn try_from_predecessor(cfg: &ServerConfig, specs: &[Spec<Kind>]) -> Takeover {
        let mut t = Takeover {
            path: cfg.handover_socket.clone(),
            taken: None,
            sockets: Vec::new(),
            handover: None,
            may_replace: true,
        };
        let Some(path) = &cfg.handover_socket else {
            return t;
        };
        let mut endpoints: Vec<wire::Endpoint> =
            specs.iter().map(|s| wire_endpoint(&s.at)).collect();
        endpoints.push(wire::Endpoint::Unix(path.clone()));
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
        match engine_handover::take_over(path, &wanted) {
            Ok(None) => {
                tracing::info!(path = %path.display(), "handover: no server to take over from; binding the listeners");
            }
            Ok(Some(mut taken)) => {
                let mut sockets = std::mem::take(&mut taken.sockets);
                t.handover = sockets.pop().and_then(|v| v.into_iter().next());
                tracing::info!(
                    incumbent = taken.incumbent,
                    version = taken.version,
                    taken = ?taken.taken(),
                    "handover: took the listening sockets of the running server"
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
    pub(super) fn listener_sockets(&mut self) -> Vec<Vec<OwnedFd>> {
        std::mem::take(&mut self.sockets)
    }

    /// Whether the listeners came from a predecessor.
    pub(super) fn taken(&self) -> bool {
        self.taken.is_some()
    }

    /// Confirms to the predecessor (it then drains), then answers the next
    /// successor on a thread of its own. `files` are the socket files this
    /// server removes when it ends; those a successor takes stay.
    pub(super) fn confirm_and_listen(
        self,
        shared: &super::ServerState,
        forward: Option<PathBuf>,
        offer: Vec<Offering>,
        files: Arc<Mutex<Vec<UnixSocketFile>>>,
    ) -> Option<std::thread::JoinHandle<()>> {
        let predecessor = &shared.predecessor;
        let accepting = [shared.accepting.clone(), shared.accepting_admin.clone()];
        let shutdown = shared.shutdown.clone();
        let handed_over = shared.handed_over.clone();
        let path = self.path?;
        if let Some(taken) = self.taken {
            match taken.confirm() {
                Ok((pid, paths)) => {
                    tracing::info!(predecessor = pid, forward = ?paths, "handover: the predecessor drains");
                    predecessor.set_paths(paths);
                }
                Err(e) => tracing::warn!("handover: the predecessor did not confirm: {e}"),
            }
        }
        let socket =
            match engine_handover::handover_listener(&path, self.handover, self.may_replace) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("{e}; no successor can take over from this server");
                    return None;
                }
            };
        let guard = UnixSocketFile::existing(&path).ok();
        let unix_paths: Vec<(String, PathBuf)> = offer
            .iter()
            .filter_map(|o| match &o.endpoint {
                wire::Endpoint::Unix(p) => Some((o.name.clone(), p.clone())),
                wire::Endpoint::Tcp(_) => None,
            })
            .collect();
        let stop = shutdown.clone();
        let predecessors = shared.predecessor.clone();
        let on_taken = move |names: &[String]| -> Vec<PathBuf> {
            let taken = |n: &str| names.iter().any(|t| t == n);
            let kept: Vec<&PathBuf> = unix_paths
                .iter()
                .filter(|(n, _)| taken(n))
                .map(|(_, p)| p)
                .collect();
            let mut files = files.lock().expect("socket files");
            let (keep, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut *files)
                .into_iter()
                .partition(|f| kept.iter().any(|p| f.path() == p.as_path()));
            *files = rest;
            keep.into_iter().for_each(UnixSocketFile::keep);
            if let (Some(g), true) = (guard, taken(HANDOVER_LISTENER)) {
                g.keep();
            }
            handed_over.trigger();
            shutdown.trigger();
            // The successor starts accepting once told that this process
            // drains, and that waits until no accept of ours is pending.
            // On io_uring an accept waits on the listening socket with an
            // exclusive wake-up: a connection that woke an accept of ours
            // as it was being cancelled wakes nobody else, and would wait
            // in the queue until the next connection came. Once ours are
            // gone, the successor's first accept finds it there.
            let running = || {
                accepting
                    .iter()
                    .map(|a| a.load(std::sync::atomic::Ordering::SeqCst))
                    .sum::<usize>()
            };
            let deadline = std::time::Instant::now() + STOP_ACCEPTING;
            while running() > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let left = running();
            if left > 0 {
                tracing::warn!(
                    accept_loops = left,
                    "handover: accept loops still running after {STOP_ACCEPTING:?}"
                );
            }
            // Where the successor may send dials it has no agent for: here,
            // then where this server sent them (a Go agent may still be
            // linked to an older server only).
            forward
                .iter()
                .cloned()
                .chain(predecessors.running_paths())
                .collect()
        };
        match Incumbent::new(socket, &path, offer).spawn(stop, on_taken) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!("handover thread: {e}; no successor can take over from this server");
                None
            }
        }
    }
}

/// What this server offers a successor: per listener its distinct sockets
/// (a TCP listener's SO_REUSEPORT group, one socket of a unix listener),
/// duplicated for the handover thread.
pub(super) fn offering(
    specs: &[Spec<Kind>],
    bound: &listener::Bound<Kind>,
) -> std::io::Result<Vec<Offering>> {
    let mut out = Vec::with_capacity(specs.len());
    // The forward socket is this process's own (a successor has another).
    for spec in specs.iter().filter(|s| s.kind != Kind::Forward) {
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
                        crate::engine::fd_ref::Identity::of(s),
                        OwnedFd::from(s.try_clone()?),
                    )
                }
                listener::Socket::Unix(s) => (
                    crate::engine::fd_ref::Identity::of(s),
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

/// Signals of a server with `--handover-socket`: SIGTERM/SIGINT raise
/// `s`, and this thread turns them into the server's drain. The
/// first one, when no successor took over yet, keeps the server serving
/// for up to `wait` while a successor may still come (a DaemonSet rolled
/// with `maxSurge` deletes the old pod once the new one runs, which may be
/// a moment before the new one took over); past it the server drains as
/// without a handover socket. After a handover the server already drains,
/// and the first signal changes nothing. The second one ends the drain.
pub(super) fn signal_bridge(
    s: Arc<crate::engine::signals::Shutdown>,
    shutdown: Arc<crate::engine::signals::Shutdown>,
    handed_over: Arc<crate::engine::signals::Shutdown>,
    wait: std::time::Duration,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("edgetunnel-handover-wait".into())
        .spawn(move || {
            s.wait_blocking(1);
            if handed_over.requested() == 0 && shutdown.requested() == 0 {
                tracing::info!(wait = ?wait, "shutdown signal: serving on while a successor may still take over");
                let deadline = std::time::Instant::now() + wait;
                while handed_over.requested() == 0
                    && s.requested() < 2
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
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
