//! Shared pieces of the end-to-end tests: real `edgetunnel` processes on
//! loopback, real targets, real clients. Every wait is bounded.
#![allow(dead_code)]

pub(crate) mod apiserver;
pub(crate) mod dial_load;
pub(crate) mod fake_kube;
pub(crate) mod fwd_proxy;
pub(crate) mod hol;
pub(crate) mod http_raw;
pub(crate) mod netns;
pub(crate) mod peer_bins;
pub(crate) mod prom_text;
pub(crate) mod proxy_proc;
pub(crate) mod raw_h2;
pub(crate) mod tls_client;
pub(crate) mod wan;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_edgetunnel");
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// Raises the open-file limit (inherited by the processes we start).
#[allow(unsafe_code)]
pub(crate) fn raise_nofile() {
    // SAFETY: plain rlimit calls on a local struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max.min(65536);
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

/// A temp dir with certificates from `edgetunnel certs init`.
pub(crate) struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub(crate) fn new() -> Self {
        raise_nofile();
        let mut dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new(BIN)
            .args(["certs", "init"])
            .arg(dir.path().join("certs"))
            .output()
            .expect("run certs init");
        assert!(out.status.success(), "certs init failed: {out:?}");
        if std::env::var_os("KEEP_TEST_DIR").is_some() {
            eprintln!("test dir kept: {}", dir.path().display());
            dir.disable_cleanup(true);
        }
        Env { dir }
    }

    pub(crate) fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A leaf certificate signed by this environment's CA, with a new key:
    /// `<name>.crt` and `<name>.key` next to the certificates directory.
    /// `sans` are DNS names or IP addresses; `usages` its extended key
    /// usages (none: no EKU extension). Returns (cert, key) paths.
    pub(crate) fn issue(
        &self,
        name: &str,
        cn: &str,
        sans: &[&str],
        usages: &[rcgen::ExtendedKeyUsagePurpose],
    ) -> (String, String) {
        self.issue_with_org(name, cn, None, sans, usages)
    }

    /// [`Env::issue`] with an organization (O) in the subject, as
    /// Kubernetes reads groups from it (`name` may name a subdirectory
    /// that exists).
    pub(crate) fn issue_with_org(
        &self,
        name: &str,
        cn: &str,
        org: Option<&str>,
        sans: &[&str],
        usages: &[rcgen::ExtendedKeyUsagePurpose],
    ) -> (String, String) {
        let read = |f: &str| std::fs::read_to_string(self.certs().join(f)).unwrap();
        let ca_key =
            rcgen::KeyPair::from_pem(&std::fs::read_to_string(ca_key(&self.certs())).unwrap())
                .unwrap();
        let ca = rcgen::CertificateParams::from_ca_cert_pem(&read("ca.crt"))
            .unwrap()
            .self_signed(&ca_key)
            .unwrap();
        let mut p =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        if let Some(o) = org {
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, o);
        }
        p.extended_key_usages = usages.to_vec();
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::DigitalSignature,
            rcgen::KeyUsagePurpose::KeyEncipherment,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &ca, &ca_key).unwrap();
        let (c, k) = (
            self.path(&format!("{name}.crt")),
            self.path(&format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c.display().to_string(), k.display().to_string())
    }
}

/// The CA key of a `certs init` directory: `DIR-ca/ca.key` (kept apart
/// from the certificates since `certs init` has a CA directory).
pub(crate) fn ca_key(certs: &std::path::Path) -> PathBuf {
    let mut name = certs.file_name().expect("a named directory").to_os_string();
    name.push("-ca");
    certs.with_file_name(name).join("ca.key")
}

