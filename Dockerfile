# edgetunnel image: one binary plus the names the Go images use, so
# manifests written for ANP's proxy-server/proxy-agent and OpenYurt's
# yurt-tunnel-server/-agent run unchanged (`command: ["/proxy-server"]`,
# `command: ["yurt-tunnel-agent"]`). Built for amd64, arm64 and 32-bit ARM
# (armv7) edge nodes; the manifests name no architecture:
#
#   docker buildx build --platform linux/amd64,linux/arm64,linux/arm/v7 -t edgetunnel:0.1.0 .
#   docker build -t edgetunnel:0.1.0 .        # this machine's architecture
#
# The build stage runs on the build machine's platform and cross-compiles
# for TARGETARCH (scripts/image-build: Debian's cross toolchain and the Rust
# target; no emulation). The tag is the crate version: deploy/ pins it
# (tests/deploy_manifests.rs checks they agree, and that scripts/image-build
# makes each architecture's binary).
FROM --platform=$BUILDPLATFORM rust:1-bookworm AS build
ARG TARGETARCH
WORKDIR /src
COPY . .
RUN scripts/image-build "${TARGETARCH:-amd64}" /out/edgetunnel

FROM debian:bookworm-slim
# iptables and conntrack: yurt-tunnel's DNAT rules (server with --iptables);
# chown: the manifests' init containers that hand a host directory to the
# non-root user.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates iptables conntrack \
    && rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man
COPY --from=build /out/edgetunnel /usr/local/bin/edgetunnel
# The Go binaries' names: the program name selects the flag set.
RUN for n in proxy-server proxy-agent yurt-tunnel-server yurt-tunnel-agent; do \
        ln -s /usr/local/bin/edgetunnel "/$n"; \
        ln -s /usr/local/bin/edgetunnel "/usr/local/bin/$n"; \
    done
# Non-root by default (the manifests' uid); roles that need root (the
# iptables rules, the init containers' chown) say so in their manifest.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/edgetunnel"]
