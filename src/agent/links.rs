//! Secondary links: the extra connections an agent keeps to an edgetunnel
//! server, one per server worker (see [`protocol::anp::agent_links`]),
//! spread over the agent's own worker threads so that each link's tunnels
//! run on one core at each end.
//!
//! The first connection to a server (a "slot", [`super::ServerSlots`])
//! learns the server's worker count and asks [`Links::ensure`] for the
//! missing links; each runs [`secondary_loop`] on one of the agent's
//! workers: it connects, is refused while it lands on a worker already
//! linked (a bounded number of times), serves, and reconnects after a
//! failure until the server no longer wants it (another server ID, no
//! primary link), drains, or the agent shuts down. A "busy" answer (the
//! server's handshake caps are full, [`super::backoff::is_busy`]) backs off
//! like the primary link does and does not count toward giving up: a
//! restarted server refuses many links for a while, and every one should
//! come back.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::StreamExt;

use super::backoff::{self, Attempt, Backoff, BusyNotice};
use super::connection::{self, Ended};
use super::{AgentConfig, ServerSlots, Slot, SLOTS_RUNNING};
use engine::signals;
use protocol::anp::agent_links::STEER_ATTEMPTS;

/// Failed attempts in a row after which a secondary link gives up (the
/// primary link asks again when it reconnects).
const GIVE_UP_AFTER: u32 = 5;

/// A secondary link to start.
pub(crate) struct Job {
    addr: String,
    server_id: String,
}

/// The agent's secondary links, shared by its worker threads.
pub(crate) struct Links {
    /// This agent process's token, sent on every link.
    pub(crate) instance: String,
    /// Secondary links running, by (address, server ID).
    running: Mutex<HashMap<(String, String), usize>>,
    /// One queue per agent worker (0: the main thread).
    workers: Vec<mpsc::UnboundedSender<Job>>,
    next: AtomicUsize,
}

impl Links {
    /// Starts secondary links until `wanted` run to `server_id` at `addr`.
    pub(crate) fn ensure(&self, addr: &str, server_id: &str, wanted: usize) {
        if wanted == 0 || server_id.is_empty() || self.workers.is_empty() {
            return;
        }
        let mut running = self.running.lock().expect("links lock");
        let have = running
            .entry((addr.to_string(), server_id.to_string()))
            .or_insert(0);
        while *have < wanted {
            *have += 1;
            // The first secondary goes to worker 1: the primary runs on 0.
            let w = self.next.fetch_add(1, Ordering::Relaxed) % self.workers.len();
            let job = Job {
                addr: addr.to_string(),
                server_id: server_id.to_string(),
            };
            if self.workers[w].unbounded_send(job).is_err() {
                *have -= 1;
                return;
            }
        }
    }

    fn done(&self, addr: &str, server_id: &str) {
        let mut running = self.running.lock().expect("links lock");
        let key = (addr.to_string(), server_id.to_string());
        if let Some(n) = running.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                running.remove(&key);
            }
        }
    }
}

/// What a link worker needs to run links.
#[derive(Clone)]
pub(crate) struct WorkerCtx {
    pub(crate) cfg: Arc<AgentConfig>,
    pub(crate) tls: Arc<rustls::ClientConfig>,
    pub(crate) shutdown: Arc<signals::Shutdown>,
}

/// Builds the shared [`Links`] for `workers` agent workers and the job
/// queues to serve with [`serve_jobs`] (index 0 on the main thread).
pub(crate) fn new(workers: usize, seed: u64) -> (Arc<Links>, Vec<mpsc::UnboundedReceiver<Job>>) {
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..workers.max(1)).map(|_| mpsc::unbounded()).unzip();
    let links = Links {
        instance: protocol::anp::agent_links::instance_token(seed),
        running: Mutex::new(HashMap::new()),
        workers: txs,
        next: AtomicUsize::new(1),
    };
    (Arc::new(links), rxs)
}

/// Runs the secondary links queued for this worker until shutdown, then
/// waits for them to drain.
pub(crate) async fn serve_jobs(
    ctx: WorkerCtx,
    links: Arc<Links>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
) {
    loop {
        let job = monoio::select! {
            j = jobs.next() => j,
            _ = ctx.shutdown.wait(1) => None,
        };
        let Some(job) = job else { break };
        monoio::spawn(secondary_loop(ctx.clone(), links.clone(), job));
    }
    while SLOTS_RUNNING.with(|s| *s.borrow()) > 0 {
        monoio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn secondary_loop(ctx: WorkerCtx, links: Arc<Links>, job: Job) {
    SLOTS_RUNNING.with(|s| *s.borrow_mut() += 1);
    let slots = Rc::new(ServerSlots {
        cfg: ctx.cfg.clone(),
        tls: ctx.tls.clone(),
        addr: job.addr.clone(),
        connected: RefCell::new(HashSet::new()),
        slots: RefCell::new(0),
        reported: Cell::new(0),
        shutdown: ctx.shutdown.clone(),
        links: links.clone(),
    });
    let cfg = &ctx.cfg;
    let mut backoff = Backoff::new(
        cfg.backoff_initial,
        cfg.backoff_max,
        cfg.backoff_reset_after,
    );
    let slot = Slot::default();
    let mut busy = BusyNotice::default();
    let (mut steered, mut failures) = (0u32, 0u32);
    loop {
        if ctx.shutdown.requested() > 0 {
            break;
        }
        slot.established.set(None);
        let result = connection::run(slots.clone(), &slot, Some(&job.server_id)).await;
        if slot.replaced.get() {
            // The server drains: the primary link finds the next server.
            break;
        }
        let attempt = match result {
            Ok(Ended::Shutdown) | Ok(Ended::NotWanted) => break,
            Ok(Ended::WorkerTaken) => {
                steered += 1;
                if steered < STEER_ATTEMPTS {
                    continue;
                }
                // A round of attempts all landed on linked workers: wait
                // (backoff) and try another round, up to GIVE_UP_AFTER
                // rounds, rather than give the link up at once; landings
                // were seen to repeat a worker far more often than chance.
                steered = 0;
                failures += 1;
                if failures >= GIVE_UP_AFTER {
                    tracing::debug!(server = %job.addr, "no free server worker reached; link given up");
                    break;
                }
                tracing::debug!(server = %job.addr, "no free server worker reached in a round; retrying");
                Attempt::Failed
            }
            Ok(Ended::Duplicate) => Attempt::Duplicate,
            Err(e) if slot.established.get().is_none() && backoff::is_busy(&*e) => {
                let delay = backoff.next_delay(Attempt::Busy);
                busy.busy(&job.addr, delay);
                monoio::select! {
                    _ = monoio::time::sleep(delay) => {}
                    _ = ctx.shutdown.wait(1) => break,
                }
                continue;
            }
            Ok(Ended::Served) | Err(_) => {
                if let Err(e) = &result {
                    tracing::debug!(server = %job.addr, error = %e, "secondary link failed");
                }
                match slot.established.get() {
                    Some(established) => {
                        (steered, failures) = (0, 0);
                        busy.reset();
                        Attempt::Ended {
                            established,
                            ended: Instant::now(),
                        }
                    }
                    None => {
                        failures += 1;
                        if failures >= GIVE_UP_AFTER {
                            break;
                        }
                        Attempt::Failed
                    }
                }
            }
        };
        let delay = backoff.next_delay(attempt);
        monoio::select! {
            _ = monoio::time::sleep(delay) => {}
            _ = ctx.shutdown.wait(1) => break,
        }
    }
    links.done(&job.addr, &job.server_id);
    SLOTS_RUNNING.with(|s| *s.borrow_mut() -= 1);
}
