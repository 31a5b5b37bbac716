//! The emulated WAN link (`wanlink`, tests/support/wan.rs) checked against
//! plain TCP between its two namespaces, as physics, with wide margins:
//!
//! - the time of a TCP connect (one round trip: SYN, SYN-ACK) is twice the
//!   one-way delay;
//! - a bulk transfer reaches at least 0.85 of the configured rate (a
//!   packet of 1,500 bytes carries 1,448 of payload: 0.965 at most);
//! - random loss makes the sender retransmit about as many segments as
//!   the link lost (`Tcp RetransSegs` of `/proc/net/snmp` in the sender's
//!   namespace), between 0.5 and 2.5 times the loss rate of what it sent.
//!
//! Each takes a few seconds; they run one at a time (two cores). Root,
//! iproute2 and /dev/net/tun needed: otherwise each says `skipped: ...`.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use support::netns::Netns;
use support::wan::{Wan, WanConfig, CLOUD_IP, EDGE_IP};

fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a bulk transfer measured at the receiver.
struct Bulk {
    bytes: u64,
    /// Bytes a second after the warm-up (slow start) to the end.
    rate: f64,
}

/// Sends from `from` to a listener in `to` (at `to_ip`) for `secs`
/// seconds; the rate is the receiver's, from `warmup` after its first
/// byte to its last.
fn bulk(from: &Netns, to: &Netns, to_ip: std::net::Ipv4Addr, secs: f64, warmup: f64) -> Bulk {
    let l = to.run(|| TcpListener::bind((to_ip, 0))).expect("bind");
    let addr: SocketAddr = l.local_addr().unwrap();
    let receiver = thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 256 * 1024];
        let (mut total, mut first, mut warm) = (0u64, None, None);
        let mut end = Instant::now();
        loop {
            let n = s.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            let now = Instant::now();
            total += n as u64;
            end = now;
            let t0 = *first.get_or_insert(now);
            if warm.is_none() && now - t0 >= Duration::from_secs_f64(warmup) {
                warm = Some((now, total));
            }
        }
        let (tw, bw) = warm.expect("the transfer outlasted its warm-up");
        Bulk {
            bytes: total,
            rate: (total - bw) as f64 / (end - tw).as_secs_f64(),
        }
    });
    let mut s = from.run(|| TcpStream::connect(addr)).expect("connect");
    let chunk = vec![0x5au8; 256 * 1024];
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        s.write_all(&chunk).expect("write");
    }
    s.shutdown(Shutdown::Write).unwrap();
    receiver.join().unwrap()
}

/// A TCP connect from cloud to edge takes one round trip: 2 x the one-way
/// delay, within 2 ms.
#[test]
fn connect_time_is_the_round_trip() {
    let _g = serial();
    let cfg = WanConfig::rtt_ms(20.0).rate_mbit(100.0);
    let Some(mut wan) = Wan::start_or_skip(&cfg) else {
        return;
    };
    let l = wan
        .edge
        .run(|| TcpListener::bind((EDGE_IP, 0)))
        .expect("bind");
    let addr = l.local_addr().unwrap();
    let acceptor = thread::spawn(move || {
        for s in l.incoming().take(7) {
            drop(s);
        }
    });
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            wan.cloud.run(|| {
                let t = Instant::now();
                let s = TcpStream::connect(addr).expect("connect");
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                drop(s);
                ms
            })
        })
        .collect();
    acceptor.join().unwrap();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let want = cfg.rtt().as_secs_f64() * 1000.0;
    let (ab, ba) = wan.stats();
    println!(
        "connect times {times:.2?} ms; median {median:.2} ms, link RTT {want} ms; {ab:?} {ba:?}"
    );
    assert!(
        median >= want - 0.5 && median <= want + 2.0,
        "connect took {median:.2} ms over a {want} ms round trip ({times:?})"
    );
    assert_eq!(ab.lost + ba.lost + ab.queue_drops + ba.queue_drops, 0);
}

