//! The comparison harness: edgetunnel against the systems a user would pick
//! instead (a direct connection as the limit, socat and haproxy as one plain
//! relay hop, rathole and `ssh -R` as reverse tunnels), in one run on one
//! machine, every scenario for every system it fits, several repetitions
//! interleaved so that drift on a shared machine hits all systems alike.
//!
//! `benches/run` (or `cargo bench --bench compare -- [--quick]`) runs it;
//! `--quick` is a pass of seconds that proves the harness works (CI runs
//! it); the full mode writes `benches/results/compare/` (JSON of every
//! sample, a Markdown report, SVG plots). Figures are printed and written,
//! never asserted. Under `cargo test` (no `--bench`) it only prints how to
//! run it.
#![allow(unsafe_code)] // system calls the test/bench harness makes directly

#[path = "../shared/tunnel_client.rs"]
mod client;
mod cpu;
mod fleet;
mod fleet_kube;
mod fleet_scenario;
mod fleet_table;
mod model;
mod plot;
mod probe;
mod profile;
mod report;
#[path = "../shared/run_facts.rs"]
mod run_facts;
mod scenarios;
mod soak;
mod soak_table;
mod systems;
mod target;
mod upgrade;
mod upgrade_table;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use model::{Sample, SystemKind};
use run_facts::{loadavg, today};
use systems::{Running, StartOptions};

