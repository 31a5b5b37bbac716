//! The measurements, each one async function that drives a running system
//! through its entries and returns figures. They never assert on timing:
//! they measure and report.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{self, Conn, Entry};
use crate::cpu::{Snapshot, Window};
use crate::target::CHUNK;

type Result<T> = std::io::Result<T>;

/// Size of a request and of its response in the latency and dial scenarios.
pub(crate) const MESSAGE: usize = 1024;

fn entry(entries: &[Entry], i: usize) -> &Entry {
    &entries[i % entries.len()]
}

/// What one bulk transfer measured.
pub(crate) struct Bulk {
    /// Payload bytes moved (all streams, one direction).
    pub bytes: u64,
    /// Gbit/s of `bytes`, from the first byte to the last.
    pub gbps: f64,
    /// CPU the system (and the machine) used over the same window, when it
    /// has processes of its own (`cpu` returned Some before and after).
    pub cpu: Option<Window>,
}

/// Reads a system's CPU so far: None when it has no process of its own.
pub(crate) type CpuProbe<'a> = &'a dyn Fn() -> Option<Snapshot>;

/// `total` bytes moved by `streams` parallel connections, client to target
/// (`upload`) or back, timed from the first byte to the last; `cpu` (the
/// system's CPU seconds so far) is sampled right before the first byte and
/// right after the last.
pub(crate) async fn bulk(
    entries: &[Entry],
    streams: usize,
    upload: bool,
    total: u64,
    cpu: CpuProbe<'_>,
) -> Result<Bulk> {
    let per = (total / streams as u64).max(1);
    let mut conns = Vec::with_capacity(streams);
    for i in 0..streams {
        conns.push(client::open(entry(entries, i), None).await?);
    }
    let cpu0 = cpu();
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|c| tokio::spawn(transfer(c, upload, per)))
        .collect();
    for t in tasks {
        t.await.map_err(std::io::Error::other)??;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu1 = cpu();
    let bytes = per * streams as u64;
    Ok(Bulk {
        bytes,
        gbps: bytes as f64 * 8.0 / secs / 1e9,
        cpu: cpu0.zip(cpu1).map(|(a, b)| Window::between(&a, &b, secs)),
    })
}

async fn transfer(mut c: Conn, upload: bool, len: u64) -> Result<()> {
    let mut head = [0u8; 9];
    head[0] = if upload { b'U' } else { b'D' };
    head[1..].copy_from_slice(&len.to_be_bytes());
    c.write_all(&head).await?;
    let mut buf = vec![0x5au8; CHUNK];
    if upload {
        let mut left = len;
        while left > 0 {
            let n = (left as usize).min(CHUNK);
            c.write_all(&buf[..n]).await?;
            left -= n as u64;
        }
        c.flush().await?;
        if c.read_u8().await? != b'k' {
            return Err(std::io::Error::other("upload not acknowledged"));
        }
    } else {
        c.flush().await?;
        let mut left = len;
        while left > 0 {
            let n = c.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::Error::other("download ended early"));
            }
            left = left.saturating_sub(n as u64);
        }
    }
    Ok(())
}

/// Latency figures of one run, milliseconds.
pub(crate) struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    /// Requests per second completed.
    pub rate: f64,
    /// The length of the run `rate` is counted over, seconds.
    pub secs: f64,
    /// (percentile, ms) points of the distribution.
    pub cdf: Vec<(f64, f64)>,
    /// CPU over the run (from the first connection's start to the last
    /// one's end), when the system has processes of its own.
    pub cpu: Option<Window>,
    /// This process's own CPU seconds over the same window: the clients.
    pub client_secs: Option<f64>,
}

const CDF_POINTS: [f64; 14] = [
    0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999, 100.0,
];

