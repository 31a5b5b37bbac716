//! An emulated WAN between two network namespaces, for tests and benches
//! that need real round trips: `cloud` (10.77.0.1) and `edge` (10.77.0.2),
//! joined by `wanlink` (crates/wanlink), which forwards the IP packets
//! between a TUN device in each through a one-way delay, a rate limit with
//! a bounded queue, random loss and jitter, per direction. The kernel's
//! TCP runs on both ends: slow start, loss recovery and socket buffer
//! limits are the real ones.
//!
//! ```ignore
//! let Some(wan) = Wan::start_or_skip(&WanConfig::rtt_ms(20.0).rate_mbit(100.0)) else { return };
//! let l = wan.edge.run(|| TcpListener::bind((EDGE_IP, 0))).unwrap();
//! let s = wan.cloud.run(|| TcpStream::connect(l.local_addr().unwrap())).unwrap();
//! let child = wan.cloud.exec(Command::new(BIN).arg("server")).spawn(); // a process inside
//! ```
//!
//! Sockets stay in the namespace they were made in, whatever thread uses
//! them later: [`Netns::run`] makes them there. Needs root, `ip`
//! (iproute2) and /dev/net/tun; [`Wan::start_or_skip`] says `skipped: ...`
//! and returns `None` otherwise. Everything goes on drop (the emulator is
//! killed, which removes its devices, then the namespaces are deleted).
#![allow(dead_code)]
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};
use std::thread;
use std::time::{Duration, SystemTime};

use super::netns::{sh, Netns};

/// The cloud side's address (namespace [`Wan::cloud`]).
pub(crate) const CLOUD_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// The edge side's address (namespace [`Wan::edge`]).
pub(crate) const EDGE_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);

/// Socket buffer maxima inside both namespaces (`net.ipv4.tcp_rmem` and
/// `tcp_wmem`, per namespace). The kernel's defaults (4 MiB to send,
/// 32 MiB to receive here) cap one connection at that much in flight per
/// round trip: 4 MiB / 100 ms = 42 MB/s, below a 1 Gbit/s link. A long fat
/// link needs buffers above its bandwidth-delay product (37.5 MB at
/// 1 Gbit/s and 300 ms), and twice that on the receiver, whose buffer
/// also holds the kernel's per-packet overhead.
pub(crate) const TCP_BUFFER_MAX: u64 = 128 << 20;

/// The link's shape, the same in both directions.
#[derive(Clone, Debug)]
pub(crate) struct WanConfig {
    /// One-way delay (the round trip is twice this).
    pub delay: Duration,
    /// Bottleneck rate in Mbit/s of IP packets (0: unlimited).
    pub rate_mbit: f64,
    /// Random loss, percent of the packets, each direction.
    pub loss_percent: f64,
    /// Extra random delay, uniform in [0, jitter] (no reordering).
    pub jitter: Duration,
    /// Bytes that may wait for the bottleneck before tail drop; `None`:
    /// one bandwidth-delay product of the round trip (at least 64 KiB).
    pub queue_bytes: Option<u64>,
    /// The devices' MTU.
    pub mtu: usize,
    /// Seed of the loss and jitter RNG.
    pub seed: u64,
}

impl WanConfig {
    /// A link of round trip `ms`, unlimited rate, no loss, MTU 1500.
    pub(crate) fn rtt_ms(ms: f64) -> WanConfig {
        WanConfig {
            delay: Duration::from_secs_f64(ms / 2000.0),
            rate_mbit: 0.0,
            loss_percent: 0.0,
            jitter: Duration::ZERO,
            queue_bytes: None,
            mtu: 1500,
            seed: 1,
        }
    }

    pub(crate) fn rate_mbit(mut self, r: f64) -> Self {
        self.rate_mbit = r;
        self
    }

    pub(crate) fn loss_percent(mut self, p: f64) -> Self {
        self.loss_percent = p;
        self
    }

    pub(crate) fn mtu(mut self, m: usize) -> Self {
        self.mtu = m;
        self
    }

    pub(crate) fn queue_bytes(mut self, q: u64) -> Self {
        self.queue_bytes = Some(q);
        self
    }

    pub(crate) fn jitter(mut self, j: Duration) -> Self {
        self.jitter = j;
        self
    }

    /// The round trip the link adds.
    pub(crate) fn rtt(&self) -> Duration {
        self.delay * 2
    }

    /// Bytes a second the rate allows (IP packets), 0 when unlimited.
    pub(crate) fn bytes_per_sec(&self) -> f64 {
        self.rate_mbit * 1e6 / 8.0
    }
}

/// Why the emulated WAN cannot run here, if it cannot.
pub(crate) fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the emulated WAN needs root (network namespaces, TUN)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("no /dev/net/tun".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("no `ip` (iproute2)".into());
    }
    None
}

