//! The control plane and what ships around it: the Kubernetes controllers
//! (leases, CSRs, DNS records, iptables in a network namespace), the
//! `certs` command, the manifests in deploy/, the monitoring rules and the
//! seccomp profile.

#[path = "../support/mod.rs"]
mod support;

mod certs_cli;
mod deploy_manifests;
mod dns_records;
mod iptables_netns;
mod kube_control;
mod monitoring;
mod seccomp_profile;
