//! The data-plane engine: runtime glue between the sans-I/O protocol and the
//! kernel. Workers (one monoio runtime per core), SO_REUSEPORT listeners,
//! TLS and HTTP/2 adapters, the socket relay and cross-core socket handoff.
//!
//! Nothing here blocks a core: file and Kubernetes work belongs to the
//! control thread, never to these tasks.

pub mod budget;
pub mod cert_reload;
pub mod grpc;
pub mod h2_server_io;
pub mod listener;
pub mod read_ahead;
pub mod relay;
pub mod runtime;
pub mod signals;
pub mod tls;
pub mod window;
