//! Hostile HTTP/2 callers on the gRPC frontend (our own HTTP/2 server,
//! `protocol::h2_server` driven by `engine::h2_conn`): each loses its own
//! connection (GOAWAY with the RFC 9113 error code, then closed) or only
//! its own stream (RST_STREAM), while a tunnel opened before keeps echoing
//! through the real server and agent, and the server stays up. A caller
//! that sends PINGs without reading loses its connection once 1,024
//! answers wait for it, without growing the server's memory.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use protocol::h2_server::reason::{
    COMPRESSION_ERROR, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, PROTOCOL_ERROR,
};
use support::raw_h2::*;
use support::*;

/// The preface and an empty SETTINGS, then `rest`.
fn after_preface(rest: &[Vec<u8>]) -> Vec<u8> {
    let mut b = PREFACE.to_vec();
    b.extend(frame(SETTINGS, 0, 0, &[]));
    for f in rest {
        b.extend_from_slice(f);
    }
    b
}

/// Reads until the server closes; the GOAWAY error code it sent, if any.
fn goaway_then_close(s: &mut TcpStream) -> Option<u32> {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let (got, _) = read_to_close(s, WAIT);
    split_frames(&got)
        .iter()
        .rev()
        .find(|f| f.ty == GOAWAY && f.payload.len() >= 8)
        .map(|f| u32::from_be_bytes([f.payload[4], f.payload[5], f.payload[6], f.payload[7]]))
}

/// A tunnel through the frontend, kept open: dial the echo server, then
/// `echo` sends and reads back.
struct Tunnel {
    c: RawH2<TcpStream>,
    connect_id: i64,
}

impl Tunnel {
    fn open(server: &Server, target: std::net::SocketAddr, stream: u32) -> Tunnel {
        let s = TcpStream::connect(server.grpc).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut c = RawH2::start(s);
        let connect_id = c.dial(stream, "localhost", target, 99);
        Tunnel { c, connect_id }
    }

    fn echo(&mut self, stream: u32, text: &str) {
        self.c.echo(stream, self.connect_id, text);
    }
}

fn rss_kib(pid: u32) -> u64 {
    let v = proc_status(pid, "VmRSS");
    v.trim_end_matches("kB")
        .trim()
        .parse()
        .expect("VmRSS in kB")
}

