//! Hostile HTTP/2 callers on the gRPC frontend (our own HTTP/2 server,
//! `protocol::h2_server` driven by `engine::h2_conn`): each loses its own
//! connection (GOAWAY with the RFC 9113 error code, then closed) or only
//! its own stream (RST_STREAM), while a tunnel opened before keeps echoing
//! through the real server and agent, and the server stays up. A caller
//! that sends PINGs without reading makes the server stop reading it, not
//! grow its memory.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use edgetunnel::protocol::h2_server::reason::{
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

    // PINGs without reading: the server stops reading this caller once
    // its answers pile up, so its memory does not grow with them.
    let pid = server.proc.child.id();
    let rss0 = rss_kib(pid);
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
            Some(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        ),
        "the flood ended with {stopped:?}, not a full socket"
    );
    let rss1 = rss_kib(pid);
    println!("PING flood: {sent} bytes taken by the socket, server RSS {rss0} -> {rss1} KiB");
    assert!(
        sent < 1000 * flood.len(),
        "the server read {sent} bytes of PINGs from a caller that does not read"
    );
    assert!(
        rss1 < rss0 + 16 * 1024,
        "server RSS grew from {rss0} to {rss1} KiB"
    );
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
