//! The proxy leg of an upstream dial: on a connected socket to the proxy,
//! TLS to an `https://` proxy, then the CONNECT or SOCKS5 handshake (the
//! sans-I/O [`protocol::kubectl::upstream::proxy_handshake`] drives the bytes), leaving a
//! stream on which the caller starts TLS to the API server (or, for a
//! plain-http target through an HTTP proxy, sends absolute-form requests).

use std::sync::Arc;
use std::time::Duration;

use monoio::net::tcp::stream_poll::TcpStreamPoll;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::io::{go_error_text, UpstreamIo};
use engine::read_ahead::ReadAhead;
use protocol::go::net::join_host_port;
use protocol::kubectl::upstream::proxy_handshake::{self as proxy_client, Socks5Client, SocksStep};
use protocol::kubectl::upstream::proxy_url::{ProxyScheme, ProxyUrl};

/// Go's transport has no separate limit; this bounds a silent proxy.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Sets up the tunnel through `proxy` toward `host:port`. `tunnel`: the
/// target needs one (https); a plain-http target through an HTTP(S) proxy
/// gets none. `tls`: the upstream's TLS settings, also used toward an
/// `https://` proxy as Go's transport does (`addTLS` with
/// `TLSClientConfig`).
pub(super) async fn through_proxy(
    tcp: TcpStreamPoll,
    proxy: &ProxyUrl,
    host: &str,
    port: u16,
    tunnel: bool,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<UpstreamIo, String> {
    let wrap = |e: String| format!("proxyconnect tcp: {e}");
    let mut io = if proxy.scheme == ProxyScheme::Https {
        let cfg = tls.ok_or_else(|| wrap("an https proxy needs an https server".into()))?;
        let mut cfg = (**cfg).clone();
        cfg.alpn_protocols.clear();
        let name = rustls::pki_types::ServerName::try_from(proxy.host.clone())
            .map_err(|e| wrap(format!("invalid proxy name {:?}: {e}", proxy.host)))?;
        let t = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, ReadAhead::new(tcp))
            .await
            .map_err(|e| wrap(format!("tls: {e}")))?;
        UpstreamIo::Tls(Box::new(t))
    } else {
        UpstreamIo::Plain(tcp)
    };
    let target = join_host_port(host, port);
    let hs = async {
        match proxy.scheme {
            ProxyScheme::Socks5 => socks5(&mut io, proxy, host, port).await,
            _ if tunnel => connect(&mut io, &target, proxy.basic_auth().as_deref()).await,
            _ => Ok(()),
        }
    };
    match monoio::time::timeout(HANDSHAKE_TIMEOUT, hs).await {
        Ok(r) => r?,
        Err(_) => return Err(format!("proxy {}: handshake timed out", proxy.addr())),
    }
    Ok(io)
}

async fn read_some<S: AsyncRead + Unpin>(io: &mut S, buf: &mut Vec<u8>) -> Result<(), String> {
    let mut chunk = [0u8; 1024];
    let n = io.read(&mut chunk).await.map_err(|e| go_error_text(&e))?;
    if n == 0 {
        return Err("unexpected EOF".into());
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    target: &str,
    auth: Option<&str>,
) -> Result<(), String> {
    io.write_all(&proxy_client::connect_request(target, auth))
        .await
        .map_err(|e| go_error_text(&e))?;
    io.flush().await.map_err(|e| go_error_text(&e))?;
    let mut buf = Vec::new();
    loop {
        read_some(io, &mut buf).await?;
        if proxy_client::parse_connect_response(&buf).map_err(|e| e.to_string())? {
            return Ok(());
        }
    }
}

async fn socks5<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    proxy: &ProxyUrl,
    host: &str,
    port: u16,
) -> Result<(), String> {
    let (mut c, greeting) = Socks5Client::new(&proxy.addr(), host, port, proxy.user.clone())
        .map_err(|e| e.to_string())?;
    let mut out = greeting;
    loop {
        if !out.is_empty() {
            io.write_all(&out).await.map_err(|e| go_error_text(&e))?;
            io.flush().await.map_err(|e| go_error_text(&e))?;
        }
        let mut buf = Vec::new();
        read_some(io, &mut buf).await?;
        match c.feed(&buf).map_err(|e| e.to_string())? {
            SocksStep::Send(b) => out = b,
            SocksStep::Read => out = Vec::new(),
            SocksStep::Done => return Ok(()),
        }
    }
}

/// The same handshakes on a blocking socket, for the start-up
/// `--match-server-version` check (run before any core starts). An
/// `https://` proxy is not supported there.
pub(super) fn through_proxy_blocking(
    tcp: &mut std::net::TcpStream,
    proxy: &ProxyUrl,
    host: &str,
    port: u16,
    tunnel: bool,
) -> Result<(), String> {
    use std::io::{Read, Write};
    let read_some = |tcp: &mut std::net::TcpStream, buf: &mut Vec<u8>| {
        let mut chunk = [0u8; 1024];
        match tcp.read(&mut chunk) {
            Ok(0) => Err("unexpected EOF".to_string()),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) => Err(go_error_text(&e)),
        }
    };
    let _ = tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
    match proxy.scheme {
        ProxyScheme::Https => Err(format!(
            "proxyconnect tcp: https proxy {} not supported for --match-server-version",
            proxy.addr()
        )),
        ProxyScheme::Http if !tunnel => Ok(()),
        ProxyScheme::Http => {
            let target = join_host_port(host, port);
            tcp.write_all(&proxy_client::connect_request(
                &target,
                proxy.basic_auth().as_deref(),
            ))
            .map_err(|e| go_error_text(&e))?;
            let mut buf = Vec::new();
            loop {
                read_some(tcp, &mut buf)?;
                if proxy_client::parse_connect_response(&buf).map_err(|e| e.to_string())? {
                    return Ok(());
                }
            }
        }
        ProxyScheme::Socks5 => {
            let (mut c, mut out) = Socks5Client::new(&proxy.addr(), host, port, proxy.user.clone())
                .map_err(|e| e.to_string())?;
            loop {
                tcp.write_all(&out).map_err(|e| go_error_text(&e))?;
                out = Vec::new();
                let mut buf = Vec::new();
                read_some(tcp, &mut buf)?;
                match c.feed(&buf).map_err(|e| e.to_string())? {
                    SocksStep::Send(b) => out = b,
                    SocksStep::Read => {}
                    SocksStep::Done => return Ok(()),
                }
            }
        }
    }
}
