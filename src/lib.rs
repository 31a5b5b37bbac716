//! edgetunnel: a thread-per-core io_uring edge tunnel, wire-compatible with
//! apiserver-network-proxy (konnectivity) and yurt-tunnel, and a drop-in
//! `kubectl proxy`.
//!
//! Layering (each layer uses only the ones above it):
//! - [`protocol`]: sans-I/O codecs, parsers, state machines and policies
//!   (Packets, HTTP CONNECT, HTTP/1 heads, routing, identities, Go flag
//!   syntax, kubectl proxy's Go rules). No I/O, no runtime; every parser
//!   has a fuzz target. It is a crate of its own (`crates/protocol`,
//!   `edgetunnel-protocol`), so it cannot reach into this one, and it may
//!   depend only on pure libraries: no monoio, tokio, rustls, h2 or kube
//!   (`tests/protocol_deps.rs`). The fuzz targets build against it alone.
//! - [`engine`]: data-plane runtime glue: one monoio runtime per core,
//!   SO_REUSEPORT listeners and the accept loop, TLS, HTTP/2 adapters,
//!   relays and cross-core socket handoff. `engine::sys` holds the crate's
//!   only `unsafe` code.
//! - [`control`]: the control thread (tokio, kube): certificates, iptables,
//!   DNS records, leases, TokenReviews; it never runs on a data-plane core.
//! - [`metrics`], [`certs`], [`admin`], [`logging`]: shared services of the roles.
//! - The roles: [`server`], [`agent`] and [`proxy`] (`kubectl proxy`); the
//!   server and agent flatten the flag groups of [`flags`].
//! - The faces on top: [`cli`] assembles the subcommands from the roles'
//!   flags; [`compat`] translates the Go binaries' command lines (ANP,
//!   yurt-tunnel) into them. No role imports either (see ARCHITECTURE.md).

/// The error type of runtime glue that only reports (never matches) errors.
pub use edgetunnel_engine::BoxError;

pub mod agent;
pub mod certs;
pub mod cli;
pub mod compat;
pub mod control;
pub mod flags;
pub mod metrics;
pub mod proxy;

/// The sans-I/O protocol layer, a crate of its own (`crates/protocol`), so
/// that it can use nothing of this one nor its runtime, TLS or Kubernetes
/// dependencies. Re-exported here so `crate::protocol::...` paths read as
/// before.
pub use edgetunnel_protocol as protocol;
pub mod server;

/// The data-plane runtime, a crate of its own (`crates/engine`,
/// `edgetunnel-engine`) that names no role. Re-exported here, with the
/// shared services it holds, so `crate::engine::...`, `crate::admin`,
/// `crate::logging` and `crate::readiness` paths read as before.
pub use edgetunnel_engine as engine;
pub use edgetunnel_engine::{admin, logging, readiness};