/// The `wanlink` binary: `EDGETUNNEL_WANLINK`, or the workspace's own in
/// this build's profile directory, built (`cargo build -p
/// edgetunnel-wanlink`) when missing or older than its sources.
pub(crate) fn wanlink_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("EDGETUNNEL_WANLINK") {
            return PathBuf::from(p);
        }
        // target/<profile>/deps/<this binary>.
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps")
            .to_path_buf();
        let bin = profile_dir.join("wanlink");
        let crate_dir = super::repo().join("crates/wanlink");
        if !bin.is_file() || newest_mtime(&crate_dir) > mtime(&bin) {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(cargo);
            super::without_test_env(&mut cmd);
            cmd.current_dir(super::repo()).args([
                "build",
                "-p",
                "edgetunnel-wanlink",
                "--bin",
                "wanlink",
            ]);
            if profile_dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            let out = cmd.output().expect("run cargo build -p edgetunnel-wanlink");
            assert!(
                out.status.success(),
                "cargo build -p edgetunnel-wanlink: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(bin.is_file(), "no {}", bin.display());
        bin
    })
    .clone()
}

fn mtime(p: &Path) -> SystemTime {
    p.metadata()
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

fn newest_mtime(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let t = if p.is_dir() {
            newest_mtime(&p)
        } else {
            mtime(&p)
        };
        newest = newest.max(t);
    }
    newest
}

/// One direction's counters, from the emulator's `STATS` line.
#[derive(Clone, Debug, Default)]
pub(crate) struct DirStats {
    pub packets: u64,
    pub bytes: u64,
    pub delivered: u64,
    pub delivered_bytes: u64,
    pub lost: u64,
    pub queue_drops: u64,
    pub write_errors: u64,
    pub max_backlog: u64,
}

impl DirStats {
    fn parse(line: &str) -> DirStats {
        let mut s = DirStats::default();
        for kv in line.split_whitespace() {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let v: u64 = v.parse().unwrap_or(0);
            match k {
                "packets" => s.packets = v,
                "bytes" => s.bytes = v,
                "delivered" => s.delivered = v,
                "delivered_bytes" => s.delivered_bytes = v,
                "lost" => s.lost = v,
                "queue_drops" => s.queue_drops = v,
                "write_errors" => s.write_errors = v,
                "max_backlog" => s.max_backlog = v,
                _ => {}
            }
        }
        s
    }
}

/// Two namespaces joined by a running `wanlink`.
pub(crate) struct Wan {
    // Dropped in this order: the emulator first (its devices go with it),
    // then the namespaces.
    link: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    pub cloud: Netns,
    pub edge: Netns,
    pub config: WanConfig,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Wan {
    /// [`Wan::start`], or `None` after printing `skipped: REASON` when
    /// this machine cannot run it.
    pub(crate) fn start_or_skip(config: &WanConfig) -> Option<Wan> {
        if let Some(why) = unavailable() {
            // Straight to the descriptor: libtest captures eprintln!.
            let _ = writeln!(std::io::stderr(), "skipped: {why}");
            return None;
        }
        Some(Wan::start(config))
    }

    /// Two new namespaces (`etwan<pid>-<n>c` and `...e`, loopback up,
    /// socket buffer maxima raised) joined by `wanlink` with `config`.
    pub(crate) fn start(config: &WanConfig) -> Wan {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("etwan{}-{n}", std::process::id());
        let cloud = Netns::new(&format!("{tag}c"));
        let edge = Netns::new(&format!("{tag}e"));
        for ns in [&cloud, &edge] {
            sh(
                &ns.0,
                &format!(
                    "sysctl -qw net.ipv4.tcp_rmem='4096 131072 {m}' \
                     net.ipv4.tcp_wmem='4096 16384 {m}' \
                     net.ipv6.conf.default.disable_ipv6=1",
                    m = TCP_BUFFER_MAX
                ),
            );
        }
        let ms = |d: Duration| format!("{}", d.as_secs_f64() * 1000.0);
        let mut cmd = Command::new(wanlink_bin());
        cmd.args(["--ns-a", &cloud.0, "--ns-b", &edge.0])
            .args(["--addr-a", &format!("{CLOUD_IP}/24")])
            .args(["--addr-b", &format!("{EDGE_IP}/24")])
            .args(["--mtu", &config.mtu.to_string()])
            .args(["--delay-ms", &ms(config.delay)])
            .args(["--jitter-ms", &ms(config.jitter)])
            .args(["--rate-mbit", &config.rate_mbit.to_string()])
            .args(["--loss-percent", &config.loss_percent.to_string()])
            .args(["--seed", &config.seed.to_string()]);
        if let Some(q) = config.queue_bytes {
            cmd.args(["--queue-bytes", &q.to_string()]);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut link = cmd.spawn().expect("spawn wanlink");
        let stdin = link.stdin.take();
        let out = link.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut wan = Wan {
            link,
            stdin,
            lines,
            cloud,
            edge,
            config: config.clone(),
        };
        let ready = wan.next_line(Duration::from_secs(20));
        assert!(
            ready.as_deref().is_some_and(|l| l.starts_with("READY")),
            "wanlink did not start: {ready:?}"
        );
        wan
    }

    fn next_line(&mut self, timeout: Duration) -> Option<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Some(l),
            Err(_) => {
                if let Ok(Some(st)) = self.link.try_wait() {
                    panic!("wanlink exited: {st}");
                }
                None
            }
        }
    }

