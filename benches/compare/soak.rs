//! The soak scenario (`--scenarios soak`, length `--soak-secs`): does a
//! tunnel system's memory stay flat over many tunnels, and does it come
//! back once they are gone (issue 40: RSS within 5 % of the idle start
//! after a minute idle)?
//!
//! Every tunnel system selected runs at once, so that they share the
//! machine's drift and the run takes the soak's length once: edgetunnel's
//! CONNECT frontend over TCP and over a unix socket and its gRPC frontend
//! with our agent, our server with ANP's Go agent (when the peers are
//! here), and the Go ANP server with the Go agent in each mode the harness
//! runs. Each gets the same load for the whole length
//! ([`crate::scenarios::soak`]: clients opening, echoing and closing
//! tunnels one after another, and bursts of tunnels opened at once), then
//! nothing for the idle period. Its server and agent processes are sampled
//! before the load, every [`SoakPlan::every`] during it, when it stops and
//! through the idle period: RSS (VmRSS, and its anonymous part) and
//! descriptors from /proc; the live heap (edgetunnel's count from its
//! global allocator; Go's `go_memstats_heap_inuse_bytes`), mimalloc's
//! committed bytes, open tunnels, pending dials and (Go) goroutines from
//! their /metrics.
//!
//! Recorded per system: tunnels served, their rate and the failures; per
//! process the figures at four points (before the load; the baseline, the
//! first sample after [`SoakPlan::baseline_tunnels`]; the end of the load;
//! after the idle period), RSS and live heap per tunnel (the least-squares
//! slope over the samples from the baseline to the end of the load), RSS
//! after idle over RSS before the load, and the curves of RSS and live
//! heap against tunnels served (the plot `soak.svg`). Measured and
//! reported, never asserted. The soak runs once, whatever `--reps` says.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::SystemKind;
use crate::probe;
use crate::scenarios::{self, SoakCount};
use crate::soak_table::{self, AFTER_IDLE, BASELINE, BEFORE, END, SCENARIO};
use crate::systems::{self, RoleProc, Running, StartOptions};
use crate::Harness;

/// The systems the soak fits: a server and an agent of their own.
const KINDS: [SystemKind; 5] = [
    SystemKind::EdgetunnelConnect,
    SystemKind::EdgetunnelGrpc,
    SystemKind::AnpUds,
    SystemKind::AnpTcp,
    SystemKind::AnpGrpc,
];

/// Live heap: edgetunnel's count, else Go's heap in use.
const LIVE_HEAP: [&str; 2] = ["edgetunnel_heap_live_bytes", "go_memstats_heap_inuse_bytes"];
/// What the allocator holds from the system (edgetunnel: mimalloc).
const COMMITTED: [&str; 1] = ["edgetunnel_heap_committed_bytes"];
/// Tunnels open: our server's count, else ANP's server's and agent's
/// gauges (our agent exports ANP's name).
const OPEN: [&str; 3] = [
    "edgetunnel_open_connections",
    "konnectivity_network_proxy_server_established_connections",
    "konnectivity_network_proxy_agent_open_endpoint_connections",
];
/// Goroutines (the Go processes): a tunnel's goroutines that never end
/// would show here.
const GOROUTINES: [&str; 1] = ["go_goroutines"];
/// Dials not yet answered (ANP's agent has no such gauge).
const PENDING: [&str; 3] = [
    "edgetunnel_pending_dials",
    "edgetunnel_agent_dials_pending",
    "konnectivity_network_proxy_server_pending_backend_dials",
];

/// Durations and sizes of one mode.
pub(crate) struct SoakPlan {
    /// How long the load runs.
    pub load: Duration,
    /// How long the systems then stay idle before the last sample.
    pub idle: Duration,
    /// Sampling interval, through the load and the idle period.
    pub every: Duration,
    /// Clients opening and closing tunnels one after another, per system.
    pub loops: usize,
    /// Tunnels opened at once in a burst, and the pause between bursts.
    pub burst: usize,
    pub pause: Duration,
    /// The baseline is the first sample after this many tunnels (0: the
    /// first sample of the load).
    pub baseline_tunnels: u64,
}

