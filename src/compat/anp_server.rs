//! ANP's `proxy-server` flags (`cmd/server/app/options/options.go`) as
//! `edgetunnel server` flags.
//!
//! - Frontend: with `--uds-name` (and `--server-port=0`, which Go demands
//!   with it) `--mode=grpc` becomes `--grpc-uds`, `--mode=http-connect`
//!   `--connect-uds`. Without it Go serves the frontend on TCP
//!   (`--server-bind-address:--server-port`) with mutual TLS toward
//!   kube-apiserver: `--grpc-bind`/`--connect-bind` with `--frontend-cert`,
//!   `--frontend-key` and `--frontend-ca` (Go demands `--server-ca-cert`
//!   there, and so callers always present a certificate). The socket gets
//!   Go's mode (`getUDSListener` binds under umask 0007: 0770) as
//!   `--uds-mode 0770`; `--delete-existing-uds-file=false` is
//!   `--keep-existing-uds` (Go then fails to bind an existing path), `true`
//!   (Go removes whatever is at the path, `runUDSFrontendServer`) is
//!   edgetunnel's default, which removes only a stale socket file.
//! - `--cipher-suites`, `--tls-min-version` -> the same edgetunnel flags
//!   (agent and frontend listeners, as Go's `getTLSConfig`).
//! - Agent listener: `--agent-bind-address:--agent-port` (empty address:
//!   all) becomes `--agent-bind`, its TLS `--cluster-cert`/`--cluster-key`
//!   `--cert`/`--key`, and `--cluster-ca-cert` `--ca`.
//! - Agent authentication: `--agent-namespace`, `--agent-service-account`,
//!   `--authentication-audience` (all three, as Go demands) map to the same
//!   edgetunnel flags, with `--kube` (`--kubeconfig`, else in-cluster) for
//!   the TokenReviews. Without `--cluster-ca-cert` Go asks agents for no
//!   certificate; so does edgetunnel then (no `--ca`): agents prove
//!   themselves with their token alone. Without token authentication and
//!   without `--cluster-ca-cert` edgetunnel, which must then verify agent
//!   certificates, takes `ca.crt` next to `--cluster-cert` (kubeadm's
//!   `/etc/kubernetes/pki` layout: `apiserver.crt` beside the cluster CA)
//!   and says so, or refuses to start when there is none.
//! - Health and admin: `--health-bind-address:--health-port` (all
//!   addresses, 8092: `/healthz`, `/readyz`, `/metrics`, where the liveness
//!   probes of ANP's manifests point) -> `--health-bind`;
//!   `--admin-bind-address:--admin-port` (127.0.0.1:8095: `/metrics`, and
//!   pprof in Go, which edgetunnel does not have) -> `--admin-bind`.
//! - Leases: `--enable-lease-controller` -> `--enable-lease-controller`
//!   with `--kube` (`--kubeconfig`, else in-cluster, as client-go's
//!   `BuildConfigFromFlags("", "")`), `--lease-namespace`, `--lease-label`.
//!   Note that `--kube` (for leases or token review) also makes
//!   edgetunnel's server list and watch nodes (its yurt-tunnel features),
//!   which needs that RBAC too. With neither, `--kubeconfig` is unused, as
//!   in ANP.
//! - `--keepalive-time` -> `--keepalive-secs` (grpc-go's server rule: 0
//!   means 2h; rounded up to whole seconds); `--backend-dial-timeout` ->
//!   `--dial-timeout-secs`, where Go's 0 ("no timeout": the agent's own
//!   dial timeout answers first) becomes one day, edgetunnel having no
//!   "never".
//! - `--server-id` (else `PROXY_SERVER_ID`, else a UUID, as Go), `--server-count`,
//!   `--proxy-strategies` (Go's default `default`, not edgetunnel's).

use super::goflag::Kind;
use super::Conv;
use super::Effect::{self, *};
use super::{
    bind_addr, flag, invalid, klog, non_negative, port, whole_seconds, CompatError, Flag, Host, Out,
};
use crate::compat::goflag::Parsed;

/// `--backend-dial-timeout=0` (Go: no timeout) as edgetunnel seconds.
pub const NO_DIAL_TIMEOUT_SECS: u64 = 86_400;

