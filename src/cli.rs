//! Command-line faces: the subcommands and the flag groups the roles
//! share. Each role's own flags, and their translation into that role's
//! configuration, live in the role (`server::args`, `agent::args`,
//! `proxy::flags`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub use crate::agent::args::AgentArgs;
use crate::engine::runtime::Driver;
use crate::engine::tls::TlsFiles;
use crate::protocol::grpc_frame::DEFAULT_MAX_MESSAGE;
pub use crate::server::args::ServerArgs;
use crate::BoxError;

#[derive(Parser, Debug)]
#[command(
    name = "edgetunnel",
    version,
    about = "Thread-per-core io_uring edge tunnel, wire-compatible with apiserver-network-proxy (konnectivity) and yurt-tunnel"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `edgetunnel=debug`.
    #[arg(long, env = "EDGETUNNEL_LOG", default_value = "info", global = true)]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Cloud side: accept agents and route tunnel requests to them.
    Server(Box<ServerArgs>),
    /// Edge side: connect out to servers and dial targets on their behalf.
    Agent(Box<AgentArgs>),
    /// A drop-in `kubectl proxy`: same flags, same answers, faster.
    Proxy(Box<crate::proxy::ProxyArgs>),
    /// Certificate helpers.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// One-shot iptables operations (the server keeps them in sync itself
    /// with --iptables).
    #[command(subcommand)]
    Iptables(IptablesCommand),
}

#[derive(Subcommand, Debug)]
pub enum IptablesCommand {
    /// Make the nat rules match these flags once, and exit.
    Sync {
        /// Ports to intercept.
        #[arg(long, value_delimiter = ',', default_value = "10250,10255")]
        ports: Vec<u16>,
        /// Address to DNAT to (repeatable, one per family).
        #[arg(long, required = true)]
        dnat_ip: Vec<std::net::IpAddr>,
        /// Port to DNAT to (the interception listener's).
        #[arg(long, default_value_t = 10264)]
        dnat_port: u16,
        /// Edge node addresses to redirect (repeatable).
        #[arg(long)]
        edge_ip: Vec<std::net::IpAddr>,
        /// Nodes never redirected (repeatable); with any, everything else is.
        #[arg(long)]
        cloud_node_ip: Vec<std::net::IpAddr>,
    },
    /// Remove every rule and chain edgetunnel added.
    Cleanup,
}

#[derive(Subcommand, Debug)]
pub enum CertsCommand {
    /// Write a local CA, a server and an agent certificate into DIR.
    Init {
        dir: PathBuf,
        /// Server certificate names (DNS or IP); repeatable.
        #[arg(long = "server-name", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])]
        server_names: Vec<String>,
        /// Agent certificate common name.
        #[arg(long, default_value = "edgetunnel-agent")]
        agent_name: String,
    },
}

/// Certificate flags shared by server and agent (mutual TLS on the agent
/// link). From `certs init`, the server uses server.crt/server.key and the
/// agent agent.crt/agent.key; both use ca.crt to verify the other side.
#[derive(Args, Debug, Clone)]
pub struct TlsArgs {
    /// Directory with ca.crt and this side's certificate and key (from
    /// `certs init`); --cert/--key/--ca override single files.
    #[arg(long)]
    pub certs_dir: Option<PathBuf>,
    /// This side's certificate (PEM): server.crt or agent.crt in --certs-dir.
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// This side's private key (PEM): server.key or agent.key in --certs-dir.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// CA that verifies the other side's certificate (PEM).
    #[arg(long)]
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
    #[arg(long, env = "EDGETUNNEL_DRIVER", default_value = "auto")]
    pub driver: Driver,
    /// Largest gRPC message accepted, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_MESSAGE)]
    pub max_message_size: usize,
    /// HTTP/2 keepalive PING interval, seconds.
    #[arg(long, default_value_t = 30)]
    pub keepalive_secs: u64,
    /// Seconds a half-closed tunnel (one side finished sending, with the
    /// half-close extension between edgetunnel peers) waits for the other
    /// side to finish before it is closed, like haproxy's `timeout
    /// client-fin`.
    #[arg(long, default_value_t = 30.0)]
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
