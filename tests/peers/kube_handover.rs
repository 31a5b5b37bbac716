//! Upgrades without a failed dial with the real kube-apiserver (v1.36,
//! `--egress-selector-config-file`, HTTPConnect over the unix socket, the
//! mode kube-apiserver's docs show): our server in the cloud namespace
//! with `--handover-socket`, our agent and a fake kubelet in the node
//! namespace. Under a steady load (`kubectl logs` in a loop, a held
//! `kubectl logs -f`, and CONNECT dials on the same unix socket beside
//! kube-apiserver's), the server is replaced three times by a new process
//! through the handover: no `kubectl logs` fails, no dial fails, the held
//! `logs -f` keeps streaming in order across all three, and each old
//! server exits by the end of its drain (kube-apiserver's idle pooled
//! connections to the kubelet keep it until then; see [`GRACE_SECS`]).

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{peers, serial, tail, Logged, Peers};
use crate::go_agent::{agent_mtls, go_agent_args};
use crate::kube_cluster::{
    in_netns, start_etcd, Egress, KubeApiserver, KubeCerts, Net, CLOUD_IP, KUBELET_IP, KUBELET_PORT,
};
use crate::kubelet::{small_log, FakeKubelet};
use crate::support::dial_load::{assert_none_failed, Load, Via};
use crate::support::{echo_server, Agent, Binds, Env, Proc, Server, WAIT};

/// The old servers' drain: kube-apiserver keeps idle connections to the
/// kubelet in its pool, through the server that dialled them (Go's
/// transport keeps an idle connection 90 s), so an old server exits when
/// this passes, not when the held stream ends; what the pool still holds
/// through it is cut then, and kube-apiserver must dial again without a
/// failed request.
const GRACE_SECS: &str = "12";

fn kube_peers() -> Option<&'static Peers> {
    let p = peers()?;
    if !p.has("kube-apiserver") {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: kube-apiserver not in EDGETUNNEL_PEERS"
        );
        return None;
    }
    Some(p)
}

/// Our server in the cloud namespace, started with `flags` on `binds`; its
/// certificate names the cloud address too (ANP's Go agent verifies the
/// address it dials).
fn server(net: &Net, env: &Env, binds: &Binds, flags: &[&str]) -> Server {
    let (cert, key) = env.issue(
        "server-cloud",
        "edgetunnel-server",
        &["localhost", "127.0.0.1", CLOUD_IP],
        &[rcgen::ExtendedKeyUsagePurpose::ServerAuth],
    );
    let ca = env.certs().join("ca.crt").display().to_string();
    let tls = [
        "--cert",
        cert.as_str(),
        "--key",
        key.as_str(),
        "--ca",
        ca.as_str(),
    ];
    let (cmd, n, connect_uds, grpc_uds) = Server::command(env, &tls, binds, flags);
    Server::spawn(env, net.cloud.exec(&cmd), n, connect_uds, grpc_uds)
}

#[test]
fn kube_apiserver_dials_survive_three_handovers() {
    three_handovers(false);
}

/// The same with ANP's Go agent on the edge, at its default sync
/// interval: the old servers keep its link while it carries the held
/// stream, and the new ones send it their dials through them.
#[test]
fn kube_apiserver_dials_survive_three_handovers_with_the_go_agent() {
    three_handovers(true);
}

