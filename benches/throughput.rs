//! Bulk throughput of tunneled TCP streams against a direct loopback
//! connection, measured side by side in one run.
//!
//! Path under test: client -> HTTP CONNECT frontend -> edgetunnel server ->
//! (mutual TLS, HTTP/2, gRPC Packets) -> edgetunnel agent -> target.
//! The same client and target code measure the direct loopback path.
//!
//! `cargo bench --bench throughput` runs the full measurement (3 rounds of
//! 5 s per case) and writes `benches/results/throughput.json`; under
//! `cargo test` (no `--bench` flag) it runs a sub-second smoke pass that
//! only proves the harness works. Figures are printed, never asserted.
//! For profiling, `-- --bench --only upload1 --rounds 1 --secs 20` runs one
//! case (`upload1`, `download1`, `upload64`, `download64`) and writes nothing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_edgetunnel");
const CHUNK: usize = 256 * 1024;

/// A target that counts and discards what it receives, or sends forever.
struct Target {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
}

fn target(send_mode: bool) -> Target {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let r = received.clone();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let r = r.clone();
            thread::spawn(move || {
                let mut buf = vec![0u8; CHUNK];
                if send_mode {
                    while s.write_all(&buf).is_ok() {}
                } else {
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        r.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    Target { addr, received }
}

/// Opens a stream to `target`, directly or through the CONNECT frontend.
fn open(via: Option<SocketAddr>, target: SocketAddr) -> TcpStream {
    let Some(proxy) = via else {
        return TcpStream::connect(target).unwrap();
    };
    let mut s = TcpStream::connect(proxy).unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// Gbit/s moved by `streams` parallel streams for `secs`, upload or download.
fn measure(via: Option<SocketAddr>, streams: usize, secs: f64, upload: bool) -> f64 {
    let t = target(!upload);
    let stop = Arc::new(AtomicBool::new(false));
    let downloaded = Arc::new(AtomicU64::new(0));
    // Each stream reads or writes from the moment it is open: a tunneled
    // connection whose reader idles would only measure buffering.
    let target_addr = t.addr;
    let handles: Vec<_> = (0..streams)
        .map(|_| {
            let stop = stop.clone();
            let downloaded = downloaded.clone();
            thread::spawn(move || {
                let mut s = open(via, target_addr);
                let mut buf = vec![0x5au8; CHUNK];
                while !stop.load(Ordering::Relaxed) {
                    if upload {
                        if s.write_all(&buf).is_err() {
                            break;
                        }
                    } else {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                downloaded.fetch_add(n as u64, Ordering::Relaxed);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let counter = if upload { &t.received } else { &downloaded };
    let start_bytes = counter.load(Ordering::Relaxed);
    let start = Instant::now();
    thread::sleep(Duration::from_secs_f64(secs));
    let bytes = counter.load(Ordering::Relaxed) - start_bytes;
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        // A stream that could not open fails the measurement.
        if let Err(e) = h.join() {
            std::panic::resume_unwind(e);
        }
    }
    bytes as f64 * 8.0 / elapsed / 1e9
}

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Reads a child's stdout lines until one starts with `prefix`; returns all
/// lines read so far.
fn lines_until(child: &mut Child, prefix: &str) -> Vec<String> {
    use std::io::BufRead;
    let out = child.stdout.take().unwrap();
    let mut r = std::io::BufReader::new(out);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "process ended before {prefix}"
        );
        let done = line.starts_with(prefix);
        lines.push(line.trim().to_string());
        if done {
            return lines;
        }
    }
}

fn listen_addr(lines: &[String], what: &str) -> String {
    let prefix = format!("LISTEN {what} ");
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {lines:?}"))
        .to_string()
}

fn start_tunnel(dir: &std::path::Path) -> (Procs, SocketAddr) {
    let st = Command::new(BIN)
        .args(["certs", "init"])
        .arg(dir.join("certs"))
        // The agent certificate names the agent ID (the server binds it).
        .args(["--agent-name", "bench"])
        .output()
        .unwrap();
    assert!(st.status.success());
    let mut server = Command::new(BIN)
        .args(["server", "--certs-dir"])
        .arg(dir.join("certs"))
        .args([
            "--agent-bind",
            "127.0.0.1:0",
            "--connect-bind",
            "127.0.0.1:0",
            "--admin-bind",
            "127.0.0.1:0",
        ])
        .args(["--log", "warn"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_until(&mut server, "READY");
    let agent_addr = listen_addr(&lines, "agent");
    let connect: SocketAddr = listen_addr(&lines, "connect").parse().unwrap();
    let mut agent = Command::new(BIN)
        .args(["agent", "--certs-dir"])
        .arg(dir.join("certs"))
        .args([
            "--server-addr",
            &agent_addr,
            "--server-name",
            "localhost",
            "--agent-id",
            "bench",
            // The targets are on loopback, which agents refuse by default.
            "--allow-destinations",
            "127.0.0.0/8,::1",
        ])
        .args(["--log", "warn"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    lines_until(&mut agent, "CONNECTED");
    (Procs(vec![server, agent]), connect)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (mut rounds, mut secs) = if full { (3, 5.0) } else { (1, 0.3) };
    if let Some(r) = flag("--rounds") {
        rounds = r.parse().expect("--rounds N");
    }
    if let Some(s) = flag("--secs") {
        secs = s.parse().expect("--secs SECONDS");
    }
    // `--only upload1|download1|upload64|download64` runs one case (for
    // profiling) and writes no results file.
    let only = flag("--only");
    let dir = tempfile::tempdir().unwrap();
    let (_procs, connect) = start_tunnel(dir.path());
    let mut rows = Vec::new();
    println!(
        "mode: {}",
        if full {
            "full"
        } else {
            "smoke (use `cargo bench` for figures)"
        }
    );
    println!(
        "{:<28} {:>12} {:>12} {:>8}",
        "case", "direct Gb/s", "tunnel Gb/s", "ratio"
    );
    for (streams, upload) in [(1, true), (1, false), (64, true), (64, false)] {
        let name = format!("{}{streams}", if upload { "upload" } else { "download" });
        if only.as_ref().is_some_and(|o| *o != name) {
            continue;
        }
        let mut d = Vec::new();
        let mut t = Vec::new();
        for _ in 0..rounds {
            // Interleave so drift on a shared machine hits both alike.
            d.push(measure(None, streams, secs, upload));
            t.push(measure(Some(connect), streams, secs, upload));
        }
        let (dm, tm) = (median(d.clone()), median(t.clone()));
        let case = format!(
            "{streams} stream(s) {}",
            if upload { "upload" } else { "download" }
        );
        println!("{case:<28} {dm:>12.2} {tm:>12.2} {:>7.1}%", 100.0 * tm / dm);
        rows.push(format!(
            "{{\"case\":\"{case}\",\"direct_gbps\":{d:?},\"tunnel_gbps\":{t:?},\"median_ratio\":{:.4}}}",
            tm / dm
        ));
    }
    if full && only.is_none() {
        let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
        std::fs::create_dir_all(&out).unwrap();
        let json = format!("[\n{}\n]\n", rows.join(",\n"));
        std::fs::write(out.join("throughput.json"), json).unwrap();
        println!("wrote benches/results/throughput.json");
    }
}