impl SoakPlan {
    pub(crate) fn new(quick: bool, secs: Option<u64>) -> SoakPlan {
        if quick {
            SoakPlan {
                load: Duration::from_secs(secs.unwrap_or(10)),
                idle: Duration::from_secs(10),
                every: Duration::from_secs(2),
                loops: 2,
                burst: 50,
                pause: Duration::from_millis(500),
                baseline_tunnels: 0,
            }
        } else {
            SoakPlan {
                load: Duration::from_secs(secs.unwrap_or(180)),
                idle: Duration::from_secs(60),
                every: Duration::from_secs(10),
                loops: 4,
                burst: 200,
                pause: Duration::from_secs(1),
                baseline_tunnels: 10_000,
            }
        }
    }
}

/// When a sample was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Before,
    Load,
    End,
    Idle,
}

/// One process at one sampling point.
#[derive(Clone, Copy, Debug, Default)]
struct ProcSample {
    rss: u64,
    /// The anonymous part of `rss` (the rest is mapped files: the binary's
    /// pages that running code made resident, not memory the process holds).
    anon: u64,
    fds: Option<usize>,
    live_heap: Option<f64>,
    committed: Option<f64>,
    open: Option<f64>,
    pending: Option<f64>,
    goroutines: Option<f64>,
}

impl ProcSample {
    fn take(p: &RoleProc) -> ProcSample {
        let text = p.metrics.and_then(probe::metrics_text).unwrap_or_default();
        ProcSample {
            rss: probe::rss(p.pid),
            anon: probe::kib_field(&format!("/proc/{}/status", p.pid), "RssAnon:"),
            fds: probe::open_fds(p.pid),
            live_heap: probe::first_metric(&text, &LIVE_HEAP),
            committed: probe::first_metric(&text, &COMMITTED),
            open: probe::first_metric(&text, &OPEN),
            pending: probe::first_metric(&text, &PENDING),
            goroutines: probe::first_metric(&text, &GOROUTINES),
        }
    }
}

/// One sampling point of one system: its tunnels so far and each of its
/// processes (in [`Soaked::roles`] order).
struct Sampled {
    phase: Phase,
    tunnels: u64,
    procs: Vec<ProcSample>,
}

/// A system under the soak.
struct Soaked {
    run: Running,
    roles: Vec<RoleProc>,
    count: Arc<SoakCount>,
    samples: Vec<Sampled>,
}

impl Soaked {
    fn sample(&mut self, phase: Phase) {
        self.samples.push(Sampled {
            phase,
            tunnels: self.count.served.load(Ordering::Relaxed),
            procs: self.roles.iter().map(ProcSample::take).collect(),
        });
    }

    /// One progress line: tunnels and each process's RSS and live heap.
    fn progress(&self, secs: f64) -> String {
        let Some(last) = self.samples.last() else {
            return String::new();
        };
        let procs: Vec<String> = self
            .roles
            .iter()
            .zip(&last.procs)
            .map(|(r, p)| {
                format!(
                    "{} RSS {:.1} MB heap {} fds {}",
                    r.role,
                    p.rss as f64 / 1e6,
                    p.live_heap
                        .map_or("-".to_string(), |h| format!("{:.1} MB", h / 1e6)),
                    p.fds.map_or("-".to_string(), |n| n.to_string())
                )
            })
            .collect();
        format!(
            "  [soak] {secs:>5.0} s {}: {} tunnels, {} failed; {}",
            self.run.label,
            last.tunnels,
            self.count.failed.load(Ordering::Relaxed),
            procs.join("; ")
        )
    }
}

