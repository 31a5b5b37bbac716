//! The `kubectl proxy` drop-in (`edgetunnel proxy`): its own behaviour
//! (`proxy`) and, in the `proxy_diff*` modules, the same requests answered
//! by the real `kubectl proxy` and by ours, compared.

#[path = "../support/mod.rs"]
mod support;

mod proxy;
mod proxy_diff;
mod proxy_diff_auth;
mod proxy_diff_auth_provider;
mod proxy_diff_exec_cert;
mod proxy_diff_goflags;
mod proxy_diff_hangup;
mod proxy_diff_http;
mod proxy_diff_klog;
mod proxy_diff_oidc;
mod proxy_diff_sniff;
mod proxy_diff_static;
mod proxy_diff_upstream_proxy;
