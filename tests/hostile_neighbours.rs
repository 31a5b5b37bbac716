//! Hostile neighbours (issue 27, item 1): a hostile agent (raw gRPC over
//! mutual TLS, with a valid client certificate and an agent ID of its own)
//! and a hostile gRPC caller send CLOSE_REQ, CLOSE_RSP, DATA, window
//! updates, DIAL_RSP and DIAL_CLS for every connection ID and random in
//! 0..5000, round after round, over several connections spread over the
//! server's workers, while victims echo through a healthy agent over both
//! frontends (HTTP CONNECT and gRPC ProxyService). Every victim byte is
//! checked: no packet of one agent or caller may touch another's tunnel.
//!
//! An impostor (any certificate of the CA, the healthy agent's ID and
//! address) is refused by the native server's default identity binding,
//! with a refusal that says what to change; victims are not disturbed.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::anp::packet::{self, Frame};
use support::raw_h2::*;
use support::tls_client::{client_tls, tls_connect};
use support::*;

/// Connection IDs (and dial randoms) every hostile round covers.
const IDS: i64 = 5000;

/// The packets of one hostile round for ids `0..IDS`.
fn round_packets(id: i64) -> [Frame; 6] {
    [
        packet::close_request(id),
        packet::close_response(id, "hostile"),
        packet::data(id, Bytes::from_static(b"HOSTILE!")),
        packet::window_update(id, 1 << 20),
        packet::dial_response(id, id, ""),
        packet::dial_close(id),
    ]
}

/// A raw HTTP/2 client that floods one gRPC stream with Packets, within
/// HTTP/2 flow control, and reads (and discards) what the server sends.
struct Flooder<S: Read + Write> {
    s: S,
    inbuf: Vec<u8>,
    conn_window: i64,
    stream_window: i64,
    closed: bool,
    /// Why the server ended the stream, when it did.
    why: String,
    /// The response head arrived.
    answered: bool,
    /// The server's SETTINGS_INITIAL_WINDOW_SIZE.
    initial: i64,
    hpack: loona_hpack::Decoder<'static>,
    /// The header fields the server answered with (head and trailers).
    fields: Vec<(String, String)>,
}

impl<S: Read + Write> Flooder<S> {
    /// Starts HTTP/2 on `s` (whose reads time out quickly) and opens
    /// stream 1 with `fields`; waits for the response head.
    fn start(s: S, fields: &[(&str, &str)]) -> Self {
        let mut f = Flooder {
            s,
            inbuf: Vec::new(),
            // HTTP/2's initial windows, until SETTINGS and WINDOW_UPDATE.
            conn_window: 65_535,
            stream_window: 65_535,
            closed: false,
            why: String::new(),
            answered: false,
            initial: 65_535,
            hpack: loona_hpack::Decoder::new(),
            fields: Vec::new(),
        };
        f.write(PREFACE);
        f.write(&frame(SETTINGS, 0, 0, &[]));
        f.write(&frame(HEADERS, END_HEADERS, 1, &hpack_literals(fields)));
        let deadline = Instant::now() + WAIT;
        while !f.answered && !f.closed {
            assert!(Instant::now() < deadline, "no response head");
            f.pump();
        }
        f
    }

