//! A neighbour beside a stalled tunnel over an emulated WAN (issue 41, "a
//! stalled reader at RTT 100 ms: neighbours keep >= 0.9x of the link, the
//! stalled tunnel holds at most its cap"): how fast one tunnel moves bytes
//! while another tunnel of the same agent link has stopped reading,
//! against plain TCP over the same link (the ceiling) and the same tunnel
//! with no stall beside it.
//!
//! Per round trip, two new namespaces joined by `wanlink`
//! (tests/support/wan.rs): the server and the client in `cloud`, the agent
//! and the target in `edge`, one agent link between them
//! (tests/support/hol.rs). Per direction:
//!
//! - `plain TCP`: the client connects straight to the target over the
//!   link (a new connection: its slow start is in the average);
//! - `edgetunnel, alone`: one tunnel through our CONNECT frontend;
//! - `edgetunnel, beside a stall`: first a tunnel moves bytes until its
//!   receiver has grown its window by 6 MiB, then its reader stops (the
//!   client for a download, the target for an upload) and stays stopped;
//!   then the neighbour's transfer. The receiving end's
//!   `edgetunnel_buffered_bytes` and window growth are sampled meanwhile:
//!   what the stalled tunnel holds (when the stall is in place) and the
//!   most both tunnels held.
//!
//! The figure is the receiver's steady rate (the second half of the bytes
//! over their time); the average from the first byte is printed too.
//!
//! Run: `cargo bench --bench wan_hol -- [--rtts 100,300] [--rate-mbit R]
//! [--size-mib N] [--reps N]` (root; `cargo build --release -p
//! edgetunnel-wanlink` first). Under `cargo test` a smoke pass: one round
//! trip of 10 ms, 8 MiB.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports, clippy::all)]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use support::hol::{self, Held, Pair, Rate, Stalled, Target, Way, MIB, PATIENCE};
use support::wan::{unavailable, Wan, WanConfig, EDGE_IP};
use support::Env;

/// Growth after which the stalling tunnel's reader stops.
const GROWN: u64 = 6 * MIB;

struct Options {
    rtts: Vec<f64>,
    rate_mbit: f64,
    size_mib: u64,
    reps: usize,
}

fn options() -> Options {
    let full = std::env::args().any(|a| a == "--bench");
    let mut o = if full {
        Options {
            rtts: vec![100.0, 300.0],
            rate_mbit: 500.0,
            size_mib: 256,
            reps: 1,
        }
    } else {
        Options {
            rtts: vec![10.0],
            rate_mbit: 100.0,
            size_mib: 8,
            reps: 1,
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
            "--size-mib" => o.size_mib = val().parse().expect("--size-mib N"),
            "--reps" => o.reps = val().parse::<usize>().expect("--reps N").max(1),
            _ => {}
        }
    }
    o
}

/// One transfer of `n` bytes `way` on a stream already asked for it
/// (`DOWN n TAG` or `UP n TAG`); the receiver's rate.
fn transfer<S>(mut s: S, target: &Target, way: Way, tag: &str, n: u64) -> Rate
where
    S: std::io::Read + Write,
    for<'a> &'a S: std::io::Read,
{
    match way {
        Way::Download => hol::receive(&mut s, n, 0),
        Way::Upload => {
            let sent = AtomicU64::new(0);
            assert!(hol::send(&mut s, n, 0, &sent), "{tag}: the upload failed");
            let mut ok = String::new();
            BufReader::new(&s)
                .read_line(&mut ok)
                .expect("the target's OK");
            let flow = target.flow(tag);
            assert_eq!(flow.wrong_byte(), None, "{tag}: wrong bytes");
            flow.wait_rate()
        }
    }
}

fn line(way: Way, n: u64, tag: &str) -> String {
    match way {
        Way::Download => format!("DOWN {n} {tag}"),
        Way::Upload => format!("UP {n} {tag}"),
    }
}

fn plain_tcp(wan: &Wan, target: &Target, way: Way, tag: &str, n: u64) -> Rate {
    let port = target.port;
    let mut s = wan
        .cloud
        .run(|| TcpStream::connect((EDGE_IP, port)))
        .expect("connect over the link");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    writeln!(s, "{}", line(way, n, tag)).unwrap();
    transfer(s, target, way, tag, n)
}

fn tunnel(pair: &Pair, target: &Target, way: Way, tag: &str, n: u64) -> Rate {
    let s = hol::connect_uds(&pair.uds, target.port, &line(way, n, tag));
    transfer(s, target, way, tag, n)
}

/// The neighbour beside a stall: its rate, what the receiver held when
/// the stall was in place, and the most it held during the transfer.
fn beside_a_stall(
    wan: &Wan,
    pair: &Pair,
    target: &Target,
    way: Way,
    tag: &str,
    n: u64,
) -> (Rate, Held, Held) {
    let (ns, admin) = pair.receiver(wan, way);
    let receiver = || Held::scrape(ns, admin);
    let grown = || receiver().growth >= GROWN;
    let stalled = Stalled::start(wan, pair, target, way, &format!("{tag}-stalled"), &grown);
    let at_stall = receiver();
    let done = AtomicBool::new(false);
    let (rate, most) = thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut most = Held::default();
            while !done.load(Ordering::Relaxed) {
                let h = receiver();
                most.buffered = most.buffered.max(h.buffered);
                most.growth = most.growth.max(h.growth);
                thread::sleep(Duration::from_millis(100));
            }
            most
        });
        let rate = tunnel(pair, target, way, tag, n);
        done.store(true, Ordering::Relaxed);
        (rate, sampler.join().expect("the sampler"))
    });
    drop(stalled);
    // Until the stalled tunnel's buffers and growth are gone.
    let deadline = std::time::Instant::now() + PATIENCE;
    while receiver() != Held::default() {
        assert!(std::time::Instant::now() < deadline, "{tag}: still held");
        thread::sleep(Duration::from_millis(50));
    }
    (rate, at_stall, most)
}

