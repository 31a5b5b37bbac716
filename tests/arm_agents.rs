//! The agent built for ARM edge nodes (issue 44): the `edgetunnel` binary
//! cross-built for `aarch64-unknown-linux-gnu` and
//! `armv7-unknown-linux-gnueabihf` (`scripts/cross-build`) runs under
//! qemu-user on this x86-64 machine, connects to an x86-64 server and
//! carries tunnels byte for byte through both cloud-side frontends (HTTP
//! CONNECT and gRPC `ProxyService/Proxy`).
//!
//! qemu-user (Debian's 7.2) does not translate io_uring: `io_uring_setup`
//! answers ENOSYS (qemu logs "Unsupported syscall"). The agent's `auto`
//! driver must then fall back to epoll, and the test checks that it did
//! (its start line says `driver="epoll"`), that the same auto driver on
//! this host chose io_uring (so the fallback is the emulator's doing), and
//! that `--driver uring` under emulation fails with the kernel's answer
//! instead of running; it prints what it found.
//!
//! The binaries are looked up at `target/<triple>/<profile>/edgetunnel`
//! (profile `EDGETUNNEL_CROSS_PROFILE`, default `release`). Without them or
//! without qemu-user the test says `skipped: ...`, unless
//! `EDGETUNNEL_REQUIRE_CROSS=1` (scripts/test sets it after the cross
//! builds), when a missing piece fails the test.

mod support;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use protocol::anp::packet::{self, Frame};
use support::raw_h2::{Event, RawH2, DATA, END_STREAM, WINDOW_UPDATE};
use support::*;

/// One ARM target: its Rust triple and how qemu-user runs its binaries.
struct Arch {
    name: &'static str,
    triple: &'static str,
    qemu: &'static str,
    /// The cross toolchain's sysroot (the dynamic loader and libc).
    sysroot: &'static str,
}

const ARM64: Arch = Arch {
    name: "arm64",
    triple: "aarch64-unknown-linux-gnu",
    qemu: "qemu-aarch64-static",
    sysroot: "/usr/aarch64-linux-gnu",
};

const ARMV7: Arch = Arch {
    name: "armv7",
    triple: "armv7-unknown-linux-gnueabihf",
    qemu: "qemu-arm-static",
    sysroot: "/usr/arm-linux-gnueabihf",
};

fn on_path(prog: &str) -> bool {
    Command::new(prog)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

impl Arch {
    /// The cross-built binary, or None after saying why the test skips.
    fn ready(&self) -> Option<PathBuf> {
        let bin = cross_binary(Some(self.triple));
        let missing = if !on_path(self.qemu) {
            Some(format!(
                "{} is not installed (scripts/ensure-tools installs qemu-user-static)",
                self.qemu
            ))
        } else if !bin.exists() {
            Some(format!(
                "no {} (scripts/cross-build {} builds it)",
                bin.display(),
                self.triple
            ))
        } else if !Path::new(self.sysroot).join("lib").exists() {
            Some(format!(
                "no {} (the cross toolchain's libc; scripts/ensure-tools installs it)",
                self.sysroot
            ))
        } else {
            None
        };
        match missing {
            Some(why) if cross_required() => {
                panic!("{}: {why} (EDGETUNNEL_REQUIRE_CROSS=1)", self.name)
            }
            Some(why) => {
                println!("skipped: {}: {why}", self.name);
                None
            }
            None => Some(bin),
        }
    }

    /// `edgetunnel ARGS` of this architecture under qemu-user.
    fn command(&self, bin: &Path) -> Command {
        let mut cmd = Command::new(self.qemu);
        cmd.arg("-L").arg(self.sysroot).arg(bin);
        cmd
    }

    /// `edgetunnel agent` of this architecture with the test certificates,
    /// linking to `server` as `agent_id`.
    fn agent(&self, bin: &Path, env: &Env, server: &Server, agent_id: &str) -> Command {
        let mut cmd = self.command(bin);
        cmd.arg("agent")
            .arg("--certs-dir")
            .arg(env.certs())
            .args(["--server-addr", &server.agent.to_string()])
            .args(["--server-name", "localhost"])
            .args(["--agent-id", agent_id]);
        cmd
    }
}

/// An emulated agent with the test certificates, on the auto driver.
fn start_agent(arch: &Arch, bin: &Path, env: &Env, server: &Server) -> Proc {
    let mut cmd = arch.agent(bin, env, server, &format!("node-{}", arch.name));
    cmd.args(["--agent-identifiers", &format!("host=node-{}", arch.name)])
        .args(["--backoff-initial-secs", "0.1", "--backoff-max-secs", "1"])
        .env_remove("EDGETUNNEL_DRIVER")
        .env_remove("MONOIO_FORCE_LEGACY_DRIVER");
    let p = Proc::spawn(cmd, env.path(&format!("agent-{}.log", arch.name)));
    p.wait_line("CONNECTED");
    p
}

/// What the host's own agent picks with the auto driver (it only prints
/// its start line and stops: no server answers on a refused port).
fn host_auto_driver(env: &Env) -> String {
    let (_hold, refused) = refused_addr();
    let mut cmd = Command::new(BIN);
    cmd.args(["agent", "--certs-dir"])
        .arg(env.certs())
        .args(["--server-addr", &refused.to_string()])
        .args(["--agent-id", "host"])
        .env_remove("EDGETUNNEL_DRIVER")
        .env_remove("MONOIO_FORCE_LEGACY_DRIVER");
    let mut p = Proc::spawn(cmd, env.path("agent-host.log"));
    let log = p.wait_log("edgetunnel agent starting");
    let _ = p.child.kill();
    let _ = p.wait_exit(WAIT);
    if log.contains("driver=\"io_uring\"") {
        "io_uring".into()
    } else {
        "epoll".into()
    }
}

/// `--driver uring` under emulation: must not run (it exits with an error
/// instead of connecting). Returns the error line it printed.
fn forced_uring_refused(arch: &Arch, bin: &Path, env: &Env, server: &Server) -> String {
    let mut cmd = arch.agent(bin, env, server, "forced-uring");
    cmd.args(["--driver", "uring"]);
    let mut p = Proc::spawn(cmd, env.path(&format!("agent-{}-uring.log", arch.name)));
    let status = p
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("{}: --driver uring kept running under qemu", arch.name));
    let log = p.log_text();
    assert!(
        !status.success(),
        "{}: --driver uring exited 0 under qemu:\n{log}",
        arch.name
    );
    log.lines()
        .rev()
        .find(|l| l.to_ascii_lowercase().contains("error") || l.contains("not implemented"))
        .unwrap_or("(no error line)")
        .trim()
        .to_string()
}

