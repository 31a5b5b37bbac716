//! A listener handover (`--handover-socket`) with ANP's Go agent (v0.36.0)
//! on the edge, at its default sync interval: a GOAWAY would make it drop
//! its link and the tunnels on it, and it links to another server only
//! when its link ends. So the old server keeps the Go agent's link while a
//! tunnel is open on it, the new server sends the dials it has no agent
//! for to the old one, and once the link carries nothing the old server
//! ends it and the agent links to the new one. Three handovers in a row
//! under a steady load of CONNECT dials (TCP and unix socket) and of the
//! real konnectivity-client's gRPC dials (anptool, a new gRPC connection
//! each, as kube-apiserver makes them): no dial fails, a tunnel held open
//! across each handover stays whole, and no socket path is ever missing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::common::{client, peers, serial, tail, GoTarget, Logged};
use crate::go_agent::{agent_mtls, dials_at, go_agent_args, spawn_go_agent};
use crate::support::dial_load::{assert_none_failed, still_echoes, watch_paths, Load, Via};
use crate::support::{connect_unix, echo_server, Binds, Env, Server, WAIT};

fn logs(server: &Server, agent: &Logged) -> String {
    format!(
        "--- server:\n{}\n--- go agent:\n{}",
        tail(&server.proc.log_text(), 40),
        tail(&agent.text(), 40)
    )
}

#[test]
fn three_handovers_with_the_go_agent_fail_no_dial_and_cut_no_tunnel() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let env = Env::new();
    let handover = env.path("handover.sock");
    let h = handover.display().to_string();
    let flags = [
        "--handover-socket",
        h.as_str(),
        "--graceful-shutdown-timeout-secs",
        "60",
    ];
    let mut server = Server::start(&env, &flags);
    let binds = Binds::of(&server);
    // ANP's defaults: a sync each second, a probe each second.
    let mut args = go_agent_args(server.agent.port(), "go-1", "host=go-1", &agent_mtls(&env));
    args.retain(|a| !a.starts_with("--sync-interval"));
    args.extend([
        "--sync-interval=1s".into(),
        "--sync-interval-cap=10s".into(),
    ]);
    let agent = spawn_go_agent(p, &env, "go-agent", &args);
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    let echo = echo_server("127.0.0.1");
    let target = echo.addr.to_string();

    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_paths(
        vec![
            server.connect_uds.clone(),
            server.grpc_uds.clone(),
            handover.clone(),
        ],
        stop_watch.clone(),
    );
    // The konnectivity-client's dials, one after another.
    let go_target = GoTarget::start(p, &env, "127.0.0.1:0");
    let grpc_stop = Arc::new(AtomicBool::new(false));
    let grpc_load = {
        let (stop, uds, t) = (
            grpc_stop.clone(),
            server.grpc_uds.display().to_string(),
            go_target.target(),
        );
        thread::spawn(move || {
            let (mut ok, mut failed) = (0usize, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let r = client(
                    p,
                    &[
                        "-via", "grpc-uds", "-addr", &uds, "-target", &t, "-test", "echo", "-size",
                        "4096",
                    ],
                );
                if r.ok {
                    ok += 1;
                } else {
                    failed.push(r.describe());
                }
            }
            (ok, failed)
        })
    };
    let load = Load::start(Via::both_frontends(&server), target.clone());
    // Tunnels that overlap: through the new server they go to the old
    // one as long as the Go agent is linked there, and must not keep its
    // link busy for ever (the old server takes them only while callers of
    // its own are left).
    let overlapping = Load::holding(
        vec![
            Via::Unix(server.connect_uds.clone()),
            Via::Unix(server.connect_uds.clone()),
            Via::Tcp(server.connect),
        ],
        target.clone(),
        Duration::from_millis(200),
    );
    thread::sleep(Duration::from_millis(500));
    let uds = binds.connect_uds.clone().unwrap();
    for round in 1..=3u8 {
        let (status, _, mut held) = connect_unix(&uds, &target);
        assert_eq!(status, 200, "{}", logs(&server, &agent));
        still_echoes(&mut held, round);
        let next = Server::start_at(&env, &binds, &flags);
        next.proc.wait_log("handover: the predecessor drains");
        // The Go agent stays on the old link while the held tunnel is
        // open: the new server forwards its dials there meanwhile.
        load.wait_past(load.dialled() + 40, || {
            format!("round {round}\n{}", logs(&next, &agent))
        });
        still_echoes(&mut held, round.wrapping_add(100));
        assert!(
            server.proc.wait_exit(Duration::ZERO).is_none(),
            "round {round}: the old server left with a tunnel open:\n{}",
            logs(&server, &agent)
        );
        drop(held);
        // Then the old server ends the agent's link and exits; the agent
        // links to the new one at its next sync.
        assert!(
            server.proc.wait_exit(WAIT).is_some(),
            "round {round}: the old server still runs:\n{}",
            logs(&server, &agent)
        );
        next.wait_metric("edgetunnel_agents_connected", 1.0);
        server = next;
    }
    thread::sleep(Duration::from_millis(1500));
    let (ok, failures) = load.finish();
    let (held_ok, held_failures) = overlapping.finish();
    assert_none_failed("overlapping tunnels", held_ok, &held_failures, || {
        logs(&server, &agent)
    });
    grpc_stop.store(true, Ordering::SeqCst);
    let (grpc_ok, grpc_failures) = grpc_load.join().unwrap();
    assert_none_failed("konnectivity-client dials", grpc_ok, &grpc_failures, || {
        logs(&server, &agent)
    });
    assert!(grpc_ok >= 10, "only {grpc_ok} konnectivity-client dials");
    stop_watch.store(true, Ordering::SeqCst);
    let missing = watcher.join().unwrap();
    assert_none_failed(
        "dials through three handovers with the Go agent",
        ok,
        &failures,
        || logs(&server, &agent),
    );
    assert_eq!(missing, 0, "a socket path was missing");
    assert!(
        dials_at(&agent, &target) >= ok,
        "the Go agent carried every dial"
    );
    server.wait_metric("edgetunnel_open_connections", 0.0);
}
