//! What an operator meets in logs, signals and `--help` (issue 28): a
//! closed stderr must not kill the process, the log formats and files, a
//! quiet INFO level, SIGHUP as a reload, LISTEN lines for every listener,
//! and grouped help.

use crate::support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::tls_client::{client_tls, tls_connect};
use support::{
    connect_and_echo, connect_tcp, connect_unix, echo_roundtrip, echo_server, http_get, Agent,
    Binds, Env, Proc, Server, BIN,
};

/// Waits until `path` is gone (a unix socket the process removes on exit).
fn gone_within(path: &Path, d: Duration) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if !path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !path.exists()
}

#[allow(unsafe_code)]
fn kill(pid: u32, sig: i32) {
    // SAFETY: a signal to a child of this test.
    unsafe { libc::kill(pid as i32, sig) };
}

/// A server whose stdout and stderr are pipes held by the test, started
/// with 2 workers at log level `log`, and the addresses its LISTEN lines
/// gave (read from stdout up to READY).
struct PipedServer {
    child: std::process::Child,
    stdout: Option<BufReader<std::process::ChildStdout>>,
    agent: SocketAddr,
    connect: SocketAddr,
    admin: SocketAddr,
    connect_uds: std::path::PathBuf,
    grpc_uds: std::path::PathBuf,
}

impl PipedServer {
    fn start(env: &Env, log: &str) -> PipedServer {
        let binds = Binds::default();
        let certs = env.certs().display().to_string();
        let (mut cmd, _, connect_uds, grpc_uds) = Server::command(
            env,
            &["--certs-dir", &certs],
            &binds,
            &["--workers", "2", "--log", log],
        );
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (mut agent, mut connect, mut admin) = (None, None, None);
        loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "stdout ended");
            let line = line.trim();
            let addr = || line.rsplit(' ').next().unwrap().parse::<SocketAddr>().ok();
            if line.starts_with("LISTEN agent ") {
                agent = addr();
            } else if line.starts_with("LISTEN connect ") {
                connect = addr();
            } else if line.starts_with("LISTEN admin ") {
                admin = addr();
            } else if line == "READY" {
                break;
            }
        }
        PipedServer {
            child,
            stdout: Some(out),
            agent: agent.unwrap(),
            connect: connect.unwrap(),
            admin: admin.unwrap(),
            connect_uds,
            grpc_uds,
        }
    }
}

/// A server whose stdout and stderr are pipes to this test: once it is
/// ready, the test closes both read ends (a log shipper that went away).
/// The server logs on (debug level, an agent, tunnels, a bad request),
/// must keep serving, count the lost log lines, and stop on SIGTERM with
/// its unix sockets removed.
#[test]
fn a_closed_stderr_neither_kills_nor_wedges_the_server() {
    let env = Env::new();
    let mut p = PipedServer::start(&env, "debug");
    let (mut child, agent_addr, connect, admin) = (p.child, p.agent, p.connect, p.admin);
    let (connect_uds, grpc_uds) = (p.connect_uds, p.grpc_uds);
    // The readers go away.
    drop(p.stdout.take());
    drop(child.stderr.take());

    // Log lines: an agent with its links, tunnels, a refused request.
    let echo = echo_server("127.0.0.1");
    let agent = Agent::start(&env, agent_addr, "a1", "host=a1&ipv4=127.0.0.1", &[]);
    let target = format!("127.0.0.1:{}", echo.addr.port());
    for _ in 0..3 {
        let s = std::net::TcpStream::connect(connect).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        connect_and_echo(s, &target, 1000).expect("tunnel after stderr closed");
    }
    let (status, _, _) = connect_tcp(connect, "nowhere.invalid:1");
    assert_ne!(status, 200);
    // Still alive and serving: health, a tunnel over the unix socket.
    assert!(child.try_wait().unwrap().is_none(), "server exited");
    assert_eq!(http_get(admin, "/healthz").0, 200);
    let s = std::os::unix::net::UnixStream::connect(&connect_uds).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    connect_and_echo(s, &target, 1000).expect("tunnel over the unix socket");
    // The lost lines are counted.
    let lost = support::metric_at(admin, "edgetunnel_log_write_errors_total");
    assert!(lost > 0.0, "no log write error counted");
    drop(agent);

    // SIGTERM still stops it, and it cleans up (at once: no tunnel is
    // open; polled for up to WAIT, a wedged server never stops).
    let t = Instant::now();
    kill(child.id(), libc::SIGTERM);
    let deadline = Instant::now() + support::WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("SIGTERM did not stop the server within {:?}", support::WAIT);
    }
    eprintln!("stopped {:?} after SIGTERM: {:?}", t.elapsed(), status);
    assert!(gone_within(&connect_uds, Duration::from_secs(1)));
    assert!(gone_within(&grpc_uds, Duration::from_secs(1)));
}

