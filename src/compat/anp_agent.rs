//! ANP's `proxy-agent` flags (`cmd/agent/app/options/options.go`) as
//! `edgetunnel agent` flags.
//!
//! - `--proxy-server-host:--proxy-server-port` -> `--server-addr`; the TLS
//!   name checked is the host, as Go's `GetClientTLSConfig` sets it.
//! - `--agent-cert`/`--agent-key`/`--ca-cert` -> `--cert`/`--key`/`--ca`.
//!   Without `--agent-cert` the agent presents no certificate and proves
//!   itself with `--service-account-token-path` alone (the server's
//!   `--agent-namespace` token review), as in Go; with neither it would
//!   have no credentials at all, which is refused.
//! - `--service-account-token-path` -> `--token-file` (sent as `Bearer`,
//!   as ANP sends it; read again at every connect).
//! - `--agent-id` (else `PROXY_AGENT_ID`, else a UUID, as Go),
//!   `--agent-identifiers` (checked as Go checks them).
//! - `--sync-interval`/`--sync-interval-cap` -> `--backoff-initial-secs`/
//!   `--backoff-max-secs` (Go: 1s and 10s; edgetunnel doubles with jitter
//!   where ANP's wait.Backoff multiplies by 1.5).
//! - `--keepalive-time` -> `--keepalive-secs`, at least 10 s as grpc-go's
//!   `WithKeepaliveParams` enforces.
//! - `--health-server-host:--health-server-port` (all addresses, 8093) ->
//!   `--health-bind`, `--admin-bind-address:--admin-server-port`
//!   (127.0.0.1:8094) -> `--admin-bind`, both always on as in Go.
//! - Leases: `--count-server-leases` -> `--count-server-leases` with
//!   `--kube` (`--kubeconfig`, else in-cluster, as client-go's
//!   `BuildConfigFromFlags("", "")`), `--lease-namespace`,
//!   `--lease-label-selector` (or the deprecated `--lease-label`),
//!   `--server-count-source`.

use super::goflag::Kind;
use super::Conv;
use super::Effect::{self, *};
use super::{
    bind_addr, flag, invalid, join_host_port, klog, port, whole_seconds, CompatError, Flag, Host,
    Out,
};
use crate::compat::goflag::{format_duration, Parsed};

/// grpc-go's smallest client keepalive (`internal.KeepaliveMinPingTime`).
const GRPC_CLIENT_MIN_KEEPALIVE_SECS: u64 = 10;

const fn f(name: &'static str, kind: Kind, default: &'static str, effect: Effect) -> Flag {
    flag(name, kind, default, effect)
}

/// Every flag of ANP's proxy-agent, with Go's defaults.
pub fn flags() -> Vec<Flag> {
    use Kind::*;
    let mut v = vec![
        f("agent-cert", String, "", Composite("--cert")),
        f("agent-key", String, "", Composite("--key")),
        f("ca-cert", String, "", Composite("--ca")),
        f("proxy-server-host", String, "127.0.0.1", Composite("--server-addr")),
        f("proxy-server-port", Int, "8091", Composite("--server-addr")),
        f("alpn-proto", StringSlice, "", NoEffect("edgetunnel's agent offers ALPN h2 only")),
        f("health-server-host", String, "", Composite("--health-bind (empty: all addresses)")),
        f("health-server-port", Int, "8093", Composite("--health-bind")),
        f("admin-bind-address", String, "127.0.0.1", Composite("--admin-bind")),
        f("admin-server-port", Int, "8094", Composite("--admin-bind")),
        f("enable-profiling", Bool, "false", NoEffect("edgetunnel has no pprof endpoints")),
        f("enable-contention-profiling", Bool, "false", NoEffect("edgetunnel has no pprof endpoints")),
        f("agent-id", String, "", Composite("--agent-id (else PROXY_AGENT_ID, else a UUID)")),
        f("agent-identifiers", String, "", To("--agent-identifiers", Conv::Text)),
        f("sync-interval", Duration, "1s", To("--backoff-initial-secs", Conv::Seconds)),
        f("sync-interval-cap", Duration, "10s", To("--backoff-max-secs", Conv::Seconds)),
        f("probe-interval", Duration, "1s", NoEffect("edgetunnel's agent notices a dead connection by its HTTP/2 PINGs (--keepalive-time) and its socket")),
        f("keepalive-time", Duration, "1h", Composite("--keepalive-secs (at least 10)")),
        f("service-account-token-path", String, "", To("--token-file", Conv::Text)),
        f("warn-on-channel-limit", Bool, "false", NoEffect("edgetunnel has no transfer channel to warn about")),
        f("sync-forever", Bool, "false", Same("edgetunnel's agent always keeps one connection per server the servers report, reconnecting as needed")),
        f("xfr-channel-size", Int, "150", NoEffect("edgetunnel buffers per connection by bytes, not by a packet channel")),
        f("count-server-leases", Bool, "false", To("--count-server-leases", Conv::Switch)),
        f("lease-namespace", String, "kube-system", To("--lease-namespace", Conv::Text)),
        f("lease-label-selector", String, "k8s-app=konnectivity-server", Composite("--lease-label-selector")),
        f("server-count-source", String, "default", To("--server-count-source", Conv::Text)),
        f("kubeconfig", String, "", Composite("--kube with --count-server-leases (empty: in-cluster)")),
        f("kube-api-content-type", String, "application/vnd.kubernetes.protobuf", NoEffect("edgetunnel's Kubernetes client speaks JSON")),
    ];
    v.push(Flag {
        spec: super::goflag::Spec {
            deprecated: Some("Use --lease-label-selector instead"),
            ..super::goflag::Spec::new("lease-label", String, "")
        },
        effect: Composite("--lease-label-selector"),
    });
    v.extend(klog::flags("4"));
    v
}

