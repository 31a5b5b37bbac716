//! The upgrade scenario (`--scenarios upgrade`, issue 45): what a server's
//! replacement costs its callers. Each system, alone on the machine, gets
//! an open-loop load of [`UpgradePlan::rate`] dials a second (each: a
//! tunnel opened, 1 KiB echoed, closed in order; every dial its own task,
//! so a server that refuses meanwhile is asked as often as kube-apiserver
//! would ask it) while its server is replaced [`UpgradePlan::restarts`]
//! times. Before each replacement [`UpgradePlan::held`] tunnels are
//! opened that echo 1 KiB every 100 ms for [`UpgradePlan::hold`]: the
//! `exec` sessions and `logs -f` open at the moment of the upgrade.
//!
//! edgetunnel is replaced through its listener handover (a new server on
//! the same `--handover-socket` takes the listeners; the old one drains)
//! and, as a second anchor, by a plain restart (SIGTERM, wait for the
//! exit, start again); the Go ANP by its only way, the plain restart. Both
//! plain restarts keep the default graceful timeout, 0: the server exits
//! at once.
//!
//! Recorded per replacement (the repetition): the dials started from it
//! until the next one and how many failed, the longest of them, the held
//! tunnels cut, how long until the new server carried tunnels, and how
//! long the old one took to go. Measured and reported, never asserted
//! (the tests assert the handover: `tests/tunnel/handover.rs`,
//! `tests/peers/kube_handover.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{self, Entry};
use crate::model::SystemKind;
use crate::scenarios::{self, Close};
use crate::systems::{self, RestartHow, Running, StartOptions, GRACEFUL_SECS};
use crate::upgrade_table::{self as table, SCENARIO};
use crate::Harness;

/// A dial slower than this counts as failed.
const DIAL_TIMEOUT: Duration = Duration::from_secs(20);
/// Interval of a held tunnel's echoes.
const ECHO_EVERY: Duration = Duration::from_millis(100);

/// Sizes and durations of one mode.
pub(crate) struct UpgradePlan {
    /// Replacements of the server per system.
    pub restarts: usize,
    /// Dials started per second, open loop.
    pub rate: f64,
    /// Tunnels held open across each replacement, and for how long each.
    pub held: usize,
    pub hold: Duration,
    /// From one replacement's start to the next one's (at least).
    pub settle: Duration,
    /// Load before the first replacement.
    pub warm: Duration,
}

impl UpgradePlan {
    pub(crate) fn new(quick: bool) -> UpgradePlan {
        UpgradePlan {
            restarts: if quick { 1 } else { 3 },
            rate: 50.0,
            held: if quick { 3 } else { 5 },
            hold: Duration::from_secs(if quick { 3 } else { 6 }),
            settle: Duration::from_secs(if quick { 5 } else { 10 }),
            warm: Duration::from_secs(if quick { 1 } else { 3 }),
        }
    }
}

/// One dial of the load.
struct Dial {
    at: Instant,
    took: Duration,
    error: Option<String>,
}

/// One replacement of the server.
struct Replacement {
    at: Instant,
    restarted: Result<systems::Restarted, String>,
    /// Held tunnels cut, with what the first one said.
    cut: usize,
    first_cut: Option<String>,
    /// Handover: from the start until the old server exited (None: it
    /// had not within the graceful timeout and a margin).
    old_gone: Option<Duration>,
}

impl Harness {
    /// The upgrade scenario: each system in turn under the dial load while
    /// its server is replaced `plan.restarts` times.
    pub(crate) fn upgrade(
        &mut self,
        rt: &tokio::runtime::Runtime,
        targets: &[std::net::SocketAddr],
        plan: &UpgradePlan,
    ) {
        println!(
            "== upgrade: {} dials/s and {} tunnels held across each of {} server replacement(s) per system",
            plan.rate, plan.held, plan.restarts
        );
        self.note(format!(
            "upgrade: one system at a time; {} dials a second started open loop (each opens a tunnel, \
             echoes 1 KiB and closes; failed after an error or {} s), {} s of load before the first \
             replacement, at least {} s from one to the next; before each, {} tunnels opened that echo \
             1 KiB every {} ms for {} s; through a handover the old edgetunnel server drains for up \
             to {GRACEFUL_SECS} s (--graceful-shutdown-timeout-secs); a plain restart (edgetunnel's and \
             the Go ANP's) keeps the default graceful timeout, 0: the server exits at once",
            plan.rate,
            DIAL_TIMEOUT.as_secs(),
            plan.warm.as_secs(),
            plan.settle.as_secs(),
            plan.held,
            ECHO_EVERY.as_millis(),
            plan.hold.as_secs()
        ));
        for (kind, opts) in self.upgrade_variants() {
            let mut run = match systems::start(kind, targets, &opts) {
                Ok(run) => run,
                Err(e) if kind.is_anp() && !self.strict => {
                    self.note(format!("upgrade: {} not run: {e}", kind.name()));
                    continue;
                }
                Err(e) => {
                    self.fail(&format!("upgrade: starting {}", kind.name()), e);
                    continue;
                }
            };
            run.label.push_str(if opts.handover {
                " handover"
            } else {
                " plain restart"
            });
            println!("started {}", run.label);
            let how = if opts.handover {
                RestartHow::Handover
            } else {
                RestartHow::Plain
            };
            self.upgrade_one(rt, &mut run, how, plan);
        }
        print!("{}", table::table(&self.samples));
    }

