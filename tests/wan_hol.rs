//! What per-tunnel windows protect, kept at a long round trip (issue 41):
//! over an emulated link of 100 ms and 200 Mbit/s, one tunnel's reader
//! stalls (the cloud's client for a download, the edge's target for an
//! upload) after its window grew, while a neighbour on the same agent
//! link transfers. Checked from the server's and the agent's metrics
//! (`edgetunnel_buffered_bytes`, `edgetunnel_tunnel_window_growth_bytes`)
//! and the bytes, never timed:
//!
//! - the neighbour's bytes all arrive, in order, while the stall holds;
//! - the receiving end holds no more of the stalled tunnel than its window
//!   (the first 2 MiB plus its growth, never past `MAX_TUNNEL_WINDOW`)
//!   plus the slack a sender may overrun by, and no more of both tunnels
//!   than their two windows;
//! - the stalled tunnel's window does not grow while it is stalled: the
//!   growth held stands still, and once the neighbour ends it is the
//!   stalled tunnel's again, to the byte;
//! - the stalled tunnel's reader resumes and its bytes arrive whole.
//!
//! The loopback test of the same property, against a build without
//! windows, is tests/tunnel/e2e.rs `stalled_reader_does_not_hold_up_other_connections`;
//! the neighbour's rate is benches/wan_hol.rs. Needs root, iproute2 and
//! /dev/net/tun; otherwise it says `skipped: ...`.

mod support;

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use engine::window::{MAX_TUNNEL_WINDOW, OVERRUN_SLACK, TUNNEL_WINDOW};
use support::hol::{self, Held, Pair, Stalled, Target, Way, MIB};
use support::wan::{Wan, WanConfig};
use support::{Env, WAIT};

/// The neighbour's bytes: over ten times the link's bandwidth-delay
/// product, and past the stalled tunnel's grown window.
const NEIGHBOUR: u64 = 32 * MIB;
/// Growth after which the stalling tunnel's reader stops (its window is
/// then 8 MiB or more).
const GROWN: u64 = 6 * MIB;
/// Samples of the stalled tunnel's growth before the neighbour starts,
/// 100 ms apart.
const STILL_SAMPLES: usize = 10;

#[test]
fn a_stalled_reader_holds_its_window_and_its_neighbour_flows_at_100_ms() {
    let Some(wan) = Wan::start_or_skip(&WanConfig::rtt_ms(100.0).rate_mbit(200.0)) else {
        return;
    };
    let env = Env::new();
    let pair = Pair::start(&env, &wan, "t");
    let target = Target::start(&wan.edge);
    for way in [Way::Download, Way::Upload] {
        stall_beside_a_neighbour(&wan, &pair, &target, way);
    }
}

