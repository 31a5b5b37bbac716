//! Finding the real peers (unpacked once into `target/peers`), anptool's
//! target and client, and the edgetunnel server + agent stack most cases
//! drive them through.
#![allow(dead_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::peer_bins::peer_dir;
use crate::support::{repo, Agent, Env, Server, WAIT};

/// What every test prints (once per test binary) when the peers are absent.
pub(crate) const SKIPPED: &str = "skipped: no real peers (set EDGETUNNEL_PEERS)";

/// The directory holding the unpacked peer binaries.
pub(crate) struct Peers {
    dir: PathBuf,
}

impl Peers {
    /// The path of peer `name` (`anp-server`, `anp-agent`, `anptool`,
    /// `h2spec`, `kube-apiserver`).
    pub(crate) fn bin(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Whether peer `name` is there (kube-apiserver is optional).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.bin(name).is_file()
    }

    /// A command running anptool with `args`.
    pub(crate) fn anptool(&self, args: &[&str]) -> Command {
        let mut c = Command::new(self.bin("anptool"));
        c.args(args);
        c
    }
}

/// The real peers, or `None` (after printing [`SKIPPED`] once) when
/// `EDGETUNNEL_PEERS` is unset. A directory with `unpack` and `*.xz`
/// (`../shared/peers`) is unpacked into `target/peers` once per test
/// binary (cheap when already up to date); a directory of plain binaries
/// is used as it is. A set variable that names nothing usable fails the
/// test: it is a broken setup, not an absent peer.
pub(crate) fn peers() -> Option<&'static Peers> {
    static PEERS: OnceLock<Option<Peers>> = OnceLock::new();
    let p = PEERS.get_or_init(|| {
        let dir = peer_dir(&repo())?;
        assert!(
            dir.join("anptool").is_file(),
            "EDGETUNNEL_PEERS: {} holds no anptool",
            dir.display()
        );
        Some(Peers { dir })
    });
    if p.is_none() {
        static SAID: OnceLock<()> = OnceLock::new();
        SAID.get_or_init(|| {
            // Straight to the file descriptor: libtest captures eprintln!.
            let _ = writeln!(std::io::stderr(), "{SKIPPED}");
        });
    }
    p.as_ref()
}

/// Held by every case that moves much data or starts many processes, so
/// that two of them never compete for this machine's two cores.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// A child process with stdout and stderr in one log file, killed on drop.
pub(crate) struct Logged {
    pub child: Child,
    pub log: PathBuf,
}

