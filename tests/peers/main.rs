//! The real peers, nobody here wrote them: ANP's Go `proxy-server` and
//! `proxy-agent` (v0.36.0), `anptool` (a driver linked against ANP's own
//! konnectivity-client and grpc-go), h2spec and kube-apiserver. They come
//! prebuilt from `EDGETUNNEL_PEERS` (scripts/test points it at
//! `../shared/peers` when that exists); without them every test here
//! prints `skipped: no real peers (set EDGETUNNEL_PEERS)` and passes.
//!
//! Every case checks the bytes (sha256, by anptool) and the cleanup
//! (`edgetunnel_open_connections` back to 0, no connection left open at
//! the target). The heavy cases take [`common::serial`] so that two of
//! them never share this 2-core machine's CPU at once.

#[path = "../support/mod.rs"]
mod support;

mod busy_server;
mod common;
mod deploy_layouts;
mod deploy_path;
mod go_agent;
mod go_server;
mod h2_conformance;
mod handover;
mod konnectivity_client;
mod kube_apiserver;
mod kube_cluster;
mod kube_handover;
mod kubelet;
mod metrics_scrape;
mod node_image;
mod real_node;
mod rollout;
mod spdy;
mod tls_frontends;
mod yurt_dnat;
