# edgetunnel image: one static-ish binary plus the names the Go images use,
# so manifests written for ANP's proxy-server/proxy-agent and OpenYurt's
# yurt-tunnel-server/-agent run unchanged (`command: ["/proxy-server"]`,
# `command: ["yurt-tunnel-agent"]`).
#
#   docker build -t edgetunnel:0.1.0 .
#
# The tag is the crate version: deploy/ pins it (tests/deploy_manifests.rs
# checks they agree). The manifests run it as uid 65532 where the role
# allows; the image itself needs no user.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin edgetunnel \
    && strip target/release/edgetunnel

FROM debian:bookworm-slim
# iptables and conntrack: yurt-tunnel's DNAT rules (server with --iptables).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates iptables conntrack \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/edgetunnel /usr/local/bin/edgetunnel
# The Go binaries' names: the program name selects the flag set.
RUN for n in proxy-server proxy-agent yurt-tunnel-server yurt-tunnel-agent; do \
        ln -s /usr/local/bin/edgetunnel "/$n"; \
        ln -s /usr/local/bin/edgetunnel "/usr/local/bin/$n"; \
    done
ENTRYPOINT ["/usr/local/bin/edgetunnel"]