    /// The systems and how each is replaced: edgetunnel's CONNECT frontend
    /// on a unix socket (as kube-apiserver dials it) with our agent and
    /// with ANP's Go agent, and its gRPC frontend, each through the
    /// handover; CONNECT with a plain restart; the Go ANP (unix socket
    /// CONNECT and gRPC) with a plain restart.
    fn upgrade_variants(&mut self) -> Vec<(SystemKind, StartOptions)> {
        let base = self.opts(None, 1024);
        let uds = StartOptions {
            connect_uds: true,
            ..base.clone()
        };
        let handover = |o: &StartOptions| StartOptions {
            handover: true,
            ..o.clone()
        };
        let all = [
            (SystemKind::EdgetunnelConnect, handover(&uds)),
            (
                SystemKind::EdgetunnelConnect,
                handover(&StartOptions {
                    go_agent: true,
                    ..uds.clone()
                }),
            ),
            (SystemKind::EdgetunnelGrpc, handover(&base)),
            (SystemKind::EdgetunnelConnect, uds.clone()),
            (SystemKind::AnpUds, base.clone()),
            (SystemKind::AnpGrpc, base.clone()),
        ];
        let mut out = Vec::new();
        for (k, o) in all {
            if !self.systems.contains(&k) {
                continue;
            }
            match systems::available(k, &o) {
                Ok(()) => out.push((k, o)),
                Err(e) => self.note(format!("upgrade: {}: {e}", k.name())),
            }
        }
        out
    }

    fn upgrade_one(
        &mut self,
        rt: &tokio::runtime::Runtime,
        run: &mut Running,
        how: RestartHow,
        plan: &UpgradePlan,
    ) {
        let entries = Arc::new(run.entries.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let load = rt.spawn(dials(entries.clone(), plan.rate, stop.clone(), log.clone()));
        std::thread::sleep(plan.warm);
        let mut done = Vec::new();
        for r in 0..plan.restarts {
            let held: Vec<_> = (0..plan.held)
                .map(|k| {
                    let e = entries[k % entries.len()].clone();
                    rt.spawn(hold(e, plan.hold, (r * 16 + k) as u8))
                })
                .collect();
            // Let them open on the old server.
            std::thread::sleep(Duration::from_millis(300));
            let at = Instant::now();
            let restarted = run.restart_server();
            match &restarted {
                Ok(x) => println!(
                    "  [upgrade] {} replacement {}: new server ready after {:.2} s",
                    run.label,
                    r + 1,
                    x.ready.as_secs_f64()
                ),
                Err(e) => eprintln!("  [upgrade] {} replacement {}: {e}", run.label, r + 1),
            }
            let results = rt.block_on(futures::future::join_all(held));
            let errors: Vec<String> = results
                .into_iter()
                .filter_map(|j| match j {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e),
                    Err(e) => Some(e.to_string()),
                })
                .collect();
            let old_gone = (how == RestartHow::Handover).then(|| {
                let deadline = at + Duration::from_secs(GRACEFUL_SECS + 5);
                while run.retired_running() > 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                (run.retired_running() == 0).then(|| at.elapsed())
            });
            std::thread::sleep((at + plan.settle).saturating_duration_since(Instant::now()));
            done.push(Replacement {
                at,
                restarted,
                cut: errors.len(),
                first_cut: errors.into_iter().next(),
                old_gone: old_gone.flatten(),
            });
        }
        stop.store(true, Ordering::SeqCst);
        if let Err(e) = rt.block_on(load) {
            self.fail(&format!("upgrade via {}: the load", run.label), e);
        }
        let dials = std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()));
        self.record_upgrade(&run.label, plan, &done, &dials);
    }

    fn record_upgrade(
        &mut self,
        system: &str,
        plan: &UpgradePlan,
        done: &[Replacement],
        dials: &[Dial],
    ) {
        let rec = |h: &mut Harness, case: &str, metric: &str, v: f64, rep: usize| {
            h.record(
                SCENARIO,
                case,
                system,
                metric,
                v,
                rep as u32,
                false,
                Vec::new(),
            );
        };
        let first = done.first().map(|d| d.at);
        let steady: Vec<&Dial> = dials
            .iter()
            .filter(|d| first.is_none_or(|f| d.at < f))
            .collect();
        rec(self, table::STEADY, table::DIALS, steady.len() as f64, 0);
        rec(
            self,
            table::STEADY,
            table::FAILED,
            steady.iter().filter(|d| d.error.is_some()).count() as f64,
            0,
        );
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for (r, d) in done.iter().enumerate() {
            let end = done.get(r + 1).map(|n| n.at);
            let window: Vec<&Dial> = dials
                .iter()
                .filter(|x| x.at >= d.at && end.is_none_or(|e| x.at < e))
                .collect();
            let failed: Vec<&&Dial> = window.iter().filter(|x| x.error.is_some()).collect();
            for f in &failed {
                *kinds
                    .entry(f.error.clone().unwrap_or_default())
                    .or_default() += 1;
            }
            rec(self, table::RESTART, table::DIALS, window.len() as f64, r);
            rec(self, table::RESTART, table::FAILED, failed.len() as f64, r);
            let longest = window.iter().map(|x| x.took).max().unwrap_or_default();
            rec(
                self,
                table::RESTART,
                table::LONGEST_MS,
                longest.as_secs_f64() * 1e3,
                r,
            );
            rec(self, table::RESTART, table::CUT, d.cut as f64, r);
            rec(self, table::RESTART, table::HELD, plan.held as f64, r);
            if let Some(e) = &d.first_cut {
                self.note(format!(
                    "upgrade via {system}, replacement {}: a held tunnel: {e}",
                    r + 1
                ));
            }
            match &d.restarted {
                Ok(x) => {
                    rec(
                        self,
                        table::RESTART,
                        table::READY_S,
                        x.ready.as_secs_f64(),
                        r,
                    );
                    if let Some(s) = x.stopped {
                        rec(self, table::RESTART, table::OLD_GONE_S, s.as_secs_f64(), r);
                    }
                }
                Err(e) => self.fail(&format!("upgrade via {system}, replacement {}", r + 1), e),
            }
            if let Some(g) = d.old_gone {
                rec(self, table::RESTART, table::OLD_GONE_S, g.as_secs_f64(), r);
            }
        }
        if !kinds.is_empty() {
            let list: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} × `{k}`")).collect();
            self.note(format!(
                "upgrade via {system}: failed dials: {}",
                list.join(", ")
            ));
        }
    }
}

