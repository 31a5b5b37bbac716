//! Credentials that change while the proxy runs: an exec credential
//! plugin (`user.exec`: a bearer token and/or a TLS client certificate) and
//! a token file (`user.tokenFile`, the in-cluster service account token).
//! One control thread owns the fetching (running the plugin, reading the
//! file); the data-plane cores only read the cached value and, when it is
//! missing, expired or was refused with a 401, ask the control thread and
//! await its answer on a oneshot channel, so no core ever blocks on a plugin.
//!
//! Caching follows client-go: a plugin runs on the first request, again
//! when the cached credential's `expirationTimestamp` has passed, and again
//! after a 401 answered a request that used the cached credential
//! (plugin/pkg/client/auth/exec/exec.go, `getCreds`, `maybeRefreshCreds`);
//! a token file is read again when its copy is older than 50 s (client-go's
//! `NewCachedFileTokenSource`: period one minute, leeway 10 s) or after a
//! 401 (`ResetTokenOlderThan`), keeping the last good token when a read fails.
//!
//! A plugin's client certificate is handed to every new upstream TLS
//! handshake by [`PluginCert`] (client-go's `GetCert` callback, which
//! returns the cached certificate); when a fetch brings a different
//! certificate, [`DynamicToken::cert_generation`] moves on so that pooled
//! connections made with the old one are not used again (client-go closes
//! them all through its `connTracker` on rotation).
//! An `oidc` auth-provider ([`super::oidc`]) is asked again when its
//! id-token's `exp` (less 10 s) has passed, and not after a 401: client-go's
//! oidc round tripper refreshes only by expiry.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::channel::oneshot;
use kube::config::{ExecConfig, ExecInteractiveMode};
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;

use super::oidc::OidcProvider;
use protocol::kubectl::upstream::exec_credential;

/// How long a token file's copy is used before it is read again.
const FILE_TOKEN_TTL: Duration = Duration::from_secs(50);

/// Where a changing token comes from.
pub enum TokenSource {
    Exec(Box<ExecPlugin>),
    File(PathBuf),
    Oidc(Box<OidcProvider>),
}

impl TokenSource {
    /// Whether a 401 makes the token be fetched again.
    fn refetch_on_401(&self) -> bool {
        !matches!(self, TokenSource::Oidc(_))
    }
}

/// A `user.exec` entry, checked.
pub struct ExecPlugin {
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub api_version: String,
    pub interactive_mode: ExecInteractiveMode,
    /// `spec.cluster` when `provideClusterInfo` is set.
    pub cluster: Option<serde_json::Value>,
}

