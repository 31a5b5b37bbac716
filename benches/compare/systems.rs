//! Starting and stopping the systems under test on loopback.
//!
//! `start` brings one system up so that `entries[i]` of the returned
//! [`Running`] leads to `targets[i]`, and returns once it carries
//! connections; dropping the [`Running`] kills every process it started,
//! with their descendants, and removes its scratch directory. Nothing here
//! changes machine-wide settings: the harness raises `RLIMIT_NOFILE`
//! before starting anything and the children inherit it.
//!
//! Readiness never sends application bytes to a target: relays and reverse
//! tunnels are ready when each entry port is in LISTEN state and the socket
//! belongs to one of the system's own processes (listeners asked of the
//! kernel over sock_diag netlink, owners read from `/proc/PID/fd`), which
//! for the reverse tunnels (rathole, `ssh -R`) only happens once their
//! control channel is up; edgetunnel tells readiness on stdout (`READY`,
//! `CONNECTED`).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use crate::client::Entry;
use crate::model::SystemKind;

mod anchors;

/// edgetunnel's gauge of the agents linked to the server.
const AGENTS_CONNECTED: &str = "edgetunnel_agents_connected";
/// How long a system may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Interval of the readiness polls.
const POLL: Duration = Duration::from_millis(10);
/// Connections a relay accepts beyond `max_conns` (stragglers of a previous
/// case still closing, probes).
const CONN_MARGIN: usize = 1024;
/// OpenSSH's hard limit of channels per connection (`CHANNELS_MAX_CHANNELS`
/// in channels.h): every forwarded connection of `ssh -R` is one channel.
const SSH_MAX_CHANNELS: usize = 16 * 1024;
/// Descriptors a process needs besides its connections (listeners, logs,
/// pipes, epoll, TLS state files).
const FD_OVERHEAD: usize = 256;
/// Bytes of a child's log quoted in an error.
const LOG_TAIL: u64 = 2000;

/// What `start` needs besides the system and its targets.
#[derive(Clone, Debug)]
pub(crate) struct StartOptions {
    /// Path of the edgetunnel binary (main passes env!("CARGO_BIN_EXE_edgetunnel")).
    pub edgetunnel_bin: PathBuf,
    /// edgetunnel `--workers` (server and agent); None = its default
    /// (core count).
    pub workers: Option<usize>,
    /// edgetunnel agent `--max-links-per-server 1`: one connection, as
    /// before agent links (for A/B in the scaling rows).
    pub one_link: bool,
    /// Most connections the scenario will hold open at once (configure haproxy maxconn, rathole, sshd etc. so they do not refuse below this). Up to 100_000.
    pub max_conns: usize,
    /// edgetunnel-connect: callers reach the CONNECT frontend on a unix
    /// socket (`--connect-uds`, as kube-apiserver's egress over UDS dials
    /// it) instead of TCP; labelled ` uds`.
    pub connect_uds: bool,
    /// edgetunnel: ANP's Go agent instead of ours (needs the real peers);
    /// labelled ` go-agent`.
    pub go_agent: bool,
    /// edgetunnel: the server names a handover socket
    /// (`--handover-socket`), so that [`Running::restart_server`] hands its
    /// listeners to the new server instead of stopping it first, and the
    /// old one drains open tunnels for up to [`GRACEFUL_SECS`]. Without it
    /// the server keeps its default graceful timeout (0: it exits at once
    /// on SIGTERM, as the Go ANP does).
    pub handover: bool,
}

/// edgetunnel's `--graceful-shutdown-timeout-secs` with a handover socket.
pub(crate) const GRACEFUL_SECS: u64 = 30;

/// How [`Running::restart_server`] replaces a system's server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RestartHow {
    /// The new server starts beside the old one and takes its listening
    /// sockets over the handover socket (edgetunnel `--handover-socket`);
    /// the old one drains and exits on its own.
    Handover,
    /// The old server is stopped (SIGTERM, then waited for), then the new
    /// one starts on the same addresses: ANP's only way, and edgetunnel's
    /// without a handover socket.
    Plain,
}

/// What [`Running::restart_server`] needs to start the server again.
#[derive(Clone, Debug)]
struct Recipe {
    /// The server's process name.
    name: &'static str,
    program: PathBuf,
    /// The arguments of the new server: the first one's, with the
    /// addresses it listens on in place of port 0.
    args: Vec<OsString>,
    how: RestartHow,
    /// Environment variables the server must not inherit.
    unset_env: Vec<&'static str>,
    /// Where the new server is ready to carry tunnels.
    ready: Ready,
}

/// When a restarted server is ready.
#[derive(Clone, Debug)]
enum Ready {
    /// edgetunnel: it printed `READY`, and (plain restart) its admin
    /// listener counts an agent again.
    Edgetunnel { admin: SocketAddr },
    /// ANP: these ports listen, the frontend socket (if any) exists, and
    /// the ready-backends gauge on `admin` counts the agent again.
    Anp {
        ports: Vec<u16>,
        admin: u16,
        uds: Option<PathBuf>,
    },
}

/// How one [`Running::restart_server`] went.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Restarted {
    /// From the start of the restart until the new server carries tunnels
    /// (plain: it listens and an agent linked again; handover: it took
    /// the listeners over and printed `READY`).
    pub ready: Duration,
    /// Plain: how long the old server took to exit after SIGTERM.
    pub stopped: Option<Duration>,
}

/// One process started for a system, with the file its output goes to.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    /// Where it serves Prometheus text (`GET /metrics`), if it does.
    metrics: Option<SocketAddr>,
}

/// The server or the agent process of a tunnel system.
pub(crate) struct RoleProc {
    /// "server" or "agent".
    pub role: &'static str,
    pub pid: u32,
    /// Where it serves /metrics, if it does.
    pub metrics: Option<SocketAddr>,
}

