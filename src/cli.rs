//! Command-line faces: the `edgetunnel` command and its subcommands. Each
//! role's own flags, and their translation into that role's configuration,
//! live in the role (`server::args`, `agent::args`, `proxy::flags`); the
//! flag groups the roles share live in [`crate::flags`]. This module sits
//! on top: it names the roles, no role names it.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use crate::agent::args::AgentArgs;
pub use crate::flags::{CertMode, EngineArgs, TlsArgs};
pub use crate::server::args::ServerArgs;

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
