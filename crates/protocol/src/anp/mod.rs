//! The tunnel (ANP/konnectivity and yurt-tunnel): its wire ([`grpc_frame`],
//! [`packet`], [`pb`]), the server's side of an agent connection
//! ([`server_tunnel`]), a konnectivity-client's gRPC `ProxyService/Proxy`
//! stream ([`proxy_service_stream`]) and HTTP CONNECT request
//! ([`http_connect`]), the choice of an agent ([`routing`]), what an agent
//! is ([`agent_identifiers`], [`agent_identity`], [`agent_links`]), and the
//! agent's side ([`agent_tunnel`], [`agent_dest_policy`]).

pub mod agent_dest_policy;
pub mod agent_identifiers;
pub mod agent_identity;
pub mod agent_links;
pub mod agent_tunnel;
pub mod grpc_frame;
pub mod http_connect;
pub mod packet;
pub mod packet_decoder;
pub mod proxy_service_stream;
pub mod routing;
pub mod server_tunnel;
mod small_map;
pub mod window_tuning;

/// Protobuf types generated from `proto/` (see `tests/codegen.rs`).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!("pb.rs");
}
