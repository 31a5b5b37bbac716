//! The upstream (API server) a proxy forwards to, from the kubeconfig (read
//! with the `kube` crate), the in-cluster service account when there is no
//! kubeconfig, and kubectl's override flags, resolved once at start on the
//! calling thread, off the data-plane cores. Changing credentials (exec
//! plugins' tokens and client certificates, token files, the `oidc`
//! auth-provider) are kept current by [`super::credentials`].
//!
//! As client-go (tools/clientcmd/client_config.go, `ClientConfig`: user
//! credentials are merged only `if restclient.IsConfigTransportTLS(...)`,
//! i.e. when the server URL's scheme is https), no token, password, exec
//! plugin or client certificate is used toward an `http://` server;
//! impersonation headers are set before that check and are still sent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use rustls::ClientConfig;
use secrecy::ExposeSecret;

use super::credentials::{DynamicToken, ExecPlugin, PluginCert, TokenSource};
use super::flags::ProxyArgs;
use super::oidc::{OidcProvider, Persister};
use protocol::kubectl::forward::{ForwardProxy, UpstreamHead};
use protocol::kubectl::upstream::impersonation::Impersonation;
use protocol::kubectl::upstream::oidc as oidc_policy;
use protocol::kubectl::upstream::proxy_url::{
    parse_kubeconfig_proxy, EnvProxy, ProxyScheme, ProxyUrl,
};

/// Where the service account token and CA are mounted in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Overrides [`SERVICE_ACCOUNT_DIR`] (tests, unusual mounts).
pub const SERVICE_ACCOUNT_DIR_ENV: &str = "EDGETUNNEL_SERVICEACCOUNT_DIR";

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
#[derive(Clone)]
pub enum Auth {
    None,
    Bearer(String),
    Basic {
        user: String,
        password: String,
    },
    /// A token from an exec plugin or a token file, refreshed off-core.
    Dynamic(Arc<DynamicToken>),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "None",
            Auth::Bearer(_) => "Bearer(..)",
            Auth::Basic { .. } => "Basic(..)",
            Auth::Dynamic(_) => "Dynamic(..)",
        })
    }
}

impl Auth {
    /// The `Authorization` header value, if any (for a dynamic token, the
    /// value last fetched: await [`Auth::dynamic`]'s `ready` first).
    pub fn header(&self) -> Option<String> {
        match self {
            Auth::None => None,
            Auth::Dynamic(d) => d.current(),
            Auth::Bearer(t) => Some(format!("Bearer {t}")),
            Auth::Basic { user, password } => Some(format!(
                "Basic {}",
                base64(format!("{user}:{password}").as_bytes())
            )),
        }
    }

    /// The refreshed token source, if this is one.
    pub fn dynamic(&self) -> Option<&Arc<DynamicToken>> {
        match self {
            Auth::Dynamic(d) => Some(d),
            _ => None,
        }
    }
}

use protocol::kubectl::upstream::proxy_url::base64;

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
    /// `Impersonate-*` headers to add (sent over http too, as kubectl does).
    pub impersonation: Impersonation,
    /// The proxy connections go through (kubeconfig `proxy-url` or the
    /// environment), if any.
    pub proxy: Option<ProxyUrl>,
}

impl Upstream {
    /// The API server's host (no brackets) and port, from `dial`.
    pub fn target_host_port(&self) -> (&str, u16) {
        let (h, p) = self.dial.rsplit_once(':').unwrap_or((&self.dial, "443"));
        let h = h.trim_start_matches('[').trim_end_matches(']');
        (h, p.parse().unwrap_or(443))
    }

    /// An HTTP(S) proxy that takes `http://` requests in absolute form
    /// (Go's transport sends no CONNECT for a plain-http target), with its
    /// `Proxy-Authorization`.
    pub fn forward_proxy(&self) -> Option<&ProxyUrl> {
        self.proxy
            .as_ref()
            .filter(|p| self.tls.is_none() && p.scheme != ProxyScheme::Socks5)
    }