/// A started system. Owns its processes (killed with all their
/// descendants on drop) and its scratch directory (configs, keys, logs;
/// removed on drop).
pub(crate) struct Running {
    pub kind: SystemKind,
    /// `kind.name()`, plus ` --workers N` for edgetunnel when set.
    pub label: String,
    /// `entries[i]` reaches `targets[i]` of `start`.
    pub entries: Vec<Entry>,
    procs: Vec<Proc>,
    /// Servers replaced through a handover: still draining, no longer
    /// checked for readiness; killed on drop like `procs`.
    retired: Vec<Proc>,
    /// How the server starts again, for systems that can restart it.
    recipe: Option<Recipe>,
    // Declared after `procs` and removed by `Drop` only after the kill.
    dir: Option<tempfile::TempDir>,
}

impl Running {
    fn new(kind: SystemKind, label: String) -> Result<Running, String> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("bench-{}-", kind.name()))
            .tempdir()
            .map_err(|e| format!("{}: creating a scratch directory: {e}", kind.name()))?;
        Ok(Running {
            kind,
            label,
            entries: Vec::new(),
            procs: Vec::new(),
            retired: Vec::new(),
            recipe: None,
            dir: Some(dir),
        })
    }

    /// Resident memory (bytes) of the system's own processes and all their
    /// descendants (socat forks a child per connection; sshd forks per
    /// session), as the sum of their proportional set sizes (Pss): a page
    /// shared by N processes counts 1/N in each, so socat's children do not
    /// count the binary and libc they share once each. For a single
    /// process Pss is its RSS. Direct = 0.
    pub(crate) fn rss_bytes(&self) -> u64 {
        self.pids().into_iter().map(pss_of).sum()
    }

    /// CPU the system's processes have used so far (its roots and all
    /// their live descendants, each with the children it has reaped; see
    /// `cpu`), their threads', and the machine's. None when the system has
    /// no process of its own (direct).
    pub(crate) fn cpu_snapshot(&self) -> Option<crate::cpu::Snapshot> {
        if self.procs.is_empty() {
            return None;
        }
        Some(crate::cpu::Snapshot::take(&self.pids()))
    }

    /// The server and agent processes of a tunnel system (edgetunnel, the
    /// Go ANP; none for the other systems), in the order started.
    pub(crate) fn roles(&self) -> Vec<RoleProc> {
        self.procs
            .iter()
            .filter_map(|p| {
                let role = if p.name.ends_with("-server") {
                    "server"
                } else if p.name.ends_with("-agent") {
                    "agent"
                } else {
                    return None;
                };
                Some(RoleProc {
                    role,
                    pid: p.child.id(),
                    metrics: p.metrics,
                })
            })
            .collect()
    }

    /// Bytes the global allocator holds for the program in all the
    /// system's processes (`edgetunnel_heap_live_bytes`, summed): what a
    /// connection costs whatever the allocator keeps beside it. None when a
    /// process has no /metrics or no such gauge (not edgetunnel).
    pub(crate) fn heap_live_bytes(&self) -> Option<u64> {
        let mut sum = 0.0;
        for p in self.roles() {
            let text = crate::probe::metrics_text(p.metrics?)?;
            sum += crate::probe::metric_sum(&text, "edgetunnel_heap_live_bytes")?;
        }
        Some(sum as u64)
    }

    /// Records where the process started as `name` serves /metrics.
    fn set_metrics(&mut self, name: &str, addr: SocketAddr) {
        if let Some(p) = self.procs.iter_mut().find(|p| p.name == name) {
            p.metrics = Some(addr);
        }
    }

    /// Pids whose memory counts (for perf profiling too): the processes
    /// `start` spawned and all their live descendants.
    pub(crate) fn pids(&self) -> Vec<u32> {
        let roots: Vec<u32> = self.procs.iter().map(|p| p.child.id()).collect();
        let mut pids: Vec<u32> = roots
            .iter()
            .copied()
            .filter(|&p| Path::new(&format!("/proc/{p}")).exists())
            .collect();
        pids.extend(descendants(&roots).into_iter().map(|d| d.pid));
        pids
    }

    fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .unwrap_or(Path::new("/"))
    }

    /// Spawns `cmd` as `name`, owned by `self` from then on: stdin closed,
    /// stderr (and stdout unless piped) written to `<dir>/<name>.log`. Returns the stdout pipe when
    /// `pipe_stdout`.
    fn spawn(
        &mut self,
        name: &str,
        cmd: &mut Command,
        pipe_stdout: bool,
    ) -> Result<Option<ChildStdout>, String> {
        // A restarted server keeps its predecessor's log: name-2.log, ...
        let mut log = self.dir().join(format!("{name}.log"));
        for n in 2.. {
            if !log.exists() {
                break;
            }
            log = self.dir().join(format!("{name}-{n}.log"));
        }
        let file = File::create(&log).map_err(|e| format!("{name}: creating its log: {e}"))?;
        let stdout = if pipe_stdout {
            Stdio::piped()
        } else {
            Stdio::from(
                file.try_clone()
                    .map_err(|e| format!("{name}: log file: {e}"))?,
            )
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::from(file))
            .spawn()
            .map_err(|e| format!("{name}: starting {:?}: {e}", cmd.get_program()))?;
        let out = child.stdout.take();
        self.procs.push(Proc {
            name: name.to_string(),
            child,
            log,
            metrics: None,
        });
        Ok(out)
    }

    /// Err naming the first started process that has already exited, with
    /// the end of its log.
    fn check_alive(&mut self) -> Result<(), String> {
        for p in &mut self.procs {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(format!(
                    "{}: {} exited ({status}) before it was ready; its log ends with:\n{}",
                    self.kind.name(),
                    p.name,
                    log_tail(&p.log)
                ));
            }
        }
        Ok(())
    }

    /// The timeout error for `what`, with the end of every process's log.
    fn timeout_error(&self, what: &str) -> String {
        let mut msg = format!(
            "{}: not ready after {} s: {what}",
            self.kind.name(),
            READY_TIMEOUT.as_secs()
        );
        for p in &self.procs {
            msg.push_str(&format!(
                "\n--- {} log ends with:\n{}",
                p.name,
                log_tail(&p.log)
            ));
        }
        msg
    }

    /// Waits until every port in `ports` listens on a socket owned by one
    /// of this system's processes.
    fn wait_listening(&mut self, ports: &[u16]) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            if listening_owned(ports, || self.pids()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.timeout_error(&format!("127.0.0.1 ports {ports:?} not listening")));
            }
            thread::sleep(POLL);
        }
    }

    /// Polls `ready` until it holds; Err with `what` and the logs after
    /// [`READY_TIMEOUT`] or when a process exits first.
    fn wait_until(&mut self, what: &str, mut ready: impl FnMut() -> bool) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            if ready() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.timeout_error(what));
            }
            thread::sleep(POLL);
        }
    }

    /// Replaces the server by a new process with the same arguments and
    /// addresses, as the system's recipe says: through a listener
    /// handover (the old one drains beside it, in `retired`) or by
    /// stopping the old one first. Returns once the new one carries
    /// tunnels. Err when the system has no server to restart or the new
    /// one does not become ready.
    pub(crate) fn restart_server(&mut self) -> Result<Restarted, String> {
        let recipe = self
            .recipe
            .clone()
            .ok_or_else(|| format!("{}: no server to restart", self.label))?;
        let t0 = Instant::now();
        let at = self
            .procs
            .iter()
            .position(|p| p.name == recipe.name)
            .ok_or_else(|| format!("{}: no {} running", self.label, recipe.name))?;
        let mut old = self.procs.remove(at);
        let metrics = old.metrics;
        let stopped = match recipe.how {
            RestartHow::Handover => {
                self.retired.push(old);
                None
            }
            RestartHow::Plain => {
                // SAFETY: kill(2) with a positive pid has no memory effects.
                unsafe {
                    libc::kill(old.child.id() as libc::pid_t, libc::SIGTERM);
                }
                let deadline = t0 + Duration::from_secs(GRACEFUL_SECS + 10);
                while matches!(old.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    thread::sleep(POLL);
                }
                let _ = old.child.kill();
                let _ = old.child.wait();
                Some(t0.elapsed())
            }
        };
        let mut cmd = Command::new(&recipe.program);
        cmd.args(&recipe.args);
        for v in &recipe.unset_env {
            cmd.env_remove(v);
        }
        let edgetunnel = matches!(recipe.ready, Ready::Edgetunnel { .. });
        let out = self.spawn(recipe.name, &mut cmd, edgetunnel)?;
        if let Some(m) = metrics {
            self.set_metrics(recipe.name, m);
        }
        match &recipe.ready {
            Ready::Edgetunnel { admin } => {
                let lines = drain_lines(out, recipe.name)?;
                self.wait_line(&lines, "READY")?;
                if recipe.how == RestartHow::Plain {
                    self.wait_until("the new server never counted an agent", || {
                        anchors::gauge(admin.port(), AGENTS_CONNECTED) >= Some(1.0)
                    })?;
                }
            }
            Ready::Anp { ports, admin, uds } => {
                self.wait_listening(ports)?;
                self.wait_until("the new server never counted the agent", || {
                    anchors::gauge(*admin, anchors::ANP_READY) >= Some(1.0)
                        && uds.as_ref().is_none_or(|p| p.exists())
                })?;
            }
        }
        Ok(Restarted {
            ready: t0.elapsed(),
            stopped,
        })
    }

    /// Servers replaced through a handover that have not exited yet.
    pub(crate) fn retired_running(&mut self) -> usize {
        self.retired
            .iter_mut()
            .map(|p| matches!(p.child.try_wait(), Ok(None)))
            .filter(|&running| running)
            .count()
    }

    /// Waits for a stdout line starting with `prefix` from `lines` (a
    /// `drain_lines` receiver); returns all lines received up to it.
    fn wait_line(&mut self, lines: &Receiver<String>, prefix: &str) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            match lines.recv_timeout(Duration::from_millis(50)) {
                Ok(line) => {
                    let done = line.starts_with(prefix);
                    seen.push(line);
                    if done {
                        return Ok(seen);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    // Stdout closed: the process is ending; let it finish
                    // so the error can quote its status and log.
                    thread::sleep(Duration::from_millis(100));
                    self.check_alive()?;
                    return Err(self.timeout_error(&format!(
                        "stdout closed before `{prefix}` (got {seen:?})"
                    )));
                }
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                return Err(self.timeout_error(&format!("no `{prefix}` line (got {seen:?})")));
            }
        }
    }
}

