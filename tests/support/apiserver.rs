//! A small HTTPS server standing in for kube-apiserver in the proxy tests:
//! it echoes what it received as JSON, streams chunked watch events,
//! accepts upgrades (then echoes bytes), and answers `/version` (kubectl
//! asks for it at start). Thread per connection; written independently of
//! the proxy's own HTTP code so that it checks it rather than mirrors it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

pub(crate) struct FakeApiServer {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    /// Set while a watch stream has sent its first event and waits.
    pub watch_gate: Arc<AtomicBool>,
    /// What happened, in order: `"METHOD /path"` per request,
    /// `"closed /path"` when a held request (`.../hold`, `.../quiet`) saw
    /// the proxy close its connection (HTTP/1.1) or reset its stream
    /// (HTTP/2), `"h2-conn"` per HTTP/2 connection accepted, `"body N
    /// /upload/N"` when an `/upload/N` request's first N body bytes came.
    pub events: Events,
}

/// The server's event log (see [`FakeApiServer::events`]).
pub(crate) type Events = Arc<Mutex<Vec<(Instant, String)>>>;

fn note(events: &Events, what: String) {
    events.lock().unwrap().push((Instant::now(), what));
}

impl FakeApiServer {
    /// How many events equal `what`.
    pub(crate) fn count(&self, what: &str) -> usize {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| e == what)
            .count()
    }

    /// Waits until `what` was seen `n` times; the time of the n-th.
    pub(crate) fn wait_count(&self, what: &str, n: usize, timeout: Duration) -> Option<Instant> {
        let end = Instant::now() + timeout;
        loop {
            let at = self
                .events
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, e)| e == what)
                .nth(n.saturating_sub(1))
                .map(|(t, _)| *t);
            if at.is_some() {
                return at;
            }
            if Instant::now() > end {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The certificates of a PEM file.
pub(crate) fn load_certs(p: &Path) -> Vec<CertificateDer<'static>> {
    let pem = std::fs::read(p).expect("read cert");
    rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<_, _>>()
        .expect("certs")
}

/// The private key of a PEM file.
pub(crate) fn load_key(p: &Path) -> PrivateKeyDer<'static> {
    let pem = std::fs::read(p).expect("read key");
    rustls_pemfile::private_key(&mut &pem[..])
        .expect("key")
        .expect("a key")
}

/// Starts the server with `certs/server.crt` and `server.key`, asking for
/// (not requiring) a client certificate signed by `certs/ca.crt`.
pub(crate) fn start(certs: &Path) -> FakeApiServer {
    start_at(certs, "127.0.0.1:0")
}

/// [`start`] listening on `bind` (e.g. a non-loopback address).
pub(crate) fn start_at(certs: &Path, bind: &str) -> FakeApiServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(&certs.join("ca.crt")) {
        roots.add(c).expect("root");
    }
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .expect("verifier");
    let mut cfg = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            load_certs(&certs.join("server.crt")),
            load_key(&certs.join("server.key")),
        )
        .expect("server config");
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let cfg = Arc::new(cfg);
    let listener = TcpListener::bind(bind).expect("bind");
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let watch_gate = Arc::new(AtomicBool::new(false));
    let events = Events::default();
    let (r, g, ev) = (requests.clone(), watch_gate.clone(), events.clone());
    thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { continue };
            let cfg = cfg.clone();
            let (r, g, ev) = (r.clone(), g.clone(), ev.clone());
            thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let Ok(conn) = rustls::ServerConnection::new(cfg) else {
                    return;
                };
                let tls = rustls::StreamOwned::new(conn, s);
                serve_conn(tls, &r, &g, &ev);
            });
        }
    });
    FakeApiServer {
        addr,
        requests,
        watch_gate,
        events,
    }
}

type Tls = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;
/// Method, target and headers (names lower-cased) of a request head.
pub(crate) type Head = (String, String, Vec<(String, String)>);

/// A served connection: TLS or plain.
trait Conn: Read + Write {
    fn client_cert(&self) -> bool;
    /// The common name of the client certificate presented, if any.
    fn client_cn(&self) -> Option<String>;
    fn close_notify(&mut self);
    fn set_read_timeout(&self, t: Duration);
    /// Fixes the socket's receive buffer at [`SMALL_WINDOW`] (no growth).
    fn small_window(&self);
}

/// The receive buffer of a connection that got an `/upload/N` request.
const SMALL_WINDOW: usize = 64 * 1024;

/// The subject common name of a DER certificate.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