#[test]
fn hostile_callers_lose_only_their_own_connection_or_stream() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let target = echo_server("127.0.0.1");
    let mut good = Tunnel::open(&server, target.addr, 1);
    good.echo(1, "before");

    let bad_hpack = frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]);
    let mut endless_block = vec![frame(HEADERS, 0, 1, &[0; 100])];
    endless_block.extend((0..80).map(|_| frame(CONTINUATION, 0, 1, &[0; 1024])));
    // A frame header announcing more than the 256 KiB we advertise.
    let mut oversized = frame(DATA, 0, 1, &[]);
    oversized[..3].copy_from_slice(&[0x04, 0x93, 0xe0]);
    let cases: Vec<(&str, Vec<u8>, Option<u32>)> = vec![
        (
            "HTTP/1.1 instead of the preface",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(PROTOCOL_ERROR),
        ),
        (
            "DATA on stream 0",
            after_preface(&[frame(DATA, 0, 0, b"x")]),
            Some(PROTOCOL_ERROR),
        ),
        (
            "undecodable HPACK",
            after_preface(&[bad_hpack]),
            Some(COMPRESSION_ERROR),
        ),
        (
            "a header block that never ends",
            after_preface(&endless_block),
            Some(ENHANCE_YOUR_CALM),
        ),
        (
            "a frame over the advertised size",
            after_preface(&[oversized]),
            Some(FRAME_SIZE_ERROR),
        ),
        (
            "a connection window past 2^31-1",
            after_preface(&[frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes())]),
            Some(FLOW_CONTROL_ERROR),
        ),
    ];
    for (what, bytes, want) in cases {
        let mut s = TcpStream::connect(server.grpc).unwrap();
        // The server may close before taking all of it.
        let _ = s.write_all(&bytes);
        assert_eq!(goaway_then_close(&mut s), want, "{what}");
        good.echo(1, &format!("after {what}"));
    }

    // A malformed request costs only its stream: the next one on the
    // same connection is served.
    let s = TcpStream::connect(server.grpc).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut c = RawH2::start(s);
    let mut bad = proxy_request("localhost");
    bad.push(("Upper-Case", "x"));
    c.write_frame(HEADERS, END_HEADERS, 1, &hpack_literals(&bad));
    loop {
        let f = c.read_frame();
        if f.ty == RST_STREAM {
            assert_eq!(f.stream, 1);
            assert_eq!(f.payload, PROTOCOL_ERROR.to_be_bytes());
            break;
        }
        assert_ne!(f.ty, GOAWAY, "the connection was closed");
    }
    let id = c.dial(3, "localhost", target.addr, 99);
    c.echo(3, id, "a good stream after a reset one");
    good.echo(1, "after a malformed request");

    // PINGs without reading: the server keeps reading (a caller that
    // stops reading until its writes drain must not stall it too), and
    // once 1,024 of its answers wait unwritten the caller is a flood: its
    // connection ends, and the server's memory does not grow with them.
    let pid = server.proc.child.id();
    let rss0 = rss_kib(pid);
    let floods = "edgetunnel_frontend_h2_floods_total{kind=\"control_frames\"}";
    assert_eq!(server.metric(floods), 0.0);
    let mut s = TcpStream::connect(server.grpc).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(&after_preface(&[])).unwrap();
    // 4,096 PINGs a round, 1,000 rounds at most (70 MB: far more than
    // the loopback socket buffers hold).
    let ping = frame(PING, 0, 0, b"12345678");
    let flood: Vec<u8> = (0..4096).flat_map(|_| ping.clone()).collect();
    let mut sent = 0usize;
    let mut stopped = None;
    'flood: for _ in 0..1000 {
        let mut at = 0;
        while at < flood.len() {
            match s.write(&flood[at..]) {
                Ok(n) => at += n,
                Err(e) => {
                    stopped = Some(e.kind());
                    sent += at;
                    break 'flood;
                }
            }
        }
        sent += at;
    }
    println!("PING flood stopped: {stopped:?}");
    assert!(
        matches!(
            stopped,
            Some(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe)
        ),
        "the flood ended with {stopped:?}, not a closed connection"
    );
    let rss1 = rss_kib(pid);
    println!("PING flood: {sent} bytes taken by the socket, server RSS {rss0} -> {rss1} KiB");
    assert!(
        sent < 1000 * flood.len(),
        "the server took {sent} bytes of PINGs from a caller that does not read"
    );
    assert!(
        rss1 < rss0 + 16 * 1024,
        "server RSS grew from {rss0} to {rss1} KiB"
    );
    server.wait_metric(floods, 1.0);
    good.echo(1, "after a PING flood");
    drop(s);
    good.echo(1, "after the flooder left");
}

/// Writes `bytes` from a thread (the server may stop reading and close
/// early) and returns the GOAWAY code the server sent before closing.
fn flood(server: &Server, bytes: Vec<u8>) -> Option<u32> {
    let mut s = TcpStream::connect(server.grpc).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&bytes);
    });
    let code = goaway_then_close(&mut s);
    writer.join().unwrap();
    code
}