impl Drop for Running {
    /// Kills the descendants level by level, deepest first, so that each
    /// dies while its parent still lives to reap it (no orphaned zombies),
    /// then kills and reaps the processes `start` spawned.
    fn drop(&mut self) {
        let roots: Vec<u32> = self
            .procs
            .iter()
            .chain(&self.retired)
            .map(|p| p.child.id())
            .collect();
        for _round in 0..3 {
            let desc = descendants(&roots);
            if desc.is_empty() {
                break;
            }
            let deepest = desc.iter().map(|d| d.depth).max().unwrap_or(0);
            for depth in (1..=deepest).rev() {
                let level: Vec<&Desc> = desc.iter().filter(|d| d.depth == depth).collect();
                for d in &level {
                    // Skip a pid that died and was reused meanwhile.
                    if parent_of(d.pid) == Some(d.ppid) {
                        // SAFETY: kill(2) with a positive pid has no memory effects.
                        unsafe {
                            libc::kill(d.pid as libc::pid_t, libc::SIGKILL);
                        }
                    }
                }
                let deadline = Instant::now() + Duration::from_secs(2);
                while level.iter().any(|d| parent_of(d.pid) == Some(d.ppid))
                    && Instant::now() < deadline
                {
                    thread::sleep(Duration::from_millis(2));
                }
            }
        }
        for p in self.procs.iter_mut().chain(&mut self.retired) {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        if let Some(dir) = self.dir.take() {
            // COMPARE_KEEP=1 keeps configs and logs for a post-mortem.
            if std::env::var_os("COMPARE_KEEP").is_some() {
                eprintln!("kept {}", dir.keep().display());
            } else {
                let _ = dir.close();
            }
        }
    }
}

/// Ok if the tool is installed (for a clear skip message otherwise).
pub(crate) fn available(kind: SystemKind, opts: &StartOptions) -> Result<(), String> {
    match kind {
        SystemKind::Direct => Ok(()),
        SystemKind::Socat => find_tool("socat").map(drop),
        SystemKind::Haproxy => find_tool("haproxy").map(drop),
        SystemKind::Rathole => {
            find_tool("rathole")?;
            find_tool("openssl").map(drop)
        }
        SystemKind::SshR => {
            for tool in ["sshd", "ssh", "ssh-keygen"] {
                find_tool(tool)?;
            }
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return Err("ssh-R: needs root (a private sshd with privilege separation)".into());
            }
            Ok(())
        }
        SystemKind::HaproxyTlsPair => find_tool("haproxy").map(drop),
        SystemKind::StunnelPair => find_tool("stunnel").map(drop),
        SystemKind::AnpUds | SystemKind::AnpTcp | SystemKind::AnpGrpc => {
            anchors::peers_dir().map(drop)
        }
        SystemKind::EdgetunnelConnect | SystemKind::EdgetunnelGrpc => {
            if opts.go_agent {
                anchors::peers_dir()?;
            }
            if is_executable(&opts.edgetunnel_bin) {
                Ok(())
            } else {
                Err(format!(
                    "edgetunnel binary {} not found or not executable",
                    opts.edgetunnel_bin.display()
                ))
            }
        }
    }
}