/// The server's log lines (its stderr).
/// A stderr that stays open but is never read (a stalled log shipper):
/// once the pipe's 64 KiB are full a write blocks, and before the log
/// thread it blocked the data-plane core that logged; now lines past the
/// queue are lost and counted, and tunnels keep flowing.
#[test]
fn a_stderr_nobody_reads_holds_up_no_core() {
    let env = Env::new();
    // stderr is kept open (in `p.child`) and never read.
    let p = PipedServer::start(&env, "trace");
    let (mut child, agent_addr, connect, admin) = (p.child, p.agent, p.connect, p.admin);
    let echo = echo_server("127.0.0.1");
    let agent = Agent::start(&env, agent_addr, "a1", "host=a1&ipv4=127.0.0.1", &[]);
    let target = format!("127.0.0.1:{}", echo.addr.port());
    // Trace lines per tunnel fill the pipe many times over.
    let t = Instant::now();
    let mut tunnels = 0;
    while support::metric_at(admin, "edgetunnel_log_write_errors_total") == 0.0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{tunnels} tunnels and no line lost: the queue never filled"
        );
        let s = std::net::TcpStream::connect(connect).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        connect_and_echo(s, &target, 1000)
            .unwrap_or_else(|e| panic!("tunnel {tunnels} with stderr full: {e:?}"));
        tunnels += 1;
    }
    // Past the full queue, every core still serves.
    for i in 0..20 {
        let s = std::net::TcpStream::connect(connect).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        connect_and_echo(s, &target, 1000)
            .unwrap_or_else(|e| panic!("tunnel {i} after the queue filled: {e:?}"));
    }
    assert_eq!(http_get(admin, "/healthz").0, 200);
    drop(agent);
    // SIGTERM: the exit waits for the log thread at most a second (the
    // product's bound under test; 4 s more are the margin).
    kill(child.id(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("SIGTERM did not stop the server within 5 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lines(p: &Proc) -> Vec<String> {
    p.log_text().lines().map(str::to_string).collect()
}

#[test]
fn json_lines_parse_and_carry_fields() {
    let env = Env::new();
    let server = Server::start(&env, &["--log-format", "json", "--workers", "2"]);
    let mut started = None;
    for l in lines(&server.proc) {
        let v: serde_json::Value =
            serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["timestamp"].is_string(), "{l}");
        assert!(v["level"].is_string(), "{l}");
        if v["message"] == "edgetunnel server starting" {
            started = Some(v);
        }
    }
    let v = started.unwrap_or_else(|| panic!("no start line:\n{}", server.proc.log_text()));
    assert_eq!(v["level"], "INFO");
    assert_eq!(v["workers"], 2);
    assert_eq!(v["target"], "edgetunnel::server");
    eprintln!("a JSON line: {v}");
}

#[test]
fn klog_lines_have_klogs_header() {
    let env = Env::new();
    let server = Server::start(&env, &["--log-format", "klog", "--workers", "2"]);
    let pid = server.proc.child.id();
    let re = regex::Regex::new(
        r#"^([IWEF])(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) +(\d+) ([\w.]+):(\d+)\] "((?:[^"\\]|\\.)*)"((?: [\w.]+=\S.*)*)$"#,
    )
    .unwrap();
    let mut started = None;
    let all = lines(&server.proc);
    assert!(!all.is_empty());
    for l in &all {
        let c = re
            .captures(l)
            .unwrap_or_else(|| panic!("not a klog line: {l}"));
        assert_eq!(c[8].parse::<u32>().unwrap(), pid, "{l}");
        // The PID column is 7 wide, right-aligned, as klog pads it.
        assert_eq!(&l[21..30], format!(" {pid:>7} "), "{l}");
        if &c[11] == "edgetunnel server starting" {
            started = Some(l.clone());
        }
    }
    let l = started.unwrap_or_else(|| panic!("no start line:\n{}", all.join("\n")));
    assert!(l.starts_with('I') && l.contains(" mod.rs:"), "{l}");
    assert!(l.contains(" workers=2"), "{l}");
    assert!(l.contains(r#" driver=""#), "{l}");
    eprintln!("a klog line: {l}");
}

#[test]
fn a_bad_log_filter_stops_the_start() {
    let env = Env::new();
    let certs = env.certs().display().to_string();
    let run = |filter: &str| {
        let out = Command::new(BIN)
            .args(["--log", filter, "server", "--certs-dir", &certs])
            .args(["--agent-bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, out, err) = run("edgetunnel=loud");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a valid log filter"), "{err}");
    assert!(!out.contains("LISTEN"), "started anyway: {out}");
    let (code, out, err) = run("json");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("use --log-format json"), "{err}");
    assert!(!out.contains("LISTEN"), "started anyway: {out}");
}

#[test]
fn log_file_gets_the_lines_and_stderr_only_errors() {
    let env = Env::new();
    let file = env.path("logs/server.log");
    let f = file.display().to_string();
    let server = Server::start(&env, &["--log-file", &f, "--workers", "1"]);
    // A warning (an agent refused) goes to the file, not to stderr; an
    // error would go to both.
    // (The lines reach the file through the log thread: waited for.)
    support::wait_file_text(&file, "edgetunnel server starting");
    assert!(
        !server
            .proc
            .log_text()
            .contains("edgetunnel server starting"),
        "{}",
        server.proc.log_text()
    );
    // With --log-stderr-threshold all, stderr gets every line as well.
    let both = env.path("both.log").display().to_string();
    let s2 = Server::start(
        &env,
        &["--log-file", &both, "--log-stderr-threshold", "all"],
    );
    support::wait_file_text(std::path::Path::new(&both), "edgetunnel server starting");
    s2.proc.wait_log("edgetunnel server starting");
}

/// Log lines at INFO and above (text format: the level is the second
/// word).
fn loud(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| matches!(l.split_whitespace().nth(1), Some("INFO" | "WARN" | "ERROR")))
        .collect()
}

/// One agent on an 8-worker server, one tunnel, the agent stopped: a
/// handful of INFO lines, none worded as an error.
#[test]
fn one_agent_makes_few_info_lines() {
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "8"]);
    let echo = echo_server("127.0.0.1");
    let mut agent = Agent::start(&env, server.agent, "quiet", "host=quiet", &[]);
    // A link per server worker; the agent may give one up when the
    // kernel's SO_REUSEPORT spread keeps missing a worker (its
    // STEER_ATTEMPTS): then the count settles below 8.
    let (mut last, mut since) = (0.0, Instant::now());
    loop {
        let n = server.agent_links();
        if n != last {
            (last, since) = (n, Instant::now());
        }
        if n == 8.0 || (n >= 2.0 && since.elapsed() > Duration::from_secs(1)) {
            break;
        }
        assert!(since.elapsed() < support::WAIT, "links: {n}");
        std::thread::sleep(Duration::from_millis(25));
    }
    eprintln!("links: {last}");
    let target = format!("127.0.0.1:{}", echo.addr.port());
    let s = std::net::TcpStream::connect(server.connect).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    connect_and_echo(s, &target, 10_000).unwrap();
    // The agent stops (SIGTERM: it drains and leaves).
    agent.proc.signal(libc::SIGTERM);
    assert!(agent.proc.wait_exit(Duration::from_secs(10)).is_some());
    server.wait_metric("edgetunnel_agents_connected", 0.0);
    // The last line expected, through the log thread.
    let log = server.proc.wait_log("agent disconnected");
    let loud_lines = loud(&log);
    eprintln!(
        "server: {} lines at INFO and above:\n{}",
        loud_lines.len(),
        loud_lines.join("\n")
    );
    assert!(loud_lines.len() <= 8, "{}", loud_lines.join("\n"));
    for l in &loud_lines {
        assert!(!l.to_lowercase().contains("error"), "{l}");
    }
    assert_eq!(
        loud_lines
            .iter()
            .filter(|l| l.contains("agent connected"))
            .count(),
        1
    );
    assert_eq!(
        loud_lines
            .iter()
            .filter(|l| l.contains("agent disconnected"))
            .count(),
        1
    );
    let agent_log = agent.proc.log_text();
    let agent_loud = loud(&agent_log);
    eprintln!(
        "agent: {} lines at INFO and above:\n{}",
        agent_loud.len(),
        agent_loud.join("\n")
    );
    assert!(agent_loud.len() <= 8, "{}", agent_loud.join("\n"));
}

