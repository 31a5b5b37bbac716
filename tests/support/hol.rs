//! A tunnel whose reader stalls beside a neighbour on the same agent link,
//! over the emulated WAN (tests/support/wan.rs): the pieces that
//! tests/wan_hol.rs (what the windows protect, from the metrics) and
//! benches/wan_hol.rs (the neighbour's rate against plain TCP) share.
//!
//! - [`Target`], in the edge namespace: each connection sends one line,
//!   `DOWN n TAG` (the target sends n bytes of [`byte_at`]) or `UP n TAG`
//!   (it reads n bytes, checks them, answers `OK`); the [`Flow`] named
//!   TAG counts the bytes, records the receiver's [`Rate`] and, for an
//!   upload, can stop reading ([`Flow::pause`]).
//! - [`Pair`]: our server in the cloud namespace (CONNECT on a unix
//!   socket) and our agent on the edge with one link and an admin
//!   listener, so both ends' `/metrics` can be read.
//! - [`Stalled`]: a tunnel that first moves bytes (its window grows), then
//!   its reader stops: the cloud-side client for a download, the edge
//!   target for an upload.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::netns::Netns;
use super::wan::{Wan, CLOUD_IP};
use super::{http_get, listen_addr, Agent, Binds, Env, Proc, Server};

pub(crate) const MIB: u64 = 1024 * 1024;
/// Payload queued for tunnels and not yet written (server or agent).
pub(crate) const BUFFERED: &str = "edgetunnel_buffered_bytes";
/// Growth held by the windows of open tunnels (server or agent).
pub(crate) const GROWTH: &str = "edgetunnel_tunnel_window_growth_bytes";
/// Bytes a stalled tunnel moves at most before its reader stops.
pub(crate) const WARM_UP_MAX: u64 = 256 * MIB;
/// How long a counter stands still before a stall counts as in place:
/// ten round trips of 100 ms.
pub(crate) const QUIET: Duration = Duration::from_secs(1);
/// A bound on every wait for progress (generous: the machine is shared).
pub(crate) const PATIENCE: Duration = Duration::from_secs(90);
/// Endless, for `DOWN` and `UP`.
pub(crate) const ENDLESS: u64 = u64::MAX;

/// Byte `i` of every stream (not periodic in any window size).
pub(crate) fn byte_at(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

fn fill(buf: &mut [u8], at: u64) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = byte_at(at + j as u64);
    }
}

/// The offset of the first byte of `buf` (stream offset `at`) that is
/// not the stream's.
fn first_wrong(buf: &[u8], at: u64) -> Option<u64> {
    buf.iter()
        .enumerate()
        .find(|&(j, &b)| b != byte_at(at + j as u64))
        .map(|(j, _)| at + j as u64)
}

/// What one transfer measured at its receiver.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Rate {
    /// Bytes a second over the second half of the bytes (slow start left
    /// out).
    pub steady: f64,
    /// Bytes a second from the first byte to the last.
    pub average: f64,
}

/// Times a transfer of `n` bytes at its receiver.
struct Clock {
    n: u64,
    first: Option<Instant>,
    half: Option<(Instant, u64)>,
}

impl Clock {
    fn new(n: u64) -> Clock {
        Clock {
            n,
            first: None,
            half: None,
        }
    }

    fn got(&mut self, total: u64) {
        let now = Instant::now();
        self.first.get_or_insert(now);
        if self.half.is_none() && total >= self.n / 2 {
            self.half = Some((now, total));
        }
    }

    fn rate(&self) -> Rate {
        let end = Instant::now();
        let first = self.first.unwrap_or(end);
        let (th, bh) = self.half.unwrap_or((first, 0));
        Rate {
            steady: (self.n - bh) as f64 / (end - th).as_secs_f64().max(1e-9),
            average: self.n as f64 / (end - first).as_secs_f64().max(1e-9),
        }
    }
}

/// Reads `n` bytes of the stream from offset `at`, checking each; their
/// rate. Panics on a wrong byte or an early end.
pub(crate) fn receive(s: &mut impl Read, n: u64, at: u64) -> Rate {
    let mut buf = vec![0u8; 256 * 1024];
    let mut clock = Clock::new(n);
    let mut got = 0u64;
    while got < n {
        let want = (n - got).min(buf.len() as u64) as usize;
        let k = s.read(&mut buf[..want]).expect("read the transfer");
        assert!(k > 0, "the stream ended at {got} of {n} bytes");
        if let Some(bad) = first_wrong(&buf[..k], at + got) {
            panic!("byte {bad} of the stream is wrong");
        }
        got += k as u64;
        clock.got(got);
    }
    clock.rate()
}