impl ExecPlugin {
    /// Checks an exec entry as clientcmd's `validateAuthInfo` does.
    pub fn from_config(e: &ExecConfig, user: &str) -> Result<ExecPlugin, String> {
        let command = e.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err(format!(
                "command must be specified for {user} to use exec authentication plugin"
            ));
        }
        let api_version = e.api_version.clone().unwrap_or_default();
        if api_version.is_empty() {
            return Err(format!(
                "apiVersion must be specified for {user} to use exec authentication plugin"
            ));
        }
        if api_version != exec_credential::V1 && api_version != exec_credential::V1BETA1 {
            return Err(format!("exec plugin: invalid apiVersion {api_version:?}"));
        }
        let interactive_mode = match (&e.interactive_mode, api_version.as_str()) {
            (Some(m), _) => m.clone(),
            // v1 requires the field; v1beta1 defaults to IfAvailable.
            (None, exec_credential::V1) => {
                return Err(format!(
                    "interactiveMode must be specified for {user} to use exec authentication plugin"
                ))
            }
            (None, _) => ExecInteractiveMode::IfAvailable,
        };
        let mut env = Vec::new();
        for pair in e.env.iter().flatten() {
            let name = pair.get("name").cloned().unwrap_or_default();
            if name.is_empty() {
                return Err(format!(
                    "env variable name must be specified for {user} to use exec authentication plugin"
                ));
            }
            env.push((name, pair.get("value").cloned().unwrap_or_default()));
        }
        let cluster = if e.provide_cluster_info {
            e.cluster
                .as_ref()
                .and_then(|c| serde_json::to_value(c).ok())
        } else {
            None
        };
        Ok(ExecPlugin {
            command,
            args: e.args.clone().unwrap_or_default(),
            env,
            api_version,
            interactive_mode,
            cluster,
        })
    }

    /// Runs the plugin once (on the control thread).
    fn run(&self) -> Result<exec_credential::Credential, String> {
        let tty = std::io::stdin().is_terminal();
        let interactive =
            match self.interactive_mode {
                ExecInteractiveMode::Never => false,
                ExecInteractiveMode::IfAvailable => tty,
                ExecInteractiveMode::Always if tty => true,
                ExecInteractiveMode::Always => return Err(
                    "exec plugin cannot support interactive mode: standard input is not a terminal"
                        .into(),
                ),
            };
        let info = exec_credential::exec_info(&self.api_version, interactive, self.cluster.clone())
            .map_err(|e| e.to_string())?;
        let mut cmd = std::process::Command::new(&self.command);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("KUBERNETES_EXEC_INFO", info)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .stdin(if interactive {
                std::process::Stdio::inherit()
            } else {
                std::process::Stdio::null()
            });
        let out = cmd
            .output()
            .map_err(|e| format!("exec: executable {} failed: {e}", self.command))?;
        if !out.status.success() {
            return Err(format!(
                "exec: executable {} failed with {}",
                self.command, out.status
            ));
        }
        exec_credential::parse(&self.api_version, &out.stdout).map_err(|e| e.to_string())
    }
}

#[derive(Default)]
struct Cached {
    header: Option<Arc<str>>,
    /// The plugin's client certificate, ready for handshakes.
    cert: Option<Arc<CertifiedKey>>,
    /// Its PEM text, to tell a new certificate from the same one again.
    cert_pem: Option<(String, String)>,
    /// Bumped by every successful fetch: names the credential a request
    /// used (client-go compares its `credentials` pointer).
    serial: u64,
    /// Unix seconds; after it the value must be fetched again.
    expires: Option<f64>,
    stale: bool,
    /// Plugin runs or file reads so far.
    fetches: u64,
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Cached {
    fn fresh(&self) -> bool {
        self.serial > 0 && !self.stale && self.expires.is_none_or(|e| now_secs() <= e)
    }

    fn used(&self) -> Used {
        Used {
            header: self.header.clone(),
            serial: self.serial,
        }
    }
}

/// The credential a request went out with.
#[derive(Clone, Debug)]
pub struct Used {
    /// The `Authorization` value (None: the plugin gave only a certificate).
    pub header: Option<Arc<str>>,
    serial: u64,
}

enum Msg {
    Get(oneshot::Sender<Result<Used, String>>),
    Refused(u64, oneshot::Sender<()>),
}

/// Credentials shared by all cores and kept current by a control thread.
pub struct DynamicToken {
    cached: Mutex<Cached>,
    tx: Mutex<mpsc::Sender<Msg>>,
    /// Moves on whenever the client certificate changes.
    cert_generation: AtomicU64,
    /// An exec plugin (which may return a certificate), not a token file.
    exec: bool,
    refetch_on_401: bool,
    fetch_at_start: bool,
}

impl DynamicToken {
    /// Starts the control thread for `source`.
    pub fn start(mut source: TokenSource) -> std::io::Result<Arc<DynamicToken>> {
        let (tx, rx) = mpsc::channel();
        let me = Arc::new(DynamicToken {
            cached: Mutex::new(Cached::default()),
            tx: Mutex::new(tx),
            cert_generation: AtomicU64::new(0),
            exec: matches!(source, TokenSource::Exec(_)),
            refetch_on_401: source.refetch_on_401(),
            fetch_at_start: matches!(source, TokenSource::Oidc(_)),
        });
        let weak = Arc::downgrade(&me);
        std::thread::Builder::new()
            .name("proxy-credentials".into())
            .spawn(move || {
                for msg in rx {
                    let Some(me) = weak.upgrade() else { return };
                    me.handle(&mut source, msg);
                }
            })?;
        Ok(me)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.cached.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, msg: Msg) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let _ = tx.send(msg);
    }

