//! What the client does over a bed: timed transfers through N tunnels at
//! once, dials timed to their first byte, and the wait for a quiet link
//! between cases. The client runs on a tokio runtime of its own on a
//! thread inside the cloud namespace (its TCP sockets are made there; the
//! unix sockets of the frontends are files), through the benches' shared
//! client (benches/shared/tunnel_client.rs).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use crate::client::{self, Entry};
use crate::support::wan::Wan;
use crate::target::{expected, Tally, CHUNK};

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// The target (edge) sends, the client (cloud) receives.
    Down,
    /// The client sends, the target receives.
    Up,
}

impl Direction {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Direction::Down => "download",
            Direction::Up => "upload",
        }
    }
}

/// How long a case runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// From the last tunnel open to the window (slow start, window growth).
    pub warmup: Duration,
    /// The measured window.
    pub window: Duration,
}

/// What one case delivered in its window.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Delivered {
    pub bytes: u64,
    pub secs: f64,
}

impl Delivered {
    /// Megabytes (10^6) a second.
    pub(crate) fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.secs.max(1e-9) / 1e6
    }
}

/// `f` run to its end on a runtime of its own inside the cloud namespace
/// (a future makes no socket before it is polled).
fn in_cloud<R: Send>(wan: &Wan, f: impl std::future::Future<Output = R> + Send) -> R {
    wan.cloud.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let r = rt.block_on(f);
        // Whatever is still open (the streams) closes here.
        rt.shutdown_timeout(Duration::from_millis(100));
        r
    })
}

