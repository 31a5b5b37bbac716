//! One tunnel over an emulated WAN (issue 41): how fast one download and
//! one upload go through a tunnel whose agent link crosses a long link,
//! against plain TCP over the same link (the ceiling).
//!
//! Per round trip, two new namespaces joined by `wanlink`
//! (tests/support/wan.rs): `cloud` (10.77.0.1) holds the tunnel server and
//! the client, `edge` (10.77.0.2) the agent and the target. Only the agent
//! link crosses the emulated WAN; the client reaches the server on a unix
//! socket (its CONNECT frontend), the agent dials the target on the edge's
//! loopback. Systems:
//!
//! - `plain TCP`: the client connects straight to the target over the
//!   link (the ceiling);
//! - `edgetunnel CONNECT`: `edgetunnel server` and `edgetunnel agent`
//!   (this build, default flags), mutual TLS with test certificates;
//! - `ANP http-connect`: ANP's Go `proxy-server --mode=http-connect` and
//!   `proxy-agent` from the real peers (`EDGETUNNEL_PEERS`, or
//!   `../shared/peers`), skipped when absent.
//!
//! A download is the target sending `--size-mib` MiB to the client, an
//! upload the other way. The figure is the receiver's steady rate: the
//! second half of the bytes over the time they took (slow start left out,
//! see [`receive`]); the average over the whole transfer is printed too.
//!
//! Run: `benches/scripts/wan-tunnel [--rtts 0,20,100,300] [--rate-mbit R]
//! [--mtu M] [--size-mib N] [--loss-percent P]` (root). Under `cargo test`
//! a smoke pass: one round trip of 10 ms, 4 MiB.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports, clippy::all)]
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use support::peer_bins::peer_dir;
use support::wan::{unavailable, Wan, WanConfig, CLOUD_IP, EDGE_IP};
use support::{repo, Agent, Binds, Env, Proc, Server};

/// What one transfer measured at its receiver.
#[derive(Clone, Copy, Debug)]
struct Rate {
    /// Bytes a second over the second half of the bytes.
    steady: f64,
    /// Bytes a second from the first byte to the last.
    average: f64,
}

/// Reads `n` bytes from `s` and times them.
///
/// The steady rate is the second half of the bytes over the time they
/// took (slow start left out). It may exceed the link by what the
/// receiver's kernel held behind a lost packet when the half was reached
/// (at most a congestion window, handed over at once when the hole
/// fills): a few percent at 256 MiB.
fn receive(s: &mut impl Read, n: u64) -> Rate {
    let mut buf = vec![0u8; 256 * 1024];
    let (mut got, mut first, mut half) = (0u64, None, None);
    while got < n {
        let k = s.read(&mut buf).expect("read");
        assert!(k > 0, "the stream ended at {got} of {n} bytes");
        let now = Instant::now();
        first.get_or_insert(now);
        got += k as u64;
        if half.is_none() && got >= n / 2 {
            half = Some((now, got));
        }
    }
    let end = Instant::now();
    let (first, (th, bh)) = (first.unwrap(), half.unwrap());
    Rate {
        steady: (got - bh) as f64 / (end - th).as_secs_f64().max(1e-9),
        average: got as f64 / (end - first).as_secs_f64().max(1e-9),
    }
}

fn send(s: &mut impl Write, n: u64) {
    let chunk = vec![0xa5u8; 256 * 1024];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..k]).expect("write");
        left -= k as u64;
    }
}

/// The target in the edge namespace: each connection sends one line,
/// `DOWN n` (the target sends n bytes and closes) or `UP n` (it reads n
/// bytes, reports their rate on the channel and answers `OK`).
fn start_target(wan: &Wan) -> (u16, mpsc::Receiver<Rate>) {
    let l = wan
        .edge
        .run(|| TcpListener::bind(("0.0.0.0", 0)))
        .expect("bind the target");
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let tx = tx.clone();
            thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    return;
                }
                let mut w = s;
                let mut it = line.split_whitespace();
                let (cmd, n) = (it.next(), it.next().and_then(|v| v.parse::<u64>().ok()));
                match (cmd, n) {
                    (Some("DOWN"), Some(n)) => {
                        send(&mut w, n);
                        let _ = w.shutdown(Shutdown::Write);
                        // Until the client closes: the last bytes are out.
                        let _ = r.read(&mut [0u8; 16]);
                    }
                    (Some("UP"), Some(n)) => {
                        let rate = receive(&mut r, n);
                        let _ = tx.send(rate);
                        let _ = w.write_all(b"OK\n");
                    }
                    _ => {}
                }
            });
        }
    });
    (port, rx)
}

