//! The agent's part in a handover (`--handover-socket`; the exchange is
//! [`engine::handover`], the steps shared with the server
//! [`engine::takeover`]). Two agents of one node overlap during a
//! DaemonSet rollout with `maxSurge`; on a host-network node they would
//! both bind the health and admin ports, which only one can. So the new
//! agent takes those listeners from the old one at start, links to the
//! servers, and only then confirms: the old agent stops accepting on them
//! (the new one accepts from then on: see `engine::takeover`'s
//! `await_accept_loops` for why not both at once) and drains (DRAIN on
//! each link, its tunnels finish within `--drain-grace-secs`), by which
//! time the servers have the new agent's links for the node's dials. No
//! dial finds the node without an agent.

use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::handover::{self as exchange, Incumbent, Offering, HANDOVER_LISTENER};
use engine::listener::UnixSocketFile;
use engine::signals::Shutdown;
use engine::takeover::{await_accept_loops, Successor};

/// How long a new agent waits for its links before it confirms anyway
/// (below the incumbent's 30 s wait for the confirmation).
const LINK_WAIT: Duration = Duration::from_secs(25);
/// How long an agent that handed over waits for its accept loops to end.
const STOP_ACCEPTING: Duration = Duration::from_secs(2);

/// What the handover thread needs.
pub(super) struct Handover {
    pub successor: Successor,
    pub offer: Vec<Offering>,
    /// The agent's drain.
    pub shutdown: Arc<Shutdown>,
    /// Raised when a successor took over (the admin accept loops stop).
    pub handed_over: Arc<Shutdown>,
    /// The admin and health accept loops running.
    pub accepting: Arc<AtomicUsize>,
    /// Whether the agent is linked to every server it should be.
    pub linked: fn() -> bool,
    /// Raised once this agent's admin listeners may accept: at once
    /// without a predecessor, else when it confirmed (it stopped
    /// accepting on them).
    pub serving: Arc<Shutdown>,
}

impl Handover {
    /// On a thread of its own (off the data plane): once linked, confirms
    /// to the predecessor, if any (it then drains); then answers the next
    /// successor at the same path.
    pub(super) fn spawn(self) -> std::io::Result<()> {
        if self.successor.path.is_none() {
            self.serving.trigger();
            return Ok(());
        }
        std::thread::Builder::new()
            .name("edgetunnel-agent-handover".into())
            .spawn(move || self.run())?;
        Ok(())
    }

    fn run(self) {
        let Handover {
            successor,
            offer,
            shutdown,
            handed_over,
            accepting,
            linked,
            serving,
        } = self;
        let Successor {
            path,
            taken,
            handover,
            may_replace,
            ..
        } = successor;
        let Some(path) = path else { return };
        if let Some(taken) = taken {
            let t = Instant::now();
            while !linked() && shutdown.requested() == 0 && t.elapsed() < LINK_WAIT {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !linked() {
                tracing::warn!(waited = ?t.elapsed(), "handover: not linked to every server yet; the predecessor drains all the same");
            }
            match taken.confirm() {
                Ok((pid, _)) => {
                    tracing::info!(predecessor = pid, linked_in = ?t.elapsed(), "handover: the predecessor drains")
                }
                Err(e) => tracing::warn!("handover: the predecessor did not confirm: {e}"),
            }
        }
        serving.trigger();
        let socket = match exchange::handover_listener(&path, handover, may_replace) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("{e}; no successor can take over from this agent");
                return;
            }
        };
        let guard = UnixSocketFile::existing(&path).ok();
        let stop = shutdown.clone();
        let on_taken = move |names: &[String]| -> Vec<PathBuf> {
            if let (Some(g), true) = (guard, names.iter().any(|n| n == HANDOVER_LISTENER)) {
                g.keep();
            }
            handed_over.trigger();
            shutdown.trigger();
            await_accept_loops(&[accepting], STOP_ACCEPTING);
            Vec::new()
        };
        match Incumbent::new(socket, &path, offer).spawn(stop, on_taken) {
            // The incumbent's thread ends with the process or the handover.
            Ok(t) => drop(t),
            Err(e) => {
                tracing::warn!("handover thread: {e}; no successor can take over from this agent")
            }
        }
    }
}
