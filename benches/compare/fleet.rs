//! The fleet simulator: N agent links from one process, each speaking what
//! `edgetunnel agent` speaks to a server (src/agent/connection.rs): TCP,
//! mutual TLS with ALPN h2, HTTP/2, one gRPC `POST /AgentService/Connect`
//! stream with the `agentid` and `agentidentifiers` metadata (and, when
//! given, `authorization: Bearer`), Packets framed as gRPC messages both
//! ways. The same names ANP's Go agent sends (read in ANP's
//! proto/header/header.go and pkg/agent/client.go: `agentID`,
//! `agentIdentifiers`, `Authorization: Bearer <token>`, lowercased on the
//! wire; proto/agent/agent.proto has no package, hence the path), so ANP's
//! Go server takes the same fleet. No features are offered (no half-close, no windows) and no
//! secondary links: one link per simulated agent, as a Go agent with one
//! server.
//!
//! Each simulated agent answers a DIAL_REQ with a DIAL_RSP (connection IDs
//! counted from 1 per link), echoes every DATA back on the same connection
//! ID (the target is in-process), and answers CLOSE_REQ with CLOSE_RSP.
//! HTTP/2 PINGs are answered by h2 itself. Toward a loopback server each
//! agent connects from its own source address (127.1.x.y). A link that ends or fails is
//! retried with the agent's own policy ([`edgetunnel::agent::Backoff`],
//! full jitter, the agent's default delays), forever: a simulated agent
//! never gives up, so "gave up" is one still unlinked when the
//! measurement's deadline passes. A handshake the server refuses as busy
//! (its handshake caps full: a TLS `user_canceled` alert,
//! [`edgetunnel::agent::backoff::is_busy`]) is counted apart and backed
//! off from as the agent does ([`Attempt::Busy`]).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use edgetunnel::agent::backoff::{Attempt, Backoff, DEFAULT_RESET_AFTER};
use protocol::anp::packet::{self, Frame};
use protocol::{anp::grpc_frame, AGENT_CONNECT_PATH, AGENT_IDENTIFIERS_HEADER, AGENT_ID_HEADER};
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

/// The agent's defaults (`--backoff-initial-secs`, `--backoff-max-secs`).
const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The agent's CONNECT_TIMEOUT: TCP + TLS + HTTP/2 + the Connect answer.
const SETUP_TIMEOUT: Duration = Duration::from_secs(15);
const MAX_MESSAGE: usize = 16 << 20;

/// What every simulated agent shares.
pub(crate) struct FleetConfig {
    /// The server's agent listener.
    pub server: SocketAddr,
    pub server_name: String,
    pub tls: Arc<rustls::ClientConfig>,
    /// `Some(prefix)`: agent `i` presents `Bearer <prefix><i>`.
    pub token_prefix: Option<String>,
}

/// Counters of the whole fleet, read while it runs.
#[derive(Default)]
pub(crate) struct Stats {
    /// Links up now (Connect answered 200 without a gRPC error).
    pub linked: AtomicUsize,
    /// Links established so far.
    pub links_made: AtomicU64,
    /// Attempts that found no listener or whose TCP connect failed.
    pub tcp_failed: AtomicU64,
    /// Attempts closed or timed out in TLS or HTTP/2 (a shed handshake
    /// looks like this).
    pub handshake_failed: AtomicU64,
    /// Connects answered with an HTTP or gRPC error (refused).
    pub refused: AtomicU64,
    /// Handshakes the server refused as busy (TLS `user_canceled`).
    pub busy: AtomicU64,
    /// The first few distinct handshake errors seen.
    pub handshake_errors: Mutex<Vec<String>>,
    /// DIAL_REQs answered.
    pub dials: AtomicU64,
    /// Agents (by index) linked at least once since the last `reset_seen`.
    seen: Mutex<HashSet<usize>>,
}

impl Stats {
    /// Agents linked at least once since the last call.
    pub(crate) fn reset_seen(&self) -> usize {
        let mut s = self.seen.lock().unwrap();
        let n = s.len();
        s.clear();
        n
    }

