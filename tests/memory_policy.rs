//! The memory policy of the data-plane processes (`engine::memory`): the
//! server and the agent run without transparent huge pages (2 MiB pages
//! kept idle tunnels' small allocations resident a huge page at a time),
//! unless `EDGETUNNEL_THP=on` keeps them; the kernel's own view of each
//! process (`THP_enabled` in /proc/PID/status) is checked.

mod support;

use support::*;

/// The process's `THP_enabled` flag (Linux 5.0 and later report it).
fn thp_enabled(pid: u32) -> bool {
    match proc_status(pid, "THP_enabled").as_str() {
        "0" => false,
        "1" => true,
        other => panic!("unexpected THP_enabled value {other:?}"),
    }
}

#[test]
fn server_and_agent_run_without_transparent_huge_pages() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let agent = Agent::start(&env, server.agent, "thp", "host=thp", &[]);
    assert!(!thp_enabled(server.proc.child.id()), "server");
    assert!(!thp_enabled(agent.proc.child.id()), "agent");
}

#[test]
fn thp_on_keeps_transparent_huge_pages() {
    let env = Env::new();
    let binds = Binds::default();
    let certs = env.certs().display().to_string();
    let (mut cmd, n, connect_uds, grpc_uds) =
        Server::command(&env, &["--certs-dir", &certs], &binds, &[]);
    cmd.env("EDGETUNNEL_THP", "on");
    let server = Server::spawn(&env, cmd, n, connect_uds, grpc_uds);
    // The flag is inherited: the server keeps what this test process has
    // (on, unless whatever started the tests turned it off).
    assert_eq!(
        thp_enabled(server.proc.child.id()),
        thp_enabled(std::process::id())
    );
}
