//! The WAN grid (issue 41): how fast tunnels go over a long, lossy link,
//! against plain TCP over the same link (the ceiling) and the systems a
//! user would compare: edgetunnel through its CONNECT and gRPC frontends,
//! the Go ANP (http-connect and grpc), and a mutual-TLS haproxy pair.
//!
//! For every RTT x loss and every system a fresh bed ([`bed`]): two
//! network namespaces joined by `wanlink` (tests/support/wan.rs), `cloud`
//! (10.77.0.1) with the client and the tunnel's server, `edge`
//! (10.77.0.2) with its agent and the target; only the system's own link
//! crosses the emulated WAN. On it, one case per tunnel count and
//! direction: that many streams at once move a checked byte pattern
//! ([`target`]) for a warm-up (slow start, window growth), then a
//! measured window; the figure is the bytes the receivers took in the
//! window over its length. Between cases the link must go quiet, or the
//! bed is made anew. At the first loss of each RTT, dials are timed to
//! their first byte ([`flows::dials`]). The report ([`report`]) has MB/s,
//! ratios to the ceiling and to ANP, the goals checked, dial
//! round trips, and plots of throughput against RTT ([`plot`]).
//!
//! Run: `benches/run --scenarios wan [flags]` (`--help` lists them; root).
//! Under `cargo test` (no `--bench`) a smoke pass of seconds that fails on
//! any error or corrupted byte; `skipped: ...` without root or TUN.

#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports, clippy::all)]
mod support;

#[allow(dead_code)]
#[path = "../shared/tunnel_client.rs"]
mod client;
#[path = "../shared/haproxy_pair.rs"]
mod haproxy_pair;
#[path = "../shared/run_facts.rs"]
mod run_facts;

mod bed;
mod diag;
mod flows;
mod options;
mod plot;
mod report;
mod target;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bed::Bed;
use flows::Timing;
use report::{Cell, DialRow, Grid};
use support::peer_bins::peer_dir;
use support::wan::{unavailable, WanConfig};
use support::{repo, Env};

/// How long a link may stay busy after a case before the bed is made anew.
const QUIET_TIMEOUT: Duration = Duration::from_secs(20);

