//! The agent's flags and their translation into an [`AgentConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::AgentConfig;
use crate::control::manager;
use crate::flags::{read_token, secs, CertMode, EngineArgs, TlsArgs};
use crate::BoxError;
use engine::tls::TlsFiles;
use protocol::anp::agent_identifiers::Identifiers;

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Server agent-listener address host:port; repeatable.
    #[arg(
        long = "server-addr",
        help_heading = "Servers",
        required_unless_present = "server_service"
    )]
    pub server_addr: Vec<String>,
    /// Without --server-addr: find the server through this Service
    /// (`namespace/name`, needs --kube) at start, as yurt-tunnel-agent does
    /// with `kube-system/x-tunnel-server-svc` (a load balancer's address, a
    /// cloud node's for a NodePort Service, the
    /// `x-tunnel-server-external-addr` annotation's host, else the
    /// ClusterIP; the port named `tcp`).
    #[arg(long, help_heading = "Servers", conflicts_with = "server_addr")]
    pub server_service: Option<String>,
    /// TLS name to verify on the server certificate (default: the host).
    #[arg(long, help_heading = "Servers")]
    pub server_name: Option<String>,
    /// Agent ID (default: the host name).
    #[arg(long, help_heading = "Identity")]
    pub agent_id: Option<String>,
    /// Identifiers in URL query form: host=node1&ipv4=10.0.0.5&cidr=10.1.0.0/16&default-route=true
    /// (keys: host, ipv4, ipv6, cidr, default-route; any other is refused)
    #[arg(long, help_heading = "Identity", default_value = "")]
    pub agent_identifiers: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// File holding the bearer token to present.
    #[arg(long, help_heading = "Identity")]
    pub token_file: Option<PathBuf>,
    /// First reconnect delay, seconds (doubles up to --backoff-max-secs, with jitter).
    #[arg(long, help_heading = "Servers", default_value_t = 0.5)]
    pub backoff_initial_secs: f64,
    /// Longest reconnect delay, seconds.
    #[arg(long, help_heading = "Servers", default_value_t = 30.0)]
    pub backoff_max_secs: f64,
    /// A connection that stayed up this many seconds resets the backoff
    /// (the next retry comes within --backoff-initial-secs); shorter ones,
    /// like failed attempts, keep it growing.
    #[arg(long, help_heading = "Servers", default_value_t = crate::agent::backoff::DEFAULT_RESET_AFTER.as_secs_f64())]
    pub backoff_reset_after_secs: f64,
    /// After SIGTERM (DRAIN sent), how long open connections may finish.
    #[arg(long, help_heading = "Servers", default_value_t = 30.0)]
    pub drain_grace_secs: f64,
    /// Timeout for dialing a local target, seconds.
    #[arg(long, help_heading = "Dialing", default_value_t = 5.0)]
    pub dial_timeout_secs: f64,
    /// Destinations this agent may dial, as a comma list (repeatable) of
    /// `CIDR[:PORT[-PORT]]` (IPv6 with a port in brackets:
    /// `[fd00::/8]:1-1024`). When given, only these are dialed. Loopback,
    /// link-local (cloud metadata) and unspecified addresses are refused
    /// unless an entry inside them lists them (`127.0.0.1/32:10255`;
    /// `0.0.0.0/0` does not). Checked on every resolved address.
    #[arg(
        long,
        help_heading = "Dialing",
        env = "EDGETUNNEL_ALLOW_DESTINATIONS",
        value_delimiter = ','
    )]
    pub allow_destinations: Vec<protocol::anp::agent_dest_policy::Entry>,
    /// Destinations this agent never dials (same syntax); wins over
    /// --allow-destinations.
    #[arg(
        long,
        help_heading = "Dialing",
        env = "EDGETUNNEL_DENY_DESTINATIONS",
        value_delimiter = ','
    )]
    pub deny_destinations: Vec<protocol::anp::agent_dest_policy::Entry>,
    /// Do not offer the half-close extension (behave exactly like ANP's agent).
    #[arg(long, help_heading = "Dialing")]
    pub no_half_close: bool,
    /// Do not offer per-connection flow control: every connection then
    /// shares the server's buffer budget, as with ANP's agent, and one
    /// stalled reader can hold up the others once that budget is spent.
    #[arg(long, help_heading = "Dialing")]
    pub no_flow_control: bool,
    /// Kubernetes access for `--cert-mode csr`: a kubeconfig path, or
    /// `in-cluster`.
    #[arg(long, help_heading = "Kubernetes")]
    pub kube: Option<String>,
    /// Where the agent's certificate comes from: `files` (watched and
    /// reloaded) or `csr` (a CertificateSigningRequest with signer
    /// kubernetes.io/kube-apiserver-client, CN tunnel-agent-client, SANs the
    /// agent ID and its addresses; written to --cert/--key and renewed at
    /// 80% of its lifetime).
    #[arg(long, help_heading = "TLS", value_enum, default_value_t = CertMode::Files)]
    pub cert_mode: CertMode,
    /// Keep as many server connections as there are valid server leases
    /// (ANP's format, see the server's --enable-lease-controller) rather
    /// than the servers' reported count; needs --kube.
    #[arg(long, help_heading = "Kubernetes")]
    pub count_server_leases: bool,
    /// Namespace of the server leases.
    #[arg(long, help_heading = "Kubernetes", default_value = crate::control::server_lease::DEFAULT_NAMESPACE)]
    pub lease_namespace: String,
    /// Label selector of the server leases counted.
    #[arg(long, help_heading = "Kubernetes", alias = "lease-label", default_value = crate::control::server_lease::DEFAULT_LABEL)]
    pub lease_label_selector: String,
    /// How lease and server-reported counts combine: `default` (the lease
    /// count when counting leases, else the servers') or `max`.
    #[arg(long, help_heading = "Kubernetes", default_value = "default")]
    pub server_count_source: String,
    /// How often the server leases are listed, seconds (validity is judged
    /// every second).
    #[arg(long, help_heading = "Kubernetes", default_value_t = 10.0)]
    pub lease_poll_secs: f64,
    /// Health listener: /healthz, /ready and /readyz (500 while no server
    /// connection is up), /metrics (ANP's --health-server-port; off by
    /// default here).
    #[arg(long, help_heading = "Observability")]
    pub health_bind: Option<SocketAddr>,
    /// Admin listener: /metrics (and the health paths); off by default.
    #[arg(long, help_heading = "Observability")]
    pub admin_bind: Option<SocketAddr>,
    /// Handover for upgrades without a failed dial: a unix socket path
    /// that a running agent listens on. An agent started with the same
    /// path (a new pod beside the old one on a host-network node) takes
    /// over the running one's health and admin listeners there, links to
    /// the servers, and only then tells the old one to drain (DRAIN, its
    /// open tunnels finish within --drain-grace-secs). Nobody at the path:
    /// the agent binds its listeners itself and listens there for its own
    /// successor.
    #[arg(long, help_heading = "Servers")]
    pub handover_socket: Option<PathBuf>,
    /// With --handover-socket: on the first SIGTERM/SIGINT before any
    /// successor took over, seconds to serve on while one may still come
    /// (a DaemonSet rolled with maxSurge signals the old pod as soon as the
    /// new one runs, which may be before it linked); then the agent drains
    /// as usual. A second signal ends the wait and the drain.
    #[arg(long, help_heading = "Servers", default_value_t = 5.0)]
    pub handover_wait_secs: f64,
    /// Worker cores (monoio runtimes) for the links to edgetunnel servers;
    /// default: all cores. Links are spread over them.
    #[arg(long, help_heading = "Data plane")]
    pub workers: Option<usize>,
    /// Most connections ("links") kept to one edgetunnel server, which
    /// asks for one per server worker so that tunnels spread over its
    /// cores; 1: one connection per server, as ANP's agent. ANP's Go
    /// server never asks.
    #[arg(long, help_heading = "Servers", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub max_links_per_server: u64,
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl AgentArgs {
    /// The agent's configuration. Each part comes from its own builder
    /// below, called in this order (the first error is the one reported).
    pub fn into_config(self) -> Result<AgentConfig, BoxError> {
        let client_cert = self.presents_certificate();
        let tls = self.tls_files(client_cert)?;
        // Checked now; read again at every connect (projected tokens rotate).
        read_token(&self.token_file)?;
        let agent_id = self.agent_id.clone().unwrap_or_else(hostname);
        // Unknown keys refused, as ANP's agent refuses them.
        let identifiers = Identifiers::parse_known(&self.agent_identifiers)?;
        let kube = self.kube();
        let has_kube = kube.is_some();
        let csr = self.csr(has_kube, &tls, &agent_id, &identifiers)?;
        let server_service = self.server_service(has_kube)?;
        let lease_count = self.lease_count(has_kube)?;
        Ok(AgentConfig {
            announce: Default::default(),
            lease_count,
            kube,
            csr,
            servers: self.server_addr,
            server_service,
            server_name: self.server_name,
            tls,
            agent_id,
            identifiers,
            token_file: self.token_file.clone(),
            client_cert,
            keepalive: Duration::from_secs(self.engine.keepalive_secs.max(1)),
            backoff_initial: secs(self.backoff_initial_secs),
            backoff_max: secs(self.backoff_max_secs),
            backoff_reset_after: secs(self.backoff_reset_after_secs),
            drain_grace: secs(self.drain_grace_secs),
            dial_timeout: secs(self.dial_timeout_secs),
            policy: protocol::anp::agent_dest_policy::Policy::new(
                self.allow_destinations,
                self.deny_destinations,
            ),
            driver: self.engine.driver,
            max_message: self.engine.max_message_size,
            half_close: !self.no_half_close,
            half_close_linger: secs(self.engine.half_close_linger_secs),
            window: !self.no_flow_control,
            health_bind: self.health_bind,
            admin_bind: self.admin_bind,
            handover_socket: self.handover_socket,
            handover_wait: secs(self.handover_wait_secs),
            workers: self
                .workers
                .unwrap_or_else(engine::runtime::default_workers)
                .max(1),
            max_links: self.max_links_per_server as usize,
        })
    }

    /// With a token and no certificate given, the agent presents no
    /// client certificate (ANP's token-authenticated agents).
    fn presents_certificate(&self) -> bool {
        self.token_file.is_none()
            || self.tls.cert.is_some()
            || self.tls.key.is_some()
            || self.tls.certs_dir.is_some()
    }

    /// The client certificate, key and CA (only the CA without a client
    /// certificate).
    fn tls_files(&self, client_cert: bool) -> Result<TlsFiles, BoxError> {
        if client_cert {
            return self.tls.files("agent");
        }
        Ok(TlsFiles {
            cert: PathBuf::new(),
            key: PathBuf::new(),
            ca: self
                .tls
                .ca
                .clone()
                .ok_or("--ca or --certs-dir is required")?,
        })
    }

    /// Kubernetes access (`--kube`), for CSRs, the server Service and the
    /// server leases.
    fn kube(&self) -> Option<manager::KubeSpec> {
        self.kube.as_ref().map(|k| manager::KubeSpec {
            kubeconfig: (k != "in-cluster").then(|| PathBuf::from(k)),
            edge_label: Default::default(),
            dns_configmap: None,
            server_configmap: None,
            watch_nodes: false,
            lease: None,
        })
    }

    /// The agent certificate kept signed by a CSR (`--cert-mode csr`).
    fn csr(
        &self,
        has_kube: bool,
        tls: &TlsFiles,
        agent_id: &str,
        identifiers: &Identifiers,
    ) -> Result<Vec<crate::control::csr::Job>, BoxError> {
        match self.cert_mode {
            CertMode::Files => Ok(Vec::new()),
            CertMode::Csr if has_kube => {
                let ips = identifiers
                    .ipv4
                    .iter()
                    .map(|a| std::net::IpAddr::V4(*a))
                    .chain(identifiers.ipv6.iter().map(|a| std::net::IpAddr::V6(*a)))
                    .collect();
                Ok(vec![crate::control::csr::Job {
                    profile: crate::control::csr::Profile::agent(agent_id, ips),
                    cert: tls.cert.clone(),
                    key: tls.key.clone(),
                    name_prefix: "edgetunnel-agent-".into(),
                    services: Vec::new(),
                }])
            }
            CertMode::Csr => Err("--cert-mode csr needs --kube".into()),
        }
    }

    /// The Service the server's address is read from (`--server-service`).
    fn server_service(&self, has_kube: bool) -> Result<Option<manager::ObjectRef>, BoxError> {
        match &self.server_service {
            Some(s) if has_kube => Ok(Some(s.parse::<manager::ObjectRef>()?)),
            Some(_) => Err("--server-service needs --kube".into()),
            None => Ok(None),
        }
    }

    /// The server count from ANP-format leases (`--count-server-leases`).
    fn lease_count(
        &self,
        has_kube: bool,
    ) -> Result<Option<crate::control::lease_count::LeaseCountSpec>, BoxError> {
        use crate::control::lease_count::{CountSource, LeaseCountSpec, Selector};
        let source = CountSource::parse(&self.server_count_source)?;
        if !self.count_server_leases {
            return Ok(None);
        }
        if !has_kube {
            return Err("--count-server-leases needs --kube".into());
        }
        Ok(Some(LeaseCountSpec::new(
            &self.lease_namespace,
            Selector::parse(&self.lease_label_selector)?,
            source,
            secs(self.lease_poll_secs).max(Duration::from_millis(100)),
        )))
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "edgetunnel-agent".to_string())
}