const USAGE: &str = "\
usage: benches/run [--quick] [--reps N] [--systems a,b,..] [--scenarios a,b,..] [--out DIR] [--strict] [--base-bin PATH] [--memory-sizes N,..] [--bulk-mib N] [--fleet-sizes N,..] [--soak-secs N]
  --quick       seconds-long pass proving every part works (CI); output in target/compare-quick/
  --reps N      repetitions per case (default 3; quick: 1)
  --systems     subset of: direct,socat,haproxy,rathole,ssh-R,haproxy-tls-pair,
                stunnel-pair,anp-uds,anp-tcp,edgetunnel-connect,edgetunnel-grpc
                (anp-*: the real Go ANP, when EDGETUNNEL_PEERS or ../shared/peers
                has it; noted as not run otherwise)
  --scenarios   subset of: bulk,latency,dial,hol,memory,scaling,fleet,soak,upgrade
  --out DIR     where to write compare.json, compare.md and the SVG plots
                (default benches/results/compare/; quick: target/compare-quick/)
  --strict      fail when a system is missing or a measurement fails (quick implies it)
  --base-bin    another edgetunnel binary (e.g. main's, built elsewhere): every
                scenario but scaling runs its edgetunnel systems with it too,
                labelled `... base`, side by side with this build's
  --memory-sizes  idle connections per memory case (default 1000,10000,100000; quick: 100,1000)
  --bulk-mib N  bytes per bulk transfer, MiB (default 1024; quick: 8)
  --rereport DIR  write DIR/compare.md and the plots again from DIR/compare.json
                (a newer report from an older run); measures nothing
  --fleet-sizes   simulated agents per fleet case (default 10,100,1000,5000,10000; quick: 50)
  --soak-secs N   seconds of load in the soak (default 180; quick: 10); every
                tunnel system at once, then 60 s idle (quick: 10 s)
  upgrade       (a scenario) 50 dials a second and tunnels held open while the
                server is replaced three times (quick: once): edgetunnel through
                its listener handover (--handover-socket), and with a plain
                restart, beside the Go ANP's plain restart";

/// Metric of the bulk rows: payload throughput.
const GBPS: &str = "Gbit/s";
/// Metric of the bulk rows: the system's CPU seconds (user + system, all
/// its processes) per 10^9 payload bytes moved.
const CPU_PER_GB: &str = "CPU s/GB";
/// The kernel-mode (system) part of [`CPU_PER_GB`].
const KERNEL_PER_GB: &str = "kernel s/GB";
/// Metric of the saturation rows: the system's CPU (user + system, all its
/// processes) per completed request, microseconds.
const CPU_PER_REQ: &str = "CPU µs/req";
/// The kernel-mode (system) part of [`CPU_PER_REQ`].
const KERNEL_PER_REQ: &str = "kernel µs/req";
/// The load generator's own CPU per request at saturation (this process:
/// the clients; the targets run in a process of their own): what driving
/// the system costs, which shares the cores with the system and bounds
/// its req/s (a gRPC client frames and decodes what a TCP client sends
/// raw).
const CLIENT_PER_REQ: &str = "client µs/req";
/// Metric of the dial rows: the system's CPU (user + system) per
/// connection opened, used once and closed, microseconds.
const CPU_PER_CONN: &str = "CPU µs/conn";
/// The kernel-mode (system) part of [`CPU_PER_CONN`].
const KERNEL_PER_CONN: &str = "kernel µs/conn";

/// Metric of the memory rows beside bytes/conn (resident memory): the
/// live heap per idle connection (`edgetunnel_heap_live_bytes` of every
/// process of the system, edgetunnel only).
const HEAP_PER_CONN: &str = "live heap bytes/conn";

const SCENARIOS: [&str; 9] = [
    "bulk", "latency", "dial", "hol", "memory", "scaling", "fleet", "soak", "upgrade",
];

struct Args {
    quick: bool,
    reps: u32,
    systems: Vec<SystemKind>,
    scenarios: Vec<String>,
    out: PathBuf,
    strict: bool,
    base_bin: Option<PathBuf>,
    memory_sizes: Option<Vec<usize>>,
    bulk_mib: Option<u64>,
    fleet_sizes: Option<Vec<usize>>,
    soak_secs: Option<u64>,
}

/// Sizes and durations of one mode.
struct Plan {
    bulk_bytes: u64,
    latency_conns: usize,
    rates: Vec<f64>,
    latency_dur: Duration,
    dial_concurrency: usize,
    dial_dur: Duration,
    hol_phase: Duration,
    memory_sizes: Vec<usize>,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                bulk_bytes: 8 << 20,
                latency_conns: 4,
                rates: vec![500.0],
                latency_dur: Duration::from_millis(500),
                dial_concurrency: 4,
                dial_dur: Duration::from_millis(500),
                hol_phase: Duration::from_millis(400),
                memory_sizes: vec![100, 1000],
            }
        } else {
            Plan {
                bulk_bytes: 1 << 30,
                latency_conns: 16,
                rates: vec![1000.0, 5000.0],
                latency_dur: Duration::from_secs(5),
                dial_concurrency: 16,
                dial_dur: Duration::from_secs(5),
                hol_phase: Duration::from_secs(2),
                memory_sizes: vec![1_000, 10_000, 100_000],
            }
        }
    }
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut argv = std::env::args().skip(1);
    let mut bench = false;
    let mut quick = false;
    let mut reps = None;
    let mut systems: Vec<SystemKind> = SystemKind::ALL.to_vec();
    let mut scenarios: Vec<String> = SCENARIOS.iter().map(|s| s.to_string()).collect();
    let mut out = None;
    let mut strict = false;
    let mut base_bin = None;
    let mut memory_sizes = None;
    let mut bulk_mib = None;
    let mut fleet_sizes = None;
    let mut soak_secs = None;
    while let Some(a) = argv.next() {
        let mut value = || argv.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--bench" => bench = true,
            "--quick" => quick = true,
            "--strict" => strict = true,
            "--reps" => reps = Some(value()?.parse::<u32>().map_err(|e| e.to_string())?),
            "--systems" => {
                systems = value()?
                    .split(',')
                    .map(|s| SystemKind::from_name(s).ok_or(format!("unknown system {s}")))
                    .collect::<Result<_, _>>()?
            }
            "--scenarios" => {
                scenarios = value()?.split(',').map(str::to_string).collect();
                if let Some(bad) = scenarios.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
                    return Err(format!("unknown scenario {bad}"));
                }
            }
            "--out" => out = Some(PathBuf::from(value()?)),
            "--base-bin" => base_bin = Some(PathBuf::from(value()?)),
            "--memory-sizes" => memory_sizes = Some(sizes(&a, &value()?)?),
            "--bulk-mib" => bulk_mib = Some(at_least_one(&a, &value()?)?),
            "--fleet-sizes" => fleet_sizes = Some(sizes(&a, &value()?)?),
            "--soak-secs" => soak_secs = Some(at_least_one(&a, &value()?)?),
            "-h" | "--help" => return Err(USAGE.to_string()),
            // cargo passes filters and its own flags through; ignore them.
            _ => {}
        }
    }
    if !bench && !quick {
        return Ok(None);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    Ok(Some(Args {
        reps: reps.unwrap_or(if quick { 1 } else { 3 }).max(1),
        out: out.unwrap_or_else(|| {
            if quick {
                root.join("target/compare-quick")
            } else {
                root.join("benches/results/compare")
            }
        }),
        strict: strict || quick,
        quick,
        systems,
        scenarios,
        base_bin,
        memory_sizes,
        bulk_mib,
        fleet_sizes,
        soak_secs,
    }))
}

/// The value of `flag`, a comma-separated list of counts.
fn sizes(flag: &str, value: &str) -> Result<Vec<usize>, String> {
    value
        .split(',')
        .map(|n| n.parse::<usize>().map_err(|e| format!("{flag} {n}: {e}")))
        .collect()
}