impl Conn for Tls {
    fn client_cert(&self) -> bool {
        self.conn.peer_certificates().is_some_and(|c| !c.is_empty())
    }
    fn client_cn(&self) -> Option<String> {
        common_name(self.conn.peer_certificates()?.first()?)
    }
    fn close_notify(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush();
    }
    fn set_read_timeout(&self, t: Duration) {
        let _ = self.sock.set_read_timeout(Some(t));
    }
    fn small_window(&self) {
        let _ = socket2::SockRef::from(&self.sock).set_recv_buffer_size(SMALL_WINDOW);
    }
}

impl Conn for TcpStream {
    fn client_cert(&self) -> bool {
        false
    }
    fn client_cn(&self) -> Option<String> {
        None
    }
    fn close_notify(&mut self) {}
    fn set_read_timeout(&self, t: Duration) {
        let _ = TcpStream::set_read_timeout(self, Some(t));
    }
    fn small_window(&self) {
        let _ = socket2::SockRef::from(self).set_recv_buffer_size(SMALL_WINDOW);
    }
}

/// Starts the same server without TLS (for `http://` upstreams).
pub(crate) fn start_plain() -> FakeApiServer {
    start_plain_at("127.0.0.1:0")
}

/// [`start_plain`] listening on `bind`.
pub(crate) fn start_plain_at(bind: &str) -> FakeApiServer {
    let listener = TcpListener::bind(bind).expect("bind");
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let watch_gate = Arc::new(AtomicBool::new(false));
    let events = Events::default();
    let (r, g, ev) = (requests.clone(), watch_gate.clone(), events.clone());
    thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { continue };
            let (r, g, ev) = (r.clone(), g.clone(), ev.clone());
            thread::spawn(move || {
                let _ = s.set_nodelay(true);
                serve_conn(s, &r, &g, &ev);
            });
        }
    });
    FakeApiServer {
        addr,
        requests,
        watch_gate,
        events,
    }
}

struct Req {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// Reads one HTTP/1.1 request head; `None` at EOF or on garbage.
pub(crate) fn read_head<R: BufRead>(r: &mut R) -> Option<Head> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.trim_end().splitn(3, ' ');
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':')?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    Some((method, target, headers))
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

fn read_body<S: Conn>(r: &mut BufReader<S>, headers: &[(String, String)]) -> Option<Vec<u8>> {
    read_body_marked(r, headers, usize::MAX, &mut || {})
}

/// Reads `n` more body bytes onto `body`, calling `at_mark` as soon as the
/// body holds `mark` bytes (before reading past them); the bytes up to the
/// mark are read slowly.
fn read_part<S: Conn>(
    r: &mut BufReader<S>,
    body: &mut Vec<u8>,
    n: usize,
    mark: usize,
    at_mark: &mut dyn FnMut(),
) -> Option<()> {
    let start = body.len();
    body.resize(start + n, 0);
    let mut at = start;
    if start < mark && mark <= start + n {
        // Slowly up to the mark, so that the sender's socket stays full.
        while at < mark {
            let k = (mark - at).min(SLOW_READ);
            r.read_exact(&mut body[at..at + k]).ok()?;
            at += k;
            thread::sleep(Duration::from_millis(1));
        }
        at_mark();
    }
    r.read_exact(&mut body[at..]).ok()
}

/// Bytes read per millisecond up to an `/upload/N` mark (about 16 MB/s).
const SLOW_READ: usize = 16 * 1024;

/// [`read_body`], calling `at_mark` once `mark` payload bytes arrived.
fn read_body_marked<S: Conn>(
    r: &mut BufReader<S>,
    headers: &[(String, String)],
    mark: usize,
    at_mark: &mut dyn FnMut(),
) -> Option<Vec<u8>> {
    if header(headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        let mut body = Vec::new();
        loop {
            let mut line = String::new();
            r.read_line(&mut line).ok()?;
            let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
            if size == 0 {
                loop {
                    let mut t = String::new();
                    r.read_line(&mut t).ok()?;
                    if t.trim().is_empty() {
                        return Some(body);
                    }
                }
            }
            read_part(r, &mut body, size, mark, at_mark)?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).ok()?;
        }
    }
    let n: usize = header(headers, "content-length").map_or(Some(0), |v| v.parse().ok())?;
    let mut body = Vec::with_capacity(n);
    read_part(r, &mut body, n, mark, at_mark)?;
    Some(body)
}

