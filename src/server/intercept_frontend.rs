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
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio::io::AsyncReadRent;

use super::connect_frontend::{run_on_agent_core, Mode, NO_TUNNEL};
use super::Shared;
use crate::engine::listener;
use crate::engine::relay::MovedSocket;
use crate::metrics::DialResult;
use crate::protocol::http_connect;

const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_HEAD: usize = 64 * 1024;

pub(super) async fn accept_tcp(core: usize, shared: Arc<Shared>, l: monoio::net::TcpListener) {
    let local = l.local_addr().ok();
    loop {
        match l.accept().await {
            Ok((s, peer)) => {
                listener::nodelay(&s);
                monoio::spawn(front(core, shared.clone(), s, peer, local));
            }
            Err(e) => {
                tracing::warn!(error = %e, "interception listener accept failed");
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The destination before DNAT, when the connection was redirected.
pub fn original_dst(fd: &impl AsRawFd) -> Option<SocketAddr> {
    const SO_ORIGINAL_DST: libc::c_int = 80;
    // SAFETY: getsockopt into a zeroed sockaddr_storage of the right size.
    unsafe {
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let p = &mut ss as *mut _ as *mut libc::c_void;
        if libc::getsockopt(fd.as_raw_fd(), libc::SOL_IP, SO_ORIGINAL_DST, p, &mut len) == 0 {
            let sin = &*(p as *const libc::sockaddr_in);
            let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            return Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)));
        }
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getsockopt(fd.as_raw_fd(), libc::SOL_IPV6, SO_ORIGINAL_DST, p, &mut len) == 0 {
            let sin6 = &*(p as *const libc::sockaddr_in6);
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            return Some(SocketAddr::new(
                IpAddr::V6(ip),
                u16::from_be(sin6.sin6_port),
            ));
        }
    }
    None
}

/// Where to route and what to dial for node `host` and `port`:
/// (routing address, dial address).
fn targets(shared: &Shared, host: &str, port: u16) -> (String, String) {
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
    shared: Arc<Shared>,
    mut sock: monoio::net::TcpStream,
    peer: SocketAddr,
    local: Option<SocketAddr>,
) {
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
                shared.metrics.frontend_errors.fetch_add(1, Relaxed);
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
    let Some(agent) = shared.pick(&route) else {
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
    run_on_agent_core(
        core,
        shared,
        sock,
        MovedSocket::from_tcp,
        dial,
        leftover,
        agent,
        mode,
    )
    .await;
}

/// Reads a plain HTTP request head and returns the Host's node and port
/// (port 10250 when absent), with every byte read so far.
async fn read_host(sock: &mut monoio::net::TcpStream) -> Result<(String, u16, Bytes), String> {
    let mut acc: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let buf = Vec::with_capacity(8192);
        let (res, buf) = sock.read(buf).await;
        let n = res.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed before a request head".into());
        }
        acc.extend_from_slice(&buf[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&acc) {
            Ok(httparse::Status::Complete(_)) => {
                let host = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("host"))
                    .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
                    .ok_or("request without a Host header")?;
                let (h, p) = split_host_port(&host).ok_or_else(|| format!("bad Host {host:?}"))?;
                return Ok((h, p, Bytes::from(acc)));
            }
            Ok(httparse::Status::Partial) if acc.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => return Err("request head too large".into()),
            Err(e) => return Err(format!("malformed request: {e}")),
        }
    }
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