/// A bulk transfer fills the bottleneck: 100 Mbit/s at RTT 20 ms, both
/// ways, at least 0.85 of the rate after a second of slow start.
#[test]
fn bulk_transfer_reaches_the_rate() {
    let _g = serial();
    let cfg = WanConfig::rtt_ms(20.0).rate_mbit(100.0);
    let Some(mut wan) = Wan::start_or_skip(&cfg) else {
        return;
    };
    let cpu0 = wan.cpu_secs();
    let down = bulk(&wan.edge, &wan.cloud, CLOUD_IP, 3.0, 1.0);
    let up = bulk(&wan.cloud, &wan.edge, EDGE_IP, 3.0, 1.0);
    let cpu = wan.cpu_secs() - cpu0;
    let (ab, ba) = wan.stats();
    let link = cfg.bytes_per_sec();
    for (what, b) in [("edge to cloud", &down), ("cloud to edge", &up)] {
        println!(
            "{what}: {:.1} MB in all, {:.2} MB/s after the warm-up = {:.3} of the link ({:.2} MB/s)",
            b.bytes as f64 / 1e6,
            b.rate / 1e6,
            b.rate / link,
            link / 1e6
        );
    }
    let moved = (ab.bytes + ba.bytes) as f64;
    println!(
        "wanlink: {cpu:.2} CPU s for {:.1} MB = {:.2} CPU s per GB; cloud>edge {ab:?}; edge>cloud {ba:?}",
        moved / 1e6,
        cpu / (moved / 1e9)
    );
    for (what, b) in [("edge to cloud", &down), ("cloud to edge", &up)] {
        assert!(
            b.rate >= 0.85 * link,
            "{what}: {:.2} MB/s over a {:.2} MB/s link",
            b.rate / 1e6,
            link / 1e6
        );
        // Not faster than the link either (the bottleneck holds).
        assert!(b.rate <= 1.05 * link, "{what}: {:.2} MB/s", b.rate / 1e6);
    }
}

/// At 1 % random loss the sender retransmits about what the link lost:
/// between 0.5 and 2.5 % of the segments it sent. The queue is made large
/// (4 MiB) so that no packet is dropped at its tail: every loss is the
/// random one.
#[test]
fn loss_makes_retransmits() {
    let _g = serial();
    let cfg = WanConfig::rtt_ms(2.0)
        .rate_mbit(100.0)
        .loss_percent(1.0)
        .queue_bytes(4 << 20);
    let Some(mut wan) = Wan::start_or_skip(&cfg) else {
        return;
    };
    let (r0, o0) = (
        wan.cloud.snmp("Tcp", "RetransSegs"),
        wan.cloud.snmp("Tcp", "OutSegs"),
    );
    let b = bulk(&wan.cloud, &wan.edge, EDGE_IP, 3.0, 0.5);
    let (retrans, out) = (
        wan.cloud.snmp("Tcp", "RetransSegs") - r0,
        wan.cloud.snmp("Tcp", "OutSegs") - o0,
    );
    let (ab, ba) = wan.stats();
    let frac = retrans as f64 / out as f64;
    println!(
        "{:.1} MB at {:.2} MB/s; sender: {out} segments, {retrans} retransmitted ({:.2} %); link lost {} of {} packets cloud>edge ({:.2} %), {} of {} edge>cloud",
        b.bytes as f64 / 1e6,
        b.rate / 1e6,
        frac * 100.0,
        ab.lost,
        ab.packets,
        ab.lost as f64 * 100.0 / ab.packets as f64,
        ba.lost,
        ba.packets
    );
    assert!(out > 5_000, "too few segments to judge: {out}");
    assert_eq!(ab.queue_drops + ba.queue_drops, 0, "tail drops");
    assert!(
        (0.005..=0.025).contains(&frac),
        "{retrans} retransmits of {out} segments at 1 % loss"
    );
    // Every lost segment is sent again (a retransmission lost too, twice);
    // a tail loss probe may add a few.
    assert!(
        retrans as f64 >= 0.9 * ab.lost as f64 && retrans as f64 <= 1.5 * ab.lost as f64 + 20.0,
        "{retrans} retransmits for {} lost packets",
        ab.lost
    );
}
