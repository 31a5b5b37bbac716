//! edgetunnel's protocol layer, sans-I/O, one folder per product or origin:
//! the tunnel's wire and state machines ([`anp`]: gRPC framing, ANP
//! Packets, the HTTP CONNECT head, agent identifiers and their binding to
//! client certificates, routing, the per-connection state machines), our
//! HTTP/2 server connection ([`h2_server`]), HTTP/1.x heads, bodies and
//! exchanges ([`http1`]), ports of Go library behaviour ([`go`]) and
//! `kubectl proxy`'s Go behaviour ([`kubectl`]).
//!
//! Nothing here touches a socket, a runtime or a file: every type takes
//! bytes or events in and gives bytes or actions out, so it runs in unit
//! tests and fuzz targets as is (the one clock read is the `Date` header of
//! [`kubectl::forward`]). This is its own crate (`edgetunnel-protocol`,
//! named `protocol` by the crates that use it) so that the rule
//! is the compiler's: it cannot use the main crate, and its manifest lists
//! only pure libraries. No monoio, tokio, rustls, h2, hyper or kube, not
//! even indirectly (`tests/protocol_deps.rs` in the root package checks
//! `cargo tree`); the fuzz targets depend on this crate alone.

pub mod anp;
pub mod go;
pub mod h2_server;
pub mod handover;
pub mod http1;
pub mod kubectl;
pub mod spare;
pub mod tls_record;

/// gRPC method of the agent connection.
pub const AGENT_CONNECT_PATH: &str = "/AgentService/Connect";
/// gRPC method of the konnectivity-client frontend.
pub const PROXY_PATH: &str = "/ProxyService/Proxy";

/// Metadata keys (HTTP/2 header names are lower case on the wire).
pub const AGENT_ID_HEADER: &str = "agentid";
pub const AGENT_IDENTIFIERS_HEADER: &str = "agentidentifiers";
pub const SERVER_ID_HEADER: &str = "serverid";
pub const SERVER_COUNT_HEADER: &str = "servercount";
/// edgetunnel extension: features both ends support (`half-close`,
/// `window`, `window-growth`), comma-separated.
pub const FEATURES_HEADER: &str = "x-edgetunnel-features";
pub const FEATURE_HALF_CLOSE: &str = "half-close";
/// Per-connection flow control (see `engine::window`).
pub const FEATURE_WINDOW: &str = "window";
/// Per-connection windows that grow with the path (see `engine::window`):
/// a window update may acknowledge more than was sent.
pub const FEATURE_WINDOW_GROWTH: &str = "window-growth";

/// Why a dial found no agent (as ANP words it; the CONNECT body and the
/// gRPC DIAL_RSP error).
pub const NO_TUNNEL: &str = "currently no tunnels available: No agent available";

/// Agents tried for one dial whose agent connections end before answering.
pub const ROUTE_ATTEMPTS: u8 = 3;

/// Whether a features header value lists `feature`.
pub fn has_feature(header: Option<&str>, feature: &str) -> bool {
    header.is_some_and(|v| v.split(',').any(|f| f.trim() == feature))
}

/// Our features header value.
pub fn our_features() -> String {
    format!("{FEATURE_HALF_CLOSE},{FEATURE_WINDOW},{FEATURE_WINDOW_GROWTH}")
}
