//! `kubectl proxy`'s side toward the API server as client-go builds it from
//! a kubeconfig: exec credential plugins ([`exec_credential`]), the `oidc`
//! auth-provider ([`oidc`]), impersonation headers ([`impersonation`]), the
//! proxy a connection goes through ([`proxy_url`]) and that proxy's CONNECT
//! or SOCKS5 handshake ([`proxy_handshake`]).

pub mod exec_credential;
pub mod impersonation;
pub mod oidc;
pub mod proxy_handshake;
pub mod proxy_url;