    /// Reads what is there (the socket has a short read timeout) and
    /// answers SETTINGS and PING; counts WINDOW_UPDATEs.
    fn pump(&mut self) {
        let mut tmp = [0u8; 16384];
        match self.s.read(&mut tmp) {
            Ok(0) => {
                self.end("EOF".into());
                return;
            }
            Ok(n) => self.inbuf.extend_from_slice(&tmp[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => {
                self.end(format!("read: {e}"));
                return;
            }
        }
        while self.inbuf.len() >= 9 {
            let b = &self.inbuf;
            let len = usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]);
            if b.len() < 9 + len {
                break;
            }
            let (ty, flags) = (b[3], b[4]);
            let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff;
            let payload = b[9..9 + len].to_vec();
            self.inbuf.drain(..9 + len);
            match ty {
                SETTINGS if flags & ACK == 0 => {
                    for p in payload.chunks_exact(6) {
                        // SETTINGS_INITIAL_WINDOW_SIZE changes every
                        // stream's window by the difference.
                        if p[..2] == [0, 4] {
                            let v = i64::from(u32::from_be_bytes([p[2], p[3], p[4], p[5]]));
                            self.stream_window += v - self.initial;
                            self.initial = v;
                        }
                    }
                    self.write(&frame(SETTINGS, ACK, 0, &[]))
                }
                PING if flags & ACK == 0 => self.write(&frame(PING, ACK, 0, &payload)),
                WINDOW_UPDATE if payload.len() == 4 => {
                    let inc = i64::from(
                        u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                            & 0x7fff_ffff,
                    );
                    if stream == 0 {
                        self.conn_window += inc;
                    } else {
                        self.stream_window += inc;
                    }
                }
                // Give back what the server sends, as a real peer would.
                DATA if len > 0 => {
                    let inc = (len as u32).to_be_bytes();
                    self.write(&frame(WINDOW_UPDATE, 0, 0, &inc));
                    self.write(&frame(WINDOW_UPDATE, 0, stream, &inc));
                }
                GOAWAY => self.end(format!("GOAWAY {payload:?}")),
                RST_STREAM => self.end(format!("RST_STREAM {payload:?}")),
                HEADERS => {
                    // Small blocks only (no CONTINUATION from this server
                    // for a response head or trailers).
                    if let Ok(f) = self.hpack.decode(&payload) {
                        self.fields.extend(f.into_iter().map(|(n, v)| {
                            (
                                String::from_utf8_lossy(&n).into_owned(),
                                String::from_utf8_lossy(&v).into_owned(),
                            )
                        }));
                    }
                    self.answered = true;
                    if flags & END_STREAM != 0 {
                        let msg = header(&self.fields, "grpc-message")
                            .unwrap_or("")
                            .to_string();
                        self.end(format!("trailers: {msg}"));
                    }
                }
                _ => {}
            }
        }
    }

    /// The stream is over; the first reason stays (a GOAWAY read in the
    /// same batch as the refusal's trailers does not replace them).
    fn end(&mut self, why: String) {
        if self.closed {
            return;
        }
        if self.answered && !why.starts_with("trailers") {
            eprintln!("hostile stream ended: {why}");
        }
        self.closed = true;
        self.why = why;
    }

    fn write(&mut self, b: &[u8]) {
        if let Err(e) = self.s.write_all(b).and_then(|_| self.s.flush()) {
            self.end(format!("write: {e}"));
        }
    }

    /// Sends `msgs` (gRPC messages) on stream 1, packed into DATA frames,
    /// waiting for window as needed. `false` once the server closed.
    fn send_all(&mut self, msgs: &[Vec<u8>]) -> bool {
        let mut i = 0;
        while i < msgs.len() {
            let mut chunk = Vec::new();
            while i < msgs.len() && chunk.len() + msgs[i].len() <= 16_384 {
                chunk.extend_from_slice(&msgs[i]);
                i += 1;
            }
            let need = chunk.len() as i64;
            let deadline = Instant::now() + WAIT;
            while self.conn_window < need || self.stream_window < need {
                self.pump();
                if Instant::now() > deadline {
                    self.end("no HTTP/2 window for 20 s".into());
                }
                if self.closed {
                    return false;
                }
            }
            self.conn_window -= need;
            self.stream_window -= need;
            self.write(&frame(DATA, 0, 1, &chunk));
            if self.closed {
                return false;
            }
            self.pump();
        }
        !self.closed
    }
}