/// The composite mappings and Go's validation (`Validate`).
pub fn translate(p: &Parsed, out: &mut Out, host: &dyn Host) -> Result<(), CompatError> {
    // ANP's agent dials any destination; edgetunnel's refuses loopback,
    // link-local (cloud metadata) and unspecified addresses by default.
    out.info(
        "edgetunnel's agent refuses loopback, link-local (cloud metadata) and unspecified \
         destinations, which ANP's agent dials; EDGETUNNEL_ALLOW_DESTINATIONS (e.g. \
         0.0.0.0/0,::/0,127.0.0.1/32:10255) opens them"
            .to_string(),
    );
    let (cert, key, ca) = (p.str("agent-cert"), p.str("agent-key"), p.str("ca-cert"));
    if !key.is_empty() && cert.is_empty() {
        return Err(invalid(format!(
            "cannot have agent cert empty when agent key is set to {key:?}"
        )));
    }
    if !cert.is_empty() && key.is_empty() {
        return Err(invalid(format!(
            "cannot have agent key empty when agent cert is set to {cert:?}"
        )));
    }
    if cert.is_empty() && p.str("service-account-token-path").is_empty() {
        return Err(invalid(
            "the agent has no credentials: give --agent-cert and --agent-key, or --service-account-token-path for a server with --agent-namespace token review",
        ));
    }
    if ca.is_empty() {
        return Err(invalid(
            "--ca-cert is required: the CA that verifies the proxy server (ANP cannot load an empty CA file either)",
        ));
    }
    if !cert.is_empty() {
        out.arg("--cert", cert);
        out.arg("--key", key);
    }
    out.arg("--ca", ca);

    let server_port = p.int("proxy-server-port");
    if server_port <= 0 {
        return Err(invalid(format!(
            "proxy server port {server_port} must be greater than 0"
        )));
    }
    if server_port > 65535 {
        return Err(invalid(format!(
            "--proxy-server-port={server_port}: not a TCP port"
        )));
    }
    out.arg(
        "--server-addr",
        join_host_port(p.str("proxy-server-host"), server_port),
    );

    let id = match p.str("agent-id") {
        "" => host
            .env("PROXY_AGENT_ID")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| host.uuid()),
        id => id.to_string(),
    };
    out.arg("--agent-id", id);
    check_identifiers(p.str("agent-identifiers"))?;

    let (sync, cap) = (p.duration("sync-interval"), p.duration("sync-interval-cap"));
    if sync > cap {
        return Err(invalid(format!(
            "sync interval {} must be less than sync interval cap {}",
            format_duration(sync),
            format_duration(cap)
        )));
    }
    if sync < 0 {
        return Err(invalid(format!(
            "--sync-interval={}: must not be negative",
            format_duration(sync)
        )));
    }
    let ka = whole_seconds(p.duration("keepalive-time")).max(GRPC_CLIENT_MIN_KEEPALIVE_SECS);
    out.arg("--keepalive-secs", ka.to_string());

    for (n, what) in [
        ("health-server-port", "health server port"),
        ("admin-server-port", "admin server port"),
    ] {
        if p.int(n) <= 0 {
            return Err(invalid(format!(
                "{what} {} must be greater than 0",
                p.int(n)
            )));
        }
    }
    out.arg(
        "--health-bind",
        bind_addr(
            "health-server-host",
            p.str("health-server-host"),
            port(p, "health-server-port")?,
        )?
        .to_string(),
    );
    out.arg(
        "--admin-bind",
        bind_addr(
            "admin-bind-address",
            p.str("admin-bind-address"),
            port(p, "admin-server-port")?,
        )?
        .to_string(),
    );

    // Leases: the deprecated --lease-label sets the same selector.
    let selector = if p.is_set("lease-label-selector") || !p.is_set("lease-label") {
        p.str("lease-label-selector")
    } else {
        p.str("lease-label")
    };
    out.arg("--lease-label-selector", selector);
    let kubeconfig = p.str("kubeconfig");
    if p.bool("count-server-leases") {
        out.arg(
            "--kube",
            if kubeconfig.is_empty() {
                "in-cluster"
            } else {
                kubeconfig
            },
        );
    } else if !kubeconfig.is_empty() {
        out.info(format!(
            "accepted: --kubeconfig={kubeconfig}: unused without --count-server-leases, as in ANP"
        ));
    }
    if p.bool("enable-contention-profiling") && !p.bool("enable-profiling") {
        return Err(invalid(
            "if --enable-contention-profiling is set, --enable-profiling must also be set",
        ));
    }
    if p.int("xfr-channel-size") <= 0 {
        return Err(invalid(format!(
            "channel size {} must be greater than 0",
            p.int("xfr-channel-size")
        )));
    }
    let source = p.str("server-count-source");
    if !matches!(source, "" | "default" | "max") {
        return Err(invalid(format!(
            "--server-count-source must be one of '', 'default', 'max', got {source}"
        )));
    }
    Ok(())
}