/// Starts `kind` so that entries[i] leads to targets[i]; returns only when it is ready to carry connections.
pub(crate) fn start(
    kind: SystemKind,
    targets: &[SocketAddr],
    opts: &StartOptions,
) -> Result<Running, String> {
    available(kind, opts)?;
    if targets.is_empty() {
        return Err(format!("{}: no targets", kind.name()));
    }
    if kind == SystemKind::Direct {
        return Ok(Running {
            kind,
            label: kind.name().to_string(),
            entries: targets.iter().map(|&t| Entry::Tcp(t)).collect(),
            procs: Vec::new(),
            retired: Vec::new(),
            recipe: None,
            dir: None,
        });
    }
    let mut label = match (kind.is_edgetunnel(), opts.workers) {
        (true, Some(n)) if opts.one_link => format!("{} --workers {n} one link", kind.name()),
        (true, Some(n)) => format!("{} --workers {n}", kind.name()),
        _ => kind.name().to_string(),
    };
    if kind == SystemKind::EdgetunnelConnect && opts.connect_uds {
        label.push_str(" uds");
    }
    if kind.is_edgetunnel() && opts.go_agent {
        label.push_str(" go-agent");
    }
    let mut run = Running::new(kind, label)?;
    // On any error below, dropping `run` stops what was started so far.
    match kind {
        SystemKind::Direct => {}
        SystemKind::Socat => start_socat(&mut run, targets, opts)?,
        SystemKind::Haproxy => start_haproxy(&mut run, targets, opts)?,
        SystemKind::Rathole => start_rathole(&mut run, targets, opts.max_conns)?,
        SystemKind::SshR => start_ssh(&mut run, targets, opts)?,
        SystemKind::HaproxyTlsPair => anchors::start_haproxy_tls_pair(&mut run, targets, opts)?,
        SystemKind::StunnelPair => anchors::start_stunnel_pair(&mut run, targets, opts)?,
        SystemKind::AnpUds | SystemKind::AnpTcp | SystemKind::AnpGrpc => {
            anchors::start_anp(&mut run, targets, opts)?
        }
        SystemKind::EdgetunnelConnect | SystemKind::EdgetunnelGrpc => {
            start_edgetunnel(&mut run, targets, opts)?
        }
    }
    Ok(run)
}

/// One `socat TCP-LISTEN:P,fork` per target: a process per connection,
/// so `max_conns` is refused up front when the kernel's pid space cannot
/// hold that many processes.
fn start_socat(
    run: &mut Running,
    targets: &[SocketAddr],
    opts: &StartOptions,
) -> Result<(), String> {
    let (pid_max, tasks) = pid_headroom();
    if opts.max_conns + tasks + CONN_MARGIN > pid_max {
        return Err(format!(
            "socat: forks a process per connection; {} connections do not fit \
             kernel.pid_max {pid_max} with {tasks} tasks running",
            opts.max_conns
        ));
    }
    let socat = find_tool("socat")?;
    let ports = free_ports(targets.len())?;
    for (i, (t, p)) in targets.iter().zip(&ports).enumerate() {
        let to = match t {
            SocketAddr::V4(a) => format!("TCP4:{}:{}", a.ip(), a.port()),
            SocketAddr::V6(a) => format!("TCP6:[{}]:{}", a.ip(), a.port()),
        };
        let mut cmd = Command::new(&socat);
        cmd.arg(format!(
            "TCP-LISTEN:{p},bind=127.0.0.1,fork,reuseaddr,backlog=4096"
        ))
        .arg(to);
        run.spawn(&format!("socat-{i}"), &mut cmd, false)?;
    }
    run.wait_listening(&ports)?;
    run.entries = tcp_entries(&ports);
    Ok(())
}

/// One haproxy process (foreground, `-db`) in TCP mode with one `listen`
/// section per target; `maxconn` global and per section is
/// `max_conns + CONN_MARGIN`, less if the fd hard limit allows fewer
/// (haproxy raises its own soft limit to match), timeouts 1 h, no logging.
fn start_haproxy(
    run: &mut Running,
    targets: &[SocketAddr],
    opts: &StartOptions,
) -> Result<(), String> {
    let haproxy = find_tool("haproxy")?;
    // haproxy raises its soft limit to what maxconn needs (2 per
    // connection) and exits when the hard limit is lower.
    let fit = fd_fit("haproxy", opts.max_conns, 2, Limit::Hard)?;
    let maxconn = (opts.max_conns + CONN_MARGIN).min(fit);
    let ports = free_ports(targets.len())?;
    let mut cfg = format!(
        "global\n    maxconn {maxconn}\n\n\
         defaults\n    mode tcp\n    maxconn {maxconn}\n    timeout connect 1h\n    \
         timeout client 1h\n    timeout server 1h\n    timeout client-fin 1h\n    \
         timeout server-fin 1h\n"
    );
    for (i, (t, p)) in targets.iter().zip(&ports).enumerate() {
        let server = match t {
            SocketAddr::V4(a) => a.to_string(),
            SocketAddr::V6(a) => format!("ipv6@{}:{}", a.ip(), a.port()),
        };
        cfg.push_str(&format!(
            "\nlisten t{i}\n    bind 127.0.0.1:{p}\n    maxconn {maxconn}\n    server s{i} {server}\n"
        ));
    }
    let path = run.dir().join("haproxy.cfg");
    fs::write(&path, cfg).map_err(|e| format!("haproxy: writing its config: {e}"))?;
    let mut cmd = Command::new(haproxy);
    cmd.arg("-db").arg("-f").arg(&path);
    run.spawn("haproxy", &mut cmd, false)?;
    run.wait_listening(&ports)?;
    run.entries = tcp_entries(&ports);
    Ok(())
}