    /// The `Authorization` value last fetched (never blocks).
    pub fn current(&self) -> Option<String> {
        self.lock().header.as_ref().map(|h| h.to_string())
    }

    /// Whether the token is fetched before the proxy serves (the oidc
    /// provider: kubectl's start-up request refreshes it).
    pub fn fetch_at_start(&self) -> bool {
        self.fetch_at_start
    }

    /// How many times the plugin ran or the file was read.
    pub fn fetches(&self) -> u64 {
        self.lock().fetches
    }

    /// Whether the credentials come from an exec plugin (which may hand
    /// out a client certificate).
    pub fn is_exec(&self) -> bool {
        self.exec
    }

    /// The client certificate last fetched (never blocks).
    pub fn client_cert(&self) -> Option<Arc<CertifiedKey>> {
        self.lock().cert.clone()
    }

    /// Changes whenever the client certificate does: a connection made
    /// under another generation presented an old certificate.
    pub fn cert_generation(&self) -> u64 {
        self.cert_generation.load(Ordering::Acquire)
    }

    /// A current credential, fetched first when there is none, it expired
    /// or it was refused. Awaits the control thread, never blocks the
    /// calling core.
    pub async fn ready(&self) -> Result<Used, String> {
        {
            let c = self.lock();
            if c.fresh() {
                return Ok(c.used());
            }
        }
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Get(tx));
        rx.await
            .map_err(|_| "credential thread ended".to_string())?
    }

    /// Before a TLS handshake toward the upstream: makes sure the
    /// certificate [`PluginCert`] hands out is current, as client-go's
    /// `GetCert` callback (`getCreds`) does: fetched when nothing was yet,
    /// again when the cached certificate expired. A plugin that gave only
    /// a token is not run again here (the request itself refreshes it).
    pub async fn ready_for_handshake(&self) -> Result<(), String> {
        if !self.exec {
            return Ok(());
        }
        {
            let c = self.lock();
            if c.serial > 0 && (c.cert.is_none() || c.fresh()) {
                return Ok(());
            }
        }
        self.ready().await.map(|_| ())
    }

    /// The upstream answered 401 to a request that used `used`: fetch
    /// again (once, however many requests were refused with the same
    /// credential) and, as client-go, before the 401 goes back to the client.
    pub async fn refused(&self, used: &Used) {
        if !self.refetch_on_401 {
            return;
        }
        let rx = {
            let mut c = self.lock();
            if c.serial != used.serial || c.stale {
                return;
            }
            c.stale = true;
            let (tx, rx) = oneshot::channel();
            drop(c);
            self.send(Msg::Refused(used.serial, tx));
            rx
        };
        let _ = rx.await;
    }

    fn handle(&self, source: &mut TokenSource, msg: Msg) {
        match msg {
            Msg::Get(reply) => {
                let r = {
                    let c = self.lock();
                    c.fresh().then(|| c.used())
                };
                let r = match r {
                    Some(u) => Ok(u),
                    None => self.fetch(source),
                };
                let _ = reply.send(r);
            }
            Msg::Refused(serial, done) => {
                let again = {
                    let c = self.lock();
                    c.stale && c.serial == serial
                };
                if again {
                    if let Err(e) = self.fetch(source) {
                        tracing::error!("refreshing credentials: {e}");
                    }
                }
                let _ = done.send(());
            }
        }
    }

    fn fetch(&self, source: &mut TokenSource) -> Result<Used, String> {
        self.lock().fetches += 1;
        match source {
            TokenSource::Exec(p) => {
                let cred = p.run().map_err(|e| format!("getting credentials: {e}"))?;
                // Parsed here, off the cores; a bad pair keeps the old
                // credential, as client-go (`refreshCredsLocked` returns
                // before caching).
                let cert = match &cred.client_cert {
                    Some((c, k)) => Some(Arc::new(
                        super::exec_cert::client_key(c, k)
                            .map_err(|e| format!("getting credentials: {e}"))?,
                    )),
                    None => None,
                };
                let header: Option<Arc<str>> = cred
                    .token
                    .map(|t| Arc::from(format!("Bearer {t}").as_str()));
                let mut c = self.lock();
                if c.cert_pem != cred.client_cert {
                    if c.serial > 0 {
                        tracing::info!("exec plugin returned a new client certificate");
                    }
                    self.cert_generation.fetch_add(1, Ordering::AcqRel);
                }
                c.header = header;
                c.cert = cert;
                c.cert_pem = cred.client_cert;
                c.expires = cred.expires_unix.map(|e| e as f64);
                c.stale = false;
                c.serial += 1;
                Ok(c.used())
            }
            TokenSource::File(path) => {
                let read = std::fs::read_to_string(&*path);
                let mut c = self.lock();
                match read {
                    Ok(t) => {
                        let header: Arc<str> = Arc::from(format!("Bearer {}", t.trim()).as_str());
                        c.header = Some(header);
                        c.expires = Some(now_secs() + FILE_TOKEN_TTL.as_secs_f64());
                        c.stale = false;
                        c.serial += 1;
                        Ok(c.used())
                    }
                    Err(e) if c.header.is_some() => {
                        tracing::error!("Unable to rotate token: {}: {e}", path.display());
                        c.expires = Some(now_secs() + FILE_TOKEN_TTL.as_secs_f64());
                        c.stale = false;
                        c.serial += 1;
                        Ok(c.used())
                    }
                    Err(e) => Err(format!("reading {}: {e}", path.display())),
                }
            }
            TokenSource::Oidc(p) => {
                let (token, exp) = p.id_token()?;
                let header: Arc<str> = Arc::from(format!("Bearer {token}").as_str());
                let mut c = self.lock();
                c.header = Some(header);
                // Valid while now + 10 s < exp; asked again from then on.
                c.expires = Some(
                    exp.map_or(0.0, |e| {
                        e as f64 - protocol::kubectl::upstream::oidc::EXPIRY_DELTA_SECS
                    }) - 0.001,
                );
                c.stale = false;
                c.serial += 1;
                Ok(c.used())
            }
        }
    }
}

