//! Start-up and handshake errors that name their cause and what to do
//! (issue 28): each case starts the real binary with the wrong input and
//! checks the exit status and the words of the message.
//!
//! - an agent's certificate (clientAuth only) given as the server's: refused
//!   at start, naming the file and `certs issue server`;
//! - a key that does not belong to the certificate: both files named
//!   (rustls says only `KeyMismatch`);
//! - a unix socket in a missing directory: the directory named;
//! - a port held by an outgoing connection (nothing listens): said so,
//!   not "another process listens there";
//! - an agent whose certificate another CA signed, and an agent that does
//!   not trust the server's CA: the server's log names the agent's address
//!   and the cause.

use crate::support;

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::{Agent, Env, Server, BIN};

/// Runs `edgetunnel server ARGS` (loopback ports) and returns its exit
/// success and stderr.
fn server_fails(args: &[&str]) -> String {
    let mut child = Command::new(BIN)
        .arg("server")
        .args([
            "--admin-bind",
            "127.0.0.1:0",
            "--connect-bind",
            "127.0.0.1:0",
        ])
        .args(["--grpc-bind", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run edgetunnel server");
    // A server that accepts the input runs on: stopped after a while.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        status.is_some_and(|s| !s.success()),
        "server started with {args:?} ({status:?}):\n{err}"
    );
    err
}

fn path(env: &Env, f: &str) -> String {
    env.certs().join(f).display().to_string()
}

#[test]
fn agent_certificate_as_server_certificate_is_refused() {
    let env = Env::new();
    let (crt, key, ca) = (
        path(&env, "agent.crt"),
        path(&env, "agent.key"),
        path(&env, "ca.crt"),
    );
    let err = server_fails(&[
        "--cert",
        &crt,
        "--key",
        &key,
        "--ca",
        &ca,
        "--agent-bind",
        "127.0.0.1:0",
    ]);
    assert!(
        err.contains(&format!("{crt} is not a server certificate")),
        "{err}"
    );
    assert!(err.contains("clientAuth"), "{err}");
    assert!(err.contains("certs issue server"), "{err}");
}

#[test]
fn a_key_of_another_certificate_names_both_files() {
    let env = Env::new();
    let (crt, key, ca) = (
        path(&env, "server.crt"),
        path(&env, "agent.key"),
        path(&env, "ca.crt"),
    );
    let err = server_fails(&[
        "--cert",
        &crt,
        "--key",
        &key,
        "--ca",
        &ca,
        "--agent-bind",
        "127.0.0.1:0",
    ]);
    assert!(
        err.contains(&format!(
            "the private key {key} does not belong to the certificate {crt}"
        )),
        "{err}"
    );
}

#[test]
fn a_socket_in_a_missing_directory_names_the_directory() {
    let env = Env::new();
    let dir = env.path("no-such-dir");
    let sock = dir.join("konnectivity.socket");
    let certs = env.certs().display().to_string();
    let err = server_fails(&[
        "--certs-dir",
        &certs,
        "--agent-bind",
        "127.0.0.1:0",
        "--grpc-uds",
        &sock.display().to_string(),
    ]);
    assert!(
        err.contains(&format!(
            "grpc-uds listener: binding {}: the directory {} does not exist",
            sock.display(),
            dir.display()
        )),
        "{err}"
    );
}

#[test]
fn a_port_held_by_an_outgoing_connection_is_not_called_a_listener() {
    let env = Env::new();
    let certs = env.certs().display().to_string();
    // A connection whose local end is bound to `port` first: nothing
    // listens on that port, yet it is in use.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    let port = s.local_addr().unwrap().as_socket().unwrap().port();
    s.connect(&l.local_addr().unwrap().into()).unwrap();
    let _accepted = l.accept().unwrap();
    let bind = format!("127.0.0.1:{port}");
    let err = server_fails(&["--certs-dir", &certs, "--agent-bind", &bind]);
    assert!(
        err.contains(&format!("nothing listens on port {port}")),
        "{err}"
    );
    assert!(!err.contains("another process listens"), "{err}");
    // And a real listener is still called one.
    let lp = l.local_addr().unwrap().to_string();
    let err = server_fails(&["--certs-dir", &certs, "--agent-bind", &lp]);
    assert!(err.contains("another process listens there"), "{err}");
}

fn wait_log(server: &Server, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = server.proc.log_text();
        if let Some(l) = log.lines().find(|l| l.contains(needle)) {
            return l.to_string();
        }
        assert!(Instant::now() < deadline, "no {needle:?} in:\n{log}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn handshake_failures_name_the_agent_and_the_cause() {
    let env = Env::new();
    let other = Env::new();
    let server = Server::start(&env, &[]);
    let ca = path(&env, "ca.crt");
    let ours_ca = env.certs().join("ca.crt");
    // Signed by another CA, trusting ours.
    let (crt, key) = (path(&other, "agent.crt"), path(&other, "agent.key"));
    let _a = Agent::spawn(
        &env,
        server.agent,
        "node-x",
        "host=node-x",
        &["--cert", &crt, "--key", &key, "--ca", &ca],
    );
    let line = wait_log(
        &server,
        "presented a certificate not signed by the agent CA",
    );
    assert!(line.contains("agent 127.0.0.1:"), "{line}");
    assert!(line.contains(&ours_ca.display().to_string()), "{line}");
    drop(_a);
    // Trusting another CA: it refuses our certificate.
    let other_ca = path(&other, "ca.crt");
    let (crt, key) = (path(&env, "agent.crt"), path(&env, "agent.key"));
    let _b = Agent::spawn(
        &env,
        server.agent,
        "node-y",
        "host=node-y",
        &["--cert", &crt, "--key", &key, "--ca", &other_ca],
    );
    let line = wait_log(&server, "refused this server's certificate");
    assert!(line.contains("agent 127.0.0.1:"), "{line}");
    let _ = TcpStream::connect(server.agent);
}

#[test]
fn version_names_the_commit() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    let v = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{v}");
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    // Outside a git checkout the build says `unknown`.
    let want = head.unwrap_or_else(|| "unknown".into());
    assert!(v.contains(&format!("(commit {want}, rustc ")), "{v}");
}
