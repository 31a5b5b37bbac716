//! One tunnel over an emulated WAN of 100 ms round trip (issue 41): the
//! agent link alone crosses the link (`wanlink` between two network
//! namespaces, tests/support/wan.rs), our server on the cloud side, our
//! agent and the target on the edge. A fixed 2 MiB window moves 2 MiB a
//! round trip; with `window-growth` the server, the receiver of a
//! download, grows the window it grants while the sender is held by it.
//! Checked from the server's metrics, not timed: the window grew past
//! 8 MiB, gave its growth back when the tunnel ended, and every byte
//! arrived in order. Needs root, iproute2 and /dev/net/tun; otherwise it
//! says `skipped: ...`.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use support::wan::{Wan, WanConfig, CLOUD_IP};
use support::*;

const MIB: u64 = 1024 * 1024;
/// Bytes the target sends: a few seconds at the link's rate.
const SIZE: u64 = 48 * MIB;
const GROWTH: &str = "edgetunnel_tunnel_window_growth_bytes";

/// Byte `i` of the target's stream (not periodic in any window size).
fn byte_at(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
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

    // The target, on the edge: SIZE bytes to whoever connects.
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
                while at < SIZE {
                    let k = (SIZE - at).min(buf.len() as u64) as usize;
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

    // The server's metrics, scraped in its namespace while bytes flow.
    let scrape = |what: &str| -> f64 {
        let admin = server.admin;
        let text = wan.cloud.run(move || http_get(admin, "/metrics").1);
        text.lines()
            .find_map(|l| l.strip_prefix(what)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {what} in:\n{text}"))
    };
    assert_eq!(scrape(GROWTH), 0.0);

    let mut s = UnixStream::connect(&uds).expect("the CONNECT socket");
    // Generous: the download takes seconds; a stalled one fails here.
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let t = format!("127.0.0.1:{port}");
    write!(s, "CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "closed in the answer");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let most = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let (secs, ()) = thread::scope(|scope| {
        let admin = server.admin;
        let cloud = &wan.cloud;
        let (most, done) = (&most, &done);
        scope.spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let text = cloud.run(move || http_get(admin, "/metrics").1);
                if let Some(v) = text
                    .lines()
                    .find_map(|l| l.strip_prefix(GROWTH)?.trim().parse::<f64>().ok())
                {
                    most.fetch_max(v as u64, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(100));
            }
        });
        let started = Instant::now();
        let mut buf = vec![0u8; 256 * 1024];
        let mut at = 0u64;
        while at < SIZE {
            let k = s.read(&mut buf).expect("read the download");
            assert!(k > 0, "closed after {at} of {SIZE} bytes");
            for (j, &b) in buf[..k].iter().enumerate() {
                assert_eq!(b, byte_at(at + j as u64), "byte {}", at + j as u64);
            }
            at += k as u64;
        }
        let secs = started.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        (secs, ())
    });
    drop(s);
    let grown = most.load(Ordering::Relaxed);
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
    let deadline = Instant::now() + WAIT;
    while scrape(GROWTH) != 0.0 {
        assert!(
            Instant::now() < deadline,
            "growth held after the tunnel ended"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let rtt = scrape("edgetunnel_agent_link_rtt_seconds_count");
    assert!(rtt > 0.0, "no round trip sampled");
}
