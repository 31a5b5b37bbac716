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
    #[error("{}", key_pair_message(cert, key, source))]
    KeyPair {
        cert: String,
        key: String,
        source: rustls::Error,
    },
    #[error("{cert} is not a server certificate: its extended key usage is {usages} without serverAuth, so TLS clients (Go's included) refuse it. It looks like an agent's or a client's certificate; issue a server one with `edgetunnel certs issue server OUT --ca-dir CA_DIR --name HOST` and pass it with its key")]
    NotServerCert { cert: String, usages: String },
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("{0}")]
    Policy(String),
}

fn key_pair_message(cert: &str, key: &str, e: &rustls::Error) -> String {
    match e {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => format!(
            "the private key {key} does not belong to the certificate {cert}: pass the key that was issued with that certificate"
        ),
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown) => format!(
            "could not check that the private key {key} belongs to the certificate {cert}"
        ),
        e => format!("certificate {cert} with key {key}: {e}"),
    }
}

/// Refuses a certificate to serve TLS with that cannot: its leaf has an
/// extended key usage extension without serverAuth (or anyExtendedKeyUsage),
/// e.g. an agent's clientAuth-only certificate. Go's clients check that
/// usage and would refuse every handshake; better said at start.
pub fn require_server_usage(cert: &Path) -> Result<(), TlsError> {
    let certs = load_certs(cert)?;
    let Ok((_, leaf)) = x509_parser::parse_x509_certificate(&certs[0]) else {
        return Ok(());
    };
    let Ok(Some(eku)) = leaf.extended_key_usage() else {
        return Ok(());
    };
    let eku = eku.value;
    if eku.server_auth || eku.any {
        return Ok(());
    }
    let mut usages = Vec::new();
    for (on, name) in [
        (eku.client_auth, "clientAuth"),
        (eku.code_signing, "codeSigning"),
        (eku.email_protection, "emailProtection"),
        (eku.time_stamping, "timeStamping"),
        (eku.ocsp_signing, "OCSPSigning"),
    ] {
        if on {
            usages.push(name.to_string());
        }
    }
    usages.extend(eku.other.iter().map(|o| o.to_id_string()));
    Err(TlsError::NotServerCert {
        cert: cert.display().to_string(),
        usages: usages.join(", "),
    })
}

/// ring, with AES-128-GCM preferred: with AES-NI it is about a third
/// cheaper than AES-256-GCM and it is what Go peers prefer too. Bulk
/// encryption is the largest cost of the agent link.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(base_provider())
}

fn base_provider() -> rustls::crypto::CryptoProvider {
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
    p
}

/// The TLS 1.2 suites Go's `tls.CipherSuites()` offers that rustls does not
/// implement (CBC and RSA key exchange): ANP accepts their names in
/// `--cipher-suites`; edgetunnel skips them with a warning.
const GO_ONLY_SUITES: &[&str] = &[
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
];

/// What a server listener allows: ANP's `--tls-min-version` and
/// `--cipher-suites` (which, as in Go, restrict TLS 1.2 only; TLS 1.3
/// suites are not configurable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsPolicy {
    /// Refuse TLS 1.2.
    pub tls13_only: bool,
    /// TLS 1.2 suites allowed, by IANA name; `None`: all of ours.
    pub tls12_suites: Option<Vec<String>>,
}

