//! Prometheus metrics of the tunnel, built on `prometheus-client` and
//! rendered in the Prometheus text format (0.0.4, [`CONTENT_TYPE`]).
//!
//! Two sets of families live side by side:
//! - edgetunnel's own (`edgetunnel_*`), unchanged in names, labels and
//!   meaning;
//! - the names of apiserver-network-proxy's Go server
//!   (`konnectivity_network_proxy_server_*`, from ANP's
//!   `pkg/server/metrics/metrics.go` and
//!   `konnectivity-client/pkg/common/metrics/metrics.go`), so that dashboards
//!   and alerts written for ANP keep working.
//!
//! Every value is an atomic shared by all cores; the per-packet counters are
//! handles created once (no label lookup on the hot path).

pub mod agent;

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use engine::grpc;
use engine::tls_records::LinkTls;
use protocol::anp::agent_identity::REASONS;
use protocol::anp::packet::Frame;
use protocol::anp::pb::PacketType;
use protocol::anp::routing::Strategy;
use protocol::h2_server::Flood;

// The text exposition (exact names, counters retyped, the process
// families) is shared with the `kubectl proxy` crate, so it lives in the
// engine crate; the paths below stay.
pub use engine::exposition::{process, ExactCounter, CONTENT_TYPE};
use engine::exposition::{Exact, Exposition};

/// Upper bounds (seconds) of `edgetunnel_dial_duration_seconds`.
const DIAL_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// ANP server `latencyBuckets` (pkg/server/metrics/metrics.go).
pub const ANP_SERVER_LATENCY_BUCKETS: [f64; 9] =
    [0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];

const ANP_SERVER: &str = "konnectivity_network_proxy_server_";

/// Outcome of a dial, a label of `edgetunnel_dials_total` (and, for
/// failures, a reason of ANP's `dial_failure_count`).
#[derive(Debug, Clone, Copy)]
pub enum DialResult {
    Success,
    /// The agent answered with an error (ANP `error_response`).
    Failure,
    /// No answer in time (ANP `backend_dial_timeout`).
    Timeout,
    NoAgent,
    /// The agent closed the dial (DIAL_CLS) before answering: counted as
    /// `failure` here, ANP `backend_close`.
    BackendClose,
    /// The client gave up (closed its stream or sent DIAL_CLS) before the
    /// answer: counted as `timeout` here, ANP `frontend_close`.
    FrontendClose,
}

impl DialResult {
    /// Index into `edgetunnel_dials_total{result}`.
    fn index(self) -> usize {
        match self {
            DialResult::Success => 0,
            DialResult::Failure | DialResult::BackendClose => 1,
            DialResult::Timeout | DialResult::FrontendClose => 2,
            DialResult::NoAgent => 3,
        }
    }

    fn anp_reason(self) -> Option<DialFailure> {
        Some(match self {
            DialResult::Success => return None,
            DialResult::Failure => DialFailure::ErrorResponse,
            DialResult::Timeout => DialFailure::BackendDialTimeout,
            DialResult::NoAgent => DialFailure::NoAgent,
            DialResult::BackendClose => DialFailure::BackendClose,
            DialResult::FrontendClose => DialFailure::FrontendClose,
        })
    }
}

const DIAL_RESULTS: [&str; 4] = ["success", "failure", "timeout", "no_agent"];

/// ANP's `DialFailureReason` values (pkg/server/metrics/metrics.go).
#[derive(Debug, Clone, Copy)]
pub enum DialFailure {
    NoAgent,
    ErrorResponse,
    UnrecognizedResponse,
    SendResponse,
    BackendClose,
    BackendDialTimeout,
    FrontendClose,
}

const DIAL_FAILURES: [&str; 7] = [
    "no_agent",
    "error_response",
    "unrecognized_response",
    "send_rsp",
    "backend_close",
    "backend_dial_timeout",
    "frontend_close",
];

/// A stream segment, ANP's `commonmetrics.Segment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    FromClient,
    ToClient,
    FromAgent,
    ToAgent,
}

impl Segment {
    pub fn as_str(self) -> &'static str {
        ["from_client", "to_client", "from_agent", "to_agent"][self as usize]
    }
}

/// Every `PacketType` (konnectivity-client/proto/client), in number order.
pub const ALL_PACKET_TYPES: [PacketType; 7] = [
    PacketType::DialReq,
    PacketType::DialRsp,
    PacketType::CloseReq,
    PacketType::CloseRsp,
    PacketType::Data,
    PacketType::DialCls,
    PacketType::Drain,
];

/// The packet type of a frame.
pub fn packet_type(f: &Frame) -> PacketType {
    match f {
        Frame::DialRequest(_) => PacketType::DialReq,
        Frame::DialResponse(_) => PacketType::DialRsp,
        Frame::CloseRequest(_) => PacketType::CloseReq,
        Frame::CloseResponse(_) => PacketType::CloseRsp,
        Frame::Data(_) => PacketType::Data,
        Frame::DialClose(_) => PacketType::DialCls,
        Frame::Drain => PacketType::Drain,
    }
}

/// The packet type of an encoded gRPC message (its 5-byte prefix
/// included): `type` is field 1, written first, and left out when 0
/// (DIAL_REQ); an unknown number reads as DIAL_REQ too.
pub fn encoded_packet_type(message_head: &[u8]) -> PacketType {
    match message_head.get(5..7) {
        Some([0x08, t]) => PacketType::try_from(i32::from(*t)).unwrap_or(PacketType::DialReq),
        _ => PacketType::DialReq,
    }
}

