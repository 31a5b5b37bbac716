//! edgetunnel: a thread-per-core io_uring edge tunnel, wire-compatible with
//! apiserver-network-proxy (konnectivity) and yurt-tunnel. This crate (the
//! root package) holds the tunnel's roles, its control thread and the
//! command-line faces; the `edgetunnel` binary (`src/main.rs`) also mounts
//! the drop-in `kubectl proxy` from its own crate (`crates/kubectl-proxy`,
//! `edgetunnel-kubectl-proxy`), which uses nothing of this one.
//!
//! Layering (each layer uses only the ones below it):
//! - [`protocol`]: sans-I/O codecs, parsers, state machines and policies
//!   (Packets, HTTP CONNECT, HTTP/1 heads, routing, identities, Go flag
//!   syntax, kubectl proxy's Go rules). No I/O, no runtime; every parser
//!   has a fuzz target. It is a crate of its own (`crates/protocol`,
//!   `edgetunnel-protocol`), so it cannot reach into this one, and it may
//!   depend only on pure libraries: no monoio, tokio, rustls, h2 or kube
//!   (`tests/protocol_deps.rs`). The fuzz targets build against it alone.
//! - [`engine`]: data-plane runtime glue: one monoio runtime per core,
//!   SO_REUSEPORT listeners and the accept loop, TLS, HTTP/2 adapters,
//!   relays and cross-core socket handoff, and the services every product
//!   shares ([`admin`], [`readiness`], [`logging`], the metrics text in
//!   `engine::exposition`). A crate of its own (`crates/engine`,
//!   `edgetunnel-engine`) that names no role (`tests/crate_deps.rs`);
//!   `engine::sys` holds the workspace's only `unsafe` code.
//! - [`control`]: the control thread (tokio, kube): certificates, iptables,
//!   DNS records, leases, TokenReviews; it never runs on a data-plane core.
//! - [`metrics`] (the server's and agent's families), [`certs`]: shared
//!   services of the tunnel roles.
//! - The roles: [`server`] and [`agent`]; they flatten the flag groups of
//!   [`flags`].
//! - The faces on top: [`cli`] assembles the subcommands from the roles'
//!   flags (and the kubectl proxy crate's); [`compat`] translates the Go
//!   binaries' command lines (ANP, yurt-tunnel) into them. No role imports
//!   either (see ARCHITECTURE.md).

/// The error type of runtime glue that only reports (never matches) errors.
pub use engine::BoxError;

pub mod agent;
pub mod certs;
pub mod cli;
pub mod compat;
pub mod control;
pub mod flags;
pub mod metrics;

pub mod server;

/// The shared services the data-plane runtime (`crates/engine`) holds, so
/// that `crate::admin`, `crate::logging` and `crate::readiness` read as
/// the roles' own.
pub use engine::{admin, logging, readiness};