fn three_handovers(go_agent: bool) {
    let Some(p) = kube_peers() else { return };
    let _g = serial();
    let net = Net::new();
    let env = Env::new();
    let certs = KubeCerts::new(&env);
    let _etcd = start_etcd(&net, &env);
    let handover = env.path("handover.sock").display().to_string();
    let flags = [
        "--handover-socket",
        handover.as_str(),
        "--graceful-shutdown-timeout-secs",
        GRACE_SECS,
    ];
    let first = server(
        &net,
        &env,
        &Binds {
            agent: format!("{CLOUD_IP}:0"),
            ..Binds::default()
        },
        &flags,
    );
    let binds = Binds::of(&first);
    let identifiers = format!("host=node-1&ipv4={KUBELET_IP}");
    let _agent: Box<dyn std::any::Any> = if go_agent {
        let mut args = go_agent_args(
            first.agent.port(),
            "node-1",
            &identifiers,
            &agent_mtls(&env),
        );
        for a in args.iter_mut() {
            if a.starts_with("--proxy-server-host=") {
                *a = format!("--proxy-server-host={CLOUD_IP}");
            }
        }
        args.retain(|a| !a.starts_with("--sync-interval"));
        args.extend([
            "--sync-interval=1s".into(),
            "--sync-interval-cap=10s".into(),
        ]);
        let mut cmd = std::process::Command::new(p.bin("anp-agent"));
        cmd.args(&args).env_remove("PROXY_AGENT_ID");
        let a = Logged::spawn(net.node.exec(&cmd), env.path("go-agent.log"));
        a.wait_for("\"Start serving\"", WAIT);
        Box::new(a)
    } else {
        let cmd = Agent::command(&env, first.agent, "node-1", &identifiers, &[]);
        let a = Proc::spawn(net.node.exec(&cmd), env.path("agent-node-1.log"));
        a.wait_line("CONNECTED");
        Box::new(a)
    };
    let _kubelet = FakeKubelet::start(
        &net.node.0,
        &format!("{KUBELET_IP}:{KUBELET_PORT}"),
        &certs.kubelet.0,
        &certs.kubelet.1,
        &certs.ca,
    );
    // An echo target in the node namespace, for the CONNECT dials.
    let echo = in_netns(&net.node.0, || echo_server(KUBELET_IP));
    let kas = KubeApiserver::start(
        &p.bin("kube-apiserver"),
        &net,
        &env,
        &certs,
        &Egress::ConnectUds(first.connect_uds.clone()),
        0,
    );
    crate::kube_apiserver::create_objects(&kas, &env);
    let logs = |s: &Server| format!("--- server:\n{}", tail(&s.proc.log_text(), 30));

    // The held `kubectl logs -f`: each line in order, counted.
    let mut follow = kas
        .kubectl_cmd(&["logs", "-f", "p1", "-c", "c"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let followed = Arc::new(AtomicUsize::new(0));
    let out_of_order = Arc::new(Mutex::new(None::<String>));
    let reader = {
        let (followed, bad) = (followed.clone(), out_of_order.clone());
        let out = follow.stdout.take().unwrap();
        thread::spawn(move || {
            for (i, l) in BufReader::new(out).lines().enumerate() {
                let Ok(l) = l else { break };
                if l != format!("follow default/p1/c {i}") {
                    *bad.lock().unwrap() = Some(format!("line {i}: {l:?}"));
                    break;
                }
                followed.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // `kubectl logs` in a loop (two at a time), and CONNECT dials on the
    // same unix socket kube-apiserver dials.
    let stop = AtomicBool::new(false);
    let (logs_ok, logs_failed) = (AtomicUsize::new(0), Mutex::new(Vec::<String>::new()));
    let load = Load::start(
        vec![
            Via::Unix(first.connect_uds.clone()),
            Via::Unix(first.connect_uds.clone()),
        ],
        echo.addr.to_string(),
    );
    let mut current = first;
    let mut old_servers = Vec::new();
    /// Stops the `kubectl logs` loops when the scope ends, a failed
    /// assertion included (the scope waits for them).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    let out = kas.kubectl(&["logs", "p1", "-c", "c", "--tail=3"]);
                    let text = String::from_utf8_lossy(&out.stdout).to_string();
                    if out.status.success() && text == small_log("default", "p1", "c", Some(3)) {
                        logs_ok.fetch_add(1, Ordering::SeqCst);
                    } else {
                        logs_failed.lock().unwrap().push(format!(
                            "{:?}: {}",
                            out.status,
                            String::from_utf8_lossy(&out.stderr)
                        ));
                    }
                }
            });
        }
        let wait_for = |what: &str, f: &dyn Fn() -> bool, s: &Server| {
            let deadline = Instant::now() + WAIT;
            while !f() {
                assert!(Instant::now() < deadline, "{what}\n{}", logs(s));
                thread::sleep(Duration::from_millis(50));
            }
        };
        wait_for(
            "kubectl logs never succeeded",
            &|| logs_ok.load(Ordering::SeqCst) >= 3,
            &current,
        );
        for round in 1..=3 {
            let next = server(&net, &env, &binds, &flags);
            next.proc.wait_log("handover: the predecessor drains");
            let (l0, d0, f0) = (
                logs_ok.load(Ordering::SeqCst),
                load.ok.load(Ordering::SeqCst),
                followed.load(Ordering::SeqCst),
            );
            wait_for(
                &format!("round {round}: no progress after the handover"),
                &|| {
                    logs_ok.load(Ordering::SeqCst) >= l0 + 5
                        && load.ok.load(Ordering::SeqCst) >= d0 + 20
                        && followed.load(Ordering::SeqCst) >= f0 + 3
                },
                &next,
            );
            old_servers.push(std::mem::replace(&mut current, next));
        }
        // The held stream went on through the three handovers (within the
        // first old server's drain), on the server that took it.
        assert_eq!(*out_of_order.lock().unwrap(), None, "logs -f out of order");
        assert!(follow.try_wait().unwrap().is_none(), "logs -f ended");
        assert!(
            old_servers[0].proc.wait_exit(Duration::ZERO).is_none(),
            "the first server left with logs -f open\n{}",
            logs(&old_servers[0])
        );
        follow.kill().unwrap();
        follow.wait().unwrap();
        // Every old server exits by the end of its drain, the load still
        // running: what kube-apiserver's pool held through them is cut.
        for (i, old) in old_servers.iter_mut().enumerate() {
            let grace: u64 = GRACE_SECS.parse().unwrap();
            assert!(
                old.proc
                    .wait_exit(Duration::from_secs(grace) + WAIT)
                    .is_some(),
                "old server {i} still runs\n{}",
                logs(old)
            );
        }
        let l0 = logs_ok.load(Ordering::SeqCst);
        wait_for(
            "kubectl logs after the old servers left",
            &|| logs_ok.load(Ordering::SeqCst) >= l0 + 5,
            &current,
        );
        stop.store(true, Ordering::SeqCst);
    });
    reader.join().unwrap();
    let (dials_ok, dial_failures) = load.finish();
    let failed = logs_failed.into_inner().unwrap();
    let logs_ok = logs_ok.load(Ordering::SeqCst);
    eprintln!(
        "three handovers under kube-apiserver: {logs_ok} kubectl logs ({} failed), {dials_ok} dials ({} failed), logs -f {} lines",
        failed.len(),
        dial_failures.len(),
        followed.load(Ordering::SeqCst)
    );
    assert_none_failed("kubectl logs", logs_ok, &failed, || logs(&current));
    assert_none_failed("dials", dials_ok, &dial_failures, String::new);
    kas.stop();
}
