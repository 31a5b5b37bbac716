//! Ports of Go library behaviour that callers can tell apart from Rust's:
//! spf13/pflag command lines ([`pflag`], the Go faces of the tunnel and
//! `kubectl proxy`'s flags), `regexp` ([`regexp`]), `net/url` and `path`
//! rules ([`url`]), `net/url`'s percent-escapes ([`percent`]) and `net`'s
//! `JoinHostPort` ([`net`]). Each
//! names the Go file and function behind what it does.

pub mod net;
pub mod percent;
pub mod pflag;
pub mod regexp;
pub mod url;