    /// What the head rewrite needs of this upstream, for one request (the
    /// token current now, the forward proxy's credentials).
    pub fn head(&self) -> UpstreamHead<'_> {
        UpstreamHead {
            host: &self.host_header,
            authorization: self.auth.header(),
            impersonation: &self.impersonation,
            forward_proxy: self.forward_proxy().map(|p| ForwardProxy {
                authorization: p.basic_auth(),
            }),
        }
    }
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
            .field("impersonation", &self.impersonation)
            .field("proxy", &self.proxy.as_ref().map(|p| (p.scheme, p.addr())))
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

/// The in-cluster config (client-go's `rest.InClusterConfig`): possible
/// when `KUBERNETES_SERVICE_HOST` and `_PORT` are set and the service
/// account token file exists.
fn in_cluster() -> Option<Result<(kube::Config, String, ClusterProxy), UpstreamError>> {
    let dir = std::env::var_os(SERVICE_ACCOUNT_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR));
    let host = std::env::var("KUBERNETES_SERVICE_HOST").unwrap_or_default();
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_default();
    let token = dir.join("token");
    if host.is_empty() || port.is_empty() || !token.is_file() {
        return None;
    }
    let hostport = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let url = format!("https://{hostport}");
    Some((|| {
        let uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| UpstreamError::Url(url.clone(), e.to_string()))?;
        let mut config = kube::Config::new(uri);
        let ca = dir.join("ca.crt");
        match std::fs::read(&ca) {
            Ok(pem) => config.root_cert = Some(pem_certs(&pem, &ca.display().to_string())?),
            // client-go logs this and goes on with the system roots.
            Err(e) => tracing::error!(
                "Expected to load root CA config from {}, but got err: {e}",
                ca.display()
            ),
        }
        config.auth_info.token_file = Some(token.display().to_string());
        tracing::info!("using in-cluster configuration ({})", dir.display());
        Ok((config, String::new(), None))
    })())
}

/// What kube's loader is given as `proxy-url` (see [`load_config`]).
const KUBE_PROXY_PLACEHOLDER: &str = "http://unused.invalid";

/// The cluster entry's `proxy-url` as written, with the cluster's name
/// (kube's `Config::proxy_url` mixes in `HTTPS_PROXY`; client-go does not).
type ClusterProxy = Option<(String, String)>;

/// The kubeconfig's config, the name of the user entry in use and the
/// cluster's `proxy-url`.
async fn load_config(
    args: &ProxyArgs,
) -> Result<(kube::Config, String, ClusterProxy), UpstreamError> {
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
    let no_file = kubeconfig.is_err();
    let loaded = match kubeconfig {
        Ok(mut kc) => {
            let context = opt(&args.context).or_else(|| kc.current_context.clone());
            let user = opt(&args.user).unwrap_or_else(|| {
                kc.contexts
                    .iter()
                    .find(|c| Some(&c.name) == context.as_ref())
                    .and_then(|c| c.context.as_ref())
                    .and_then(|c| c.user.clone())
                    .unwrap_or_default()
            });
            let cluster = opt(&args.cluster).or_else(|| {
                kc.contexts
                    .iter()
                    .find(|c| Some(&c.name) == context.as_ref())
                    .and_then(|c| c.context.as_ref())
                    .map(|c| c.cluster.clone())
            });
            let proxy = cluster.and_then(|name| {
                let url = kc
                    .clusters
                    .iter()
                    .find(|c| c.name == name)
                    .and_then(|c| c.cluster.as_ref())
                    .and_then(|c| c.proxy_url.clone())
                    .filter(|u| !u.is_empty())?;
                Some((name, url))
            });
            // kube's loader would parse proxy-url itself (failing with its
            // own words) or fall back to HTTPS_PROXY; client-go does
            // neither, and `resolve` picks the proxy. A fixed valid value
            // keeps kube from doing either; its `proxy_url` is not used.
            for c in kc.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
                c.proxy_url = Some(KUBE_PROXY_PLACEHOLDER.into());
            }
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map(|c| (c, user, proxy))
                .map_err(|e| UpstreamError::Kubeconfig(e.to_string()))
        }
        Err(e) => Err(UpstreamError::Kubeconfig(e.to_string())),
    };
    match loaded {
        Ok(c) => Ok(c),
        // No kubeconfig at all: the pod's service account, as kubectl.
        Err(_) if no_file && args.server.is_empty() && args.kubeconfig.is_empty() => {
            match in_cluster() {
                Some(r) => r,
                None => loaded,
            }
        }
        // kubectl works from flags alone when there is no kubeconfig.
        Err(_) if !args.server.is_empty() && args.kubeconfig.is_empty() => {
            let uri = args.server.parse().map_err(|e: http::uri::InvalidUri| {
                UpstreamError::Url(args.server.clone(), e.to_string())
            })?;
            Ok((kube::Config::new(uri), String::new(), None))
        }
        Err(e) => Err(e),
    }
}