/// The agent's `--allow-destinations` from the environment.
pub(crate) const ALLOW_ENV: &str = "EDGETUNNEL_ALLOW_DESTINATIONS";
/// What every agent the tests start may dial: what the default policy
/// allows plus loopback, where the test targets listen. Set here, in
/// [`Proc::spawn`], for every process (agents started through the Go-flag
/// faces and in network namespaces too), unless the command sets or
/// removes [`ALLOW_ENV`] itself; an `--allow-destinations` flag wins.
pub(crate) const TEST_ALLOW_DESTINATIONS: &str = "0.0.0.0/0,::/0,127.0.0.0/8,::1";

/// A child process killed on drop, with its stdout lines on a channel and
/// stderr in a log file.
pub(crate) struct Proc {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub log: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(mut cmd: Command, log: PathBuf) -> Proc {
        if !cmd.get_envs().any(|(k, _)| k == ALLOW_ENV) {
            cmd.env(ALLOW_ENV, TEST_ALLOW_DESTINATIONS);
        }
        CHILD_ENV.with(|e| {
            for (k, v) in e.borrow().iter() {
                if !cmd.get_envs().any(|(x, _)| x == k.as_str()) {
                    cmd.env(k, v);
                }
            }
        });
        let logf = std::fs::File::create(&log).expect("log file");
        cmd.stdout(Stdio::piped()).stderr(logf).stdin(Stdio::null());
        let mut child = cmd.spawn().expect("spawn edgetunnel");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines: rx,
            log,
        }
    }

    /// Waits for a stdout line starting with `prefix`.
    pub(crate) fn wait_line(&self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => continue,
                Err(_) => panic!(
                    "no line {prefix:?} within {WAIT:?}; log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ),
            }
        }
    }

    /// Waits for a stdout line starting with any of `prefixes`.
    pub(crate) fn wait_line_any(&self, prefixes: &[&str], timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if prefixes.iter().any(|p| l.starts_with(p)) => return l,
                Ok(_) => continue,
                Err(_) => panic!(
                    "no line {prefixes:?} within {timeout:?}; log:\n{}",
                    self.log_text()
                ),
            }
        }
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log once it holds `needle`: lines reach the file through the
    /// process's log thread, so a line logged a moment ago may not be
    /// there yet when a metric already moved.
    pub(crate) fn wait_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let log = self.log_text();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "{needle:?} never logged within {WAIT:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[allow(unsafe_code)]
    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for the process to exit; its status code if it did in time.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `edgetunnel server` with every frontend on loopback.
pub(crate) struct Server {
    pub proc: Proc,
    pub agent: SocketAddr,
    pub connect: SocketAddr,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    pub connect_uds: PathBuf,
    pub grpc_uds: PathBuf,
    /// The interception listener, when started with one.
    pub interception: Option<SocketAddr>,
}

impl Server {
    pub(crate) fn start(env: &Env, extra: &[&str]) -> Server {
        Self::start_on(env, "127.0.0.1:0", extra)
    }

    pub(crate) fn start_on(env: &Env, agent_bind: &str, extra: &[&str]) -> Server {
        let certs = env.certs().display().to_string();
        Self::start_with_tls(env, agent_bind, &["--certs-dir", &certs], extra)
    }

    /// A server whose TLS files are given by `tls` (e.g. `--cert`/`--key`
    /// only) instead of the test certificates directory.
    pub(crate) fn start_with_tls(
        env: &Env,
        agent_bind: &str,
        tls: &[&str],
        extra: &[&str],
    ) -> Server {
        let binds = Binds {
            agent: agent_bind.to_string(),
            ..Binds::default()
        };
        Self::start_full(env, tls, &binds, extra)
    }

    /// A server on the given addresses and socket paths.
    pub(crate) fn start_at(env: &Env, binds: &Binds, extra: &[&str]) -> Server {
        let certs = env.certs().display().to_string();
        Self::start_full(env, &["--certs-dir", &certs], binds, extra)
    }