/// One hostile agent connection (agent ID `id`) that floods `rounds`
/// rounds; reconnects when the server closes it. Returns packets sent.
fn hostile_agent(certs: &std::path::Path, agent_port: SocketAddr, id: &str, rounds: usize) -> u64 {
    let msgs: Vec<Vec<u8>> = (0..IDS)
        .flat_map(round_packets)
        .map(|f| packet::encode(f).to_vec())
        .collect();
    let mut sent = 0u64;
    let mut done = 0;
    while done < rounds {
        let cfg = client_tls(
            &certs.join("ca.crt"),
            Some((&certs.join("agent.crt"), &certs.join("agent.key"))),
            b"h2",
            &[&rustls::version::TLS13],
            &[],
        );
        let Ok(tls) = tls_connect(agent_port, cfg) else {
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        tls.sock
            .set_read_timeout(Some(Duration::from_millis(2)))
            .unwrap();
        let identifiers = format!("host={id}");
        let mut f = Flooder::start(
            tls,
            &[
                (":method", "POST"),
                (":scheme", "https"),
                (":path", "/AgentService/Connect"),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("agentid", id),
                ("agentidentifiers", &identifiers),
            ],
        );
        assert!(!f.closed, "hostile agent {id} refused: {}", f.why);
        while done < rounds {
            if !f.send_all(&msgs) {
                break;
            }
            sent += msgs.len() as u64;
            done += 1;
        }
    }
    sent
}

/// A hostile gRPC caller: one ProxyService stream that sends CLOSE_REQ,
/// DATA and DIAL_CLS for ids `0..IDS` (the ids its neighbours' tunnels use
/// too), `rounds` times.
fn hostile_caller(grpc: SocketAddr, rounds: usize) -> u64 {
    let msgs: Vec<Vec<u8>> = (0..IDS)
        .flat_map(|id| {
            [
                packet::close_request(id),
                packet::data(id, Bytes::from_static(b"HOSTILE!")),
                packet::dial_close(id),
            ]
        })
        .map(|f| packet::encode(f).to_vec())
        .collect();
    let s = TcpStream::connect(grpc).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
    let mut f = Flooder::start(s, &proxy_request("localhost"));
    let mut sent = 0;
    for _ in 0..rounds {
        if !f.send_all(&msgs) {
            break;
        }
        sent += msgs.len() as u64;
    }
    sent
}

/// CONNECT tunnels to `target`, one after another until `stop`, each
/// echoing distinct bytes: the number of tunnels, or what went wrong.
fn connect_victim(
    proxy: SocketAddr,
    target: SocketAddr,
    seed: u64,
    stop: &AtomicBool,
) -> Result<u64, String> {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) || n < 3 {
        let (status, body, s) = connect_tcp(proxy, &target.to_string());
        if status != 200 {
            return Err(format!("tunnel {n}: CONNECT answered {status}: {body}"));
        }
        let data = random_bytes(48 * 1024 + (n as usize % 7) * 1000, seed + n);
        let back = echo_roundtrip(s, &data);
        if back != data {
            let at = back.iter().zip(&data).position(|(a, b)| a != b);
            return Err(format!("tunnel {n}: echo differs (first at {at:?})"));
        }
        n += 1;
    }
    Ok(n)
}

