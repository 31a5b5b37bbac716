//! Tunnels over an emulated WAN (issue 41): the agent link alone crosses
//! the link (`wanlink` between two network namespaces,
//! tests/support/wan.rs), our server on the cloud side, the agent and the
//! target on the edge. Checked from the server's metrics, not timed:
//!
//! - our agent, 100 ms: a fixed 2 MiB window moves 2 MiB a round trip;
//!   with `window-growth` the server, the receiver of a download, grows
//!   the window it grants while the sender is held by it. The window grew
//!   past 8 MiB, gave its growth back when the tunnel ended, and every
//!   byte arrived in order;
//! - ANP's Go agent (no tunnel windows), 300 ms: the link's own HTTP/2
//!   windows, 16 MiB at first, grow while the agent is held by them
//!   (`engine::link_window`), and give the growth back when the link ends;
//!   every byte arrived in order. Skipped without the real peers.
//!
//! Needs root, iproute2 and /dev/net/tun; otherwise it says `skipped: ...`.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use support::netns::Netns;
use support::peer_bins::peer_dir;
use support::wan::{anp_server_command, Wan, WanConfig, CLOUD_IP};
use support::*;

const MIB: u64 = 1024 * 1024;
/// Bytes the target sends: a few seconds at the link's rate.
const SIZE: u64 = 48 * MIB;
const GROWTH: &str = "edgetunnel_tunnel_window_growth_bytes";
const LINK_GROWTH: &str = "edgetunnel_agent_link_window_growth_bytes";

/// Byte `i` of the target's stream (not periodic in any window size).
fn byte_at(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

/// The target, on the edge's loopback: `size` bytes to whoever connects.
fn start_target(wan: &Wan, size: u64) -> u16 {
    let target = wan
        .edge
        .run(|| TcpListener::bind(("127.0.0.1", 0)))
        .expect("bind the target");
    let port = target.local_addr().unwrap().port();
    thread::spawn(move || {
        for s in target.incoming() {
            let Ok(mut s) = s else { continue };
            thread::spawn(move || {
                let mut buf = vec![0u8; 256 * 1024];
                let mut at = 0u64;
                while at < size {
                    let k = (size - at).min(buf.len() as u64) as usize;
                    for (j, b) in buf[..k].iter_mut().enumerate() {
                        *b = byte_at(at + j as u64);
                    }
                    if s.write_all(&buf[..k]).is_err() {
                        return;
                    }
                    at += k as u64;
                }
                let _ = s.shutdown(Shutdown::Write);
                let _ = s.read(&mut [0u8; 1]);
            });
        }
    });
    port
}

/// A metric of the server (its admin address in the cloud namespace).
fn scrape(wan: &Wan, admin: SocketAddr, what: &str) -> f64 {
    let text = wan.cloud.run(move || http_get(admin, "/metrics").1);
    metric_in(&text, what).unwrap_or_else(|| panic!("no {what} in:\n{text}"))
}

fn metric_in(text: &str, what: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(what)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A CONNECT tunnel to the target's `port` through the server's socket.
fn connect(uds: &Path, port: u16) -> UnixStream {
    // Generous: a transfer takes seconds; a stalled one fails here.
    support::hol::connect_tunnel(uds, port, Duration::from_secs(60))
}

/// Runs `work` while the `metric` of the process whose admin address is
/// `admin` (in `ns`) is scraped every 100 ms: what `work` gave and the
/// metric's highest value seen.
fn watching<T: Send>(
    ns: &Netns,
    admin: SocketAddr,
    metric: &str,
    work: impl FnOnce() -> T,
) -> (T, u64) {
    let most = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let out = thread::scope(|scope| {
        let (most, done) = (&most, &done);
        scope.spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let text = ns.run(move || http_get(admin, "/metrics").1);
                if let Some(v) = metric_in(&text, metric) {
                    most.fetch_max(v as u64, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(100));
            }
        });
        let out = work();
        done.store(true, Ordering::Relaxed);
        out
    });
    (out, most.load(Ordering::Relaxed))
}

/// Reads `size` bytes from `s`, each checked, while the server's `metric`
/// is scraped: the seconds taken and the metric's highest value seen.
fn download_watching(
    wan: &Wan,
    admin: SocketAddr,
    s: &mut UnixStream,
    size: u64,
    metric: &str,
) -> (f64, u64) {
    watching(&wan.cloud, admin, metric, || {
        let started = Instant::now();
        let mut buf = vec![0u8; 256 * 1024];
        let mut at = 0u64;
        while at < size {
            let k = s.read(&mut buf).expect("read the download");
            assert!(k > 0, "closed after {at} of {size} bytes");
            for (j, &b) in buf[..k].iter().enumerate() {
                assert_eq!(b, byte_at(at + j as u64), "byte {}", at + j as u64);
            }
            at += k as u64;
        }
        started.elapsed().as_secs_f64()
    })
}

