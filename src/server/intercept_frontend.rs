//! yurt-tunnel's interception listener: cloud components keep addressing
//! edge kubelets (`nodeIP:10250`, `:10255`); iptables DNAT sends that
//! traffic here. The original destination (`SO_ORIGINAL_DST`) says which
//! node and port were meant, and the connection is relayed as it is, byte
//! for byte, through the agent that announced that address (TLS from the
//! caller stays end to end). A client that connects here directly (no DNAT)
//! must speak plain HTTP: the node comes from its Host header (a node name
//! or IP), as yurt-tunnel's HTTP interceptor does. Ports in
//! `--localhost-proxy-ports` are dialed on the node's 127.0.0.1.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::connect_frontend::{run_on_agent_core, socket_pair, Mode, Pending, NO_TUNNEL};
use super::ServerState;
use crate::metrics::DialResult;
use engine::fd_ref::FdRef;
use engine::head_reader::read_request_head;
use engine::relay::MovedSocket;
use engine::{abort, accept};
use protocol::anp::http_connect;
use protocol::http1::{self, HeadLimit};

const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) async fn accept_tcp(core: usize, shared: Arc<ServerState>, l: monoio::net::TcpListener) {
    let local = l.local_addr().ok();
    accept::serve(l, shared.accept_options("interception"), move |c| {
        front(core, shared.clone(), c.stream, c.peer, local)
    })
    .await
}

/// The destination before DNAT, when the connection was redirected.
pub(super) fn original_dst(fd: &impl AsRawFd) -> Option<SocketAddr> {
    engine::sys::original_dst(fd)
}

/// Where to route and what to dial for node `host` and `port`:
/// (routing address, dial address).
fn targets(shared: &ServerState, host: &str, port: u16) -> (String, String) {
    let node = match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        // A node name: dial the address its agent announced.
        Err(_) => shared
            .registry
            .lock()
            .expect("registry lock")
            .address_of_host(host)
            .map(|ip| ip.to_string())
            .unwrap_or_else(|| host.to_string()),
    };
    let join = |h: &str| {
        if h.contains(':') {
            format!("[{h}]:{port}")
        } else {
            format!("{h}:{port}")
        }
    };
    let route = join(&node);
    let dial = if shared.cfg.localhost_proxy_ports.contains(&port) {
        format!("127.0.0.1:{port}")
    } else {
        route.clone()
    };
    (route, dial)
}

async fn front(
    core: usize,
    shared: Arc<ServerState>,
    mut sock: monoio::net::TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
) {
    // This task relays for the caller as long as the tunnel lasts.
    let _caller = shared.intercepted();
    let started = Instant::now();
    let orig = original_dst(&sock).filter(|o| Some(*o) != local);
    let (route, dial, leftover, mode) = match orig {
        Some(o) => {
            let (route, dial) = targets(&shared, &o.ip().to_string(), o.port());
            (
                route,
                dial,
                Bytes::new(),
                Mode::Transparent { http_errors: false },
            )
        }
        None => match monoio::time::timeout(HEAD_TIMEOUT, read_host(&mut sock)).await {
            Ok(Ok((host, port, head))) => {
                let (route, dial) = targets(&shared, &host, port);
                (route, dial, head, Mode::Transparent { http_errors: true })
            }
            Ok(Err(msg)) => {
                shared.metrics.frontend_errors.inc();
                tracing::info!(%peer, "interception request refused: {msg}");
                let _ = monoio::io::AsyncWriteRentExt::write_all(
                    &mut sock,
                    http_connect::error_response(400, &format!("{msg}\n")),
                )
                .await;
                return;
            }
            Err(_) => return,
        },
    };
    let Some(agent) = shared.pick_or_wait(&route).await else {
        shared
            .metrics
            .dial_done(DialResult::NoAgent, started.elapsed());
        tracing::info!(%route, "intercepted connection: no agent for this node");
        if mode != (Mode::Transparent { http_errors: false }) {
            let _ = monoio::io::AsyncWriteRentExt::write_all(
                &mut sock,
                http_connect::error_response(503, NO_TUNNEL),
            )
            .await;
        }
        return;
    };
    tracing::debug!(%peer, %route, %dial, agent = %agent.agent_id, "intercepted connection");
    // Through a socket pair, so that the tracing wrapper sees the exchanges
    // (it only follows; the bytes pass unchanged).
    let Ok((tunnel_end, our_end)) = socket_pair() else {
        return;
    };
    let ends = Ends {
        caller: FdRef::of(&sock),
        watch: abort::watch(&tunnel_end),
        started,
    };
    let agent_id = agent.agent_id.clone();
    monoio::spawn(run_on_agent_core(
        core,
        shared,
        tunnel_end,
        MovedSocket::from_unix,
        Pending::new(dial.clone(), Bytes::new(), agent, mode),
    ));
    use monoio::io::IntoPollIo;
    let (Ok(down), Ok(up)) = (sock.into_poll_io(), our_end.into_poll_io()) else {
        return;
    };
    let node = route
        .rsplit_once(':')
        .map_or(route.as_str(), |(h, _)| h)
        .trim_matches(['[', ']']);
    relay_traced(down, up, leftover, node, &dial, &agent_id, &ends).await;
}

