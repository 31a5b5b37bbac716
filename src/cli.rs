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
    version = crate::metrics::process::LONG_VERSION,
    about = "Thread-per-core io_uring edge tunnel, wire-compatible with apiserver-network-proxy (konnectivity) and yurt-tunnel"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `edgetunnel=debug`.
    /// A format word (`json`) or a directive that does not parse is refused.
    #[arg(
        long,
        env = "EDGETUNNEL_LOG",
        default_value = "info",
        global = true,
        help_heading = "Logging"
    )]
    pub log: String,
    /// Log line format.
    #[arg(long, env = "EDGETUNNEL_LOG_FORMAT", value_enum, default_value_t = crate::logging::LogFormat::Text, global = true, help_heading = "Logging")]
    pub log_format: crate::logging::LogFormat,
    /// Write logs to this file (appended) instead of stderr; lines at or
    /// above --log-stderr-threshold still go to stderr too.
    #[arg(long, global = true, help_heading = "Logging")]
    pub log_file: Option<PathBuf>,
    /// With --log-file: which lines also go to stderr (klog's
    /// --stderrthreshold; `all` is klog's --alsologtostderr).
    #[arg(long, value_enum, default_value_t = crate::logging::StderrThreshold::Error, global = true, help_heading = "Logging")]
    pub log_stderr_threshold: crate::logging::StderrThreshold,
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
    /// Write a new CA into --ca-dir (default DIR-ca: its key stays off the
    /// nodes) and ca.crt with a server, an agent and a proxy-client
    /// certificate into DIR. Refuses to replace existing files without
    /// --force.
    Init {
        dir: PathBuf,
        /// Server certificate names (DNS or IP); repeatable.
        #[arg(long = "server-name", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])]
        server_names: Vec<String>,
        /// Agent certificate common name (and DNS name).
        #[arg(long, default_value = "edgetunnel-agent")]
        agent_name: String,
        /// Where the CA (ca.crt, ca.key) goes; default: DIR-ca beside DIR.
        #[arg(long)]
        ca_dir: Option<PathBuf>,
        /// Days the server, agent and proxy-client certificates last.
        #[arg(long, default_value_t = crate::certs::DEFAULT_DAYS, value_parser = clap::value_parser!(u32).range(1..))]
        days: u32,
        /// Days the CA lasts.
        #[arg(long, default_value_t = crate::certs::DEFAULT_CA_DAYS, value_parser = clap::value_parser!(u32).range(1..))]
        ca_days: u32,
        /// Replace existing files (a new CA: certificates from the old one
        /// stop being trusted).
        #[arg(long)]
        force: bool,
    },
    /// Sign one more certificate with an existing CA: writes ca.crt and
    /// ROLE.crt/ROLE.key into OUT (for an agent, all one edge node needs).
    /// Refuses to replace a different existing file without --force.
    Issue {
        /// server, agent or proxy-client.
        #[arg(value_enum)]
        role: CertRole,
        out: PathBuf,
        /// The CA directory (`certs init`'s DIR-ca).
        #[arg(long)]
        ca_dir: PathBuf,
        /// DNS names or IP addresses (repeatable): the SANs; an agent's
        /// first name is also its CN (the agent ID that
        /// --bind-agent-identity accepts). Default: as `certs init`.
        #[arg(long = "name")]
        names: Vec<String>,
        /// Days the certificate lasts (never past the CA).
        #[arg(long, default_value_t = crate::certs::DEFAULT_DAYS, value_parser = clap::value_parser!(u32).range(1..))]
        days: u32,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
}

/// Which certificate `certs issue` signs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CertRole {
    /// serverAuth, CN edgetunnel-server.
    Server,
    /// clientAuth, CN the first --name.
    Agent,
    /// clientAuth toward kubelets, CN tunnel-proxy-client, O openyurt:yurttunnel.
    ProxyClient,
}

impl CertRole {
    /// The files' base name, as `--certs-dir` looks for them.
    pub fn file_base(self) -> &'static str {
        match self {
            CertRole::Server => "server",
            CertRole::Agent => "agent",
            CertRole::ProxyClient => "proxy-client",
        }
    }
}

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
