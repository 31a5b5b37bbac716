//! A handshake on a worker under attack (issue 39's goal): how long a
//! mutual-TLS handshake to the agent listener takes while other clients
//! flood the same worker, against its quiet median, in one run.
//!
//! The server runs with `--workers 1`, so every connection (the probes and
//! the floods) is served by one core. Each case starts two flood threads,
//! then probes: a TCP connect and a full TLS 1.3 handshake with an agent's
//! certificate, one after another, a few milliseconds apart. The floods
//! stay within what the server accepts until it ends them at a bound, and
//! start again at once:
//!
//! - `cpu-hog`: two threads that only spin (the control: what two busy
//!   client threads cost the probes on this machine without touching the
//!   server);
//! - `handshakes`: TLS handshakes, each connection closed once done (the
//!   control for the record floods, which are a handshake each and then
//!   up to 32 records: no record bound makes a handshake cheaper);
//! - `empty-records`: TLS connections sending empty application_data
//!   records (ended after 32 in a row);
//! - `key-updates`: KeyUpdates asking for ours (ended after 32);
//! - `h2-connections`: plaintext HTTP/2 connections to the gRPC frontend,
//!   each closed after its preface and SETTINGS (the control for the
//!   floods that the server ends at a bound and that start again);
//! - `ping-flood`: HTTP/2 PINGs to the gRPC frontend without reading the
//!   answers (the server ends the connection once 1,024 answers wait);
//! - `settings-flood`: SETTINGS frames of 100 entries (the most allowed),
//!   the ACKs read;
//! - `rapid-reset`: HEADERS and RST_STREAM pairs (ended after 20);
//! - `error-resets`: streams made to be reset with a WINDOW_UPDATE of 0
//!   (ended after 1,024);
//! - `many-streams`: 1,000 open streams, small DATA frames across them.
//!
//! Run: `cargo bench --bench flood_latency [-- --probes N --cases a,b]`
//! (under `cargo test` a smoke pass of 10 probes a case). The ratio to
//! `quiet` is the goal (within 2x); the ratio to `cpu-hog` takes out
//! what the machine's two cores cost any busy neighbour.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports, clippy::all)]
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use protocol::tls_record::APPLICATION_DATA;
use support::raw_h2::*;
use support::tls_client::{client_tls, tls_connect};
use support::*;

/// What every flood thread is given.
#[derive(Clone)]
struct Target {
    agent: SocketAddr,
    grpc: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    stop: Arc<AtomicBool>,
    /// Connections the flood opened (to show it ran).
    conns: Arc<AtomicU64>,
}

type Flood = fn(&Target);