/// rathole server + client on loopback, one service per target, over its
/// TLS transport (native-tls, i.e. the system OpenSSL, as
/// `scripts/ensure-bench-tools` builds it): the encrypted transport closest
/// to edgetunnel's TLS, and the quicker build (noise is left out). A
/// self-signed ECDSA P-256 certificate for `localhost`, as edgetunnel's
/// `certs init` makes, is written with `openssl`. rathole's acceptor
/// (openssl's `mozilla_intermediate`) turns TLS 1.3 off and prefers its own
/// cipher order, so the tunnel runs TLS 1.2 ECDHE-ECDSA-CHACHA20-POLY1305
/// (its noise transport is ChaCha20-Poly1305 too); no config reaches that.
/// rathole has no connection limit to raise (it raises its own fd soft
/// limit to the hard one) and opens one TLS data channel per visitor
/// connection, its design. Ready when the server listens on every service
/// port, which it does only once the client's control channel for that
/// service is up.
fn start_rathole(
    run: &mut Running,
    targets: &[SocketAddr],
    max_conns: usize,
) -> Result<(), String> {
    let rathole = find_tool("rathole")?;
    let openssl = find_tool("openssl")?;
    // Each side holds two sockets per connection; rathole raises its soft
    // limit to the hard one.
    fd_fit("rathole", max_conns, 2, Limit::Hard)?;
    let dir = run.dir().to_path_buf();
    let (key, cert, p12) = (
        dir.join("key.pem"),
        dir.join("cert.pem"),
        dir.join("id.p12"),
    );
    run_tool(
        Command::new(&openssl)
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "30"])
            .args(["-subj", "/CN=localhost"])
            .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert),
    )?;
    run_tool(
        Command::new(&openssl)
            .args(["pkcs12", "-export", "-passout", "pass:bench"])
            .arg("-inkey")
            .arg(&key)
            .arg("-in")
            .arg(&cert)
            .arg("-out")
            .arg(&p12),
    )?;
    let ports = free_ports(targets.len() + 1)?;
    let (ctrl, svc_ports) = (ports[0], &ports[1..]);
    let mut server = format!(
        "[server]\nbind_addr = \"127.0.0.1:{ctrl}\"\ndefault_token = \"bench\"\n\n\
         [server.transport]\ntype = \"tls\"\n\n[server.transport.tls]\n\
         pkcs12 = {}\npkcs12_password = \"bench\"\n",
        toml_str(&p12)
    );
    let mut client = format!(
        "[client]\nremote_addr = \"127.0.0.1:{ctrl}\"\ndefault_token = \"bench\"\n\n\
         [client.transport]\ntype = \"tls\"\n\n[client.transport.tls]\n\
         trusted_root = {}\nhostname = \"localhost\"\n",
        toml_str(&cert)
    );
    for (i, (t, p)) in targets.iter().zip(svc_ports).enumerate() {
        server.push_str(&format!(
            "\n[server.services.t{i}]\nbind_addr = \"127.0.0.1:{p}\"\n"
        ));
        client.push_str(&format!("\n[client.services.t{i}]\nlocal_addr = \"{t}\"\n"));
    }
    let (server_cfg, client_cfg) = (dir.join("server.toml"), dir.join("client.toml"));
    fs::write(&server_cfg, server).map_err(|e| format!("rathole: writing server.toml: {e}"))?;
    fs::write(&client_cfg, client).map_err(|e| format!("rathole: writing client.toml: {e}"))?;
    for (name, flag, cfg) in [
        ("rathole-server", "--server", &server_cfg),
        ("rathole-client", "--client", &client_cfg),
    ] {
        let mut cmd = Command::new(&rathole);
        cmd.arg(flag).arg(cfg).env("RUST_LOG", "info");
        run.spawn(name, &mut cmd, false)?;
        if flag == "--server" {
            // A client started before the server listens backs off for
            // about a second before its next attempt.
            run.wait_listening(&[ctrl])?;
        }
    }
    run.wait_listening(svc_ports)?;
    run.entries = tcp_entries(svc_ports);
    Ok(())
}

