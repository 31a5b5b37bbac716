//! The upstream (API server) a proxy forwards to, from the kubeconfig (read
//! with the `kube` crate) and kubectl's override flags, resolved once at
//! start on the calling thread, off the data-plane cores.

use std::path::Path;
use std::sync::Arc;

use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use rustls::ClientConfig;
use secrecy::ExposeSecret;

use super::flags::ProxyArgs;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("invalid server URL {0:?}: {1}")]
    Url(String, String),
    #[error("reading {0}: {1}")]
    Read(String, std::io::Error),
    #[error("TLS configuration: {0}")]
    Tls(String),
}

/// Credentials applied to every forwarded request that carries none.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    Bearer(String),
    Basic { user: String, password: String },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "None",
            Auth::Bearer(_) => "Bearer(..)",
            Auth::Basic { .. } => "Basic(..)",
        })
    }
}

impl Auth {
    /// The `Authorization` header value, if any.
    pub fn header(&self) -> Option<String> {
        match self {
            Auth::None => None,
            Auth::Bearer(t) => Some(format!("Bearer {t}")),
            Auth::Basic { user, password } => Some(format!(
                "Basic {}",
                base64(format!("{user}:{password}").as_bytes())
            )),
        }
    }
}

fn base64(input: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Where and how to reach the API server.
#[derive(Clone)]
pub struct Upstream {
    /// `host:port` to dial.
    pub dial: String,
    /// The Host header: the server URL's host as written (port kept when given).
    pub host_header: String,
    /// TLS toward the upstream (None for `http://`), offering HTTP/1.1 only.
    pub tls: Option<Arc<ClientConfig>>,
    /// The same offering HTTP/2 first (None when HTTP/2 is off).
    pub tls_h2: Option<Arc<ClientConfig>>,
    /// Name checked on the server certificate.
    pub server_name: String,
    /// The server URL's path (for --append-server-path).
    pub base_path: String,
    pub auth: Auth,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("dial", &self.dial)
            .field("host_header", &self.host_header)
            .field("tls", &self.tls.is_some())
            .field("server_name", &self.server_name)
            .field("base_path", &self.base_path)
            .field("auth", &self.auth)
            .finish()
    }
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn read(path: &str) -> Result<Vec<u8>, UpstreamError> {
    std::fs::read(path).map_err(|e| UpstreamError::Read(path.to_string(), e))
}

fn pem_certs(pem: &[u8], path: &str) -> Result<Vec<Vec<u8>>, UpstreamError> {
    let certs: Vec<Vec<u8>> = rustls_pemfile::certs(&mut &pem[..])
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| UpstreamError::Read(path.to_string(), e))?;
    if certs.is_empty() {
        return Err(UpstreamError::Tls(format!("{path} holds no certificate")));
    }
    Ok(certs)
}

async fn load_config(args: &ProxyArgs) -> Result<kube::Config, UpstreamError> {
    let options = KubeConfigOptions {
        context: opt(&args.context),
        cluster: opt(&args.cluster),
        user: opt(&args.user),
    };
    let kubeconfig = if args.kubeconfig.is_empty() {
        Kubeconfig::read()
    } else {
        Kubeconfig::read_from(Path::new(&args.kubeconfig))
    };
    let loaded = match kubeconfig {
        Ok(kc) => kube::Config::from_custom_kubeconfig(kc, &options)
            .await
            .map_err(|e| UpstreamError::Kubeconfig(e.to_string())),
        Err(e) => Err(UpstreamError::Kubeconfig(e.to_string())),
    };
    match loaded {
        Ok(c) => Ok(c),
        // kubectl works from flags alone when there is no kubeconfig.
        Err(_) if !args.server.is_empty() && args.kubeconfig.is_empty() => {
            let uri = args.server.parse().map_err(|e: http::uri::InvalidUri| {
                UpstreamError::Url(args.server.clone(), e.to_string())
            })?;
            Ok(kube::Config::new(uri))
        }
        Err(e) => Err(e),
    }
}

/// Resolves the upstream from the kubeconfig and the override flags.
pub async fn resolve(args: &ProxyArgs) -> Result<Upstream, UpstreamError> {
    let mut config = load_config(args).await?;
    if !args.server.is_empty() {
        let server = if args.server.contains("://") {
            args.server.clone()
        } else {
            format!("https://{}", args.server)
        };
        config.cluster_url = server.parse().map_err(|e: http::uri::InvalidUri| {
            UpstreamError::Url(server.clone(), e.to_string())
        })?;
    }
    if !args.certificate_authority.is_empty() {
        let pem = read(&args.certificate_authority)?;
        config.root_cert = Some(pem_certs(&pem, &args.certificate_authority)?);
        config.root_cert_file = None;
    }
    if args.insecure_skip_tls_verify {
        config.accept_invalid_certs = true;
    }
    if !args.tls_server_name.is_empty() {
        config.tls_server_name = Some(args.tls_server_name.clone());
    }
    if !args.client_certificate.is_empty() {
        config.auth_info.client_certificate = Some(args.client_certificate.clone());
        config.auth_info.client_certificate_data = None;
    }
    if !args.client_key.is_empty() {
        config.auth_info.client_key = Some(args.client_key.clone());
        config.auth_info.client_key_data = None;
    }
    let auth = if !args.token.is_empty() {
        Auth::Bearer(args.token.clone())
    } else if let Some(t) = &config.auth_info.token {
        Auth::Bearer(t.expose_secret().to_string())
    } else if let Some(f) = &config.auth_info.token_file {
        Auth::Bearer(String::from_utf8_lossy(&read(f)?).trim().to_string())
    } else if let (Some(u), Some(p)) = (&config.auth_info.username, &config.auth_info.password) {
        Auth::Basic {
            user: u.clone(),
            password: p.expose_secret().to_string(),
        }
    } else {
        Auth::None
    };

    let url = &config.cluster_url;
    let https = match url.scheme_str() {
        Some("https") | None => true,
        Some("http") => false,
        Some(other) => {
            return Err(UpstreamError::Url(
                url.to_string(),
                format!("unsupported scheme {other}"),
            ))
        }
    };
    let host = url
        .host()
        .ok_or_else(|| UpstreamError::Url(url.to_string(), "no host".into()))?
        .to_string();
    let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
    let bare_host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let dial = if bare_host.contains(':') {
        format!("[{bare_host}]:{port}")
    } else {
        format!("{bare_host}:{port}")
    };
    let host_header = match url.port_u16() {
        Some(p) => format!("{host}:{p}"),
        None => host.clone(),
    };
    let (tls, tls_h2) = if https {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut tls = config
            .rustls_client_config()
            .map_err(|e| UpstreamError::Tls(e.to_string()))?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let h2 = args.upstream_http2.then(|| {
            let mut c = tls.clone();
            c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Arc::new(c)
        });
        (Some(Arc::new(tls)), h2)
    } else {
        (None, None)
    };
    let server_name = config.tls_server_name.clone().unwrap_or(bare_host);
    let base_path = url.path().trim_end_matches('/').to_string();
    Ok(Upstream {
        dial,
        host_header,
        tls,
        tls_h2,
        server_name,
        base_path,
        auth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_header() {
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        let a = Auth::Basic {
            user: "u".into(),
            password: "p".into(),
        };
        assert_eq!(a.header().unwrap(), "Basic dTpw");
    }
}