fn main() {
    // Under `cargo test` (no `--bench`): a smoke pass that shows every
    // case runs, 10 probes each.
    let full = std::env::args().any(|a| a == "--bench");
    let mut probes = if full { 200 } else { 10 };
    let mut only: Option<Vec<String>> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--probes" => {
                probes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--probes N");
            }
            "--cases" => {
                let v = args.next().expect("--cases a,b");
                only = Some(v.split(',').map(String::from).collect());
            }
            _ => {}
        }
    }
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "1"]);
    let certs = env.certs();
    let tls = client_tls(
        &certs.join("ca.crt"),
        Some((&certs.join("agent.crt"), &certs.join("agent.key"))),
        b"h2",
        &[&rustls::version::TLS13],
        &[],
    );
    let cases: [(&str, Option<Flood>); 11] = [
        ("quiet", None),
        ("cpu-hog", Some(cpu_hog)),
        ("handshakes", Some(handshakes)),
        ("empty-records", Some(empty_records)),
        ("key-updates", Some(key_updates)),
        ("h2-connections", Some(h2_connections)),
        ("ping-flood", Some(ping_flood)),
        ("settings-flood", Some(settings_flood)),
        ("rapid-reset", Some(rapid_reset)),
        ("error-resets", Some(error_resets)),
        ("many-streams", Some(many_streams)),
    ];
    println!(
        "handshake latency on a 1-worker server, {probes} probes a case; load {}",
        load_average()
    );
    println!(
        "| case | median ms | p90 ms | vs quiet | vs cpu-hog | flood connections | server CPU s |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut quiet = f64::NAN;
    let mut hog = f64::NAN;
    for (name, flood) in cases {
        if only.as_ref().is_some_and(|o| !o.iter().any(|c| c == name)) {
            continue;
        }
        let cpu0 = cpu_secs(server.proc.child.id());
        let target = Target {
            agent: server.agent,
            grpc: server.grpc,
            tls: tls.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(AtomicU64::new(0)),
        };
        let threads: Vec<_> = flood
            .map(|f| {
                (0..2)
                    .map(|_| {
                        let t = target.clone();
                        thread::spawn(move || f(&t))
                    })
                    .collect()
            })
            .unwrap_or_default();
        thread::sleep(Duration::from_millis(300));
        // Each probe's time to its first byte from the server (the
        // ServerHello: accepted and read) and to the end of its handshake.
        let mut first = Vec::with_capacity(probes);
        let mut took: Vec<f64> = (0..probes)
            .map(|_| {
                thread::sleep(Duration::from_millis(3));
                let t0 = Instant::now();
                // A probe that times out (10 s) counts as 10 s.
                let (ms_first, _) = probe(server.agent, &tls);
                first.push(ms_first);
                t0.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        first.sort_by(f64::total_cmp);
        if std::env::var_os("FLOOD_PHASES").is_some() {
            println!(
                "  {name}: first server byte median {:.2} ms, p90 {:.2} ms",
                first[first.len() / 2],
                first[first.len() * 9 / 10]
            );
        }
        target.stop.store(true, Ordering::Relaxed);
        for t in threads {
            let _ = t.join();
        }
        took.sort_by(f64::total_cmp);
        let median = took[took.len() / 2];
        let p90 = took[took.len() * 9 / 10];
        if name == "quiet" {
            quiet = median;
        }
        if name == "cpu-hog" {
            hog = median;
        }
        let cpu = cpu_secs(server.proc.child.id()) - cpu0;
        println!(
            "| {name} | {median:.2} | {p90:.2} | {:.2} | {:.2} | {} | {cpu:.1} |",
            median / quiet,
            median / hog,
            target.conns.load(Ordering::Relaxed)
        );
        assert!(
            server.proc.log_text().lines().count() < 100_000,
            "the server is logging the flood line by line"
        );
    }
    println!("load {}", load_average());
}

/// User and system CPU seconds of process `pid`.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after ')'.
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
}

/// One probe: TCP connect and a TLS handshake; the milliseconds to the
/// server's first byte, and whether the handshake completed.
fn probe(addr: SocketAddr, tls: &Arc<rustls::ClientConfig>) -> (f64, bool) {
    let t0 = Instant::now();
    let Ok(tcp) = TcpStream::connect(addr) else {
        return (f64::NAN, false);
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let Ok(conn) = rustls::ClientConnection::new(tls.clone(), name) else {
        return (f64::NAN, false);
    };
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let mut first = f64::NAN;
    while s.conn.is_handshaking() {
        match s.conn.complete_io(&mut s.sock) {
            Ok((rd, _)) if rd > 0 && first.is_nan() => {
                first = t0.elapsed().as_secs_f64() * 1e3;
            }
            Ok(_) => {}
            Err(_) => return (first, false),
        }
    }
    (first, true)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn cpu_hog(t: &Target) {
    let mut x = 0u64;
    while !t.stop.load(Ordering::Relaxed) {
        for i in 0..100_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
    }
}

fn handshakes(t: &Target) {
    while !t.stop.load(Ordering::Relaxed) {
        if tls_connect(t.agent, t.tls.clone()).is_ok() {
            t.conns.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// TLS connections from our own record layer (which can seal any record),
/// each sent `send` until the server ends it, again and again.
fn record_flood(t: &Target, send: fn(&mut Records) -> std::io::Result<()>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        while !t.stop.load(Ordering::Relaxed) {
            let Ok(tcp) = tokio::net::TcpStream::connect(t.agent).await else {
                continue;
            };
            t.conns.fetch_add(1, Ordering::Relaxed);
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let cfg = engine::tls_records::client_config(&t.tls);
            let Ok(done) = engine::tls_records::connect(tcp, name, cfg).await else {
                continue;
            };
            let mut s = done.stream;
            while !t.stop.load(Ordering::Relaxed) {
                if send(&mut s).is_err() || s.flush().await.is_err() {
                    break;
                }
            }
        }
    });
}

type Records = engine::tls_records::RecordStream<tokio::net::TcpStream>;

fn empty_records(t: &Target) {
    record_flood(t, |s| {
        (0..64).try_for_each(|_| s.seal_record(APPLICATION_DATA, &[]))
    });
}

fn key_updates(t: &Target) {
    record_flood(t, |s| (0..64).try_for_each(|_| s.seal_key_update(true)));
}

/// A plaintext HTTP/2 connection to the gRPC frontend, past the preface;
/// what the server sends is read and dropped by a thread of its own.
fn h2_conn(t: &Target) -> Option<TcpStream> {
    let mut s = TcpStream::connect(t.grpc).ok()?;
    t.conns.fetch_add(1, Ordering::Relaxed);
    s.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut start = PREFACE.to_vec();
    start.extend(frame(SETTINGS, 0, 0, &[]));
    s.write_all(&start).ok()?;
    let mut r = s.try_clone().ok()?;
    thread::spawn(move || {
        let mut sink = [0u8; 16 * 1024];
        while matches!(r.read(&mut sink), Ok(n) if n > 0) {}
    });
    Some(s)
}

/// Sends `chunk` on fresh connections to the gRPC frontend until `stop`
/// (a new connection whenever the server ends one).
fn h2_flood(t: &Target, chunk: &[u8]) {
    while !t.stop.load(Ordering::Relaxed) {
        let Some(mut s) = h2_conn(t) else { continue };
        while !t.stop.load(Ordering::Relaxed) {
            if s.write_all(chunk).is_err() {
                break;
            }
        }
    }
}

fn h2_connections(t: &Target) {
    while !t.stop.load(Ordering::Relaxed) {
        if let Ok(mut s) = TcpStream::connect(t.grpc) {
            t.conns.fetch_add(1, Ordering::Relaxed);
            let mut start = PREFACE.to_vec();
            start.extend(frame(SETTINGS, 0, 0, &[]));
            let _ = s.write_all(&start);
            // The server's SETTINGS, then close.
            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
            let mut b = [0u8; 64];
            let _ = s.read(&mut b);
        }
    }
}

fn ping_flood(t: &Target) {
    // Nobody reads: the server ends the connection once 1,024 answers
    // wait unwritten (and this one connects again).
    let ping = frame(PING, 0, 0, b"12345678");
    let chunk: Vec<u8> = (0..1024).flat_map(|_| ping.clone()).collect();
    while !t.stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(t.grpc) else {
            continue;
        };
        t.conns.fetch_add(1, Ordering::Relaxed);
        let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = s.write_all(PREFACE);
        while !t.stop.load(Ordering::Relaxed) {
            match s.write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
    }
}

fn settings_flood(t: &Target) {
    // 100 entries of SETTINGS_ENABLE_PUSH 0 (id 2): allowed, each frame ACKed.
    let entries: Vec<u8> = (0..100).flat_map(|_| [0, 2, 0, 0, 0, 0]).collect();
    let f = frame(SETTINGS, 0, 0, &entries);
    let chunk: Vec<u8> = (0..64).flat_map(|_| f.clone()).collect();
    h2_flood(t, &chunk);
}

fn rapid_reset(t: &Target) {
    let fields = hpack_literals(&proxy_request("localhost"));
    while !t.stop.load(Ordering::Relaxed) {
        let Some(mut s) = h2_conn(t) else { continue };
        let mut b = Vec::new();
        for k in 0..64u32 {
            let id = 1 + 2 * k;
            b.extend(frame(HEADERS, END_HEADERS, id, &fields));
            b.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
        }
        let _ = s.write_all(&b);
    }
}

fn error_resets(t: &Target) {
    let fields = hpack_literals(&proxy_request("localhost"));
    while !t.stop.load(Ordering::Relaxed) {
        let Some(mut s) = h2_conn(t) else { continue };
        let mut id = 1u32;
        while !t.stop.load(Ordering::Relaxed) {
            let mut b = Vec::new();
            for _ in 0..64 {
                b.extend(frame(HEADERS, END_HEADERS, id, &fields));
                b.extend(frame(WINDOW_UPDATE, 0, id, &0u32.to_be_bytes()));
                id += 2;
            }
            if s.write_all(&b).is_err() {
                break;
            }
        }
    }
}

fn many_streams(t: &Target) {
    let fields = hpack_literals(&proxy_request("localhost"));
    while !t.stop.load(Ordering::Relaxed) {
        let Some(mut s) = h2_conn(t) else { continue };
        let mut open = Vec::new();
        for k in 0..1000u32 {
            let id = 1 + 2 * k;
            open.extend(frame(HEADERS, END_HEADERS, id, &fields));
            // The start of a gRPC message that never ends.
            open.extend(frame(DATA, 0, id, &[0, 0, 0, 1, 0]));
        }
        if s.write_all(&open).is_err() {
            continue;
        }
        // One byte of that message at a time, across every stream: each
        // frame finds its stream among 1,000.
        let mut k = 0u32;
        while !t.stop.load(Ordering::Relaxed) {
            let mut b = Vec::new();
            for _ in 0..256 {
                b.extend(frame(DATA, 0, 1 + 2 * (k % 1000), &[0x08]));
                k = k.wrapping_add(7);
            }
            if s.write_all(&b).is_err() {
                break;
            }
        }
    }
}