/// Starts `rate` dials a second through `entries` (in turn), each its own
/// task, until `stop`; logs each as it ends.
async fn dials(
    entries: Arc<Vec<Entry>>,
    rate: f64,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Dial>>>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = tokio::task::JoinSet::new();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let (entries, log) = (entries.clone(), log.clone());
        tasks.spawn(async move {
            let at = Instant::now();
            let result = tokio::time::timeout(
                DIAL_TIMEOUT,
                scenarios::cycle(&entries[i % entries.len()], Close::Orderly),
            )
            .await;
            let error = match result {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("no answer in {} s", DIAL_TIMEOUT.as_secs())),
            };
            let dial = Dial {
                at,
                took: at.elapsed(),
                error,
            };
            log.lock().unwrap_or_else(|e| e.into_inner()).push(dial);
        });
        i += 1;
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// A tunnel held open for `length`: 1 KiB echoed every [`ECHO_EVERY`],
/// then closed in order. Err (what broke) when it was cut.
async fn hold(entry: Entry, length: Duration, tag: u8) -> Result<(), String> {
    let end = Instant::now() + length;
    let mut c = client::open(&entry, None)
        .await
        .map_err(|e| format!("open: {e}"))?;
    // The target's first byte: echo everything after it.
    c.write_all(b"E").await.map_err(|e| format!("send: {e}"))?;
    let data = [tag; scenarios::MESSAGE];
    let mut back = [0u8; scenarios::MESSAGE];
    let mut rounds = 0u32;
    while Instant::now() < end {
        let round = async {
            c.write_all(&data).await?;
            c.flush().await?;
            c.read_exact(&mut back).await?;
            Ok::<_, std::io::Error>(())
        };
        match tokio::time::timeout(DIAL_TIMEOUT, round).await {
            Ok(Ok(())) if back == data => {}
            Ok(Ok(())) => return Err(format!("echo {rounds}: bytes differ")),
            Ok(Err(e)) => return Err(format!("echo {rounds}: {e}")),
            Err(_) => return Err(format!("echo {rounds}: no answer")),
        }
        rounds += 1;
        tokio::time::sleep(ECHO_EVERY).await;
    }
    c.shutdown().await.map_err(|e| format!("close: {e}"))?;
    let mut rest = [0u8; 1];
    match c.read(&mut rest).await {
        Ok(0) => Ok(()),
        Ok(_) => Err("bytes past the echo".into()),
        // A TLS peer that closed without close_notify has closed all the same.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(()),
        Err(e) => Err(format!("close: {e}")),
    }
}