/// How a client reaches the target.
enum Via {
    /// Straight over the link from the cloud namespace.
    Direct(SocketAddr),
    /// HTTP CONNECT to `127.0.0.1:port` (the edge's) on a unix socket.
    Connect(PathBuf),
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Stream {
    fn shutdown_write(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write),
            Stream::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }
}

/// A stream to the target's port `port`, or why not.
fn open(wan: &Wan, via: &Via, port: u16) -> Result<Stream, String> {
    match via {
        Via::Direct(a) => {
            let a = SocketAddr::new(a.ip(), port);
            wan.cloud
                .run(|| TcpStream::connect(a))
                .map(Stream::Tcp)
                .map_err(|e| e.to_string())
        }
        Via::Connect(path) => {
            let mut s = UnixStream::connect(path).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let t = format!("127.0.0.1:{port}");
            write!(s, "CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n\r\n").map_err(|e| e.to_string())?;
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(1) => head.push(b[0]),
                    Ok(_) => {
                        return Err(format!("closed after {:?}", String::from_utf8_lossy(&head)))
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            let head = String::from_utf8_lossy(&head).to_string();
            if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
                return Err(head);
            }
            s.set_read_timeout(None).unwrap();
            Ok(Stream::Unix(s))
        }
    }
}

/// A download then an upload of `n` bytes.
fn measure(wan: &Wan, via: &Via, port: u16, ups: &mpsc::Receiver<Rate>, n: u64) -> (Rate, Rate) {
    let mut s = open(wan, via, port).expect("open a stream to the target");
    writeln!(s, "DOWN {n}").unwrap();
    let down = receive(&mut s, n);
    drop(s);
    let mut s = open(wan, via, port).expect("open a stream to the target");
    writeln!(s, "UP {n}").unwrap();
    send(&mut s, n);
    let mut ok = [0u8; 3];
    s.read_exact(&mut ok).expect("the target's OK");
    s.shutdown_write();
    let up = ups.recv().expect("the upload's rate");
    (down, up)
}

