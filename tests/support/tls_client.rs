//! A rustls client for tests that speak TLS to edgetunnel's listeners.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

/// A client TLS configuration: roots from `ca`, a client certificate when
/// given, `versions` and `suites` (by IANA name; empty: all of ring's).
pub(crate) fn client_tls(
    ca: &Path,
    cert: Option<(&Path, &Path)>,
    alpn: &[u8],
    versions: &[&'static rustls::SupportedProtocolVersion],
    suites: &[&str],
) -> Arc<rustls::ClientConfig> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !suites.is_empty() {
        provider.cipher_suites.retain(|s| {
            let n = s.suite().as_str().unwrap_or("").replace("TLS13_", "TLS_");
            suites.contains(&n.as_str())
        });
    }
    let roots = engine::tls::load_roots(ca).expect("CA");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots);
    let mut cfg = match cert {
        Some((c, k)) => builder
            .with_client_auth_cert(
                engine::tls::load_certs(c).unwrap(),
                engine::tls::load_key(k).unwrap(),
            )
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(cfg)
}

pub(crate) type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// TLS to `addr` (checked as `localhost`); completes the handshake, so a
/// refused client certificate shows here (TLS 1.3 reports it only with the
/// server's first record).
pub(crate) fn tls_connect(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<Tls> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(cfg, name).map_err(std::io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}
