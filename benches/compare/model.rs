//! Shared vocabulary of the comparison harness: the systems under test, how
//! a client reaches a target through one of them, and the samples the
//! scenarios produce.

use std::net::SocketAddr;

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
    /// edgetunnel server + agent (mutual TLS), reached through the HTTP CONNECT frontend.
    EdgetunnelConnect,
    /// edgetunnel server + agent (mutual TLS), reached through gRPC ProxyService
    /// (one HTTP/2 connection per tunnel, as konnectivity-client's single-use tunnels).
    EdgetunnelGrpc,
}

impl SystemKind {
    pub(crate) const ALL: [SystemKind; 7] = [
        SystemKind::Direct,
        SystemKind::Socat,
        SystemKind::Haproxy,
        SystemKind::Rathole,
        SystemKind::SshR,
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
}

/// How a client opens a connection that ends at one target.
#[derive(Clone, Debug)]
pub(crate) enum Entry {
    /// Connect here; the bytes reach the target (direct, relays, reverse tunnels).
    Tcp(SocketAddr),
    /// Connect to `proxy`, send `CONNECT target`, expect 200, then raw bytes.
    Connect {
        proxy: SocketAddr,
        target: SocketAddr,
    },
    /// Open an HTTP/2 connection to `server`, call `/ProxyService/Proxy`,
    /// DIAL_REQ `target`, then DATA packets.
    Grpc {
        server: SocketAddr,
        target: SocketAddr,
    },
}

/// One measured value. Every repetition of every case is one sample.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    /// "bulk", "latency", "dial", "memory", "scaling", "hol".
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
}