/// The impersonation in effect: the kubeconfig's, each part replaced by
/// its flag when the flag is given (non-empty), as kubectl merges them.
fn impersonation(args: &ProxyArgs, ai: &kube::config::AuthInfo) -> Impersonation {
    let mut imp = Impersonation {
        user: ai.impersonate.clone().unwrap_or_default(),
        uid: ai.impersonate_uid.clone().unwrap_or_default(),
        groups: ai.impersonate_groups.clone().unwrap_or_default(),
        extra: ai
            .impersonate_user_extra
            .clone()
            .map(|m| m.into_iter().collect())
            .unwrap_or_default(),
    };
    if !args.as_user.is_empty() {
        imp.user = args.as_user.clone();
    }
    if !args.as_uid.is_empty() {
        imp.uid = args.as_uid.clone();
    }
    if !args.as_groups.is_empty() {
        imp.groups = args.as_groups.clone();
    }
    imp
}

/// client-go's `GetAuthProvider` in kubectl 1.32: only `oidc` is built in
/// (plugin/pkg/client/auth/oidc/oidc.go, its checks made at start as
/// `newOIDCAuthProvider` does); `gcp` and `azure` fail with their removal
/// notices (plugin/pkg/client/auth/{gcp,azure}), anything else is unknown.
/// Texts copied from what kubectl v1.32 prints.
fn auth_provider(
    p: &kube::config::AuthProviderConfig,
    args: &ProxyArgs,
    user: &str,
) -> Result<TokenSource, UpstreamError> {
    let err = |s: String| Err(UpstreamError::Kubeconfig(s));
    match p.name.as_str() {
        "gcp" => err("The gcp auth plugin has been removed.\nPlease use the \"gke-gcloud-auth-plugin\" kubectl/client-go credential plugin instead.\nSee https://cloud.google.com/blog/products/containers-kubernetes/kubectl-auth-changes-in-gke for further details".into()),
        "azure" => err("The azure auth plugin has been removed.\nPlease use the https://github.com/Azure/kubelogin kubectl/client-go credential plugin instead.\nSee https://kubernetes.io/docs/reference/access-authn-authz/authentication/#client-go-credential-plugins for further details".into()),
        "oidc" => {
            let cfg: BTreeMap<String, String> =
                p.config.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let checked = oidc_policy::ProviderConfig::from_map(&cfg)
                .map_err(|e| UpstreamError::Kubeconfig(e.to_string()))?;
            let tls = idp_tls(&checked)?;
            let persister = Persister {
                files: kubeconfig_precedence(args),
                user: user.to_string(),
            };
            Ok(TokenSource::Oidc(Box::new(OidcProvider::new(
                cfg,
                checked,
                tls,
                Some(persister),
            ))))
        }
        other => err(format!("no Auth Provider found for name {other:?}")),
    }
}