/// Waits until a CONNECT through `via` reaches the target (agents may
/// still be connecting).
fn wait_tunnel(wan: &Wan, via: &Via, port: u16, logs: &dyn Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match open(wan, via, port) {
            Ok(mut s) => {
                writeln!(s, "DOWN 1").unwrap();
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).is_ok() {
                    return;
                }
            }
            Err(e) if Instant::now() > deadline => panic!("no tunnel: {e}\n{}", logs()),
            Err(_) => {}
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Our server in the cloud namespace and our agent in the edge's.
fn start_edgetunnel(env: &Env, wan: &Wan, tag: &str) -> (Proc, Proc, PathBuf) {
    let uds = env.path(&format!("et-connect-{tag}.sock"));
    let binds = Binds {
        agent: format!("{CLOUD_IP}:0"),
        connect_uds: Some(uds.clone()),
        grpc_uds: Some(env.path(&format!("et-grpc-{tag}.sock"))),
        ..Binds::default()
    };
    let certs = env.certs().display().to_string();
    let (cmd, n, cu, gu) = Server::command(env, &["--certs-dir", &certs], &binds, &[]);
    let server = Server::spawn(env, wan.cloud.exec(&cmd), n, cu, gu);
    let agent_cmd = Agent::command(env, server.agent, "node-1", "host=node-1", &[]);
    let agent = Proc::spawn(
        wan.edge.exec(&agent_cmd),
        env.path(&format!("et-agent-{tag}.log")),
    );
    agent.wait_line("CONNECTED");
    (server.proc, agent, uds)
}

/// ANP's Go server in the cloud namespace, its Go agent in the edge's.
fn start_anp(env: &Env, wan: &Wan, peers: &Path, tag: &str) -> (Proc, Proc, PathBuf) {
    let c = env.certs();
    let uds = env.path(&format!("anp-{tag}.sock"));
    let (cert, key) = env.issue(
        &format!("anp-server-{tag}"),
        "anp-server",
        &[&CLOUD_IP.to_string(), "localhost"],
        &[rcgen::ExtendedKeyUsagePurpose::ServerAuth],
    );
    let mut cmd = Command::new(peers.join("anp-server"));
    cmd.arg("--mode=http-connect")
        .arg(format!("--uds-name={}", uds.display()))
        .arg("--server-port=0")
        .arg(format!("--cluster-cert={cert}"))
        .arg(format!("--cluster-key={key}"))
        .arg(format!("--cluster-ca-cert={}", c.join("ca.crt").display()))
        .arg(format!("--agent-bind-address={CLOUD_IP}"))
        .arg("--agent-port=8091")
        .arg("--admin-port=8095")
        .arg("--health-bind-address=127.0.0.1")
        .arg("--health-port=8092")
        .arg("--keepalive-time=1h")
        .arg("-v=1")
        .env_remove("PROXY_SERVER_ID");
    let server = Proc::spawn(
        wan.cloud.exec(&cmd),
        env.path(&format!("anp-server-{tag}.log")),
    );
    server.wait_log("Starting health server");
    let mut cmd = Command::new(peers.join("anp-agent"));
    cmd.arg(format!("--proxy-server-host={CLOUD_IP}"))
        .arg("--proxy-server-port=8091")
        .arg("--agent-id=node-1")
        .arg("--agent-identifiers=host=node-1")
        .arg("--admin-server-port=8093")
        .arg("--health-server-port=8094")
        .arg(format!("--ca-cert={}", c.join("ca.crt").display()))
        .arg(format!("--agent-cert={}", c.join("agent.crt").display()))
        .arg(format!("--agent-key={}", c.join("agent.key").display()))
        .arg("-v=1")
        .env_remove("PROXY_AGENT_ID");
    let agent = Proc::spawn(
        wan.edge.exec(&cmd),
        env.path(&format!("anp-agent-{tag}.log")),
    );
    (server, agent, uds)
}

struct Options {
    rtts: Vec<f64>,
    rate_mbit: f64,
    mtu: usize,
    size_mib: u64,
    loss_percent: f64,
}

fn options() -> Options {
    let full = std::env::args().any(|a| a == "--bench");
    let mut o = if full {
        Options {
            rtts: vec![0.0, 20.0, 100.0, 300.0],
            rate_mbit: 500.0,
            mtu: 1500,
            size_mib: 256,
            loss_percent: 0.0,
        }
    } else {
        Options {
            rtts: vec![10.0],
            rate_mbit: 100.0,
            mtu: 1500,
            size_mib: 4,
            loss_percent: 0.0,
        }
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--rtts" => {
                o.rtts = val()
                    .split(',')
                    .map(|v| v.trim().parse().expect("--rtts MS,MS,..."))
                    .collect()
            }
            "--rate-mbit" => o.rate_mbit = val().parse().expect("--rate-mbit R"),
            "--mtu" => o.mtu = val().parse().expect("--mtu M"),
            "--size-mib" => o.size_mib = val().parse().expect("--size-mib N"),
            "--loss-percent" => o.loss_percent = val().parse().expect("--loss-percent P"),
            _ => {}
        }
    }
    o
}

const SYSTEMS: [&str; 3] = ["plain TCP", "edgetunnel CONNECT", "ANP http-connect"];

