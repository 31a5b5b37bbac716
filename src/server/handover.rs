//! The server's part in a listener handover (`--handover-socket`; the
//! exchange is [`engine::handover`]): at start, take the listeners
//! of a server running there ([`Takeover::try_from_predecessor`]); once
//! serving, confirm to it and answer the next successor
//! ([`Takeover::confirm_and_listen`]). When a successor takes over, the
//! socket files it took stay in place, the admin listeners stop, the
//! control thread leaves its iptables rules, and the server drains as on
//! SIGTERM.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use engine::handover::{self as engine_handover, Incumbent, Offering, HANDOVER_LISTENER};
use engine::listener::{Spec, UnixSocketFile};
use engine::takeover::Successor;
use protocol::handover as wire;

use super::listeners::Kind;
use super::ServerConfig;

/// How long a server that handed over waits for its accept loops to end
/// before telling the successor that it drains.
const STOP_ACCEPTING: std::time::Duration = std::time::Duration::from_secs(2);

/// What a starting server got from its predecessor, if anything.
pub(super) struct Takeover(Successor);

impl Takeover {
    /// Takes the listeners of the server at `--handover-socket`, if one
    /// runs there.
    pub(super) fn try_from_predecessor(cfg: &ServerConfig, specs: &[Spec<Kind>]) -> Takeover {
        Takeover(Successor::try_from_predecessor(
            cfg.handover_socket.as_deref(),
            specs,
            "server",
        ))
    }

    /// The sockets passed for each spec, for [`listener::bind_all_with`].
    pub(super) fn listener_sockets(&mut self) -> Vec<Vec<std::os::fd::OwnedFd>> {
        self.0.listener_sockets()
    }

    /// Whether the listeners came from a predecessor.
    pub(super) fn taken(&self) -> bool {
        self.0.taken()
    }

    /// What this server offers a successor: every listener but the
    /// forward socket, which is this process's own (a successor has
    /// another).
    pub(super) fn offering(
        &self,
        specs: &[Spec<Kind>],
        bound: &engine::listener::Bound<Kind>,
    ) -> std::io::Result<Vec<Offering>> {
        let offered: Vec<Spec<Kind>> = specs
            .iter()
            .filter(|s| s.kind != Kind::Forward)
            .cloned()
            .collect();
        self.0.offering(&offered, bound)
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
        let Successor {
            path,
            taken,
            handover,
            may_replace,
            ..
        } = self.0;
        let path = path?;
        if let Some(taken) = taken {
            match taken.confirm() {
                Ok((pid, paths)) => {
                    tracing::info!(predecessor = pid, forward = ?paths, "handover: the predecessor drains");
                    predecessor.set_paths(paths);
                }
                Err(e) => tracing::warn!("handover: the predecessor did not confirm: {e}"),
            }
        }
        let socket = match engine_handover::handover_listener(&path, handover, may_replace) {
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
            engine::takeover::await_accept_loops(&accepting, STOP_ACCEPTING);
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
