//! The agent's metrics: ANP's agent families
//! (`konnectivity_network_proxy_agent_*`, from ANP's
//! `pkg/agent/metrics/metrics.go` and
//! `konnectivity-client/pkg/common/metrics/metrics.go`) and a few of
//! edgetunnel's own (`edgetunnel_agent_*`). One agent per process: the
//! values are process-wide, like ANP's.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::{
    Exact, ExactCounter, Exposition, GaugeGuard, Label1, LinkTlsCounters, Segment, Streams,
};
use engine::tls_records::LinkTls;

/// ANP agent `latencyBuckets` (pkg/agent/metrics/metrics.go).
pub const ANP_AGENT_LATENCY_BUCKETS: [f64; 7] = [0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 30.0];

const ANP_AGENT: &str = "konnectivity_network_proxy_agent_";

/// Why a dial to a local endpoint failed (ANP's agent `DialFailureReason`,
/// and edgetunnel's `policy`: refused by `--allow-destinations` /
/// `--deny-destinations` before any socket was opened).
#[derive(Debug, Clone, Copy)]
pub enum EndpointDialFailure {
    Timeout,
    Unknown,
    Policy,
}

/// Direction of a server connection failure (ANP's agent `Direction`).
#[derive(Debug, Clone, Copy)]
pub enum Direction {
    ToServer,
    FromServer,
}

#[derive(Debug)]
pub struct AgentMetrics {
    exposition: Exposition,
    dial_duration: Histogram,
    server_failures: [ExactCounter; 2],
    dial_failures: [Counter; 3],
    open_server_connections: Gauge,
    known_server_count: Gauge,
    open_endpoint_connections: Gauge,
    streams: Streams,
    servers_connected: Gauge,
    dials: [Counter; 5],
    dials_pending: Gauge,
    keepalive_timeouts: Counter,
    server_drains: Counter,
    server_busy: Counter,
    server_duplicates: Counter,
    link_tls: LinkTlsCounters,
}

static METRICS: LazyLock<AgentMetrics> = LazyLock::new(AgentMetrics::new);

/// The process's agent metrics.
pub fn metrics() -> &'static AgentMetrics {
    &METRICS
}