pub(crate) type Label1 = [(&'static str, &'static str); 1];
pub(crate) type Label2 = [(&'static str, &'static str); 2];
pub(crate) type Label3 = [(&'static str, &'static str); 3];

/// `edgetunnel_agent_link_tls_total{record_layer,tls_version}` (at both
/// ends of the agent link): links whose TLS handshake completed, one
/// counter per [`LinkTls`] value. A counter, not a gauge: nothing has to
/// be held for a link's life, and the mode is per process.
#[derive(Debug, Clone)]
pub(crate) struct LinkTlsCounters([Counter; 3]);

impl LinkTlsCounters {
    pub(crate) fn register(x: &mut Exact) -> Self {
        let f = Family::<Label2, Counter>::default();
        let counters = LinkTls::ALL.map(|t| {
            f.get_or_create_owned(&[
                ("record_layer", t.record_layer()),
                ("tls_version", t.version()),
            ])
        });
        // Registered without "_total": the text encoder adds it to counters.
        x.add(
            "edgetunnel_agent_link_tls",
            "Agent links whose TLS handshake completed, by record layer (own: edgetunnel's TLS 1.3 record layer, the default; rustls: TLS 1.2 links, or EDGETUNNEL_TLS_RECORDS=rustls) and TLS version.",
            f,
        );
        LinkTlsCounters(counters)
    }

    pub(crate) fn inc(&self, t: LinkTls) {
        self.0[t.index()].inc();
    }
}

/// `stream_packets_total` handles, one per segment and packet type, and
/// the `stream_errors_total` family.
#[derive(Debug)]
pub(crate) struct Streams {
    packets: Vec<[Counter; 7]>,
    segments: Vec<Segment>,
    errors: Family<Label3, Counter>,
}

impl Streams {
    pub(crate) fn new(exact: &mut Exact, prefix: &str, segments: &[Segment]) -> Self {
        let family = Family::<Label2, Counter>::default();
        let packets = segments
            .iter()
            .map(|s| {
                ALL_PACKET_TYPES.map(|t| {
                    family.get_or_create_owned(&[
                        ("segment", s.as_str()),
                        ("packet_type", t.as_str_name()),
                    ])
                })
            })
            .collect();
        let errors = Family::<Label3, Counter>::default();
        exact.add(
            format!("{prefix}stream_packets"),
            "Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)",
            family,
        );
        exact.add(
            format!("{prefix}stream_errors"),
            "Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)",
            errors.clone(),
        );
        Streams {
            packets,
            segments: segments.to_vec(),
            errors,
        }
    }

    /// One packet of type `packet_type` on `segment`.
    #[inline]
    pub(crate) fn packet(&self, segment: Segment, packet_type: PacketType) {
        if let Some(i) = self.segments.iter().position(|s| *s == segment) {
            if let Some(c) = self.packets[i].get(packet_type as usize) {
                c.inc();
            }
        }
    }

    /// A stream error; `packet_type` is "Unknown" when no packet was read.
    pub(crate) fn error(&self, segment: Segment, code: &'static str, packet_type: &'static str) {
        self.errors
            .get_or_create(&[
                ("segment", segment.as_str()),
                ("code", code),
                ("packet_type", packet_type),
            ])
            .inc();
    }

    pub(crate) fn packets(&self, segment: Segment, packet_type: PacketType) -> u64 {
        let i = self.segments.iter().position(|s| *s == segment);
        i.map_or(0, |i| self.packets[i][packet_type as usize].get())
    }
}