/// Writes `n` bytes of the stream from offset `at`, counting them in
/// `sent`; `false` when the stream failed first.
pub(crate) fn send(s: &mut impl Write, n: u64, at: u64, sent: &AtomicU64) -> bool {
    let mut buf = vec![0u8; 256 * 1024];
    let mut done = 0u64;
    while done < n {
        let k = (n - done).min(buf.len() as u64) as usize;
        fill(&mut buf[..k], at + done);
        if s.write_all(&buf[..k]).is_err() {
            return false;
        }
        done += k as u64;
        sent.fetch_add(k as u64, Ordering::Relaxed);
    }
    true
}

/// One tagged transfer at the target.
#[derive(Debug, Default)]
pub(crate) struct Flow {
    /// Bytes the target sent (DOWN) or read and checked (UP).
    pub moved: AtomicU64,
    paused: AtomicBool,
    /// An upload's first wrong byte, plus one (0: none).
    wrong: AtomicU64,
    /// An upload's rate, once all its bytes arrived.
    rate: Mutex<Option<Rate>>,
}

impl Flow {
    pub(crate) fn moved(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }

    /// An upload's target stops reading (or reads again).
    pub(crate) fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// An upload's first wrong byte, if any.
    pub(crate) fn wrong_byte(&self) -> Option<u64> {
        self.wrong.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Waits (at most [`PATIENCE`]) for an upload's last byte; its rate.
    pub(crate) fn wait_rate(&self) -> Rate {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(r) = *self.rate.lock().unwrap() {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "the upload stopped at {} bytes",
                self.moved()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The target, listening on every address of the edge namespace.
pub(crate) struct Target {
    pub port: u16,
    flows: Arc<Mutex<HashMap<String, Arc<Flow>>>>,
}

impl Target {
    pub(crate) fn start(ns: &Netns) -> Target {
        let l = ns
            .run(|| TcpListener::bind(("0.0.0.0", 0)))
            .expect("bind the target");
        let port = l.local_addr().unwrap().port();
        let flows: Arc<Mutex<HashMap<String, Arc<Flow>>>> = Arc::default();
        let table = flows.clone();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                let table = table.clone();
                thread::spawn(move || serve(s, &table));
            }
        });
        Target { port, flows }
    }

    /// The flow named `tag` (made on first use).
    pub(crate) fn flow(&self, tag: &str) -> Arc<Flow> {
        flow_in(&self.flows, tag)
    }
}

fn flow_in(table: &Mutex<HashMap<String, Arc<Flow>>>, tag: &str) -> Arc<Flow> {
    table
        .lock()
        .unwrap()
        .entry(tag.to_string())
        .or_default()
        .clone()
}

fn serve(s: std::net::TcpStream, table: &Mutex<HashMap<String, Arc<Flow>>>) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let mut w = s;
    let f: Vec<&str> = line.split_whitespace().collect();
    let (Some(&cmd), Some(n), Some(&tag)) = (
        f.first(),
        f.get(1).and_then(|v| v.parse::<u64>().ok()),
        f.get(2),
    ) else {
        return;
    };
    let flow = flow_in(table, tag);
    match cmd {
        "DOWN" if send(&mut w, n, 0, &flow.moved) => {
            let _ = w.shutdown(Shutdown::Write);
            // Until the client closes: the last bytes are out.
            let _ = r.read(&mut [0u8; 16]);
        }
        "UP" => {
            let mut buf = vec![0u8; 256 * 1024];
            let mut clock = Clock::new(n);
            let mut got = 0u64;
            while got < n {
                if flow.paused.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(5));
                    continue;
                }
                let want = (n - got).min(buf.len() as u64) as usize;
                let k = match r.read(&mut buf[..want]) {
                    Ok(0) | Err(_) => return,
                    Ok(k) => k,
                };
                if let Some(bad) = first_wrong(&buf[..k], got) {
                    let _ = flow.wrong.compare_exchange(
                        0,
                        bad + 1,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                }
                got += k as u64;
                clock.got(got);
                flow.moved.fetch_add(k as u64, Ordering::Relaxed);
            }
            *flow.rate.lock().unwrap() = Some(clock.rate());
            let _ = w.write_all(b"OK\n");
        }
        _ => {}
    }
}

