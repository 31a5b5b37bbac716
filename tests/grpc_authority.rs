//! Clients whose `:authority` the h2 crate would reject are served: the
//! percent-encoded socket path grpc-go sends when kube-apiserver dials the
//! konnectivity socket through its custom dialer
//! (`%2Fetc%2Fkubernetes%2F...`), a raw path, an empty value. The server
//! drops such a value before h2 sees it (`src/protocol/h2_authority.rs`,
//! `src/engine/h2_server_io.rs`); without that, h2 answers the request with
//! RST_STREAM(PROTOCOL_ERROR).
//!
//! * a hand-made HTTP/2 client (literal HPACK, no Huffman) over the gRPC
//!   frontend's unix socket and TCP port: DIAL_REQ -> DIAL_RSP, bytes echoed
//!   through the agent, CLOSE_REQ -> CLOSE_RSP, on two streams of one
//!   connection;
//! * Python grpcio (C-core HPACK, Huffman and dynamic table) over the unix
//!   socket with its own percent-encoded `:authority`
//!   (`proxy_client.py --raw-authority`);
//! * the agent listener (mutual TLS): a hand-made agent Connect with an
//!   odd `:authority` is accepted.
//!
//! The venv comes from `tests/interop/setup.sh`, as for `tests/interop.rs`;
//! set `EDGETUNNEL_INTEROP_VENV` to reuse one.

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use edgetunnel::protocol::grpc_frame::FrameDecoder;
use edgetunnel::protocol::packet::{self, Frame};
use support::*;

