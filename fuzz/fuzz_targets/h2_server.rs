//! The sans-I/O HTTP/2 server connection on an arbitrary client byte
//! stream (after a valid preface and SETTINGS), cut into chunks at
//! input-chosen points, with the caller's side driven as the runtime
//! drives it (requests answered, bodies taken, some streams released, the
//! output written in pieces): no panic; the request bodies, events and the
//! final error agree however the stream is cut; the caller's
//! leftover input stays under one frame; the output's length is what
//! `output_len` says.
//!
//! Input: `n` (1 byte), then `n % 16` chunk-size bytes, then the stream.
#![no_main]

use bytes::{Bytes, BytesMut};
use edgetunnel_protocol::h2_server::{Config, Event, Recv, ServerConn};
use libfuzzer_sys::fuzz_target;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

#[derive(Debug, PartialEq, Eq, Default)]
struct Seen {
    requests: Vec<(u32, String, Vec<(String, Vec<u8>)>)>,
    bodies: Vec<(u32, Vec<u8>)>,
    pongs: usize,
    error: Option<(u32, &'static str)>,
}

fn cfg() -> Config {
    Config {
        // Windows and a stream limit no input reaches: when the caller
        // takes data and releases streams depends on the cutting, and so
        // would errors that depend on them.
        stream_window: 16 << 20,
        conn_window: 64 << 20,
        max_frame: 16_384,
        max_streams: 100_000,
        max_header_list: 4_096,
        // As the agent listener: the metadata is part of what must not
        // depend on the cutting.
        keep_fields: true,
    }
}

fn drive(c: &mut ServerConn<()>, seen: &mut Seen) {
    while let Some(e) = c.poll_event() {
        match e {
            Event::Request { stream, head, .. } => {
                seen.requests.push((stream, head.path.clone(), head.fields.clone()));
                // Odd paths are answered and released at once.
                if head.path.len() % 2 == 1 {
                    let _ = c.send_head(stream, &[("grpc-status", "12")], true);
                    c.release(stream);
                } else {
                    let _ = c.send_head(stream, &[("content-type", "application/grpc")], false);
                    let _ = c.send_data(stream, Bytes::from(vec![7u8; 3_000]));
                }
            }
            Event::Wake(id) => loop {
                match c.take_data(id) {
                    Recv::Data(b) => {
                        // Used at once: its window goes back.
                        c.consumed(id, b.len());
                        match seen.bodies.iter_mut().find(|(s, _)| *s == id) {
                            Some((_, v)) => v.extend_from_slice(&b),
                            None => seen.bodies.push((id, b.to_vec())),
                        }
                    }
                    Recv::End | Recv::Reset(_) => {
                        let _ = c.send_trailers(id, &[("grpc-status", "0")]);
                        c.release(id);
                        break;
                    }
                    Recv::Pending => break,
                }
            },
            Event::Pong => seen.pongs += 1,
            Event::GoAway { .. } => {}
        }
    }
}

fn run(stream: &[u8], sizes: &[u8]) -> Seen {
    let mut c = ServerConn::<()>::new(cfg());
    let mut seen = Seen::default();
    let mut buf = BytesMut::new();
    let mut pos = 0;
    let mut i = 0;
    while pos < stream.len() {
        let b = sizes.get(i % sizes.len().max(1)).copied().unwrap_or(255);
        i += 1;
        let len = (1 + usize::from(b) * usize::from(b) / 4).min(stream.len() - pos);
        buf.extend_from_slice(&stream[pos..pos + len]);
        pos += len;
        let res = c.recv(&mut buf);
        // What the connection holds of received DATA stays within the
        // connection window it advertised (issue 39, finding 4).
        assert!(c.received_held() <= cfg().conn_window as usize);
        drive(&mut c, &mut seen);
        if let Err(e) = res {
            assert_eq!(c.error(), Some(&e));
            seen.error = Some((e.code, e.what));
            break;
        }
        assert!(buf.len() < 16_384 + 9 + 1, "leftover {}", buf.len());
        // Write part of the output.
        let total: usize = c.output().iter().map(|b| b.len()).sum();
        assert_eq!(total, c.output_len());
        let n = c.output_len().min(usize::from(b) * 100);
        c.wrote(n);
        drive(&mut c, &mut seen);
    }
    c.take_output();
    seen
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len());
    let (sizes, body) = rest.split_at(n);
    let mut stream = PREFACE.to_vec();
    stream.extend_from_slice(body);
    let whole = run(&stream, &[255, 255]);
    let cut = run(&stream, sizes);
    // Cutting changes when output is written, so only what the client
    // caused is compared (not the windows' timing).
    // Answers waiting unwritten (a flood past 1,024) depend on how much
    // was written when: a run that ended for them saw a prefix of the
    // other's requests.
    let unwritten = |e: &Option<(u32, &str)>| e.is_some_and(|(_, what)| what.starts_with("too many answers"));
    if unwritten(&cut.error) || unwritten(&whole.error) {
        let n = cut.requests.len().min(whole.requests.len());
        assert_eq!(cut.requests[..n], whole.requests[..n]);
        return;
    }
    // A reset drops data not yet taken, and that depends on the cutting:
    // of two bodies of a stream, one is a prefix of the other.
    assert_eq!(cut.requests, whole.requests);
    for (id, body) in &whole.bodies {
        let other = cut
            .bodies
            .iter()
            .find(|(s, _)| s == id)
            .map_or(&[][..], |(_, b)| b);
        let n = body.len().min(other.len());
        assert_eq!(body[..n], other[..n], "stream {id}");
    }
    // The connection's send window depends on how much was written when;
    // whether HEADERS on a finished stream finds it still known (a stream
    // error) or forgotten (a connection error) depends on when the caller
    // released it.
    let timing = |e: &Option<(u32, &str)>| {
        e.is_some_and(|(code, what)| code == 3 || what.starts_with("HEADERS on a closed stream"))
    };
    if !timing(&cut.error) && !timing(&whole.error) {
        assert_eq!(cut.error, whole.error);
    }
});