/// Waits until the server's `metric` reads 0.
fn wait_zero(wan: &Wan, admin: SocketAddr, metric: &str, log: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    while scrape(wan, admin, metric) != 0.0 {
        assert!(Instant::now() < deadline, "{metric} held:\n{}", log());
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_tunnels_window_grows_on_a_long_path_and_its_bytes_arrive_whole() {
    let Some(wan) = Wan::start_or_skip(&WanConfig::rtt_ms(100.0).rate_mbit(200.0)) else {
        return;
    };
    let env = Env::new();
    let uds = env.path("wan-connect.sock");
    let binds = Binds {
        agent: format!("{CLOUD_IP}:0"),
        connect_uds: Some(uds.clone()),
        grpc_uds: Some(env.path("wan-grpc.sock")),
        ..Binds::default()
    };
    let certs = env.certs().display().to_string();
    let (cmd, n, cu, gu) = Server::command(&env, &["--certs-dir", &certs], &binds, &[]);
    let server = Server::spawn(&env, wan.cloud.exec(&cmd), n, cu, gu);
    let agent_cmd = Agent::command(&env, server.agent, "node-1", "host=node-1", &[]);
    let agent = Proc::spawn(wan.edge.exec(&agent_cmd), env.path("wan-agent.log"));
    agent.wait_line("CONNECTED");
    let port = start_target(&wan, SIZE);
    let admin = server.admin;
    assert_eq!(scrape(&wan, admin, GROWTH), 0.0);

    let mut s = connect(&uds, port);
    let (secs, grown) = download_watching(&wan, admin, &mut s, SIZE, GROWTH);
    drop(s);
    println!(
        "{SIZE} bytes in {secs:.1} s ({:.1} MB/s) over a 100 ms round trip at 200 Mbit/s; the window grew by up to {:.1} MiB",
        SIZE as f64 / secs / 1e6,
        grown as f64 / MIB as f64
    );
    assert!(
        grown > 6 * MIB,
        "the tunnel's window grew by at most {grown} bytes (not past 8 MiB):\n{}",
        server.proc.log_text()
    );
    // The growth is given back with the tunnel.
    wait_zero(&wan, admin, GROWTH, || server.proc.log_text());
    let rtt = scrape(&wan, admin, "edgetunnel_agent_link_rtt_seconds_count");
    assert!(rtt > 0.0, "no round trip sampled");
    // Our agent's link grows its tunnels' windows, not its own.
    assert_eq!(scrape(&wan, admin, LINK_GROWTH), 0.0);
}

/// ANP's Go agent has no tunnel windows: only the link's HTTP/2 windows
/// pace it. At 300 ms and 200 Mbit/s (25 MB/s) a fixed 16 MiB stream
/// window allows 56 MB/s, and the rule grows a window that a window's
/// worth of payload fills within 2 round trips at half (14 MB/s here): the
/// link's window must grow once at least, and give the growth back when
/// the link ends.
#[test]
fn a_go_agents_link_window_grows_on_a_long_path_and_its_bytes_arrive_whole() {
    let Some(peers) = peer_dir(&repo()) else {
        println!("skipped: no real peers (set EDGETUNNEL_PEERS)");
        return;
    };
    let Some(wan) = Wan::start_or_skip(&WanConfig::rtt_ms(300.0).rate_mbit(200.0)) else {
        return;
    };
    let env = Env::new();
    let uds = env.path("wan-go-connect.sock");
    let binds = Binds {
        agent: format!("{CLOUD_IP}:0"),
        connect_uds: Some(uds.clone()),
        grpc_uds: Some(env.path("wan-go-grpc.sock")),
        ..Binds::default()
    };
    // The Go agent checks the server's address against its certificate.
    let (cert, key) = env.issue(
        "wan-go-server",
        "edgetunnel-server",
        &[&CLOUD_IP.to_string(), "localhost"],
        &[rcgen::ExtendedKeyUsagePurpose::ServerAuth],
    );
    let certs = env.certs().display().to_string();
    let flags = ["--certs-dir", &certs, "--cert", &cert, "--key", &key];
    let (cmd, n, cu, gu) = Server::command(&env, &flags, &binds, &[]);
    let server = Server::spawn(&env, wan.cloud.exec(&cmd), n, cu, gu);
    let mut cmd = Command::new(peers.join("anp-agent"));
    cmd.arg(format!("--proxy-server-host={CLOUD_IP}"))
        .arg(format!("--proxy-server-port={}", server.agent.port()))
        .arg("--agent-id=go-1")
        .arg("--agent-identifiers=host=go-1")
        .arg(format!("--admin-server-port={}", free_port()))
        .arg(format!("--health-server-port={}", free_port()))
        .args(agent_mtls(&env))
        .arg("-v=1")
        .env_remove("PROXY_AGENT_ID");
    let agent = Proc::spawn(wan.edge.exec(&cmd), env.path("wan-go-agent.log"));
    let admin = server.admin;
    let deadline = Instant::now() + WAIT;
    while scrape(&wan, admin, "edgetunnel_agents_connected") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the Go agent did not link:\n{}",
            agent.log_text()
        );
        thread::sleep(Duration::from_millis(50));
    }
    let size = 64 * MIB;
    let port = start_target(&wan, size);
    assert_eq!(scrape(&wan, admin, LINK_GROWTH), 0.0);

    let mut s = connect(&uds, port);
    let (secs, grown) = download_watching(&wan, admin, &mut s, size, LINK_GROWTH);
    drop(s);
    println!(
        "{size} bytes in {secs:.1} s ({:.1} MB/s) from the Go agent over a 300 ms round trip at 200 Mbit/s; the link's windows grew by up to {:.1} MiB",
        size as f64 / secs / 1e6,
        grown as f64 / MIB as f64
    );
    assert!(
        grown >= 16 * MIB,
        "the link's windows grew by {grown} bytes (not once):\n{}",
        server.proc.log_text()
    );
    assert_eq!(scrape(&wan, admin, GROWTH), 0.0, "no tunnel window grew");
    // The link's growth is given back when the link ends.
    drop(agent);
    wait_zero(&wan, admin, LINK_GROWTH, || server.proc.log_text());
}