/// What kube-apiserver's grpc-go sends for the default konnectivity socket.
const PERCENT: &str = "%2Fetc%2Fkubernetes%2Fkonnectivity-server%2Fkonnectivity-server.socket";
const ODD_AUTHORITIES: [&str; 3] = [PERCENT, "/tmp/x.sock", ""];

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// A string literal as HPACK writes it without Huffman coding (lengths
/// below 127 only).
fn hpack_string(out: &mut Vec<u8>, s: &str) {
    assert!(s.len() < 127);
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// A header block of literals without indexing, new names (0x00).
fn hpack_literals(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in fields {
        b.push(0x00);
        hpack_string(&mut b, n);
        hpack_string(&mut b, v);
    }
    b
}

struct RawFrame {
    ty: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// A minimal HTTP/2 client connection over a blocking stream.
struct RawH2<S: Read + Write> {
    s: S,
    /// The server's HPACK state (h2 indexes what it sends).
    decoder: loona_hpack::Decoder<'static>,
    /// gRPC messages per stream.
    grpc: HashMap<u32, FrameDecoder>,
}

impl<S: Read + Write> RawH2<S> {
    fn start(mut s: S) -> Self {
        s.write_all(PREFACE).unwrap();
        let mut c = RawH2 {
            s,
            decoder: loona_hpack::Decoder::new(),
            grpc: HashMap::new(),
        };
        c.write_frame(SETTINGS, 0, 0, &[]);
        c
    }

    fn write_frame(&mut self, ty: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        self.s.write_all(&f).unwrap();
        self.s.flush().unwrap();
    }

    fn read_frame(&mut self) -> RawFrame {
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
    fn open(&mut self, stream: u32, fields: &[(&str, &str)]) {
        self.write_frame(HEADERS, END_HEADERS, stream, &hpack_literals(fields));
    }

    fn send_packet(&mut self, stream: u32, frame: Frame) {
        let msg = packet::encode(frame).to_vec();
        self.write_frame(DATA, 0, stream, &msg);
    }

    /// Reads frames, answering SETTINGS and PING, until `stream` yields a
    /// response header block or a gRPC message; fails on RST_STREAM for it
    /// and on GOAWAY.
    fn next_event(&mut self, stream: u32) -> Event {
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
}

#[derive(Debug)]
enum Event {
    Headers(Vec<(String, String)>),
    Packet(Frame),
}

fn header<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn proxy_request(authority: &str) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/ProxyService/Proxy"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}

/// One ProxyService/Proxy call on `stream`: dial `target`, echo a few
/// bytes through it, close it.
fn proxy_call<S: Read + Write>(c: &mut RawH2<S>, stream: u32, authority: &str, target: SocketAddr) {
    c.open(stream, &proxy_request(authority));
    let random = 4200 + i64::from(stream);
    c.send_packet(
        stream,
        packet::dial_request("tcp", &target.to_string(), random),
    );
    match c.next_event(stream) {
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
    let connect_id = match c.next_event(stream) {
        Event::Packet(Frame::DialResponse(r)) => {
            assert_eq!(r.random, random);
            assert!(r.error.is_empty(), "dial failed: {}", r.error);
            assert!(r.connect_id > 0, "{r:?}");
            r.connect_id
        }
        e => panic!("expected DIAL_RSP, got {e:?}"),
    };
    let payload = format!("through {authority:?} on stream {stream}");
    c.send_packet(
        stream,
        packet::data(connect_id, Bytes::from(payload.clone())),
    );
    let mut echoed = Vec::new();
    while echoed.len() < payload.len() {
        match c.next_event(stream) {
            Event::Packet(Frame::Data(d)) => {
                assert_eq!(d.connect_id, connect_id);
                echoed.extend_from_slice(&d.data);
            }
            e => panic!("expected DATA, got {e:?}"),
        }
    }
    assert_eq!(echoed, payload.as_bytes());
    c.send_packet(stream, packet::close_request(connect_id));
    loop {
        match c.next_event(stream) {
            Event::Packet(Frame::CloseResponse(r)) => {
                assert_eq!(r.connect_id, connect_id);
                break;
            }
            Event::Packet(Frame::Data(_)) => {}
            e => panic!("expected CLOSE_RSP, got {e:?}"),
        }
    }
    // Half-close our side of the call.
    c.write_frame(DATA, END_STREAM, stream, &[]);
}

fn setup() -> (Env, Server, Agent, Echo) {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    (env, server, agent, echo)
}

#[test]
fn raw_h2_odd_authority_over_unix_socket() {
    let (_env, server, _agent, echo) = setup();
    for a in ODD_AUTHORITIES {
        let s = UnixStream::connect(&server.grpc_uds).expect("connect grpc uds");
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut c = RawH2::start(s);
        proxy_call(&mut c, 1, a, echo.addr);
        proxy_call(&mut c, 3, a, echo.addr);
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

#[test]
fn raw_h2_odd_authority_over_tcp() {
    let (_env, server, _agent, echo) = setup();
    for a in ODD_AUTHORITIES.into_iter().chain(["localhost:8090"]) {
        let s = TcpStream::connect(server.grpc).expect("connect grpc tcp");
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.set_nodelay(true).unwrap();
        let mut c = RawH2::start(s);
        proxy_call(&mut c, 1, a, echo.addr);
        proxy_call(&mut c, 3, a, echo.addr);
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

/// A hand-made agent: mutual TLS with the agent certificate, then an
/// `AgentService/Connect` call with an odd `:authority`.
#[test]
fn agent_connect_with_odd_authority_over_tls() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let files = edgetunnel::engine::tls::TlsFiles {
        cert: env.certs().join("agent.crt"),
        key: env.certs().join("agent.key"),
        ca: env.certs().join("ca.crt"),
    };
    let (cfg, _) = edgetunnel::engine::tls::client_config(&files).expect("client TLS config");
    for (i, a) in ODD_AUTHORITIES.into_iter().enumerate() {
        let tcp = TcpStream::connect(server.agent).expect("connect agent listener");
        tcp.set_read_timeout(Some(WAIT)).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = rustls::ClientConnection::new(Arc::clone(&cfg), name).unwrap();
        let mut c = RawH2::start(rustls::StreamOwned::new(tls, tcp));
        let id = format!("raw-agent-{i}");
        c.open(
            1,
            &[
                (":method", "POST"),
                (":scheme", "https"),
                (":path", "/AgentService/Connect"),
                (":authority", a),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("agentid", &id),
                ("agentidentifiers", "host=raw-node"),
            ],
        );
        match c.next_event(1) {
            Event::Headers(h) => {
                assert_eq!(header(&h, ":status"), Some("200"), "{h:?}");
                assert_eq!(header(&h, "grpc-status"), None, "refused: {h:?}");
            }
            e => panic!("expected response headers, got {e:?}"),
        }
        server.wait_metric("edgetunnel_agents_connected", 1.0);
        drop(c);
        server.wait_metric("edgetunnel_agents_connected", 0.0);
    }
}

/// grpc C-core over `unix:PATH` with its own `:authority` (the
/// percent-encoded path): several calls, multiplexed and one after the
/// other on one channel, so its HPACK dynamic table is in play.
#[test]
fn grpcio_raw_authority_over_unix_socket() {
    let (env, server, _agent, echo) = setup();
    for streams in ["per-connection", "shared"] {
        let args: Vec<String> = vec![
            "--target".into(),
            format!("unix:{}", server.grpc_uds.display()),
            "--raw-authority".into(),
            "--dial".into(),
            echo.addr.to_string(),
            "--payload-size".into(),
            (256 << 10).to_string(),
            "--connections".into(),
            "4".into(),
            "--streams".into(),
            streams.into(),
        ];
        let mut client = script(&env, "proxy_client.py", &args);
        let last = client.wait_line_any(&["OK", "FAIL"], Duration::from_secs(120));
        let status = client.wait_exit(Duration::from_secs(30));
        assert!(
            last.starts_with("OK") && status.is_some_and(|s| s.success()),
            "proxy_client.py --raw-authority failed: {last} ({status:?})\n{}\nserver log:\n{}",
            client.log_text(),
            server.proc.log_text()
        );
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
}