/// Decrements its gauge when dropped.
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    pub fn new(g: &Gauge) -> Self {
        g.inc();
        GaugeGuard(g.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn strategy_name(s: &Strategy) -> &'static str {
    match s {
        Strategy::Default => "default",
        Strategy::DestHost => "destHost",
        Strategy::DefaultRoute => "defaultRoute",
    }
}

/// Whose silence a server connection's keepalive noticed, the `peer` label
/// of `edgetunnel_keepalive_timeouts_total`.
#[derive(Debug, Clone, Copy)]
pub enum KeepalivePeer {
    /// An agent link (`--keepalive-secs`).
    Agent = 0,
    /// A gRPC frontend caller (`--frontend-keepalive-secs`).
    Frontend = 1,
}

/// ANP's `service_method` label.
#[derive(Debug, Clone, Copy)]
pub enum ServiceMethod {
    Proxy = 0,
    Connect = 1,
}

/// Go client's `prometheus.DefBuckets`, the buckets of ANP's lease
/// latency histograms (they set none).
const GO_DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

type LeaseLabels = Vec<(&'static str, String)>;
type LatencyFamily = Family<LeaseLabels, Histogram, fn() -> Histogram>;

fn lease_histogram() -> Histogram {
    Histogram::new(GO_DEFAULT_BUCKETS)
}

/// How the Connects that needed a verdict were answered
/// (`edgetunnel_token_reviews_total{result}`): by a TokenReview that
/// accepted, denied or failed, from memory, or by joining a review of the
/// same token already under way. The control thread counts
/// (`control::token_review`); this module shows them.
#[derive(Clone, Debug, Default)]
pub struct ReviewCounters {
    pub accepted: Counter,
    pub denied: Counter,
    pub failed: Counter,
    pub remembered: Counter,
    pub joined: Counter,
    /// Refused without a review: the reviews already waiting reach past
    /// what the data plane waits for an answer.
    pub shed: Counter,
    /// Not sent: every Connect waiting for it gave up first.
    pub abandoned: Counter,
}

/// ANP's lease garbage collection families (pkg/server/metrics/metrics.go,
/// observed as pkg/server/leases/gc_controller.go does): the culled
/// count, and each list and delete call by HTTP status code (200 on
/// success; the API status's code and reason on failure). Only a server
/// with `--enable-lease-controller` lists and deletes, so, as in Go, the
/// labelled families appear once a call was made; `culled_leases_count`
/// is always there.
#[derive(Debug, Clone)]
pub struct LeaseMetrics {
    culled: ExactCounter,
    delete_latency: LatencyFamily,
    deletes: Family<LeaseLabels, Counter>,
    list_latency: LatencyFamily,
    lists: Family<LeaseLabels, Counter>,
}

impl Default for LeaseMetrics {
    /// Handles registered nowhere (a lease controller without metrics).
    fn default() -> Self {
        LeaseMetrics {
            culled: ExactCounter::default(),
            delete_latency: Family::new_with_constructor(lease_histogram),
            deletes: Family::default(),
            list_latency: Family::new_with_constructor(lease_histogram),
            lists: Family::default(),
        }
    }
}

impl LeaseMetrics {
    fn register(x: &mut Exact) -> Self {
        let m = LeaseMetrics::default();
        x.add_counter(
            format!("{ANP_SERVER}culled_leases_count"),
            "Count of expired leases that the lease garbage collection controller has culled.",
            m.culled.clone(),
        );
        x.add(
            format!("{ANP_SERVER}lease_delete_latency_seconds"),
            "Latency of lease deletion calls by the garbage collection controller in seconds.",
            m.delete_latency.clone(),
        );
        x.add(
            format!("{ANP_SERVER}lease_delete"),
            "Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason.",
            m.deletes.clone(),
        );
        x.add(
            format!("{ANP_SERVER}lease_list_latency_seconds"),
            "Latency of lease list calls by the garbage collection controller in seconds.",
            m.list_latency.clone(),
        );
        x.add(
            format!("{ANP_SERVER}lease_list"),
            "Count of lease deletion calls by the garbage collection controller. Labeled by HTTP status code and reason.",
            m.lists.clone(),
        );
        m
    }

    /// An expired lease deleted.
    pub fn culled(&self) {
        self.culled.inc();
    }

    pub fn culled_count(&self) -> u64 {
        self.culled.get()
    }

    /// A list call answered `code` (`reason`: the API status reason, empty
    /// on success) after `latency`.
    pub fn list(&self, code: u16, reason: &str, latency: Duration) {
        observe(&self.list_latency, &self.lists, code, reason, latency);
    }

    /// A delete call, as [`LeaseMetrics::list`].
    pub fn delete(&self, code: u16, reason: &str, latency: Duration) {
        observe(&self.delete_latency, &self.deletes, code, reason, latency);
    }
}

fn observe(
    latency: &LatencyFamily,
    calls: &Family<LeaseLabels, Counter>,
    code: u16,
    reason: &str,
    took: Duration,
) {
    let code = code.to_string();
    latency
        .get_or_create(&vec![("http_status_code", code.clone())])
        .observe(took.as_secs_f64());
    calls
        .get_or_create(&vec![
            ("http_status_code", code),
            ("reason", reason.to_string()),
        ])
        .inc();
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    exposition: Exposition,
    pub agents_connected: Gauge,
    pub open_connections: Gauge,
    pub pending_dials: Gauge,
    dials: [Counter; 4],
    pub bytes_to_agent: Counter,
    pub bytes_from_agent: Counter,
    pub frontend_errors: Counter,
    pub agent_protocol_errors: Counter,
    /// Agent registrations refused by `--bind-agent-identity`, by reason
    /// ([`protocol::anp::agent_identity::REASONS`]).
    identity_refused: Vec<Counter>,
    dial_duration: Histogram,
    /// The agent listener's pre-authentication cap.
    pub handshakes: engine::admission::AdmissionMetrics,
    // ANP (konnectivity_network_proxy_server_*)
    anp_dial_duration: Histogram,
    frontend_write_duration: Histogram,
    full_receive_channels: [Gauge; 2],
    /// ANP's lease GC families, handed to the control thread.
    pub leases: LeaseMetrics,
    grpc_proxy: Gauge,
    grpc_connect: Gauge,
    http_connections: Gauge,
    ready_backend_connections: Gauge,
    ready_backends: Vec<Gauge>,
    anp_pending: Gauge,
    anp_established: Gauge,
    dial_failures: [ExactCounter; 7],
    streams: Streams,
    /// Agent Connects refused, by gRPC code ([`grpc::code::REFUSALS`],
    /// then `Unknown`).
    agents_refused: Vec<Counter>,
    /// DRAIN packets received from agents.
    pub agent_drains: Counter,
    /// `edgetunnel_token_reviews_total{result}`, counted by the control thread.
    pub token_reviews: ReviewCounters,
    /// Keepalive PINGs left unanswered: toward agents, toward gRPC
    /// frontend callers.
    keepalive_timeouts: [Counter; 2],
    /// gRPC frontend connections ended for an HTTP/2 flood, by kind
    /// ([`Flood`]: rapid reset, CONTINUATION).
    frontend_h2_floods: [Counter; 4],
    /// Per server worker: agent links held, dials sent, payload bytes.
    worker_links: Family<Label1, Gauge>,
    worker_dials: Family<Label1, Counter>,
    worker_bytes: Family<Label2, Counter>,
    link_tls: LinkTlsCounters,
}

/// The per-worker metrics of one agent link, looked up once per link.
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    pub links: Gauge,
    pub dials: Counter,
    pub bytes_to_agent: Counter,
    pub bytes_from_agent: Counter,
}

/// `"0"`, `"1"`, ... as label values that live for the process.
fn worker_label(i: usize) -> &'static str {
    static LABELS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let labels = LABELS.get_or_init(|| {
        (0..256)
            .map(|i| &*Box::leak(i.to_string().into_boxed_str()))
            .collect()
    });
    labels[i.min(labels.len() - 1)]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(&[Strategy::Default])
    }
}