impl TlsPolicy {
    /// Reads the flags' values: a minimum version as Go names it
    /// (`VersionTLS12`, `VersionTLS13`, also `1.2`/`1.3`; empty: TLS 1.2)
    /// and cipher suite names as Go's `tls.CipherSuites()` names them.
    /// Returns the policy and warnings for what edgetunnel cannot honour
    /// exactly (TLS 1.0/1.1 minimums, suites rustls lacks).
    pub fn parse(min_version: &str, suites: &[String]) -> Result<(Self, Vec<String>), TlsError> {
        let mut warnings = Vec::new();
        let tls13_only = match min_version {
            "" | "VersionTLS12" | "1.2" => false,
            "VersionTLS13" | "1.3" => true,
            "VersionTLS10" | "VersionTLS11" | "1.0" | "1.1" => {
                warnings.push(format!(
                    "--tls-min-version={min_version}: edgetunnel never speaks TLS below 1.2; the minimum is TLS 1.2"
                ));
                false
            }
            other => return Err(TlsError::Policy(format!(
                "unsupported TLS version {other:?}, supported values are: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
            ))),
        };
        let suites: Vec<&str> = suites
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .collect();
        if suites.is_empty() {
            return Ok((
                Self {
                    tls13_only,
                    tls12_suites: None,
                },
                warnings,
            ));
        }
        let ours = base_provider();
        let mut tls12 = Vec::new();
        for name in suites {
            let known = ours.cipher_suites.iter().find(|s| suite_name(s) == *name);
            match known {
                Some(s) if s.version() == &rustls::version::TLS12 => tls12.push(name.to_string()),
                // TLS 1.3 names are accepted and change nothing, as in Go.
                Some(_) => {}
                None if GO_ONLY_SUITES.contains(&name) => warnings.push(format!(
                    "--cipher-suites: {name} is not implemented by edgetunnel (rustls has no CBC or RSA key exchange suites); skipped"
                )),
                None => {
                    return Err(TlsError::Policy(format!(
                        "cipher suite {name} not supported, doesn't exist or considered as insecure"
                    )))
                }
            }
        }
        if tls12.is_empty() && !tls13_only {
            warnings.push(
                "--cipher-suites names no TLS 1.2 suite edgetunnel has: TLS 1.2 is refused, TLS 1.3 only"
                    .to_string(),
            );
        }
        Ok((
            Self {
                tls13_only,
                tls12_suites: Some(tls12),
            },
            warnings,
        ))
    }

    /// The provider (suites) and protocol versions this policy allows.
    fn apply(
        &self,
    ) -> (
        Arc<rustls::crypto::CryptoProvider>,
        &'static [&'static rustls::SupportedProtocolVersion],
    ) {
        let mut p = base_provider();
        if let Some(allowed) = &self.tls12_suites {
            p.cipher_suites.retain(|s| {
                s.version() != &rustls::version::TLS12 || allowed.contains(&suite_name(s))
            });
        }
        let has_tls12 = p
            .cipher_suites
            .iter()
            .any(|s| s.version() == &rustls::version::TLS12);
        let versions: &'static [&'static rustls::SupportedProtocolVersion] =
            if self.tls13_only || !has_tls12 {
                TLS13_ONLY
            } else {
                rustls::DEFAULT_VERSIONS
            };
        (Arc::new(p), versions)
    }
}

