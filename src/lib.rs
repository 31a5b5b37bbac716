//! edgetunnel: a thread-per-core io_uring edge tunnel, wire-compatible with
//! apiserver-network-proxy (konnectivity) and yurt-tunnel.
//!
//! Layout: [`protocol`] is sans-I/O (codecs, state machines, routing);
//! `engine` is the data-plane runtime glue (workers, listeners, TLS, HTTP/2,
//! relays); the roles (`server`, `agent`) are built from those two.

pub mod admin;
pub mod agent;
pub mod certs;
pub mod cli;
pub mod compat;
pub mod control;
pub mod engine;
pub mod metrics;
pub mod protocol;
pub mod proxy;
pub mod server;