    /// Both directions' counters: (cloud to edge, edge to cloud).
    pub(crate) fn stats(&mut self) -> (DirStats, DirStats) {
        let stdin = self.stdin.as_mut().expect("wanlink's stdin");
        stdin.write_all(b"stats\n").expect("ask wanlink for stats");
        stdin.flush().unwrap();
        let (mut ab, mut ba) = (None, None);
        while ab.is_none() || ba.is_none() {
            let l = self
                .next_line(Duration::from_secs(10))
                .expect("wanlink's STATS lines");
            if let Some(rest) = l.strip_prefix("STATS a>b ") {
                ab = Some(DirStats::parse(rest));
            } else if let Some(rest) = l.strip_prefix("STATS b>a ") {
                ba = Some(DirStats::parse(rest));
            }
        }
        (ab.unwrap(), ba.unwrap())
    }

    /// CPU seconds (user + system) the emulator used so far; the kernel
    /// work of delivering a packet (the receiving side's IP and TCP) runs
    /// in its write and counts here too.
    pub(crate) fn cpu_secs(&self) -> f64 {
        cpu_secs(self.link.id())
    }

    /// The emulator's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.link.id()
    }
}

impl Drop for Wan {
    fn drop(&mut self) {
        let _ = self.link.kill();
        let _ = self.link.wait();
    }
}

/// CPU seconds (user + system) process `pid` used so far.
pub(crate) fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    cpu_secs_of(&stat)
}

/// CPU seconds (user + system) in the text of a `/proc/.../stat` file.
pub(crate) fn cpu_secs_of(stat: &str) -> f64 {
    // The fields after the command's closing parenthesis: state is the
    // first, utime the 12th and stime the 13th.
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions and touches no memory.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (tick(11) + tick(12)) / hz
}

impl Netns {
    /// Runs `f` on a new thread inside this namespace (sockets made there
    /// stay in it when used from other threads) and returns its result.
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let ns = File::open(format!("/run/netns/{}", self.0)).expect("open /run/netns/NAME");
        thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns reads its two integer arguments only; `ns`
                // keeps the descriptor open for the call. It moves this
                // new thread alone, which ends with the scope.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .expect("thread in the namespace panicked")
        })
    }

    /// A counter of `/proc/net/snmp` in this namespace (`Tcp`,
    /// `RetransSegs`).
    pub(crate) fn snmp(&self, proto: &str, key: &str) -> u64 {
        let text = sh(&self.0, "cat /proc/net/snmp");
        let prefix = format!("{proto}:");
        let rows: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| l.split_whitespace().collect())
            .collect();
        let [names, values] = rows.as_slice() else {
            panic!("no {proto} rows in /proc/net/snmp:\n{text}");
        };
        let i = names
            .iter()
            .position(|n| *n == key)
            .unwrap_or_else(|| panic!("no {proto} {key} in /proc/net/snmp"));
        values[i].parse().expect("a counter")
    }
}

/// ANP's Go `proxy-server` for the cloud namespace: `mode` (`http-connect`
/// or `grpc`), its frontend on the unix socket `uds`, agents on
/// `CLOUD_IP:agent_port` with a server certificate (named `tag`) that
/// names that address, keepalive 1 h as tests/peers run it, `-v=<v>`.
pub(crate) fn anp_server_command(
    env: &super::Env,
    peers: &Path,
    mode: &str,
    uds: &Path,
    agent_port: u16,
    tag: &str,
    v: u8,
) -> Command {
    let (cert, key) = env.issue(
        &format!("anp-server-{tag}"),
        "anp-server",
        &[&CLOUD_IP.to_string(), "localhost"],
        &[rcgen::ExtendedKeyUsagePurpose::ServerAuth],
    );
    let ca = env.certs().join("ca.crt");
    let mut cmd = Command::new(peers.join("anp-server"));
    cmd.arg(format!("--mode={mode}"))
        .arg(format!("--uds-name={}", uds.display()))
        .arg("--server-port=0")
        .arg(format!("--cluster-cert={cert}"))
        .arg(format!("--cluster-key={key}"))
        .arg(format!("--cluster-ca-cert={}", ca.display()))
        .arg(format!("--agent-bind-address={CLOUD_IP}"))
        .arg(format!("--agent-port={agent_port}"))
        .arg("--admin-port=8095")
        .arg("--health-bind-address=127.0.0.1")
        .arg("--health-port=8092")
        .arg("--keepalive-time=1h")
        .arg(format!("-v={v}"))
        .env_remove("PROXY_SERVER_ID");
    cmd
}