/// Replaces `dst` by `src`, keeping `dst`'s modification time, so that only
/// an explicit reload (SIGHUP), not the file watcher, picks it up.
fn replace_same_mtime(src: &Path, dst: &Path) {
    let stamp = dst.with_extension("stamp");
    let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
    ok(Command::new("touch").arg("-r").arg(dst).arg(&stamp));
    let tmp = dst.with_extension("new");
    std::fs::copy(src, &tmp).unwrap();
    std::fs::rename(&tmp, dst).unwrap();
    ok(Command::new("touch").arg("-r").arg(&stamp).arg(dst));
}

/// The certificate the server's agent listener presents now.
fn served_cert(env: &Env, addr: SocketAddr, roots: &Path) -> Vec<u8> {
    let certs = env.certs();
    let cfg = client_tls(
        roots,
        Some((&certs.join("agent.crt"), &certs.join("agent.key"))),
        b"h2",
        &[&rustls::version::TLS13],
        &[],
    );
    let s = tls_connect(addr, cfg).expect("TLS to the agent listener");
    s.conn.peer_certificates().unwrap()[0].as_ref().to_vec()
}

fn pem_der(path: &Path) -> Vec<u8> {
    engine::tls::load_certs(path).unwrap()[0].as_ref().to_vec()
}

