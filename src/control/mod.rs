//! The control plane: everything that is not moving bytes. It runs on its
//! own thread with its own tokio runtime (the `kube` client lives here) and
//! hands new state to the data plane through shared values the cores read
//! briefly, or answers their requests on oneshot channels, so it never
//! blocks a data-plane core. It owns:
//! - iptables rules (`iptables` plans them, `iptables_sync` applies them),
//!   DNAT of kubelet ports towards the interception listeners;
//! - DNS records for CoreDNS (`dns`: a hosts file and/or a ConfigMap),
//!   written by the one server elected with a Lease (`lease`), and yurt's
//!   `dnat-PORT` ports on the tunnel Service (`dnat_ports`);
//! - the cluster view (`kube_sync`, `nodes`: edge and cloud nodes, extra
//!   ports from yurt-tunnel's ConfigMap);
//! - certificates from Kubernetes CSRs with renewal (`csr`);
//! - ANP's server leases (`server_lease` publishes, `lease_count` counts);
//! - agent token checks by TokenReview (`token_review`);
//! - the agent's server address from yurt-tunnel's Service (`tunnel_addr`).
//!
//! `manager` starts it all from one spec per role.

pub mod csr;
pub mod dnat_ports;
pub mod dns;
pub mod iptables;
pub mod iptables_sync;
pub mod kube_sync;
pub mod lease;
pub mod lease_count;
pub mod manager;
pub mod nodes;
pub mod review_cache;
pub mod server_lease;
pub mod token_review;
pub mod tunnel_addr;
