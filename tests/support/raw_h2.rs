//! A minimal hand-made HTTP/2 client (literal HPACK, no Huffman) for the
//! gRPC frontend: raw frames, gRPC calls whose headers the h2 crate would
//! not send, and connections that stop short (preface only).

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::anp::grpc_frame::FrameDecoder;
use protocol::anp::packet::{self, Frame};

pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const WINDOW_UPDATE: u8 = 0x8;
pub(crate) const CONTINUATION: u8 = 0x9;
pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const ACK: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;

/// A string literal as HPACK writes it without Huffman coding (lengths
/// below 127 only).
pub(crate) fn hpack_string(out: &mut Vec<u8>, s: &str) {
    assert!(s.len() < 127);
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// A header block of literals without indexing, new names (0x00).
pub(crate) fn hpack_literals(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in fields {
        b.push(0x00);
        hpack_string(&mut b, n);
        hpack_string(&mut b, v);
    }
    b
}

/// One frame's bytes.
pub(crate) fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The frames in a byte stream of HTTP/2 frames (the last one's payload
/// cut short if the stream is).
pub(crate) fn split_frames(mut b: &[u8]) -> Vec<RawFrame> {
    let mut frames = Vec::new();
    while b.len() >= 9 {
        let len = usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]);
        let end = (9 + len).min(b.len());
        frames.push(RawFrame {
            ty: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
            payload: b[9..end].to_vec(),
        });
        b = &b[end..];
    }
    frames
}

/// The frame types in a byte stream of HTTP/2 frames.
pub(crate) fn frame_types(b: &[u8]) -> Vec<u8> {
    split_frames(b).iter().map(|f| f.ty).collect()
}

/// Reads until the server closes `s`; what it sent and how long it took.
pub(crate) fn read_to_close(s: &mut impl Read, limit: Duration) -> (Vec<u8>, Duration) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return (got, t0.elapsed()),
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (got, t0.elapsed()),
            Err(e) => panic!(
                "not closed after {:?} ({e}); got {} bytes",
                t0.elapsed(),
                got.len()
            ),
        }
        assert!(t0.elapsed() < limit, "still open after {limit:?}");
    }
}

pub(crate) struct RawFrame {
    pub ty: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// A minimal HTTP/2 client connection over a blocking stream.
pub(crate) struct RawH2<S: Read + Write> {
    pub s: S,
    /// The server's HPACK state (h2 indexes what it sends).
    decoder: loona_hpack::Decoder<'static>,
    /// gRPC messages per stream.
    grpc: HashMap<u32, FrameDecoder>,
}

impl<S: Read + Write> RawH2<S> {
    pub(crate) fn start(mut s: S) -> Self {
        s.write_all(PREFACE).unwrap();
        let mut c = RawH2 {
            s,
            decoder: loona_hpack::Decoder::new(),
            grpc: HashMap::new(),
        };
        c.write_frame(SETTINGS, 0, 0, &[]);
        c
    }

    pub(crate) fn write_frame(&mut self, ty: u8, flags: u8, stream: u32, payload: &[u8]) {
        self.s
            .write_all(&frame(ty, flags, stream, payload))
            .unwrap();
        self.s.flush().unwrap();
    }

    pub(crate) fn read_frame(&mut self) -> RawFrame {
        let mut h = [0u8; 9];
        self.s
            .read_exact(&mut h)
            .expect("server closed the connection or timed out");
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let mut payload = vec![0u8; len];
        self.s.read_exact(&mut payload).expect("frame payload");
        RawFrame {
            ty: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
            payload,
        }
    }

    /// Opens a gRPC call on `stream` with these request headers.
    pub(crate) fn open(&mut self, stream: u32, fields: &[(&str, &str)]) {
        self.write_frame(HEADERS, END_HEADERS, stream, &hpack_literals(fields));
    }

    pub(crate) fn send_packet(&mut self, stream: u32, frame: Frame) {
        let msg = packet::encode(frame).to_vec();
        self.write_frame(DATA, 0, stream, &msg);
    }

