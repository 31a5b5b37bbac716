//! The `oidc` auth-provider at run time, on the credentials control thread
//! (never on a data-plane core): it keeps the provider's config map, hands
//! out the id-token while it is valid and, once it is not, asks the IdP for
//! a new one with the refresh token (discovery, then the token endpoint,
//! with blocking HTTP/1.1 over rustls, through the environment's proxy,
//! redirects followed) and writes the new tokens back into
//! the kubeconfig file the user entry came from, as client-go's
//! plugin/pkg/client/auth/oidc/oidc.go (`idToken`) and clientcmd's
//! `persister` do. What is decided lives in [`protocol::kubectl::upstream::oidc`].

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::ServerName;

use super::proxy_dial::through_proxy_blocking;
use protocol::http1::{self, ChunkedDecoder, Framing, HeadLimit};
use protocol::kubectl::upstream::oidc::{self as policy, redirect, AuthStyle, ProviderConfig};
use protocol::kubectl::upstream::proxy_url::{EnvProxy, ProxyScheme};

/// Go's default dialer timeout in client-go's transports.
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bounds a silent IdP (Go has no overall timeout here; a stuck IdP would
/// hold every request of the proxy).
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest discovery document read.
const DISCOVERY_LIMIT: usize = 4 << 20;

/// Where refreshed tokens are written (clientcmd `PersisterForUser`).
#[derive(Debug, Clone)]
pub struct Persister {
    /// The kubeconfig files in loading precedence.
    pub files: Vec<PathBuf>,
    /// The user entry's name.
    pub user: String,
}

/// A live `oidc` provider.
pub struct OidcProvider {
    cfg: BTreeMap<String, String>,
    checked: ProviderConfig,
    tls: Arc<rustls::ClientConfig>,
    /// HTTPS_PROXY/HTTP_PROXY/NO_PROXY, read once (Go caches them too).
    env: EnvProxy,
    persister: Option<Persister>,
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl OidcProvider {
    /// Checks the entry as `newOIDCAuthProvider` does; `tls` trusts
    /// `idp-certificate-authority(-data)` or the system roots.
    pub fn new(
        cfg: BTreeMap<String, String>,
        checked: ProviderConfig,
        tls: Arc<rustls::ClientConfig>,
        persister: Option<Persister>,
    ) -> OidcProvider {
        if cfg.get(policy::EXTRA_SCOPES).is_some_and(|s| !s.is_empty()) {
            tracing::debug!(
                "{} auth provider field depricated, refresh request don't send scopes",
                policy::EXTRA_SCOPES
            );
        }
        OidcProvider {
            cfg,
            checked,
            tls,
            env: EnvProxy::from_lookup(|k| std::env::var(k).ok()),
            persister,
        }
    }

    /// The id-token to send and its `exp` (client-go's `idToken`): the one
    /// held while valid, else a refreshed one (persisted first).
    pub fn id_token(&mut self) -> Result<(String, Option<i64>), String> {
        if let Some(t) = self.cfg.get(policy::ID_TOKEN).filter(|t| !t.is_empty()) {
            if policy::id_token_valid(t, now_secs()).map_err(|e| e.to_string())? {
                return Ok((t.clone(), policy::id_token_exp(t)));
            }
        }
        let rt = self
            .cfg
            .get(policy::REFRESH_TOKEN)
            .filter(|t| !t.is_empty())
            .cloned()
            .ok_or_else(|| policy::OidcError::NoRefreshToken.to_string())?;
        let token_url = self.token_endpoint()?;
        let refreshed = self.refresh(&token_url, &rt)?;
        let new_cfg = policy::persisted_config(&self.cfg, &refreshed);
        if let Some(p) = &self.persister {
            persist(p, &new_cfg).map_err(|e| format!("could not persist new tokens: {e}"))?;
        }
        self.cfg = new_cfg;
        let exp = policy::id_token_exp(&refreshed.id_token);
        Ok((refreshed.id_token, exp))
    }

    fn token_endpoint(&self) -> Result<String, String> {
        let url = policy::discovery_url(&self.checked.issuer);
        let a = request(
            &self.tls,
            &self.env,
            "GET",
            &url,
            None,
            b"",
            DISCOVERY_LIMIT,
        )?;
        policy::parse_discovery(a.code, &a.status, &a.body).map_err(|e| e.to_string())
    }

    /// oauth2's refresh with `AuthStyleAutoDetect` on a fresh config: the
    /// client in a Basic header first, on any failure in the form.
    fn refresh(&self, token_url: &str, rt: &str) -> Result<policy::Refreshed, String> {
        let mut last = String::new();
        for style in [AuthStyle::Header, AuthStyle::Params] {
            let r = policy::refresh_request(
                &self.checked.client_id,
                &self.checked.client_secret,
                rt,
                style,
            );
            let answer = request(
                &self.tls,
                &self.env,
                "POST",
                token_url,
                r.authorization.as_deref(),
                r.body.as_bytes(),
                policy::TOKEN_BODY_LIMIT,
            );
            let result = match answer {
                Ok(a) => policy::parse_token_response(
                    a.code,
                    &a.status,
                    a.content_type.as_deref(),
                    &a.body,
                    rt,
                )
                .map_err(|e| e.to_string()),
                Err(e) => Err(format!("failed to refresh token: {e}")),
            };
            match result {
                Ok(r) => return Ok(r),
                // client-go's own check comes after oauth2 succeeded.
                Err(e) if e == policy::OidcError::NoIdToken.to_string() => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// One answer from the IdP.
struct Answer {
    code: u16,
    /// Go's `resp.Status`: "200 OK".
    status: String,
    content_type: Option<String>,
    location: Option<String>,
    body: Vec<u8>,
}

trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// One request as Go's `http.Client.Do` makes it: sent, and its redirects
/// followed ([`redirect::Chain`]); the first request's headers go along
/// (`Authorization` only while the chain stays on its host), with a
/// `Referer`.
fn request(
    tls: &Arc<rustls::ClientConfig>,
    env: &EnvProxy,
    method: &str,
    url: &str,
    authorization: Option<&str>,
    body: &[u8],
    limit: usize,
) -> Result<Answer, String> {
    let mut chain = redirect::Chain::new(method, url);
    // The first request has a body (and Content-Type) when it is a POST.
    let has_body = method == "POST";
    let content_type = has_body.then_some("application/x-www-form-urlencoded");
    let mut hop = redirect::Hop {
        method: method.to_string(),
        url: url.to_string(),
        body: true,
        authorization: true,
        referer: None,
    };
    loop {
        let req = Hop {
            method: &hop.method,
            url: &hop.url,
            authorization: authorization.filter(|_| hop.authorization),
            content_type,
            referer: hop.referer.as_deref(),
            body: (has_body && hop.body).then_some(body),
        };
        let a = send(tls, env, &req, limit)
            .map_err(|e| format!("{} {:?}: {e}", chain.op(), hop.url))?;
        match chain.next(&hop.method, &hop.url, a.code, a.location.as_deref()) {
            redirect::Step::Done => return Ok(a),
            redirect::Step::Follow(next) => {
                tracing::debug!(status = a.code, to = %next.url, "IdP redirect followed");
                hop = next;
            }
            redirect::Step::Fail { url, error } => {
                return Err(format!("{} {url:?}: {error}", chain.op()))
            }
        }
    }
}

/// One request of a chain.
struct Hop<'a> {
    method: &'a str,
    url: &'a str,
    authorization: Option<&'a str>,
    content_type: Option<&'a str>,
    referer: Option<&'a str>,
    /// None: no body, no Content-Length.
    body: Option<&'a [u8]>,
}

/// Connects to `host:port` (any of its addresses).
fn dial(host: &str, port: u16) -> Result<TcpStream, String> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .collect();
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, DIAL_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or_else(|| "no address".to_string(), |e| e.to_string()))
}

/// One HTTP/1.1 request on a new connection (blocking; control thread),
/// through the environment's proxy for the URL if it has one (Go's
/// `ProxyFromEnvironment`, as client-go's `TransportFor` sets it).
fn send(
    tls: &Arc<rustls::ClientConfig>,
    env: &EnvProxy,
    req: &Hop<'_>,
    limit: usize,
) -> Result<Answer, String> {
    let uri: http::Uri = req
        .url
        .parse()
        .map_err(|e: http::uri::InvalidUri| e.to_string())?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        other => {
            return Err(format!(
                "unsupported protocol scheme {:?}",
                other.unwrap_or("")
            ))
        }
    };
    let host = uri.host().ok_or("no Host in request URL")?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let proxy = env.proxy_for(https, bare, port);
    let tcp = match &proxy {
        Some(p) => {
            tracing::debug!(proxy = %p.addr(), "IdP through a proxy");
            let mut tcp = dial(&p.host, p.port).map_err(|e| format!("proxyconnect tcp: {e}"))?;
            through_proxy_blocking(&mut tcp, p, bare, port, https)?;
            tcp
        }
        None => dial(bare, port)?,
    };
    let _ = tcp.set_read_timeout(Some(IO_TIMEOUT));
    let _ = tcp.set_write_timeout(Some(IO_TIMEOUT));
    let _ = tcp.set_nodelay(true);
    let mut stream: Box<dyn Stream> = if https {
        let name = ServerName::try_from(bare.to_string()).map_err(|e| e.to_string())?;
        let conn = rustls::ClientConnection::new(tls.clone(), name).map_err(|e| e.to_string())?;
        Box::new(rustls::StreamOwned::new(conn, tcp))
    } else {
        Box::new(tcp)
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let host_header = match uri.port_u16() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    // A plain-http URL through an HTTP proxy: absolute form, the proxy's
    // credentials in Proxy-Authorization.
    let forward = proxy
        .as_ref()
        .filter(|p| !https && p.scheme != ProxyScheme::Socks5);
    let target = match forward {
        Some(_) => format!("http://{host_header}{path}"),
        None => path.to_string(),
    };
    // The headers Go's client sends, less Accept-Encoding (no gzip here).
    let mut head = format!(
        "{} {target} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: Go-http-client/1.1\r\n",
        req.method
    );
    if let Some(b) = req.body {
        head.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    if let Some(a) = req.authorization {
        head.push_str(&format!("Authorization: {a}\r\n"));
    }
    if let Some(t) = req.content_type {
        head.push_str(&format!("Content-Type: {t}\r\n"));
    }
    if let Some(a) = forward.and_then(|p| p.basic_auth()) {
        head.push_str(&format!("Proxy-Authorization: {a}\r\n"));
    }
    if let Some(r) = req.referer {
        head.push_str(&format!("Referer: {r}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(req.body.unwrap_or_default());
    stream.write_all(&out).map_err(|e| e.to_string())?;
    stream.flush().map_err(|e| e.to_string())?;
    read_answer(&mut *stream, req.method, limit)
}

fn read_answer(s: &mut dyn Stream, method: &str, limit: usize) -> Result<Answer, String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut eof = false;
    let mut fill = |buf: &mut Vec<u8>, eof: &mut bool| -> Result<(), String> {
        match s.read(&mut chunk) {
            Ok(0) => *eof = true,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // A peer that closes without close_notify ends the body too.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => *eof = true,
            Err(e) => return Err(e.to_string()),
        }
        Ok(())
    };
    let (head, used) = loop {
        match http1::parse_response(&buf, HeadLimit::GO_SERVER).map_err(|e| e.to_string())? {
            // 1xx answers other than 101 are skipped, as Go does.
            Some((h, n)) if (100..200).contains(&h.status) && h.status != 101 => {
                buf.drain(..n);
            }
            Some(done) => break done,
            None if eof => return Err("unexpected EOF".into()),
            None => fill(&mut buf, &mut eof)?,
        }
    };
    buf.drain(..used);
    let framing = http1::response_framing(method, &head).map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    match framing {
        Framing::None => {}
        Framing::Length(n) => {
            while (buf.len() as u64) < n && !eof {
                if buf.len() > limit {
                    break;
                }
                fill(&mut buf, &mut eof)?;
            }
            if (buf.len() as u64) < n && eof {
                return Err("unexpected EOF".into());
            }
            buf.truncate(n.min(buf.len() as u64) as usize);
            body = buf;
        }
        Framing::Chunked => {
            let mut dec = ChunkedDecoder::new();
            loop {
                let p = dec.advance(&buf).map_err(|e| e.to_string())?;
                for r in &p.data {
                    body.extend_from_slice(&buf[r.clone()]);
                }
                buf.drain(..p.consumed);
                if p.done || body.len() > limit {
                    break;
                }
                if eof {
                    return Err("unexpected EOF".into());
                }
                fill(&mut buf, &mut eof)?;
            }
        }
        Framing::UntilClose => {
            while !eof && buf.len() <= limit {
                fill(&mut buf, &mut eof)?;
            }
            body = buf;
        }
    }
    body.truncate(limit);
    let reason = if head.reason.is_empty() {
        http::StatusCode::from_u16(head.status)
            .ok()
            .and_then(|c| c.canonical_reason())
            .unwrap_or("")
            .to_string()
    } else {
        head.reason.clone()
    };
    Ok(Answer {
        code: head.status,
        status: format!("{} {reason}", head.status),
        content_type: http1::get(&head.headers, "content-type").map(str::to_string),
        location: http1::get(&head.headers, "location").map(str::to_string),
        body,
    })
}

/// The first kubeconfig file (in loading precedence) that has the user
/// entry: where clientcmd's merge took it from (`LocationOfOrigin`).
fn origin(p: &Persister) -> Option<(PathBuf, serde_json::Value)> {
    for f in &p.files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let Ok(doc) = serde_saphyr::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let has = doc["users"]
            .as_array()
            .is_some_and(|u| u.iter().any(|e| e["name"] == p.user.as_str()));
        if has {
            return Some((f.clone(), doc));
        }
    }
    None
}

/// Holds clientcmd's `<file>.lock` files while a kubeconfig is rewritten.
struct Locks(Vec<PathBuf>);

impl Locks {
    fn take(files: &[PathBuf]) -> Result<Locks, String> {
        let mut sorted = files.to_vec();
        sorted.sort();
        let mut held = Locks(Vec::new());
        for f in sorted {
            let mut lock = f.clone().into_os_string();
            lock.push(".lock");
            let lock = PathBuf::from(lock);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
                .map_err(|e| format!("open {}: {e}", lock.display()))?;
            held.0.push(lock);
        }
        Ok(held)
    }
}

impl Drop for Locks {
    fn drop(&mut self) {
        for l in &self.0 {
            let _ = std::fs::remove_file(l);
        }
    }
}

/// clientcmd's `persister.Persist`: the user's auth-provider config is
/// replaced in the file it came from (nothing is written when the entry
/// has no auth-provider there). The rest of the file is kept (re-written
/// as YAML, comments dropped, as kubectl does).
fn persist(p: &Persister, cfg: &BTreeMap<String, String>) -> Result<(), String> {
    let _locks = Locks::take(&p.files)?;
    let Some((file, mut doc)) = origin(p) else {
        return Ok(());
    };
    let Some(entry) = doc["users"].as_array_mut().and_then(|u| {
        u.iter_mut()
            .find(|e| e["name"] == p.user.as_str())
            .and_then(|e| e.get_mut("user"))
            .and_then(|u| u.get_mut("auth-provider"))
            .filter(|a| a.is_object())
    }) else {
        return Ok(());
    };
    entry["config"] = serde_json::to_value(cfg).map_err(|e| e.to_string())?;
    let text = serde_saphyr::to_string(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&file, text).map_err(|e| format!("open {}: {e}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persist_replaces_only_the_auth_provider_config() {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("a.yaml");
        let second = dir.path().join("b.yaml");
        std::fs::write(
            &first,
            "apiVersion: v1\nkind: Config\nusers:\n- name: other\n  user: {token: t}\n",
        )
        .unwrap();
        std::fs::write(
            &second,
            "apiVersion: v1\nkind: Config\n# a comment\nusers:\n- name: me\n  user:\n    auth-provider:\n      name: oidc\n      config:\n        id-token: old\n        client-id: \"0123\"\n",
        )
        .unwrap();
        let p = Persister {
            files: vec![first.clone(), second.clone()],
            user: "me".into(),
        };
        let cfg: BTreeMap<String, String> = [("id-token", "new"), ("client-id", "0123")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        persist(&p, &cfg).unwrap();
        let doc: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(&second).unwrap()).unwrap();
        assert_eq!(doc["users"][0]["user"]["auth-provider"]["name"], "oidc");
        assert_eq!(
            doc["users"][0]["user"]["auth-provider"]["config"],
            serde_json::json!({"id-token": "new", "client-id": "0123"})
        );
        assert_eq!(doc["kind"], "Config");
        assert!(std::fs::read_to_string(&first).unwrap().contains("other"));
        assert!(!dir.path().join("a.yaml.lock").exists());
        // A lock held by someone else: refused, nothing written.
        std::fs::write(dir.path().join("b.yaml.lock"), "").unwrap();
        assert!(persist(&p, &cfg).unwrap_err().contains("b.yaml.lock"));
        assert!(!dir.path().join("a.yaml.lock").exists());
    }
}