/// SIGHUP: the server keeps serving (its unix sockets stay), reloads its
/// certificate at once (files replaced with their old modification time,
/// which the watcher does not notice), and SIGTERM still cleans up. An
/// agent survives SIGHUP too.
#[test]
fn sighup_reloads_and_never_kills() {
    let env = Env::new();
    let a = env.certs();
    let b = env.path("certs-b");
    let out = Command::new(BIN)
        .args(["certs", "init"])
        .arg(&b)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let live = env.path("live");
    std::fs::create_dir(&live).unwrap();
    for f in ["server.crt", "server.key"] {
        std::fs::copy(a.join(f), live.join(f)).unwrap();
    }
    // Roots that accept either server certificate.
    let roots = env.path("both-ca.crt");
    let mut pem = std::fs::read(a.join("ca.crt")).unwrap();
    pem.extend(std::fs::read(b.join("ca.crt")).unwrap());
    std::fs::write(&roots, pem).unwrap();
    let (crt, key) = (
        live.join("server.crt").display().to_string(),
        live.join("server.key").display().to_string(),
    );
    let ca = a.join("ca.crt").display().to_string();
    let mut server = Server::start_with_tls(
        &env,
        "127.0.0.1:0",
        &["--cert", &crt, "--key", &key, "--ca", &ca],
        &["--workers", "2"],
    );
    let echo = echo_server("127.0.0.1");
    let target = format!("127.0.0.1:{}", echo.addr.port());
    let agent = Agent::start(&env, server.agent, "hup", "host=hup", &[]);
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    assert_eq!(
        served_cert(&env, server.agent, &roots),
        pem_der(&a.join("server.crt"))
    );

    // A SIGHUP with nothing changed: taken (logged), and the server lives.
    server.proc.signal(libc::SIGHUP);
    server.proc.wait_log("SIGHUP received");
    assert!(
        server.proc.child.try_wait().unwrap().is_none(),
        "SIGHUP killed the server"
    );
    assert!(server.connect_uds.exists() && server.grpc_uds.exists());
    assert_eq!(http_get(server.admin, "/healthz").0, 200);
    let (status, _, s) = connect_unix(&server.connect_uds, &target);
    assert_eq!(status, 200);
    assert_eq!(echo_roundtrip(s, b"after SIGHUP"), b"after SIGHUP");

    // New files the watcher cannot see; SIGHUP swaps them in.
    replace_same_mtime(&b.join("server.key"), &live.join("server.key"));
    replace_same_mtime(&b.join("server.crt"), &live.join("server.crt"));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        served_cert(&env, server.agent, &roots),
        pem_der(&a.join("server.crt")),
        "the watcher reloaded files whose times did not change"
    );
    server.proc.signal(libc::SIGHUP);
    let deadline = Instant::now() + support::WAIT;
    while served_cert(&env, server.agent, &roots) != pem_der(&b.join("server.crt")) {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload:\n{}",
            server.proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The operator is told (the line may still be on its way to the file
    // through the log thread when the new certificate is already served).
    server.proc.wait_log("SIGHUP: certificate reloaded");
    // The agent connected before still carries tunnels.
    let (status, _, s) = connect_tcp(server.connect, &target);
    assert_eq!(status, 200);
    assert_eq!(echo_roundtrip(s, b"old agent"), b"old agent");

    // The agent: SIGHUP does not end it either.
    agent.proc.signal(libc::SIGHUP);
    agent.proc.wait_log("SIGHUP");
    let mut agent = agent;
    assert!(
        agent.proc.child.try_wait().unwrap().is_none(),
        "SIGHUP killed the agent"
    );
    let (status, _, s) = connect_tcp(server.connect, &target);
    assert_eq!(status, 200);
    assert_eq!(echo_roundtrip(s, b"agent hup"), b"agent hup");
    agent.proc.signal(libc::SIGTERM);
    assert!(agent.proc.wait_exit(Duration::from_secs(10)).is_some());

    // SIGTERM: exits (at once: no drain timeout) and removes its sockets.
    server.proc.signal(libc::SIGTERM);
    assert!(server.proc.wait_exit(support::WAIT).is_some());
    assert!(gone_within(&server.connect_uds, Duration::from_secs(1)));
    assert!(gone_within(&server.grpc_uds, Duration::from_secs(1)));
}

/// Every listener is announced: unix sockets, and the proxy's
/// --metrics-bind.
#[test]
fn unix_sockets_and_proxy_metrics_are_announced() {
    let env = Env::new();
    let certs = env.certs().display().to_string();
    let (cmd, n, connect_uds, grpc_uds) =
        Server::command(&env, &["--certs-dir", &certs], &Binds::default(), &[]);
    let p = Proc::spawn(cmd, env.path(&format!("announce-{n}.log")));
    let mut seen = Vec::new();
    loop {
        let l = p.wait_line_any(&["LISTEN ", "READY"], support::WAIT);
        if l == "READY" {
            break;
        }
        seen.push(l);
    }
    let want = |l: String| assert!(seen.contains(&l), "{l} not in {seen:#?}");
    want(format!("LISTEN connect-uds {}", connect_uds.display()));
    want(format!("LISTEN grpc-uds {}", grpc_uds.display()));

    let api = support::apiserver::start(&env.certs());
    let kubeconfig = env.path("kubeconfig");
    support::apiserver::kubeconfig(
        &kubeconfig,
        &format!("https://127.0.0.1:{}", api.addr.port()),
        &env.certs(),
        Some("tok"),
        false,
    );
    let cmd = support::proxy_proc::ours_cmd(
        &kubeconfig,
        &["--port=0".into(), "--metrics-bind=127.0.0.1:0".into()],
    );
    let proxy = Proc::spawn(cmd, env.path("proxy.log"));
    let first = proxy.wait_line_any(&["Starting to serve on ", "LISTEN "], support::WAIT);
    assert!(
        first.starts_with("Starting to serve on "),
        "kubectl's line first: {first}"
    );
    let metrics = support::listen_addr(&proxy, "metrics");
    let (status, body) = http_get(metrics, "/metrics");
    assert_eq!(status, 200, "{body}");
}

/// `server --help` and `agent --help` group their flags under headings,
/// each with flags; `proxy --help` sets kubectl's global flags apart.
#[test]
fn server_and_agent_help_are_grouped() {
    for (role, headings) in [
        (
            "server",
            &[
                "Agents:",
                "Frontends:",
                "TLS:",
                "Routing:",
                "Limits and shutdown:",
                "Data plane:",
                "Interception (yurt-tunnel):",
                "iptables:",
                "DNS records:",
                "Kubernetes:",
                "Observability:",
                "Logging:",
            ][..],
        ),
        (
            "agent",
            &[
                "Servers:",
                "Identity:",
                "TLS:",
                "Dialing:",
                "Kubernetes:",
                "Observability:",
                "Data plane:",
                "Logging:",
            ][..],
        ),
    ] {
        let out = Command::new(BIN).args([role, "--help"]).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let all: Vec<&str> = text.lines().collect();
        for h in headings {
            let at = all
                .iter()
                .position(|l| l == h)
                .unwrap_or_else(|| panic!("{role}: no heading {h:?}:\n{text}"));
            assert!(
                all.get(at + 1)
                    .is_some_and(|l| l.trim_start().starts_with("--")),
                "{role}: heading {h:?} has no flag under it:\n{text}"
            );
        }
        // Nothing but --help is left without a heading.
        let options = all.iter().position(|l| *l == "Options:").unwrap();
        let flags = all[options + 1..]
            .iter()
            .take_while(|l| !l.ends_with(':') || l.starts_with(' '))
            .filter(|l| l.trim_start().starts_with('-'))
            .count();
        assert_eq!(flags, 1, "{role}: flags without a heading:\n{text}");
    }
    // The drop-in proxy keeps kubectl proxy's own flags under `Options:`;
    // kubectl's global ones and edgetunnel's additions get headings.
    let out = Command::new(BIN)
        .args(["proxy", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    for h in [
        "Options:",
        "kubectl global options (kubectl options):",
        "edgetunnel:",
        "Logging:",
    ] {
        assert!(text.lines().any(|l| l == h), "proxy: no {h:?}:\n{text}");
    }
    let own = text.split("kubectl global options").next().unwrap();
    assert!(
        own.contains("--accept-paths") && !own.contains("--kubeconfig"),
        "{text}"
    );
}