/// A private sshd (own host key, config and authorized key in the scratch
/// directory, 127.0.0.1 only) and one `ssh -N` carrying every target as a
/// `-R` forward, AES-128-GCM. Ready when sshd listens on every forwarded
/// port (after authentication and the forward requests). One ssh
/// connection carries at most 16384 channels, so larger `max_conns` is
/// refused up front. Without an interactive session sshd leaves Nagle on
/// for its connection socket, so about half of the new forwarded
/// connections wait ~40 ms (a delayed ACK) for their first reply; a pty
/// session (`ssh -tt ... sleep`) would avoid it, but `-N` is how reverse
/// tunnels are run.
fn start_ssh(run: &mut Running, targets: &[SocketAddr], opts: &StartOptions) -> Result<(), String> {
    if opts.max_conns + targets.len() + 16 > SSH_MAX_CHANNELS {
        return Err(format!(
            "ssh-R: one ssh connection carries at most {SSH_MAX_CHANNELS} channels \
             (OpenSSH CHANNELS_MAX_CHANNELS); {} connections do not fit",
            opts.max_conns
        ));
    }
    // sshd's session process and ssh each hold a socket per connection.
    fd_fit("ssh-R", opts.max_conns, 1, Limit::Soft)?;
    let sshd = find_tool("sshd")?;
    let ssh = find_tool("ssh")?;
    let keygen = find_tool("ssh-keygen")?;
    let privsep = Path::new("/run/sshd");
    if !privsep.is_dir() {
        fs::create_dir_all(privsep)
            .and_then(|_| fs::set_permissions(privsep, fs::Permissions::from_mode(0o755)))
            .map_err(|e| format!("ssh-R: creating /run/sshd: {e}"))?;
    }
    let dir = run.dir().to_path_buf();
    let (host_key, user_key) = (dir.join("host_ed25519"), dir.join("user_ed25519"));
    for key in [&host_key, &user_key] {
        run_tool(
            Command::new(&keygen)
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f"])
                .arg(key),
        )?;
    }
    let authorized = dir.join("authorized_keys");
    fs::copy(user_key.with_extension("pub"), &authorized)
        .map_err(|e| format!("ssh-R: writing authorized_keys: {e}"))?;

    let ports = free_ports(targets.len() + 1)?;
    let (sshd_port, fwd_ports) = (ports[0], &ports[1..]);
    let sessions = opts.max_conns.max(10);
    let config = format!(
        "ListenAddress 127.0.0.1:{sshd_port}\nHostKey {}\nPidFile none\nUsePAM no\n\
         PermitRootLogin yes\nStrictModes no\nAuthorizedKeysFile {}\n\
         PubkeyAuthentication yes\nPasswordAuthentication no\n\
         KbdInteractiveAuthentication no\nAllowTcpForwarding yes\nGatewayPorts no\n\
         X11Forwarding no\nPermitTTY no\nPrintMotd no\nUseDNS no\n\
         MaxStartups {sessions}\nMaxSessions {sessions}\nClientAliveInterval 0\n\
         Ciphers aes128-gcm@openssh.com\nLogLevel ERROR\n",
        host_key.display(),
        authorized.display()
    );
    let config_path = dir.join("sshd_config");
    fs::write(&config_path, config).map_err(|e| format!("ssh-R: writing sshd_config: {e}"))?;
    let mut cmd = Command::new(&sshd);
    cmd.args(["-D", "-e", "-f"]).arg(&config_path);
    run.spawn("sshd", &mut cmd, false)?;
    run.wait_listening(&[sshd_port])?;

    let mut cmd = Command::new(&ssh);
    cmd.args(["-N", "-T", "-F", "/dev/null"]);
    for opt in [
        "ExitOnForwardFailure=yes",
        "StrictHostKeyChecking=no",
        "UserKnownHostsFile=/dev/null",
        "Ciphers=aes128-gcm@openssh.com",
        "BatchMode=yes",
        "IdentitiesOnly=yes",
        "LogLevel=ERROR",
    ] {
        cmd.args(["-o", opt]);
    }
    cmd.arg("-i")
        .arg(&user_key)
        .args(["-p", &sshd_port.to_string()]);
    for (t, p) in targets.iter().zip(fwd_ports) {
        cmd.arg("-R").arg(format!("127.0.0.1:{p}:{t}"));
    }
    cmd.arg("root@127.0.0.1");
    run.spawn("ssh", &mut cmd, false)?;
    run.wait_listening(fwd_ports)?;
    run.entries = tcp_entries(fwd_ports);
    Ok(())
}

/// `edgetunnel certs init`, then the server (CONNECT frontend on TCP, or
/// on a unix socket with `connect_uds`, and the gRPC frontend; `--workers`
/// when given) and one agent, both logging at warn, each with its admin
/// listener (/metrics). Ready when the server printed `READY` and the
/// agent `CONNECTED`; their stdout keeps being drained afterwards. With
/// `go_agent` the agent is ANP's Go agent, ready when the server counts it
/// (`edgetunnel_agents_connected`).
fn start_edgetunnel(
    run: &mut Running,
    targets: &[SocketAddr],
    opts: &StartOptions,
) -> Result<(), String> {
    // The server holds a socket per client connection, the agent one per
    // target connection; neither raises its fd limit.
    fd_fit("edgetunnel", opts.max_conns, 1, Limit::Soft)?;
    let bin = &opts.edgetunnel_bin;
    // The agent certificate names the agent ID (the server binds it).
    let certs = anchors::certs(run, opts)?;

    let uds = run.dir().join("connect.socket");
    let handover = run.dir().join("handover.socket");
    // The server's arguments with these agent, connect, gRPC and admin
    // addresses.
    let server_args = |binds: [String; 4]| -> Vec<OsString> {
        let mut args: Vec<OsString> =
            vec!["server".into(), "--certs-dir".into(), certs.clone().into()];
        for (flag, bind) in [
            "--agent-bind",
            "--connect-bind",
            "--grpc-bind",
            "--admin-bind",
        ]
        .into_iter()
        .zip(binds)
        {
            args.extend([flag.into(), bind.into()]);
        }
        args.extend(["--log".into(), "warn".into()]);
        if opts.connect_uds {
            args.extend(["--connect-uds".into(), uds.clone().into_os_string()]);
        }
        if let Some(n) = opts.workers {
            args.extend(["--workers".into(), n.to_string().into()]);
        }
        if opts.handover {
            args.extend([
                "--handover-socket".into(),
                handover.clone().into_os_string(),
                "--graceful-shutdown-timeout-secs".into(),
                GRACEFUL_SECS.to_string().into(),
            ]);
        }
        args
    };
    let mut cmd = Command::new(bin);
    cmd.args(server_args(std::array::from_fn(|_| {
        "127.0.0.1:0".to_string()
    })));
    let out = run.spawn("edgetunnel-server", &mut cmd, true)?;
    let lines = drain_lines(out, "edgetunnel-server")?;
    let seen = run.wait_line(&lines, "READY")?;
    let listen = |what: &str| -> Result<SocketAddr, String> {
        let prefix = format!("LISTEN {what} ");
        seen.iter()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|a| a.trim().parse().ok())
            .ok_or_else(|| format!("edgetunnel server printed no `{prefix}ADDR`: {seen:?}"))
    };
    let (agent_addr, connect, grpc) = (listen("agent")?, listen("connect")?, listen("grpc")?);
    let admin = listen("admin")?;
    run.set_metrics("edgetunnel-server", admin);
    run.recipe = Some(Recipe {
        name: "edgetunnel-server",
        program: bin.clone(),
        args: server_args([agent_addr, connect, grpc, admin].map(|a| a.to_string())),
        how: if opts.handover {
            RestartHow::Handover
        } else {
            RestartHow::Plain
        },
        unset_env: Vec::new(),
        ready: Ready::Edgetunnel { admin },
    });
    if opts.go_agent {
        anchors::start_go_agent(run, &certs, agent_addr.port())?;
        run.wait_until("the server never counted the Go agent", || {
            anchors::gauge(admin.port(), AGENTS_CONNECTED) >= Some(1.0)
        })?;
    } else {
        start_edgetunnel_agent(run, &certs, agent_addr, opts)?;
    }
    run.entries = targets
        .iter()
        .map(|&target| match run.kind {
            SystemKind::EdgetunnelGrpc => Entry::Grpc {
                server: grpc,
                target,
            },
            _ if opts.connect_uds => Entry::ConnectUds {
                path: uds.clone(),
                target,
            },
            _ => Entry::Connect {
                proxy: connect,
                target,
            },
        })
        .collect();
    Ok(())
}

