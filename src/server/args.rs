//! The server's flags and their translation into a [`ServerConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::ServerConfig;
use crate::control::manager;
use crate::flags::{read_token, secs, CertMode, EngineArgs, TlsArgs};
use crate::BoxError;
use engine::runtime;
use engine::tls::TlsFiles;
use protocol::anp::routing::parse_strategies;

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Agent listener (gRPC AgentService over mutual TLS).
    #[arg(long, help_heading = "Agents", default_value = "0.0.0.0:10262")]
    pub agent_bind: SocketAddr,
    /// HTTP CONNECT frontend on TCP (as kube-apiserver's egress selector uses).
    #[arg(long, help_heading = "Frontends")]
    pub connect_bind: Option<SocketAddr>,
    /// HTTP CONNECT frontend on a unix socket.
    #[arg(long, help_heading = "Frontends")]
    pub connect_uds: Option<PathBuf>,
    /// gRPC ProxyService frontend (konnectivity-client) on TCP: plaintext
    /// h2, or TLS with --frontend-cert.
    #[arg(long, help_heading = "Frontends")]
    pub grpc_bind: Option<SocketAddr>,
    /// gRPC ProxyService frontend on a unix socket.
    #[arg(long, help_heading = "Frontends")]
    pub grpc_uds: Option<PathBuf>,
    /// Certificate (PEM) the TCP frontends (--connect-bind, --grpc-bind)
    /// present: with it they speak TLS only (ANP's --server-cert).
    #[arg(long, help_heading = "Frontends", requires = "frontend_key")]
    pub frontend_cert: Option<PathBuf>,
    /// Its private key (ANP's --server-key).
    #[arg(long, help_heading = "Frontends", requires = "frontend_cert")]
    pub frontend_key: Option<PathBuf>,
    /// CA that signs the certificates TCP frontend callers must present
    /// (ANP's --server-ca-cert); without it no client certificate is asked.
    #[arg(long, help_heading = "Frontends", requires = "frontend_cert")]
    pub frontend_ca: Option<PathBuf>,
    /// On SIGTERM/SIGINT, seconds open tunnels may take to finish before
    /// the server exits (ANP's --graceful-shutdown-timeout): listeners
    /// close at once, /readyz fails, agents get a DRAIN packet and an HTTP/2
    /// GOAWAY, gRPC callers a GOAWAY. 0 (the default): exit at once. A second
    /// signal ends the wait.
    #[arg(long, help_heading = "Limits and shutdown", default_value_t = 0.0)]
    pub graceful_shutdown_timeout_secs: f64,
    /// Listener handover for upgrades without a failed dial: a unix socket
    /// path that a running server listens on. A server started with the
    /// same path takes over the running one's listening sockets there (no
    /// moment without a listener, no socket path unlinked); the old one
    /// then stops accepting, tells its agents to connect again, and drains
    /// as on SIGTERM (--graceful-shutdown-timeout-secs). Nobody at the
    /// path: the server binds its listeners itself and listens there for
    /// its own successor.
    #[arg(long, help_heading = "Limits and shutdown")]
    pub handover_socket: Option<PathBuf>,
    /// After taking over from a running server, seconds a dial for which
    /// no agent is connected yet may wait for one (agents move over from
    /// the old server in about a round trip and a handshake); counted from
    /// the takeover. Past it, the caller gets the usual no-agent answer.
    #[arg(long, help_heading = "Limits and shutdown", default_value_t = 10.0)]
    pub takeover_dial_wait_secs: f64,
    /// With --handover-socket: on the first SIGTERM/SIGINT before any
    /// successor took over, seconds to serve on while one may still come
    /// (a DaemonSet rolled with maxSurge signals the old pod as soon as the
    /// new one runs); then the server drains as usual. A second signal
    /// ends the wait and the drain.
    #[arg(long, help_heading = "Limits and shutdown", default_value_t = 5.0)]
    pub handover_wait_secs: f64,
    /// HTTP/2 PING interval toward gRPC frontend callers, seconds (ANP's
    /// --frontend-keepalive-time, 1h by default); an unanswered PING
    /// (twice this long) closes the caller's connection.
    #[arg(long, help_heading = "Frontends", default_value_t = 3600.0)]
    pub frontend_keepalive_secs: f64,
    /// Agent connections that may be in their handshake at once (TLS,
    /// HTTP/2, first request, token review); over it the oldest is shed or
    /// the newcomer closed, so that a flood of unauthenticated connections
    /// cannot take every descriptor. Default: a quarter of the descriptor
    /// limit in force (the soft RLIMIT_NOFILE, raised to the hard one at
    /// start), at most 1024; the other three quarters stay for listeners,
    /// agents and tunnels (each CONNECT or gRPC caller holds one). An
    /// explicit value above half the limit draws a warning. 0: no cap.
    #[arg(long, help_heading = "Limits and shutdown")]
    pub max_handshakes: Option<usize>,
    /// The same cap per source address; never above --max-handshakes by
    /// default. 0: no cap.
    #[arg(long, help_heading = "Limits and shutdown", default_value_t = 64)]
    pub max_handshakes_per_ip: usize,
    /// A gRPC frontend connection that sends no HTTP/2 preface, or has no
    /// stream open, for this many seconds is closed (GOAWAY first when it
    /// spoke HTTP/2). Hidden: for tests.
    #[arg(long, help_heading = "Frontends", hide = true, default_value_t = 30.0)]
    pub frontend_idle_secs: f64,
    /// Lowest TLS version of the agent and frontend listeners: VersionTLS12
    /// (default) or VersionTLS13 (ANP's --tls-min-version).
    #[arg(long, help_heading = "TLS", default_value = "")]
    pub tls_min_version: String,
    /// TLS 1.2 cipher suites the agent and frontend listeners allow, by
    /// IANA name, comma-separated (ANP's --cipher-suites; TLS 1.3 suites are
    /// not configurable). Default: all of edgetunnel's (ECDHE with AES-GCM
    /// or ChaCha20-Poly1305).
    #[arg(long, help_heading = "TLS", value_delimiter = ',')]
    pub cipher_suites: Vec<String>,
    /// Permission bits (octal) of the --connect-uds/--grpc-uds socket files,
    /// set before anyone can connect.
    #[arg(long, help_heading = "Frontends", default_value = "0600", value_parser = engine::listener::parse_mode)]
    pub uds_mode: u32,
    /// Never remove an existing file at a --connect-uds/--grpc-uds path (the
    /// bind then fails). Without it only a stale socket file (one that
    /// refuses connections) is removed, never a regular file or a live
    /// server's socket.
    #[arg(long, help_heading = "Frontends")]
    pub keep_existing_uds: bool,
    /// Admin listener: /metrics, /healthz, /readyz.
    #[arg(
        long,
        help_heading = "Observability",
        default_value = "127.0.0.1:10265"
    )]
    pub admin_bind: SocketAddr,
    /// Health listener: /healthz, /readyz (/ready), /metrics, like the
    /// admin one, for kubelet probes (ANP's --health-port).
    #[arg(long, help_heading = "Observability")]
    pub health_bind: Option<SocketAddr>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// File holding a bearer token agents must present.
    #[arg(long, help_heading = "Agents")]
    pub agent_token_file: Option<PathBuf>,
    /// Proxy strategies tried in order: destHost, defaultRoute, default.
    #[arg(long, help_heading = "Routing", default_value = "destHost,default")]
    pub proxy_strategies: String,
    /// This server's ID, sent to agents and the holder of its lease
    /// (default: $PROXY_SERVER_ID, else random).
    #[arg(long, help_heading = "Routing", env = "PROXY_SERVER_ID")]
    pub server_id: Option<String>,
    /// Number of servers behind the agents' address (agents connect to each).
    #[arg(long, help_heading = "Routing", default_value_t = 1)]
    pub server_count: u32,
    /// Worker cores (monoio runtimes); default: all cores.
    #[arg(long, help_heading = "Data plane")]
    pub workers: Option<usize>,
    /// Seconds to wait for the agent's DIAL_RSP before answering 504.
    #[arg(long, help_heading = "Routing", default_value_t = 30.0)]
    pub dial_timeout_secs: f64,
    /// HTTP status answered when no agent can take a dial: 500 as ANP's
    /// server does (the default), or 503 Service Unavailable.
    #[arg(long, help_heading = "Routing", default_value_t = 500, value_parser = parse_no_agent_status)]
    pub no_agent_status: u16,
    /// Interception listener (yurt-tunnel's 10264): kubelet traffic sent here
    /// by iptables DNAT is relayed to its original destination through the
    /// node's agent; direct plain-HTTP clients are routed by their Host.
    #[arg(long, help_heading = "Interception (yurt-tunnel)")]
    pub interception_bind: Option<SocketAddr>,
    /// Intercepted ports dialed on the node's 127.0.0.1 instead of its IP.
    #[arg(
        long,
        help_heading = "Interception (yurt-tunnel)",
        value_delimiter = ',',
        default_value = "10266,10267"
    )]
    pub localhost_proxy_ports: Vec<u16>,
    /// Keep iptables NAT rules (nat OUTPUT -> TUNNEL-PORT chains) that send
    /// edge nodes' kubelet ports to the interception listener; removed on exit.
    #[arg(long, help_heading = "iptables")]
    pub iptables: bool,
    /// TLS interception listener (yurt-tunnel's 10263): terminates the
    /// caller's TLS and speaks TLS to the kubelet through the tunnel with the
    /// proxy-client certificate; the first request of each connection is
    /// logged (method, path, node, status, duration).
    #[arg(long, help_heading = "Interception (yurt-tunnel)")]
    pub interception_tls_bind: Option<SocketAddr>,
    /// Certificate the TLS interception listener presents (default: the
    /// server certificate).
    #[arg(long, help_heading = "Interception (yurt-tunnel)")]
    pub interception_cert: Option<PathBuf>,
    /// Its key (default: the server key).
    #[arg(long, help_heading = "Interception (yurt-tunnel)")]
    pub interception_key: Option<PathBuf>,
    /// Client certificate toward kubelets (default: proxy-client.crt in --certs-dir).
    #[arg(long, help_heading = "Interception (yurt-tunnel)")]
    pub kubelet_client_cert: Option<PathBuf>,
    /// Its key (default: proxy-client.key in --certs-dir).
    #[arg(long, help_heading = "Interception (yurt-tunnel)")]
    pub kubelet_client_key: Option<PathBuf>,
    /// CA that verifies kubelet certificates (default: the --ca / ca.crt).
    #[arg(long, help_heading = "Interception (yurt-tunnel)")]
    pub kubelet_ca: Option<PathBuf>,
    /// Do not verify kubelet certificates (as yurt-tunnel does).
    #[arg(long, help_heading = "Interception (yurt-tunnel)")]
    pub kubelet_insecure_skip_verify: bool,
    /// Intercepted TLS ports (DNAT to the TLS interception listener when
    /// set, else relayed as they are by the plain one).
    #[arg(
        long,
        help_heading = "iptables",
        value_delimiter = ',',
        default_value = "10250"
    )]
    pub iptables_https_ports: Vec<u16>,
    /// Intercepted plain-HTTP ports (DNAT to the interception listener).
    #[arg(
        long,
        help_heading = "iptables",
        value_delimiter = ',',
        default_value = "10255"
    )]
    pub iptables_http_ports: Vec<u16>,
    /// Address the rules DNAT to (repeatable, one per family; default: the
    /// interception listener's address).
    #[arg(long, help_heading = "iptables")]
    pub iptables_dnat_ip: Vec<std::net::IpAddr>,
    /// A node reached directly, never intercepted (repeatable). With any,
    /// the rules redirect everything but these and loopback (yurt-tunnel's
    /// layout); without, only addresses announced by agents.
    #[arg(long, help_heading = "iptables")]
    pub cloud_node_ip: Vec<std::net::IpAddr>,
    /// Full resync period, seconds (at least 15); changes in the connected
    /// agents are applied within a second.
    #[arg(long, help_heading = "iptables", default_value_t = 15)]
    pub iptables_sync_period_secs: u64,
    /// Leave the rules in place on exit.
    #[arg(long, help_heading = "iptables")]
    pub iptables_keep_rules: bool,
    /// Keep a hosts-format DNS record file (for CoreDNS's `hosts` plugin or
    /// dnsmasq): connected edge nodes' names -> --dns-tunnel-ip, cloud nodes
    /// -> their address.
    #[arg(long, help_heading = "DNS records")]
    pub dns_hosts_file: Option<PathBuf>,
    /// The address edge node names resolve to (the tunnel server's; default:
    /// the interception listener's).
    #[arg(long, help_heading = "DNS records")]
    pub dns_tunnel_ip: Option<std::net::IpAddr>,
    /// Edge node names resolve to this Service's ClusterIP (`namespace/name`,
    /// read at every sync; yurt-tunnel's `x-tunnel-server-internal-svc`),
    /// instead of --dns-tunnel-ip; needs --kube.
    #[arg(long, help_heading = "DNS records", conflicts_with = "dns_tunnel_ip")]
    pub dns_tunnel_service: Option<String>,
    /// Keep a `dnat-PORT` port on the --dns-tunnel-service Service for
    /// every extra port of --server-configmap (`dnat-ports-pair`,
    /// `http-proxy-ports`, `https-proxy-ports`), aimed at the
    /// --interception-bind or --interception-tls-bind port, and remove the
    /// ones no longer listed, as yurt-tunnel's DNS controller does; the
    /// server elected by --leader-lease writes. Needs both interception
    /// listeners.
    #[arg(long, help_heading = "DNS records", requires = "dns_tunnel_service")]
    pub dns_service_dnat_ports: bool,
    /// A cloud node's record, `name=ip` (repeatable).
    #[arg(long, help_heading = "DNS records", value_parser = crate::control::dns::parse_node)]
    pub dns_cloud_node: Vec<(String, std::net::IpAddr)>,
    /// Use the Kubernetes cluster: with --iptables or DNS records, nodes
    /// (list and watch) decide which nodes iptables leaves alone and the
    /// DNS records; `--dns-configmap` and (with --iptables)
    /// `--server-configmap` are read and written there. Takes a
    /// kubeconfig path, or `in-cluster` for the service account.
    #[arg(long, help_heading = "Kubernetes")]
    pub kube: Option<String>,
    /// Label (`key=value`) that marks edge nodes.
    #[arg(
        long,
        help_heading = "Kubernetes",
        default_value = "openyurt.io/is-edge-worker=true"
    )]
    pub edge_node_label: String,
    /// `namespace/name` of the ConfigMap that gets the DNS records (key
    /// `tunnel-nodes`, for CoreDNS's `hosts` plugin); needs --kube.
    #[arg(long, help_heading = "DNS records")]
    pub dns_configmap: Option<String>,
    /// `namespace/name` of yurt-tunnel's server ConfigMap with extra ports
    /// (`http-proxy-ports`, `https-proxy-ports`); needs --kube, read only
    /// with --iptables (the ports it adds are intercepted ports).
    #[arg(
        long,
        help_heading = "Kubernetes",
        default_value = "kube-system/yurt-tunnel-server-cfg"
    )]
    pub server_configmap: String,
    /// `namespace/name` of the Lease electing the one server that writes
    /// the DNS records ConfigMap when several run; needs --kube.
    #[arg(
        long,
        help_heading = "Kubernetes",
        default_value = "kube-system/edgetunnel-dns"
    )]
    pub leader_lease: String,
    /// Where the server's certificates come from: `files` (watched and
    /// reloaded) or `csr` (Kubernetes CertificateSigningRequests, written to
    /// --certs-dir and renewed at 80% of their lifetime; needs --kube).
    #[arg(long, help_heading = "TLS", value_enum, default_value_t = CertMode::Files)]
    pub cert_mode: CertMode,
    /// A DNS name for the serving certificate in `csr` mode (repeatable).
    #[arg(long, help_heading = "TLS")]
    pub csr_dns_name: Vec<String>,
    /// An IP address for the serving certificate in `csr` mode (repeatable).
    #[arg(long, help_heading = "TLS")]
    pub csr_ip: Vec<std::net::IpAddr>,
    /// A Service (`namespace/name`, repeatable) whose cluster, external and
    /// load-balancer addresses join the serving certificate's SANs, read
    /// again at every renewal.
    #[arg(long, help_heading = "TLS", default_values_t = ["kube-system/x-tunnel-server-svc".to_string(), "kube-system/x-tunnel-server-internal-svc".to_string()])]
    pub csr_service: Vec<String>,
    /// Lease duration, seconds: a dead leader is replaced after this long.
    #[arg(long, help_heading = "Kubernetes", default_value_t = 15)]
    pub leader_lease_secs: u32,
    /// Agents authenticate with a ServiceAccount token checked by a
    /// TokenReview (ANP's agent authentication): the agent's namespace.
    /// With --agent-service-account and --authentication-audience; needs
    /// --kube; agents then need no client certificate.
    #[arg(long, help_heading = "Agents")]
    pub agent_namespace: Option<String>,
    /// The agents' ServiceAccount name (see --agent-namespace).
    #[arg(long, help_heading = "Agents")]
    pub agent_service_account: Option<String>,
    /// The audience the agents' tokens must carry (see --agent-namespace).
    #[arg(long, help_heading = "Agents")]
    pub authentication_audience: Option<String>,
    /// Seconds an accepted agent token is believed without a new
    /// TokenReview (never past the token's own expiry); 0 reviews every
    /// Connect, as ANP does. A restart of N agents then costs about N
    /// reviews, not N times the retries.
    #[arg(long, help_heading = "Agents", default_value_t = 120)]
    pub token_review_cache_secs: u64,
    /// TokenReviews sent to the kube-apiserver per second at most (0: no
    /// limit); the same token asked for twice meanwhile waits for one.
    #[arg(long, help_heading = "Agents", default_value_t = 500)]
    pub token_review_qps: u32,
    /// TokenReviews sent at once before --token-review-qps spaces them.
    #[arg(long, help_heading = "Agents", default_value_t = 1000)]
    pub token_review_burst: u32,
    /// Bind each agent to its client certificate: the agent ID must be the
    /// certificate's CN (`system:node:<name>` counts as `<name>`) or a DNS
    /// SAN, `host` identifiers such names, `ipv4`/`ipv6` identifiers IP
    /// SANs, a `cidr` only when all its addresses are IP SANs, no
    /// `default-route`; the certificate must have the clientAuth usage, and
    /// an agent ID held by another certificate's connection is refused.
    /// Token-authenticated agents without a certificate are not bound.
    /// On by default: any valid client certificate could otherwise
    /// register any node's ID and receive its dials. Each node then needs
    /// its own certificate naming its ID (`edgetunnel certs`);
    /// `--bind-agent-identity=false` accepts any certificate the CA signed
    /// (ANP's behaviour, and that of the proxy-server and
    /// yurt-tunnel-server faces).
    #[arg(
        help_heading = "Agents",
        long,
        action = clap::ArgAction::Set,
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub bind_agent_identity: bool,
    /// Publish this server's Lease in ANP's format
    /// (`konnectivity-proxy-server-<server ID>`, renewed every 15 s, 30 s
    /// long) and delete expired ones with --lease-label, so that agents
    /// with --count-server-leases (ANP's or ours) find every server; needs
    /// --kube.
    #[arg(long, help_heading = "Kubernetes")]
    pub enable_lease_controller: bool,
    /// Namespace of the server leases.
    #[arg(long, help_heading = "Kubernetes", default_value = crate::control::server_lease::DEFAULT_NAMESPACE)]
    pub lease_namespace: String,
    /// Labels (`k=v,...`) put on this server's lease and selecting the
    /// leases garbage-collected.
    #[arg(long, help_heading = "Kubernetes", default_value = crate::control::server_lease::DEFAULT_LABEL)]
    pub lease_label: String,
    /// Server lease duration, seconds (ANP: 30; for tests).
    #[arg(long, help_heading = "Kubernetes", hide = true, default_value_t = crate::control::server_lease::DEFAULT_DURATION_SECS)]
    pub lease_duration_secs: i32,
    /// Server lease renewal period, seconds (ANP: 15; for tests).
    #[arg(long, help_heading = "Kubernetes", hide = true, default_value_t = 15.0)]
    pub lease_renew_secs: f64,
    /// Expired-lease collection period, seconds (ANP: 15; for tests).
    #[arg(long, help_heading = "Kubernetes", hide = true, default_value_t = 15.0)]
    pub lease_gc_secs: f64,
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl ServerArgs {
    /// The server's configuration. Each part comes from its own builder
    /// below, called in this order (the first error is the one reported).
    pub fn into_config(self) -> Result<ServerConfig, BoxError> {
        let tls = self.tls_files()?;
        let agent_token = read_token(&self.agent_token_file)?;
        let strategies = self.strategies()?;
        let iptables = self.iptables()?;
        let interception_tls = self.interception_tls(&tls)?;
        let server_id = self
            .server_id
            .clone()
            .unwrap_or_else(|| format!("{:016x}", fastrand::u64(..)));
        let kube = self.kube(&server_id)?;
        let has_kube = kube.is_some();
        let csr = self.csr(has_kube, &tls, interception_tls.as_ref())?;
        if self.dns_configmap.is_some() && !has_kube {
            return Err("--dns-configmap needs --kube".into());
        }
        let agent_auth = self.agent_auth(has_kube)?;
        let server_lease = self.server_lease(has_kube, &server_id)?;
        let dns = self.dns(has_kube)?;
        let tls_policy = self.tls_policy()?;
        let frontend_tls = self.frontend_tls()?;
        let handshake_limits = handshake_limits(
            self.max_handshakes,
            self.max_handshakes_per_ip,
            engine::sys::nofile_limit(),
        );
        Ok(ServerConfig {
            announce: Default::default(),
            frontend_tls,
            tls_policy,
            control: crate::control::manager::ControlSpec {
                iptables,
                dns,
                kube,
                certs: Vec::new(),
                csr,
                server_lease,
                lease_count: None,
                token_review: None,
            },
            agent_auth,
            bind_agent_identity: self.bind_agent_identity,
            interception_tls,
            interception_bind: self.interception_bind,
            localhost_proxy_ports: self.localhost_proxy_ports,
            agent_bind: self.agent_bind,
            connect_bind: self.connect_bind,
            connect_uds: self.connect_uds,
            grpc_bind: self.grpc_bind,
            grpc_uds: self.grpc_uds,
            uds: engine::listener::UdsOptions {
                mode: self.uds_mode,
                replace_stale: !self.keep_existing_uds,
            },
            admin_bind: Some(self.admin_bind),
            health_bind: self.health_bind,
            tls,
            agent_token,
            strategies,
            server_id,
            server_count: self.server_count.max(1),
            workers: self.workers.unwrap_or_else(runtime::default_workers),
            driver: self.engine.driver,
            dial_timeout: secs(self.dial_timeout_secs),
            no_agent_status: self.no_agent_status,
            max_message: self.engine.max_message_size,
            keepalive: Duration::from_secs(self.engine.keepalive_secs.max(1)),
            frontend_keepalive: secs(self.frontend_keepalive_secs).max(Duration::from_millis(100)),
            graceful_shutdown: secs(self.graceful_shutdown_timeout_secs),
            handover_socket: self.handover_socket.clone(),
            takeover_dial_wait: secs(self.takeover_dial_wait_secs),
            handover_wait: secs(self.handover_wait_secs),
            handshake_limits,
            frontend_idle: secs(self.frontend_idle_secs).max(Duration::from_millis(100)),
            half_close_linger: secs(self.engine.half_close_linger_secs),
        })
    }

    /// The agent listener's certificate, key and CA.
    fn tls_files(&self) -> Result<TlsFiles, BoxError> {
        let token_auth = self.agent_namespace.is_some();
        match self.tls.files("server") {
            // Token-authenticated agents: no CA needed (none is asked for).
            Err(_) if token_auth && self.tls.ca.is_none() && self.tls.certs_dir.is_none() => {
                Ok(TlsFiles {
                    cert: self
                        .tls
                        .cert
                        .clone()
                        .ok_or("--cert or --certs-dir is required")?,
                    key: self
                        .tls
                        .key
                        .clone()
                        .ok_or("--key or --certs-dir is required")?,
                    ca: PathBuf::new(),
                })
            }
            other => other,
        }
    }

    fn strategies(&self) -> Result<Vec<protocol::anp::routing::Strategy>, BoxError> {
        let strategies = parse_strategies(&self.proxy_strategies)?;
        if strategies.is_empty() {
            return Err("--proxy-strategies must name at least one strategy".into());
        }
        Ok(strategies)
    }

    /// The iptables rules kept with `--iptables`.
    fn iptables(&self) -> Result<Option<manager::IptablesSpec>, BoxError> {
        if !self.iptables {
            return Ok(None);
        }
        let bind = self
            .interception_bind
            .ok_or("--iptables needs --interception-bind (the DNAT target)")?;
        let ips = if self.iptables_dnat_ip.is_empty() {
            if bind.ip().is_unspecified() {
                return Err(
                    "--interception-bind is a wildcard address: give --iptables-dnat-ip".into(),
                );
            }
            vec![bind.ip()]
        } else {
            self.iptables_dnat_ip.clone()
        };
        let mut ports = manager::port_rules(&self.iptables_http_ports, &ips, bind.port());
        let tls_port = self.interception_tls_bind.map_or(bind.port(), |b| b.port());
        ports.extend(manager::port_rules(
            &self.iptables_https_ports,
            &ips,
            tls_port,
        ));
        Ok(Some(manager::IptablesSpec {
            ports,
            dnat: manager::DnatTarget {
                addrs: ips,
                plain_port: bind.port(),
                tls_port,
            },
            cloud_nodes: (!self.cloud_node_ip.is_empty())
                .then(|| self.cloud_node_ip.iter().copied().collect()),
            period: Duration::from_secs(self.iptables_sync_period_secs)
                .max(manager::MIN_SYNC_PERIOD),
            keep_rules: self.iptables_keep_rules,
        }))
    }

    /// The TLS interception listener (`--interception-tls-bind`) and its
    /// certificates (defaults: the server's, and proxy-client.* in
    /// --certs-dir toward kubelets).
    fn interception_tls(
        &self,
        tls: &TlsFiles,
    ) -> Result<Option<crate::server::InterceptionTls>, BoxError> {
        let Some(bind) = self.interception_tls_bind else {
            return Ok(None);
        };
        let dir_file = |explicit: &Option<PathBuf>, name: &str, flag: &str| {
            explicit
                .clone()
                .or_else(|| self.tls.certs_dir.as_ref().map(|d| d.join(name)))
                .ok_or_else(|| BoxError::from(format!("--{flag} or --certs-dir is required")))
        };
        Ok(Some(crate::server::InterceptionTls {
            bind,
            cert: self.interception_cert.clone().unwrap_or(tls.cert.clone()),
            key: self.interception_key.clone().unwrap_or(tls.key.clone()),
            kubelet_cert: dir_file(
                &self.kubelet_client_cert,
                "proxy-client.crt",
                "kubelet-client-cert",
            )?,
            kubelet_key: dir_file(
                &self.kubelet_client_key,
                "proxy-client.key",
                "kubelet-client-key",
            )?,
            kubelet_ca: (!self.kubelet_insecure_skip_verify)
                .then(|| self.kubelet_ca.clone().unwrap_or(tls.ca.clone())),
        }))
    }

    /// Kubernetes access (`--kube`) and what the control thread reads and
    /// writes there.
    fn kube(&self, server_id: &str) -> Result<Option<manager::KubeSpec>, BoxError> {
        let Some(k) = &self.kube else {
            return Ok(None);
        };
        let (key, value) = self
            .edge_node_label
            .split_once('=')
            .ok_or("--edge-node-label: expected key=value")?;
        Ok(Some(manager::KubeSpec {
            kubeconfig: (k != "in-cluster").then(|| PathBuf::from(k)),
            edge_label: manager::EdgeLabel {
                key: key.to_string(),
                value: value.to_string(),
            },
            dns_configmap: self.dns_configmap.as_deref().map(object).transpose()?,
            // The nodes and yurt-tunnel's port ConfigMap feed only the
            // iptables rules and the DNS records: without them a server
            // (e.g. ANP's proxy-server face with --kubeconfig for
            // TokenReviews and leases) reads neither, as ANP does not, and
            // needs no RBAC for them.
            server_configmap: (self.iptables || self.dns_service_dnat_ports)
                .then(|| object(&self.server_configmap))
                .transpose()?,
            watch_nodes: self.iptables
                || self.dns_hosts_file.is_some()
                || self.dns_configmap.is_some(),
            lease: match self.dns_configmap {
                Some(_) => Some(manager::LeaderLease {
                    lease: object(&self.leader_lease)?,
                    holder: server_id.to_string(),
                    duration_secs: self.leader_lease_secs.max(1) as i32,
                }),
                None => None,
            },
        }))
    }

    /// Certificates requested from the cluster with `--cert-mode csr`.
    fn csr(
        &self,
        has_kube: bool,
        tls: &TlsFiles,
        interception_tls: Option<&crate::server::InterceptionTls>,
    ) -> Result<Vec<crate::control::csr::Job>, BoxError> {
        use crate::control::csr::{Job, Profile};
        match self.cert_mode {
            CertMode::Files => return Ok(Vec::new()),
            CertMode::Csr if !has_kube => return Err("--cert-mode csr needs --kube".into()),
            CertMode::Csr => {}
        }
        let mut jobs = vec![Job {
            profile: Profile::server(self.csr_dns_name.clone(), self.csr_ip.clone()),
            cert: tls.cert.clone(),
            key: tls.key.clone(),
            name_prefix: "edgetunnel-server-".into(),
            services: self
                .csr_service
                .iter()
                .map(|s| object(s))
                .collect::<Result<_, _>>()?,
        }];
        if let Some(t) = interception_tls {
            jobs.push(Job {
                profile: Profile::proxy_client(),
                cert: t.kubelet_cert.clone(),
                key: t.kubelet_key.clone(),
                name_prefix: "edgetunnel-proxy-client-".into(),
                services: Vec::new(),
            });
        }
        Ok(jobs)
    }

    /// Agents authenticated by TokenReview (`--agent-namespace`,
    /// `--agent-service-account`, `--authentication-audience`, all or none).
    fn agent_auth(
        &self,
        has_kube: bool,
    ) -> Result<Option<crate::control::token_review::AgentAuthSpec>, BoxError> {
        use crate::control::token_review::{AgentAuthSpec, ReviewLimits};
        match (
            &self.agent_namespace,
            &self.agent_service_account,
            &self.authentication_audience,
        ) {
            (None, None, None) => Ok(None),
            (Some(ns), Some(sa), Some(aud)) if !ns.is_empty() && !sa.is_empty() => {
                if !has_kube {
                    return Err("--agent-namespace/--agent-service-account need --kube".into());
                }
                Ok(Some(AgentAuthSpec {
                    audience: aud.clone(),
                    namespace: ns.clone(),
                    service_account: sa.clone(),
                    limits: ReviewLimits {
                        accepted_ttl: Duration::from_secs(self.token_review_cache_secs),
                        qps: self.token_review_qps,
                        burst: self.token_review_burst,
                    },
                }))
            }
            _ => Err("agent authentication needs --agent-namespace, --agent-service-account and --authentication-audience together".into()),
        }
    }

    /// This server's ANP-format lease (`--enable-lease-controller`).
    fn server_lease(
        &self,
        has_kube: bool,
        server_id: &str,
    ) -> Result<Option<crate::control::server_lease::ServerLeaseSpec>, BoxError> {
        use crate::control::server_lease::{parse_labels, ServerLeaseSpec};
        if !self.enable_lease_controller {
            return Ok(None);
        }
        if !has_kube {
            return Err("--enable-lease-controller needs --kube".into());
        }
        let labels = parse_labels(&self.lease_label)?;
        let mut spec = ServerLeaseSpec::new(&self.lease_namespace, labels, server_id);
        spec.duration_secs = self.lease_duration_secs.max(1);
        spec.renew = secs(self.lease_renew_secs).max(Duration::from_millis(100));
        spec.gc_period = secs(self.lease_gc_secs).max(Duration::from_millis(100));
        Ok(Some(spec))
    }

    /// The DNS records (`--dns-hosts-file`, `--dns-configmap`).
    fn dns(&self, has_kube: bool) -> Result<Option<manager::DnsSpec>, BoxError> {
        if self.dns_hosts_file.is_none() && self.dns_configmap.is_none() {
            return Ok(None);
        }
        let tunnel = match &self.dns_tunnel_service {
            Some(svc) => {
                if !has_kube {
                    return Err("--dns-tunnel-service needs --kube".into());
                }
                manager::DnsTunnel::Service(object(svc)?)
            }
            None => manager::DnsTunnel::Ip(
                self.dns_tunnel_ip
                    .or_else(|| {
                        self.interception_bind
                            .map(|b| b.ip())
                            .filter(|ip| !ip.is_unspecified())
                    })
                    .ok_or(
                        "DNS records need --dns-tunnel-ip, --dns-tunnel-service or a specific --interception-bind",
                    )?,
            ),
        };
        let service_dnat = match (&self.dns_tunnel_service, self.dns_service_dnat_ports) {
            (Some(svc), true) => Some(manager::ServiceDnat {
                service: object(svc)?,
                insecure_port: self
                    .interception_bind
                    .ok_or("--dns-service-dnat-ports needs --interception-bind")?
                    .port(),
                secure_port: self
                    .interception_tls_bind
                    .ok_or("--dns-service-dnat-ports needs --interception-tls-bind")?
                    .port(),
            }),
            _ => None,
        };
        Ok(Some(manager::DnsSpec {
            hosts_file: self.dns_hosts_file.clone(),
            tunnel,
            cloud_nodes: self.dns_cloud_node.iter().cloned().collect(),
            service_dnat,
        }))
    }

    /// TLS versions and suites of the agent and frontend listeners; what
    /// is ignored is logged.
    fn tls_policy(&self) -> Result<engine::tls::TlsPolicy, BoxError> {
        let (policy, warnings) =
            engine::tls::TlsPolicy::parse(&self.tls_min_version, &self.cipher_suites)?;
        for w in warnings {
            tracing::warn!("{w}");
        }
        Ok(policy)
    }

    /// TLS on the TCP frontends (`--frontend-cert`).
    fn frontend_tls(&self) -> Result<Option<crate::server::FrontendTls>, BoxError> {
        let (Some(cert), Some(key)) = (&self.frontend_cert, &self.frontend_key) else {
            return Ok(None);
        };
        if self.connect_bind.is_none() && self.grpc_bind.is_none() {
            return Err(
                "--frontend-cert needs a TCP frontend (--connect-bind or --grpc-bind)".into(),
            );
        }
        Ok(Some(crate::server::FrontendTls {
            cert: cert.clone(),
            key: key.clone(),
            ca: self.frontend_ca.clone(),
        }))
    }
}

