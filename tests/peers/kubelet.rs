//! A fake kubelet for the kube-apiserver case: HTTPS with a client
//! certificate required (kube-apiserver's `--kubelet-client-certificate`),
//! listening inside the node's network namespace, serving what
//! kube-apiserver asks a kubelet for in `kubectl logs`, `logs -f`, node
//! proxy, `exec` and `port-forward` (the last two through [`spdy`]); and
//! a plain HTTP backend for the service proxy. Thread per connection,
//! blocking I/O; written from the Kubernetes API's documented paths
//! (`/containerLogs/NS/POD/CONTAINER`, `/healthz`, `/exec/...`,
//! `/portForward/...`), not from kubelet's code.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;

use crate::kube_cluster::in_netns;
use crate::spdy;
use crate::support::apiserver::{self, load_certs, load_key};

/// Lines of the small log (`tailLines` picks the last ones).
pub(crate) const SMALL_LINES: usize = 1000;
/// Size of the big log (container `big`): 16 MiB.
pub(crate) const BIG_LEN: usize = 16 << 20;
/// Bytes per line of the big log.
const BIG_LINE: usize = 64;

/// Line `i` of the small log of `ns/pod/container`.
pub(crate) fn small_line(ns: &str, pod: &str, container: &str, i: usize) -> String {
    format!("{ns}/{pod}/{container} line {i:04}\n")
}

/// The small log's last `tail` lines (all of them for `None`).
pub(crate) fn small_log(ns: &str, pod: &str, container: &str, tail: Option<usize>) -> String {
    let n = tail.unwrap_or(SMALL_LINES).min(SMALL_LINES);
    (SMALL_LINES - n..SMALL_LINES)
        .map(|i| small_line(ns, pod, container, i))
        .collect()
}

/// The 16 MiB log: 64-byte lines, each numbered and with letters that
/// depend on the number, so that a missing, repeated or moved piece shows.
pub(crate) fn big_log() -> Vec<u8> {
    let mut v = Vec::with_capacity(BIG_LEN);
    for i in 0..BIG_LEN / BIG_LINE {
        let head = format!("big {i:08} ");
        v.extend_from_slice(head.as_bytes());
        for k in 0..BIG_LINE - head.len() - 1 {
            v.push(b'a' + ((i * 7 + k * 13) % 26) as u8);
        }
        v.push(b'\n');
    }
    v
}

/// What the fake kubelet saw.
#[derive(Default)]
pub(crate) struct Stats {
    /// `METHOD TARGET cn=CLIENT-CN` of every request, in order.
    pub requests: Mutex<Vec<String>>,
    /// TLS connections open now.
    pub conns_open: AtomicUsize,
    /// `logs -f` streams open now, and ended so far.
    pub follow_open: AtomicUsize,
    pub follow_ended: AtomicUsize,
    /// Exec and port-forward sessions that completed their checks.
    pub exec_done: AtomicUsize,
    pub portforward_done: AtomicUsize,
}

pub(crate) struct FakeKubelet {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
}

fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