/// A CONNECT to the target's `port` on the edge's loopback through the
/// server's unix socket, then `line`.
pub(crate) fn connect_uds(uds: &Path, port: u16, line: &str) -> UnixStream {
    let mut s = connect_tunnel(uds, port, PATIENCE);
    writeln!(s, "{line}").unwrap();
    s
}

/// A CONNECT to `port` on the edge's loopback through the server's unix
/// socket `uds`, answered 200; reads and writes wait at most `patience`.
pub(crate) fn connect_tunnel(uds: &Path, port: u16, patience: Duration) -> UnixStream {
    let mut s = UnixStream::connect(uds).expect("the CONNECT socket");
    s.set_read_timeout(Some(patience)).unwrap();
    s.set_write_timeout(Some(patience)).unwrap();
    let t = format!("127.0.0.1:{port}");
    write!(s, "CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "closed in the answer");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

/// Our server in the cloud namespace and our agent on the edge, one agent
/// link between them, both with /metrics.
pub(crate) struct Pair {
    pub server: Server,
    pub agent: Proc,
    pub agent_admin: SocketAddr,
    pub uds: PathBuf,
}

impl Pair {
    pub(crate) fn start(env: &Env, wan: &Wan, tag: &str) -> Pair {
        let uds = env.path(&format!("hol-connect-{tag}.sock"));
        let binds = Binds {
            agent: format!("{CLOUD_IP}:0"),
            connect_uds: Some(uds.clone()),
            grpc_uds: Some(env.path(&format!("hol-grpc-{tag}.sock"))),
            ..Binds::default()
        };
        let certs = env.certs().display().to_string();
        let (cmd, n, cu, gu) = Server::command(env, &["--certs-dir", &certs], &binds, &[]);
        let server = Server::spawn(env, wan.cloud.exec(&cmd), n, cu, gu);
        // One link: both tunnels share it (links would otherwise spread
        // them over the server's workers).
        let flags = ["--admin-bind", "127.0.0.1:0", "--max-links-per-server", "1"];
        let agent_cmd = Agent::command(env, server.agent, "node-1", "host=node-1", &flags);
        let agent = Proc::spawn(
            wan.edge.exec(&agent_cmd),
            env.path(&format!("hol-agent-{tag}.log")),
        );
        let agent_admin = listen_addr(&agent, "admin");
        agent.wait_line("CONNECTED");
        Pair {
            server,
            agent,
            agent_admin,
            uds,
        }
    }

    /// Where the end receiving `way` serves its /metrics: the server for
    /// a download, the agent for an upload (a [`Held::scrape`] of it may
    /// run on any thread).
    pub(crate) fn receiver<'a>(&self, wan: &'a Wan, way: Way) -> (&'a Netns, SocketAddr) {
        match way {
            Way::Download => (&wan.cloud, self.server.admin),
            Way::Upload => (&wan.edge, self.agent_admin),
        }
    }

    pub(crate) fn logs(&self) -> String {
        format!(
            "server:\n{}\nagent:\n{}",
            self.server.proc.log_text(),
            self.agent.log_text()
        )
    }
}

/// What one end holds: payload queued for tunnels and not yet written,
/// and the growth of its tunnels' windows (one scrape).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Held {
    pub buffered: u64,
    pub growth: u64,
}

impl Held {
    pub(crate) fn scrape(ns: &Netns, admin: SocketAddr) -> Held {
        let text = ns.run(move || http_get(admin, "/metrics").1);
        let value = |what: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(what)?.strip_prefix(' ')?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {what} in:\n{text}")) as u64
        };
        Held {
            buffered: value(BUFFERED),
            growth: value(GROWTH),
        }
    }
}

/// Waits until `state()` has not changed for [`QUIET`] (every buffer on a
/// stalled tunnel's way is full), at most [`PATIENCE`].
pub(crate) fn wait_still<T: PartialEq + std::fmt::Debug>(state: impl Fn() -> T, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    let mut last = (state(), Instant::now());
    while last.1.elapsed() < QUIET {
        assert!(
            Instant::now() < deadline,
            "{what} never stood still (last {:?})",
            last.0
        );
        thread::sleep(Duration::from_millis(20));
        let now = state();
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
}

/// Which way a tunnel's bytes go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Way {
    /// From the edge's target to the cloud's client.
    Download,
    /// From the cloud's client to the edge's target.
    Upload,
}