/// FNV-1a, enough to compare bodies.
pub(crate) fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// What the upstream saw, as JSON: method, target, sorted headers, body
/// length and hash, whether a client certificate was presented and its
/// common name (`client_cn`, null without one).
fn echo_json(req: &Req, client_cert: bool, client_cn: Option<&str>) -> String {
    let mut headers = req.headers.clone();
    headers.sort();
    let hs: Vec<String> = headers
        .iter()
        .map(|(n, v)| format!("[{},{}]", json_str(n), json_str(v)))
        .collect();
    format!(
        "{{\"method\":{},\"target\":{},\"headers\":[{}],\"body_len\":{},\"body_fnv\":{},\"client_cert\":{},\"client_cn\":{}}}",
        json_str(&req.method),
        json_str(&req.target),
        hs.join(","),
        req.body.len(),
        fnv(&req.body),
        client_cert,
        client_cn.map_or_else(|| "null".to_string(), json_str)
    )
}

/// How long a held request waits for the proxy to give up on it.
const HOLD: Duration = Duration::from_secs(30);

/// Header lines of the `.../many` answer (Go's transport reads up to
/// 10 MiB of response head, with no limit on the number of lines).
pub(crate) const MANY_HEADERS: usize = 600;

fn serve_conn<S: Conn>(conn: S, requests: &AtomicUsize, gate: &AtomicBool, events: &Events) {
    let mut r = BufReader::with_capacity(64 * 1024, conn);
    loop {
        let Some((method, target, headers)) = read_head(&mut r) else {
            return;
        };
        // `/upload/N`: reads the first N payload bytes slowly through a
        // small receive window (a busy upstream: the proxy's socket to it
        // is full when the N-th byte is written) and notes
        // `body N /upload/N` as soon as they arrived, while the rest of
        // the body is still to come.
        let mark = target
            .strip_prefix("/upload/")
            .and_then(|n| n.split('?').next()?.parse::<usize>().ok());
        if mark.is_some() {
            r.get_ref().small_window();
        }
        let Some(body) =
            read_body_marked(&mut r, &headers, mark.unwrap_or(usize::MAX), &mut || {
                note(events, format!("body {0} /upload/{0}", mark.unwrap_or(0)));
            })
        else {
            return;
        };
        requests.fetch_add(1, Ordering::SeqCst);
        let client_cert = r.get_ref().client_cert();
        let client_cn = r.get_ref().client_cn();
        let req = Req {
            method,
            target,
            headers,
            body,
        };
        let upgrade = header(&req.headers, "connection")
            .is_some_and(|v| v.to_ascii_lowercase().contains("upgrade"));
        let path = req.target.split('?').next().unwrap_or("").to_string();
        // A HEAD answer has no body (RFC 9110 9.3.2): an upstream that sent
        // one anyway left bytes that raced the next request on the same
        // connection (proxy_diff's `HEAD /status/418` under load; the proxy's
        // side of that is `proxy::bytes_arriving_on_an_idle_pooled_connection_retire_it`).
        let head_only = req.method == "HEAD";
        let query = req
            .target
            .split_once('?')
            .map(|(_, q)| q.to_string())
            .unwrap_or_default();
        note(events, format!("{} {path}", req.method));
        let w = r.get_mut();
        if path.ends_with("/hold") || path.ends_with("/quiet") {
            // `/hold`: no answer; `/quiet`: a watch's head and one event,
            // then nothing. Either way until the proxy closes.
            if path.ends_with("/quiet") {
                let ev = "{\"type\":\"ADDED\"}\n";
                let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{ev}\r\n", ev.len());
                let _ = w.flush();
            }
            w.set_read_timeout(HOLD);
            let mut buf = [0u8; 4096];
            loop {
                match w.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            || e.kind() == std::io::ErrorKind::TimedOut =>
                    {
                        return
                    }
                    Err(_) => break,
                }
            }
            note(events, format!("closed {path}"));
            return;
        }
        if path.ends_with("/drop") {
            // Reads the request, then closes without an answer.
            w.close_notify();
            return;
        }
        if path.ends_with("/many") {
            let mut head = String::from("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n");
            for i in 0..MANY_HEADERS {
                head.push_str(&format!("X-Many-{i}: value {i}\r\n"));
            }
            let _ = write!(w, "{head}Content-Length: 4\r\n\r\nmany");
            let _ = w.flush();
            continue;
        }
        if upgrade {
            let proto = header(&req.headers, "upgrade").unwrap_or("").to_string();
            let _ = write!(w, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {proto}\r\n\r\n");
            let _ = w.flush();
            // Echo whatever comes, until EOF.
            let mut buf = vec![0u8; 65536];
            let pending = r.buffer().to_vec();
            let w = r.get_mut();
            if !pending.is_empty() {
                let _ = w.write_all(&pending);
                let _ = w.flush();
            }
            loop {
                match w.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if w.write_all(&buf[..n]).is_err() || w.flush().is_err() {
                            return;
                        }
                    }
                }
            }
        }
        if path == "/version" {
            let b = r#"{"major":"1","minor":"32","gitVersion":"v1.32.4","platform":"linux/amd64"}"#;
            let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len());
            let _ = w.flush();
            continue;
        }
        if query.contains("watch=true") || query.contains("follow=true") {
            let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
            for i in 0..3 {
                if i == 0 {
                    // Raised before the first event and held until the
                    // client saw it (the test lowers it) or 10 s passed
                    // (then lowered here): a client that sees the event
                    // with the gate still up got it while we waited.
                    gate.store(true, Ordering::SeqCst);
                }
                let ev = format!("{{\"type\":\"ADDED\",\"object\":{{\"n\":{i}}}}}\n");
                let _ = write!(w, "{:x}\r\n{ev}\r\n", ev.len());
                let _ = w.flush();
                if i == 0 {
                    for _ in 0..1000 {
                        if !gate.load(Ordering::SeqCst) {
                            break;
                        }
                        thread::sleep(Duration::from_millis(10));
                    }
                    gate.store(false, Ordering::SeqCst);
                }
            }
            let _ = write!(w, "0\r\n\r\n");
            let _ = w.flush();
            continue;
        }
        if let Some(n) = path.strip_prefix("/bytes/") {
            let n: usize = n.parse().unwrap_or(0);
            let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {n}\r\n\r\n");
            let chunk = vec![b'x'; 65536];
            let mut left = if head_only { 0 } else { n };
            while left > 0 {
                let k = left.min(chunk.len());
                if w.write_all(&chunk[..k]).is_err() {
                    return;
                }
                left -= k;
            }
            let _ = w.flush();
            continue;
        }
        if let Some(code) = path.strip_prefix("/status/") {
            let code: u16 = code.parse().unwrap_or(500);
            let b = format!("{{\"status\":{code}}}");
            let shown = if head_only { "" } else { b.as_str() };
            let _ = write!(w, "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{shown}", b.len());
            let _ = w.flush();
            continue;
        }
        if path == "/gzip" || path == "/gzip-chunked" {
            let accepts =
                header(&req.headers, "accept-encoding").is_some_and(|v| v.contains("gzip"));
            let plain: Vec<u8> = (0..50_000u32)
                .flat_map(|i| format!("line {i}\n").into_bytes())
                .collect();
            let (body, enc) = if accepts {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(&plain).unwrap();
                (e.finish().unwrap(), "Content-Encoding: gzip\r\n")
            } else {
                (plain, "")
            };
            if path == "/gzip" {
                let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{enc}Content-Length: {}\r\n\r\n", body.len());
                if !head_only {
                    let _ = w.write_all(&body);
                }
            } else {
                let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{enc}Transfer-Encoding: chunked\r\n\r\n");
                if !head_only {
                    for part in body.chunks(1000) {
                        let _ = write!(w, "{:x}\r\n", part.len());
                        let _ = w.write_all(part);
                        let _ = w.write_all(b"\r\n");
                    }
                    let _ = w.write_all(b"0\r\n\r\n");
                }
            }
            let _ = w.flush();
            continue;
        }
        if path == "/close" {
            let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil close");
            let _ = w.flush();
            w.close_notify();
            return;
        }
        let b = echo_json(&req, client_cert, client_cn.as_deref());
        let body = if req.method == "HEAD" { "" } else { b.as_str() };
        let _ = write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            b.len()
        );
        let _ = w.flush();
    }
}