/// HTTP/2 floods (issue 27 item 5): rapid reset (CVE-2023-44487: HEADERS
/// then RST_STREAM, 100,000 times on one connection) and empty
/// CONTINUATION frames without end. Each attacker gets GOAWAY
/// ENHANCE_YOUR_CALM and is counted; a tunnel on another connection keeps
/// echoing through the attacks.
#[test]
fn http2_floods_end_the_attackers_connection() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let target = echo_server("127.0.0.1");
    let mut good = Tunnel::open(&server, target.addr, 1);
    good.echo(1, "before");

    let head = hpack_literals(&proxy_request("localhost"));
    let mut rapid = after_preface(&[]);
    for k in 0..100_000u32 {
        let id = 1 + 2 * k;
        rapid.extend(frame(HEADERS, END_HEADERS, id, &head));
        rapid.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    assert_eq!(
        flood(&server, rapid),
        Some(ENHANCE_YOUR_CALM),
        "rapid reset"
    );
    good.echo(1, "after a rapid reset flood");
    assert_eq!(
        server.metric("edgetunnel_frontend_h2_floods_total{kind=\"rapid_reset\"}"),
        1.0
    );

    let mut cont = after_preface(&[frame(HEADERS, 0, 1, &head)]);
    for _ in 0..1_000_000 {
        cont.extend(frame(CONTINUATION, 0, 1, &[]));
    }
    assert_eq!(
        flood(&server, cont),
        Some(ENHANCE_YOUR_CALM),
        "empty CONTINUATION"
    );
    good.echo(1, "after a CONTINUATION flood");
    assert_eq!(
        server.metric("edgetunnel_frontend_h2_floods_total{kind=\"continuation\"}"),
        1.0
    );
}

/// What the server granted a caller, as its SETTINGS and WINDOW_UPDATE
/// frames say (read by a thread while the caller writes).
#[derive(Default)]
struct Granted {
    /// SETTINGS_INITIAL_WINDOW_SIZE, once the server's SETTINGS came.
    stream_initial: Option<i64>,
    conn: i64,
    streams: std::collections::HashMap<u32, i64>,
    /// RST_STREAM codes by stream, and a GOAWAY's code.
    resets: std::collections::HashMap<u32, u32>,
    goaway: Option<u32>,
}

/// A caller that stays within the windows it is given (issue 39 finding
/// 4): it opens `streams` gRPC calls and on each sends one message that
/// would be gathered whole (not a DATA packet, declared `declared` bytes
/// long), in 4 KiB DATA frames each followed by 28 KiB of an unknown frame
/// type (ignored, RFC 9113 5.5), so that every piece arrives in a read of
/// its own. It sends while the server grants window and returns how many
/// message bytes the server let in, and what it was told.
fn window_respecting_flood(
    server: &Server,
    streams: u32,
    declared: usize,
) -> (usize, std::sync::Arc<std::sync::Mutex<Granted>>) {
    use std::sync::{Arc, Mutex};
    let mut s = TcpStream::connect(server.grpc).unwrap();
    let mut r = s.try_clone().unwrap();
    let granted = Arc::new(Mutex::new(Granted {
        conn: 65_535,
        ..Granted::default()
    }));
    let g = granted.clone();
    std::thread::spawn(move || loop {
        let mut h = [0u8; 9];
        if r.read_exact(&mut h).is_err() {
            return;
        }
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let mut p = vec![0u8; len];
        if r.read_exact(&mut p).is_err() {
            return;
        }
        let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let word =
            |p: &[u8], at: usize| u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]]);
        let mut g = g.lock().unwrap();
        match h[3] {
            SETTINGS if h[4] & ACK == 0 => {
                for e in p.chunks_exact(6) {
                    if u16::from_be_bytes([e[0], e[1]]) == 0x4 {
                        g.stream_initial = Some(i64::from(word(e, 2)));
                    }
                }
                g.stream_initial.get_or_insert(65_535);
            }
            WINDOW_UPDATE if id == 0 => g.conn += i64::from(word(&p, 0) & 0x7fff_ffff),
            WINDOW_UPDATE => {
                *g.streams.entry(id).or_default() += i64::from(word(&p, 0) & 0x7fff_ffff)
            }
            RST_STREAM => {
                g.resets.insert(id, word(&p, 0));
            }
            GOAWAY => g.goaway = Some(word(&p, 4)),
            _ => {}
        }
    });
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&after_preface(&[frame(SETTINGS, ACK, 0, &[])]))
        .unwrap();
    let t0 = std::time::Instant::now();
    while granted.lock().unwrap().stream_initial.is_none() {
        assert!(t0.elapsed() < WAIT, "no SETTINGS from the server");
        std::thread::sleep(Duration::from_millis(10));
    }
    let junk = frame(0xfa, 0, 0, &[0x5a; 28 * 1024]);
    let mut let_in = 0usize;
    'streams: for k in 0..streams {
        let id = 2 * k + 1;
        {
            let mut g = granted.lock().unwrap();
            let initial = g.stream_initial.unwrap();
            *g.streams.entry(id).or_default() += initial;
        }
        s.write_all(&frame(
            HEADERS,
            END_HEADERS,
            id,
            &hpack_literals(&proxy_request("localhost")),
        ))
        .unwrap();
        // A DIAL_REQ-typed Packet header: gathered whole, never streamed.
        let mut message = vec![0u8];
        message.extend_from_slice(&(declared as u32).to_be_bytes());
        message.extend_from_slice(&[0x08, 0x00]);
        // All but its last byte: the server holds it, waiting for the rest.
        message.resize(5 + declared - 1, 0x42);
        let mut at = 0;
        let mut stalled = std::time::Instant::now();
        while at < message.len() {
            let n = {
                let mut g = granted.lock().unwrap();
                if g.goaway.is_some() || g.resets.contains_key(&id) {
                    break;
                }
                let room = g.conn.min(g.streams[&id]);
                let n = (room.max(0) as usize).min(4096).min(message.len() - at);
                if n > 0 {
                    g.conn -= n as i64;
                    *g.streams.get_mut(&id).unwrap() -= n as i64;
                }
                n
            };
            if n == 0 {
                if stalled.elapsed() > Duration::from_secs(2) {
                    // No window for 2 s: this stream is full; the next
                    // one tries while the connection has room.
                    if granted.lock().unwrap().conn <= 0 {
                        break 'streams;
                    }
                    continue 'streams;
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            stalled = std::time::Instant::now();
            let mut b = frame(DATA, 0, id, &message[at..at + n]);
            b.extend_from_slice(&junk);
            if s.write_all(&b).is_err() {
                break 'streams;
            }
            at += n;
            let_in += n;
        }
    }
    std::mem::forget(s);
    (let_in, granted)
}