impl Way {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Way::Download => "download",
            Way::Upload => "upload",
        }
    }
}

/// A tunnel whose reader has stopped, its window grown first.
pub(crate) struct Stalled {
    pub way: Way,
    pub stream: UnixStream,
    pub flow: Arc<Flow>,
    /// Bytes the client wrote (an upload) or read (a download).
    pub client: Arc<AtomicU64>,
    /// What the receiving end held when the reader stopped (its kernel
    /// socket buffers still took bytes for a while after).
    pub at_stop: Held,
}

impl Stalled {
    /// Opens a tunnel through `pair` that moves bytes `way` until
    /// `grown()` says its window grew (or [`WARM_UP_MAX`] bytes moved);
    /// then its reader stops, and this returns once nothing moves any more
    /// (the bytes, and what the receiving end holds).
    pub(crate) fn start(
        wan: &Wan,
        pair: &Pair,
        target: &Target,
        way: Way,
        tag: &str,
        grown: &dyn Fn() -> bool,
    ) -> Stalled {
        let flow = target.flow(tag);
        let client = Arc::new(AtomicU64::new(0));
        let (ns, admin) = pair.receiver(wan, way);
        let held = || Held::scrape(ns, admin);
        let at_stop;
        let line = match way {
            Way::Download => format!("DOWN {ENDLESS} {tag}"),
            Way::Upload => format!("UP {ENDLESS} {tag}"),
        };
        let mut stream = connect_uds(&pair.uds, target.port, &line);
        match way {
            Way::Download => {
                let mut buf = vec![0u8; 256 * 1024];
                let mut got = 0u64;
                let mut checked_at = 0u64;
                while got < WARM_UP_MAX {
                    let k = stream.read(&mut buf).expect("read the stalling download");
                    assert!(k > 0, "the stalling download ended");
                    if let Some(bad) = first_wrong(&buf[..k], got) {
                        panic!("byte {bad} of the stalling download is wrong");
                    }
                    got += k as u64;
                    if got - checked_at >= 2 * MIB {
                        checked_at = got;
                        if grown() {
                            break;
                        }
                    }
                }
                client.store(got, Ordering::Relaxed);
                at_stop = held();
                // The client reads no more: the target's writes stop,
                // and the server's buffers and window.
                wait_still(|| (flow.moved(), held()), "the stalled download");
            }
            Way::Upload => {
                let mut w = stream.try_clone().unwrap();
                // Blocked for good once the stall is in place: it ends
                // when the stream is shut down.
                w.set_write_timeout(None).unwrap();
                let sent = client.clone();
                thread::spawn(move || send(&mut w, ENDLESS, 0, &sent));
                let deadline = Instant::now() + PATIENCE;
                while flow.moved() < WARM_UP_MAX && !grown() {
                    assert!(
                        Instant::now() < deadline,
                        "the stalling upload moved {} bytes",
                        flow.moved()
                    );
                    thread::sleep(Duration::from_millis(50));
                }
                flow.pause(true);
                at_stop = held();
                // The client's writes stop, and the agent's buffers and
                // window.
                let written = || client.load(Ordering::Relaxed);
                wait_still(|| (written(), held()), "the stalled upload");
            }
        }
        Stalled {
            way,
            stream,
            flow,
            client,
            at_stop,
        }
    }

    /// The reader goes on for `n` more bytes, which arrive whole.
    pub(crate) fn resume(&mut self, n: u64) {
        match self.way {
            Way::Download => {
                let at = self.client.load(Ordering::Relaxed);
                receive(&mut self.stream, n, at);
                self.client.fetch_add(n, Ordering::Relaxed);
            }
            Way::Upload => {
                let until = self.flow.moved() + n;
                self.flow.pause(false);
                let deadline = Instant::now() + PATIENCE;
                while self.flow.moved() < until {
                    assert!(
                        Instant::now() < deadline,
                        "the resumed upload stopped at {} bytes",
                        self.flow.moved()
                    );
                    thread::sleep(Duration::from_millis(10));
                }
                assert_eq!(self.flow.wrong_byte(), None, "the stalled upload's bytes");
            }
        }
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        // An upload's target reads again: the client's end is a
        // half-close, after which the agent still delivers what it holds.
        self.flow.pause(false);
        // Wakes an upload's writer blocked on the full socket.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
