//! The data-plane engine (`edgetunnel-engine`): runtime glue between the
//! sans-I/O protocol (`edgetunnel-protocol`) and the kernel. Workers (one
//! monoio runtime per core), SO_REUSEPORT listeners and the accept loop
//! they all run, TLS and HTTP/2 adapters (and HTTP/2 keepalive), the
//! socket relay and cross-core socket handoff.
//!
//! Beside them, the services every product shares: the admin listener
//! ([`admin`]), readiness lines ([`readiness`]), the log thread
//! ([`logging`]) and the Prometheus text exposition ([`exposition`]).
//!
//! Nothing here blocks a core: file and Kubernetes work belongs to the
//! control thread, never to these tasks. This crate names no role (tunnel
//! server, agent, `kubectl proxy`): the roles depend on it, never the
//! other way (`tests/crate_deps.rs`). [`sys`] holds its only `unsafe`.

/// The error type of runtime glue that only reports (never matches) errors.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

// `protocol::...` paths, as in the roles.

pub mod abort;
pub mod accept;
pub mod admin;
pub mod admission;
pub mod budget;
pub mod cert_reload;
pub mod deadline;
pub mod exposition;
pub mod fd_ref;
pub mod grpc;
pub mod h2_conn;
pub mod h2_keepalive;
pub mod handover;
pub mod head_reader;
pub mod heap;
pub mod link_window;
pub mod listener;
pub mod logging;
pub mod memory;
pub mod read_ahead;
pub mod readiness;
pub mod relay;
pub mod runtime;
pub mod sharded_count;
pub mod signals;
#[allow(unsafe_code)]
pub mod sys;
pub mod takeover;
pub mod thread_buf;
pub mod tls;
pub mod tls_copy;
pub mod tls_records;
pub mod tunnel_relay;
pub mod window;

/// `AsyncWrite` for a read-side wrapper (a struct with an `inner` stream)
/// whose writes pass straight through to `inner`.
macro_rules! forward_async_write {
    ($wrapper:ident) => {
        impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<T> {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
            }
        }
    };
}
use forward_async_write;
