//! Shared vocabulary of the comparison harness: the systems under test and
//! the samples the scenarios produce (how a client reaches a target through
//! one of them is `client::Entry`, benches/shared/tunnel_client.rs).

/// A system a user could pick to carry cloud-to-edge TCP connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum SystemKind {
    /// Client connects straight to the target: the limit.
    Direct,
    /// `socat TCP-LISTEN:..,fork TCP:target`: one plain relay hop, a process per connection.
    Socat,
    /// haproxy in TCP mode: one plain relay hop, event-driven.
    Haproxy,
    /// rathole server + client (a Rust reverse tunnel), noise/TLS off or on as configured.
    Rathole,
    /// `ssh -R` reverse port forwarding through a local sshd.
    SshR,
    /// Two haproxy processes in TCP mode: a cloud one that takes the
    /// client's connection and originates mutual TLS 1.3 (the certificates
    /// and cipher suite of edgetunnel's agent link) to an edge one that
    /// terminates it and connects to the target: the four sockets and the
    /// encryption of a tunnel, done by a C relay.
    HaproxyTlsPair,
    /// The same pair made of two stunnel processes (a thread per
    /// connection each).
    StunnelPair,
    /// The incumbent: ANP's Go proxy-server (http-connect mode, frontend on
    /// a unix socket as kube-apiserver dials it) and its Go proxy-agent
    /// over mutual TLS. Runs only when the real peers are present.
    AnpUds,
    /// ANP's Go proxy-server in http-connect mode on TCP, whose frontend is
    /// mutual TLS only (the client presents the `certs init` proxy-client
    /// certificate), and its Go proxy-agent.
    AnpTcp,
    /// ANP's Go proxy-server in gRPC mode (its default), `ProxyService` on a
    /// unix socket as kube-apiserver's `GRPC` egress over `UDS` dials it, and
    /// its Go proxy-agent: the same work as `edgetunnel-grpc` (one HTTP/2
    /// connection and one Proxy stream per tunnel).
    AnpGrpc,
    /// edgetunnel server + agent (mutual TLS), reached through the HTTP CONNECT frontend.
    EdgetunnelConnect,
    /// edgetunnel server + agent (mutual TLS), reached through gRPC ProxyService
    /// (one HTTP/2 connection per tunnel, as konnectivity-client's single-use tunnels).
    EdgetunnelGrpc,
}

impl SystemKind {
    pub(crate) const ALL: [SystemKind; 12] = [
        SystemKind::Direct,
        SystemKind::Socat,
        SystemKind::Haproxy,
        SystemKind::Rathole,
        SystemKind::SshR,
        SystemKind::HaproxyTlsPair,
        SystemKind::StunnelPair,
        SystemKind::AnpUds,
        SystemKind::AnpTcp,
        SystemKind::AnpGrpc,
        SystemKind::EdgetunnelConnect,
        SystemKind::EdgetunnelGrpc,
    ];

    /// Short stable name used in JSON, tables, plots and `--systems`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SystemKind::Direct => "direct",
            SystemKind::Socat => "socat",
            SystemKind::Haproxy => "haproxy",
            SystemKind::Rathole => "rathole",
            SystemKind::SshR => "ssh-R",
            SystemKind::HaproxyTlsPair => "haproxy-tls-pair",
            SystemKind::StunnelPair => "stunnel-pair",
            SystemKind::AnpUds => "anp-uds",
            SystemKind::AnpTcp => "anp-tcp",
            SystemKind::AnpGrpc => "anp-grpc",
            SystemKind::EdgetunnelConnect => "edgetunnel-connect",
            SystemKind::EdgetunnelGrpc => "edgetunnel-grpc",
        }
    }

    pub(crate) fn from_name(s: &str) -> Option<SystemKind> {
        SystemKind::ALL.into_iter().find(|k| k.name() == s)
    }

    pub(crate) fn is_edgetunnel(self) -> bool {
        matches!(
            self,
            SystemKind::EdgetunnelConnect | SystemKind::EdgetunnelGrpc
        )
    }

    /// The Go ANP systems: they need the real peers, and a run without
    /// them says "not run: no peers" instead of failing.
    pub(crate) fn is_anp(self) -> bool {
        matches!(
            self,
            SystemKind::AnpUds | SystemKind::AnpTcp | SystemKind::AnpGrpc
        )
    }
}

/// One measured value. Every repetition of every case is one sample.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    /// "bulk", "latency", "dial", "memory", "scaling", "hol", "fleet", "soak".
    pub scenario: String,
    /// What was measured within the scenario, e.g. "1 stream upload",
    /// "rate 1000/s", "10000 idle". Rows of the tables.
    pub case: String,
    /// `SystemKind::name()`, or e.g. "edgetunnel-connect --workers 1".
    pub system: String,
    /// Unit and meaning, e.g. "Gbit/s", "p99 ms", "conn/s", "bytes/conn".
    pub metric: String,
    pub value: f64,
    /// 0-based repetition index.
    pub rep: u32,
    pub higher_is_better: bool,
    /// For latency samples: (percentile 0..=100, milliseconds) points of the
    /// distribution, enough to draw a CDF. Empty otherwise.
    pub cdf: Vec<(f64, f64)>,
    /// For the soak's memory curves: (tunnels served, value) at each
    /// sampling point, drawn as a line. Empty otherwise.
    pub series: Vec<(f64, f64)>,
}

#[cfg(test)]
impl Sample {
    /// A sample of the first repetition, lower is better, no points: for
    /// tests, which set what else they need.
    pub(crate) fn of(scenario: &str, case: &str, system: &str, metric: &str, value: f64) -> Sample {
        Sample {
            scenario: scenario.into(),
            case: case.into(),
            system: system.into(),
            metric: metric.into(),
            value,
            rep: 0,
            higher_is_better: false,
            cdf: Vec::new(),
            series: Vec::new(),
        }
    }
}