/// gRPC ProxyService tunnels to `target`: several on one stream at once,
/// each echoing distinct text, closed and dialled again until `stop`.
fn grpc_victim(
    grpc: SocketAddr,
    target: SocketAddr,
    seed: u64,
    stop: &AtomicBool,
) -> Result<u64, String> {
    let run = move || {
        let s = TcpStream::connect(grpc).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut h2 = RawH2::start(s);
        // RawH2 gives no window back: open it wide for the whole run
        // (SETTINGS_INITIAL_WINDOW_SIZE and the connection's window).
        h2.write_frame(SETTINGS, 0, 0, &[0, 4, 0x40, 0, 0, 0]);
        h2.write_frame(WINDOW_UPDATE, 0, 0, &0x4000_0000u32.to_be_bytes());
        let mut n = 0u64;
        let mut stream = 1;
        while !stop.load(Ordering::Relaxed) || n < 3 {
            let id = h2.dial(stream, "localhost", target, (seed * 1000 + n) as i64 + 1);
            for k in 0..4 {
                let text: String = random_bytes(2000, seed * 7919 + n * 13 + k)
                    .iter()
                    .map(|b| char::from(b'a' + b % 26))
                    .collect();
                h2.echo(stream, id, &text);
            }
            h2.close(stream, id);
            n += 1;
            stream += 2;
        }
        n
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

#[test]
fn hostile_packets_never_touch_a_neighbours_tunnel() {
    let env = Env::new();
    let server = Server::start(&env, &["--workers", "2", "--proxy-strategies", "destHost"]);
    let echo = echo_server("127.0.0.1");
    let healthy = Agent::start(
        &env,
        server.agent,
        "node1",
        "ipv4=127.0.0.1",
        &["--workers", "2"],
    );
    server.wait_agent_links(2.0, &healthy.proc);

    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut victims = Vec::new();
    for v in 0..3u64 {
        let stop1 = stop.clone();
        let (connect, target) = (server.connect, echo.addr);
        victims.push(thread::spawn(move || {
            let r = connect_victim(connect, target, 100 + v * 1000, &stop1);
            if let Err(e) = &r {
                eprintln!("CONNECT victim {v}: {e}");
            }
            r
        }));
        let stop = stop.clone();
        let grpc = server.grpc;
        victims.push(thread::spawn(move || {
            let r = grpc_victim(grpc, target, 7 + v, &stop);
            if let Err(e) = &r {
                eprintln!("gRPC victim {v}: {e}");
            }
            r
        }));
    }
    let packets = Arc::new(AtomicU64::new(0));
    let mut hostiles = Vec::new();
    for h in 0..4 {
        let (agent_port, packets) = (server.agent, packets.clone());
        let certs = env.certs();
        hostiles.push(thread::spawn(move || {
            let n = hostile_agent(&certs, agent_port, &format!("hostile{h}"), 4);
            packets.fetch_add(n, Ordering::Relaxed);
        }));
    }
    let (grpc, p) = (server.grpc, packets.clone());
    hostiles.push(thread::spawn(move || {
        p.fetch_add(hostile_caller(grpc, 4), Ordering::Relaxed);
    }));
    for h in hostiles {
        h.join().expect("hostile thread");
    }
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    let mut tunnels = 0;
    for v in victims {
        match v.join().expect("victim thread") {
            Ok(n) => tunnels += n,
            Err(e) => failures.push(e),
        }
    }
    eprintln!(
        "hostile packets: {}, victim tunnels: {tunnels}, {:?}",
        packets.load(Ordering::Relaxed),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "victims disturbed: {failures:#?}\nserver log:\n{}",
        server.proc.log_text()
    );
    assert!(packets.load(Ordering::Relaxed) >= 4 * 4 * 6 * IDS as u64);
}

/// An agent that claims `id` and `identifiers` with the shared test
/// certificate (CN edgetunnel-agent), again and again until `stop`,
/// flooding one round whenever it gets in: (times admitted, the last
/// refusal's gRPC message).
fn impostor(
    certs: &std::path::Path,
    agent_port: SocketAddr,
    id: &str,
    identifiers: &str,
    stop: &AtomicBool,
) -> (u64, String) {
    let msgs: Vec<Vec<u8>> = (0..IDS)
        .flat_map(round_packets)
        .map(|f| packet::encode(f).to_vec())
        .collect();
    let (mut admitted, mut refusal) = (0, String::new());
    while !stop.load(Ordering::Relaxed) {
        let cfg = client_tls(
            &certs.join("ca.crt"),
            Some((&certs.join("agent.crt"), &certs.join("agent.key"))),
            b"h2",
            &[&rustls::version::TLS13],
            &[],
        );
        let Ok(tls) = tls_connect(agent_port, cfg) else {
            continue;
        };
        tls.sock
            .set_read_timeout(Some(Duration::from_millis(2)))
            .unwrap();
        let mut f = Flooder::start(
            tls,
            &[
                (":method", "POST"),
                (":scheme", "https"),
                (":path", "/AgentService/Connect"),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("agentid", id),
                ("agentidentifiers", identifiers),
            ],
        );
        if f.closed {
            refusal = f.why.clone();
            thread::sleep(Duration::from_millis(20));
            continue;
        }
        admitted += 1;
        // In: flood, and sit on the dials routed here until told to stop.
        f.send_all(&msgs);
        while !f.closed && !stop.load(Ordering::Relaxed) {
            f.pump();
        }
    }
    (admitted, refusal)
}

/// `edgetunnel server` with the test certificates and nothing else about
/// agent identity: the native default.
fn default_server(env: &Env, extra: &[&str]) -> Server {
    let (c, g) = (env.path("connect-d.sock"), env.path("grpc-d.sock"));
    let mut cmd = Command::new(BIN);
    cmd.arg("server")
        .arg("--certs-dir")
        .arg(env.certs())
        .args([
            "--agent-bind",
            "127.0.0.1:0",
            "--connect-bind",
            "127.0.0.1:0",
        ])
        .args(["--grpc-bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
        .arg("--connect-uds")
        .arg(&c)
        .arg("--grpc-uds")
        .arg(&g)
        .args(extra);
    Server::spawn(env, cmd, 9000, c, g)
}

#[test]
fn an_impostor_is_refused_by_default_and_its_neighbours_undisturbed() {
    let env = Env::new();
    // IMPOSTOR_TEST_NO_BIND=1 shows the hole the default closes: the same
    // run with binding off (the default before issue 27).
    let off = std::env::var_os("IMPOSTOR_TEST_NO_BIND").is_some();
    let mut extra = vec!["--workers", "2", "--dial-timeout-secs", "3"];
    if off {
        extra.push("--bind-agent-identity=false");
    }
    let server = default_server(&env, &extra);
    let echo = echo_server("127.0.0.1");
    // The real node1: a certificate naming its ID and its address.
    let (cert, key) = env.issue(
        "node1",
        "node1",
        &["node1", "127.0.0.1"],
        &[rcgen::ExtendedKeyUsagePurpose::ClientAuth],
    );
    let healthy = Agent::start(
        &env,
        server.agent,
        "node1",
        "host=node1&ipv4=127.0.0.1",
        &["--workers", "2", "--cert", &cert, "--key", &key],
    );
    server.wait_agent_links(2.0, &healthy.proc);

    let stop = Arc::new(AtomicBool::new(false));
    let imp = {
        let (certs, port, stop) = (env.certs(), server.agent, stop.clone());
        thread::spawn(move || impostor(&certs, port, "node1", "ipv4=127.0.0.1", &stop))
    };
    // Let the impostor try before the victims start: until it was refused
    // once (or, with binding off, for a moment).
    if off {
        thread::sleep(Duration::from_millis(300));
    } else {
        wait_metric_at(
            server.admin,
            "edgetunnel_agent_identity_refused_total{reason=\"agent_id\"}",
            &server.proc,
            |v| v >= 1.0,
        );
    }
    let victims_stop = Arc::new(AtomicBool::new(false));
    let mut victims = Vec::new();
    for v in 0..2u64 {
        let (s, connect, target) = (victims_stop.clone(), server.connect, echo.addr);
        victims.push(thread::spawn(move || {
            connect_victim(connect, target, 500 + v, &s)
        }));
        let (s, grpc) = (victims_stop.clone(), server.grpc);
        victims.push(thread::spawn(move || grpc_victim(grpc, target, 50 + v, &s)));
    }
    thread::sleep(Duration::from_secs(2));
    victims_stop.store(true, Ordering::Relaxed);
    let results: Vec<_> = victims.into_iter().map(|v| v.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let (admitted, refusal) = imp.join().unwrap();
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "victims disturbed (impostor admitted {admitted} times): {failures:#?}"
    );
    assert_eq!(admitted, 0, "the impostor registered as node1");
    // The refusal says what is wrong and what to change.
    for want in [
        "node1",
        "edgetunnel-agent",
        "edgetunnel certs",
        "--bind-agent-identity=false",
    ] {
        assert!(refusal.contains(want), "{want:?} not in {refusal:?}");
    }
    assert!(server.metric("edgetunnel_agent_identity_refused_total{reason=\"agent_id\"}") >= 1.0);
}