/// Hands the plugin's current client certificate to each new upstream TLS
/// handshake (rustls asks only when the server requests one). Never
/// blocks: the connection's dialer made it current first
/// ([`DynamicToken::ready_for_handshake`]).
pub struct PluginCert(pub Arc<DynamicToken>);

impl std::fmt::Debug for PluginCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PluginCert")
    }
}

impl ResolvesClientCert for PluginCert {
    fn resolve(
        &self,
        _issuers: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.0.client_cert()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn file_token_reread_after_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "one\n").unwrap();
        let d = DynamicToken::start(TokenSource::File(p.clone())).unwrap();
        let header = |u: Used| u.header.unwrap().to_string();
        let u = block(d.ready()).unwrap();
        assert_eq!(header(u.clone()), "Bearer one");
        std::fs::write(&p, "two").unwrap();
        // Cached: not read again.
        assert_eq!(header(block(d.ready()).unwrap()), "Bearer one");
        assert_eq!(d.fetches(), 1);
        block(d.refused(&u));
        block(d.refused(&u));
        assert_eq!(header(block(d.ready()).unwrap()), "Bearer two");
        assert_eq!(d.fetches(), 2);
        // A failed read keeps the last good token.
        std::fs::remove_file(&p).unwrap();
        let u2 = block(d.ready()).unwrap();
        block(d.refused(&u2));
        assert_eq!(header(block(d.ready()).unwrap()), "Bearer two");
        // A token file never hands out a certificate.
        assert!(d.client_cert().is_none());
        assert_eq!(d.cert_generation(), 0);
    }

    fn pem_pair(cn: &str) -> (String, String) {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        (p.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    fn json_str(s: &str) -> String {
        serde_json::Value::String(s.to_string()).to_string()
    }

    /// A plugin printing `creds/<run>.json`, counting its runs.
    fn cert_plugin(dir: &std::path::Path, answers: &[String]) -> ExecPlugin {
        for (i, a) in answers.iter().enumerate() {
            std::fs::write(dir.join(format!("{}.json", i + 1)), a).unwrap();
        }
        let script = dir.join("plugin.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nd={}\nn=$(( $(cat $d/count 2>/dev/null || echo 0) + 1 ))\necho $n > $d/count\ncat $d/$n.json\n",
                dir.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        ExecPlugin {
            command: script.display().to_string(),
            args: Vec::new(),
            env: Vec::new(),
            api_version: exec_credential::V1.into(),
            interactive_mode: ExecInteractiveMode::Never,
            cluster: None,
        }
    }

    fn cert_answer(pair: &(String, String), expiry: Option<&str>) -> String {
        let exp = expiry
            .map(|e| format!(",\"expirationTimestamp\":\"{e}\""))
            .unwrap_or_default();
        format!(
            "{{\"kind\":\"ExecCredential\",\"apiVersion\":\"{}\",\"status\":{{\"clientCertificateData\":{},\"clientKeyData\":{}{exp}}}}}",
            exec_credential::V1,
            json_str(&pair.0),
            json_str(&pair.1)
        )
    }

    #[test]
    fn plugin_certificate_cached_rotated_and_bad_pairs_kept_out() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (pem_pair("a"), pem_pair("b"));
        let mismatched = (a.0.clone(), b.1.clone());
        let answers = [
            cert_answer(&a, None),
            cert_answer(&a, Some("2000-01-01T00:00:00Z")),
            cert_answer(&mismatched, None),
            cert_answer(&b, None),
        ];
        let d = DynamicToken::start(TokenSource::Exec(Box::new(cert_plugin(
            dir.path(),
            &answers,
        ))))
        .unwrap();
        assert!(d.client_cert().is_none());
        // First handshake: the plugin runs; a certificate, no token.
        block(d.ready_for_handshake()).unwrap();
        let g1 = d.cert_generation();
        let leaf = |d: &DynamicToken| d.client_cert().unwrap().cert[0].to_vec();
        let leaf_a = leaf(&d);
        let u1 = block(d.ready()).unwrap();
        assert!(u1.header.is_none());
        block(d.ready_for_handshake()).unwrap();
        assert_eq!(d.fetches(), 1);
        // A 401: run again; the same certificate keeps the generation.
        block(d.refused(&u1));
        assert_eq!(d.fetches(), 2);
        assert_eq!(d.cert_generation(), g1);
        // That answer expired already: the next handshake runs the plugin,
        // which now returns a key that is not the certificate's.
        let e = block(d.ready_for_handshake()).unwrap_err();
        assert!(
            e.contains(
                "failed parsing client key/certificate: tls: private key does not match public key"
            ),
            "{e}"
        );
        assert_eq!(leaf(&d), leaf_a, "a bad pair is not cached");
        // Then a new certificate: a new generation.
        block(d.ready_for_handshake()).unwrap();
        assert_eq!(d.fetches(), 4);
        assert_ne!(leaf(&d), leaf_a);
        assert_ne!(d.cert_generation(), g1);
        let r = PluginCert(d.clone());
        assert!(r.has_certs());
        assert_eq!(r.resolve(&[], &[]).unwrap().cert[0].to_vec(), leaf(&d));
    }
}