/// Go's `validateAgentIdentifiers`: a URL query whose keys are identifier
/// types.
fn check_identifiers(s: &str) -> Result<(), CompatError> {
    for pair in s.split('&').filter(|x| !x.is_empty()) {
        if pair.contains(';') {
            return Err(invalid(
                "agent address is invalid: invalid semicolon separator in query",
            ));
        }
        let key = pair.split('=').next().unwrap_or(pair);
        if !matches!(key, "ipv4" | "ipv6" | "cidr" | "host" | "default-route") {
            return Err(invalid(format!(
                "agent address is invalid: unknown address type: {key}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Binary;

    const CERTS: &[&str] = &[
        "--agent-cert=/pki/agent.crt",
        "--agent-key=/pki/agent.key",
        "--ca-cert=/pki/ca.crt",
    ];

    #[test]
    fn go_defaults_when_flags_are_absent() {
        let t = run(Binary::ProxyAgent, CERTS, &FakeHost::default()).unwrap();
        assert_eq!(&t.argv[..2], ["edgetunnel", "agent"]);
        assert_eq!(
            pairs(&t),
            [
                "--backoff-initial-secs 1",
                "--backoff-max-secs 10",
                "--lease-namespace kube-system",
                "--server-count-source default",
                "--cert /pki/agent.crt",
                "--key /pki/agent.key",
                "--ca /pki/ca.crt",
                "--server-addr 127.0.0.1:8091",
                "--agent-id 00000000-0000-4000-8000-000000000000",
                "--keepalive-secs 3600",
                "--health-bind 0.0.0.0:8093",
                "--admin-bind 127.0.0.1:8094",
                "--lease-label-selector k8s-app=konnectivity-server",
            ]
        );
        assert!(
            t.notes.iter().all(
                |n| matches!(n, super::super::Note::Info(s) if s.contains("refuses loopback"))
            ),
            "{:?}",
            t.notes
        );
        assert_clap_accepts(&t);
    }

    #[test]
    fn every_flag() {
        use Expect::*;
        let cases: &[(&[&str], Expect)] = &[
            (
                &["--agent-cert=/other/a.crt"],
                Maps(&["--cert /other/a.crt"]),
            ),
            (&["--agent-key=/other/a.key"], Maps(&["--key /other/a.key"])),
            (
                &["--ca-cert=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"],
                Maps(&["--ca /var/run/secrets/kubernetes.io/serviceaccount/ca.crt"]),
            ),
            (&["--ca-cert="], Fails("--ca-cert is required")),
            (
                &["--proxy-server-host=konnectivity-server.kube-system.svc.cluster.local"],
                Maps(&["--server-addr konnectivity-server.kube-system.svc.cluster.local:8091"]),
            ),
            (
                &["--proxy-server-host=fd00::1"],
                Maps(&["--server-addr [fd00::1]:8091"]),
            ),
            (
                &["--proxy-server-port=8132"],
                Maps(&["--server-addr 127.0.0.1:8132"]),
            ),
            (
                &["--proxy-server-port=0"],
                Fails("proxy server port 0 must be greater than 0"),
            ),
            (&["--alpn-proto=konnectivity"], NoEffect),
            (
                &["--health-server-host=127.0.0.1"],
                Maps(&["--health-bind 127.0.0.1:8093"]),
            ),
            (
                &["--health-server-port=8134"],
                Maps(&["--health-bind 0.0.0.0:8134"]),
            ),
            (
                &["--health-server-host=example.com"],
                Fails("edgetunnel binds IP addresses"),
            ),
            (
                &["--admin-bind-address=0.0.0.0"],
                Maps(&["--admin-bind 0.0.0.0:8094"]),
            ),
            (
                &["--admin-server-port=8133"],
                Maps(&["--admin-bind 127.0.0.1:8133"]),
            ),
            (
                &["--admin-server-port=0"],
                Fails("admin server port 0 must be greater than 0"),
            ),
            (&["--enable-profiling"], NoEffect),
            (
                &["--enable-contention-profiling"],
                Fails("--enable-profiling must also be set"),
            ),
            (&["--agent-id=node-1"], Maps(&["--agent-id node-1"])),
            (
                &["--agent-identifiers=ipv4=10.0.0.5&host=node-1"],
                Maps(&["--agent-identifiers ipv4=10.0.0.5&host=node-1"]),
            ),
            (
                &["--agent-identifiers=zone=a"],
                Fails("unknown address type: zone"),
            ),
            (
                &["--sync-interval=5s", "--sync-interval-cap=30s"],
                Maps(&["--backoff-initial-secs 5", "--backoff-max-secs 30"]),
            ),
            (
                &["--sync-interval=15s"],
                Fails("sync interval 15s must be less than sync interval cap 10s"),
            ),
            (
                &["--sync-interval-cap=1m30s"],
                Maps(&["--backoff-max-secs 90"]),
            ),
            (&["--probe-interval=5s"], NoEffect),
            (&["--keepalive-time=30s"], Maps(&["--keepalive-secs 30"])),
            (&["--keepalive-time=1s"], Maps(&["--keepalive-secs 10"])),
            (
                &["--service-account-token-path=/var/run/secrets/tokens/konnectivity-agent-token"],
                Maps(&["--token-file /var/run/secrets/tokens/konnectivity-agent-token"]),
            ),
            (&["--warn-on-channel-limit"], NoEffect),
            (&["--sync-forever"], Same),
            (&["--xfr-channel-size=300"], NoEffect),
            (
                &["--xfr-channel-size=0"],
                Fails("channel size 0 must be greater than 0"),
            ),
            (
                &["--count-server-leases"],
                Maps(&["--count-server-leases", "--kube in-cluster"]),
            ),
            (
                &[
                    "--count-server-leases",
                    "--kubeconfig=/etc/kubernetes/kubeconfig",
                ],
                Maps(&["--count-server-leases", "--kube /etc/kubernetes/kubeconfig"]),
            ),
            (
                &["--lease-namespace=default"],
                Maps(&["--lease-namespace default"]),
            ),
            (
                &["--lease-label-selector=app=x"],
                Maps(&["--lease-label-selector app=x"]),
            ),
            (
                &["--lease-label=app=x"],
                Maps(&["--lease-label-selector app=x"]),
            ),
            (
                &["--server-count-source=max"],
                Maps(&["--server-count-source max"]),
            ),
            (
                &["--server-count-source=min"],
                Fails("--server-count-source must be one of"),
            ),
            (&["--kubeconfig=/etc/kubernetes/kubeconfig"], Same),
            (&["--kube-api-content-type=application/json"], NoEffect),
            (&["-v", "7"], Maps(&["--log info,edgetunnel=trace"])),
            (&["--vmodule=agent=5"], NoEffect),
            (&["--logtostderr=true"], Maps(&[])),
            (
                &["--logtostderr=false", "--log-file=/var/log/agent.log"],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/agent.log",
                    "--log-stderr-threshold error",
                ]),
            ),
            (
                &[
                    "--logtostderr=false",
                    "--log-file=/var/log/agent.log",
                    "--alsologtostderr",
                ],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/agent.log",
                    "--log-stderr-threshold all",
                ]),
            ),
            (
                &[
                    "--logtostderr=false",
                    "--log-file=/var/log/agent.log",
                    "--stderrthreshold=WARNING",
                ],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/agent.log",
                    "--log-stderr-threshold warn",
                ]),
            ),
            (&["--alsologtostderr"], Same),
            (&["--log-file=/var/log/agent.log"], Same),
            (&["--log-dir=/var/log"], Same),
            (&["--log-file-max-size=10"], Same),
            (&["--stderrthreshold=1"], Same),
            (&["--alsologtostderrthreshold=1"], Same),
            (&["--legacy-stderr-threshold-behavior=false"], NoEffect),
            (&["--add-dir-header"], NoEffect),
            (&["--skip-headers"], NoEffect),
            (&["--skip-log-headers"], NoEffect),
            (&["--one-output"], NoEffect),
            (&["--log-backtrace-at=agent.go:1"], NoEffect),
        ];
        check_table(Binary::ProxyAgent, CERTS, &FakeHost::default(), cases);
    }

    #[test]
    fn the_documentation_arguments_use_the_token_alone() {
        // kubernetes/website's konnectivity-agent.yaml: no agent certificate.
        let docs = [
            "--logtostderr=true",
            "--ca-cert=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
            "--proxy-server-host=35.225.206.7",
            "--proxy-server-port=8132",
            "--admin-server-port=8133",
            "--health-server-port=8134",
            "--service-account-token-path=/var/run/secrets/tokens/konnectivity-agent-token",
        ];
        let h = FakeHost::default().with_env("PROXY_AGENT_ID", "agent-from-env");
        let t = run(Binary::ProxyAgent, &docs, &h).unwrap();
        assert_eq!(
            pairs(&t),
            [
                "--backoff-initial-secs 1",
                "--backoff-max-secs 10",
                "--token-file /var/run/secrets/tokens/konnectivity-agent-token",
                "--lease-namespace kube-system",
                "--server-count-source default",
                "--ca /var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                "--server-addr 35.225.206.7:8132",
                "--agent-id agent-from-env",
                "--keepalive-secs 3600",
                "--health-bind 0.0.0.0:8134",
                "--admin-bind 127.0.0.1:8133",
                "--lease-label-selector k8s-app=konnectivity-server",
            ]
        );
        assert!(
            t.notes.iter().all(
                |n| matches!(n, super::super::Note::Info(s) if s.contains("refuses loopback"))
            ),
            "{:?}",
            t.notes
        );
        assert_clap_accepts(&t);
        // With a certificate as well, both are presented.
        let with_cert: Vec<&str> = docs
            .iter()
            .copied()
            .chain(["--agent-cert=/a.crt", "--agent-key=/a.key"])
            .collect();
        let t = run(Binary::ProxyAgent, &with_cert, &h).unwrap();
        let p = pairs(&t);
        for want in [
            "--cert /a.crt",
            "--key /a.key",
            "--token-file /var/run/secrets/tokens/konnectivity-agent-token",
        ] {
            assert!(p.contains(&want.to_string()), "{want} not in {p:?}");
        }
        // Neither a certificate nor a token: no credentials, refused.
        let e = run(
            Binary::ProxyAgent,
            &["--ca-cert=/pki/ca.crt"],
            &FakeHost::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("the agent has no credentials"),
            "{e}"
        );
    }
}
