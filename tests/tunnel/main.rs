//! The tunnel (`edgetunnel server` and `edgetunnel agent`, ANP/yurt
//! compatible) end to end, over real sockets and TLS: one test binary for
//! the product, one module per concern. Suites whose bounds are about time
//! or load on 2 cores (grpc_frontend, grpc_frontend_hostile,
//! handshake_flood, hostile_neighbours, memory_policy) keep binaries of
//! their own so that they never share the machine with these.

#[path = "../support/mod.rs"]
mod support;

mod abnormal_ends;
mod agent_auth;
mod agent_identity;
mod agent_links;
mod agent_policy;
mod anp_metrics;
mod bad_input;
mod cert_reload;
mod e2e;
mod frontend_tls;
mod graceful_shutdown;
mod grpc_authority;
mod handover;
mod interception;
mod listener_safety;
mod reconnect;
mod server_leases;
mod tls_flush;
mod tls_records;