/// Our agent behind ANP's Go server (no tunnel windows): the agent's
/// HTTP/2 windows alone pace what the server sends it, so an upload grows
/// them as the server grows its own for the Go agent (`link_window`), and
/// every byte arrives in order. 300 ms, 200 Mbit/s, as above.
#[test]
fn our_agents_link_window_grows_behind_a_go_server_and_an_upload_arrives_whole() {
    let Some(peers) = peer_dir(&repo()) else {
        println!("skipped: no real peers (set EDGETUNNEL_PEERS)");
        return;
    };
    let Some(wan) = Wan::start_or_skip(&WanConfig::rtt_ms(300.0).rate_mbit(200.0)) else {
        return;
    };
    let env = Env::new();
    let uds = env.path("wan-anp.sock");
    let cmd = anp_server_command(&env, &peers, "http-connect", &uds, 8091, "wan", 1);
    let server = Proc::spawn(wan.cloud.exec(&cmd), env.path("wan-anp-server.log"));
    server.wait_log("Starting health server");
    let agent_cmd = Agent::command(
        &env,
        SocketAddr::from((CLOUD_IP, 8091)),
        "node-1",
        "host=node-1",
        &["--admin-bind", "127.0.0.1:0"],
    );
    let agent = Proc::spawn(
        wan.edge.exec(&agent_cmd),
        env.path("wan-agent-go-server.log"),
    );
    let admin = listen_addr(&agent, "admin");
    agent.wait_line("CONNECTED");
    let agent_metric = |what: &str| -> f64 {
        let text = wan.edge.run(move || http_get(admin, "/metrics").1);
        metric_in(&text, what).unwrap_or_else(|| panic!("no {what} in:\n{text}"))
    };
    assert_eq!(agent_metric(LINK_GROWTH), 0.0);

    // The target, on the edge: checks every byte of `size`, then says ok.
    let size = 64 * MIB;
    let target = wan
        .edge
        .run(|| TcpListener::bind(("127.0.0.1", 0)))
        .expect("bind the target");
    let port = target.local_addr().unwrap().port();
    thread::spawn(move || {
        let Ok((mut s, _)) = target.accept() else {
            return;
        };
        let mut buf = vec![0u8; 256 * 1024];
        let mut at = 0u64;
        while at < size {
            let k = s.read(&mut buf).expect("read the upload");
            assert!(k > 0, "the upload ended at {at} of {size} bytes");
            for (j, &b) in buf[..k].iter().enumerate() {
                assert_eq!(b, byte_at(at + j as u64), "byte {}", at + j as u64);
            }
            at += k as u64;
        }
        let _ = s.write_all(b"ok");
    });

    let mut s = connect(&uds, port);
    let (secs, grown) = watching(&wan.edge, admin, LINK_GROWTH, || {
        let started = Instant::now();
        let mut buf = vec![0u8; 256 * 1024];
        let mut at = 0u64;
        while at < size {
            let k = (size - at).min(buf.len() as u64) as usize;
            for (j, b) in buf[..k].iter_mut().enumerate() {
                *b = byte_at(at + j as u64);
            }
            s.write_all(&buf[..k]).expect("write the upload");
            at += k as u64;
        }
        let mut ok = [0u8; 2];
        s.read_exact(&mut ok).expect("the target's answer");
        assert_eq!(&ok, b"ok");
        started.elapsed().as_secs_f64()
    });
    println!(
        "{size} bytes in {secs:.1} s ({:.1} MB/s) to our agent behind the Go server over a 300 ms round trip at 200 Mbit/s; the link's windows grew by up to {:.1} MiB",
        size as f64 / secs / 1e6,
        grown as f64 / MIB as f64
    );
    assert!(
        grown >= 16 * MIB,
        "the link's windows grew by {grown} bytes (not once):\n{}",
        agent.log_text()
    );
}