/// Issue 39 finding 4: a caller's memory is bounded by the windows the
/// server advertised. Before, credit came back as soon as the gRPC decoder
/// took a chunk, so a message gathered whole (up to 4 MiB a stream, 1,024
/// streams) was bounded by nothing, and every 4 KiB piece kept a whole
/// 64 KiB read buffer alive: 40 streams held 164 MiB against an 8 MiB
/// connection window. Now received bytes are copied into their stream's
/// own buffer and the window comes back only as the decoder hands
/// messages on: the flood stops at the connection window.
#[test]
fn a_callers_memory_is_bounded_by_the_windows_it_was_given() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let target = echo_server("127.0.0.1");
    let mut good = Tunnel::open(&server, target.addr, 1);
    good.echo(1, "before");
    let pid = server.proc.child.id();
    let rss0 = rss_kib(pid);
    let (let_in, granted) = window_respecting_flood(&server, 12, 4 * 1024 * 1024 - 64);
    std::thread::sleep(Duration::from_millis(500));
    let rss1 = rss_kib(pid);
    let g = granted.lock().unwrap();
    println!(
        "window-respecting flood: {let_in} message bytes let in on {} streams (GOAWAY {:?}, resets {:?}), \
         server RSS {rss0} -> {rss1} KiB (+{} KiB)",
        g.streams.len(),
        g.goaway,
        g.resets,
        rss1.saturating_sub(rss0)
    );
    // The frontend advertises a connection window of 8 MiB (two streams'
    // worth) plus the 64 KiB the connection starts with.
    assert!(
        let_in <= 8 * 1024 * 1024 + 65_535,
        "the server let {let_in} bytes of unfinished messages in"
    );
    assert!(
        rss1 < rss0 + 16 * 1024,
        "server RSS grew from {rss0} to {rss1} KiB: more than the connection window and its overhead"
    );
    drop(g);
    good.echo(1, "after a window-respecting flood");
}
