//! `wanlink`: an emulated WAN link between two network namespaces, made in
//! user space because this project's CI kernels may lack `netem`.
//!
//! It creates one TUN device in each namespace (`--ns-a`, `--ns-b`, made
//! beforehand with `ip netns add`), gives them the addresses `--addr-a` and
//! `--addr-b` and the MTU `--mtu`, and forwards the IP packets one device
//! reads to the other, per direction through the model of `link.rs`: a
//! FIFO bottleneck of `--rate-mbit` with a queue of `--queue-bytes` (tail
//! drop), random loss (`--loss-percent`, seeded by `--seed`), a one-way
//! delay (`--delay-ms`) and jitter (`--jitter-ms`, no reordering unless
//! `--reorder`). Every shaping flag takes one value for both directions or
//! `AB,BA` (from a to b, from b to a).
//!
//! It prints `READY a=NS/DEV b=NS/DEV` once both devices are up. On stdin,
//! the line `stats` prints one `STATS` line per direction; end of input
//! prints them and exits (the devices go with the process).

mod link;
mod sys;

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use link::{Direction, Shape, Verdict};

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("network namespace {name}: {source}")]
    Netns { name: String, source: io::Error },
    #[error("TUN device {name} in {ns}: {source}")]
    Tun {
        ns: String,
        name: String,
        source: io::Error,
    },
    #[error("`ip {args}` failed: {detail}")]
    Ip { args: String, detail: String },
    #[error("forwarding {dir}: {source}")]
    Forward { dir: String, source: io::Error },
}

/// One value for both directions, or `AB,BA`.
#[derive(Clone, Copy, Debug)]
struct PerDir<T> {
    ab: T,
    ba: T,
}

impl<T: FromStr + Copy> FromStr for PerDir<T>
where
    T::Err: std::fmt::Display,
{
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let one = |v: &str| v.trim().parse::<T>().map_err(|e| format!("{v:?}: {e}"));
        match s.split_once(',') {
            Some((a, b)) => Ok(PerDir {
                ab: one(a)?,
                ba: one(b)?,
            }),
            None => {
                let v = one(s)?;
                Ok(PerDir { ab: v, ba: v })
            }
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "wanlink",
    version,
    about = "An emulated WAN link between two network namespaces (TUN devices)"
)]
struct Args {
    /// Namespace of side a (`ip netns add` made it: /run/netns/NAME).
    #[arg(long)]
    ns_a: String,
    /// Namespace of side b.
    #[arg(long)]
    ns_b: String,
    /// Address and prefix of side a's device, e.g. 10.77.0.1/24.
    #[arg(long)]
    addr_a: String,
    /// Address and prefix of side b's device, e.g. 10.77.0.2/24.
    #[arg(long)]
    addr_b: String,
    /// Name of the TUN device in each namespace.
    #[arg(long, default_value = "wan0")]
    dev: String,
    /// MTU of both devices (bytes of an IP packet).
    #[arg(long, default_value_t = 1500)]
    mtu: usize,
    /// One-way delay in milliseconds (`AB,BA` for two values).
    #[arg(long, default_value = "0")]
    delay_ms: PerDir<f64>,
    /// Extra random delay, uniform in [0, J] milliseconds.
    #[arg(long, default_value = "0")]
    jitter_ms: PerDir<f64>,
    /// Let jittered packets overtake each other (off: FIFO delivery).
    #[arg(long)]
    reorder: bool,
    /// Bottleneck rate in Mbit/s of IP packets (0: unlimited).
    #[arg(long, default_value = "0")]
    rate_mbit: PerDir<f64>,
    /// Bytes that may wait for the bottleneck; a packet above is dropped
    /// at the tail. Default: one bandwidth-delay product of the round
    /// trip (rate x (delay a->b + delay b->a)), at least 64 KiB.
    #[arg(long)]
    queue_bytes: Option<PerDir<u64>>,
    /// Random loss in percent of the packets.
    #[arg(long, default_value = "0")]
    loss_percent: PerDir<f64>,
    /// While packets are in flight, read and deliver in batches at most
    /// this many microseconds apart (a packet may be read and delivered up
    /// to one tick late; 0: a wake-up per packet, much more CPU).
    #[arg(long, default_value_t = 100)]
    tick_us: u64,
    /// Seed of the loss and jitter RNG (b->a uses seed + 1).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Counters of one direction.
#[derive(Default)]
struct Stats {
    packets: AtomicU64,
    bytes: AtomicU64,
    delivered: AtomicU64,
    delivered_bytes: AtomicU64,
    lost: AtomicU64,
    queue_drops: AtomicU64,
    write_errors: AtomicU64,
    max_backlog: AtomicU64,
}

impl Stats {
    fn line(&self, dir: &str) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "STATS {dir} packets={} bytes={} delivered={} delivered_bytes={} lost={} queue_drops={} write_errors={} max_backlog={}",
            g(&self.packets),
            g(&self.bytes),
            g(&self.delivered),
            g(&self.delivered_bytes),
            g(&self.lost),
            g(&self.queue_drops),
            g(&self.write_errors),
            g(&self.max_backlog),
        )
    }
}