impl AgentMetrics {
    fn new() -> Self {
        let mut x = Exact::default();
        let dial_duration = Histogram::new(ANP_AGENT_LATENCY_BUCKETS);
        x.add(
            format!("{ANP_AGENT}dial_duration_seconds"),
            "Latency of dial to the remote endpoint in seconds",
            dial_duration.clone(),
        );
        let sf = Family::<Label1, ExactCounter>::default();
        let server_failures =
            ["to_server", "from_server"].map(|d| sf.get_or_create_owned(&[("direction", d)]));
        x.add_counter(
            format!("{ANP_AGENT}server_connection_failure_count"),
            "Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server). DEPRECATED, please use stream_events_error_total",
            sf,
        );
        let df = Family::<Label1, Counter>::default();
        let dial_failures =
            ["timeout", "unknown", "policy"].map(|r| df.get_or_create_owned(&[("reason", r)]));
        // Registered without "_total": the text encoder adds it to counters.
        x.add(
            format!("{ANP_AGENT}endpoint_dial_failure"),
            "Number of failures dialing the remote endpoint, by reason (example: timeout).",
            df,
        );
        let gauge = |x: &mut Exact, name: String, help: &'static str| {
            let g = Gauge::default();
            x.add(name, help, g.clone());
            g
        };
        let open_server_connections = gauge(
            &mut x,
            format!("{ANP_AGENT}open_server_connections"),
            "Current number of open server connections.",
        );
        let known_server_count = gauge(
            &mut x,
            format!("{ANP_AGENT}known_server_count"),
            "Current number of servers agent is trying to connect to.",
        );
        let open_endpoint_connections = gauge(
            &mut x,
            format!("{ANP_AGENT}open_endpoint_connections"),
            "Current number of open endpoint connections.",
        );
        let streams = Streams::new(&mut x, ANP_AGENT, &[Segment::FromAgent, Segment::ToAgent]);
        let servers_connected = gauge(
            &mut x,
            "edgetunnel_agent_servers_connected".into(),
            "Server connections up (Connect stream accepted).",
        );
        let d = Family::<Label1, Counter>::default();
        let dials = ["success", "failure", "timeout", "refused", "cancelled"]
            .map(|r| d.get_or_create_owned(&[("result", r)]));
        x.add(
            "edgetunnel_agent_dials",
            "Dials to local endpoints by result (refused: by the destination policy; cancelled: by the server's DIAL_CLS or its connection ending).",
            d,
        );
        let dials_pending = gauge(
            &mut x,
            "edgetunnel_agent_dials_pending".into(),
            "Dials to local endpoints in progress.",
        );
        let kt = Family::<Label1, Counter>::default();
        let keepalive_timeouts = kt.get_or_create_owned(&[("peer", "server")]);
        x.add(
            "edgetunnel_keepalive_timeouts",
            "Server connections dropped because an HTTP/2 keepalive PING (--keepalive-secs) was not answered.",
            kt,
        );
        let server_drains = Counter::default();
        // Registered without "_total": the text encoder adds it to counters.
        x.add(
            "edgetunnel_agent_server_drains",
            "DRAIN notices from servers shutting down (each server connection counts one).",
            server_drains.clone(),
        );
        let server_busy = Counter::default();
        // Registered without "_total": the text encoder adds it to counters.
        x.add(
            "edgetunnel_agent_server_busy",
            "Connection attempts a server refused because it was busy (its handshake caps were full: a TLS user_canceled alert); the agent backs off.",
            server_busy.clone(),
        );
        let server_duplicates = Counter::default();
        // Registered without "_total": the text encoder adds it to counters.
        x.add(
            "edgetunnel_agent_server_duplicates",
            "Server connections the agent closed because they reached a server it is already connected to (a load balancer in front of several servers); the slot tries again until it reaches another.",
            server_duplicates.clone(),
        );
        let link_tls = LinkTlsCounters::register(&mut x);
        x.add(
            "edgetunnel_certificate_reloads",
            "Certificate reloads by result: ok (a new certificate and key in use for new handshakes, after their files changed or on SIGHUP), failed (the pair did not load; the old one stays in use).",
            engine::cert_reload::reload_counts(),
        );
        x.add(
            "edgetunnel_log_write_errors",
            "Log lines lost: their write failed (stderr closed, disk full) or the log queue was full (stderr not read).",
            crate::logging::write_errors(),
        );
        AgentMetrics {
            exposition: Exposition::new(x),
            dial_duration,
            server_failures,
            dial_failures,
            open_server_connections,
            known_server_count,
            open_endpoint_connections,
            streams,
            servers_connected,
            dials,
            dials_pending,
            keepalive_timeouts,
            server_drains,
            server_busy,
            server_duplicates,
            link_tls,
        }
    }

    /// A server said it drains (DRAIN): new dials go elsewhere.
    pub fn server_drain(&self) {
        self.server_drains.inc();
    }

    /// A server refused a connection attempt: busy (see
    /// [`crate::agent::backoff::is_busy`]).
    pub fn server_busy(&self) {
        self.server_busy.inc();
    }

    /// A connection reached a server already connected and was closed.
    pub fn server_duplicate(&self) {
        self.server_duplicates.inc();
    }

    /// A server link's TLS handshake completed as `t`.
    pub fn link_tls(&self, t: LinkTls) {
        self.link_tls.inc(t);
    }

    /// A server connection dropped by its keepalive (the server went
    /// silent).
    pub fn keepalive_timeout(&self) {
        self.keepalive_timeouts.inc();
    }

    /// Held while a server connection is up.
    pub fn server_connection(&self) -> (GaugeGuard, GaugeGuard) {
        (
            GaugeGuard::new(&self.open_server_connections),
            GaugeGuard::new(&self.servers_connected),
        )
    }

    /// Servers the agent tries to keep a connection to (summed over its
    /// addresses' `serverCount`).
    pub fn set_known_servers(&self, n: usize) {
        self.known_server_count.set(n as i64);
    }

    /// Held while a connection to a local endpoint is open.
    pub fn endpoint_connection(&self) -> GaugeGuard {
        GaugeGuard::new(&self.open_endpoint_connections)
    }

    pub fn dial_succeeded(&self, elapsed: Duration) {
        self.dial_duration.observe(elapsed.as_secs_f64());
        self.dials[0].inc();
    }

    pub fn dial_failed(&self, reason: EndpointDialFailure) {
        match reason {
            EndpointDialFailure::Timeout => {
                self.dial_failures[0].inc();
                self.dials[2].inc();
            }
            EndpointDialFailure::Unknown => {
                self.dial_failures[1].inc();
                self.dials[1].inc();
            }
            EndpointDialFailure::Policy => {
                self.dial_failures[2].inc();
                self.dials[3].inc();
            }
        }
    }

    /// A dial abandoned because the server no longer wants it.
    pub fn dial_cancelled(&self) {
        self.dials[4].inc();
    }

    /// Held while a dial to a local endpoint is in progress.
    pub fn dial_pending(&self) -> GaugeGuard {
        GaugeGuard::new(&self.dials_pending)
    }

    /// A send to (`ToServer`) or receive from the server failed.
    pub fn server_failure(&self, d: Direction, code: &'static str, packet_type: &'static str) {
        self.server_failures[d as usize].inc();
        let segment = match d {
            Direction::ToServer => Segment::FromAgent,
            Direction::FromServer => Segment::ToAgent,
        };
        self.streams.error(segment, code, packet_type);
    }

    /// One packet sent (`FromAgent`) or received (`ToAgent`).
    #[inline]
    pub fn packet(&self, segment: Segment, packet_type: protocol::anp::pb::PacketType) {
        self.streams.packet(segment, packet_type);
    }

    pub fn open_server_connections(&self) -> i64 {
        self.open_server_connections.get()
    }

    /// Whether a connection is up to every server the agent knows of (and
    /// to one at least).
    pub fn linked_to_every_server(&self) -> bool {
        let linked = self.servers_connected.get();
        linked > 0 && linked >= self.known_server_count.get()
    }

    pub fn render(&self) -> String {
        self.exposition.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::anp::pb::PacketType;

    #[test]
    fn anp_agent_families() {
        let m = AgentMetrics::new();
        let _s = m.server_connection();
        m.set_known_servers(2);
        let _e = m.endpoint_connection();
        m.dial_succeeded(Duration::from_millis(30));
        m.dial_failed(EndpointDialFailure::Timeout);
        m.dial_failed(EndpointDialFailure::Policy);
        m.dial_cancelled();
        let pending = m.dial_pending();
        m.server_failure(Direction::FromServer, "Unknown", "Unknown");
        m.packet(Segment::ToAgent, PacketType::DialReq);
        m.packet(Segment::FromAgent, PacketType::DialRsp);
        m.keepalive_timeout();
        m.server_drain();
        m.server_duplicate();
        let t = m.render();
        let p = ANP_AGENT;
        for s in [
            format!("{p}open_server_connections 1\n"),
            format!("{p}known_server_count 2\n"),
            format!("{p}open_endpoint_connections 1\n"),
            format!("{p}dial_duration_seconds_bucket{{le=\"0.025\"}} 0\n"),
            format!("{p}dial_duration_seconds_bucket{{le=\"0.1\"}} 1\n"),
            format!("{p}dial_duration_seconds_bucket{{le=\"30\"}} 1\n"),
            format!("{p}dial_duration_seconds_bucket{{le=\"+Inf\"}} 1\n"),
            format!("{p}endpoint_dial_failure_total{{reason=\"timeout\"}} 1\n"),
            format!("{p}server_connection_failure_count{{direction=\"from_server\"}} 1\n"),
            format!("{p}stream_packets_total{{segment=\"to_agent\",packet_type=\"DIAL_REQ\"}} 1\n"),
            format!("{p}stream_packets_total{{segment=\"from_agent\",packet_type=\"DIAL_RSP\"}} 1\n"),
            format!("{p}stream_errors_total{{segment=\"to_agent\",code=\"Unknown\",packet_type=\"Unknown\"}} 1\n"),
            "edgetunnel_agent_servers_connected 1\n".to_string(),
            "edgetunnel_agent_dials_total{result=\"timeout\"} 1\n".to_string(),
            format!("{p}endpoint_dial_failure_total{{reason=\"policy\"}} 1\n"),
            "edgetunnel_agent_dials_total{result=\"refused\"} 1\n".to_string(),
            "edgetunnel_agent_dials_total{result=\"cancelled\"} 1\n".to_string(),
            "edgetunnel_agent_dials_pending 1\n".to_string(),
            "edgetunnel_keepalive_timeouts_total{peer=\"server\"} 1\n".to_string(),
            "edgetunnel_agent_server_drains_total 1\n".to_string(),
            "edgetunnel_agent_server_duplicates_total 1\n".to_string(),
            "edgetunnel_certificate_reloads_total{result=\"failed\"} ".to_string(),
            format!("# HELP {p}open_server_connections Current number of open server connections.\n"),
            format!("# TYPE {p}server_connection_failure_count counter\n"),
        ] {
            assert!(t.contains(&s), "{s} missing in\n{t}");
        }
        drop(pending);
        assert!(m.render().contains("edgetunnel_agent_dials_pending 0\n"));
    }
}
