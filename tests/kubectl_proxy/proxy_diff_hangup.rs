//! Long-lived and abandoned requests through `edgetunnel proxy` against the
//! real `kubectl proxy` (issue 26): a client that hangs up while its request
//! waits on the upstream (HTTP/1.1: the upstream connection closes; HTTP/2:
//! its stream is reset), more HTTP/2 connections once the upstream's
//! SETTINGS_MAX_CONCURRENT_STREAMS is used up, many cancelled watches, no
//! request sent upstream twice (and an answer with 600 header lines
//! relayed), and `--address=0.0.0.0` serving IPv6 too.
//!
//! Every case runs the same steps through both proxies against the fake API
//! server (`support::apiserver`, whose event log says what the upstream saw
//! and when), and compares what was observed.

use crate::support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use support::apiserver::{self, FakeApiServer, MANY_HEADERS};
use support::http_raw::Endpoint;
use support::proxy_proc::{kubectl, kubectl_cmd, ours_cmd, start, Running};
use support::Env;

/// How long the upstream may take to see a hang-up: kubectl takes
/// milliseconds; the old proxy never did (until the upstream's own timeout,
/// 30 s: `apiserver::HOLD`). 10 s tells the two apart with margin for a
/// loaded machine.
const NOTICE: Duration = Duration::from_secs(10);

/// How long a request through either proxy may take before it counts as
/// unanswered: milliseconds when answered; the margin is for a loaded
/// machine.
const ANSWER: Duration = Duration::from_secs(10);