impl FakeKubelet {
    /// Listens on `bind` inside network namespace `ns` with `cert`/`key`,
    /// requiring a client certificate signed by `client_ca`.
    pub(crate) fn start(ns: &str, bind: &str, cert: &Path, key: &Path, client_ca: &Path) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        for c in load_certs(client_ca) {
            roots.add(c).expect("root");
        }
        let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .expect("verifier");
        let mut cfg = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(load_certs(cert), load_key(key))
            .expect("kubelet TLS config");
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        let bind = bind.to_string();
        let l = in_netns(ns, move || TcpListener::bind(&bind).expect("bind kubelet"));
        let addr = l.local_addr().unwrap();
        let stats = Arc::new(Stats::default());
        let st = stats.clone();
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                let (cfg, st) = (cfg.clone(), st.clone());
                thread::spawn(move || {
                    let _ = s.set_nodelay(true);
                    let Ok(conn) = rustls::ServerConnection::new(cfg) else {
                        return;
                    };
                    st.conns_open.fetch_add(1, Ordering::SeqCst);
                    let mut tls = rustls::StreamOwned::new(conn, s);
                    // The handshake first, for the client's name.
                    let cn = loop {
                        if tls.conn.is_handshaking() {
                            if tls.conn.complete_io(&mut tls.sock).is_err() {
                                break None;
                            }
                            continue;
                        }
                        break tls
                            .conn
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .and_then(|c| common_name(c));
                    };
                    if let Some(cn) = cn {
                        serve(tls, &cn, &st);
                    }
                    st.conns_open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        FakeKubelet { addr, stats }
    }

    /// Every request seen so far.
    pub(crate) fn requests(&self) -> Vec<String> {
        self.stats.requests.lock().unwrap().clone()
    }
}

type Tls = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;

/// A request head: method, target, lower-cased headers.
pub(crate) struct Head {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name`.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub(crate) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The value of query parameter `key`, if present.
    pub(crate) fn query(&self, key: &str) -> Option<String> {
        let q = self.target.split_once('?')?.1;
        q.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == key).then(|| v.to_string())
        })
    }

    /// Every value of query parameter `key`.
    pub(crate) fn query_all(&self, key: &str) -> Vec<String> {
        let Some((_, q)) = self.target.split_once('?') else {
            return Vec::new();
        };
        q.split('&')
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k == key).then(|| v.to_string())
            })
            .collect()
    }
}

/// Reads one request head; `None` at EOF or on garbage.
pub(crate) fn read_head<R: BufRead>(r: &mut R) -> Option<Head> {
    let (method, target, headers) = apiserver::read_head(r)?;
    Some(Head {
        method,
        target,
        headers,
    })
}

fn respond(w: &mut impl Write, status: &str, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )?;
    for c in body.chunks(64 * 1024) {
        w.write_all(c)?;
    }
    w.flush()
}

fn serve(tls: Tls, cn: &str, st: &Stats) {
    let mut r = BufReader::with_capacity(64 * 1024, tls);
    loop {
        let Some(head) = read_head(&mut r) else {
            return;
        };
        st.requests
            .lock()
            .unwrap()
            .push(format!("{} {} cn={cn}", head.method, head.target));
        let path = head.path().to_string();
        let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let ok = match seg.as_slice() {
            ["containerLogs", ns, pod, container] => {
                if head.query("follow").as_deref() == Some("true") {
                    follow(r.get_mut(), ns, pod, container, st);
                    return;
                }
                if *container == "big" {
                    respond(r.get_mut(), "200 OK", "text/plain", &big_log())
                } else {
                    let tail = head.query("tailLines").and_then(|v| v.parse().ok());
                    let body = small_log(ns, pod, container, tail);
                    respond(r.get_mut(), "200 OK", "text/plain", body.as_bytes())
                }
            }
            ["healthz"] => respond(r.get_mut(), "200 OK", "text/plain", b"ok"),
            ["pods"] => respond(
                r.get_mut(),
                "200 OK",
                "application/json",
                br#"{"kind":"PodList","apiVersion":"v1","items":[]}"#,
            ),
            ["exec", ..] | ["portForward", ..] => {
                spdy::serve_upgrade(r, &head, st);
                return;
            }
            _ => respond(r.get_mut(), "404 Not Found", "text/plain", b"not found"),
        };
        if ok.is_err() {
            return;
        }
    }
}

/// `logs -f`: a line every 20 ms, chunked, until a write fails (the
/// client went away).
fn follow(w: &mut Tls, ns: &str, pod: &str, container: &str, st: &Stats) {
    st.follow_open.fetch_add(1, Ordering::SeqCst);
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut res = w.write_all(head.as_bytes()).and_then(|_| w.flush());
    let mut i = 0;
    while res.is_ok() {
        let line = format!("follow {ns}/{pod}/{container} {i}\n");
        res = write!(w, "{:x}\r\n{line}\r\n", line.len()).and_then(|_| w.flush());
        i += 1;
        thread::sleep(Duration::from_millis(20));
    }
    st.follow_open.fetch_sub(1, Ordering::SeqCst);
    st.follow_ended.fetch_add(1, Ordering::SeqCst);
}

/// A plain HTTP backend for the service proxy: answers one request per
/// connection with `backend saw METHOD TARGET` and `Connection: close`
/// (so that no idle connection stays in the tunnel); counts requests.
pub(crate) struct Backend {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
}

impl Backend {
    pub(crate) fn start(ns: &str, bind: &str) -> Backend {
        let bind = bind.to_string();
        let l = in_netns(ns, move || TcpListener::bind(&bind).expect("bind backend"));
        let addr = l.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let n = requests.clone();
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                let n = n.clone();
                thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let Some(head) = read_head(&mut r) else {
                        return;
                    };
                    n.fetch_add(1, Ordering::SeqCst);
                    let body = format!("backend saw {} {}", head.method, head.target);
                    let _ = write!(
                        w,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\
                         Content-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                });
            }
        });
        Backend { addr, requests }
    }
}