/// Tunnels through the CONNECT frontend: one of 4 MiB, then eight at once.
fn connect_tunnels(arch: &Arch, server: &Server, echo: &Echo) {
    let target = echo.addr.to_string();
    let (status, body, s) = connect_tcp(server.connect, &target);
    assert_eq!(status, 200, "{}: {body}", arch.name);
    let data = random_bytes(4 << 20, 44);
    let back = echo_roundtrip(s, &data);
    assert!(
        back == data,
        "{}: CONNECT: {}",
        arch.name,
        first_difference(&back, &data)
    );
    let busy: Vec<_> = (0..8)
        .map(|i| busy_tunnel(server.connect, target.clone(), 512 << 10, 100 + i))
        .collect();
    for (i, b) in busy.into_iter().enumerate() {
        assert!(
            b.join().unwrap(),
            "{}: CONNECT tunnel {i} of 8 differs",
            arch.name
        );
    }
}

/// A tunnel through the gRPC frontend: 1 MiB in messages of 8 KiB, each
/// read back before the next goes.
fn grpc_tunnel(arch: &Arch, server: &Server, echo: &Echo) {
    let s = TcpStream::connect(server.grpc).expect("connect grpc tcp");
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.set_nodelay(true).unwrap();
    let mut c = RawH2::start(s);
    // The client's receive windows, 64 KiB by default, opened to 2 GiB
    // (it sends no WINDOW_UPDATE as it reads).
    let more = (0x7fff_ffff_u32 - 65_535).to_be_bytes();
    c.write_frame(WINDOW_UPDATE, 0, 0, &more);
    let id = c.dial(1, "localhost", echo.addr, 4400);
    c.write_frame(WINDOW_UPDATE, 0, 1, &more);
    let data = random_bytes(1 << 20, 45);
    let mut back = Vec::with_capacity(data.len());
    for chunk in data.chunks(8 << 10) {
        c.send_packet(1, packet::data(id, Bytes::copy_from_slice(chunk)));
        let want = back.len() + chunk.len();
        while back.len() < want {
            match c.next_event(1) {
                Event::Packet(Frame::Data(d)) => {
                    assert_eq!(d.connect_id, id);
                    back.extend_from_slice(&d.data);
                }
                e => panic!("{}: gRPC: expected DATA, got {e:?}", arch.name),
            }
        }
    }
    assert!(
        back == data,
        "{}: gRPC: {}",
        arch.name,
        first_difference(&back, &data)
    );
    c.close(1, id);
    c.write_frame(DATA, END_STREAM, 1, &[]);
}

fn emulated_agent_carries_tunnels(arch: &Arch) {
    let Some(bin) = arch.ready() else { return };
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let echo = echo_server("127.0.0.1");
    let host = host_auto_driver(&env);
    let agent = start_agent(arch, &bin, &env, &server);
    let log = agent.wait_log("edgetunnel agent starting");
    assert!(
        log.contains("driver=\"epoll\""),
        "{}: the auto driver under qemu did not fall back to epoll:\n{log}",
        arch.name
    );
    let refused = forced_uring_refused(arch, &bin, &env, &server);
    println!(
        "{}: under {} the auto driver chose epoll (on this host it chose {host}); \
         --driver uring fails there: {refused}",
        arch.name, arch.qemu
    );
    connect_tunnels(arch, &server, &echo);
    grpc_tunnel(arch, &server, &echo);
    server.wait_metric("edgetunnel_open_connections", 0.0);
    println!(
        "{}: CONNECT (4 MiB, then 8 x 512 KiB at once) and gRPC (1 MiB) tunnels \
         carried byte for byte",
        arch.name
    );
}

#[test]
fn arm64_agent_under_qemu_carries_connect_and_grpc_tunnels() {
    emulated_agent_carries_tunnels(&ARM64);
}

#[test]
fn armv7_agent_under_qemu_carries_connect_and_grpc_tunnels() {
    emulated_agent_carries_tunnels(&ARMV7);
}