/// TLS toward the IdP: `idp-certificate-authority-data` (it wins) or
/// `idp-certificate-authority`, else the system roots (client-go builds the
/// IdP's transport from only these two through `restclient.TransportFor`).
fn idp_tls(c: &oidc_policy::ProviderConfig) -> Result<Arc<ClientConfig>, UpstreamError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let roots = match (&c.ca_data, &c.ca_file) {
        (Some(pem), _) => Some(pem_certs(pem, oidc_policy::CA_DATA)?),
        (None, Some(f)) => Some(pem_certs(&read(f)?, f)?),
        (None, None) => None,
    };
    let mut config = kube::Config::new(http::Uri::from_static("https://idp.invalid"));
    config.root_cert = roots;
    let mut tls = config
        .rustls_client_config()
        .map_err(|e| UpstreamError::Tls(e.to_string()))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

/// The kubeconfig files in clientcmd's loading precedence: the flag's file,
/// else `$KUBECONFIG`'s list (duplicates dropped), else `~/.kube/config`.
fn kubeconfig_precedence(args: &ProxyArgs) -> Vec<PathBuf> {
    if !args.kubeconfig.is_empty() {
        return vec![PathBuf::from(&args.kubeconfig)];
    }
    let env = std::env::var_os("KUBECONFIG").unwrap_or_default();
    if !env.is_empty() {
        let mut out: Vec<PathBuf> = Vec::new();
        for p in std::env::split_paths(&env) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
        return out;
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    vec![home.join(".kube").join("config")]
}

/// The credentials for an https upstream, in client-go's precedence.
fn credentials(args: &ProxyArgs, config: &kube::Config, user: &str) -> Result<Auth, UpstreamError> {
    let ai = &config.auth_info;
    let token = if !args.token.is_empty() {
        Some(args.token.clone())
    } else {
        ai.token.as_ref().map(|t| t.expose_secret().to_string())
    };
    let username = opt(&args.username).or_else(|| ai.username.clone());
    let password =
        opt(&args.password).or_else(|| ai.password.as_ref().map(|p| p.expose_secret().to_string()));
    let has_token = token.is_some() || ai.token_file.is_some();
    let has_basic = username.is_some() || password.is_some();
    if has_token && has_basic {
        return Err(UpstreamError::Kubeconfig(format!(
            "more than one authentication method found for {user}; found [token basicAuth], only one is allowed"
        )));
    }
    let provider = match &ai.auth_provider {
        Some(p) => Some(auth_provider(p, args, user)?),
        None => None,
    };
    if provider.is_some() && ai.exec.is_some() {
        return Err(UpstreamError::Kubeconfig(
            "execProvider and authProvider cannot be used in combination".into(),
        ));
    }
    let start = |source| {
        DynamicToken::start(source)
            .map(Auth::Dynamic)
            .map_err(|e| UpstreamError::Kubeconfig(format!("credential thread: {e}")))
    };
    if let Some(t) = token.filter(|_| !args.token.is_empty() || ai.token_file.is_none()) {
        return Ok(Auth::Bearer(t));
    }
    if let Some(f) = &ai.token_file {
        // kubectl reads it once at start and fails when it cannot.
        read(f)?;
        return start(TokenSource::File(PathBuf::from(f)));
    }
    if has_basic {
        return Ok(Auth::Basic {
            user: username.unwrap_or_default(),
            password: password.unwrap_or_default(),
        });
    }
    // Inside the token and basic-auth round trippers: used only when
    // neither set Authorization.
    if let Some(p) = provider {
        return start(p);
    }
    // transport.Config.HasCertAuth: a certificate and a key, each from a
    // file or inline data.
    let has_cert = (ai.client_certificate.is_some() || ai.client_certificate_data.is_some())
        && (ai.client_key.is_some() || ai.client_key_data.is_some());
    if let Some(exec) = &ai.exec {
        let plugin = ExecPlugin::from_config(exec, user).map_err(UpstreamError::Kubeconfig)?;
        // client-go's exec `UpdateTransportConfig` leaves the transport
        // alone (no plugin run, no error) when a static client certificate
        // is configured: the static one is used.
        if !has_cert {
            return start(TokenSource::Exec(Box::new(plugin)));
        }
    }
    Ok(Auth::None)
}

/// Resolves the upstream from the kubeconfig and the override flags.
pub async fn resolve(args: &ProxyArgs) -> Result<Upstream, UpstreamError> {
    let (mut config, user, cluster_proxy) = load_config(args).await?;
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
    let impersonation = impersonation(args, &config.auth_info);
    impersonation
        .validate(&user)
        .map_err(|e| UpstreamError::Kubeconfig(e.to_string()))?;

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
    // client-go merges user credentials only for a TLS transport.
    let auth = if https {
        credentials(args, &config, &user)?
    } else {
        Auth::None
    };
    let url = &config.cluster_url;
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
        // Only the certificate fields: kube would run an exec plugin here.
        let mut tls_config = config.clone();
        let ai = &config.auth_info;
        tls_config.auth_info = kube::config::AuthInfo {
            client_certificate: ai.client_certificate.clone(),
            client_certificate_data: ai.client_certificate_data.clone(),
            client_key: ai.client_key.clone(),
            client_key_data: ai.client_key_data.clone(),
            ..Default::default()
        };
        let mut tls = tls_config
            .rustls_client_config()
            .map_err(|e| UpstreamError::Tls(e.to_string()))?;
        // An exec plugin's certificate, current at each handshake
        // (client-go's `GetCert` callback).
        if let Some(d) = auth.dynamic().filter(|d| d.is_exec()) {
            tls.client_auth_cert_resolver = Arc::new(PluginCert(d.clone()));
            // A resumed TLS session keeps the identity of the certificate
            // of its first handshake: after a rotation the server would
            // still see the old one. Go's client (client-go sets no
            // ClientSessionCache) never resumes either.
            tls.resumption = rustls::client::Resumption::disabled();
        }
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
    // client-go: the kubeconfig's proxy-url for every host, else the
    // environment (rest.Config.Proxy / http.ProxyFromEnvironment).
    let proxy = match cluster_proxy {
        Some((cluster, raw)) => Some(parse_kubeconfig_proxy(&raw).map_err(|e| {
            UpstreamError::Kubeconfig(format!(
                "invalid 'proxy-url' {raw:?} for cluster {cluster:?}: {e}"
            ))
        })?),
        None => EnvProxy::from_lookup(|k| std::env::var(k).ok()).proxy_for(https, &bare_host, port),
    };
    if let Some(p) = &proxy {
        tracing::debug!(proxy = %p.addr(), scheme = ?p.scheme, "upstream through a proxy");
    }
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
        impersonation,
        proxy,
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

    #[test]
    fn head_data_for_the_rewrite() {
        let mut up = Upstream {
            dial: "10.0.0.1:6443".into(),
            host_header: "api:6443".into(),
            tls: None,
            tls_h2: None,
            server_name: "api".into(),
            base_path: "/base".into(),
            auth: Auth::Bearer("tok".into()),
            impersonation: Impersonation {
                user: "me".into(),
                ..Default::default()
            },
            proxy: Some(parse_kubeconfig_proxy("http://u:p@proxy:3128").unwrap()),
        };
        let h = up.head();
        assert_eq!(h.host, "api:6443");
        assert_eq!(h.authorization.as_deref(), Some("Bearer tok"));
        assert_eq!(h.impersonation.user, "me");
        let fp = h.forward_proxy.expect("plain http through an HTTP proxy");
        assert_eq!(fp.authorization.as_deref(), Some("Basic dTpw"));
        // SOCKS5 and TLS upstreams are tunnelled, never written in absolute form.
        up.proxy = Some(parse_kubeconfig_proxy("socks5://proxy:1080").unwrap());
        assert!(up.head().forward_proxy.is_none());
        up.proxy = Some(parse_kubeconfig_proxy("http://proxy:3128").unwrap());
        assert!(up.head().forward_proxy.unwrap().authorization.is_none());
        up.auth = Auth::None;
        assert!(up.head().authorization.is_none());
    }
}