/// A `namespace/name` flag value.
fn object(s: &str) -> Result<manager::ObjectRef, BoxError> {
    Ok(s.parse::<manager::ObjectRef>()?)
}

/// The default --max-handshakes: at most this many.
const DEFAULT_MAX_HANDSHAKES: usize = 1024;

/// The handshake caps for a descriptor limit `nofile`: an unset total is a
/// quarter of the limit (at most [`DEFAULT_MAX_HANDSHAKES`], at least 1),
/// and then bounds the per-address cap; an explicit total is kept, with a
/// warning above half the limit.
pub fn handshake_limits(
    total: Option<usize>,
    per_ip: usize,
    nofile: u64,
) -> engine::admission::Limits {
    let allowed = usize::try_from(nofile / 4).unwrap_or(usize::MAX);
    let total = match total {
        Some(t) => {
            if t as u64 > nofile / 2 {
                tracing::warn!(
                    max_handshakes = t,
                    nofile,
                    "--max-handshakes leaves too few descriptors for established tunnels \
                     under this descriptor limit"
                );
            }
            t
        }
        None => allowed.clamp(1, DEFAULT_MAX_HANDSHAKES),
    };
    let per_ip = if total > 0 && per_ip > total {
        total
    } else {
        per_ip
    };
    engine::admission::Limits { total, per_ip }
}

fn parse_no_agent_status(s: &str) -> Result<u16, String> {
    match s {
        "500" => Ok(500),
        "503" => Ok(503),
        _ => Err(format!("{s:?} is not 500 or 503")),
    }
}