/// The value of `flag`, a number (at least 1).
fn at_least_one(flag: &str, value: &str) -> Result<u64, String> {
    let n = value.parse::<u64>().map_err(|e| format!("{flag}: {e}"))?;
    Ok(n.max(1))
}

fn main() {
    if std::env::args().any(|a| a == "--serve-targets") {
        serve_targets();
    }
    if let Some(dir) = rereport_dir() {
        rereport(&dir);
        return;
    }
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!(
                "compare: run `benches/run --quick` (seconds) or `benches/run` (full figures)"
            );
            return;
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut plan = Plan::new(args.quick);
    if let Some(sizes) = &args.memory_sizes {
        plan.memory_sizes = sizes.clone();
    }
    if let Some(mib) = args.bulk_mib {
        plan.bulk_bytes = mib << 20;
    }
    let started = Instant::now();
    let mut h = Harness::new(&args);
    // The machine is shared: what else ran is part of every figure.
    h.note(format!("load average at the start: {}", loadavg()));
    h.note(format!(
        "commit: {}",
        run_facts::commit(std::path::Path::new(env!("CARGO_MANIFEST_DIR")))
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // The targets run in their own process: the client's sockets alone
    // then count against this process's descriptor limit.
    let (target_proc, targets) = spawn_targets();
    let has = |s: &str| args.scenarios.iter().any(|x| x == s);
    if has("bulk") || has("latency") || has("dial") || has("hol") {
        let running = h.start_all(&targets, 1024);
        if has("bulk") {
            h.bulk(&rt, &running, &plan);
        }
        if has("latency") {
            h.latency(&rt, &running, &plan);
        }
        if has("dial") {
            h.dial(&rt, &running, &plan);
        }
        if has("hol") {
            h.hol(&rt, &running, &plan);
        }
    }
    if has("memory") {
        h.memory(&rt, &targets, &plan);
    }
    if has("scaling") {
        h.scaling(&rt, &targets, &plan);
    }
    if has("fleet") {
        let fleet = fleet_scenario::FleetPlan::new(args.quick, args.fleet_sizes.clone());
        h.fleet(&rt, &fleet);
    }
    if has("soak") {
        h.soak(
            &rt,
            &targets,
            &soak::SoakPlan::new(args.quick, args.soak_secs),
        );
    }
    if has("upgrade") {
        h.upgrade(&rt, &targets, &upgrade::UpgradePlan::new(args.quick));
    }
    h.note(format!("load average at the end: {}", loadavg()));
    if args.systems.contains(&SystemKind::AnpTcp) {
        h.notes.push(
            "anp-tcp: ANP's TCP frontend is mutual TLS only, so its CPU includes \
             terminating the client's TLS, which no other system does"
                .to_string(),
        );
    }
    // Before any exit below, which would leave the target process
    // running (and holding the caller's stderr).
    drop(target_proc);
    let meta = report::Meta {
        date: today(),
        machine: machine(),
        mode: if args.quick { "quick" } else { "full" }.to_string(),
        reps: args.reps,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        notes: h.notes.clone(),
    };
    match report::write_all(&h.samples, &meta, &args.out) {
        Ok(paths) => {
            for p in paths {
                println!("wrote {}", p.display());
            }
        }
        Err(e) => {
            eprintln!("writing the report failed: {e}");
            std::process::exit(1);
        }
    }
    println!(
        "compare: {} samples in {:.0} s",
        h.samples.len(),
        started.elapsed().as_secs_f64()
    );
    if args.strict && h.failures > 0 {
        eprintln!("compare: {} measurement(s) failed (see above)", h.failures);
        std::process::exit(1);
    }
}

/// `--rereport DIR`, if given.
fn rereport_dir() -> Option<PathBuf> {
    let mut argv = std::env::args().skip_while(|a| a != "--rereport");
    argv.next()?;
    argv.next().map(PathBuf::from)
}

/// Writes the report of `dir` again from its compare.json.
fn rereport(dir: &std::path::Path) {
    let result = report::read_json(&dir.join("compare.json"))
        .and_then(|(samples, meta)| report::write_all(&samples, &meta, dir));
    match result {
        Ok(paths) => paths.iter().for_each(|p| println!("wrote {}", p.display())),
        Err(e) => {
            eprintln!("--rereport {}: {e}", dir.display());
            std::process::exit(1);
        }
    }
}

/// Collected samples and notes, plus the run's settings.
struct Harness {
    reps: u32,
    strict: bool,
    systems: Vec<SystemKind>,
    samples: Vec<Sample>,
    notes: Vec<String>,
    failures: usize,
    /// `--base-bin`: edgetunnel build to compare against, side by side.
    base_bin: Option<PathBuf>,
    /// `COMPARE_PROFILE`: a profiler attached for each measured window.
    profiler: profile::Profiler,
    _ports: Option<PortRange>,
}

impl Harness {
    fn new(args: &Args) -> Harness {
        raise_nofile();
        Harness {
            reps: args.reps,
            strict: args.strict,
            systems: args.systems.clone(),
            samples: Vec::new(),
            notes: Vec::new(),
            failures: 0,
            base_bin: args.base_bin.clone(),
            profiler: profile::Profiler::from_env(),
            _ports: PortRange::widen(),
        }
    }

    fn opts(&self, workers: Option<usize>, max_conns: usize) -> StartOptions {
        StartOptions {
            edgetunnel_bin: PathBuf::from(env!("CARGO_BIN_EXE_edgetunnel")),
            workers,
            one_link: false,
            max_conns,
            connect_uds: false,
            go_agent: false,
            handover: false,
        }
    }

    fn note(&mut self, msg: String) {
        println!("note: {msg}");
        self.notes.push(msg);
    }

    fn fail(&mut self, what: &str, e: impl std::fmt::Display) {
        eprintln!("FAILED {what}: {e}");
        self.failures += 1;
        self.notes.push(format!("{what} failed: {e}"));
    }

    /// Starts every available system once (memory starts its own).
    fn start_all(&mut self, targets: &[std::net::SocketAddr], max_conns: usize) -> Vec<Running> {
        let opts = self.opts(None, max_conns);
        let mut running = Vec::new();
        for k in self.systems.clone() {
            if let Err(e) = systems::available(k, &opts) {
                if k.is_anp() {
                    // The real peers are optional, also under --strict.
                    self.note(format!("{}: {e}", k.name()));
                } else if self.strict {
                    self.fail(&format!("{} is not installed", k.name()), e);
                } else {
                    self.note(format!("{} skipped: {e}", k.name()));
                }
                continue;
            }
            // Each edgetunnel system again with `--base-bin`, side by side.
            let mut variants = vec![(opts.clone(), false)];
            if let (true, Some(base)) = (k.is_edgetunnel(), &self.base_bin) {
                let mut o = opts.clone();
                o.edgetunnel_bin = base.clone();
                variants.push((o, true));
            }
            for (o, base) in variants {
                let t0 = Instant::now();
                match systems::start(k, targets, &o) {
                    Ok(mut r) => {
                        if base {
                            r.label = format!("{} base", r.label);
                        }
                        println!("started {} in {:.1} s", r.label, t0.elapsed().as_secs_f64());
                        running.push(r);
                    }
                    Err(e) => self.fail(&format!("starting {}", k.name()), e),
                }
            }
        }
        running
    }

    /// Records one value, with progress on the terminal.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        scenario: &str,
        case: &str,
        system: &str,
        metric: &str,
        value: f64,
        rep: u32,
        higher: bool,
        cdf: Vec<(f64, f64)>,
    ) {
        println!(
            "  [{scenario}] {case} · {system} · rep {}: {value:.3} {metric}",
            rep + 1
        );
        self.samples.push(Sample {
            scenario: scenario.to_string(),
            case: case.to_string(),
            system: system.to_string(),
            metric: metric.to_string(),
            value,
            rep,
            higher_is_better: higher,
            cdf,
            series: Vec::new(),
        });
    }

    /// Prints the median line of every (case, system) of `scenario` done so far.
    fn summarize(&self, scenario: &str, case: &str) {
        let mut systems: Vec<&str> = Vec::new();
        for s in self
            .samples
            .iter()
            .filter(|s| s.scenario == scenario && s.case == case)
        {
            if !systems.contains(&s.system.as_str()) {
                systems.push(&s.system);
            }
        }
        for sys in systems {
            let group: Vec<Sample> = self
                .samples
                .iter()
                .filter(|s| s.scenario == scenario && s.case == case && s.system == sys)
                .cloned()
                .collect();
            println!("{}", report::summary_line(&group));
        }
    }

    fn bulk(&mut self, rt: &tokio::runtime::Runtime, running: &[Running], plan: &Plan) {
        println!("== bulk throughput: {} MiB each way", plan.bulk_bytes >> 20);
        for (streams, upload) in [(1, true), (1, false), (64, true), (64, false)] {
            let case = format!(
                "{streams} stream{} {}",
                if streams > 1 { "s" } else { "" },
                if upload { "upload" } else { "download" }
            );
            for rep in 0..self.reps {
                for r in running {
                    let what = format!("bulk-{case}-{rep}");
                    let cpu = || self.profiler.snapshot(r, &what);
                    match rt.block_on(scenarios::bulk(
                        &r.entries,
                        streams,
                        upload,
                        plan.bulk_bytes,
                        &cpu,
                    )) {
                        Ok(b) => self.record_bulk("bulk", &case, &r.label, &b, rep, false),
                        Err(e) => self.fail(&format!("bulk {case} via {}", r.label), e),
                    }
                }
            }
            self.summarize("bulk", &case);
            self.print_ratios("bulk", &case);
        }
    }

    /// Records a bulk transfer: Gbit/s, and CPU s/GB when the system has
    /// processes of its own (direct has none); with `context`, also where
    /// the CPU went (see [`Harness::record_context`]).
    fn record_bulk(
        &mut self,
        scenario: &str,
        case: &str,
        system: &str,
        b: &scenarios::Bulk,
        rep: u32,
        context: bool,
    ) {
        self.record(scenario, case, system, GBPS, b.gbps, rep, true, Vec::new());
        let Some(w) = b.cpu else { return };
        // Too few clock ticks (quick runs) say nothing: no figure at all
        // rather than a ratio of 0 or infinity.
        if cpu::measurable(w.seconds) {
            for (metric, secs) in [
                (CPU_PER_GB, w.seconds),
                (KERNEL_PER_GB, w.seconds - w.user_seconds),
            ] {
                let per_gb = cpu::seconds_per_gb(secs, b.bytes);
                self.record(
                    scenario,
                    case,
                    system,
                    metric,
                    per_gb,
                    rep,
                    false,
                    Vec::new(),
                );
            }
        }
        if context {
            self.record_context(scenario, case, system, &w, rep);
        }
    }

    /// Records a saturation run: req/s, and the CPU per request (total and
    /// its kernel part) when it spans enough clock ticks.
    fn record_saturation(
        &mut self,
        scenario: &str,
        case: &str,
        system: &str,
        l: &scenarios::Latency,
        rep: u32,
    ) {
        self.record(
            scenario,
            case,
            system,
            "req/s",
            l.rate,
            rep,
            true,
            Vec::new(),
        );
        let requests = l.rate * l.secs;
        if requests < 1.0 {
            return;
        }
        if let Some(secs) = l.client_secs.filter(|&s| cpu::measurable(s)) {
            let us = secs / requests * 1e6;
            self.record(
                scenario,
                case,
                system,
                CLIENT_PER_REQ,
                us,
                rep,
                false,
                Vec::new(),
            );
        }
        let Some(w) = l.cpu.filter(|w| cpu::measurable(w.seconds)) else {
            return;
        };
        for (metric, secs) in [
            (CPU_PER_REQ, w.seconds),
            (KERNEL_PER_REQ, w.seconds - w.user_seconds),
        ] {
            let us = secs / requests * 1e6;
            self.record(scenario, case, system, metric, us, rep, false, Vec::new());
        }
    }

    /// Records where a run's CPU went: the busiest thread of the system
    /// (1.0 = a whole core) and the machine's idle share. Context for the
    /// core-scaling rows (report::CONTEXT_METRICS: no ratio tables).
    fn record_context(
        &mut self,
        scenario: &str,
        case: &str,
        system: &str,
        w: &cpu::Window,
        rep: u32,
    ) {
        for (metric, v) in [
            (report::BUSIEST_THREAD, w.busiest_thread),
            (report::MACHINE_IDLE, w.machine_idle * 100.0),
        ] {
            if v.is_finite() {
                self.record(scenario, case, system, metric, v, rep, false, Vec::new());
            }
        }
    }

    /// Prints the ratio lines of every edgetunnel system of `case` against
    /// each peer (Gbit/s and CPU s/GB side by side).
    fn print_ratios(&self, scenario: &str, case: &str) {
        let group: Vec<Sample> = self
            .samples
            .iter()
            .filter(|s| s.scenario == scenario && s.case == case)
            .cloned()
            .collect();
        for line in report::ratio_lines(&group, &[GBPS, CPU_PER_GB]) {
            println!("  {line}");
        }
    }

    fn latency(&mut self, rt: &tokio::runtime::Runtime, running: &[Running], plan: &Plan) {
        println!(
            "== request/response latency: 1 KiB each way, {} kept-alive connections",
            plan.latency_conns
        );
        let mut cases: Vec<(String, Option<f64>)> = plan
            .rates
            .iter()
            .map(|&r| (format!("{r:.0} req/s"), Some(r)))
            .collect();
        cases.push(("saturation".to_string(), None));
        for (case, rate) in cases {
            for rep in 0..self.reps {
                for r in running {
                    let what = format!("latency-{case}-{rep}");
                    let cpu = || self.profiler.snapshot(r, &what);
                    match rt.block_on(scenarios::latency(
                        &r.entries,
                        plan.latency_conns,
                        rate,
                        plan.latency_dur,
                        &cpu,
                    )) {
                        Ok(l) => {
                            for (metric, v) in
                                [("p50 ms", l.p50), ("p99 ms", l.p99), ("p99.9 ms", l.p999)]
                            {
                                self.record(
                                    "latency",
                                    &case,
                                    &r.label,
                                    metric,
                                    v,
                                    rep,
                                    false,
                                    l.cdf.clone(),
                                );
                            }
                            if rate.is_none() {
                                self.record_saturation("latency", &case, &r.label, &l, rep);
                            }
                        }
                        Err(e) => self.fail(&format!("latency {case} via {}", r.label), e),
                    }
                }
            }
            self.summarize("latency", &case);
        }
    }

    fn dial(&mut self, rt: &tokio::runtime::Runtime, running: &[Running], plan: &Plan) {
        println!(
            "== dial rate: open, one 1 KiB round trip, close; {} clients",
            plan.dial_concurrency
        );
        let case = format!("{} concurrent clients", plan.dial_concurrency);
        for rep in 0..self.reps {
            for r in running {
                let (cpu0, t0) = (r.cpu_snapshot(), Instant::now());
                let result = rt.block_on(scenarios::dial(
                    &r.entries,
                    plan.dial_concurrency,
                    plan.dial_dur,
                ));
                let wall = t0.elapsed().as_secs_f64();
                let window = cpu0
                    .zip(r.cpu_snapshot())
                    .map(|(a, b)| cpu::Window::between(&a, &b, wall));
                match result {
                    Ok((rate, p99, errors)) => {
                        self.record(
                            "dial",
                            &case,
                            &r.label,
                            "conn/s",
                            rate,
                            rep,
                            true,
                            Vec::new(),
                        );
                        // The system's CPU per connection (its whole life:
                        // open, dial, one round trip, close), over the run.
                        let conns = rate * wall;
                        if let Some(w) =
                            window.filter(|w| cpu::measurable(w.seconds) && conns >= 1.0)
                        {
                            for (metric, secs) in [
                                (CPU_PER_CONN, w.seconds),
                                (KERNEL_PER_CONN, w.seconds - w.user_seconds),
                            ] {
                                let us = secs / conns * 1e6;
                                self.record(
                                    "dial",
                                    &case,
                                    &r.label,
                                    metric,
                                    us,
                                    rep,
                                    false,
                                    Vec::new(),
                                );
                            }
                        }
                        self.record(
                            "dial",
                            &case,
                            &r.label,
                            "p99 ms per connection",
                            p99,
                            rep,
                            false,
                            Vec::new(),
                        );
                        if errors > 0 {
                            self.note(format!(
                                "dial via {}: {errors} failed connection(s) in rep {}",
                                r.label,
                                rep + 1
                            ));
                        }
                    }
                    Err(e) => self.fail(&format!("dial via {}", r.label), e),
                }
            }
        }
        self.summarize("dial", &case);
    }

    fn hol(&mut self, rt: &tokio::runtime::Runtime, running: &[Running], plan: &Plan) {
        println!("== head-of-line isolation: one stalled reader, one healthy download on the same system");
        for rep in 0..self.reps {
            for r in running {
                match rt.block_on(scenarios::hol(&r.entries, plan.hol_phase)) {
                    Ok((before, during)) => {
                        self.record(
                            "hol",
                            "healthy stream before the stall",
                            &r.label,
                            "Gbit/s",
                            before,
                            rep,
                            true,
                            Vec::new(),
                        );
                        self.record(
                            "hol",
                            "healthy stream during the stall",
                            &r.label,
                            "Gbit/s",
                            during,
                            rep,
                            true,
                            Vec::new(),
                        );
                    }
                    Err(e) => self.fail(&format!("hol via {}", r.label), e),
                }
            }
        }
        self.summarize("hol", "healthy stream before the stall");
        self.summarize("hol", "healthy stream during the stall");
    }

    fn memory(
        &mut self,
        rt: &tokio::runtime::Runtime,
        targets: &[std::net::SocketAddr],
        plan: &Plan,
    ) {
        println!("== memory: RSS with idle tunneled connections");
        // Each system, plus each edgetunnel system again with `--base-bin`.
        let mut kinds: Vec<(SystemKind, Option<PathBuf>)> = Vec::new();
        for k in self.systems_for_memory() {
            kinds.push((k, None));
            if let (true, Some(base)) = (k.is_edgetunnel(), &self.base_bin) {
                kinds.push((k, Some(base.clone())));
            }
        }
        for &n in &plan.memory_sizes {
            let case = format!("{n} idle");
            let limit = nofile_limit();
            if n as u64 + 256 > limit {
                self.note(format!("memory {case}: not run: the open-file limit here is {limit} and cannot be raised (no CAP_SYS_RESOURCE); each process would hold {n} sockets"));
                continue;
            }
            // The largest size is slow for some systems: one repetition.
            let reps = if n >= 100_000 { 1 } else { self.reps };
            for rep in 0..reps {
                for (k, base) in &kinds {
                    let k = *k;
                    if n > memory_cap(k) {
                        if rep == 0 {
                            self.note(format!(
                                "memory {case}: {} not run (at most {} connections: {})",
                                k.name(),
                                memory_cap(k),
                                cap_reason(k)
                            ));
                        }
                        continue;
                    }
                    let mut opts = self.opts(None, n + 64);
                    if let Some(b) = base {
                        opts.edgetunnel_bin = b.clone();
                    }
                    let r = match systems::start(k, targets, &opts) {
                        Ok(mut r) => {
                            if base.is_some() {
                                r.label = format!("{} base", r.label);
                            }
                            r
                        }
                        Err(e) if !self.strict => {
                            if rep == 0 {
                                self.note(format!("memory {case}: {} not run: {e}", k.name()));
                            }
                            continue;
                        }
                        Err(e) => {
                            self.fail(&format!("starting {} for memory", k.name()), e);
                            continue;
                        }
                    };
                    std::thread::sleep(Duration::from_millis(300));
                    let before = r.rss_bytes();
                    let heap_before = r.heap_live_bytes();
                    let t0 = Instant::now();
                    let held = rt.block_on(scenarios::hold_idle(&r.entries, n, 64));
                    match held {
                        Ok(conns) => {
                            let open_secs = t0.elapsed().as_secs_f64();
                            std::thread::sleep(Duration::from_millis(500));
                            let after = r.rss_bytes();
                            let per = after.saturating_sub(before) as f64 / n as f64;
                            self.record(
                                "memory",
                                &case,
                                &r.label,
                                "bytes/conn",
                                per,
                                rep,
                                false,
                                Vec::new(),
                            );
                            // The allocator's view beside the system's:
                            // bytes the program holds per connection.
                            if let Some((b, a)) = heap_before.zip(r.heap_live_bytes()) {
                                self.record(
                                    "memory",
                                    &case,
                                    &r.label,
                                    HEAP_PER_CONN,
                                    (a as f64 - b as f64) / n as f64,
                                    rep,
                                    false,
                                    Vec::new(),
                                );
                            }
                            self.record(
                                "memory",
                                &case,
                                &r.label,
                                "RSS MiB",
                                after as f64 / (1 << 20) as f64,
                                rep,
                                false,
                                Vec::new(),
                            );
                            println!("    opened {n} in {open_secs:.1} s");
                            rt.block_on(async move { drop(conns) });
                        }
                        Err(e) => self.fail(&format!("memory {case} via {}", r.label), e),
                    }
                    drop(r);
                }
            }
            self.summarize("memory", &case);
        }
    }

    fn systems_for_memory(&mut self) -> Vec<SystemKind> {
        let mut kinds = Vec::new();
        for &k in SystemKind::ALL.iter() {
            if k == SystemKind::Direct || !self.systems.contains(&k) {
                continue;
            }
            match systems::available(k, &self.opts(None, 0)) {
                Ok(()) => kinds.push(k),
                Err(e) if k.is_anp() => self.note(format!("memory: {}: {e}", k.name())),
                Err(_) => {}
            }
        }
        kinds
    }

    fn scaling(
        &mut self,
        rt: &tokio::runtime::Runtime,
        targets: &[std::net::SocketAddr],
        plan: &Plan,
    ) {
        println!("== core scaling: edgetunnel --workers 1 vs 2, and 2 with one agent link (CONNECT frontend)");
        let mut running = Vec::new();
        for (w, one_link) in [(1usize, false), (2, true), (2, false)] {
            let opts = StartOptions {
                one_link,
                ..self.opts(Some(w), 1024)
            };
            match systems::start(SystemKind::EdgetunnelConnect, targets, &opts) {
                Ok(r) => running.push(r),
                Err(e) => self.fail(&format!("starting edgetunnel --workers {w}"), e),
            }
        }
        for rep in 0..self.reps {
            for r in &running {
                let cpu = || r.cpu_snapshot();
                match rt.block_on(scenarios::bulk(
                    &r.entries,
                    64,
                    false,
                    plan.bulk_bytes,
                    &cpu,
                )) {
                    Ok(b) => {
                        self.record_bulk("scaling", "64 streams download", &r.label, &b, rep, true)
                    }
                    Err(e) => self.fail(&format!("scaling bulk via {}", r.label), e),
                }
                match rt.block_on(scenarios::dial(
                    &r.entries,
                    plan.dial_concurrency,
                    plan.dial_dur,
                )) {
                    Ok((rate, _, _)) => self.record(
                        "scaling",
                        "dial rate",
                        &r.label,
                        "conn/s",
                        rate,
                        rep,
                        true,
                        Vec::new(),
                    ),
                    Err(e) => self.fail(&format!("scaling dial via {}", r.label), e),
                }
                match rt.block_on(scenarios::latency(
                    &r.entries,
                    plan.latency_conns,
                    None,
                    plan.latency_dur,
                    &cpu,
                )) {
                    Ok(l) => {
                        let case = "1 KiB request/response at saturation";
                        self.record_saturation("scaling", case, &r.label, &l, rep);
                        if let Some(w) = l.cpu {
                            self.record_context("scaling", case, &r.label, &w, rep);
                        }
                    }
                    Err(e) => self.fail(&format!("scaling latency via {}", r.label), e),
                }
            }
        }
        for case in [
            "64 streams download",
            "dial rate",
            "1 KiB request/response at saturation",
        ] {
            self.summarize("scaling", case);
        }
    }
}

/// Most idle connections a system is asked to hold in the memory scenario.
fn memory_cap(k: SystemKind) -> usize {
    match k {
        SystemKind::Socat => 1_000,
        SystemKind::SshR | SystemKind::StunnelPair => 10_000,
        _ => usize::MAX,
    }
}

fn cap_reason(k: SystemKind) -> &'static str {
    match k {
        SystemKind::Socat => "a process per connection",
        SystemKind::SshR => "one ssh process polls every channel",
        SystemKind::StunnelPair => "a thread per connection in each stunnel",
        _ => "",
    }
}