impl Logged {
    pub(crate) fn spawn(mut cmd: Command, log: PathBuf) -> Logged {
        let f = std::fs::File::create(&log).expect("log file");
        let f2 = f.try_clone().expect("log file");
        cmd.stdout(f).stderr(f2).stdin(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        Logged { child, log }
    }

    pub(crate) fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for a log line containing `needle`; returns it.
    pub(crate) fn wait_for(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.text().lines().find(|l| l.contains(needle)) {
                return l.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in {} within {timeout:?}:\n{}",
                self.log.display(),
                tail(&self.text(), 40)
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    #[allow(unsafe_code)]
    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `anptool target`: ECHO, SINK n, SRC n, SRCCLOSE n, HOLD.
pub(crate) struct GoTarget {
    pub proc: Logged,
    pub addr: SocketAddr,
}

impl GoTarget {
    pub(crate) fn start(peers: &Peers, env: &Env, listen: &str) -> GoTarget {
        let proc = Logged::spawn(
            peers.anptool(&["target", "-listen", listen]),
            env.path(&format!("target-{}.log", listen.replace([':', '/'], "_"))),
        );
        let l = proc.wait_for("T LISTEN ", WAIT);
        let addr = l.rsplit(' ').next().unwrap().parse().expect("T LISTEN");
        GoTarget { proc, addr }
    }

    pub(crate) fn target(&self) -> String {
        self.addr.to_string()
    }

    /// (connections accepted, connections closed) so far.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let t = self.proc.text();
        (
            t.matches(" T ACCEPT id=").count(),
            t.matches(" T CLOSED id=").count(),
        )
    }

    /// Waits until every connection the target accepted has closed: no
    /// socket is left to the target. Returns how many it accepted.
    pub(crate) fn wait_idle(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let (a, c) = self.counts();
            if a == c {
                return a;
            }
            assert!(
                Instant::now() < deadline,
                "target still holds {} of {a} connections after {timeout:?}:\n{}",
                a - c,
                tail(&self.proc.text(), 30)
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The outcome of one `anptool client` run.
pub(crate) struct ClientRun {
    pub ok: bool,
    /// The first stdout line: `OK ...` or `FAIL ...`.
    pub line: String,
    pub output: Output,
    pub secs: f64,
}

impl ClientRun {
    pub(crate) fn describe(&self) -> String {
        format!(
            "{}\nstdout:\n{}\nstderr:\n{}",
            self.line,
            tail(&String::from_utf8_lossy(&self.output.stdout), 20),
            tail(&String::from_utf8_lossy(&self.output.stderr), 20)
        )
    }
}

/// Runs `anptool client ARGS` to its end.
pub(crate) fn client(peers: &Peers, args: &[&str]) -> ClientRun {
    let mut all = vec!["client"];
    all.extend_from_slice(args);
    let t0 = Instant::now();
    let output = peers
        .anptool(&all)
        .stdin(Stdio::null())
        .output()
        .expect("run anptool client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("OK") || l.starts_with("FAIL"))
        .unwrap_or("")
        .to_string();
    ClientRun {
        ok: output.status.success() && line.starts_with("OK "),
        line,
        output,
        secs: t0.elapsed().as_secs_f64(),
    }
}

/// Our server, one agent of ours (`node-1`) and a Go target.
pub(crate) struct Stack {
    pub env: Env,
    pub server: Server,
    pub agent: Agent,
    pub target: GoTarget,
}

impl Stack {
    /// Starts the three; `server_extra` goes to `edgetunnel server`.
    pub(crate) fn start(peers: &Peers, server_extra: &[&str]) -> Stack {
        Self::start_in(peers, Env::new(), server_extra, &[])
    }

    /// [`Stack::start`] in an environment made beforehand (e.g. to name
    /// its certificates in `server_extra`).
    /// `agent_extra` goes to `edgetunnel agent`.
    pub(crate) fn start_in(
        peers: &Peers,
        env: Env,
        server_extra: &[&str],
        agent_extra: &[&str],
    ) -> Stack {
        let target = GoTarget::start(peers, &env, "127.0.0.1:0");
        let mut args = vec!["--workers", "2"];
        args.extend_from_slice(server_extra);
        let server = Server::start(&env, &args);
        let agent = Agent::start(
            &env,
            server.agent,
            "node-1",
            "host=node-1&ipv4=127.0.0.1",
            agent_extra,
        );
        // One link per server worker.
        server.wait_agent_links(2.0, &agent.proc);
        Stack {
            env,
            server,
            agent,
            target,
        }
    }

    /// Runs anptool's client and fails the test, with every log, when it
    /// does not say OK.
    pub(crate) fn expect_ok(&self, peers: &Peers, args: &[&str]) -> ClientRun {
        let r = client(peers, args);
        assert!(r.ok, "anptool client {args:?}:\n{}", self.logs(&r));
        r
    }

    /// The client's output with the tails of our logs and the target's.
    pub(crate) fn logs(&self, r: &ClientRun) -> String {
        format!(
            "{}\n--- server:\n{}\n--- agent:\n{}\n--- target:\n{}",
            r.describe(),
            tail(&self.server.proc.log_text(), 30),
            tail(&self.agent.proc.log_text(), 30),
            tail(&self.target.proc.text(), 20)
        )
    }

    /// Cleanup after a case: the server holds no tunnel and no dial, and
    /// the target no connection.
    pub(crate) fn assert_clean(&self) {
        self.server.wait_metric("edgetunnel_open_connections", 0.0);
        self.server.wait_metric("edgetunnel_pending_dials", 0.0);
        self.target.wait_idle(WAIT);
    }
}

/// The `(cert, key)` paths of `name` (`server`, `agent`, ...) in the
/// `certs init` directory.
pub(crate) fn cert_pair(certs: &Path, name: &str) -> (String, String) {
    (
        certs.join(format!("{name}.crt")).display().to_string(),
        certs.join(format!("{name}.key")).display().to_string(),
    )
}