fn shape(args: &Args, ab: bool) -> Shape {
    let pick = |p: PerDir<f64>| if ab { p.ab } else { p.ba };
    let ms = |v: f64| Duration::from_secs_f64(v.max(0.0) / 1000.0);
    let rate_bps = (pick(args.rate_mbit).max(0.0) * 1e6) as u64;
    let rtt = ms(args.delay_ms.ab) + ms(args.delay_ms.ba);
    let bdp = (rate_bps as f64 * rtt.as_secs_f64() / 8.0) as u64;
    let queue_bytes = match args.queue_bytes {
        Some(q) => {
            if ab {
                q.ab
            } else {
                q.ba
            }
        }
        None => bdp.max(64 * 1024),
    };
    Shape {
        delay: ms(pick(args.delay_ms)),
        jitter: ms(pick(args.jitter_ms)),
        reorder: args.reorder,
        rate_bps,
        queue_bytes,
        loss: (pick(args.loss_percent) / 100.0).clamp(0.0, 1.0),
    }
}

/// Runs `ip ARGS`.
fn ip(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("ip").args(args).output();
    let detail = match out {
        Ok(o) if o.status.success() => return Ok(()),
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => e.to_string(),
    };
    Err(Error::Ip {
        args: args.join(" "),
        detail,
    })
}

/// Creates TUN device `dev` in namespace `ns` (on a thread of its own that
/// enters the namespace: the rest of the process stays where it is), then
/// sets its MTU, queue length and address and brings it up.
fn open_tun(ns: &str, dev: &str, addr: &str, mtu: usize) -> Result<File, Error> {
    let nsf = File::open(format!("/run/netns/{ns}")).map_err(|source| Error::Netns {
        name: ns.to_string(),
        source,
    })?;
    let tun_err = |source| Error::Tun {
        ns: ns.to_string(),
        name: dev.to_string(),
        source,
    };
    let dev_owned = dev.to_string();
    let made = thread::spawn(move || -> io::Result<(File, String)> {
        sys::enter_netns(&nsf)?;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        let name = sys::tun_attach(&f, &dev_owned)?;
        Ok((f, name))
    })
    .join()
    .map_err(|_| tun_err(io::Error::other("thread panicked")))?;
    let (f, name) = made.map_err(tun_err)?;
    let mtu = mtu.to_string();
    // A long queue in front of the device: the kernel's TCP may burst
    // more than one read loop takes, and a drop there would be a loss
    // the model did not make.
    ip(&[
        "-n",
        ns,
        "link",
        "set",
        &name,
        "mtu",
        &mtu,
        "txqueuelen",
        "10000",
        "up",
    ])?;
    ip(&["-n", ns, "addr", "add", addr, "dev", &name])?;
    Ok(f)
}