/// Lifts RLIMIT_NOFILE (children inherit it): 100,000 tunneled connections
/// need several descriptors each.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        let want = libc::rlimit {
            rlim_cur: 1 << 20,
            rlim_max: 1 << 20,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &want) != 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Widens the ephemeral port range for the run (root only) and puts the
/// old one back at the end.
struct PortRange(String);

const PORT_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

impl PortRange {
    fn widen() -> Option<PortRange> {
        let old = std::fs::read_to_string(PORT_RANGE).ok()?;
        std::fs::write(PORT_RANGE, "10000 65000").ok()?;
        Some(PortRange(old.trim().replace('\t', " ")))
    }
}

impl Drop for PortRange {
    fn drop(&mut self) {
        let _ = std::fs::write(PORT_RANGE, &self.0);
    }
}

/// The machine, and how the run shares it.
fn machine() -> String {
    format!(
        "{}, loopback; load generator, targets and every system share the cores",
        run_facts::machine()
    )
}

/// Child mode: serves the targets, prints their addresses, runs until killed.
fn serve_targets() -> ! {
    raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let addrs = rt.block_on(target::start(4)).expect("targets");
    let list: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    println!("TARGETS {}", list.join(","));
    rt.block_on(std::future::pending::<()>());
    unreachable!()
}

/// The target process, killed on drop.
struct TargetProc(std::process::Child);

impl Drop for TargetProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_targets() -> (TargetProc, Vec<std::net::SocketAddr>) {
    use std::io::BufRead;
    let exe = std::env::current_exe().expect("own path");
    let mut child = std::process::Command::new(exe)
        .arg("--serve-targets")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("target process");
    let out = child.stdout.take().expect("stdout");
    let proc = TargetProc(child);
    let mut line = String::new();
    std::io::BufReader::new(out)
        .read_line(&mut line)
        .expect("target addresses");
    let addrs = line
        .trim()
        .strip_prefix("TARGETS ")
        .expect("TARGETS line")
        .split(',')
        .map(|a| a.parse().expect("address"))
        .collect();
    (proc, addrs)
}

/// Descriptors this process may hold (the soft limit after raising it).
fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit on a local struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    // `rlim_t` is 32 bits on armv7.
    #[allow(clippy::useless_conversion)]
    u64::from(lim.rlim_cur)
}