    /// The `edgetunnel server` command for `binds` (unix socket paths: new
    /// ones in `env` when not given), its number and socket paths.
    pub(crate) fn command(
        env: &Env,
        tls: &[&str],
        binds: &Binds,
        extra: &[&str],
    ) -> (Command, usize, PathBuf, PathBuf) {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let connect_uds = binds
            .connect_uds
            .clone()
            .unwrap_or_else(|| env.path(&format!("connect-{n}.sock")));
        let grpc_uds = binds
            .grpc_uds
            .clone()
            .unwrap_or_else(|| env.path(&format!("grpc-{n}.sock")));
        let mut cmd = Command::new(BIN);
        cmd.arg("server")
            .args(tls)
            .args(["--agent-bind", &binds.agent])
            .args(["--connect-bind", &binds.connect])
            .args(["--grpc-bind", &binds.grpc])
            .args(["--admin-bind", &binds.admin])
            .arg("--connect-uds")
            .arg(&connect_uds)
            .arg("--grpc-uds")
            .arg(&grpc_uds);
        // The test agents share one certificate (CN edgetunnel-agent)
        // whatever their --agent-id: identities are bound (the server's
        // default) only where a test names the flag.
        if !extra.iter().any(|a| a.starts_with("--bind-agent-identity")) {
            cmd.arg("--bind-agent-identity=false");
        }
        cmd.args(extra);
        (cmd, n, connect_uds, grpc_uds)
    }

    fn start_full(env: &Env, tls: &[&str], binds: &Binds, extra: &[&str]) -> Server {
        let (cmd, n, connect_uds, grpc_uds) = Self::command(env, tls, binds, extra);
        Self::spawn(env, cmd, n, connect_uds, grpc_uds)
    }