/// A packet in the delay line, ordered by delivery time, then arrival.
struct Pending {
    at: Instant,
    seq: u64,
    data: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Reversed: BinaryHeap is a max-heap, the earliest goes first.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Forwards what `input` reads to `output` through `dir`, forever.
fn pump(
    name: &str,
    input: &File,
    output: &File,
    mut dir: Direction,
    stats: &Stats,
    mtu: usize,
    tick: Duration,
) -> io::Result<()> {
    sys::set_timer_slack(1000);
    let mut line = std::collections::BinaryHeap::<Pending>::new();
    let mut pool: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; mtu.max(576) + 64];
    let mut seq = 0u64;
    let (mut inp, mut out) = (input, output);
    loop {
        // Everything the device has now (a bounded batch, so that due
        // packets go out in time).
        for _ in 0..256 {
            let n = match inp.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            stats.packets.fetch_add(1, Ordering::Relaxed);
            stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
            match dir.admit(now, n) {
                Verdict::Deliver(at) => {
                    let mut data = pool.pop().unwrap_or_default();
                    data.clear();
                    data.extend_from_slice(&buf[..n]);
                    seq += 1;
                    line.push(Pending { at, seq, data });
                    stats
                        .max_backlog
                        .fetch_max(dir.backlog(now), Ordering::Relaxed);
                }
                Verdict::QueueFull => {
                    stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                }
                Verdict::Lost => {
                    stats.lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let now = Instant::now();
        while line.peek().is_some_and(|p| p.at <= now) {
            let Some(p) = line.pop() else { break };
            match out.write(&p.data) {
                Ok(_) => {
                    stats.delivered.fetch_add(1, Ordering::Relaxed);
                    stats
                        .delivered_bytes
                        .fetch_add(p.data.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.write_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(dir = name, error = %e, "write");
                }
            }
            pool.push(p.data);
        }
        match line.peek() {
            // Idle: until a packet comes.
            None => {
                sys::wait_readable(input, None)?;
            }
            // Busy: a tick, without waking for each packet that comes
            // meanwhile (they wait in the device's queue and are read in
            // one batch) or each one due (delivered in one batch): a
            // wake-up per packet cost more CPU than the packets themselves.
            Some(p) => {
                if p.at > Instant::now() {
                    thread::sleep(tick);
                }
            }
        }
    }
}

fn run(args: Args) -> Result<(), Error> {
    let a = Arc::new(open_tun(&args.ns_a, &args.dev, &args.addr_a, args.mtu)?);
    let b = Arc::new(open_tun(&args.ns_b, &args.dev, &args.addr_b, args.mtu)?);
    let (shape_ab, shape_ba) = (shape(&args, true), shape(&args, false));
    tracing::info!(?shape_ab, ?shape_ba, mtu = args.mtu, "link up");
    let stats = Arc::new([Stats::default(), Stats::default()]);
    let dirs = [
        ("a>b", a.clone(), b.clone(), shape_ab, args.seed, 0),
        ("b>a", b, a, shape_ba, args.seed.wrapping_add(1), 1),
    ];
    for (name, input, output, shape, seed, i) in dirs {
        let stats = stats.clone();
        let mtu = args.mtu;
        let tick = Duration::from_micros(args.tick_us);
        thread::Builder::new()
            .name(format!("wanlink {name}"))
            .spawn(move || {
                let dir = Direction::new(shape, seed);
                if let Err(source) = pump(name, &input, &output, dir, &stats[i], mtu, tick) {
                    let e = Error::Forward {
                        dir: name.to_string(),
                        source,
                    };
                    tracing::error!("{e}");
                    eprintln!("wanlink: {e}");
                    std::process::exit(1);
                }
            })
            .map_err(|source| Error::Forward {
                dir: name.to_string(),
                source,
            })?;
    }
    let print = || {
        let mut o = io::stdout().lock();
        let _ = writeln!(o, "{}", stats[0].line("a>b"));
        let _ = writeln!(o, "{}", stats[1].line("b>a"));
        let _ = o.flush();
    };
    {
        let mut o = io::stdout().lock();
        let _ = writeln!(
            o,
            "READY a={}/{} b={}/{}",
            args.ns_a, args.dev, args.ns_b, args.dev
        );
        let _ = o.flush();
    }
    for l in io::stdin().lock().lines() {
        let Ok(l) = l else { break };
        if l.trim() == "stats" {
            print();
        }
    }
    print();
    Ok(())
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(io::stderr)
        .init();
    if let Err(e) = run(Args::parse()) {
        eprintln!("wanlink: {e}");
        std::process::exit(1);
    }
}