/// Our agent for `start_edgetunnel`, linked to the server's agent
/// listener `server`: ready once it printed `CONNECTED` (and, with links,
/// `LINKED` for every other server worker).
fn start_edgetunnel_agent(
    run: &mut Running,
    certs: &Path,
    server: SocketAddr,
    opts: &StartOptions,
) -> Result<(), String> {
    let bin = &opts.edgetunnel_bin;
    let mut cmd = Command::new(bin);
    cmd.args(["agent", "--certs-dir"]).arg(certs).args([
        "--server-addr",
        &server.to_string(),
        "--server-name",
        "localhost",
        "--agent-id",
        "bench",
        "--log",
        "warn",
    ]);
    // The targets are on loopback, which agents refuse by default. A
    // `--base-bin` from before the destination policy (issue 15's filing
    // build, say) has no such flag and refuses nothing.
    if agent_has_flag(bin, "--allow-destinations") {
        cmd.args(["--allow-destinations", "127.0.0.0/8,::1"]);
    }
    if let Some(n) = opts.workers {
        cmd.args(["--workers", &n.to_string()]);
    }
    if opts.one_link {
        cmd.args(["--max-links-per-server", "1"]);
    }
    // Its /metrics (a `--base-bin` from before the agent's admin listener
    // has none).
    let admin = agent_has_flag(bin, "--admin-bind");
    if admin {
        cmd.args(["--admin-bind", "127.0.0.1:0"]);
    }
    let out = run.spawn("edgetunnel-agent", &mut cmd, true)?;
    let lines = drain_lines(out, "edgetunnel-agent")?;
    let seen = run.wait_line(&lines, "CONNECTED")?;
    if let Some(addr) = seen
        .iter()
        .find_map(|l| l.strip_prefix("LISTEN admin ")?.trim().parse().ok())
    {
        run.set_metrics("edgetunnel-agent", addr);
    } else if admin {
        return Err(format!(
            "edgetunnel agent printed no `LISTEN admin ADDR`: {seen:?}"
        ));
    }
    // With links, measure once the agent has one on every server worker.
    if !opts.one_link {
        for _ in 1..opts.workers.unwrap_or(1) {
            run.wait_line(&lines, "LINKED")?;
        }
    }
    Ok(())
}

/// Whether `bin agent --help` lists `flag`.
fn agent_has_flag(bin: &Path, flag: &str) -> bool {
    Command::new(bin)
        .args(["agent", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
        .unwrap_or(false)
}

/// Reads `out` to EOF on its own thread, so the child never blocks on a
/// full pipe, and passes each line to the returned receiver for as long as
/// it is kept.
fn drain_lines(out: Option<ChildStdout>, name: &str) -> Result<Receiver<String>, String> {
    let out = out.ok_or_else(|| format!("{name}: stdout was not piped"))?;
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name(format!("drain-{name}"))
        .spawn(move || {
            let mut r = BufReader::new(out);
            let mut line = Vec::new();
            let mut forward = true;
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if forward => {
                        let text = String::from_utf8_lossy(&line).trim_end().to_string();
                        forward = tx.send(text).is_ok();
                    }
                    Ok(_) => {}
                }
            }
        })
        .map_err(|e| format!("{name}: starting its stdout reader: {e}"))?;
    Ok(rx)
}

/// Runs a setup command to completion; Err with its stderr on failure.
fn run_tool(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} {:?} failed ({}): {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Finds an executable `name` on PATH, in the sbin directories (sshd) or
/// in cargo's bin directory (rathole from `cargo install`).
fn find_tool(name: &str) -> Result<PathBuf, String> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| format!("{name} not found (run scripts/ensure-bench-tools)"))
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `n` distinct free loopback ports (bound together, then released).
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("picking a free port: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("picking a free port: {e}"))
}

fn tcp_entries(ports: &[u16]) -> Vec<Entry> {
    ports
        .iter()
        .map(|&p| Entry::Tcp(SocketAddr::from(([127, 0, 0, 1], p))))
        .collect()
}

/// A path as a TOML basic string.
fn toml_str(p: &Path) -> String {
    let s = p.display().to_string();
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The last `LOG_TAIL` bytes of a log file, lossily decoded.
fn log_tail(path: &Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return "(no log)".into();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).trim().to_string();
    if text.is_empty() {
        "(empty)".into()
    } else {
        text
    }
}

/// Which RLIMIT_NOFILE value bounds a child: the soft one it inherits, or
/// the hard one for programs that raise their soft limit themselves.
#[derive(Clone, Copy)]
enum Limit {
    Soft,
    Hard,
}

