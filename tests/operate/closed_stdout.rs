//! Readiness lines (`LISTEN ...`, `READY`, `CONNECTED ...`, `LINKED ...`)
//! go to stdout; a supervisor that stops reading (closes its end of the
//! pipe) must not kill the process or a link thread. `println!` panics on
//! EPIPE; `edgetunnel::announce` does not.

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{free_port, http_get, Env, BIN};

/// Runs `cmd` with a stdout pipe whose read end is closed at once.
fn spawn_with_closed_stdout(mut cmd: Command) -> std::process::Child {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    child
}

fn wait_healthy(admin: std::net::SocketAddr, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("exited with {status} after its stdout was closed");
        }
        if std::net::TcpStream::connect(admin).is_ok() && http_get(admin, "/healthz").0 == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "{admin} never answered /healthz");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn server_and_agent_survive_a_closed_stdout() {
    let env = Env::new();
    let certs = env.certs().display().to_string();
    let port = |_: ()| format!("127.0.0.1:{}", free_port());
    let (agent_bind, admin) = (port(()), port(()));
    let mut server = Command::new(BIN);
    server
        .args(["server", "--certs-dir", &certs, "--workers", "2"])
        .arg("--bind-agent-identity=false")
        .args(["--agent-bind", &agent_bind])
        .args(["--connect-bind", &port(())])
        .args(["--grpc-bind", &port(())])
        .args(["--admin-bind", &admin])
        .arg("--connect-uds")
        .arg(env.path("c.sock"))
        .arg("--grpc-uds")
        .arg(env.path("g.sock"));
    let mut server = spawn_with_closed_stdout(server);
    wait_healthy(admin.parse().unwrap(), &mut server);

    // The agent announces CONNECTED and, with two server workers, LINKED.
    let agent_admin = port(());
    let mut agent = Command::new(BIN);
    agent
        .args(["agent", "--certs-dir", &certs, "--workers", "2"])
        .args(["--server-addr", &agent_bind, "--server-name", "localhost"])
        .args(["--agent-id", "closed-stdout"])
        .args(["--admin-bind", &agent_admin]);
    let mut agent = spawn_with_closed_stdout(agent);
    wait_healthy(agent_admin.parse().unwrap(), &mut agent);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, text) = http_get(admin.parse().unwrap(), "/metrics");
        let links: f64 = text
            .lines()
            .filter(|l| l.starts_with("edgetunnel_worker_agent_links{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if links >= 2.0 {
            break;
        }
        assert!(Instant::now() < deadline, "links never formed:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Still running after announcing everything into a closed pipe.
    std::thread::sleep(Duration::from_millis(300));
    assert!(server.try_wait().unwrap().is_none(), "server exited");
    assert!(agent.try_wait().unwrap().is_none(), "agent exited");
    let _ = agent.kill();
    let _ = server.kill();
    let _ = agent.wait();
    let _ = server.wait();
}
