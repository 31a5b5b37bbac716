//! Command-line faces: the `edgetunnel` command and its subcommands. Each
//! role's own flags, and their translation into that role's configuration,
//! live in the role (`server::args`, `agent::args`, and
//! `kubectl_proxy::flags`); the flag groups the server and agent
//! share live in [`crate::flags`]. This module sits on top: it names the
//! roles, no role names it.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use crate::agent::args::AgentArgs;
pub use crate::certs::{CertRole, CertsCommand};
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
    Proxy(Box<kubectl_proxy::ProxyArgs>),
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