/// Connections a process holding `per_conn` descriptors each can keep
/// within this process's RLIMIT_NOFILE (which children inherit); Err when
/// that is below `max_conns`.
fn fd_fit(name: &str, max_conns: usize, per_conn: usize, which: Limit) -> Result<usize, String> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Ok(usize::MAX);
    }
    let (limit, what) = match which {
        Limit::Soft => (r.rlim_cur, "soft"),
        Limit::Hard => (r.rlim_max, "hard"),
    };
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let fit = limit.saturating_sub(FD_OVERHEAD) / per_conn;
    if max_conns > fit {
        return Err(format!(
            "{name}: holds {per_conn} descriptor(s) per connection; {max_conns} connections \
             need about {} but RLIMIT_NOFILE ({what}) is {limit}",
            max_conns * per_conn + FD_OVERHEAD
        ));
    }
    Ok(fit)
}

/// (kernel.pid_max, tasks now running machine-wide).
fn pid_headroom() -> (usize, usize) {
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default();
    let pid_max = read("/proc/sys/kernel/pid_max")
        .trim()
        .parse()
        .unwrap_or(32768);
    // Fourth field of loadavg: running/total scheduling entities.
    let tasks = read("/proc/loadavg")
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split('/').nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (pid_max, tasks)
}

/// A descendant process: its pid, its parent and its depth below the
/// nearest root (children of a root are depth 1).
struct Desc {
    pid: u32,
    ppid: u32,
    depth: usize,
}

/// Parent pid of `pid` from /proc/PID/stat; None when the process is gone
/// (zombies still have one until reaped).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// All live descendants of `roots` (roots excluded), from /proc.
fn descendants(roots: &[u32]) -> Vec<Desc> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = parent_of(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier: Vec<(u32, usize)> = roots.iter().map(|&r| (r, 0)).collect();
    let mut seen: HashSet<u32> = roots.iter().copied().collect();
    while let Some((pid, depth)) = frontier.pop() {
        for &c in children.get(&pid).into_iter().flatten() {
            if seen.insert(c) {
                out.push(Desc {
                    pid: c,
                    ppid: pid,
                    depth: depth + 1,
                });
                frontier.push((c, depth + 1));
            }
        }
    }
    out
}

/// Pss of `pid` in bytes (0 when gone or a zombie).
fn pss_of(pid: u32) -> u64 {
    crate::probe::kib_field(&format!("/proc/{pid}/smaps_rollup"), "Pss:")
}

/// True when every port in `ports` has a TCP socket in LISTEN state (IPv4
/// or IPv6) whose inode is open in one of the processes `pids` returns
/// (asked only once all ports listen).
fn listening_owned(ports: &[u16], pids: impl FnOnce() -> Vec<u32>) -> bool {
    let listeners = diag_listeners(ports).unwrap_or_else(|| proc_listeners(ports));
    if ports.iter().any(|p| !listeners.contains_key(p)) {
        return false;
    }
    let mut owned = HashSet::new();
    for pid in pids() {
        let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for e in rd.flatten() {
            if let Ok(target) = fs::read_link(e.path()) {
                let t = target.to_string_lossy();
                if let Some(n) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    if let Ok(n) = n.parse::<u64>() {
                        owned.insert(n);
                    }
                }
            }
        }
    }
    ports
        .iter()
        .all(|p| listeners[p].iter().any(|i| owned.contains(i)))
}

/// Inodes of the TCP LISTEN sockets on `ports`, by port, asked of the
/// kernel over sock_diag netlink, which walks only the listening table
/// (unlike /proc/net/tcp, whose cost grows with every open and TIME_WAIT
/// socket). None when netlink fails.
fn diag_listeners(ports: &[u16]) -> Option<HashMap<u16, Vec<u64>>> {
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_DUMP: u16 = 0x300;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const TCP_LISTEN: u32 = 10;
    const HDR: usize = 16; // struct nlmsghdr
    const REQ: usize = HDR + 56; // + struct inet_diag_req_v2
    const MSG: usize = 72; // struct inet_diag_msg

    // SAFETY: socket(2) with constant arguments.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if raw < 0 {
        return None;
    }
    // SAFETY: `raw` is a fresh descriptor owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let u32_at = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut found: HashMap<u16, Vec<u64>> = HashMap::new();
    let mut buf = vec![0u8; 64 * 1024];
    for family in [libc::AF_INET, libc::AF_INET6] {
        let mut req = [0u8; REQ];
        req[0..4].copy_from_slice(&(REQ as u32).to_ne_bytes());
        req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        req[HDR] = family as u8;
        req[HDR + 1] = libc::IPPROTO_TCP as u8;
        req[HDR + 4..HDR + 8].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
        // SAFETY: sends from a live, initialized buffer of that length; an
        // unconnected netlink socket sends to the kernel.
        let sent = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if sent != REQ as isize {
            return None;
        }
        'dump: loop {
            // SAFETY: receives into a live buffer of that length.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let n = usize::try_from(n).ok().filter(|&n| n > 0)?;
            let mut off = 0;
            while off + HDR <= n {
                let len = u32_at(&buf, off) as usize;
                let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
                if len < HDR || off + len > n {
                    return None;
                }
                match kind {
                    NLMSG_DONE => break 'dump,
                    NLMSG_ERROR => return None,
                    _ if len >= HDR + MSG => {
                        let m = &buf[off + HDR..off + len];
                        // inet_diag_msg: id.idiag_sport (big endian) at 4,
                        // idiag_inode at 68.
                        let port = u16::from_be_bytes([m[4], m[5]]);
                        if ports.contains(&port) {
                            found
                                .entry(port)
                                .or_default()
                                .push(u64::from(u32_at(m, 68)));
                        }
                    }
                    _ => {}
                }
                off += (len + 3) & !3;
            }
        }
    }
    Some(found)
}

/// `diag_listeners` from /proc/net/tcp{,6}, when netlink is unavailable.
fn proc_listeners(ports: &[u16]) -> HashMap<u16, Vec<u64>> {
    let mut found: HashMap<u16, Vec<u64>> = HashMap::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let port = f[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if let (Some(port), Ok(inode)) = (port, f[9].parse::<u64>()) {
                if ports.contains(&port) {
                    found.entry(port).or_default().push(inode);
                }
            }
        }
    }
    found
}