/// Writes a kubeconfig for `server` with the test CA, and the given
/// credentials (token and/or the agent client certificate).
pub(crate) fn kubeconfig(
    path: &Path,
    server: &str,
    certs: &Path,
    token: Option<&str>,
    client_cert: bool,
) {
    let mut user = String::new();
    if let Some(t) = token {
        user.push_str(&format!("    token: {t}\n"));
    }
    if client_cert {
        user.push_str(&format!(
            "    client-certificate: {}\n    client-key: {}\n",
            certs.join("agent.crt").display(),
            certs.join("agent.key").display()
        ));
    }
    if user.is_empty() {
        user.push_str("    {}\n");
    }
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: test\n  user:\n{user}contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\n",
        certs.join("ca.crt").display()
    );
    std::fs::write(path, text).expect("write kubeconfig");
}

/// Starts an HTTP/2-only (ALPN h2) variant: the same echo JSON, gzip when
/// asked, the `:authority` reported as `host`. Runs on its own thread with a
/// tokio runtime and the h2 crate. Asks for (does not require) a client
/// certificate signed by `certs/ca.crt`, as [`start`].
pub(crate) fn start_h2(certs: &Path) -> FakeApiServer {
    start_h2_limited(certs, None)
}

/// [`start_h2`] announcing `max_streams` as its
/// SETTINGS_MAX_CONCURRENT_STREAMS (none announced: unlimited). Paths
/// ending in `/hold` (no answer) and `/quiet` (a watch's head and one event)
/// are held until the client resets the stream (`"closed /path"`).
pub(crate) fn start_h2_limited(certs: &Path, max_streams: Option<u32>) -> FakeApiServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(&certs.join("ca.crt")) {
        roots.add(c).expect("root");
    }
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .expect("verifier");
    let mut cfg = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            load_certs(&certs.join("server.crt")),
            load_key(&certs.join("server.key")),
        )
        .expect("server config");
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let std_listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let r = requests.clone();
    let events = Events::default();
    let ev = events.clone();
    thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let r = r.clone();
                let ev = ev.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let cn: Option<Arc<str>> = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| common_name(c))
                        .map(Arc::from);
                    let mut b = h2::server::Builder::new();
                    if let Some(n) = max_streams {
                        b.max_concurrent_streams(n);
                    }
                    let Ok(mut conn) = b.handshake(tls).await else {
                        return;
                    };
                    note(&ev, "h2-conn".into());
                    while let Some(Ok((req, respond))) = conn.accept().await {
                        r.fetch_add(1, Ordering::SeqCst);
                        let path = req.uri().path().to_string();
                        note(&ev, format!("{} {path}", req.method()));
                        if path.ends_with("/hold") || path.ends_with("/quiet") {
                            tokio::spawn(h2_hold(respond, path, ev.clone()));
                            continue;
                        }
                        tokio::spawn(h2_answer(req, respond, cn.clone()));
                    }
                });
            }
        });
    });
    FakeApiServer {
        addr,
        requests,
        watch_gate: Arc::new(AtomicBool::new(false)),
        events,
    }
}

