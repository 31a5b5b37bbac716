//! `kubectl proxy`'s Go behaviour, sans-I/O: what `edgetunnel proxy` must
//! decide exactly as the Go program does (on top of the Go ports in
//! [`crate::go`]): the request filter ([`filter`]), `http.ServeMux` routing ([`mux`]), kubectl's command line
//! ([`go_args`]), the head rewrite of `httputil.ReverseProxy` and Go's
//! server ([`forward`]) and the header logic of `http.FileServer`
//! ([`static_files`]), the choice of an HTTP/2 upstream connection
//! ([`h2_pool`]), when a failed request may go again ([`retry`]) and the
//! connection toward the API server as client-go makes it ([`upstream`]).
//! The kubectl proxy crate (`crates/kubectl-proxy`) does the I/O and
//! re-exports these under their old names (`goregex`, `gourl`, ...).

pub mod filter;
pub mod forward;
pub mod go_args;
pub mod h2_pool;
pub mod mux;
pub mod retry;
pub mod static_files;
pub mod upstream;