/// `tunnels` streams through `entry` at once, each moving the pattern in
/// `dir` until the window ends; the bytes the receivers took (and
/// checked) within the window, after the warm-up.
pub(crate) fn transfer(
    wan: &Wan,
    entry: &Entry,
    tally: &Arc<Tally>,
    case: u64,
    tunnels: usize,
    dir: Direction,
    timing: Timing,
) -> Result<Delivered, String> {
    tally.case.store(case, Ordering::Relaxed);
    let corrupt_before = tally.corrupt.load(Ordering::Relaxed);
    let down = Arc::new(AtomicU64::new(0));
    let counter = down.clone();
    let up = tally.clone();
    let read = move || match dir {
        Direction::Down => down.load(Ordering::Relaxed),
        Direction::Up => up.up_bytes.load(Ordering::Relaxed),
    };
    let entry = entry.clone();
    let r = in_cloud(wan, async move {
        let opened = Arc::new(AtomicUsize::new(0));
        let mut streams: Vec<JoinHandle<Result<(), String>>> = (0..tunnels)
            .map(|_| {
                let (e, o, c) = (entry.clone(), opened.clone(), counter.clone());
                tokio::spawn(stream(e, dir, case, o, c))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        while opened.load(Ordering::Relaxed) < tunnels {
            failed(&mut streams).await?;
            if Instant::now() > deadline {
                return Err(format!(
                    "{} of {tunnels} tunnels open after 60 s",
                    opened.load(Ordering::Relaxed)
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(timing.warmup).await;
        failed(&mut streams).await?;
        let (b0, t0) = (read(), Instant::now());
        tokio::time::sleep(timing.window).await;
        let (b1, t1) = (read(), Instant::now());
        failed(&mut streams).await?;
        for s in &streams {
            s.abort();
        }
        Ok(Delivered {
            bytes: b1 - b0,
            secs: (t1 - t0).as_secs_f64(),
        })
    });
    let corrupt = tally.corrupt.load(Ordering::Relaxed) - corrupt_before;
    if corrupt > 0 {
        return Err(format!(
            "{corrupt} upload(s) differed from the pattern at the target"
        ));
    }
    r
}

/// The error of the first stream that ended (a stream ends only on an
/// error before the window closes).
async fn failed(streams: &mut [JoinHandle<Result<(), String>>]) -> Result<(), String> {
    let Some(i) = streams.iter().position(|s| s.is_finished()) else {
        return Ok(());
    };
    let why = match (&mut streams[i]).await {
        Ok(Err(e)) => e,
        Ok(Ok(())) => "it ended".to_string(),
        Err(e) => e.to_string(),
    };
    Err(format!("tunnel {i}: {why}"))
}

/// One tunnel of a transfer: opens, says what it is for, then receives
/// (checking the pattern and counting into `got`) or sends, until it is
/// aborted or fails.
async fn stream(
    entry: Entry,
    dir: Direction,
    case: u64,
    opened: Arc<AtomicUsize>,
    got: Arc<AtomicU64>,
) -> Result<(), String> {
    let mut c = client::open(&entry, None)
        .await
        .map_err(|e| format!("open: {e}"))?;
    let hello = match dir {
        Direction::Down => "DOWN\n".to_string(),
        Direction::Up => format!("UP {case}\n"),
    };
    let io = |e: std::io::Error| e.to_string();
    c.write_all(hello.as_bytes()).await.map_err(io)?;
    c.flush().await.map_err(io)?;
    opened.fetch_add(1, Ordering::Relaxed);
    let mut off = 0u64;
    match dir {
        Direction::Down => {
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = c.read(&mut buf).await.map_err(io)?;
                if n == 0 {
                    return Err(format!("the stream ended after {off} bytes"));
                }
                if buf[..n] != *expected(off, n) {
                    return Err(format!("bytes at {off} differ from the pattern"));
                }
                off += n as u64;
                got.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        Direction::Up => loop {
            c.write_all(expected(off, CHUNK)).await.map_err(io)?;
            off += CHUNK as u64;
        },
    }
}

/// Milliseconds of `n` dials through `entry`, one after another: to the
/// stream being open (CONNECT's 200, gRPC's DIAL_RSP, TCP's handshake)
/// and to the first byte echoed through it.
pub(crate) struct DialTimes {
    pub open_ms: Vec<f64>,
    pub first_byte_ms: Vec<f64>,
}

pub(crate) fn dials(wan: &Wan, entry: &Entry, n: usize) -> Result<DialTimes, String> {
    let entry = entry.clone();
    in_cloud(wan, async move {
        let mut t = DialTimes {
            open_ms: Vec::new(),
            first_byte_ms: Vec::new(),
        };
        let io = |e: std::io::Error| e.to_string();
        for _ in 0..n {
            let t0 = Instant::now();
            let mut c = client::open(&entry, None).await.map_err(io)?;
            let t1 = Instant::now();
            c.write_all(b"ECHO\nx").await.map_err(io)?;
            c.flush().await.map_err(io)?;
            let mut b = [0u8; 1];
            c.read_exact(&mut b).await.map_err(io)?;
            let t2 = Instant::now();
            t.open_ms.push((t1 - t0).as_secs_f64() * 1e3);
            t.first_byte_ms.push((t2 - t0).as_secs_f64() * 1e3);
            let _ = c.shutdown().await;
            drop(c);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(t)
    })
}

/// Whether a stream through `entry` carries an echo now (the system may
/// still be linking its agent).
pub(crate) fn echoes(wan: &Wan, entry: &Entry) -> Result<(), String> {
    dials(wan, entry, 1).map(drop)
}

/// Waits until the link carries (almost) nothing: what a case left in
/// flight (a tunnel's queued bytes, retransmissions) would slow the next.
/// False when it is still busy after `timeout`.
pub(crate) fn wait_quiet(wan: &mut Wan, timeout: Duration) -> bool {
    let interval = (wan.config.rtt() * 2).max(Duration::from_millis(200));
    let packets = |wan: &mut Wan| {
        let (a, b) = wan.stats();
        a.packets + b.packets
    };
    let deadline = Instant::now() + timeout;
    let mut last = packets(wan);
    loop {
        std::thread::sleep(interval);
        let now = packets(wan);
        // Keepalives and a few closing segments are quiet enough.
        if now - last <= 12 {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        last = now;
    }
}