fn stall_beside_a_neighbour(wan: &Wan, pair: &Pair, target: &Target, way: Way) {
    let name = way.name();
    // The receiving end buffers a tunnel's payload and grows its window.
    let (ns, admin) = pair.receiver(wan, way);
    let receiver = || Held::scrape(ns, admin);
    let start = receiver();
    assert_eq!(start.growth, 0, "{name}: growth held before any tunnel");

    let grown = || receiver().growth >= GROWN;
    let mut stalled = Stalled::start(wan, pair, target, way, &format!("{name}-stalled"), &grown);
    let held = receiver();
    let mib = |v: u64| v as f64 / MIB as f64;
    println!(
        "{name}: the stalled tunnel's reader took {:.1} MiB, then stopped with its window grown by {:.1} MiB; stalled, its receiver holds {:.1} MiB, its window grown by {:.1} MiB",
        mib(stalled.flow.moved().min(stalled.client.load(Ordering::Relaxed))),
        mib(stalled.at_stop.growth),
        mib(held.buffered),
        mib(held.growth)
    );
    assert!(
        held.growth >= GROWN,
        "{name}: the window grew by {} bytes only, in {} bytes:\n{}",
        held.growth,
        stalled.flow.moved(),
        pair.logs()
    );
    // At most its window (and a sender's overrun), whatever it grew to.
    let window = TUNNEL_WINDOW + held.growth;
    assert!(window <= MAX_TUNNEL_WINDOW, "{name}: a window of {window}");
    assert!(
        held.buffered <= window + OVERRUN_SLACK,
        "{name}: {} bytes held beside a window of {window}",
        held.buffered
    );
    // Nothing consumed, nothing grown: ten round trips of a stall.
    for _ in 0..STILL_SAMPLES {
        thread::sleep(Duration::from_millis(100));
        let now = receiver();
        assert_eq!(
            now.growth, held.growth,
            "{name}: a stalled tunnel's window grew"
        );
        assert!(now.buffered <= window + OVERRUN_SLACK, "{name}: {now:?}");
    }

    // The neighbour, on the same link, while the stall holds; the
    // receiver's metrics sampled as it goes.
    let done = AtomicBool::new(false);
    let samples = AtomicU64::new(0);
    let (rate, worst) = thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut worst = Held::default();
            while !done.load(Ordering::Relaxed) {
                let h = receiver();
                // Both tunnels' windows, their growth included, and a
                // sender's overrun each.
                let both = 2 * TUNNEL_WINDOW + h.growth + 2 * OVERRUN_SLACK;
                assert!(h.buffered <= both, "{name}: {h:?} held beside two windows");
                assert!(
                    h.growth >= held.growth,
                    "{name}: the stalled tunnel's growth went back: {h:?}"
                );
                worst.buffered = worst.buffered.max(h.buffered);
                worst.growth = worst.growth.max(h.growth);
                samples.fetch_add(1, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(50));
            }
            worst
        });
        let tag = format!("{name}-neighbour");
        let rate = match way {
            Way::Download => {
                let mut s =
                    hol::connect_uds(&pair.uds, target.port, &format!("DOWN {NEIGHBOUR} {tag}"));
                hol::receive(&mut s, NEIGHBOUR, 0)
            }
            Way::Upload => {
                let flow = target.flow(&tag);
                let mut s =
                    hol::connect_uds(&pair.uds, target.port, &format!("UP {NEIGHBOUR} {tag}"));
                let sent = AtomicU64::new(0);
                assert!(
                    hol::send(&mut s, NEIGHBOUR, 0, &sent),
                    "{name}: the neighbour's upload failed at {} bytes:\n{}",
                    sent.load(Ordering::Relaxed),
                    pair.logs()
                );
                let mut ok = String::new();
                BufReader::new(&s)
                    .read_line(&mut ok)
                    .expect("the target's OK");
                assert_eq!(ok, "OK\n", "{name}: the neighbour's answer");
                assert_eq!(flow.wrong_byte(), None, "{name}: the neighbour's bytes");
                assert_eq!(flow.moved(), NEIGHBOUR);
                flow.wait_rate()
            }
        };
        done.store(true, Ordering::Relaxed);
        (rate, sampler.join().expect("the metrics sampler"))
    });
    println!(
        "{name}: the neighbour moved {} MiB beside the stall at {:.1} MB/s (steady {:.1}); {} samples, at most {:.1} MiB held and {:.1} MiB of growth",
        NEIGHBOUR / MIB,
        rate.average / 1e6,
        rate.steady / 1e6,
        samples.load(Ordering::Relaxed),
        worst.buffered as f64 / MIB as f64,
        worst.growth as f64 / MIB as f64
    );
    // The neighbour's growth goes with it: what stays is the stalled
    // tunnel's, unchanged by the neighbour's whole transfer.
    let deadline = Instant::now() + WAIT;
    loop {
        let now = receiver();
        if now.growth == held.growth {
            assert!(now.buffered <= window + OVERRUN_SLACK, "{name}: {now:?}");
            break;
        }
        assert!(
            now.growth > held.growth && Instant::now() < deadline,
            "{name}: growth {} after the neighbour, {} before",
            now.growth,
            held.growth
        );
        thread::sleep(Duration::from_millis(25));
    }

    // The stalled reader goes on, and what was held arrives whole.
    stalled.resume(window + 8 * MIB);
    drop(stalled);
    let deadline = Instant::now() + WAIT;
    while receiver() != Held::default() {
        assert!(
            Instant::now() < deadline,
            "{name}: still held after the tunnels ended: {:?}",
            receiver()
        );
        thread::sleep(Duration::from_millis(25));
    }
}