    /// Runs a command from [`Server::command`] (changed as a test needs)
    /// and waits until it listens.
    pub(crate) fn spawn(
        env: &Env,
        cmd: Command,
        n: usize,
        connect_uds: PathBuf,
        grpc_uds: PathBuf,
    ) -> Server {
        let proc = Proc::spawn(cmd, env.path(&format!("server-{n}.log")));
        let addr = |what: &str| -> SocketAddr {
            let l = proc.wait_line(&format!("LISTEN {what} "));
            l.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let agent = addr("agent");
        let connect = addr("connect");
        let grpc = addr("grpc");
        let admin = addr("admin");
        let mut interception = None;
        loop {
            let l = proc.wait_line_any(&["LISTEN interception ", "READY"], WAIT);
            if l == "READY" {
                break;
            }
            interception = l.rsplit(' ').next().and_then(|a| a.parse().ok());
        }
        Server {
            proc,
            agent,
            connect,
            grpc,
            admin,
            connect_uds,
            grpc_uds,
            interception,
        }
    }

    pub(crate) fn metrics(&self) -> String {
        http_get(self.admin, "/metrics").1
    }

    /// The value of an unlabelled or labelled sample in /metrics.
    pub(crate) fn metric(&self, sample: &str) -> f64 {
        metric_at(self.admin, sample)
    }

    /// The agent links this server holds, summed over its workers.
    pub(crate) fn agent_links(&self) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with("edgetunnel_worker_agent_links{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until an agent holds `n` links here (one per server worker
    /// for an edgetunnel agent): none is then still in its handshake.
    pub(crate) fn wait_agent_links(&self, n: f64, agent: &Proc) {
        let deadline = Instant::now() + WAIT;
        while self.agent_links() != n {
            assert!(
                Instant::now() < deadline,
                "{n} agent links:\n{}\n{}",
                self.metrics(),
                agent.log_text()
            );
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits until `sample` equals `want`.
    pub(crate) fn wait_metric(&self, sample: &str, want: f64) {
        wait_metric_at(self.admin, sample, &self.proc, |v| v == want)
    }
}

/// The value of an unlabelled or labelled sample in the /metrics of the
/// admin listener at `admin` (a server's or an agent's).
pub(crate) fn metric_at(admin: SocketAddr, sample: &str) -> f64 {
    let text = http_get(admin, "/metrics").1;
    text.lines()
        .find_map(|l| l.strip_prefix(sample).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("metric {sample} missing in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits until `sample` at `admin` is as wanted (`proc`'s log on failure).
pub(crate) fn wait_metric_at(
    admin: SocketAddr,
    sample: &str,
    proc: &Proc,
    ok: impl Fn(f64) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    loop {
        let v = metric_at(admin, sample);
        if ok(v) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sample} stayed {v}, not as wanted\n{}",
            proc.log_text()
        );
        thread::sleep(Duration::from_millis(25));
    }
}

/// The address a process announced in its `LISTEN <what> <addr>` line.
pub(crate) fn listen_addr(p: &Proc, what: &str) -> SocketAddr {
    let l = p.wait_line(&format!("LISTEN {what} "));
    l.rsplit(' ').next().unwrap().parse().unwrap()
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Where a test server listens: addresses as `--*-bind` values, unix
/// socket paths (None: new ones in the test dir).
#[derive(Debug, Clone)]
pub(crate) struct Binds {
    pub agent: String,
    pub connect: String,
    pub grpc: String,
    pub admin: String,
    pub connect_uds: Option<PathBuf>,
    pub grpc_uds: Option<PathBuf>,
}

impl Binds {
    /// The addresses and socket paths `server` listens on, for another
    /// server on the same ones (a listener handover's successor).
    pub(crate) fn of(server: &Server) -> Binds {
        Binds {
            agent: server.agent.to_string(),
            connect: server.connect.to_string(),
            grpc: server.grpc.to_string(),
            admin: server.admin.to_string(),
            connect_uds: Some(server.connect_uds.clone()),
            grpc_uds: Some(server.grpc_uds.clone()),
        }
    }
}

impl Default for Binds {
    fn default() -> Self {
        let any = "127.0.0.1:0".to_string();
        Binds {
            agent: any.clone(),
            connect: any.clone(),
            grpc: any.clone(),
            admin: any,
            connect_uds: None,
            grpc_uds: None,
        }
    }
}

/// This machine's address toward the outside (no packet is sent), if any
/// that is not loopback.
pub(crate) fn outward_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.200:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// A loopback port free at the moment of the call, and never one this
/// process handed out before: the kernel may give the port it just
/// released to the next bind to port 0, and two ports picked one after the
/// other for the same program (etcd's client and peer URLs) were once the
/// same.
pub(crate) fn free_port() -> u16 {
    static HANDED: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed = HANDED.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        if !handed.contains(&port) {
            handed.push(port);
            return port;
        }
    }
}

/// The text of the file at `path` once it holds `needle` (a log file
/// written through a process's log thread, which may lag behind what the
/// process already announced on stdout or in /metrics).
pub(crate) fn wait_file_text(path: &Path, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} not in {} within {WAIT:?}:\n{text}",
            path.display()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// A loopback address nothing listens on, for as long as the returned
/// socket lives: the port is held by a bound socket that never listens,
/// so a connect there is refused, and no listener (another test's, bound
/// to port 0 in the meantime) can take it, as it could a port picked and
/// released.
pub(crate) fn refused_addr() -> (socket2::Socket, SocketAddr) {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind a port to refuse");
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    (s, addr)
}

/// Where two byte strings part: both lengths, the offset of the first
/// differing byte and 24 bytes of each from there, in hex.
pub(crate) fn first_difference(got: &[u8], want: &[u8]) -> String {
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let show = |b: &[u8]| {
        b[at.min(b.len())..(at + 24).min(b.len())]
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    };
    format!(
        "{} bytes (want {}), first difference at {at}: got {} want {}",
        got.len(),
        want.len(),
        show(got),
        show(want)
    )
}

/// A running `edgetunnel agent`.
pub(crate) struct Agent {
    pub proc: Proc,
}

impl Agent {
    pub(crate) fn start(
        env: &Env,
        server: SocketAddr,
        id: &str,
        identifiers: &str,
        extra: &[&str],
    ) -> Agent {
        let a = Self::spawn(env, server, id, identifiers, extra);
        a.proc.wait_line("CONNECTED");
        a
    }

    /// [`Agent::start`] with an admin listener (`--admin-bind`): its
    /// /metrics address.
    pub(crate) fn start_with_admin(
        env: &Env,
        server: SocketAddr,
        id: &str,
        identifiers: &str,
        extra: &[&str],
    ) -> (Agent, SocketAddr) {
        let mut args = vec!["--admin-bind", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let a = Self::spawn(env, server, id, identifiers, &args);
        let admin = listen_addr(&a.proc, "admin");
        a.proc.wait_line("CONNECTED");
        (a, admin)
    }

    pub(crate) fn spawn(
        env: &Env,
        server: SocketAddr,
        id: &str,
        identifiers: &str,
        extra: &[&str],
    ) -> Agent {
        let cmd = Self::command(env, server, id, identifiers, extra);
        Self::spawn_command(env, id, cmd)
    }

    fn spawn_command(env: &Env, id: &str, cmd: Command) -> Agent {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Agent {
            proc: Proc::spawn(cmd, env.path(&format!("agent-{id}-{n}.log"))),
        }
    }

    /// The command line of [`Agent::spawn`].
    pub(crate) fn command(
        env: &Env,
        server: SocketAddr,
        id: &str,
        identifiers: &str,
        extra: &[&str],
    ) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("agent")
            .arg("--certs-dir")
            .arg(env.certs())
            .args(["--server-addr", &server.to_string()])
            .args(["--server-name", "localhost"])
            .args(["--agent-id", id])
            .args(["--agent-identifiers", identifiers])
            .args(["--backoff-initial-secs", "0.1", "--backoff-max-secs", "1"])
            .args(extra);
        cmd
    }
}

/// A TCP echo server; counts connections that ended.
pub(crate) struct Echo {
    pub addr: SocketAddr,
    pub closed: Arc<AtomicUsize>,
}

/// Accepts on `ip` (any port) and runs `handle` on its own thread for
/// every connection.
pub(crate) fn serve_each<F>(ip: &str, handle: F) -> SocketAddr
where
    F: Fn(TcpStream) + Send + Sync + 'static,
{
    let l = TcpListener::bind((ip, 0)).expect("bind test target");
    let addr = l.local_addr().unwrap();
    let handle = Arc::new(handle);
    thread::spawn(move || {
        for s in l.incoming().flatten() {
            let handle = handle.clone();
            thread::spawn(move || handle(s));
        }
    });
    addr
}

pub(crate) fn echo_server(ip: &str) -> Echo {
    let closed = Arc::new(AtomicUsize::new(0));
    let c = closed.clone();
    let addr = serve_each(ip, move |mut s| {
        let mut r = s.try_clone().unwrap();
        let _ = std::io::copy(&mut r, &mut s);
        let _ = s.shutdown(Shutdown::Write);
        c.fetch_add(1, Ordering::SeqCst);
    });
    Echo { addr, closed }
}

/// A target that answers every connection with `reply` and closes.
pub(crate) fn banner_server(ip: &str, reply: &'static str) -> SocketAddr {
    serve_each(ip, move |mut s| {
        let _ = s.write_all(reply.as_bytes());
    })
}

/// A target that sends endlessly; counts connections that ended.
pub(crate) fn source_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let ended = Arc::new(AtomicUsize::new(0));
    let e = ended.clone();
    let addr = serve_each("127.0.0.1", move |mut s| {
        let chunk = vec![7u8; 64 * 1024];
        while s.write_all(&chunk).is_ok() {}
        e.fetch_add(1, Ordering::SeqCst);
    });
    (addr, ended)
}

/// An HTTP CONNECT over `stream`: status code, body (on error) and the
/// stream positioned after the head.
pub(crate) fn connect_over<S: Read + Write>(mut s: S, target: &str) -> (u16, String, S) {
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let mut body = String::new();
    if status != 200 {
        let _ = s.read_to_string(&mut body);
    }
    (status, body, s)
}

/// A CONNECT through `s` to `target` and an echo of `n` bytes; `Err` with
/// what went wrong when no tunnel was made.
pub(crate) fn connect_and_echo(
    mut s: impl Read + Write,
    target: &str,
    n: usize,
) -> Result<(), String> {
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            Ok(_) => return Err(format!("closed after {head:?}")),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head);
    }
    let data = random_bytes(n, 11);
    s.write_all(&data).map_err(|e| format!("write: {e}"))?;
    let mut back = vec![0u8; n];
    s.read_exact(&mut back).map_err(|e| format!("read: {e}"))?;
    if back != data {
        return Err("echo differs".into());
    }
    Ok(())
}

pub(crate) fn connect_tcp(proxy: SocketAddr, target: &str) -> (u16, String, TcpStream) {
    let s = TcpStream::connect(proxy).expect("connect to frontend");
    s.set_read_timeout(Some(WAIT)).unwrap();
    connect_over(s, target)
}

pub(crate) fn connect_unix(
    path: &Path,
    target: &str,
) -> (u16, String, std::os::unix::net::UnixStream) {
    let s = std::os::unix::net::UnixStream::connect(path).expect("connect to unix frontend");
    s.set_read_timeout(Some(WAIT)).unwrap();
    connect_over(s, target)
}

/// Sends `data` and reads the same amount back concurrently.
pub(crate) fn echo_roundtrip<S>(s: S, data: &[u8]) -> Vec<u8>
where
    S: Read + Write + Send + 'static + TryCloneStream,
{
    let mut w = s.try_clone_stream();
    let payload = data.to_vec();
    let writer = thread::spawn(move || {
        w.write_all(&payload).unwrap();
    });
    let mut r = s;
    let mut got = vec![0u8; data.len()];
    r.read_exact(&mut got).expect("read echo");
    writer.join().unwrap();
    got
}

pub(crate) trait TryCloneStream: Sized {
    fn try_clone_stream(&self) -> Self;
}

impl TryCloneStream for TcpStream {
    fn try_clone_stream(&self) -> Self {
        self.try_clone().unwrap()
    }
}

impl TryCloneStream for std::os::unix::net::UnixStream {
    fn try_clone_stream(&self) -> Self {
        self.try_clone().unwrap()
    }
}

/// A tunnel through the CONNECT frontend at `connect` to the echo server
/// `target`, moving `len` bytes of seed `seed` there and back on a thread
/// of its own while the test does something else; joins to whether they
/// came back intact.
pub(crate) fn busy_tunnel(
    connect: SocketAddr,
    target: String,
    len: usize,
    seed: u64,
) -> thread::JoinHandle<bool> {
    thread::spawn(move || {
        let (status, body, s) = connect_tcp(connect, &target);
        assert_eq!(status, 200, "{body}");
        let data = random_bytes(len, seed);
        echo_roundtrip(s, &data) == data
    })
}

/// Deterministic pseudo-random bytes.
pub(crate) fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A plain HTTP/1.1 GET: (status, body).
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect admin");
    s.set_read_timeout(Some(WAIT)).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The repository root.
pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The mutual-TLS flags of ANP's Go agent with the `certs init` agent
/// certificate.
pub(crate) fn agent_mtls(env: &Env) -> Vec<String> {
    let c = env.certs();
    vec![
        format!("--ca-cert={}", c.join("ca.crt").display()),
        format!("--agent-cert={}", c.join("agent.crt").display()),
        format!("--agent-key={}", c.join("agent.key").display()),
    ]
}

/// The cargo profile of the cross builds (`EDGETUNNEL_CROSS_PROFILE`):
/// release by default, what the image ships. scripts/test builds the ARM
/// binaries, and this machine's own for the image test, with `cross-ci`
/// (unoptimized, no debug info) to keep CI's time down.
pub(crate) fn cross_profile() -> String {
    std::env::var("EDGETUNNEL_CROSS_PROFILE").unwrap_or_else(|_| "release".to_string())
}

/// Where [`cross_profile`] puts the `edgetunnel` binary for `triple`
/// (`None`: this machine's own target). Cargo's dev profile builds into
/// `debug`.
pub(crate) fn cross_binary(triple: Option<&str>) -> PathBuf {
    let profile = cross_profile();
    let dir = if profile == "dev" { "debug" } else { &profile };
    let mut path = repo().join("target");
    if let Some(t) = triple {
        path.push(t);
    }
    path.join(dir).join("edgetunnel")
}

/// Removes from `cmd`'s environment the variables `cargo test` gives a
/// test (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...) before it runs cargo
/// itself: a build script that reads one (ring's reads
/// `CARGO_MANIFEST_DIR`) would otherwise see it change and rebuild what
/// `scripts/test` built from a shell, minutes of CI. Cargo's own settings
/// (`CARGO_HOME`, `CARGO_TARGET_DIR`, `CARGO_TERM_*`) stay.
pub(crate) fn without_test_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let keep =
            matches!(k.as_str(), "CARGO_HOME" | "CARGO_TARGET_DIR") || k.starts_with("CARGO_TERM_");
        if (k.starts_with("CARGO_") && !keep) || k == "OUT_DIR" {
            cmd.env_remove(&k);
        }
    }
    cmd
}

