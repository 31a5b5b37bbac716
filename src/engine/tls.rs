//! rustls configurations built from PEM files, with ring as the provider.
//! Configs are immutable `Arc`s: a rotation builds a new one and new
//! handshakes pick it up; live connections keep theirs.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::cert_reload::ReloadingCert;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("{path} holds no {what}")]
    Empty { path: String, what: &'static str },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// ring, with AES-128-GCM preferred: with AES-NI it is about a third
/// cheaper than AES-256-GCM and it is what Go peers prefer too. Bulk
/// encryption is the largest cost of the agent link.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Read {
            path: path.display().to_string(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.display().to_string(),
            what: "PEM certificate",
        });
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|source| TlsError::Read {
            path: path.display().to_string(),
            source,
        })?
        .ok_or_else(|| TlsError::Empty {
            path: path.display().to_string(),
            what: "PEM private key",
        })
}

pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(path)? {
        roots.add(c)?;
    }
    Ok(roots)
}

/// Paths of a certificate, its key and the CA that verifies the peer.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub ca: std::path::PathBuf,
}

/// Whether peers must present a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCert {
    Required,
    /// Verified when presented (agents that authenticate with a token).
    Optional,
}

/// Server side of mutual TLS: peers present a certificate signed by `ca`
/// (or, with [`ClientCert::Optional`], none; with no `ca` path at all no
/// certificate is asked for). ALPN offers h2. Our
/// certificate comes from `cert`, which the control thread may swap for a
/// renewed one.
pub fn server_config(
    files: &TlsFiles,
    client_cert: ClientCert,
) -> Result<(Arc<ServerConfig>, Arc<ReloadingCert>), TlsError> {
    let cert = ReloadingCert::load(&files.cert, &files.key)?;
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let mut cfg = if client_cert == ClientCert::Optional && files.ca.as_os_str().is_empty() {
        // Token-authenticated agents and no CA to check certificates with.
        builder.with_no_client_auth()
    } else {
        let roots = Arc::new(load_roots(&files.ca)?);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider());
        let verifier = match client_cert {
            ClientCert::Required => verifier.build()?,
            ClientCert::Optional => verifier.allow_unauthenticated().build()?,
        };
        builder.with_client_cert_verifier(verifier)
    }
    .with_cert_resolver(cert.clone());
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok((Arc::new(cfg), cert))
}

/// Client side of mutual TLS: verifies the server against `ca` and presents
/// our certificate (swappable, as on the server). ALPN offers h2.
pub fn client_config(
    files: &TlsFiles,
) -> Result<(Arc<ClientConfig>, Arc<ReloadingCert>), TlsError> {
    let cert = ReloadingCert::load(&files.cert, &files.key)?;
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(load_roots(&files.ca)?)
        .with_client_cert_resolver(cert.clone());
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok((Arc::new(cfg), cert))
}

/// Client side without a client certificate (an agent that authenticates
/// with a ServiceAccount token): verifies the server against `ca`.
pub fn client_config_without_cert(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(load_roots(ca)?)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// The interception listener's TLS: our certificate (swappable), no client
/// certificate asked, HTTP/1.1 (what kubelets speak).
pub fn interception_server_config(
    cert: &Path,
    key: &Path,
) -> Result<(Arc<ServerConfig>, Arc<ReloadingCert>), TlsError> {
    let pair = ReloadingCert::load(cert, key)?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(pair.clone());
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(cfg), pair))
}

/// TLS toward kubelets through the tunnel: the proxy-client certificate
/// (swappable), the kubelet verified against `ca`, or not at all with
/// `ca: None` (yurt-tunnel's behaviour, for self-signed kubelets).
pub fn kubelet_client_config(
    cert: &Path,
    key: &Path,
    ca: Option<&Path>,
) -> Result<(Arc<ClientConfig>, Arc<ReloadingCert>), TlsError> {
    let pair = ReloadingCert::load(cert, key)?;
    let builder =
        ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let mut cfg = match ca {
        Some(ca) => builder
            .with_root_certificates(load_roots(ca)?)
            .with_client_cert_resolver(pair.clone()),
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider())))
            .with_client_cert_resolver(pair.clone()),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(cfg), pair))
}

/// Accepts any server certificate (handshake signatures are still checked).
#[derive(Debug)]
struct AcceptAnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