impl Metrics {
    /// `strategies`: the proxy strategies, labels of `ready_backends`.
    pub fn new(strategies: &[Strategy]) -> Self {
        let mut x = Exact::default();
        let gauge = |x: &mut Exact, name: &str, help: &'static str| {
            let g = Gauge::default();
            x.add(name, help, g.clone());
            g
        };
        let counter = |x: &mut Exact, name: &str, help: &'static str| {
            let c = Counter::default();
            x.add(name, help, c.clone());
            c
        };
        let agents_connected = gauge(
            &mut x,
            "edgetunnel_agents_connected",
            "Agent connections registered.",
        );
        let open_connections = gauge(
            &mut x,
            "edgetunnel_open_connections",
            "Tunneled connections open.",
        );
        let pending_dials = gauge(
            &mut x,
            "edgetunnel_pending_dials",
            "Dials waiting for the agent's answer.",
        );
        let family = Family::<Label1, Counter>::default();
        let dials = DIAL_RESULTS.map(|r| family.get_or_create_owned(&[("result", r)]));
        x.add("edgetunnel_dials", "Dials by result.", family);
        let bytes = Family::<Label1, Counter>::default();
        let bytes_to_agent = bytes.get_or_create_owned(&[("direction", "to_agent")]);
        let bytes_from_agent = bytes.get_or_create_owned(&[("direction", "from_agent")]);
        x.add("edgetunnel_bytes", "Payload bytes relayed.", bytes);
        let frontend_errors = counter(
            &mut x,
            "edgetunnel_frontend_errors",
            "Frontend requests refused or broken.",
        );
        let agent_protocol_errors = counter(
            &mut x,
            "edgetunnel_agent_protocol_errors",
            "Agent connections closed for bad input.",
        );
        let refused = Family::<Label1, Counter>::default();
        let identity_refused = REASONS
            .iter()
            .map(|r| refused.get_or_create_owned(&[("reason", *r)]))
            .collect();
        x.add(
            "edgetunnel_agent_identity_refused",
            "Agent registrations refused because the client certificate does not name what the agent asked for.",
            refused,
        );
        let in_progress = gauge(
            &mut x,
            "edgetunnel_agent_handshakes",
            "Agent connections accepted and not yet authenticated (TLS, HTTP/2, first request, token review).",
        );
        let hr = Family::<Label1, Counter>::default();
        let hs = Family::<Label1, Counter>::default();
        let hc = Family::<Label1, Gauge>::default();
        let handshakes = engine::admission::AdmissionMetrics {
            in_progress,
            cap_total: hc.get_or_create_owned(&[("cap", "total")]),
            cap_per_ip: hc.get_or_create_owned(&[("cap", "per_ip")]),
            refused_total: hr.get_or_create_owned(&[("cap", "total")]),
            refused_per_ip: hr.get_or_create_owned(&[("cap", "per_ip")]),
            shed_total: hs.get_or_create_owned(&[("cap", "total")]),
            shed_per_ip: hs.get_or_create_owned(&[("cap", "per_ip")]),
        };
        x.add(
            "edgetunnel_agent_handshakes_cap",
            "The caps on agent connections in their handshake in force (--max-handshakes, by default sized from the descriptor limit; --max-handshakes-per-ip); 0: no cap. Reaching one sheds or refuses (edgetunnel_agent_handshakes_shed_total, _refused_total).",
            hc,
        );
        x.add(
            "edgetunnel_agent_handshakes_refused",
            "Agent connections closed at once because --max-handshakes or --max-handshakes-per-ip was reached and every handshake in the way had completed TLS.",
            hr,
        );
        x.add(
            "edgetunnel_agent_handshakes_shed",
            "Agent connections closed before completing TLS because a newcomer needed their slot (--max-handshakes or --max-handshakes-per-ip reached): the oldest of the same address, or of the address holding the most.",
            hs,
        );
        let dial_duration = Histogram::new(DIAL_BUCKETS);
        x.add(
            "edgetunnel_dial_duration_seconds",
            "Time from DIAL_REQ to a successful DIAL_RSP.",
            dial_duration.clone(),
        );

        // ANP server families, in the order of pkg/server/metrics/metrics.go.
        let anp_dial_duration = Histogram::new(ANP_SERVER_LATENCY_BUCKETS);
        x.add(
            format!("{ANP_SERVER}dial_duration_seconds"),
            "Latency of dial to the remote endpoint in seconds",
            anp_dial_duration.clone(),
        );
        let frontend_write_duration = Histogram::new(ANP_SERVER_LATENCY_BUCKETS);
        x.add(
            format!("{ANP_SERVER}frontend_write_duration_seconds"),
            "Latency of write to the frontend in seconds",
            frontend_write_duration.clone(),
        );
        let grpc = Family::<Label1, Gauge>::default();
        let grpc_proxy = grpc.get_or_create_owned(&[("service_method", "Proxy")]);
        let grpc_connect = grpc.get_or_create_owned(&[("service_method", "Connect")]);
        x.add(
            format!("{ANP_SERVER}grpc_connections"),
            "Number of current grpc connections, partitioned by service method.",
            grpc,
        );
        let http_connections = gauge(
            &mut x,
            &format!("{ANP_SERVER}http_connections"),
            "Number of current HTTP CONNECT connections",
        );
        let ready_backend_connections = gauge(
            &mut x,
            &format!("{ANP_SERVER}ready_backend_connections"),
            "Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends",
        );
        let rb = Family::<Label1, Gauge>::default();
        let ready_backends = strategies
            .iter()
            .map(|s| rb.get_or_create_owned(&[("proxy_strategy", strategy_name(s))]))
            .collect();
        x.add(
            format!("{ANP_SERVER}ready_backends"),
            "Number of konnectivity agent connected to the proxy server",
            rb,
        );
        let anp_pending = gauge(
            &mut x,
            &format!("{ANP_SERVER}pending_backend_dials"),
            "Current number of pending backend dial requests",
        );
        let anp_established = gauge(
            &mut x,
            &format!("{ANP_SERVER}established_connections"),
            "Current number of established end-to-end connections (post-dial).",
        );
        let frc = Family::<Label1, Gauge>::default();
        let full_receive_channels =
            ["Proxy", "Connect"].map(|m| frc.get_or_create_owned(&[("service_method", m)]));
        x.add(
            format!("{ANP_SERVER}full_receive_channels"),
            "Number of current connections blocked by a full receive channel, partitioned by service method.",
            frc,
        );
        let df = Family::<Label1, ExactCounter>::default();
        let dial_failures = DIAL_FAILURES.map(|r| df.get_or_create_owned(&[("reason", r)]));
        x.add_counter(
            format!("{ANP_SERVER}dial_failure_count"),
            "Number of dial failures observed. Multiple failures can occur for a single dial request.",
            df,
        );
        let streams = Streams::new(
            &mut x,
            ANP_SERVER,
            &[
                Segment::FromClient,
                Segment::ToClient,
                Segment::FromAgent,
                Segment::ToAgent,
            ],
        );
        let leases = LeaseMetrics::register(&mut x);
        let ar = Family::<Label1, Counter>::default();
        let agents_refused = grpc::code::REFUSALS
            .iter()
            .map(|(_, name)| *name)
            .chain(["Unknown"])
            .map(|name| ar.get_or_create_owned(&[("code", name)]))
            .collect();
        x.add(
            "edgetunnel_agents_refused",
            "Agent Connect requests refused, by gRPC status code (AlreadyExists: a secondary link on a worker already linked, retried by the agent).",
            ar,
        );
        let tr = Family::<Label1, Counter>::default();
        let review = |r: &'static str| tr.get_or_create_owned(&[("result", r)]);
        let token_reviews = ReviewCounters {
            accepted: review("accepted"),
            denied: review("denied"),
            failed: review("failed"),
            remembered: review("remembered"),
            joined: review("joined"),
            shed: review("shed"),
            abandoned: review("abandoned"),
        };
        x.add(
            "edgetunnel_token_reviews",
            "Agent Connects that needed a token verdict, by how they got it: a TokenReview that accepted, denied or failed, the verdict remembered (--token-review-cache-secs), joining a review of the same token under way, shed (the reviews waiting for their turn under --token-review-qps reach past the 15 s a Connect waits), or abandoned (every Connect waiting for it gave up, so it was not sent).",
            tr,
        );
        let agent_drains = counter(
            &mut x,
            "edgetunnel_agent_drains",
            "DRAIN packets received from agents (an agent shutting down: no new dials go to it).",
        );
        let kt = Family::<Label1, Counter>::default();
        let keepalive_timeouts =
            ["agent", "frontend"].map(|p| kt.get_or_create_owned(&[("peer", p)]));
        x.add(
            "edgetunnel_keepalive_timeouts",
            "Connections dropped because an HTTP/2 keepalive PING was not answered, by peer (agent: --keepalive-secs; frontend: a gRPC caller, --frontend-keepalive-secs).",
            kt,
        );
        let fl = Family::<Label1, Counter>::default();
        let frontend_h2_floods = [
            Flood::RapidReset,
            Flood::Continuation,
            Flood::ErrorResets,
            Flood::ControlFrames,
        ]
        .map(|k| fl.get_or_create_owned(&[("kind", k.label())]));
        x.add(
            "edgetunnel_frontend_h2_floods",
            "gRPC frontend connections ended with GOAWAY ENHANCE_YOUR_CALM for an HTTP/2 flood, by kind (rapid_reset: streams reset faster than served, CVE-2023-44487; continuation: a header block in too many CONTINUATION frames; error_resets: more than 1,024 streams reset for the caller's own errors, CVE-2025-8671; control_frames: more than 1,024 answers to its frames waiting for a caller that does not read).",
            fl,
        );
        let worker_links = Family::<Label1, Gauge>::default();
        x.add(
            "edgetunnel_worker_agent_links",
            "Agent connections (links) held by each server worker.",
            worker_links.clone(),
        );
        let worker_dials = Family::<Label1, Counter>::default();
        x.add(
            "edgetunnel_worker_dials",
            "Dials sent to agents by each server worker.",
            worker_dials.clone(),
        );
        let worker_bytes = Family::<Label2, Counter>::default();
        x.add(
            "edgetunnel_worker_bytes",
            "Payload bytes relayed through agent links by each server worker.",
            worker_bytes.clone(),
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
        Metrics {
            exposition: Exposition::new(x),
            frontend_write_duration,
            full_receive_channels,
            leases,
            agents_refused,
            agent_drains,
            token_reviews,
            keepalive_timeouts,
            frontend_h2_floods,
            worker_links,
            worker_dials,
            worker_bytes,
            link_tls,
            agents_connected,
            open_connections,
            pending_dials,
            dials,
            bytes_to_agent,
            bytes_from_agent,
            frontend_errors,
            agent_protocol_errors,
            identity_refused,
            dial_duration,
            handshakes,
            anp_dial_duration,
            grpc_proxy,
            grpc_connect,
            http_connections,
            ready_backend_connections,
            ready_backends,
            anp_pending,
            anp_established,
            dial_failures,
            streams,
        }
    }

    /// A dial ended: `edgetunnel_dials_total`, the latency histograms (on
    /// success) and ANP's `dial_failure_count`.
    pub fn dial_done(&self, result: DialResult, elapsed: Duration) {
        self.dials[result.index()].inc();
        match result.anp_reason() {
            None => {
                let secs = elapsed.as_secs_f64();
                self.dial_duration.observe(secs);
                self.anp_dial_duration.observe(secs);
            }
            Some(reason) => self.dial_failure(reason),
        }
    }

    /// ANP's `dial_failure_count{reason}` alone (failures edgetunnel does
    /// not count as a dial result: an unrecognized DIAL_RSP, an answer the
    /// frontend was gone for).
    pub fn dial_failure(&self, reason: DialFailure) {
        self.dial_failures[reason as usize].inc();
    }

    /// An agent refused by `--bind-agent-identity` for `reason` (one of
    /// [`REASONS`]).
    pub fn identity_refused(&self, reason: &str) {
        if let Some(i) = REASONS.iter().position(|r| *r == reason) {
            self.identity_refused[i].inc();
        }
    }

    /// An agent's Connect refused with gRPC status `code`.
    pub fn agent_refused(&self, code: u32) {
        let i = grpc::code::REFUSALS
            .iter()
            .position(|(c, _)| *c == code)
            .unwrap_or(grpc::code::REFUSALS.len());
        self.agents_refused[i].inc();
    }

    /// A connection dropped by its keepalive: `peer` is who went silent.
    pub fn keepalive_timeout(&self, peer: KeepalivePeer) {
        self.keepalive_timeouts[peer as usize].inc();
    }

    pub fn frontend_h2_flood(&self, kind: Flood) {
        self.frontend_h2_floods[kind as usize].inc();
    }

    pub fn dials(&self, result: DialResult) -> u64 {
        self.dials[result.index()].get()
    }

    /// An agent connection registered; `registered`: connections now in the
    /// registry.
    pub fn agent_connected(&self, registered: usize) {
        self.agents_connected.inc();
        self.grpc_connect.inc();
        self.set_backends(registered);
    }

    pub fn agent_disconnected(&self, registered: usize) {
        self.agents_connected.dec();
        self.grpc_connect.dec();
        self.set_backends(registered);
    }

    /// A link joined or left an agent that stays registered.
    pub fn links_changed(&self, registered: usize) {
        self.set_backends(registered);
    }

    /// The per-worker handles for a link on worker `core`.
    /// An agent link's TLS handshake completed as `t`.
    pub fn agent_link_tls(&self, t: LinkTls) {
        self.link_tls.inc(t);
    }

    pub fn worker(&self, core: usize) -> WorkerMetrics {
        let w = worker_label(core);
        WorkerMetrics {
            links: self.worker_links.get_or_create_owned(&[("worker", w)]),
            dials: self.worker_dials.get_or_create_owned(&[("worker", w)]),
            bytes_to_agent: self
                .worker_bytes
                .get_or_create_owned(&[("worker", w), ("direction", "to_agent")]),
            bytes_from_agent: self
                .worker_bytes
                .get_or_create_owned(&[("worker", w), ("direction", "from_agent")]),
        }
    }

    fn set_backends(&self, n: usize) {
        self.ready_backend_connections.set(n as i64);
        for g in &self.ready_backends {
            g.set(n as i64);
        }
    }

    /// Changes of the open connections (post-dial) gauge.
    pub fn open_delta(&self, d: i64) {
        if d != 0 {
            self.open_connections.inc_by(d);
            self.anp_established.inc_by(d);
        }
    }

    /// Changes of the pending dials gauge.
    pub fn pending_delta(&self, d: i64) {
        if d != 0 {
            self.pending_dials.inc_by(d);
            self.anp_pending.inc_by(d);
        }
    }

    /// Held while an HTTP CONNECT connection is served.
    pub fn http_connection(&self) -> GaugeGuard {
        GaugeGuard::new(&self.http_connections)
    }

    /// Callers still being served: CONNECT connections (pending or
    /// tunneled), gRPC proxy streams, and tunnels and dials of any
    /// frontend. A draining server exits when this reaches 0.
    pub fn in_flight(&self) -> i64 {
        self.http_connections.get()
            + self.grpc_proxy.get()
            + self.open_connections.get()
            + self.pending_dials.get()
    }

    /// Callers of the CONNECT and gRPC frontends being served: CONNECT
    /// connections (pending or tunneled) and gRPC proxy streams.
    pub fn own_callers(&self) -> i64 {
        self.http_connections.get() + self.grpc_proxy.get()
    }

    /// Held while a gRPC `ProxyService/Proxy` stream is served.
    pub fn proxy_stream(&self) -> GaugeGuard {
        GaugeGuard::new(&self.grpc_proxy)
    }

    /// One packet on a gRPC stream.
    #[inline]
    pub fn packet(&self, segment: Segment, packet_type: PacketType) {
        self.streams.packet(segment, packet_type);
    }

    pub fn stream_error(&self, segment: Segment, code: &'static str, packet_type: &'static str) {
        self.streams.error(segment, code, packet_type);
    }

    pub fn packets(&self, segment: Segment, packet_type: PacketType) -> u64 {
        self.streams.packets(segment, packet_type)
    }

    /// A packet written to a gRPC frontend's stream took `elapsed` (until
    /// the stream took it, waiting for flow-control credit): ANP's
    /// `frontend_write_duration_seconds` (Go's `ProxyClientConnection.send`
    /// also times CONNECT writes; edgetunnel's CONNECT tunnels relay bytes,
    /// not packets, and are not timed).
    pub fn frontend_write(&self, elapsed: Duration) {
        self.frontend_write_duration.observe(elapsed.as_secs_f64());
    }

    /// Held while a stream's reading waits because what it read cannot be
    /// handed on (ANP's `full_receive_channels`): a Proxy stream whose
    /// client payload waits for the agent's queue or window, an agent's
    /// Connect stream whose payload waits for a frontend's memory budget.
    pub fn full_receive_channel(&self, method: ServiceMethod) -> GaugeGuard {
        GaugeGuard::new(&self.full_receive_channels[method as usize])
    }

    /// The Prometheus text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        self.exposition.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.dial_done(DialResult::Success, Duration::from_millis(3));
        m.dial_done(DialResult::NoAgent, Duration::ZERO);
        let text = m.render();
        assert!(text.contains("edgetunnel_dial_duration_seconds_bucket{le=\"0.0025\"} 0"));
        assert!(text.contains("edgetunnel_dial_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("edgetunnel_dial_duration_seconds_bucket{le=\"+Inf\"} 1"));
        assert!(text.contains("edgetunnel_dials_total{result=\"no_agent\"} 1"));
    }

    fn sample(text: &str, sample: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|r| r.strip_prefix(' ')))
            .map(|v| v.trim().parse().unwrap())
    }

    #[test]
    fn edgetunnel_families_keep_their_names() {
        let m = Metrics::default();
        m.agent_connected(1);
        m.open_delta(2);
        m.pending_delta(1);
        m.bytes_to_agent.inc_by(10);
        m.frontend_errors.inc();
        m.agent_protocol_errors.inc();
        m.dial_done(DialResult::FrontendClose, Duration::ZERO);
        m.dial_done(DialResult::BackendClose, Duration::ZERO);
        m.agent_refused(grpc::code::PERMISSION_DENIED);
        m.agent_refused(grpc::code::ALREADY_EXISTS);
        m.agent_refused(grpc::code::ALREADY_EXISTS);
        m.agent_refused(grpc::code::INTERNAL);
        m.agent_drains.inc();
        m.keepalive_timeout(KeepalivePeer::Frontend);
        m.frontend_h2_flood(Flood::Continuation);
        let t = m.render();
        for (s, v) in [
            (
                "edgetunnel_agents_refused_total{code=\"PermissionDenied\"}",
                1.0,
            ),
            (
                "edgetunnel_agents_refused_total{code=\"AlreadyExists\"}",
                2.0,
            ),
            (
                "edgetunnel_agents_refused_total{code=\"Unauthenticated\"}",
                0.0,
            ),
            ("edgetunnel_agents_refused_total{code=\"Unknown\"}", 1.0),
            ("edgetunnel_agent_drains_total", 1.0),
            ("edgetunnel_keepalive_timeouts_total{peer=\"agent\"}", 0.0),
            (
                "edgetunnel_keepalive_timeouts_total{peer=\"frontend\"}",
                1.0,
            ),
            (
                "edgetunnel_frontend_h2_floods_total{kind=\"rapid_reset\"}",
                0.0,
            ),
            (
                "edgetunnel_frontend_h2_floods_total{kind=\"continuation\"}",
                1.0,
            ),
            ("edgetunnel_agents_connected", 1.0),
            ("edgetunnel_open_connections", 2.0),
            ("edgetunnel_pending_dials", 1.0),
            ("edgetunnel_dials_total{result=\"success\"}", 0.0),
            ("edgetunnel_dials_total{result=\"failure\"}", 1.0),
            ("edgetunnel_dials_total{result=\"timeout\"}", 1.0),
            ("edgetunnel_bytes_total{direction=\"to_agent\"}", 10.0),
            ("edgetunnel_bytes_total{direction=\"from_agent\"}", 0.0),
            ("edgetunnel_frontend_errors_total", 1.0),
            ("edgetunnel_agent_protocol_errors_total", 1.0),
            ("edgetunnel_dial_duration_seconds_count", 0.0),
        ] {
            assert_eq!(sample(&t, s), Some(v), "{s} in\n{t}");
        }
        assert!(t.contains("# HELP edgetunnel_agents_connected Agent connections registered.\n"));
        assert!(t.contains("# TYPE edgetunnel_dials_total counter\n"));
        assert!(!t.contains("# EOF"));
    }

    #[test]
    fn anp_server_families() {
        let m = Metrics::new(&[Strategy::DestHost, Strategy::Default]);
        m.agent_connected(1);
        m.open_delta(1);
        m.open_delta(-1);
        let _http = m.http_connection();
        {
            let _p = m.proxy_stream();
        }
        m.dial_done(DialResult::Success, Duration::from_millis(3));
        m.dial_done(DialResult::Failure, Duration::ZERO);
        m.dial_done(DialResult::Timeout, Duration::ZERO);
        m.dial_failure(DialFailure::UnrecognizedResponse);
        m.packet(Segment::FromAgent, PacketType::DialRsp);
        m.packet(
            Segment::ToAgent,
            encoded_packet_type(&[0, 0, 0, 0, 3, 0x12, 1, 2]),
        );
        m.stream_error(Segment::FromAgent, "Unknown", "Unknown");
        let t = m.render();
        let p = ANP_SERVER;
        for (s, v) in [
            (format!("{p}ready_backend_connections"), 1.0),
            (format!("{p}ready_backends{{proxy_strategy=\"destHost\"}}"), 1.0),
            (format!("{p}ready_backends{{proxy_strategy=\"default\"}}"), 1.0),
            (format!("{p}grpc_connections{{service_method=\"Connect\"}}"), 1.0),
            (format!("{p}grpc_connections{{service_method=\"Proxy\"}}"), 0.0),
            (format!("{p}http_connections"), 1.0),
            (format!("{p}established_connections"), 0.0),
            (format!("{p}pending_backend_dials"), 0.0),
            (format!("{p}dial_failure_count{{reason=\"error_response\"}}"), 1.0),
            (format!("{p}dial_failure_count{{reason=\"backend_dial_timeout\"}}"), 1.0),
            (format!("{p}dial_failure_count{{reason=\"unrecognized_response\"}}"), 1.0),
            (format!("{p}dial_failure_count{{reason=\"no_agent\"}}"), 0.0),
            (format!("{p}dial_duration_seconds_bucket{{le=\"0.0001\"}}"), 0.0),
            (format!("{p}dial_duration_seconds_bucket{{le=\"0.005\"}}"), 1.0),
            (format!("{p}dial_duration_seconds_bucket{{le=\"1e-06\"}}"), 0.0),
            (format!("{p}dial_duration_seconds_bucket{{le=\"12.5\"}}"), 1.0),
            (format!("{p}dial_duration_seconds_bucket{{le=\"+Inf\"}}"), 1.0),
            (format!("{p}dial_duration_seconds_count"), 1.0),
            (
                format!("{p}stream_packets_total{{segment=\"from_agent\",packet_type=\"DIAL_RSP\"}}"),
                1.0,
            ),
            (
                format!("{p}stream_packets_total{{segment=\"to_agent\",packet_type=\"DIAL_REQ\"}}"),
                1.0,
            ),
            (
                format!("{p}stream_errors_total{{segment=\"from_agent\",code=\"Unknown\",packet_type=\"Unknown\"}}"),
                1.0,
            ),
        ] {
            assert_eq!(sample(&t, &s), Some(v), "{s} in\n{t}");
        }
        assert!(t.contains(&format!(
            "# HELP {p}dial_duration_seconds Latency of dial to the remote endpoint in seconds\n# TYPE {p}dial_duration_seconds histogram\n"
        )));
        assert!(t.contains(&format!("# TYPE {p}dial_failure_count counter\n")));
        assert!(t.contains(&format!(
            "# HELP {p}stream_packets_total Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)\n"
        )));
        assert_eq!(
            t.matches(&format!("{p}dial_duration_seconds_bucket"))
                .count(),
            10
        );
    }

    #[test]
    fn encoded_type_reads_the_packet_type() {
        use protocol::anp::packet;
        for f in [
            packet::dial_request("tcp", "a:1", 7),
            packet::dial_response(7, 1, ""),
            packet::close_request(7),
            packet::close_response(7, ""),
            packet::dial_close(7),
            Frame::Drain,
        ] {
            let want = packet_type(&f);
            assert_eq!(encoded_packet_type(&packet::encode(f).head), want);
        }
        let d = packet::encode_data(3, bytes::Bytes::from_static(b"x"));
        assert_eq!(encoded_packet_type(&d.head), PacketType::Data);
        // A number past the known types, or no type field: DIAL_REQ.
        assert_eq!(
            encoded_packet_type(&[0, 0, 0, 0, 2, 0x08, 7]),
            PacketType::DialReq
        );
        assert_eq!(encoded_packet_type(&[0, 0, 0, 0]), PacketType::DialReq);
    }

    /// Counters are indexed by the enum's number: every type counts in
    /// its own cell, and the enum's order is the wire's.
    #[test]
    fn packet_types_count_in_their_own_cells() {
        for (i, t) in ALL_PACKET_TYPES.into_iter().enumerate() {
            assert_eq!(t as usize, i);
        }
        let m = Metrics::new(&[Strategy::Default]);
        m.packet(Segment::ToAgent, PacketType::Data);
        m.packet(Segment::ToAgent, PacketType::Data);
        m.packet(Segment::ToAgent, PacketType::Drain);
        assert_eq!(m.packets(Segment::ToAgent, PacketType::Drain), 1);
        assert_eq!(m.packets(Segment::ToAgent, PacketType::Data), 2);
    }
}
