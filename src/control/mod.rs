//! The control plane: everything that is not moving bytes (iptables rules
//! now; DNS records and certificates next). It runs on its own thread with
//! its own tokio runtime and talks to the data plane only through shared
//! state it reads briefly, so it never blocks a data-plane core.

pub mod csr;
pub mod dns;
pub mod iptables;
pub mod iptables_sync;
pub mod kube_sync;
pub mod lease;
pub mod lease_count;
pub mod manager;
pub mod nodes;
pub mod server_lease;
pub mod token_review;
