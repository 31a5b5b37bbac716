//! The fleet scenario (`--scenarios fleet`, sizes from `--fleet-sizes`):
//! for each N a fresh `edgetunnel server` (this build, default workers,
//! `--bind-agent-identity=false` so that N simulated agents share one
//! client certificate, ServiceAccount tokens reviewed by the fake
//! TokenReview endpoint of [`crate::fleet_kube`]) and N simulated agents
//! ([`crate::fleet`]) in this process. Measured, in order:
//!
//! - cold connect: from starting N agents at once until N links are up;
//! - server RSS per idle link: (VmRSS with N linked − VmRSS with none) / N,
//!   right after the last link and again after the idle window;
//! - server CPU per idle link per minute over an idle window with the
//!   server's HTTP/2 keepalive (default 30 s PINGs) running, less the
//!   server's own idle CPU with no agent (measured over a third of that
//!   window before the agents start);
//! - dial latency through a random agent: CONNECT `fleet-K:7` to the
//!   CONNECT frontend, time to the 200 and a 1-byte echo, p50 and p99,
//!   dialled one at a time from a thread of its own with blocking sockets
//!   (not from the runtime that runs the N simulated agents, whose
//!   scheduling would add to the figure), with the machine's CPU use and
//!   the server's and this process's during the dials (is the machine the
//!   limit?); after all sizes, each size's p99 over the smallest size's
//!   ("dial p99 ÷ smallest", issue 30's goal: ≤ 1.2 at 10,000 against 10);
//! - a restart: kill -9 of the server with N linked, the same command and
//!   ports again at once, until every agent linked again (from the kill),
//!   with the server's peak CPU (per 500 ms sample) and RSS, link
//!   handshakes per second (average and peak 500 ms sample), attempts
//!   refused or failed meanwhile (and refused as busy: the server's
//!   handshake caps were full, it answered a TLS `user_canceled` alert),
//!   agents not back by the deadline ("gave up"), and TokenReview calls per
//!   agent.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::fleet::{self, Fleet, FleetConfig};
use crate::fleet_kube::{self, FakeReviews};
use crate::probe::{metric_sum, metrics_text, rss};
use crate::Harness;

const SYSTEM: &str = "edgetunnel";
/// ANP's Go proxy-server, run with the same fleet at sizes up to `GO_MAX`.
const GO_SYSTEM: &str = "anp-go";
const GO_MAX: usize = 1_000;

/// ANP's server binary in `target/peers` (unpacked by the peers tests).
fn go_server() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/peers/anp-server");
    p.is_file().then_some(p)
}

/// Durations and counts of one mode.
pub(crate) struct FleetPlan {
    pub sizes: Vec<usize>,
    pub idle: Duration,
    pub dials: usize,
    /// How long agents may take to link (cold and after the restart).
    pub deadline: Duration,
    pub quick: bool,
}

impl FleetPlan {
    pub(crate) fn new(quick: bool, sizes: Option<Vec<usize>>) -> FleetPlan {
        if quick {
            FleetPlan {
                sizes: sizes.unwrap_or(vec![50]),
                idle: Duration::from_secs(1),
                dials: 20,
                deadline: Duration::from_secs(30),
                quick,
            }
        } else {
            FleetPlan {
                sizes: sizes.unwrap_or(vec![10, 100, 1_000, 5_000, 10_000]),
                idle: Duration::from_secs(30),
                dials: 1_000,
                deadline: Duration::from_secs(120),
                quick,
            }
        }
    }
}

/// The server process: spawned with fixed arguments, so that a restart is
/// the same command on the same ports.
struct ServerProc {
    bin: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
    /// A log line holding this says the server is ready.
    ready: &'static str,
}

impl ServerProc {
    /// Starts it (stdout and stderr to its log, truncated) and waits until
    /// the log holds `self.ready`.
    fn start(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(&self.log).map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            .env_remove("PROXY_SERVER_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.bin.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::fs::read_to_string(&self.log).is_ok_and(|l| l.contains(self.ready)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!(
            "server not ready in 20 s; log: {}",
            log_tail(&self.log)
        ))
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// utime + stime of `pid`, seconds.
fn cpu_secs(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| crate::cpu::parse_stat(&s))
        .map_or(0.0, |t| {
            crate::cpu::ticks_to_seconds(t.own, crate::cpu::clock_ticks())
        })
}