const SYSTEMS: [&str; 3] = [
    "plain TCP (ceiling)",
    "edgetunnel CONNECT, alone",
    "edgetunnel CONNECT, beside a stall",
];

struct Cell {
    rates: [Vec<Rate>; 3],
    at_stall: Vec<Held>,
    most: Vec<Held>,
}

fn main() {
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let o = options();
    let env = Env::new();
    let n = o.size_mib * MIB;
    let ways = [Way::Download, Way::Upload];
    // cells[rtt][way]
    let mut cells: Vec<Vec<Cell>> = Vec::new();
    for (i, &rtt) in o.rtts.iter().enumerate() {
        let mut wan = Wan::start(&WanConfig::rtt_ms(rtt).rate_mbit(o.rate_mbit));
        let target = Target::start(&wan.edge);
        let pair = Pair::start(&env, &wan, &format!("rtt{i}"));
        let mut row = Vec::new();
        for way in ways {
            let mut cell = Cell {
                rates: [Vec::new(), Vec::new(), Vec::new()],
                at_stall: Vec::new(),
                most: Vec::new(),
            };
            for rep in 0..o.reps {
                let tag = |s: &str| format!("{}-{s}-{i}-{rep}", way.name());
                let r = plain_tcp(&wan, &target, way, &tag("tcp"), n);
                report(rtt, way, SYSTEMS[0], r, None);
                cell.rates[0].push(r);
                let r = tunnel(&pair, &target, way, &tag("alone"), n);
                report(rtt, way, SYSTEMS[1], r, None);
                cell.rates[1].push(r);
                let (r, at_stall, most) =
                    beside_a_stall(&wan, &pair, &target, way, &tag("beside"), n);
                report(rtt, way, SYSTEMS[2], r, Some((at_stall, most)));
                cell.rates[2].push(r);
                cell.at_stall.push(at_stall);
                cell.most.push(most);
            }
            row.push(cell);
        }
        let (ab, ba) = wan.stats();
        println!(
            "RTT {rtt} ms: tail drops {}/{}, lost {}/{}",
            ab.queue_drops, ba.queue_drops, ab.lost, ba.lost
        );
        cells.push(row);
    }
    println!();
    println!(
        "A tunnel beside a stalled one over an emulated link of {} Mbit/s (= {:.1} MB/s of IP packets), {} MiB each transfer, {} repetition(s), medians",
        o.rate_mbit,
        o.rate_mbit / 8.0,
        o.size_mib,
        o.reps
    );
    println!("MB/s at the receiver, steady (average from the first byte); ratio of steady rates to plain TCP over the same link");
    for (w, way) in ways.iter().enumerate() {
        println!();
        let mut head = format!("| {} |", way.name());
        for r in &o.rtts {
            head += &format!(" RTT {r} ms |");
        }
        println!("{head}");
        println!("|---|{}", "---|".repeat(o.rtts.len()));
        for (s, sys) in SYSTEMS.iter().enumerate() {
            let mut row = format!("| {sys} |");
            for cell in cells.iter().map(|r| &r[w]) {
                let steady = median(cell.rates[s].iter().map(|r| r.steady));
                let average = median(cell.rates[s].iter().map(|r| r.average));
                let ceiling = median(cell.rates[0].iter().map(|r| r.steady));
                if s == 0 {
                    row += &format!(" {:.1} ({:.1}) |", steady / 1e6, average / 1e6);
                } else {
                    row += &format!(
                        " {:.1} ({:.1}), {:.2}x |",
                        steady / 1e6,
                        average / 1e6,
                        steady / ceiling
                    );
                }
            }
            println!("{row}");
        }
        let mut row =
            "| held by the receiver: the stall in place; most during (MiB, growth) |".to_string();
        for cell in cells.iter().map(|r| &r[w]) {
            let mib = |v: u64| v as f64 / MIB as f64;
            let at = cell.at_stall.iter().map(|h| h.buffered).max().unwrap_or(0);
            let g = cell.at_stall.iter().map(|h| h.growth).max().unwrap_or(0);
            let most = cell.most.iter().map(|h| h.buffered).max().unwrap_or(0);
            let mg = cell.most.iter().map(|h| h.growth).max().unwrap_or(0);
            row += &format!(
                " {:.1} (window {:.1}); {:.1} ({:.1}) |",
                mib(at),
                mib(g) + 2.0,
                mib(most),
                mib(mg)
            );
        }
        println!("{row}");
    }
}

fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn report(rtt: f64, way: Way, sys: &str, r: Rate, held: Option<(Held, Held)>) {
    let mut line = format!(
        "RTT {rtt:>5} ms  {:<8}  {sys:<36} {:>7.1} MB/s steady, {:>6.1} average",
        way.name(),
        r.steady / 1e6,
        r.average / 1e6
    );
    if let Some((at, most)) = held {
        line += &format!(
            "; stalled: {:.1} MiB held, window grown by {:.1} MiB; most held during {:.1} MiB",
            at.buffered as f64 / MIB as f64,
            at.growth as f64 / MIB as f64,
            most.buffered as f64 / MIB as f64
        );
    }
    println!("{line}");
}
