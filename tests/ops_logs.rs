//! What an operator meets in logs, signals and `--help` (issue 28): a
//! closed stderr must not kill the process, the log formats and files, a
//! quiet INFO level, SIGHUP as a reload, LISTEN lines for every listener,
//! and grouped help.

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{
    connect_and_echo, connect_tcp, echo_server, http_get, Agent, Binds, Env, Proc, Server, BIN,
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

/// A server whose stdout and stderr are pipes to this test: once it is
/// ready, the test closes both read ends (a log shipper that went away).
/// The server logs on (debug level, an agent, tunnels, a bad request),
/// must keep serving, count the lost log lines, and stop on SIGTERM with
/// its unix sockets removed.
#[test]
fn a_closed_stderr_neither_kills_nor_wedges_the_server() {
    let env = Env::new();
    let binds = Binds::default();
    let certs = env.certs().display().to_string();
    let (mut cmd, _, connect_uds, grpc_uds) = Server::command(
        &env,
        &["--certs-dir", &certs],
        &binds,
        &["--workers", "2", "--log", "debug"],
    );
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut agent_addr, mut connect, mut admin) = (None, None, None);
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "stdout ended");
        let line = line.trim();
        let addr = || line.rsplit(' ').next().unwrap().parse::<SocketAddr>().ok();
        if line.starts_with("LISTEN agent ") {
            agent_addr = addr();
        } else if line.starts_with("LISTEN connect ") {
            connect = addr();
        } else if line.starts_with("LISTEN admin ") {
            admin = addr();
        } else if line == "READY" {
            break;
        }
    }
    let (agent_addr, connect, admin) = (agent_addr.unwrap(), connect.unwrap(), admin.unwrap());
    // The readers go away.
    drop(out);
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

    // SIGTERM still stops it, and it cleans up.
    let t = Instant::now();
    kill(child.id(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
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
        panic!("SIGTERM did not stop the server within 5 s");
    }
    eprintln!("stopped {:?} after SIGTERM: {:?}", t.elapsed(), status);
    assert!(gone_within(&connect_uds, Duration::from_secs(1)));
    assert!(gone_within(&grpc_uds, Duration::from_secs(1)));
}

#[allow(dead_code)]
fn unused(_: Proc) {}