/// `edgetunnel_agents_connected` from the admin listener's /metrics.
fn gauge_connected(admin: SocketAddr) -> Option<f64> {
    metric_sum(&metrics_text(admin)?, "edgetunnel_agents_connected")
}

/// The lines of the admin listener's /metrics that start with one of
/// `prefixes`.
fn metric_lines(admin: SocketAddr, prefixes: &[&str]) -> Vec<String> {
    metrics_text(admin)
        .unwrap_or_default()
        .lines()
        .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
        .map(str::to_string)
        .collect()
}

/// One dial through agent `k`: CONNECT, 200, one byte echoed; its time.
/// Blocking: run from a thread of its own.
fn dial_once(connect: SocketAddr, k: usize) -> std::io::Result<Duration> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect_timeout(&connect, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let host = format!("{}:7", fleet::agent_name(k));
    s.write_all(format!("CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())?;
    let mut head = Vec::new();
    let mut b = [0u8; 512];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut b)?;
        if n == 0 {
            return Err(std::io::Error::other("CONNECT: closed before an answer"));
        }
        head.extend_from_slice(&b[..n]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(std::io::Error::other(format!(
            "CONNECT {host}: {}",
            String::from_utf8_lossy(&head).lines().next().unwrap_or("")
        )));
    }
    s.write_all(b"x")?;
    let mut one = [0u8; 1];
    s.read_exact(&mut one)?;
    if one[0] != b'x' {
        return Err(std::io::Error::other("echo differs"));
    }
    Ok(t0.elapsed())
}

/// `dials` dials through random agents of `n`, one at a time, from a new
/// thread: the latencies (ms) and the errors.
fn dial_many(connect: SocketAddr, n: usize, dials: usize) -> (Vec<f64>, Vec<String>) {
    std::thread::spawn(move || {
        let (mut lat, mut errors) = (Vec::with_capacity(dials), Vec::new());
        for _ in 0..dials {
            match dial_once(connect, fastrand::usize(..n)) {
                Ok(d) => lat.push(d.as_secs_f64() * 1000.0),
                Err(e) => errors.push(e.to_string()),
            }
        }
        (lat, errors)
    })
    .join()
    .unwrap_or_default()
}

/// The machine's busy and total jiffies (all CPUs) from /proc/stat.
fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    // idle + iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// What the restart measured.
struct Restart {
    relink: Option<Duration>,
    peak_cpu: f64,
    peak_rss: u64,
    avg_hs: f64,
    peak_hs: f64,
    gave_up: usize,
    refused: u64,
    busy: u64,
    handshake_failed: u64,
    reviews: u64,
}

impl Harness {
    /// The fleet scenario for every size of `plan`.
    pub(crate) fn fleet(&mut self, rt: &tokio::runtime::Runtime, plan: &FleetPlan) {
        println!("== fleet: N simulated agents on one edgetunnel server");
        let limit = crate::nofile_limit();
        self.note(format!(
            "fleet: one load process holds one descriptor per agent link (its RLIMIT_NOFILE is {limit}, \
             so it binds near {} links); the server holds one per link too, within the same limit; \
             agents share one client certificate, the server runs with --bind-agent-identity=false; \
             each agent presents its own ServiceAccount token, reviewed by a fake TokenReview endpoint",
            limit.saturating_sub(1000)
        ));
        let kube = match FakeReviews::start() {
            Ok(k) => k,
            Err(e) => return self.fail("fleet: fake TokenReview endpoint", e),
        };
        for &n in &plan.sizes {
            if n as u64 + 1000 > limit {
                self.note(format!(
                    "fleet {n}: skipped, {n} links do not fit RLIMIT_NOFILE {limit}"
                ));
                continue;
            }
            if let Err(e) = self.fleet_one(rt, plan, &kube, n, None) {
                self.fail(&format!("fleet {n}"), e);
            }
            match (go_server(), n <= GO_MAX) {
                (Some(go), true) => {
                    if let Err(e) = self.fleet_one(rt, plan, &kube, n, Some(go)) {
                        self.fail(&format!("fleet {n} via {GO_SYSTEM}"), e);
                    }
                }
                (None, _) if !plan.quick => self.note(format!(
                    "fleet {n}: {GO_SYSTEM} skipped (no target/peers/anp-server)"
                )),
                _ => {}
            }
        }
        for (case, system, ratio) in crate::fleet_table::p99_ratios(&self.samples) {
            self.record(
                "fleet",
                &case,
                &system,
                crate::fleet_table::DIAL_P99_RATIO,
                ratio,
                0,
                false,
                Vec::new(),
            );
        }
    }

    fn fleet_one(
        &mut self,
        rt: &tokio::runtime::Runtime,
        plan: &FleetPlan,
        kube: &FakeReviews,
        n: usize,
        go: Option<PathBuf>,
    ) -> Result<(), String> {
        let case = format!("{n} agents");
        let system = if go.is_some() { GO_SYSTEM } else { SYSTEM };
        // The machine is shared: say how busy it was.
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        self.note(format!(
            "fleet {n} via {system}: load average at start {}",
            load.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        ));
        let dir = tempfile::Builder::new()
            .prefix("bench-fleet-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_edgetunnel"));
        let certs = dir.path().join("certs");
        let st = Command::new(&bin)
            .args(["certs", "init"])
            .arg(&certs)
            .args(["--agent-name", "fleet"])
            .output()
            .map_err(|e| e.to_string())?;
        if !st.status.success() {
            return Err(format!(
                "certs init: {}",
                String::from_utf8_lossy(&st.stderr)
            ));
        }
        let kc = dir.path().join("kubeconfig");
        kube.kubeconfig(&kc).map_err(|e| e.to_string())?;
        let ports = free_ports(4)?;
        let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let (agent_addr, connect, admin) = (addr(ports[0]), addr(ports[1]), addr(ports[2]));
        let c = |f: &str| certs.join(f).display().to_string();
        let mut server = match &go {
            None => ServerProc {
                bin,
                args: [
                    "server",
                    "--certs-dir",
                    &certs.display().to_string(),
                    "--agent-bind",
                    &agent_addr.to_string(),
                    "--connect-bind",
                    &connect.to_string(),
                    "--admin-bind",
                    &admin.to_string(),
                    "--bind-agent-identity=false",
                    "--agent-namespace",
                    fleet_kube::NAMESPACE,
                    "--agent-service-account",
                    fleet_kube::SERVICE_ACCOUNT,
                    "--authentication-audience",
                    fleet_kube::AUDIENCE,
                    "--kube",
                    &kc.display().to_string(),
                    "--log",
                    "warn",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                child: None,
                log: dir.path().join("server.log"),
                ready: "READY",
            },
            // ANP's server (flags as tests/peers/go_server.rs starts it):
            // frontend on a unix socket, agents over mutual TLS with the
            // same certificates, keepalive as often as ours (30 s), no
            // token review.
            Some(go) => ServerProc {
                bin: go.clone(),
                args: vec![
                    "--mode=grpc".into(),
                    format!("--uds-name={}", dir.path().join("anp.sock").display()),
                    "--server-port=0".into(),
                    format!("--cluster-cert={}", c("server.crt")),
                    format!("--cluster-key={}", c("server.key")),
                    format!("--cluster-ca-cert={}", c("ca.crt")),
                    "--agent-bind-address=127.0.0.1".into(),
                    format!("--agent-port={}", ports[0]),
                    format!("--admin-port={}", ports[2]),
                    "--health-bind-address=127.0.0.1".into(),
                    format!("--health-port={}", ports[3]),
                    "--keepalive-time=30s".into(),
                ],
                child: None,
                log: dir.path().join("anp-server.log"),
                ready: "Starting health server",
            },
        };
        server.start()?;
        std::thread::sleep(Duration::from_millis(500));
        let rss0 = rss(server.pid());
        // The server's own idle CPU with no agent (timers, control thread),
        // subtracted from the per-agent figure below.
        let base_window = plan.idle / 3;
        let (b0, bt) = (cpu_secs(server.pid()), Instant::now());
        std::thread::sleep(base_window);
        let base_per_min = (cpu_secs(server.pid()) - b0) / (bt.elapsed().as_secs_f64() / 60.0);

        let cfg = Arc::new(FleetConfig {
            server: agent_addr,
            server_name: "localhost".into(),
            tls: fleet::client_tls(&certs)?,
            token_prefix: go.is_none().then(|| fleet_kube::TOKEN_PREFIX.to_string()),
        });
        let fleet = Fleet::start(rt, cfg, n);
        let Some(cold) = fleet.wait_linked(n, plan.deadline) else {
            let (t, h, r) = fleet.stats.failures();
            return Err(format!(
                "only {} of {n} linked after {:?} (failed attempts: tcp {t}, handshake {h}, refused {r}); server log: {}",
                fleet.stats.linked.load(Ordering::Relaxed),
                plan.deadline,
                log_tail(&server.log)
            ));
        };
        self.record(
            "fleet",
            &case,
            system,
            "cold connect s",
            cold.as_secs_f64(),
            0,
            false,
            Vec::new(),
        );
        // The server's own count agrees with the simulator's.
        std::thread::sleep(Duration::from_millis(300));
        if let Some(g) = gauge_connected(admin).filter(|_| go.is_none()) {
            if g as usize != n {
                self.note(format!(
                    "fleet {n}: edgetunnel_agents_connected is {g} with {n} simulated links up"
                ));
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        let rss1 = rss(server.pid());
        self.record(
            "fleet",
            &case,
            system,
            "server KB/agent",
            rss1.saturating_sub(rss0) as f64 / n as f64 / 1024.0,
            0,
            false,
            Vec::new(),
        );
        let c0 = cpu_secs(server.pid());
        let t0 = Instant::now();
        std::thread::sleep(plan.idle);
        let cpu = cpu_secs(server.pid()) - c0;
        let minutes = t0.elapsed().as_secs_f64() / 60.0;
        // Again after the idle window: what the allocator gave back of the
        // connect burst's transient memory.
        self.record(
            "fleet",
            &case,
            system,
            "server KB/agent after idle",
            rss(server.pid()).saturating_sub(rss0) as f64 / n as f64 / 1024.0,
            0,
            false,
            Vec::new(),
        );
        self.record(
            "fleet",
            &case,
            system,
            "server CPU ms/min idle, no agents",
            base_per_min * 1000.0,
            0,
            false,
            Vec::new(),
        );
        self.record(
            "fleet",
            &case,
            system,
            "server CPU ms/agent/min idle",
            (cpu / minutes - base_per_min).max(0.0) * 1000.0 / n as f64,
            0,
            false,
            Vec::new(),
        );

        let dials = if go.is_some() { 0 } else { plan.dials };
        let (m0, s0, l0, t0) = (
            machine_jiffies(),
            cpu_secs(server.pid()),
            cpu_secs(std::process::id()),
            Instant::now(),
        );
        let (mut lat, errors) = dial_many(connect, n, dials);
        let (m1, secs) = (machine_jiffies(), t0.elapsed().as_secs_f64());
        if dials > 0 && secs > 0.0 {
            let busy = (m1.0 - m0.0) as f64 / (m1.1 - m0.1).max(1) as f64 * 100.0;
            self.note(format!(
                "fleet {n}: during the {dials} dials ({secs:.1} s) the machine's CPUs were {busy:.0}% busy; \
                 the server used {:.0}% of a core, the load process (N agents and the dialling thread) {:.0}%",
                (cpu_secs(server.pid()) - s0) / secs * 100.0,
                (cpu_secs(std::process::id()) - l0) / secs * 100.0,
            ));
        }
        if lat.is_empty() && dials > 0 {
            return Err(format!(
                "no dial succeeded: {}",
                errors.first().cloned().unwrap_or_default()
            ));
        }
        if !lat.is_empty() {
            lat.sort_by(f64::total_cmp);
            self.record(
                "fleet",
                &case,
                system,
                "dial p50 ms",
                pct(&lat, 50.0),
                0,
                false,
                Vec::new(),
            );
            self.record(
                "fleet",
                &case,
                system,
                crate::fleet_table::DIAL_P99,
                pct(&lat, 99.0),
                0,
                false,
                Vec::new(),
            );
        }
        if let Some(e) = errors.first() {
            self.note(format!(
                "fleet {n}: {} of {dials} dials failed; the first: {e}",
                errors.len()
            ));
        }

        let r = restart(&mut server, &fleet, kube, n, plan.deadline)?;
        // What the server says it shed or refused, and what the agents saw.
        if go.is_none() {
            let said = metric_lines(
                admin,
                &[
                    "edgetunnel_agent_handshakes_shed_total",
                    "edgetunnel_agent_handshakes_refused_total",
                    "edgetunnel_agents_refused_total",
                    "edgetunnel_agent_handshakes_cap",
                ],
            );
            // Counters that stayed 0 say nothing; the caps always do.
            let said: Vec<String> = said
                .into_iter()
                .filter(|l| l.contains("_cap{") || !l.ends_with(" 0"))
                .collect();
            self.note(format!(
                "fleet {n}: after the restart the server counts {}",
                said.join(", ")
            ));
        }
        let errors = fleet.stats.handshake_errors.lock().unwrap().clone();
        if !errors.is_empty() {
            self.note(format!(
                "fleet {n} via {system}: handshake errors seen (first kinds, cold and restart): {}",
                errors.join("; ")
            ));
        }
        let mut rec = |metric: &str, v: f64| {
            self.record("fleet", &case, system, metric, v, 0, false, Vec::new())
        };
        rec(
            "restart relink s",
            r.relink.map_or(f64::NAN, |d| d.as_secs_f64()),
        );
        rec("restart peak CPU %", r.peak_cpu);
        rec("restart peak RSS MB", r.peak_rss as f64 / 1e6);
        rec("restart gave up", r.gave_up as f64);
        rec("restart refused attempts", r.refused as f64);
        rec("restart busy refusals", r.busy as f64);
        rec("restart failed handshakes", r.handshake_failed as f64);
        if go.is_none() {
            rec("restart TokenReviews/agent", r.reviews as f64 / n as f64);
        }
        self.record(
            "fleet",
            &case,
            system,
            "restart handshakes/s avg",
            r.avg_hs,
            0,
            true,
            Vec::new(),
        );
        self.record(
            "fleet",
            &case,
            system,
            "restart handshakes/s peak",
            r.peak_hs,
            0,
            true,
            Vec::new(),
        );
        drop(fleet);
        server.kill();
        Ok(())
    }
}

/// kill -9 with every agent linked, the same server again at once, and
/// until all agents linked again (or `deadline`).
fn restart(
    server: &mut ServerProc,
    fleet: &Fleet,
    kube: &FakeReviews,
    n: usize,
    deadline: Duration,
) -> Result<Restart, String> {
    let s = &fleet.stats;
    let (_, h0, r0) = s.failures();
    let busy0 = s.busy.load(Ordering::Relaxed);
    let made0 = s.links_made.load(Ordering::Relaxed);
    let kill = Instant::now();
    server.kill();
    s.reset_seen();
    let reviews0 = kube.count();
    server.start()?;
    let pid = server.pid();
    let (mut peak_cpu, mut peak_rss, mut peak_hs) = (0.0f64, 0u64, 0.0f64);
    let (mut last_cpu, mut last_t, mut last_made) = (cpu_secs(pid), Instant::now(), made0);
    let mut relink = None;
    while kill.elapsed() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let (c, t, made) = (
            cpu_secs(pid),
            Instant::now(),
            s.links_made.load(Ordering::Relaxed),
        );
        let dt = t.duration_since(last_t).as_secs_f64();
        peak_cpu = peak_cpu.max((c - last_cpu) / dt * 100.0);
        peak_hs = peak_hs.max((made - last_made) as f64 / dt);
        peak_rss = peak_rss.max(rss(pid));
        (last_cpu, last_t, last_made) = (c, t, made);
        if s.seen() >= n && s.linked.load(Ordering::Relaxed) >= n {
            relink = Some(kill.elapsed());
            break;
        }
    }
    // Reviews still under way when the last agent linked count too.
    std::thread::sleep(Duration::from_millis(500));
    let (_, h1, r1) = s.failures();
    let secs = relink.unwrap_or(deadline).as_secs_f64();
    Ok(Restart {
        relink,
        peak_cpu,
        peak_rss,
        avg_hs: (s.links_made.load(Ordering::Relaxed) - made0) as f64 / secs,
        peak_hs,
        gave_up: n.saturating_sub(s.seen()),
        refused: r1 - r0,
        busy: s.busy.load(Ordering::Relaxed) - busy0,
        handshake_failed: h1 - h0,
        reviews: kube.count() - reviews0,
    })
}

fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let ls = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    ls.iter()
        .map(|l| l.local_addr().map(|a| a.port()).map_err(|e| e.to_string()))
        .collect()
}

fn log_tail(p: &Path) -> String {
    let b = std::fs::read(p).unwrap_or_default();
    String::from_utf8_lossy(&b[b.len().saturating_sub(1500)..]).into_owned()
}