/// 1 KiB requests answered by 1 KiB over `conns` kept-alive connections,
/// for `dur`: open loop at `rate` requests per second in all (latency is
/// counted from each request's scheduled time, so a stall is not hidden),
/// or closed loop (saturation) when `rate` is None.
pub(crate) async fn latency(
    entries: &[Entry],
    conns: usize,
    rate: Option<f64>,
    dur: Duration,
    cpu: CpuProbe<'_>,
) -> Result<Latency> {
    let mut opened = Vec::with_capacity(conns);
    for i in 0..conns {
        let mut c = client::open(entry(entries, i), None).await?;
        c.write_all(b"E").await?;
        opened.push(c);
    }
    let begin = Instant::now() + Duration::from_millis(20);
    let interval = rate.map(|r| Duration::from_secs_f64(conns as f64 / r));
    let cpu0 = cpu();
    let client0 = own_cpu_ticks();
    let started = Instant::now();
    let tasks: Vec<_> = opened
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            tokio::spawn(async move {
                let req = [0x42u8; MESSAGE];
                let mut resp = [0u8; MESSAGE];
                let mut lat = Vec::new();
                let stagger = interval.map_or(Duration::ZERO, |iv| iv * i as u32 / conns as u32);
                let start = begin + stagger;
                let mut k: u32 = 0;
                loop {
                    let sched = match interval {
                        Some(iv) => start + iv * k,
                        None => Instant::now().max(start),
                    };
                    if sched >= begin + dur {
                        break;
                    }
                    // Busy past the scheduled time with the previous
                    // request: the system is late, count from the schedule.
                    // Idle: count from the send, so that the timer's own
                    // lateness (tokio's 1 ms wheel) is not charged.
                    let from = if sched > Instant::now() {
                        tokio::time::sleep_until(sched.into()).await;
                        Instant::now()
                    } else {
                        sched
                    };
                    c.write_all(&req).await?;
                    c.flush().await?;
                    c.read_exact(&mut resp).await?;
                    lat.push(from.elapsed().as_nanos() as u64);
                    k += 1;
                }
                Ok::<_, std::io::Error>(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(std::io::Error::other)??);
    }
    let cpu_window = cpu0
        .zip(cpu())
        .map(|(a, b)| Window::between(&a, &b, started.elapsed().as_secs_f64()));
    let client_secs = client0
        .zip(own_cpu_ticks())
        .map(|(a, b)| crate::cpu::ticks_to_seconds(b.saturating_sub(a), crate::cpu::clock_ticks()));
    if all.is_empty() {
        return Err(std::io::Error::other("no request completed"));
    }
    all.sort_unstable();
    let pct = |p: f64| {
        let idx = ((p / 100.0) * (all.len() - 1) as f64).round() as usize;
        all[idx.min(all.len() - 1)] as f64 / 1e6
    };
    Ok(Latency {
        p50: pct(50.0),
        p99: pct(99.0),
        p999: pct(99.9),
        rate: all.len() as f64 / dur.as_secs_f64(),
        secs: dur.as_secs_f64(),
        cdf: CDF_POINTS.iter().map(|&p| (p, pct(p))).collect(),
        cpu: cpu_window,
        client_secs,
    })
}

/// This process's own CPU clock ticks (all its threads).
fn own_cpu_ticks() -> Option<u64> {
    crate::cpu::process_ticks(std::process::id()).map(|t| t.own)
}

/// New connections per second (open, one 1 KiB round trip, close) by
/// `concurrency` clients for `dur`, and the p99 of one such cycle in ms.
pub(crate) async fn dial(
    entries: &[Entry],
    concurrency: usize,
    dur: Duration,
) -> Result<(f64, f64, u64)> {
    let deadline = Instant::now() + dur;
    let errors = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|w| {
            let entries = entries.to_vec();
            let errors = errors.clone();
            tokio::spawn(async move {
                let mut times = Vec::new();
                let mut i = w;
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    match cycle(entry(&entries, i), Close::Reset).await {
                        Ok(()) => times.push(t0.elapsed().as_nanos() as u64),
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                    i += concurrency;
                }
                times
            })
        })
        .collect();
    let start = Instant::now();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(std::io::Error::other)?);
    }
    let secs = start.elapsed().as_secs_f64();
    if all.is_empty() {
        return Err(std::io::Error::other("no connection completed"));
    }
    all.sort_unstable();
    let p99 = all[(all.len() - 1) * 99 / 100] as f64 / 1e6;
    Ok((all.len() as f64 / secs, p99, errors.load(Ordering::Relaxed)))
}

/// How the client ends a tunnel of [`cycle`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Close {
    /// Reset instead of FIN (SO_LINGER 0; a gRPC tunnel's connection is
    /// dropped without a CLOSE_REQ): the client keeps no TIME_WAIT, so a
    /// long run does not run out of ports, and the system sees an abrupt
    /// end.
    Reset,
    /// Shut the client's side down (a gRPC tunnel sends CLOSE_REQ) and
    /// read until the far end closes too: the orderly close, both ways.
    Orderly,
}

