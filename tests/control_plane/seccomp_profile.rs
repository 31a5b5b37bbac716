//! deploy/seccomp/edgetunnel.json under a real seccomp filter: the
//! profile is loaded as runc loads a Localhost profile
//! (tests/seccomp/run_under_profile.py: libseccomp's Python binding,
//! no_new_privs, then exec) around a real server and agent, and bytes go
//! through the tunnel with the io_uring driver forced on; a call the
//! profile leaves out (`unshare`) is refused with EPERM. The same with
//! Docker's default profile (edgetunnel.json without the three
//! `io_uring_*` calls, what RuntimeDefault gives): the `auto` driver falls
//! back to epoll and the tunnel still works, as deploy/README.md says.
//! Skipped, with a line saying why, without python3-seccomp
//! (`apt-get install python3-seccomp`; scripts/test installs it).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

const PYTHON: &str = "/usr/bin/python3";

fn runner() -> PathBuf {
    repo().join("tests/seccomp/run_under_profile.py")
}

fn profile() -> PathBuf {
    repo().join("deploy/seccomp/edgetunnel.json")
}

/// Whether python3-seccomp is importable by the system python; prints the
/// skipped line when not.
fn have_seccomp() -> bool {
    let ok = Command::new(PYTHON)
        .args(["-c", "import seccomp"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        use std::io::Write;
        // Straight to the file descriptor: libtest captures eprintln!.
        let _ = writeln!(
            std::io::stderr(),
            "skipped: python3-seccomp not installed (apt-get install python3-seccomp)"
        );
    }
    ok
}

/// `cmd` run under `profile`.
fn confined(profile: &Path, cmd: &Command) -> Command {
    let mut c = Command::new(PYTHON);
    c.arg(runner())
        .arg(profile)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    c
}

/// A server and an agent both under `profile` with `driver`; CONNECT
/// echoes over TCP and the unix socket, 1 byte to 8 MiB. The server's log.
fn tunnel_under(env: &Env, profile: &Path, driver: &str) -> String {
    let echo = echo_server("127.0.0.1");
    let drv = ["--driver", driver];
    let (cmd, n, connect_uds, grpc_uds) = Server::command(
        env,
        &["--certs-dir", &env.certs().display().to_string()],
        &Binds::default(),
        &drv,
    );
    let server = Server::spawn(env, confined(profile, &cmd), n, connect_uds, grpc_uds);
    let allow = format!("127.0.0.1/32:{}", echo.addr.port());
    let mut extra = vec!["--allow-destinations", &allow];
    extra.extend_from_slice(&drv);
    let cmd = Agent::command(env, server.agent, "node-1", "ipv4=127.0.0.1", &extra);
    let agent = Agent {
        proc: Proc::spawn(
            confined(profile, &cmd),
            env.path(&format!("agent-{driver}.log")),
        ),
    };
    agent.proc.wait_line("CONNECTED");
    let target = echo.addr.to_string();
    for size in [1usize, 64 * 1024 + 1, 8 << 20] {
        let (code, body, s) = connect_tcp(server.connect, &target);
        assert_eq!(code, 200, "{body}\n{}", agent.proc.log_text());
        let data = random_bytes(size, size as u64);
        assert!(echo_roundtrip(s, &data) == data, "{size} bytes over TCP");
        let (code, body, s) = connect_unix(&server.connect_uds, &target);
        assert_eq!(code, 200, "{body}");
        assert!(
            echo_roundtrip(s, &data) == data,
            "{size} bytes over the unix socket"
        );
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
    for p in [&server.proc, &agent.proc] {
        let log = p.log_text();
        assert!(
            !log.contains("Operation not permitted") && !log.contains("Function not implemented"),
            "a call refused under {}:\n{log}",
            profile.display()
        );
    }
    server.proc.log_text()
}

#[test]
fn the_profile_runs_the_tunnel_on_io_uring_and_refuses_what_it_leaves_out() {
    if !have_seccomp() {
        return;
    }
    let env = Env::new();
    // Refused: a call outside the profile gets EPERM (defaultErrnoRet 1).
    let out = confined(&profile(), Command::new("unshare").args(["-n", "true"]))
        .output()
        .expect("run unshare under the profile");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Operation not permitted"),
        "unshare under the profile: {:?} {err}",
        out.status
    );
    // The same command runs without it (root here): the filter refused it.
    assert!(Command::new("unshare")
        .args(["-n", "true"])
        .status()
        .unwrap()
        .success());
    let log = tunnel_under(&env, &profile(), "uring");
    assert!(log.contains("driver=\"io_uring\""), "{log}");
}

#[test]
fn docker_default_profile_falls_back_to_epoll() {
    if !have_seccomp() {
        return;
    }
    let env = Env::new();
    // edgetunnel.json is Docker's default plus io_uring_{setup,enter,register}.
    let mut p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(profile()).unwrap()).unwrap();
    let mut removed = 0;
    for rule in p["syscalls"].as_array_mut().unwrap() {
        let names = rule["names"].as_array_mut().unwrap();
        let before = names.len();
        names.retain(|n| !n.as_str().unwrap().starts_with("io_uring_"));
        removed += before - names.len();
    }
    assert_eq!(
        removed, 3,
        "edgetunnel.json should add exactly the io_uring calls"
    );
    let docker = env.path("docker-default.json");
    std::fs::write(&docker, p.to_string()).unwrap();
    let log = tunnel_under(&env, &docker, "auto");
    assert!(log.contains("driver=\"epoll\""), "{log}");
}