    /// Reads frames, answering SETTINGS and PING, until `stream` yields a
    /// response header block or a gRPC message; fails on RST_STREAM for it
    /// and on a GOAWAY other than a graceful one that still covers it.
    pub(crate) fn next_event(&mut self, stream: u32) -> Event {
        loop {
            if let Some(d) = self.grpc.get_mut(&stream) {
                if let Some(m) = d.next_message().expect("gRPC framing") {
                    return Event::Packet(packet::decode(m).expect("a Packet"));
                }
            }
            let f = self.read_frame();
            match f.ty {
                SETTINGS if f.flags & ACK == 0 => self.write_frame(SETTINGS, ACK, 0, &[]),
                PING if f.flags & ACK == 0 => self.write_frame(PING, ACK, 0, &f.payload),
                // A graceful GOAWAY (NO_ERROR) that still covers `stream`:
                // its answer follows (h2 sends one before a refusal it
                // answers and then closes the connection).
                GOAWAY
                    if f.payload.get(4..8) == Some(&[0, 0, 0, 0])
                        && f.payload.get(..4).is_some_and(|l| {
                            u32::from_be_bytes([l[0], l[1], l[2], l[3]]) & 0x7fff_ffff >= stream
                        }) => {}
                GOAWAY => panic!(
                    "GOAWAY: error code {:?}, {:?}",
                    &f.payload.get(4..8),
                    String::from_utf8_lossy(f.payload.get(8..).unwrap_or(&[]))
                ),
                RST_STREAM if f.stream == stream => panic!(
                    "RST_STREAM on stream {stream}: error code {:?} (1 = PROTOCOL_ERROR)",
                    f.payload
                ),
                HEADERS => {
                    let mut block = f.payload.clone();
                    let mut flags = f.flags;
                    while flags & END_HEADERS == 0 {
                        let c = self.read_frame();
                        assert_eq!(c.ty, CONTINUATION);
                        block.extend(c.payload);
                        flags = c.flags;
                    }
                    let fields = self.decoder.decode(&block).expect("server HPACK");
                    let fields: Vec<(String, String)> = fields
                        .into_iter()
                        .map(|(n, v)| {
                            (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())
                        })
                        .collect();
                    if f.stream == stream {
                        return Event::Headers(fields);
                    }
                }
                DATA if f.stream == stream => {
                    self.grpc
                        .entry(stream)
                        .or_insert_with(|| FrameDecoder::new(1 << 20))
                        .push(Bytes::from(f.payload));
                }
                _ => {}
            }
        }
    }

    /// Opens a ProxyService/Proxy call on `stream` with `authority` and
    /// dials `target` through it (DIAL_REQ `random`): checks the gRPC
    /// response head and the DIAL_RSP, and returns its connectID.
    pub(crate) fn dial(
        &mut self,
        stream: u32,
        authority: &str,
        target: std::net::SocketAddr,
        random: i64,
    ) -> i64 {
        self.open(stream, &proxy_request(authority));
        self.send_packet(
            stream,
            packet::dial_request("tcp", &target.to_string(), random),
        );
        match self.next_event(stream) {
            Event::Headers(h) => {
                assert_eq!(header(&h, ":status"), Some("200"), "{h:?}");
                assert_eq!(
                    header(&h, "content-type"),
                    Some("application/grpc"),
                    "{h:?}"
                );
            }
            e => panic!("expected response headers, got {e:?}"),
        }
        match self.next_event(stream) {
            Event::Packet(Frame::DialResponse(r)) => {
                assert_eq!(r.random, random);
                assert!(r.error.is_empty(), "dial failed: {}", r.error);
                assert!(r.connect_id > 0, "{r:?}");
                r.connect_id
            }
            e => panic!("expected DIAL_RSP, got {e:?}"),
        }
    }

    /// Sends `text` on tunnel `connect_id` of `stream` and reads it back
    /// from the echo target.
    pub(crate) fn echo(&mut self, stream: u32, connect_id: i64, text: &str) {
        self.send_packet(
            stream,
            packet::data(connect_id, Bytes::from(text.to_string())),
        );
        let mut back = Vec::new();
        while back.len() < text.len() {
            match self.next_event(stream) {
                Event::Packet(Frame::Data(d)) => {
                    assert_eq!(d.connect_id, connect_id);
                    back.extend_from_slice(&d.data);
                }
                e => panic!("expected DATA, got {e:?}"),
            }
        }
        assert_eq!(back, text.as_bytes());
    }

    /// Closes tunnel `connect_id` of `stream` and waits for its CLOSE_RSP
    /// (DATA still in flight before it is skipped).
    pub(crate) fn close(&mut self, stream: u32, connect_id: i64) {
        self.send_packet(stream, packet::close_request(connect_id));
        loop {
            match self.next_event(stream) {
                Event::Packet(Frame::CloseResponse(r)) => {
                    assert_eq!(r.connect_id, connect_id);
                    break;
                }
                Event::Packet(Frame::Data(_)) => {}
                e => panic!("expected CLOSE_RSP, got {e:?}"),
            }
        }
    }
}

#[derive(Debug)]
pub(crate) enum Event {
    Headers(Vec<(String, String)>),
    Packet(Frame),
}

pub(crate) fn header<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

pub(crate) fn proxy_request(authority: &str) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/ProxyService/Proxy"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}