    pub(crate) fn seen(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub(crate) fn failures(&self) -> (u64, u64, u64) {
        (
            self.tcp_failed.load(Ordering::Relaxed),
            self.handshake_failed.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }
}

/// A running fleet; dropping it stops every simulated agent.
pub(crate) struct Fleet {
    pub stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// Starts `n` agents `fleet-0` .. `fleet-{n-1}` (host identifier the
    /// same), all at once, on the current runtime.
    pub(crate) fn start(rt: &tokio::runtime::Runtime, cfg: Arc<FleetConfig>, n: usize) -> Fleet {
        let stats = Arc::new(Stats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..n)
            .map(|i| rt.spawn(agent(i, cfg.clone(), stats.clone(), stop.clone())))
            .collect();
        Fleet { stats, stop, tasks }
    }

    /// Waits until `n` links are up, or `limit` passes; the time it took.
    pub(crate) fn wait_linked(&self, n: usize, limit: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if self.stats.linked.load(Ordering::Relaxed) >= n {
                return Some(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The host identifier (and agent ID) of agent `i`.
pub(crate) fn agent_name(i: usize) -> String {
    format!("fleet-{i}")
}

/// The loopback source address of agent `i`, its own as an edge node's
/// would be: 127.1.0.1, 127.1.0.2, ... (250 per /24), so that a
/// per-address cap of the server (`--max-handshakes-per-ip`) meets one
/// agent per address, not the whole fleet.
fn source_ip(i: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(
        127,
        1 + (i / 62_500) as u8,
        ((i / 250) % 250) as u8,
        (i % 250 + 1) as u8,
    )
}

/// Why an attempt gave no link.
enum Fail {
    Tcp,
    Handshake(String),
    Refused,
    Busy,
}

fn hs(e: impl std::fmt::Display) -> Fail {
    Fail::Handshake(e.to_string())
}

async fn agent(i: usize, cfg: Arc<FleetConfig>, stats: Arc<Stats>, stop: Arc<AtomicBool>) {
    let mut backoff = Backoff::new(BACKOFF_INITIAL, BACKOFF_MAX, DEFAULT_RESET_AFTER);
    while !stop.load(Ordering::Relaxed) {
        let attempt = match link(i, &cfg, &stats).await {
            Ok(established) => Attempt::Ended {
                established,
                ended: Instant::now(),
            },
            Err(f) => {
                let busy = matches!(f, Fail::Busy);
                let counter = match f {
                    Fail::Tcp => &stats.tcp_failed,
                    Fail::Handshake(why) => {
                        let mut w = stats.handshake_errors.lock().unwrap();
                        if w.len() < 5 && !w.contains(&why) {
                            w.push(why);
                        }
                        &stats.handshake_failed
                    }
                    Fail::Refused => &stats.refused,
                    Fail::Busy => &stats.busy,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if busy {
                    Attempt::Busy
                } else {
                    Attempt::Failed
                }
            }
        };
        tokio::time::sleep(backoff.next_delay(attempt)).await;
    }
}

/// Decrements the linked count when a link ends.
struct Up<'a>(&'a AtomicUsize);

impl Drop for Up<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One link: set up, serve until the server goes away; Ok(when it was
/// established).
async fn link(i: usize, cfg: &FleetConfig, stats: &Stats) -> Result<Instant, Fail> {
    let setup = async {
        let sock = tokio::net::TcpSocket::new_v4().map_err(|_| Fail::Tcp)?;
        if cfg.server.ip().is_loopback() {
            sock.bind(SocketAddr::new(source_ip(i).into(), 0))
                .map_err(|_| Fail::Tcp)?;
        }
        let tcp = sock.connect(cfg.server).await.map_err(|_| Fail::Tcp)?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(cfg.server_name.clone()).map_err(hs)?;
        let tls = TlsConnector::from(cfg.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| {
                if edgetunnel::agent::backoff::is_busy(&e) {
                    Fail::Busy
                } else {
                    hs(format!("TLS: {e}"))
                }
            })?;
        let (client, conn) = h2::client::Builder::new()
            .handshake::<_, Bytes>(tls)
            .await
            .map_err(|e| hs(format!("HTTP/2: {e}")))?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let name = agent_name(i);
        let mut req = http::Request::post(format!(
            "https://{}:{}{AGENT_CONNECT_PATH}",
            cfg.server_name,
            cfg.server.port()
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header(AGENT_ID_HEADER, name.as_str())
        .header(AGENT_IDENTIFIERS_HEADER, format!("host={name}"));
        if let Some(p) = &cfg.token_prefix {
            req = req.header("authorization", format!("Bearer {p}{i}"));
        }
        let req = req.body(()).map_err(hs)?;
        let answer = async {
            let mut client = client
                .ready()
                .await
                .map_err(|e| hs(format!("HTTP/2: {e}")))?;
            let (resp, send) = client
                .send_request(req, false)
                .map_err(|e| hs(format!("Connect: {e}")))?;
            let resp = resp.await.map_err(|e| hs(format!("Connect: {e}")))?;
            if resp.status() != 200 || resp.headers().contains_key("grpc-status") {
                return Err(Fail::Refused);
            }
            Ok((send, resp.into_body()))
        }
        .await;
        match answer {
            Ok(a) => Ok((a, driver)),
            Err(f) => {
                driver.abort();
                Err(f)
            }
        }
    };
    let ((send, recv), driver) = tokio::time::timeout(SETUP_TIMEOUT, setup)
        .await
        .map_err(|_| hs("setup timed out (15 s)"))??;
    let established = Instant::now();
    stats.linked.fetch_add(1, Ordering::Relaxed);
    stats.links_made.fetch_add(1, Ordering::Relaxed);
    stats.seen.lock().unwrap().insert(i);
    let _up = Up(&stats.linked);
    serve(send, recv, stats).await;
    driver.abort();
    Ok(established)
}

/// Answers the server's packets until the stream or connection ends.
async fn serve(mut send: h2::SendStream<Bytes>, mut recv: h2::RecvStream, stats: &Stats) {
    let mut decoder = grpc_frame::FrameDecoder::new(MAX_MESSAGE);
    let mut next_id: i64 = 0;
    let mut open: HashSet<i64> = HashSet::new();
    while let Some(Ok(chunk)) = recv.data().await {
        let _ = recv.flow_control().release_capacity(chunk.len());
        decoder.push(chunk);
        while let Ok(Some(msg)) = decoder.next_message() {
            let Ok(frame) = packet::decode(msg) else {
                return;
            };
            let reply = match frame {
                Frame::DialRequest(d) => {
                    next_id += 1;
                    open.insert(next_id);
                    stats.dials.fetch_add(1, Ordering::Relaxed);
                    packet::encode(packet::dial_response(d.random, next_id, ""))
                }
                Frame::Data(d) if open.contains(&d.connect_id) && !d.data.is_empty() => {
                    packet::encode_data(d.connect_id, d.data)
                }
                Frame::CloseRequest(c) => {
                    let err = if open.remove(&c.connect_id) {
                        ""
                    } else {
                        "Unknown connectID"
                    };
                    packet::encode(packet::close_response(c.connect_id, err))
                }
                _ => continue,
            };
            if send.send_data(Bytes::from(reply.to_vec()), false).is_err() {
                return;
            }
        }
    }
}

/// The client TLS of the fleet: the CA that signed the server, and one
/// client certificate all agents present (the server runs with
/// `--bind-agent-identity=false`).
pub(crate) fn client_tls(certs: &std::path::Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let files = engine::tls::TlsFiles {
        cert: certs.join("agent.crt"),
        key: certs.join("agent.key"),
        ca: certs.join("ca.crt"),
    };
    engine::tls::client_config(&files)
        .map(|(c, _)| c)
        .map_err(|e| format!("fleet TLS: {e}"))
}
