//! The target in the edge namespace and the byte pattern every transfer
//! carries.
//!
//! Each connection sends one line first: `DOWN` (the target sends the
//! pattern until the connection breaks), `UP <case>` (it reads, checks
//! the pattern and counts the bytes into [`Tally::up_bytes`] while
//! [`Tally::case`] is `<case>`) or `ECHO` (it echoes everything). Stream
//! byte `i` is `PATTERN[i % PERIOD]` in both directions, so a byte lost,
//! doubled or moved shows at the receiver for the price of a memcmp.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use crate::support::wan::Wan;

/// Bytes a read or a write moves at most.
pub(crate) const CHUNK: usize = 256 * 1024;
/// The pattern's period: a prime, so no buffer size divides it.
const PERIOD: usize = 65_521;

/// `len` (at most [`CHUNK`]) bytes of the pattern from stream offset
/// `offset`.
pub(crate) fn expected(offset: u64, len: usize) -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    let t = TABLE.get_or_init(|| {
        // xorshift64: bytes no text or zero run looks like.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let period: Vec<u8> = (0..PERIOD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        (0..PERIOD + CHUNK).map(|i| period[i % PERIOD]).collect()
    });
    let o = (offset % PERIOD as u64) as usize;
    &t[o..o + len]
}

/// What the target counts for the upload being measured.
#[derive(Default)]
pub(crate) struct Tally {
    /// The case whose uploads count.
    pub case: AtomicU64,
    /// Bytes received (and checked) by uploads of `case`.
    pub up_bytes: AtomicU64,
    /// Uploads whose bytes differed from the pattern.
    pub corrupt: AtomicU64,
}

/// The target: a listener on every address of the edge namespace.
/// Dropping it closes the listener and every connection it holds.
pub(crate) struct Target {
    pub port: u16,
    pub tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    /// The listener, to wake its accept on drop.
    listener: TcpListener,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
}

impl Target {
    pub(crate) fn start(wan: &Wan) -> Target {
        let l = wan
            .edge
            .run(|| TcpListener::bind(("0.0.0.0", 0)))
            .expect("bind the target");
        let port = l.local_addr().expect("its address").port();
        let t = Target {
            port,
            tally: Arc::default(),
            stop: Arc::default(),
            listener: l.try_clone().expect("a second handle on the listener"),
            conns: Arc::default(),
        };
        let (stop, conns, tally) = (t.stop.clone(), t.conns.clone(), t.tally.clone());
        thread::spawn(move || accept(l, &stop, &conns, &tally));
        t
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A listening socket shut down fails its accept at once.
        let _ = socket2::SockRef::from(&self.listener).shutdown(Shutdown::Both);
        for s in self.conns.lock().unwrap().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

type Conns = Mutex<HashMap<u64, TcpStream>>;

fn accept(l: TcpListener, stop: &AtomicBool, conns: &Arc<Conns>, tally: &Arc<Tally>) {
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok((s, _)) = l.accept() else {
            thread::sleep(Duration::from_millis(5));
            continue;
        };
        let _ = s.set_nodelay(true);
        next += 1;
        let id = next;
        if let Ok(c) = s.try_clone() {
            conns.lock().unwrap().insert(id, c);
        }
        let (conns, tally) = (conns.clone(), tally.clone());
        thread::spawn(move || {
            serve(s, &tally);
            conns.lock().unwrap().remove(&id);
        });
    }
}

fn serve(s: TcpStream, tally: &Tally) {
    let Ok(w) = s.try_clone() else { return };
    let mut r = BufReader::with_capacity(CHUNK, s);
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let mut it = line.split_whitespace();
    match (it.next(), it.next().and_then(|v| v.parse::<u64>().ok())) {
        (Some("DOWN"), _) => send_pattern(w),
        (Some("UP"), Some(case)) => receive_pattern(r, case, tally),
        (Some("ECHO"), _) => echo(r, w),
        _ => {}
    }
}

fn send_pattern(mut w: TcpStream) {
    let mut off = 0u64;
    while w.write_all(expected(off, CHUNK)).is_ok() {
        off += CHUNK as u64;
    }
}

fn receive_pattern(mut r: impl Read, case: u64, tally: &Tally) {
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if buf[..n] != *expected(off, n) {
            tally.corrupt.fetch_add(1, Ordering::Relaxed);
            return;
        }
        off += n as u64;
        if tally.case.load(Ordering::Relaxed) == case {
            tally.up_bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

fn echo(mut r: impl Read, mut w: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if w.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