impl Harness {
    /// The soak scenario: every tunnel system selected at once, under load
    /// for `plan.load`, then idle for `plan.idle`.
    pub(crate) fn soak(
        &mut self,
        rt: &tokio::runtime::Runtime,
        targets: &[std::net::SocketAddr],
        plan: &SoakPlan,
    ) {
        println!(
            "== soak: {} s of tunnels (1 KiB echoed each; {} clients one after another, bursts of {} at once), then {} s idle; every system at once",
            plan.load.as_secs(),
            plan.loops,
            plan.burst,
            plan.idle.as_secs()
        );
        let baseline = if plan.baseline_tunnels > 0 {
            format!("the first sample after {} tunnels", plan.baseline_tunnels)
        } else {
            "the first sample of the load".to_string()
        };
        self.note(format!(
            "soak: every tunnel system at once (they share the cores), {} s of load, then {} s idle, \
             sampled every {} s; per system {} clients open a tunnel, echo 1 KiB and close it in order, \
             one after another, and bursts of {} tunnels opened at once echo 1 KiB and end with a reset, \
             {} ms apart; baseline = {baseline}; per-tunnel figures are least-squares slopes from the \
             baseline to the end of the load; run once, whatever --reps says",
            plan.load.as_secs(),
            plan.idle.as_secs(),
            plan.every.as_secs(),
            plan.loops,
            plan.burst,
            plan.pause.as_millis()
        ));
        let mut soaked = Vec::new();
        for (kind, opts) in self.soak_variants() {
            match systems::start(kind, targets, &opts) {
                Ok(mut run) => {
                    if opts.edgetunnel_bin != self.opts(None, 0).edgetunnel_bin {
                        run.label.push_str(" base");
                    }
                    println!("started {}", run.label);
                    let roles = run.roles();
                    soaked.push(Soaked {
                        run,
                        roles,
                        count: Arc::default(),
                        samples: Vec::new(),
                    });
                }
                Err(e) if self.strict => self.fail(&format!("soak: starting {}", kind.name()), e),
                Err(e) => self.note(format!("soak: {} not run: {e}", kind.name())),
            }
        }
        if soaked.is_empty() {
            return;
        }
        // Let start-up settle before the first sample.
        std::thread::sleep(Duration::from_secs(1));
        for s in &mut soaked {
            s.sample(Phase::Before);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let loads: Vec<_> = soaked
            .iter()
            .map(|s| {
                rt.spawn(scenarios::soak(
                    s.run.entries.clone(),
                    plan.loops,
                    plan.burst,
                    plan.pause,
                    stop.clone(),
                    s.count.clone(),
                ))
            })
            .collect();
        let t0 = Instant::now();
        sample_over(&mut soaked, Phase::Load, plan.load, plan.every, t0);
        stop.store(true, Ordering::Relaxed);
        rt.block_on(futures::future::join_all(loads));
        let load_secs = t0.elapsed().as_secs_f64();
        sample_over(&mut soaked, Phase::End, Duration::ZERO, plan.every, t0);
        sample_over(&mut soaked, Phase::Idle, plan.idle, plan.every, t0);
        for s in &soaked {
            self.record_soak(s, plan, load_secs);
        }
        print!("{}", soak_table::table(&self.samples));
    }

    /// The systems the soak runs and how each is started: the tunnel
    /// systems selected, edgetunnel-connect also over a unix socket and
    /// with ANP's Go agent (when the peers are here), and each edgetunnel
    /// system again with `--base-bin`.
    fn soak_variants(&mut self) -> Vec<(SystemKind, StartOptions)> {
        let mut out = Vec::new();
        for k in KINDS {
            if !self.systems.contains(&k) {
                continue;
            }
            let opts = self.opts(None, 1024);
            if let Err(e) = systems::available(k, &opts) {
                self.note(format!("soak: {}: {e}", k.name()));
                continue;
            }
            let mut variants = vec![opts.clone()];
            if k == SystemKind::EdgetunnelConnect {
                variants.push(StartOptions {
                    connect_uds: true,
                    ..opts.clone()
                });
                let go = StartOptions {
                    go_agent: true,
                    ..opts.clone()
                };
                if systems::available(k, &go).is_ok() {
                    variants.push(go);
                }
            }
            if let (true, Some(base)) = (k.is_edgetunnel(), &self.base_bin) {
                variants.push(StartOptions {
                    edgetunnel_bin: PathBuf::from(base),
                    ..opts
                });
            }
            out.extend(variants.into_iter().map(|o| (k, o)));
        }
        out
    }

    /// Records the figures of one soaked system.
    fn record_soak(&mut self, s: &Soaked, plan: &SoakPlan, load_secs: f64) {
        let system = s.run.label.clone();
        let served = s.count.served.load(Ordering::Relaxed);
        let failed = s.count.failed.load(Ordering::Relaxed);
        let rec = |h: &mut Harness, case: &str, metric: &str, v: f64, higher: bool| {
            h.record(SCENARIO, case, &system, metric, v, 0, higher, Vec::new());
        };
        rec(self, "load", "tunnels served", served as f64, true);
        rec(self, "load", "tunnels/s", served as f64 / load_secs, true);
        rec(self, "load", "failures", failed as f64, false);
        if served == 0 {
            self.fail(&format!("soak via {system}"), "no tunnel was served");
        }
        if failed > 0 {
            let first = s.count.first_error.lock().ok().and_then(|e| e.clone());
            self.note(format!(
                "soak via {system}: {failed} tunnel(s) failed; the first: {}",
                first.unwrap_or_default()
            ));
        }
        let at = |phase: Phase| s.samples.iter().position(|x| x.phase == phase);
        let load: Vec<usize> = (0..s.samples.len())
            .filter(|&i| s.samples[i].phase == Phase::Load)
            .collect();
        let base = load
            .iter()
            .copied()
            .find(|&i| s.samples[i].tunnels >= plan.baseline_tunnels)
            .or_else(|| {
                self.note(format!(
                    "soak via {system}: fewer than {} tunnels by the last sample; baseline = its first sample",
                    plan.baseline_tunnels
                ));
                load.first().copied()
            });
        let end = at(Phase::End);
        let points = [
            (BEFORE, at(Phase::Before)),
            (BASELINE, base),
            (END, end),
            (AFTER_IDLE, s.samples.len().checked_sub(1)),
        ];
        for (r, role) in s.roles.iter().enumerate() {
            let p = |i: usize| &s.samples[i].procs[r];
            for (point, i) in points {
                let Some(i) = i else { continue };
                let case = soak_table::case(role.role, point);
                let x = p(i);
                rec(self, &case, "RSS MB", x.rss as f64 / 1e6, false);
                rec(self, &case, "anonymous RSS MB", x.anon as f64 / 1e6, false);
                let optional = [
                    ("live heap MB", x.live_heap.map(|b| b / 1e6)),
                    ("committed heap MB", x.committed.map(|b| b / 1e6)),
                    ("descriptors", x.fds.map(|n| n as f64)),
                    ("open connections", x.open),
                    ("pending dials", x.pending),
                    ("goroutines", x.goroutines),
                ];
                for (metric, v) in optional {
                    if let Some(v) = v {
                        rec(self, &case, metric, v, false);
                    }
                }
            }
            // Per tunnel: the slope from the baseline to the end of the load.
            if let (Some(b), Some(e)) = (base, end) {
                let xs: Vec<f64> = (b..=e).map(|i| s.samples[i].tunnels as f64).collect();
                let rss: Vec<f64> = (b..=e).map(|i| p(i).rss as f64).collect();
                rec(self, role.role, "RSS B/tunnel", slope(&xs, &rss), false);
                let heap: Option<Vec<f64>> = (b..=e).map(|i| p(i).live_heap).collect();
                if let Some(heap) = heap {
                    rec(
                        self,
                        role.role,
                        "live heap B/tunnel",
                        slope(&xs, &heap),
                        false,
                    );
                }
            }
            if let (Some(b), Some(a)) = (at(Phase::Before), s.samples.len().checked_sub(1)) {
                let ratio = p(a).rss as f64 / p(b).rss as f64;
                rec(self, role.role, soak_table::IDLE_RATIO, ratio, false);
            }
            // The curves, against tunnels served; the value is the peak.
            let curve = |f: &dyn Fn(&ProcSample) -> Option<f64>| -> Option<Vec<(f64, f64)>> {
                s.samples
                    .iter()
                    .map(|x| Some((x.tunnels as f64, f(&x.procs[r])? / 1e6)))
                    .collect()
            };
            let curves = [
                ("RSS MB", curve(&|x| Some(x.rss as f64))),
                ("live heap MB", curve(&|x| x.live_heap)),
            ];
            for (metric, pts) in curves {
                let Some(pts) = pts else { continue };
                let peak = pts.iter().map(|p| p.1).fold(f64::NAN, f64::max);
                let case = soak_table::case(role.role, soak_table::PEAK);
                rec(self, &case, metric, peak, false);
                if let Some(last) = self.samples.last_mut() {
                    last.series = pts;
                }
            }
        }
    }
}

/// Samples every system as `phase`: every `every` over `length` from now
/// (once, at once, when `length` is zero), with a progress line each
/// (seconds since `t0`); returns at the end of `length`.
fn sample_over(
    soaked: &mut [Soaked],
    phase: Phase,
    length: Duration,
    every: Duration,
    t0: Instant,
) {
    let start = Instant::now();
    let mut next = if length.is_zero() { length } else { every };
    while next <= length {
        std::thread::sleep((start + next).saturating_duration_since(Instant::now()));
        for s in soaked.iter_mut() {
            s.sample(phase);
            println!("{}", s.progress(t0.elapsed().as_secs_f64()));
        }
        next += every;
    }
    std::thread::sleep((start + length).saturating_duration_since(Instant::now()));
}

/// The least-squares slope of `ys` over `xs`; NaN with fewer than two
/// distinct x.
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len().min(ys.len()) as f64;
    if n < 2.0 {
        return f64::NAN;
    }
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
    }
    if sxx > 0.0 {
        sxy / sxx
    } else {
        f64::NAN
    }
}