/// Go's `--keepalive-time=0`: grpc-go's server default.
const GRPC_SERVER_KEEPALIVE_SECS: u64 = 7_200;

const fn f(name: &'static str, kind: Kind, default: &'static str, effect: Effect) -> Flag {
    flag(name, kind, default, effect)
}

/// Every flag of ANP's proxy-server, with Go's defaults.
pub fn flags() -> Vec<Flag> {
    use Kind::*;
    let mut v = vec![
        // Frontend (kube-apiserver side).
        f("mode", String, "grpc", Composite("--grpc-uds (grpc) or --connect-uds (http-connect)")),
        f("uds-name", String, "", Composite("--grpc-uds / --connect-uds")),
        f("delete-existing-uds-file", Bool, "true", Composite("true: a stale socket file is replaced (Go removes whatever is there; edgetunnel never a regular file or a live server's socket); false: --keep-existing-uds")),
        f("server-port", Int, "8090", Composite("must be 0 with --uds-name; else the TCP frontend's port: --grpc-bind / --connect-bind")),
        f("server-bind-address", String, "", Composite("the TCP frontend's address: --grpc-bind / --connect-bind (empty: all)")),
        f("server-cert", String, "", Composite("--frontend-cert (TCP frontend)")),
        f("server-key", String, "", Composite("--frontend-key (TCP frontend)")),
        f("server-ca-cert", String, "", Composite("--frontend-ca (TCP frontend)")),
        f("frontend-keepalive-time", Duration, "1h", Composite("--frontend-keepalive-secs (0: grpc-go's 2h)")),
        // Agent listener.
        f("agent-port", Int, "8091", Composite("--agent-bind")),
        f("agent-bind-address", String, "", Composite("--agent-bind")),
        f("cluster-cert", String, "", Composite("--cert")),
        f("cluster-key", String, "", Composite("--key")),
        f("cluster-ca-cert", String, "", Composite("--ca (default: ca.crt beside --cluster-cert)")),
        f("keepalive-time", Duration, "1h", Composite("--keepalive-secs")),
        f("cipher-suites", StringSlice, "", To("--cipher-suites", Conv::Text)),
        f("tls-min-version", String, "", To("--tls-min-version", Conv::Text)),
        // Health and admin.
        f("health-port", Int, "8092", Composite("--health-bind (/healthz, /readyz, /metrics)")),
        f("health-bind-address", String, "", Composite("--health-bind (empty: all addresses)")),
        f("admin-port", Int, "8095", Composite("--admin-bind (/metrics; no pprof)")),
        f("admin-bind-address", String, "127.0.0.1", Composite("--admin-bind")),
        f("enable-profiling", Bool, "false", NoEffect("edgetunnel has no pprof endpoints")),
        f("enable-contention-profiling", Bool, "false", NoEffect("edgetunnel has no pprof endpoints")),
        // Routing and identity.
        f("server-id", String, "", Composite("--server-id (else PROXY_SERVER_ID, else a UUID)")),
        f("server-count", Int, "1", To("--server-count", Conv::Text)),
        f("proxy-strategies", String, "default", To("--proxy-strategies", Conv::Text)),
        f("backend-dial-timeout", Duration, "0", Composite("--dial-timeout-secs (0: one day)")),
        f("xfr-channel-size", Int, "10", NoEffect("edgetunnel buffers per connection by bytes, not by a packet channel")),
        f("graceful-shutdown-timeout", Duration, "0", To("--graceful-shutdown-timeout-secs", Conv::Seconds)),
        // Agent authentication by token.
        f("agent-namespace", String, "", Composite("--agent-namespace (with --kube for the TokenReviews)")),
        f("agent-service-account", String, "", Composite("--agent-service-account")),
        f("authentication-audience", String, "", Composite("--authentication-audience")),
        f("kubeconfig", String, "", Composite("--kube with --enable-lease-controller or token review (empty: in-cluster)")),
        f("kubeconfig-qps", Float32, "0", NoEffect("edgetunnel's Kubernetes client is not rate-limited by flags")),
        f("kubeconfig-burst", Int, "0", NoEffect("edgetunnel's Kubernetes client is not rate-limited by flags")),
        f("kube-api-content-type", String, "application/vnd.kubernetes.protobuf", NoEffect("edgetunnel's Kubernetes client speaks JSON")),
        // Leases.
        f("enable-lease-controller", Bool, "false", To("--enable-lease-controller", Conv::Switch)),
        f("lease-namespace", String, "kube-system", To("--lease-namespace", Conv::Text)),
        f("lease-label", String, "k8s-app=konnectivity-server", To("--lease-label", Conv::Text)),
    ];
    v.push(Flag {
        spec: super::goflag::Spec {
            deprecated: Some("This behavior is now thread safe and always on. This flag will be removed in a future release."),
            ..super::goflag::Spec::new("warn-on-channel-limit", Bool, "true")
        },
        effect: Same("deprecated in ANP, which always behaves so; edgetunnel has no such channel"),
    });
    v.extend(klog::flags("4"));
    v
}

