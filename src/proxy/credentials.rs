//! Bearer tokens that change while the proxy runs: an exec credential
//! plugin (`user.exec`) and a token file (`user.tokenFile`, the in-cluster
//! service account token). One control thread owns the fetching (running
//! the plugin, reading the file); the data-plane cores only read the
//! cached value and, when it is missing, expired or was refused with a
//! 401, ask the control thread and await its answer on a oneshot channel,
//! so no core ever blocks on a plugin.
//!
//! Caching follows client-go: a plugin runs on the first request, again
//! when the cached credential's `expirationTimestamp` has passed, and again
//! after a 401 answered a request that carried the cached token
//! (plugin/pkg/client/auth/exec/exec.go, `getCreds`, `maybeRefreshCreds`);
//! a token file is read again when its copy is older than 50 s (client-go's
//! `NewCachedFileTokenSource`: period one minute, leeway 10 s) or after a
//! 401 (`ResetTokenOlderThan`), keeping the last good token when a read fails.
//! An `oidc` auth-provider ([`super::oidc`]) is asked again when its
//! id-token's `exp` (less 10 s) has passed, and not after a 401: client-go's
//! oidc round tripper refreshes only by expiry.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::channel::oneshot;
use kube::config::{ExecConfig, ExecInteractiveMode};

use super::oidc::OidcProvider;
use crate::protocol::exec_credential;

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
        self.header.is_some() && !self.stale && self.expires.is_none_or(|e| now_secs() <= e)
    }
}

enum Msg {
    Get(oneshot::Sender<Result<Option<Arc<str>>, String>>),
    Refused(Arc<str>, oneshot::Sender<()>),
}

/// A token shared by all cores and kept current by a control thread.
pub struct DynamicToken {
    cached: Mutex<Cached>,
    tx: Mutex<mpsc::Sender<Msg>>,
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

    /// A current `Authorization` value, fetched first when there is none,
    /// it expired or it was refused. Awaits the control thread, never
    /// blocks the calling core.
    pub async fn ready(&self) -> Result<Option<Arc<str>>, String> {
        {
            let c = self.lock();
            if c.fresh() {
                return Ok(c.header.clone());
            }
        }
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Get(tx));
        rx.await
            .map_err(|_| "credential thread ended".to_string())?
    }

    /// The upstream answered 401 to a request carrying `used`: fetch again
    /// (once, however many requests were refused with the same value) and,
    /// as client-go, before the 401 goes back to the client.
    pub async fn refused(&self, used: &Arc<str>) {
        if !self.refetch_on_401 {
            return;
        }
        let rx = {
            let mut c = self.lock();
            if c.header.as_ref() != Some(used) || c.stale {
                return;
            }
            c.stale = true;
            let (tx, rx) = oneshot::channel();
            drop(c);
            self.send(Msg::Refused(used.clone(), tx));
            rx
        };
        let _ = rx.await;
    }

    fn handle(&self, source: &mut TokenSource, msg: Msg) {
        match msg {
            Msg::Get(reply) => {
                let r = {
                    let c = self.lock();
                    c.fresh().then(|| c.header.clone())
                };
                let r = match r {
                    Some(h) => Ok(h),
                    None => self.fetch(source),
                };
                let _ = reply.send(r);
            }
            Msg::Refused(used, done) => {
                let again = {
                    let c = self.lock();
                    c.stale && c.header.as_ref() == Some(&used)
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

    fn fetch(&self, source: &mut TokenSource) -> Result<Option<Arc<str>>, String> {
        self.lock().fetches += 1;
        match source {
            TokenSource::Exec(p) => {
                let cred = p.run().map_err(|e| format!("getting credentials: {e}"))?;
                if cred.client_cert.is_some() && cred.token.is_none() {
                    tracing::warn!("exec plugin returned a client certificate; edgetunnel proxy uses only tokens from exec plugins");
                }
                let header: Option<Arc<str>> = cred
                    .token
                    .map(|t| Arc::from(format!("Bearer {t}").as_str()));
                let mut c = self.lock();
                c.header = header.clone();
                c.expires = cred.expires_unix.map(|e| e as f64);
                c.stale = false;
                Ok(header)
            }
            TokenSource::File(path) => {
                let read = std::fs::read_to_string(&*path);
                let mut c = self.lock();
                match read {
                    Ok(t) => {
                        let header: Arc<str> = Arc::from(format!("Bearer {}", t.trim()).as_str());
                        c.header = Some(header.clone());
                        c.expires = Some(now_secs() + FILE_TOKEN_TTL.as_secs_f64());
                        c.stale = false;
                        Ok(Some(header))
                    }
                    Err(e) if c.header.is_some() => {
                        tracing::error!("Unable to rotate token: {}: {e}", path.display());
                        c.expires = Some(now_secs() + FILE_TOKEN_TTL.as_secs_f64());
                        c.stale = false;
                        Ok(c.header.clone())
                    }
                    Err(e) => Err(format!("reading {}: {e}", path.display())),
                }
            }
            TokenSource::Oidc(p) => {
                let (token, exp) = p.id_token()?;
                let header: Arc<str> = Arc::from(format!("Bearer {token}").as_str());
                let mut c = self.lock();
                c.header = Some(header.clone());
                // Valid while now + 10 s < exp; asked again from then on.
                c.expires = Some(
                    exp.map_or(0.0, |e| e as f64 - crate::protocol::oidc::EXPIRY_DELTA_SECS)
                        - 0.001,
                );
                c.stale = false;
                Ok(Some(header))
            }
        }
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
        let h = block(d.ready()).unwrap().unwrap();
        assert_eq!(&*h, "Bearer one");
        std::fs::write(&p, "two").unwrap();
        // Cached: not read again.
        assert_eq!(&*block(d.ready()).unwrap().unwrap(), "Bearer one");
        assert_eq!(d.fetches(), 1);
        block(d.refused(&h));
        block(d.refused(&h));
        assert_eq!(&*block(d.ready()).unwrap().unwrap(), "Bearer two");
        assert_eq!(d.fetches(), 2);
        // A failed read keeps the last good token.
        std::fs::remove_file(&p).unwrap();
        let h2 = block(d.ready()).unwrap().unwrap();
        block(d.refused(&h2));
        assert_eq!(&*block(d.ready()).unwrap().unwrap(), "Bearer two");
    }
}
