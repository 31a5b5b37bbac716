//! Flag groups and flag helpers the roles share: the certificate files
//! (`TlsArgs`), the data-plane flags (`EngineArgs`), where certificates come
//! from (`CertMode`), token files and seconds. The roles' own flag modules
//! (`server::args`, `agent::args`) flatten these; `cli`, which
//! assembles the subcommands, re-exports them. Nothing here names a role or
//! the command line as a whole, so a role never imports the CLI layer.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::BoxError;
use engine::runtime::Driver;
use engine::tls::TlsFiles;
use protocol::anp::grpc_frame::DEFAULT_MAX_MESSAGE;

/// Certificate flags shared by server and agent (mutual TLS on the agent
/// link). From `certs init`, the server uses server.crt/server.key and the
/// agent agent.crt/agent.key; both use ca.crt to verify the other side.
#[derive(Args, Debug, Clone)]
pub struct TlsArgs {
    /// Directory with ca.crt and this side's certificate and key (from
    /// `certs init`); --cert/--key/--ca override single files.
    #[arg(long, help_heading = "TLS")]
    pub certs_dir: Option<PathBuf>,
    /// This side's certificate (PEM): server.crt or agent.crt in --certs-dir.
    #[arg(long, help_heading = "TLS")]
    pub cert: Option<PathBuf>,
    /// This side's private key (PEM): server.key or agent.key in --certs-dir.
    #[arg(long, help_heading = "TLS")]
    pub key: Option<PathBuf>,
    /// CA that verifies the other side's certificate (PEM).
    #[arg(long, help_heading = "TLS")]
    pub ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The files for `role` ("server" or "agent").
    pub(crate) fn files(&self, role: &str) -> Result<TlsFiles, BoxError> {
        let pick = |explicit: &Option<PathBuf>, name: String, flag: &str| {
            explicit
                .clone()
                .or_else(|| self.certs_dir.as_ref().map(|d| d.join(&name)))
                .ok_or_else(|| BoxError::from(format!("--{flag} or --certs-dir is required")))
        };
        Ok(TlsFiles {
            cert: pick(&self.cert, format!("{role}.crt"), "cert")?,
            key: pick(&self.key, format!("{role}.key"), "key")?,
            ca: pick(&self.ca, "ca.crt".to_string(), "ca")?,
        })
    }
}

/// Reads a token file (trimmed), if one is given.
pub(crate) fn read_token(path: &Option<PathBuf>) -> Result<Option<String>, BoxError> {
    match path {
        Some(p) => Ok(Some(std::fs::read_to_string(p)?.trim().to_string())),
        None => Ok(None),
    }
}

/// Data-plane flags shared by server and agent.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// I/O driver: auto (io_uring, else epoll), uring, legacy (epoll).
    #[arg(
        long,
        help_heading = "Data plane",
        env = "EDGETUNNEL_DRIVER",
        default_value = "auto"
    )]
    pub driver: Driver,
    /// Largest gRPC message accepted, in bytes.
    #[arg(long, help_heading = "Data plane", default_value_t = DEFAULT_MAX_MESSAGE)]
    pub max_message_size: usize,
    /// HTTP/2 keepalive PING interval, seconds.
    #[arg(long, help_heading = "Data plane", default_value_t = 30)]
    pub keepalive_secs: u64,
    /// Seconds a half-closed tunnel (one side finished sending, with the
    /// half-close extension between edgetunnel peers) waits for the other
    /// side to finish before it is closed, like haproxy's `timeout
    /// client-fin`.
    #[arg(long, help_heading = "Data plane", default_value_t = 30.0)]
    pub half_close_linger_secs: f64,
}

/// Where a role's certificates come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CertMode {
    /// Files, watched and reloaded when they change.
    Files,
    /// Kubernetes CertificateSigningRequests, renewed at 80% of their lifetime.
    Csr,
}

/// Seconds as a flag gives them (negative: zero).
pub(crate) fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}