fn main() {
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let o = options();
    let peers = peer_dir(&repo()).or_else(|| {
        let p = repo().join("../shared/peers");
        if p.join("unpack").is_file() {
            std::env::set_var("EDGETUNNEL_PEERS", &p);
            peer_dir(&repo())
        } else {
            None
        }
    });
    if peers.is_none() {
        println!("ANP skipped: no real peers (set EDGETUNNEL_PEERS)");
    }
    let env = Env::new();
    let n = o.size_mib << 20;
    // results[system][rtt] = (download, upload)
    let mut results: Vec<Vec<Option<(Rate, Rate)>>> = vec![vec![None; o.rtts.len()]; SYSTEMS.len()];
    let mut cpu_notes = Vec::new();
    for (i, &rtt) in o.rtts.iter().enumerate() {
        let cfg = WanConfig::rtt_ms(rtt)
            .rate_mbit(o.rate_mbit)
            .mtu(o.mtu)
            .loss_percent(o.loss_percent);
        let mut wan = Wan::start(&cfg);
        let (port, ups) = start_target(&wan);
        let tag = format!("rtt{i}");
        let cpu0 = wan.cpu_secs();
        // The ceiling.
        let direct = Via::Direct(SocketAddr::from((EDGE_IP, 0)));
        results[0][i] = Some(measure(&wan, &direct, port, &ups, n));
        report(SYSTEMS[0], rtt, results[0][i].unwrap());
        {
            let (server, agent, uds) = start_edgetunnel(&env, &wan, &tag);
            let via = Via::Connect(uds);
            wait_tunnel(&wan, &via, port, &|| {
                format!("{}\n{}", server.log_text(), agent.log_text())
            });
            results[1][i] = Some(measure(&wan, &via, port, &ups, n));
            report(SYSTEMS[1], rtt, results[1][i].unwrap());
        }
        if let Some(p) = &peers {
            let (server, agent, uds) = start_anp(&env, &wan, p, &tag);
            let via = Via::Connect(uds);
            wait_tunnel(&wan, &via, port, &|| {
                format!("{}\n{}", server.log_text(), agent.log_text())
            });
            results[2][i] = Some(measure(&wan, &via, port, &ups, n));
            report(SYSTEMS[2], rtt, results[2][i].unwrap());
        }
        let (ab, ba) = wan.stats();
        let moved = (ab.bytes + ba.bytes) as f64;
        let cpu = wan.cpu_secs() - cpu0;
        cpu_notes.push(format!(
            "RTT {rtt} ms: wanlink {cpu:.1} CPU s for {:.2} GB = {:.1} CPU s/GB; tail drops {}/{}, lost {}/{}",
            moved / 1e9,
            cpu / (moved / 1e9),
            ab.queue_drops,
            ba.queue_drops,
            ab.lost,
            ba.lost
        ));
    }
    println!();
    println!(
        "One tunnel over an emulated link of {} Mbit/s (= {:.1} MB/s of IP packets), MTU {}, loss {} %, {} MiB each way",
        o.rate_mbit,
        o.rate_mbit / 8.0,
        o.mtu,
        o.loss_percent,
        o.size_mib
    );
    println!("MB/s at the receiver, steady (the second half of the bytes over its time; ratio to plain TCP over the same link)");
    for (d, name) in [(0, "download"), (1, "upload")] {
        println!();
        let mut head = format!("| {name} | ");
        head += &o
            .rtts
            .iter()
            .map(|r| format!("RTT {r} ms"))
            .collect::<Vec<_>>()
            .join(" | ");
        println!("{head} |");
        println!("|---|{}", "---|".repeat(o.rtts.len()));
        for (s, sys) in SYSTEMS.iter().enumerate() {
            let cells: Vec<String> = (0..o.rtts.len())
                .map(|i| {
                    let pick = |r: (Rate, Rate)| if d == 0 { r.0 } else { r.1 };
                    match (results[s][i], results[0][i]) {
                        (Some(r), Some(c)) => {
                            let (v, c) = (pick(r).steady, pick(c).steady);
                            if s == 0 {
                                format!("{:.1}", v / 1e6)
                            } else {
                                format!("{:.1} ({:.2}x)", v / 1e6, v / c)
                            }
                        }
                        _ => "-".into(),
                    }
                })
                .collect();
            println!("| {sys} | {} |", cells.join(" | "));
        }
    }
    println!();
    for c in cpu_notes {
        println!("{c}");
    }
}

fn report(sys: &str, rtt: f64, (down, up): (Rate, Rate)) {
    println!(
        "RTT {rtt:>5} ms  {sys:<20} download {:>7.1} MB/s (average {:>6.1})  upload {:>7.1} MB/s (average {:>6.1})",
        down.steady / 1e6,
        down.average / 1e6,
        up.steady / 1e6,
        up.average / 1e6
    );
}