/// A held HTTP/2 request: `/quiet` gets a watch's head and one event;
/// then both wait for the client's RST_STREAM (for at most [`HOLD`]).
async fn h2_hold(mut respond: h2::server::SendResponse<bytes::Bytes>, path: String, ev: Events) {
    use std::future::poll_fn;
    let reset = if path.ends_with("/quiet") {
        let resp = http::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        let Ok(mut tx) = respond.send_response(resp, false) else {
            return;
        };
        let _ = tx.send_data(bytes::Bytes::from_static(b"{\"type\":\"ADDED\"}\n"), false);
        tokio::time::timeout(HOLD, poll_fn(|cx| tx.poll_reset(cx))).await
    } else {
        tokio::time::timeout(HOLD, poll_fn(|cx| respond.poll_reset(cx))).await
    };
    if reset.is_ok() {
        note(&ev, format!("closed {path}"));
    }
}

async fn h2_answer(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
    client_cn: Option<Arc<str>>,
) {
    let (parts, mut body) = req.into_parts();
    let mut data = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let mut headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    if let Some(a) = parts.uri.authority() {
        headers.push(("host".into(), a.to_string()));
    }
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let accepts_gzip = parts
        .headers
        .get("accept-encoding")
        .is_some_and(|v| v.to_str().unwrap_or("").contains("gzip"));
    let (body, gz) = if parts.uri.path() == "/gzip" {
        let plain: Vec<u8> = (0..50_000u32)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        if accepts_gzip {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&plain).unwrap();
            (e.finish().unwrap(), true)
        } else {
            (plain, false)
        }
    } else {
        let req = Req {
            method: parts.method.to_string(),
            target,
            headers,
            body: data,
        };
        (
            echo_json(&req, client_cn.is_some(), client_cn.as_deref()).into_bytes(),
            false,
        )
    };
    // `/status/<code>`: that status, as the HTTP/1.1 server answers it.
    let status = parts
        .uri
        .path()
        .strip_prefix("/status/")
        .map_or(200, |c| c.parse().unwrap_or(500));
    let body = if status == 200 {
        body
    } else {
        format!("{{\"status\":{status}}}").into_bytes()
    };
    let mut resp = http::Response::builder()
        .status(status)
        .header("content-type", "application/json");
    if gz {
        resp = resp.header("content-encoding", "gzip");
    }
    // No content-length: the proxy must frame the body itself.
    let Ok(mut tx) = respond.send_response(resp.body(()).unwrap(), false) else {
        return;
    };
    for piece in body.chunks(16 * 1024) {
        tx.reserve_capacity(piece.len());
        let _ = tx.send_data(bytes::Bytes::copy_from_slice(piece), false);
    }
    let _ = tx.send_data(bytes::Bytes::new(), true);
}