fn flags(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// kubectl and ours on the same kubeconfig; `ours_extra` adds our own
/// flags (e.g. `--workers`).
fn both(
    env: &Env,
    kc: &Path,
    common: &[&str],
    ours_extra: &[&str],
    name: &str,
) -> [(&'static str, Running); 2] {
    let go = start(
        kubectl_cmd(&kubectl(), kc, &flags(common)),
        env.path(&format!("{name}-kubectl.log")),
    );
    let ours = start(
        ours_cmd(kc, &[flags(common), flags(ours_extra)].concat()),
        env.path(&format!("{name}-ours.log")),
    );
    [("kubectl", go), ("ours", ours)]
}

fn addr(ep: &Endpoint) -> SocketAddr {
    match ep {
        Endpoint::Tcp(a) => *a,
        Endpoint::Unix(_) => panic!("tcp expected"),
    }
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: t\r\n\r\n")
}

/// Sends `raw` on a new connection; the status of the answer, or `None`
/// when none came within `wait`. The head and body read (until a
/// Content-Length body is complete, or `wait`).
fn status_of(to: SocketAddr, raw: &[u8], wait: Duration) -> (Option<u16>, String) {
    let Ok(mut s) = TcpStream::connect_timeout(&to, wait) else {
        return (None, String::new());
    };
    s.set_read_timeout(Some(wait)).unwrap();
    if s.write_all(raw).is_err() {
        return (None, String::new());
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let cl = text[..end]
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + cl {
                break;
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok());
    (status, text)
}

/// Opens a request for `path` and holds the connection: returns once the
/// upstream saw it (or after 10 s).
fn open_held(to: SocketAddr, api: &FakeApiServer, path: &str, seen_before: usize) -> TcpStream {
    let mut s = TcpStream::connect(to).expect("connect proxy");
    s.write_all(get(path).as_bytes()).unwrap();
    api.wait_count(
        &format!("GET {path}"),
        seen_before + 1,
        Duration::from_secs(10),
    );
    s
}

/// Item 1: the client hangs up while its request waits (a GET with no
/// answer yet, a quiet watch with its head relayed): how long until the
/// upstream saw its connection closed or its stream reset (`None`: not
/// within [`NOTICE`]).
fn hang_up_notice(to: SocketAddr, api: &FakeApiServer, path: &str) -> Option<Duration> {
    let seen = api.count(&format!("GET {path}"));
    let closed = api.count(&format!("closed {path}"));
    let mut s = open_held(to, api, path, seen);
    if path.ends_with("/quiet") {
        // The watch's head and first event reached the client.
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
    }
    let at = Instant::now();
    let _ = s.shutdown(Shutdown::Both);
    drop(s);
    api.wait_count(&format!("closed {path}"), closed + 1, NOTICE)
        .map(|t| t.saturating_duration_since(at))
}

fn hang_ups(name: &str, api: &FakeApiServer, kc: &Path, env: &Env) {
    let mut seen = Vec::new();
    for (who, p) in both(env, kc, &["--port=0"], &[], name) {
        let to = addr(&p.ep);
        let hold = hang_up_notice(to, api, "/api/hold");
        let quiet = hang_up_notice(to, api, "/api/quiet");
        eprintln!(
            "{name} {who}: abandoned GET noticed after {hold:?}, cancelled watch after {quiet:?}"
        );
        seen.push((who, hold.is_some(), quiet.is_some()));
    }
    assert_eq!(
        seen,
        [("kubectl", true, true), ("ours", true, true)],
        "upstream request cancelled within {NOTICE:?} of the client's hang-up"
    );
}

#[test]
fn hang_up_closes_the_http1_upstream_request_as_kubectl() {
    let env = Env::new();
    let api = apiserver::start(&env.certs());
    let kc = env.path("kc-h1");
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    apiserver::kubeconfig(&kc, &server, &env.certs(), Some("t"), false);
    hang_ups("h1", &api, &kc, &env);
}

#[test]
fn hang_up_resets_the_http2_upstream_stream_as_kubectl() {
    let env = Env::new();
    let api = apiserver::start_h2_limited(&env.certs(), None);
    let kc = env.path("kc-h2");
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    apiserver::kubeconfig(&kc, &server, &env.certs(), Some("t"), false);
    hang_ups("h2", &api, &kc, &env);
}

/// What one proxy did with more watches than the upstream's stream limit
/// allows on one connection (items 2 and 3).
#[derive(Debug, PartialEq, Eq)]
struct Crowd {
    /// Watches the upstream saw start.
    started: usize,
    /// A plain GET's answer while they run.
    get_during: Option<u16>,
    /// Streams the upstream saw reset once every client hung up.
    reset: usize,
    /// A plain GET's answer after that.
    get_after: Option<u16>,
}

fn crowd(to: SocketAddr, api: &FakeApiServer, n: usize) -> Crowd {
    let path = "/api/quiet";
    let seen = api.count(&format!("GET {path}"));
    let closed = api.count(&format!("closed {path}"));
    let clients: Vec<TcpStream> = (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(to).expect("connect proxy");
            s.write_all(get(path).as_bytes()).unwrap();
            s
        })
        .collect();
    api.wait_count(&format!("GET {path}"), seen + n, support::WAIT);
    let started = api.count(&format!("GET {path}")) - seen;
    let get_during = status_of(to, get("/api/v1/plain").as_bytes(), ANSWER).0;
    for s in &clients {
        let _ = s.shutdown(Shutdown::Both);
    }
    drop(clients);
    api.wait_count(&format!("closed {path}"), closed + started, NOTICE);
    let reset = api.count(&format!("closed {path}")) - closed;
    let get_after = status_of(to, get("/api/v1/plain").as_bytes(), ANSWER).0;
    Crowd {
        started,
        get_during,
        reset,
        get_after,
    }
}

/// Items 2 and 3: the upstream allows 5 concurrent streams per connection
/// and 24 watches run (ours on 2 cores): kubectl opens more connections and
/// starts all of them; every cancelled watch is reset upstream; a GET is
/// answered during and after.
#[test]
fn http2_stream_limit_opens_more_connections_as_kubectl() {
    const LIMIT: u32 = 5;
    const WATCHES: usize = 24;
    let env = Env::new();
    let api = apiserver::start_h2_limited(&env.certs(), Some(LIMIT));
    let kc = env.path("kc-h2-limit");
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    apiserver::kubeconfig(&kc, &server, &env.certs(), Some("t"), false);
    let mut seen = Vec::new();
    for (who, p) in both(&env, &kc, &["--port=0"], &["--workers=2"], "limit") {
        let conns = api.count("h2-conn");
        let c = crowd(addr(&p.ep), &api, WATCHES);
        let conns = api.count("h2-conn") - conns;
        eprintln!("limit {LIMIT}, {WATCHES} watches, {who}: {c:?}, {conns} upstream connections");
        seen.push((who, c));
    }
    let want = Crowd {
        started: WATCHES,
        get_during: Some(200),
        reset: WATCHES,
        get_after: Some(200),
    };
    assert_eq!(seen[0].1, want, "kubectl");
    assert_eq!(seen[1].1, want, "ours");
}

/// What the upstream saw and the client got for one request made on a
/// kept-alive (reused) upstream connection.
#[derive(Debug, PartialEq, Eq)]
struct Once {
    /// Times the upstream received the request.
    upstream_saw: usize,
    status: Option<u16>,
    /// `X-Many-*` header lines relayed.
    many_lines: usize,
}

fn after_warm(to: SocketAddr, api: &FakeApiServer, method: &str, path: &str) -> Once {
    // Leaves a kept-alive upstream connection in the pool.
    let (warm, _) = status_of(to, get("/api/v1/warm").as_bytes(), ANSWER);
    assert_eq!(warm, Some(200), "warm-up GET");
    std::thread::sleep(Duration::from_millis(100));
    let before = api.count(&format!("{method} {path}"));
    let body = if method == "GET" { "" } else { "{}" };
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (status, text) = status_of(to, raw.as_bytes(), ANSWER);
    std::thread::sleep(Duration::from_millis(300));
    Once {
        upstream_saw: api.count(&format!("{method} {path}")) - before,
        status,
        many_lines: text.lines().filter(|l| l.starts_with("X-Many-")).count(),
    }
}

/// Item 4: an HTTP/1.1-over-TLS upstream; each request on a reused
/// connection: a POST answered with 600 header lines, a POST and a GET
/// whose connection the upstream closes without an answer.
#[test]
fn requests_are_sent_upstream_once_as_kubectl() {
    let env = Env::new();
    let api = apiserver::start(&env.certs());
    let kc = env.path("kc-once");
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    apiserver::kubeconfig(&kc, &server, &env.certs(), Some("t"), false);
    let mut seen = Vec::new();
    // One core: the warm-up's connection is the one reused.
    for (who, p) in both(&env, &kc, &["--port=0"], &["--workers=1"], "once") {
        let to = addr(&p.ep);
        let r = [
            after_warm(to, &api, "POST", "/api/v1/many"),
            after_warm(to, &api, "POST", "/api/v1/drop"),
            after_warm(to, &api, "GET", "/api/v1/drop"),
        ];
        eprintln!("{who}: {r:?}");
        seen.push((who, r));
    }
    let many = Once {
        upstream_saw: 1,
        status: Some(200),
        many_lines: MANY_HEADERS,
    };
    assert_eq!(seen[0].1[0], many, "kubectl, 600 header lines");
    assert_eq!(seen[0].1[1].upstream_saw, 1, "kubectl, POST dropped");
    assert_eq!(seen[1].1, seen[0].1, "ours against kubectl");
}

/// Item 5: `--address=0.0.0.0` listens on every IPv6 address too.
#[test]
fn address_0_0_0_0_serves_ipv6_as_kubectl() {
    let env = Env::new();
    let api = apiserver::start(&env.certs());
    let kc = env.path("kc-any");
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    apiserver::kubeconfig(&kc, &server, &env.certs(), Some("t"), false);
    let mut seen = Vec::new();
    for (who, p) in both(&env, &kc, &["--port=0", "--address=0.0.0.0"], &[], "any") {
        let at = addr(&p.ep);
        let port = at.port();
        let v4 = status_of(
            ([127, 0, 0, 1], port).into(),
            get("/api/v1/x").as_bytes(),
            ANSWER,
        )
        .0;
        let v6 = status_of(
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), port),
            get("/api/v1/x").as_bytes(),
            ANSWER,
        )
        .0;
        let shown = at.ip().to_string();
        eprintln!("{who}: serving on {at}, 127.0.0.1 -> {v4:?}, ::1 -> {v6:?}");
        seen.push((shown, v4, v6));
    }
    assert_eq!(seen[0], ("::".to_string(), Some(200), Some(200)), "kubectl");
    assert_eq!(seen[1], seen[0], "ours");
}