/// The composite mappings and Go's validation (`Validate`).
pub fn translate(p: &Parsed, out: &mut Out, host: &dyn Host) -> Result<(), CompatError> {
    let mode = p.str("mode");
    if mode != "grpc" && mode != "http-connect" {
        return Err(invalid(format!(
            "mode must be set to either 'grpc' or 'http-connect' not {mode:?}"
        )));
    }

    // ANP binds no agent to its certificate: any certificate the CA signed
    // may register any agent ID (edgetunnel server's default binds them).
    out.switch("--bind-agent-identity=false");

    // The agent listener's TLS.
    let (cert, key, ca) = (
        p.str("cluster-cert"),
        p.str("cluster-key"),
        p.str("cluster-ca-cert"),
    );
    if !key.is_empty() && cert.is_empty() {
        return Err(invalid(format!(
            "cannot have cluster cert empty when cluster key is set to {key:?}"
        )));
    }
    if !cert.is_empty() && key.is_empty() {
        return Err(invalid(format!(
            "cannot have cluster key empty when cluster cert is set to {cert:?}"
        )));
    }
    if cert.is_empty() {
        return Err(invalid(
            "the agent listener needs --cluster-cert and --cluster-key (ANP cannot start without them either)",
        ));
    }
    let auth = [
        "agent-namespace",
        "agent-service-account",
        "authentication-audience",
    ];
    let token_auth = auth.iter().any(|n| !p.str(n).is_empty());
    if token_auth {
        for n in auth {
            if p.str(n).is_empty() {
                return Err(invalid(format!(
                    "--{n} cannot be empty when agent authentication is enabled"
                )));
            }
        }
        for n in auth {
            out.arg(&format!("--{n}"), p.str(n));
        }
    }
    out.arg("--cert", cert);
    out.arg("--key", key);
    if !ca.is_empty() {
        out.arg("--ca", ca);
    } else if token_auth {
        // As Go: no client certificate asked for; the token proves the agent.
    } else {
        let beside = std::path::Path::new(cert).with_file_name("ca.crt");
        if !host.exists(&beside) {
            return Err(invalid(format!(
                "no --cluster-ca-cert given and no {} beside --cluster-cert: without --agent-namespace token authentication edgetunnel verifies agents by client certificate and needs the CA that signs them (ANP would accept any agent)",
                beside.display()
            )));
        }
        out.arg("--ca", beside.display().to_string());
        out.warn(format!(
            "no --cluster-ca-cert and no --agent-namespace: agents must present a certificate signed by {} (found beside --cluster-cert); ANP would ask for none and check nothing",
            beside.display()
        ));
    }

    // The frontend.
    let uds = p.str("uds-name");
    let server_port = p.int("server-port");
    if !uds.is_empty() {
        if server_port != 0 {
            return Err(invalid(format!(
                "server port should be set to 0 not {server_port} for UDS"
            )));
        }
        for (n, what) in [
            ("server-key", "server key"),
            ("server-cert", "server cert"),
            ("server-ca-cert", "server ca cert"),
        ] {
            if !p.str(n).is_empty() {
                return Err(invalid(format!("{what} should not be set for UDS")));
            }
        }
        out.arg(
            if mode == "grpc" {
                "--grpc-uds"
            } else {
                "--connect-uds"
            },
            uds,
        );
        // Go binds under umask 0007 (getUDSListener): srwxrwx---.
        out.arg("--uds-mode", "0770");
        if !p.bool("delete-existing-uds-file") {
            out.switch("--keep-existing-uds");
        }
    } else {
        if p.str("server-ca-cert").is_empty() {
            return Err(invalid(
                "server ca cert must be set when in TCP mode (uds-name is empty)",
            ));
        }
        let (cert, key) = (p.str("server-cert"), p.str("server-key"));
        if cert.is_empty() || key.is_empty() {
            // Go fails in tls.LoadX509KeyPair.
            return Err(invalid(format!(
                "failed to load X509 key pair {cert} and {key}: the TCP frontend needs --server-cert and --server-key"
            )));
        }
        let addr = bind_addr(
            "server-bind-address",
            p.str("server-bind-address"),
            port(p, "server-port")?,
        )?;
        out.arg(
            if mode == "grpc" {
                "--grpc-bind"
            } else {
                "--connect-bind"
            },
            addr.to_string(),
        );
        out.arg("--frontend-cert", cert);
        out.arg("--frontend-key", key);
        out.arg("--frontend-ca", p.str("server-ca-cert"));
    }

    // Agent, health and admin listeners.
    out.arg(
        "--agent-bind",
        bind_addr(
            "agent-bind-address",
            p.str("agent-bind-address"),
            port(p, "agent-port")?,
        )?
        .to_string(),
    );
    out.arg(
        "--health-bind",
        bind_addr(
            "health-bind-address",
            p.str("health-bind-address"),
            port(p, "health-port")?,
        )?
        .to_string(),
    );
    out.arg(
        "--admin-bind",
        bind_addr(
            "admin-bind-address",
            p.str("admin-bind-address"),
            port(p, "admin-port")?,
        )?
        .to_string(),
    );
    if p.bool("enable-contention-profiling") && !p.bool("enable-profiling") {
        return Err(invalid(
            "if --enable-contention-profiling is set, --enable-profiling must also be set",
        ));
    }

    // Timing.
    let ka = p.duration("keepalive-time");
    let ka_secs = if ka == 0 {
        GRPC_SERVER_KEEPALIVE_SECS
    } else {
        whole_seconds(ka).max(1)
    };
    out.arg("--keepalive-secs", ka_secs.to_string());
    let fka = p.duration("frontend-keepalive-time");
    let fka_secs = if fka == 0 {
        GRPC_SERVER_KEEPALIVE_SECS.to_string()
    } else {
        super::seconds(fka)
    };
    out.arg("--frontend-keepalive-secs", fka_secs);
    non_negative(p, "graceful-shutdown-timeout")?;
    let dial = non_negative(p, "backend-dial-timeout")?;
    if dial == 0 {
        out.arg("--dial-timeout-secs", NO_DIAL_TIMEOUT_SECS.to_string());
    } else {
        out.arg("--dial-timeout-secs", super::seconds(dial));
    }

    // Identity and routing.
    let id = match p.str("server-id") {
        "" => host
            .env("PROXY_SERVER_ID")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| host.uuid()),
        id => id.to_string(),
    };
    out.arg("--server-id", id);
    if p.int("server-count") < 0 {
        return Err(invalid(format!(
            "--server-count={}: must not be negative",
            p.int("server-count")
        )));
    }
    if p.str("proxy-strategies").is_empty() {
        return Err(invalid("ProxyStrategies cannot be empty"));
    }
    // Kubernetes: for the leases and the agents' TokenReviews.
    let kubeconfig = p.str("kubeconfig");
    if p.bool("enable-lease-controller") || token_auth {
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
            "accepted: --kubeconfig={kubeconfig}: unused without --enable-lease-controller or --agent-namespace, as in ANP"
        ));
    }
    if p.int("xfr-channel-size") <= 0 {
        return Err(invalid(format!(
            "channel size {} must be greater than 0",
            p.int("xfr-channel-size")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{Binary, Note};

    const CERTS: &[&str] = &[
        "--cluster-cert=/pki/apiserver.crt",
        "--cluster-key=/pki/apiserver.key",
        "--cluster-ca-cert=/pki/ca.crt",
        "--uds-name=/run/konnectivity.sock",
        "--server-port=0",
    ];

    fn host() -> FakeHost {
        FakeHost::default().with_file("/pki/ca.crt", b"CA")
    }

    /// klog v2 (`klog_file.go` `logName`): a file in --log-dir named
    /// `program.host.user.log.INFO.yyyymmdd-hhmmss.pid`.
    #[test]
    fn log_dir_gets_a_klog_named_file() {
        let mut args = CERTS.to_vec();
        args.extend(["--logtostderr=false", "--log-dir=/var/log/anp"]);
        let t = run(Binary::ProxyServer, &args, &host()).unwrap();
        let at = t.argv.iter().position(|a| a == "--log-file").unwrap();
        let file = &t.argv[at + 1];
        let name = file.strip_prefix("/var/log/anp/proxy-server.").unwrap();
        let (_, tail) = name.split_once(".log.INFO.").unwrap();
        let (stamp, pid) = tail.split_once('.').unwrap();
        assert_eq!(stamp.len(), 15, "{file}");
        assert_eq!(pid, std::process::id().to_string(), "{file}");
        assert!(pairs(&t).contains(&"--log-format klog".to_string()));
    }

    #[test]
    fn go_defaults_when_flags_are_absent() {
        let t = run(Binary::ProxyServer, CERTS, &host()).unwrap();
        assert_eq!(&t.argv[..2], ["edgetunnel", "server"]);
        assert_eq!(
            pairs(&t),
            [
                "--server-count 1",
                "--proxy-strategies default",
                "--graceful-shutdown-timeout-secs 0",
                "--lease-namespace kube-system",
                "--lease-label k8s-app=konnectivity-server",
                "--bind-agent-identity=false",
                "--cert /pki/apiserver.crt",
                "--key /pki/apiserver.key",
                "--ca /pki/ca.crt",
                "--grpc-uds /run/konnectivity.sock",
                "--uds-mode 0770",
                "--agent-bind 0.0.0.0:8091",
                "--health-bind 0.0.0.0:8092",
                "--admin-bind 127.0.0.1:8095",
                "--keepalive-secs 3600",
                "--frontend-keepalive-secs 3600",
                "--dial-timeout-secs 86400",
                "--server-id 00000000-0000-4000-8000-000000000000",
            ]
        );
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        assert_clap_accepts(&t);
    }

    #[test]
    fn every_flag() {
        use Expect::*;
        let cases: &[(&[&str], Expect)] = &[
            (
                &["--mode=http-connect"],
                Maps(&["--connect-uds /run/konnectivity.sock"]),
            ),
            (
                &["--mode=tcp"],
                Fails("mode must be set to either 'grpc' or 'http-connect' not \"tcp\""),
            ),
            (
                &["--uds-name=/tmp/other.sock"],
                Maps(&["--grpc-uds /tmp/other.sock"]),
            ),
            (&["--delete-existing-uds-file"], Maps(&[])),
            (
                &["--delete-existing-uds-file=false"],
                Maps(&["--keep-existing-uds"]),
            ),
            (
                &["--server-port=8090"],
                Fails("server port should be set to 0 not 8090 for UDS"),
            ),
            (
                &["--server-bind-address=10.0.0.1", "--uds-name="],
                Fails("server ca cert must be set when in TCP mode"),
            ),
            (
                &[
                    "--uds-name=",
                    "--server-port=8090",
                    "--server-cert=/pki/s.crt",
                    "--server-key=/pki/s.key",
                    "--server-ca-cert=/pki/ca.crt",
                ],
                Maps(&[
                    "--grpc-bind 0.0.0.0:8090",
                    "--frontend-cert /pki/s.crt",
                    "--frontend-key /pki/s.key",
                    "--frontend-ca /pki/ca.crt",
                ]),
            ),
            (
                &[
                    "--uds-name=",
                    "--mode=http-connect",
                    "--server-bind-address=10.0.0.1",
                    "--server-port=8131",
                    "--server-cert=/pki/s.crt",
                    "--server-key=/pki/s.key",
                    "--server-ca-cert=/pki/ca.crt",
                ],
                Maps(&[
                    "--connect-bind 10.0.0.1:8131",
                    "--frontend-cert /pki/s.crt",
                    "--frontend-key /pki/s.key",
                    "--frontend-ca /pki/ca.crt",
                ]),
            ),
            (
                &["--uds-name=", "--server-ca-cert=/pki/ca.crt"],
                Fails("failed to load X509 key pair"),
            ),
            (
                &["--server-cert=/pki/s.crt"],
                Fails("server cert should not be set for UDS"),
            ),
            (
                &["--server-key=/pki/s.key"],
                Fails("server key should not be set for UDS"),
            ),
            (
                &["--server-ca-cert=/pki/ca.crt"],
                Fails("server ca cert should not be set for UDS"),
            ),
            (
                &["--frontend-keepalive-time=30s"],
                Maps(&["--frontend-keepalive-secs 30"]),
            ),
            (
                &["--frontend-keepalive-time=0"],
                Maps(&["--frontend-keepalive-secs 7200"]),
            ),
            (&["--agent-port=8132"], Maps(&["--agent-bind 0.0.0.0:8132"])),
            (
                &["--agent-bind-address=::"],
                Maps(&["--agent-bind [::]:8091"]),
            ),
            (
                &["--cluster-cert=/other/tls.crt"],
                Maps(&["--cert /other/tls.crt"]),
            ),
            (
                &["--cluster-key=/other/tls.key"],
                Maps(&["--key /other/tls.key"]),
            ),
            (
                &["--cluster-ca-cert=/other/ca.crt"],
                Maps(&["--ca /other/ca.crt"]),
            ),
            (&["--keepalive-time=90s"], Maps(&["--keepalive-secs 90"])),
            (
                &["--cipher-suites=TLS_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
                Maps(&[
                    "--cipher-suites TLS_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                ]),
            ),
            (
                &["--tls-min-version=VersionTLS13"],
                Maps(&["--tls-min-version VersionTLS13"]),
            ),
            (
                &["--health-port=8134"],
                Maps(&["--health-bind 0.0.0.0:8134"]),
            ),
            (
                &["--health-bind-address=127.0.0.1"],
                Maps(&["--health-bind 127.0.0.1:8092"]),
            ),
            (
                &["--admin-port=8133"],
                Maps(&["--admin-bind 127.0.0.1:8133"]),
            ),
            (
                &["--admin-bind-address=0.0.0.0"],
                Maps(&["--admin-bind 0.0.0.0:8095"]),
            ),
            (
                &["--admin-bind-address=my-host"],
                Fails("edgetunnel binds IP addresses"),
            ),
            (&["--enable-profiling"], NoEffect),
            (
                &["--enable-contention-profiling"],
                Fails("--enable-profiling must also be set"),
            ),
            (&["--server-id=cp-1"], Maps(&["--server-id cp-1"])),
            (&["--server-count=3"], Maps(&["--server-count 3"])),
            (
                &["--proxy-strategies=destHost,defaultRoute"],
                Maps(&["--proxy-strategies destHost,defaultRoute"]),
            ),
            (
                &["--proxy-strategies="],
                Fails("ProxyStrategies cannot be empty"),
            ),
            (
                &["--backend-dial-timeout=5s"],
                Maps(&["--dial-timeout-secs 5"]),
            ),
            (
                &["--backend-dial-timeout=-1s"],
                Fails("backend-dial-timeout must be >= 0, got -1s"),
            ),
            (&["--xfr-channel-size=20"], NoEffect),
            (
                &["--graceful-shutdown-timeout=10s"],
                Maps(&["--graceful-shutdown-timeout-secs 10"]),
            ),
            (
                &["--agent-namespace=kube-system"],
                Fails("--agent-service-account cannot be empty"),
            ),
            (
                &["--agent-service-account=konnectivity-agent"],
                Fails("--agent-namespace cannot be empty"),
            ),
            (
                &["--authentication-audience=system:konnectivity-server"],
                Fails("--agent-namespace cannot be empty"),
            ),
            (
                &[
                    "--agent-namespace=kube-system",
                    "--agent-service-account=konnectivity-agent",
                    "--authentication-audience=system:konnectivity-server",
                ],
                Maps(&[
                    "--agent-namespace kube-system",
                    "--agent-service-account konnectivity-agent",
                    "--authentication-audience system:konnectivity-server",
                    "--kube in-cluster",
                ]),
            ),
            (
                &[
                    "--agent-namespace=ns",
                    "--agent-service-account=sa",
                    "--authentication-audience=aud",
                    "--kubeconfig=/etc/kubernetes/konnectivity-server.conf",
                    "--enable-lease-controller",
                ],
                Maps(&[
                    "--enable-lease-controller",
                    "--agent-namespace ns",
                    "--agent-service-account sa",
                    "--authentication-audience aud",
                    "--kube /etc/kubernetes/konnectivity-server.conf",
                ]),
            ),
            (&["--kubeconfig=/etc/kubernetes/admin.conf"], Same),
            (&["--kubeconfig-qps=50"], NoEffect),
            (&["--kubeconfig-burst=100"], NoEffect),
            (&["--kube-api-content-type=application/json"], NoEffect),
            (
                &["--enable-lease-controller"],
                Maps(&["--enable-lease-controller", "--kube in-cluster"]),
            ),
            (
                &[
                    "--enable-lease-controller",
                    "--kubeconfig=/etc/kubernetes/admin.conf",
                ],
                Maps(&[
                    "--enable-lease-controller",
                    "--kube /etc/kubernetes/admin.conf",
                ]),
            ),
            (
                &["--lease-namespace=default"],
                Maps(&["--lease-namespace default"]),
            ),
            (&["--lease-label=app=x"], Maps(&["--lease-label app=x"])),
            (&["--warn-on-channel-limit"], Same),
            // klog.
            (&["-v=2"], Maps(&["--log info"])),
            (&["--v=5"], Maps(&["--log info,edgetunnel=debug"])),
            (&["--vmodule=server=5"], NoEffect),
            (&["--logtostderr=true"], Maps(&[])),
            (
                &[
                    "--logtostderr=false",
                    "--log-file=/var/log/konnectivity-server.log",
                ],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/konnectivity-server.log",
                    "--log-stderr-threshold error",
                ]),
            ),
            (
                &[
                    "--logtostderr=false",
                    "--log-file=/var/log/konnectivity-server.log",
                    "--alsologtostderr",
                ],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/konnectivity-server.log",
                    "--log-stderr-threshold all",
                ]),
            ),
            (
                &[
                    "--logtostderr=false",
                    "--log-file=/var/log/konnectivity-server.log",
                    "--stderrthreshold=WARNING",
                ],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/konnectivity-server.log",
                    "--log-stderr-threshold warn",
                ]),
            ),
            (&["--alsologtostderr"], Same),
            (&["--log-file=/var/log/konnectivity-server.log"], Same),
            (&["--log-dir=/var/log"], Same),
            (&["--log-file-max-size=0"], Same),
            (&["--stderrthreshold=INFO"], Same),
            (&["--alsologtostderrthreshold=ERROR"], Same),
            (&["--legacy-stderr-threshold-behavior=false"], NoEffect),
            (&["--add-dir-header"], NoEffect),
            (&["--skip-headers"], NoEffect),
            (&["--skip-log-headers"], NoEffect),
            (&["--one-output"], NoEffect),
            (&["--log-backtrace-at=server.go:100"], NoEffect),
        ];
        check_table(Binary::ProxyServer, CERTS, &host(), cases);
    }

    #[test]
    fn the_documentation_arguments_review_agent_tokens() {
        let h = FakeHost::default()
            .with_env("PROXY_SERVER_ID", "from-env")
            .with_file("/etc/kubernetes/pki/ca.crt", b"CA");
        // The Kubernetes documentation's konnectivity-server arguments: no
        // --cluster-ca-cert, so no client certificate is asked for (no
        // --ca); agents prove themselves by token.
        let docs = [
            "--logtostderr=true",
            "--uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket",
            "--delete-existing-uds-file",
            "--cluster-cert=/etc/kubernetes/pki/apiserver.crt",
            "--cluster-key=/etc/kubernetes/pki/apiserver.key",
            "--mode=grpc",
            "--server-port=0",
            "--agent-port=8132",
            "--admin-port=8133",
            "--health-port=8134",
            "--agent-namespace=kube-system",
            "--agent-service-account=konnectivity-agent",
            "--kubeconfig=/etc/kubernetes/konnectivity-server.conf",
            "--authentication-audience=system:konnectivity-server",
        ];
        let t = run(Binary::ProxyServer, &docs, &h).unwrap();
        assert_eq!(
            pairs(&t),
            [
                "--server-count 1",
                "--proxy-strategies default",
                "--graceful-shutdown-timeout-secs 0",
                "--lease-namespace kube-system",
                "--lease-label k8s-app=konnectivity-server",
                "--bind-agent-identity=false",
                "--agent-namespace kube-system",
                "--agent-service-account konnectivity-agent",
                "--authentication-audience system:konnectivity-server",
                "--cert /etc/kubernetes/pki/apiserver.crt",
                "--key /etc/kubernetes/pki/apiserver.key",
                "--grpc-uds /etc/kubernetes/konnectivity-server/konnectivity-server.socket",
                "--uds-mode 0770",
                "--agent-bind 0.0.0.0:8132",
                "--health-bind 0.0.0.0:8134",
                "--admin-bind 127.0.0.1:8133",
                "--keepalive-secs 3600",
                "--frontend-keepalive-secs 3600",
                "--dial-timeout-secs 86400",
                "--server-id from-env",
                "--kube /etc/kubernetes/konnectivity-server.conf",
            ]
        );
        let warns: Vec<&str> = t
            .notes
            .iter()
            .filter_map(|n| match n {
                Note::Warn(s) => Some(s.as_str()),
                _ => None,
            })
            .collect();
        assert!(warns.is_empty(), "{warns:?}");
        assert_clap_accepts(&t);
        // With --cluster-ca-cert too, presented certificates are verified.
        let with_ca: Vec<&str> = docs
            .iter()
            .copied()
            .chain(["--cluster-ca-cert=/etc/kubernetes/pki/ca.crt"])
            .collect();
        let t = run(Binary::ProxyServer, &with_ca, &h).unwrap();
        assert!(pairs(&t).contains(&"--ca /etc/kubernetes/pki/ca.crt".to_string()));
        // Without token authentication and without --cluster-ca-cert: the
        // CA beside the certificate, with a warning.
        let no_auth = [
            "--uds-name=/s",
            "--server-port=0",
            "--cluster-cert=/etc/kubernetes/pki/apiserver.crt",
            "--cluster-key=/etc/kubernetes/pki/apiserver.key",
        ];
        let t = run(Binary::ProxyServer, &no_auth, &h).unwrap();
        assert!(pairs(&t).contains(&"--ca /etc/kubernetes/pki/ca.crt".to_string()));
        assert!(t
            .notes
            .iter()
            .any(|n| matches!(n, Note::Warn(s) if s.contains("no --cluster-ca-cert"))));
        // No CA anywhere: refused with the reason.
        let e = run(
            Binary::ProxyServer,
            &[
                "--uds-name=/s",
                "--server-port=0",
                "--cluster-cert=/x/a.crt",
                "--cluster-key=/x/a.key",
            ],
            &FakeHost::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("verifies agents by client certificate"),
            "{e}"
        );
        // Keepalive 0 is grpc-go's 2h; sub-second rounds up.
        let t = run(
            Binary::ProxyServer,
            &[CERTS, &["--keepalive-time=0"]].concat(),
            &host(),
        )
        .unwrap();
        assert!(pairs(&t).contains(&"--keepalive-secs 7200".to_string()));
        let t = run(
            Binary::ProxyServer,
            &[CERTS, &["--keepalive-time=300ms"]].concat(),
            &host(),
        )
        .unwrap();
        assert!(pairs(&t).contains(&"--keepalive-secs 1".to_string()));
        // A TCP frontend (Go's default when --uds-name is empty) is served
        // with TLS and client certificates on server-bind-address:8090.
        let t = run(
            Binary::ProxyServer,
            &[
                "--cluster-cert=/pki/apiserver.crt",
                "--cluster-key=/pki/apiserver.key",
                "--cluster-ca-cert=/pki/ca.crt",
                "--server-ca-cert=/pki/ca.crt",
                "--server-cert=/pki/s.crt",
                "--server-key=/pki/s.key",
            ],
            &host(),
        )
        .unwrap();
        let p = pairs(&t);
        for want in [
            "--grpc-bind 0.0.0.0:8090",
            "--frontend-cert /pki/s.crt",
            "--frontend-key /pki/s.key",
            "--frontend-ca /pki/ca.crt",
        ] {
            assert!(p.contains(&want.to_string()), "{want} in {p:?}");
        }
        assert_clap_accepts(&t);
    }
}