fn main() {
    let o = match options::parse() {
        Ok(o) => o,
        Err(text) if text.starts_with("usage") => {
            println!("{text}");
            return;
        }
        Err(e) => {
            eprintln!("{e}\n{}", options::USAGE);
            std::process::exit(2);
        }
    };
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let started = Instant::now();
    // (Unpacking the peers checks their sums: only when an ANP runs.)
    let peers = o.systems.iter().any(|s| s.is_anp()).then(peers).flatten();
    let env = Env::new();
    let mut grid = Grid::new(&o);
    let out = o.out.clone().unwrap_or_else(|| default_out(o.smoke));
    if peers.is_none() && o.systems.iter().any(|s| s.is_anp()) {
        grid.note("ANP not run: no real peers (set EDGETUNNEL_PEERS)".into());
    }
    let (mut case, mut beds) = (0u64, 0u64);
    for &rtt in &o.rtts {
        for (li, &loss) in o.losses.iter().enumerate() {
            let cfg = WanConfig::rtt_ms(rtt)
                .rate_mbit(o.rate_mbit)
                .mtu(o.mtu)
                .loss_percent(loss);
            let timing = Timing {
                warmup: o.warmup(rtt),
                window: o.window,
            };
            for &system in &o.systems {
                if system.is_anp() && peers.is_none() {
                    continue;
                }
                let mut slot: Option<Bed> = None;
                let mut start = |grid: &mut Grid, slot: &mut Option<Bed>| {
                    if slot.is_none() {
                        beds += 1;
                        let tag = format!("{}-{beds}", system.name());
                        match guarded(|| {
                            Bed::start(
                                system,
                                &cfg,
                                &env,
                                peers.as_deref(),
                                o.cc.as_deref(),
                                o.rmem_default,
                                &tag,
                            )
                        }) {
                            Ok(b) => *slot = Some(b),
                            Err(e) => grid.note(format!(
                                "{} at RTT {rtt} ms, loss {loss} %: did not start: {e}",
                                system.label()
                            )),
                        }
                    }
                };
                let t0 = Instant::now();
                if li == 0 && o.dials > 0 {
                    start(&mut grid, &mut slot);
                    if let Some(b) = &slot {
                        let r = guarded(|| flows::dials(&b.wan, &b.entry, o.dials));
                        let row = DialRow::new(rtt, loss, system, r);
                        println!("{}", row.line());
                        grid.dials.push(row);
                    }
                }
                if o.smoke {
                    println!("  (start and dials: {:.1} s)", t0.elapsed().as_secs_f64());
                }
                for &tunnels in &o.tunnels {
                    for &dir in &o.directions {
                        start(&mut grid, &mut slot);
                        case += 1;
                        let result = match &mut slot {
                            None => Err("the system did not start".to_string()),
                            Some(b) => {
                                let (a0, b0) = b.wan.stats();
                                let diag = diag::Sampler::start(
                                    b,
                                    &format!(
                                        "{} rtt={rtt} loss={loss} tunnels={tunnels} {}",
                                        system.name(),
                                        dir.name()
                                    ),
                                );
                                let r = guarded(|| {
                                    flows::transfer(
                                        &b.wan,
                                        &b.entry,
                                        &b.target.tally,
                                        case,
                                        tunnels,
                                        dir,
                                        timing,
                                    )
                                });
                                drop(diag);
                                let (a1, b1) = b.wan.stats();
                                let lost = a1.lost + b1.lost - a0.lost - b0.lost;
                                let drops = a1.queue_drops + b1.queue_drops
                                    - a0.queue_drops
                                    - b0.queue_drops;
                                r.map(|d| (d, lost, drops))
                            }
                        };
                        let cell = Cell::new(rtt, loss, tunnels, dir, system, result);
                        println!("{}", cell.line());
                        let broken = cell.result.is_err();
                        grid.cells.push(cell);
                        if let Err(e) = grid.save_json(&out) {
                            eprintln!("writing {}: {e}", out.display());
                        }
                        let tq = Instant::now();
                        let quiet = match &mut slot {
                            Some(b) if !broken => flows::wait_quiet(&mut b.wan, QUIET_TIMEOUT),
                            _ => false,
                        };
                        if o.smoke {
                            println!("  (quiet after {:.1} s)", tq.elapsed().as_secs_f64());
                        }
                        if !quiet && slot.is_some() {
                            if !broken {
                                grid.note(format!(
                                    "{} at RTT {rtt} ms, loss {loss} %: the link stayed busy \
                                     {} s after {tunnels} tunnel(s) {}; made anew",
                                    system.label(),
                                    QUIET_TIMEOUT.as_secs(),
                                    dir.name()
                                ));
                            }
                            slot = None;
                        }
                    }
                }
            }
        }
    }
    grid.finish();
    match report::write_all(&grid, &out) {
        Ok(files) => files.iter().for_each(|f| println!("wrote {}", f.display())),
        Err(e) => {
            eprintln!("writing the report into {}: {e}", out.display());
            std::process::exit(1);
        }
    }
    println!(
        "wan: {} cases, {} dials rows in {:.0} s",
        grid.cells.len(),
        grid.dials.len(),
        started.elapsed().as_secs_f64()
    );
    if o.smoke {
        let failed: Vec<String> = grid.failures();
        assert!(
            failed.is_empty(),
            "the smoke pass failed:\n{}",
            failed.join("\n")
        );
    }
}

/// `f`'s result, a panic in it (the test support's waits panic) as an
/// error.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into());
        Err(msg.lines().next().unwrap_or("").to_string())
    })
}

/// The real peers' binaries: `EDGETUNNEL_PEERS`, else `../shared/peers`
/// beside the repository.
fn peers() -> Option<PathBuf> {
    peer_dir(&repo()).or_else(|| {
        let p = repo().join("../shared/peers");
        if p.join("unpack").is_file() {
            std::env::set_var("EDGETUNNEL_PEERS", &p);
            peer_dir(&repo())
        } else {
            None
        }
    })
}

fn default_out(smoke: bool) -> PathBuf {
    if smoke {
        return repo().join("target/wan-smoke");
    }
    let stamp = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d-%H%M"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    repo().join(format!("benches/results/wan/grid-{stamp}"))
}