static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// The IANA name of a suite as Go spells it (rustls writes TLS 1.3 names
/// as `TLS13_...`, IANA and Go as `TLS_...`).
fn suite_name(s: &rustls::SupportedCipherSuite) -> String {
    let n = s.suite().as_str().unwrap_or("");
    match n.strip_prefix("TLS13_") {
        Some(rest) => format!("TLS_{rest}"),
        None => n.to_string(),
    }
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
    policy: &TlsPolicy,
) -> Result<(Arc<ServerConfig>, Arc<ReloadingCert>), TlsError> {
    require_server_usage(&files.cert)?;
    let cert = ReloadingCert::load(&files.cert, &files.key)?;
    let (suites, versions) = policy.apply();
    let builder = ServerConfig::builder_with_provider(suites).with_protocol_versions(versions)?;
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

/// A frontend listener's TLS (ANP's `--server-cert/--server-key/
/// --server-ca-cert`): our certificate (swappable); with a CA, callers must
/// present a certificate it signed, without one none is asked for (as ANP's
/// `getTLSConfig`). `alpn` is what the frontend speaks: `h2` for gRPC,
/// `http/1.1` for HTTP CONNECT.
pub fn frontend_server_config(
    cert: &Path,
    key: &Path,
    ca: Option<&Path>,
    alpn: &[u8],
    policy: &TlsPolicy,
) -> Result<(Arc<ServerConfig>, Arc<ReloadingCert>), TlsError> {
    require_server_usage(cert)?;
    let pair = ReloadingCert::load(cert, key)?;
    let (suites, versions) = policy.apply();
    let builder = ServerConfig::builder_with_provider(suites).with_protocol_versions(versions)?;
    let mut cfg = match ca {
        Some(ca) => {
            let roots = Arc::new(load_roots(ca)?);
            builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(roots, provider()).build()?,
            )
        }
        None => builder.with_no_client_auth(),
    }
    .with_cert_resolver(pair.clone());
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Ok((Arc::new(cfg), pair))
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

/// A sentence naming the cause of a failed TLS handshake with an agent at
/// `peer` (server side): what it presented, or what it refused of ours,
/// and what to check. `ca`: the CA that verifies agents; `cert`: our
/// certificate.
pub fn explain_agent_handshake(
    e: &io::Error,
    peer: std::net::SocketAddr,
    ca: &Path,
    cert: &Path,
) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let ca = ca.display();
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<E>()) else {
        return format!("agent {peer}: connection lost during the TLS handshake: {e}");
    };
    match tls {
        E::InvalidCertificate(C::UnknownIssuer) => format!(
            "agent {peer} presented a certificate not signed by the agent CA {ca}: issue the agent's certificate with that CA (`edgetunnel certs issue agent OUT --ca-dir CA_DIR --name NODE`) or give the server the CA that signed it"
        ),
        E::InvalidCertificate(C::BadSignature) => format!(
            "agent {peer} presented a certificate not signed by the agent CA {ca}: its issuer has that CA's name but another key (a CA made again?); issue the agent's certificate with the CA the server trusts"
        ),
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            format!("agent {peer} presented an expired certificate: renew it")
        }
        E::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => format!(
            "agent {peer} presented a certificate not valid yet (a clock behind, or ahead here?)"
        ),
        E::InvalidCertificate(C::InvalidPurpose | C::InvalidPurposeContext { .. }) => format!(
            "agent {peer} presented a certificate without the clientAuth usage (a server certificate?): give the agent its own (`edgetunnel certs issue agent`)"
        ),
        E::InvalidCertificate(C::Revoked) => {
            format!("agent {peer} presented a revoked certificate")
        }
        E::NoCertificatesPresented => format!(
            "agent {peer} presented no client certificate; it needs one signed by the agent CA {ca}"
        ),
        E::AlertReceived(a @ (A::BadCertificate | A::UnknownCA | A::CertificateUnknown | A::DecryptError | A::UnsupportedCertificate)) => format!(
            "agent {peer} refused this server's certificate {} ({a:?}): the agent's CA does not trust the CA that signed it, or the name the agent dials is not among its names",
            cert.display()
        ),
        E::InvalidCertificate(other) => {
            format!("agent {peer} presented a certificate that does not verify: {other:?}")
        }
        other => format!("agent {peer}: TLS handshake failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::TlsPolicy;

    fn parse(min: &str, suites: &[&str]) -> Result<(TlsPolicy, Vec<String>), String> {
        let suites: Vec<String> = suites.iter().map(|s| s.to_string()).collect();
        TlsPolicy::parse(min, &suites).map_err(|e| e.to_string())
    }

    #[test]
    fn versions_as_go_names_them() {
        assert_eq!(parse("", &[]).unwrap().0, TlsPolicy::default());
        assert!(!parse("VersionTLS12", &[]).unwrap().0.tls13_only);
        assert!(parse("VersionTLS13", &[]).unwrap().0.tls13_only);
        let (p, w) = parse("VersionTLS10", &[]).unwrap();
        assert!(!p.tls13_only);
        assert_eq!(w.len(), 1, "{w:?}");
        let e = parse("TLS12", &[]).unwrap_err();
        assert!(e.contains("unsupported TLS version \"TLS12\""), "{e}");
    }

    #[test]
    fn suites_restrict_tls12_only() {
        let (p, w) = parse("", &["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]).unwrap();
        assert!(w.is_empty(), "{w:?}");
        let (provider, versions) = p.apply();
        let names: Vec<String> = provider
            .cipher_suites
            .iter()
            .map(super::suite_name)
            .collect();
        assert!(
            names.contains(&"TLS_AES_128_GCM_SHA256".to_string()),
            "{names:?}"
        );
        assert!(names.contains(&"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string()));
        assert!(!names.contains(&"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384".to_string()));
        assert_eq!(versions.len(), 2);
    }

    #[test]
    fn go_only_and_unknown_suites() {
        let (p, w) = parse("", &["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"]).unwrap();
        assert_eq!(w.len(), 2, "skipped suite and TLS 1.3 only: {w:?}");
        assert_eq!(p.apply().1.len(), 1, "TLS 1.3 only");
        let (p, w) = parse("", &["TLS_AES_128_GCM_SHA256"]).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(p.apply().1.len(), 1);
        let e = parse("", &["TLS_FOO"]).unwrap_err();
        assert_eq!(
            e,
            "cipher suite TLS_FOO not supported, doesn't exist or considered as insecure"
        );
    }
}