/// One tunnel: open, one 1 KiB round trip, close as `close` says.
pub(crate) async fn cycle(e: &Entry, close: Close) -> Result<()> {
    let mut c = client::open(e, None).await?;
    let mut msg = [0x42u8; MESSAGE + 1];
    msg[0] = b'E';
    c.write_all(&msg).await?;
    c.flush().await?;
    let mut resp = [0u8; MESSAGE];
    c.read_exact(&mut resp).await?;
    match close {
        Close::Reset => {
            if let Some(s) = c.tcp() {
                let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
            }
        }
        Close::Orderly => {
            c.shutdown().await?;
            match c.read(&mut resp).await {
                Ok(0) => {}
                // A TLS peer that closed without close_notify (ANP's TCP
                // frontend, now and then) has closed all the same.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
                Ok(_) => return Err(std::io::Error::other("bytes past the echo")),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Tunnels the soak drove through one system, counted as they end.
#[derive(Default)]
pub(crate) struct SoakCount {
    pub served: AtomicU64,
    pub failed: AtomicU64,
    /// What the first failure said.
    pub first_error: std::sync::Mutex<Option<String>>,
}

impl SoakCount {
    fn count(&self, result: Result<()>) -> bool {
        match result {
            Ok(()) => {
                self.served.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| e.to_string());
                }
                false
            }
        }
    }
}

/// The longest a soak tunnel may take, open to close; past it, it counts
/// as failed.
const SOAK_TUNNEL_TIMEOUT: Duration = Duration::from_secs(10);

/// The soak's load on one system until `stop` is set: `loops` clients that
/// each open a tunnel, echo 1 KiB and close it in order, one after
/// another; beside them bursts of `burst` tunnels opened at once, each
/// echoing 1 KiB and ended by a reset, `pause` apart. Every tunnel ends in
/// `count` (a failure after an error or [`SOAK_TUNNEL_TIMEOUT`]).
pub(crate) async fn soak(
    entries: Vec<Entry>,
    loops: usize,
    burst: usize,
    pause: Duration,
    stop: Arc<AtomicBool>,
    count: Arc<SoakCount>,
) {
    let entries = Arc::new(entries);
    let tunnel = move |i: usize, close: Close| {
        let (entries, count) = (entries.clone(), count.clone());
        async move {
            let result =
                tokio::time::timeout(SOAK_TUNNEL_TIMEOUT, cycle(entry(&entries, i), close))
                    .await
                    .unwrap_or_else(|_| Err(std::io::Error::other("tunnel timed out")));
            count.count(result)
        }
    };
    let mut tasks = Vec::new();
    for w in 0..loops {
        let (stop, tunnel) = (stop.clone(), tunnel.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                if !tunnel(i, Close::Orderly).await {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                i += loops;
            }
        }));
    }
    tasks.push(tokio::spawn(async move {
        let mut round = 0;
        while !stop.load(Ordering::Relaxed) {
            let wave: Vec<_> = (0..burst)
                .map(|k| tokio::spawn(tunnel(round * burst + k, Close::Reset)))
                .collect();
            futures::future::join_all(wave).await;
            tokio::time::sleep(pause).await;
            round += 1;
        }
    }));
    futures::future::join_all(tasks).await;
}

/// Opens `n` connections that stay idle (each confirmed end to end by the
/// target's `k`), `parallel` at a time; the caller holds them while it
/// measures memory. Client sockets spread over several loopback source
/// addresses so that 100,000 of them fit in the ephemeral port range.
pub(crate) async fn hold_idle(entries: &[Entry], n: usize, parallel: usize) -> Result<Vec<Conn>> {
    let opens = futures::stream::iter(0..n)
        .map(|i| {
            let e = entry(entries, i).clone();
            async move {
                let src = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % 8) as u8));
                let mut c = client::open(&e, Some(src)).await?;
                c.write_all(b"I").await?;
                c.flush().await?;
                if c.read_u8().await? != b'k' {
                    return Err(std::io::Error::other("idle connection not confirmed"));
                }
                Ok::<_, std::io::Error>(c)
            }
        })
        .buffer_unordered(parallel);
    futures::pin_mut!(opens);
    let mut held = Vec::with_capacity(n);
    while let Some(c) = opens.next().await {
        held.push(c?);
    }
    Ok(held)
}

/// Head-of-line isolation: two connections through the same system, both
/// downloading; then the first one's reader stops. Returns the second one's
/// Gbit/s before and during the stall.
pub(crate) async fn hol(entries: &[Entry], phase: Duration) -> Result<(f64, f64)> {
    let mut stalled = client::open(entry(entries, 0), None).await?;
    let mut healthy = client::open(entry(entries, 1), None).await?;
    stalled.write_all(b"S").await?;
    stalled.flush().await?;
    healthy.write_all(b"S").await?;
    healthy.flush().await?;
    let stall = Arc::new(AtomicBool::new(false));
    let healthy_bytes = Arc::new(AtomicU64::new(0));
    let s_task = {
        let stall = stall.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            while !stall.load(Ordering::Relaxed) {
                if matches!(stalled.read(&mut buf).await, Ok(0) | Err(_)) {
                    break;
                }
            }
            // Hold the connection without reading.
            std::future::pending::<()>().await;
        })
    };
    let h_task = {
        let count = healthy_bytes.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match healthy.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        count.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    tokio::time::sleep(phase / 2).await;
    let before = gbps_over(&healthy_bytes, phase).await;
    stall.store(true, Ordering::Relaxed);
    // Let the stalled connection's buffers fill before measuring.
    tokio::time::sleep(phase / 2).await;
    let during = gbps_over(&healthy_bytes, phase).await;
    s_task.abort();
    h_task.abort();
    Ok((before, during))
}

/// Gbit/s that `count` grows by over `d`.
async fn gbps_over(count: &AtomicU64, d: Duration) -> f64 {
    let b0 = count.load(Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(d).await;
    (count.load(Ordering::Relaxed) - b0) as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9
}