/// Reads a plain HTTP request head and returns the Host's node and port
/// (port 10250 when absent), with every byte read so far.
async fn read_host(sock: &mut monoio::net::TcpStream) -> Result<(String, u16, Bytes), String> {
    let got = read_request_head(sock, HeadLimit::KUBELET)
        .await
        .map_err(|e| e.to_string())?;
    let host = http1::get(&got.head.headers, "host")
        .map(|h| h.trim().to_string())
        .ok_or("request without a Host header")?;
    let (h, p) = split_host_port(&host).ok_or_else(|| format!("bad Host {host:?}"))?;
    Ok((h, p, got.bytes))
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` (default port 10250).
fn split_host_port(s: &str) -> Option<(String, u16)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => 10250,
            None => return None,
        };
        return Some((h.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h.to_string(), p.parse().ok()?)),
        Some(_) => Some((s.to_string(), 10250)),
        None if !s.is_empty() => Some((s.to_string(), 10250)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::split_host_port;

    #[test]
    fn host_forms() {
        assert_eq!(
            split_host_port("node1:10255"),
            Some(("node1".into(), 10255))
        );
        assert_eq!(split_host_port("node1"), Some(("node1".into(), 10250)));
        assert_eq!(
            split_host_port("[fd00::1]:10250"),
            Some(("fd00::1".into(), 10250))
        );
        assert_eq!(split_host_port("fd00::1"), Some(("fd00::1".into(), 10250)));
        assert_eq!(split_host_port("a:b"), None);
        assert_eq!(split_host_port(""), None);
    }
}

/// TLS material of the TLS interception listener (yurt-tunnel's 10263).
#[derive(Clone)]
pub(super) struct InterceptTls {
    /// Terminates the caller's TLS (the API server's kubelet client).
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Speaks TLS to the kubelet through the tunnel.
    pub kubelet: Arc<rustls::ClientConfig>,
}

pub(super) async fn accept_tls(
    core: usize,
    shared: Arc<ServerState>,
    l: monoio::net::TcpListener,
    tls: InterceptTls,
) {
    let local = l.local_addr().ok();
    accept::serve(l, shared.accept_options("interception-tls"), move |c| {
        tls_front(core, shared.clone(), c.stream, c.peer, local, tls.clone())
    })
    .await
}

/// Terminates the caller's TLS, opens the tunnel to the kubelet, speaks TLS
/// to the kubelet with the proxy-client certificate over it (through a
/// socket pair whose other end is an ordinary tunneled socket), and relays
/// the plaintext both ways, logging the first request of the connection.
async fn tls_front(
    core: usize,
    shared: Arc<ServerState>,
    sock: monoio::net::TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    tls: InterceptTls,
) {
    use monoio::io::IntoPollIo;
    // This task relays for the caller as long as the tunnel lasts.
    let _caller = shared.intercepted();
    let started = Instant::now();
    let orig = original_dst(&sock).filter(|o| Some(*o) != local);
    let caller_fd = FdRef::of(&sock);
    let Ok(io) = sock.into_poll_io() else { return };
    let down = match monoio::time::timeout(HEAD_TIMEOUT, tls.acceptor.accept(io)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(%peer, "interception TLS handshake failed: {e}");
            return;
        }
        Err(_) => return,
    };
    let sni = down.get_ref().1.server_name().map(str::to_string);
    let (host, port) = match (orig, sni) {
        (Some(o), _) => (o.ip().to_string(), o.port()),
        (None, Some(name)) => (name, 10250),
        (None, None) => {
            tracing::info!(%peer, "TLS interception: no original destination and no SNI");
            return;
        }
    };
    let (route, dial) = targets(&shared, &host, port);
    let mut down = down;
    let Some(agent) = shared.pick_or_wait(&route).await else {
        shared
            .metrics
            .dial_done(DialResult::NoAgent, started.elapsed());
        tracing::info!(%route, "TLS interception: no agent for this node");
        answer_tls(&mut down, &http_connect::error_response(503, NO_TUNNEL)).await;
        return;
    };
    let Ok((tunnel_end, our_end)) = socket_pair() else {
        return;
    };
    let ends = Ends {
        caller: caller_fd,
        watch: abort::watch(&tunnel_end),
        started,
    };
    let agent_id = agent.agent_id.clone();
    monoio::spawn(run_on_agent_core(
        core,
        shared.clone(),
        tunnel_end,
        MovedSocket::from_unix,
        Pending::new(
            dial.clone(),
            Bytes::new(),
            agent,
            Mode::Transparent { http_errors: false },
        ),
    ));
    let Ok(our_end) = our_end.into_poll_io() else {
        return;
    };
    let name = match host.parse::<IpAddr>() {
        Ok(ip) => rustls::pki_types::ServerName::IpAddress(ip.into()),
        Err(_) => match rustls::pki_types::ServerName::try_from(host.clone()) {
            Ok(n) => n,
            Err(_) => return,
        },
    };
    let up = match tokio_rustls::TlsConnector::from(tls.kubelet.clone())
        .connect(name, our_end)
        .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::info!(%dial, agent = %agent_id, "TLS to the kubelet failed: {e}");
            let body = format!("TLS to the kubelet at {dial} failed: {e}\n");
            answer_tls(&mut down, &http_connect::error_response(502, &body)).await;
            return;
        }
    };
    relay_traced(down, up, Bytes::new(), &host, &dial, &agent_id, &ends).await;
}

/// Answers a TLS caller (an HTTP error) and ends its stream: the write
/// may leave the answer in the TLS session, which the shutdown sends, with
/// close_notify, before the socket closes.
async fn answer_tls<S: tokio::io::AsyncWrite + Unpin>(down: &mut S, answer: &[u8]) {
    use tokio::io::AsyncWriteExt;
    if down.write_all(answer).await.is_ok() {
        let _ = down.shutdown().await;
    }
}

/// Relays two plaintext streams both ways and logs every exchange, as
/// yurt-tunnel's tracing wrapper does: method, path, node, status and
/// duration (pipelined and streamed exchanges included; after an upgrade
/// the bytes just flow).
/// The caller's TCP descriptor and the watch on the tunnel end of the
/// socket pair (an abnormal end of the tunnel resets the caller), and when
/// the caller came.
struct Ends {
    caller: FdRef,
    watch: abort::Watch,
    started: Instant,
}

async fn relay_traced<A, B>(
    down: A,
    up: B,
    prefix: Bytes,
    node: &str,
    dial: &str,
    agent: &str,
    ends: &Ends,
) where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use protocol::http1::trace::{Event, Tracker};
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (mut down_r, mut down_w) = tokio::io::split(down);
    let (mut up_r, mut up_w) = tokio::io::split(up);
    // Requests sent and not yet answered: (method, path, when).
    let pending: RefCell<VecDeque<(String, String, Instant)>> = RefCell::new(VecDeque::new());
    let upgraded = std::cell::Cell::new(false);
    let to_kubelet = async {
        let mut t = Tracker::requests();
        // Requests seen in bytes going to the kubelet wait for their answer.
        let note = |t: &mut Tracker, data: &[u8]| {
            for ev in t.feed(data, || None) {
                if let Event::Request { method, path } = ev {
                    pending
                        .borrow_mut()
                        .push_back((method, path, Instant::now()));
                }
            }
        };
        // What the caller sent before the relay began (a head read to find
        // the node) goes first.
        if !prefix.is_empty() {
            note(&mut t, &prefix);
            // Flushed as every write below: a TLS writer may hold the
            // bytes until then, and the caller may send nothing more
            // before the answer.
            if up_w.write_all(&prefix).await.is_err() || up_w.flush().await.is_err() {
                return;
            }
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match down_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if upgraded.get() {
                t.stop();
            }
            note(&mut t, &buf[..n]);
            if up_w.write_all(&buf[..n]).await.is_err() || up_w.flush().await.is_err() {
                break;
            }
        }
        let _ = up_w.shutdown().await;
    };
    let to_caller = async {
        let mut t = Tracker::responses();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match up_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let method_of_front = || pending.borrow().front().map(|p| p.0.clone());
            for ev in t.feed(&buf[..n], method_of_front) {
                let Event::Response { status } = ev else {
                    continue;
                };
                if (100..200).contains(&status) && status != 101 {
                    continue;
                }
                let Some((method, path, at)) = pending.borrow_mut().pop_front() else {
                    continue;
                };
                tracing::info!(
                    %method, %path, %node, %dial, %agent, status,
                    elapsed_ms = at.elapsed().as_millis() as u64,
                    "kubelet request"
                );
                if status == 101 {
                    upgraded.set(true);
                }
            }
            if down_w.write_all(&buf[..n]).await.is_err() || down_w.flush().await.is_err() {
                break;
            }
        }
        if ends.watch.aborted() {
            // The tunnel ended abnormally: a reset, not a clean end.
            abort::reset(&ends.caller);
            return;
        }
        let _ = down_w.shutdown().await;
    };
    futures::join!(to_kubelet, to_caller);
    tracing::debug!(%node, elapsed_ms = ends.started.elapsed().as_millis() as u64, "kubelet connection closed");
}