/// Whether a missing cross-built binary or qemu-user fails a test instead
/// of skipping it (`EDGETUNNEL_REQUIRE_CROSS=1`, set by scripts/test after
/// the cross builds).
pub(crate) fn cross_required() -> bool {
    std::env::var_os("EDGETUNNEL_REQUIRE_CROSS").is_some_and(|v| v == "1")
}

/// The interop venv's python (Python grpcio from PyPI), set up once per
/// test binary by `tests/interop/setup.sh`; `EDGETUNNEL_INTEROP_VENV`
/// names a venv to reuse.
pub(crate) fn python() -> PathBuf {
    static PY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        let venv = std::env::var_os("EDGETUNNEL_INTEROP_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join("target/interop-venv"));
        let out = Command::new("bash")
            .arg(repo().join("tests/interop/setup.sh"))
            .arg(&venv)
            .output()
            .expect("run tests/interop/setup.sh");
        assert!(
            out.status.success(),
            "interop setup failed (needs python3-venv and PyPI):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        venv.join("bin/python")
    })
    .clone()
}

/// Starts one of the `tests/interop/` Python scripts, logging to `env`.
pub(crate) fn script(env: &Env, name: &str, args: &[String]) -> Proc {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut cmd = Command::new(python());
    cmd.arg(repo().join("tests/interop").join(name)).args(args);
    let n = N.fetch_add(1, Ordering::Relaxed);
    Proc::spawn(cmd, env.path(&format!("{name}-{n}.log")))
}

/// The value of `key` in `/proc/PID/status` (e.g. `VmRSS`, `THP_enabled`).
pub(crate) fn proc_status(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let prefix = format!("{key}:");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status:\n{status}"))
}

thread_local! {
    /// Environment for every process this thread spawns (unless the
    /// command sets the variable itself), e.g. one test's
    /// `EDGETUNNEL_TLS_RECORDS=own` without touching the test process's.
    pub(crate) static CHILD_ENV: std::cell::RefCell<Vec<(String, String)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Sets `key=value` in [`CHILD_ENV`] for the processes this thread spawns
/// from now on.
pub(crate) fn child_env(key: &str, value: &str) {
    CHILD_ENV.with(|e| e.borrow_mut().push((key.into(), value.into())));
}
