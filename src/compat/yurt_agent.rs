//! OpenYurt's `yurt-tunnel-agent` flags (v1.3
//! `cmd/yurt-tunnel-agent/app/options/options.go`) as `edgetunnel agent`
//! flags.
//!
//! - `--node-name` (else `NODE_NAME`) -> `--agent-id`; `--node-ip` (else
//!   `NODE_IP`) goes into the default identifiers `ipv4=IP&host=NAME`
//!   (`ipv6=` for an IPv6 address); both are required, as in Go.
//!   `--agent-identifiers` is written as yurt-tunnel validates it, a comma
//!   list of `type=value` (`host=n1,ipv4=10.0.0.5`), and handed on in the
//!   query form ANP's protocol carries (`host=n1&ipv4=10.0.0.5`).
//! - `--tunnelserver-addr` -> `--server-addr`. When empty, the address comes
//!   from the `kube-system/x-tunnel-server-svc` Service at start
//!   (`--server-service`, `control::tunnel_addr`), as yurt-tunnel's
//!   `serveraddr.GetTunnelServerAddr` finds it.
//! - Certificates always come from a CSR (`--cert-mode csr`, CN
//!   `tunnel-agent-client`) into `--cert-dir`
//!   (`/var/lib/yurttunnel-agent/pki`), through `--kube-config` (default
//!   `/etc/kubernetes/kubelet.conf`); the server is verified against the
//!   service account's `ca.crt`, as yurt-tunnel does.
//! - `--meta-host:--meta-port` (loopback, 10266: metrics, and pprof in Go)
//!   -> `--admin-bind`. `--apiserver-addr` has no effect yet.
//! - yurt-tunnel-server dials its `localhost-proxy-ports` (10266, 10267)
//!   on the node's 127.0.0.1 (edgetunnel's server: `--localhost-proxy-ports`),
//!   which edgetunnel's agent refuses by default: the translation adds
//!   `--allow-destinations` [`YURT_ALLOW`], every address the default
//!   policy allows plus those loopback ports.

use std::path::PathBuf;

use super::goflag::Kind;
use super::Effect::{self, *};
use super::{flag, invalid, klog, CompatError, Flag, Host, Out, Prepare};
use crate::compat::goflag::Parsed;

/// Where yurt-tunnel-agent looks its server up without
/// `--tunnelserver-addr` (`YurttunnelServerServiceNs`/`...ServiceName`).
pub const TUNNEL_SERVER_SERVICE: &str = crate::control::tunnel_addr::DEFAULT_SERVICE;

/// `YurttunnelAgentCertDir` with the agent's name.
pub const DEFAULT_CERT_DIR: &str = "/var/lib/yurttunnel-agent/pki";
/// What a yurt-tunnel agent may dial: everything edgetunnel's default
/// policy allows (`0.0.0.0/0` and `::/0` do not lift the loopback and
/// link-local refusals), plus the server's default localhost-proxy ports.
pub const YURT_ALLOW: &str = "0.0.0.0/0,::/0,127.0.0.1/32:10266-10267";

/// yurt-tunnel-agent's kubeconfig when neither `--kube-config` nor
/// `--apiserver-addr` is given.
pub const DEFAULT_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";

const fn f(name: &'static str, kind: Kind, default: &'static str, effect: Effect) -> Flag {
    flag(name, kind, default, effect)
}

/// Every flag of yurt-tunnel-agent, with Go's defaults.
pub fn flags() -> Vec<Flag> {
    use Kind::*;
    let mut v = vec![
        f("version", Bool, "false", Version),
        f(
            "node-name",
            String,
            "",
            Composite("--agent-id and the default identifiers (else NODE_NAME)"),
        ),
        f(
            "node-ip",
            String,
            "",
            Composite("the default identifiers (else NODE_IP)"),
        ),
        f("tunnelserver-addr", String, "", Composite("--server-addr")),
        f(
            "apiserver-addr",
            String,
            "",
            Composite("nothing: edgetunnel reaches Kubernetes through a kubeconfig"),
        ),
        f(
            "kube-config",
            String,
            "",
            Composite("--kube (default /etc/kubernetes/kubelet.conf)"),
        ),
        f(
            "agent-identifiers",
            String,
            "",
            Composite("--agent-identifiers (commas become &)"),
        ),
        f(
            "meta-host",
            String,
            "",
            Composite("--admin-bind (empty: loopback of --node-ip's family)"),
        ),
        f(
            "meta-port",
            String,
            "10266",
            Composite("--admin-bind (/metrics; no pprof)"),
        ),
        f(
            "cert-dir",
            String,
            "",
            Composite("--certs-dir (default /var/lib/yurttunnel-agent/pki)"),
        ),
    ];
    v.extend(klog::flags("0"));
    v
}

/// The composite mappings and Go's validation (`Validate`, `Config`).
pub fn translate(p: &Parsed, out: &mut Out, host: &dyn Host) -> Result<(), CompatError> {
    let from_env = |flag: &str, env: &str| -> Option<String> {
        match p.str(flag) {
            "" => host.env(env).filter(|s| !s.is_empty()),
            v => Some(v.to_string()),
        }
    };
    let node = from_env("node-name", "NODE_NAME")
        .ok_or_else(|| invalid("either --node-name or $NODE_NAME has to be set"))?;
    let ip = from_env("node-ip", "NODE_IP")
        .ok_or_else(|| invalid("either --node-ip or $NODE_IP has to be set"))?;
    let ids = match p.str("agent-identifiers") {
        "" => {
            let family = if ip.contains(':') { "ipv6" } else { "ipv4" };
            format!("{family}={ip}&host={node}")
        }
        given => {
            for entry in given.split(',') {
                let parts: Vec<&str> = entry.split('=').collect();
                let ok = parts.len() == 2
                    && matches!(parts[0], "host" | "cidr" | "ipv4" | "ipv6" | "uid");
                if !ok {
                    return Err(invalid(
                        "--agent-identifiers are invalid, format should be host={node-name}",
                    ));
                }
            }
            // `uid` passes yurt-tunnel's check, but ANP's server ignores
            // it (`proto/header/header.go` `GenAgentIdentifiers`) and
            // edgetunnel's agent refuses unknown keys: not sent.
            let (uids, kept): (Vec<&str>, Vec<&str>) =
                given.split(',').partition(|e| e.starts_with("uid="));
            if !uids.is_empty() {
                out.info(format!(
                    "accepted: --agent-identifiers {}: not sent, as ANP's server ignores uid identifiers",
                    uids.join(",")
                ));
            }
            kept.join("&")
        }
    };
    match p.str("tunnelserver-addr") {
        // Looked up at start, as yurt-tunnel-agent's `Run` does.
        "" => out.arg("--server-service", TUNNEL_SERVER_SERVICE),
        server => out.arg("--server-addr", server),
    }
    out.arg("--agent-id", node);
    out.arg("--agent-identifiers", ids);

    let cert_dir = match p.str("cert-dir") {
        "" => PathBuf::from(DEFAULT_CERT_DIR),
        d => PathBuf::from(d),
    };
    out.prepare(Prepare::CreateDir(cert_dir.clone()));
    out.arg("--certs-dir", cert_dir.display().to_string());
    out.arg(
        "--ca",
        super::yurt_server::serviceaccount_dir(host)
            .join("ca.crt")
            .display()
            .to_string(),
    );
    out.arg("--cert-mode", "csr");
    let kubeconfig = match (p.str("kube-config"), p.str("apiserver-addr")) {
        ("", "") => DEFAULT_KUBECONFIG.to_string(),
        ("", addr) => {
            out.warn(format!(
                "accepted, no effect: --apiserver-addr={addr}: edgetunnel reaches Kubernetes through a kubeconfig; using {DEFAULT_KUBECONFIG}"
            ));
            DEFAULT_KUBECONFIG.to_string()
        }
        (kc, addr) => {
            if !addr.is_empty() {
                out.info(format!(
                    "accepted: --apiserver-addr={addr}: unused, as --kube-config wins in yurt-tunnel too"
                ));
            }
            kc.to_string()
        }
    };
    out.arg("--kube", kubeconfig);
    let meta_ip =
        super::parse_bind_ip("meta-host", p.str("meta-host"))?.unwrap_or(if ip.contains(':') {
            std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        } else {
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        });
    out.arg(
        "--admin-bind",
        std::net::SocketAddr::new(meta_ip, super::port_str(p, "meta-port")?).to_string(),
    );
    out.arg("--allow-destinations", YURT_ALLOW);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{Binary, Prepare};
    use super::*;

    fn host() -> FakeHost {
        FakeHost::default()
    }

    const BASE: &[&str] = &[
        "--node-name=edge-1",
        "--node-ip=10.0.0.5",
        "--tunnelserver-addr=tunnel.example:10262",
    ];

    #[test]
    fn go_defaults_when_flags_are_absent() {
        let t = run(Binary::YurtTunnelAgent, BASE, &host()).unwrap();
        assert_eq!(
            pairs(&t),
            [
                "--server-addr tunnel.example:10262",
                "--agent-id edge-1",
                "--agent-identifiers ipv4=10.0.0.5&host=edge-1",
                "--certs-dir /var/lib/yurttunnel-agent/pki",
                "--ca /var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                "--cert-mode csr",
                "--kube /etc/kubernetes/kubelet.conf",
                "--admin-bind 127.0.0.1:10266",
                "--allow-destinations 0.0.0.0/0,::/0,127.0.0.1/32:10266-10267",
            ]
        );
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        assert_eq!(t.prepare, [Prepare::CreateDir(DEFAULT_CERT_DIR.into())]);
        assert_clap_accepts(&t);
    }

    #[test]
    fn every_flag() {
        use Expect::*;
        let cases: &[(&[&str], Expect)] = &[
            (&["--version=false"], Maps(&[])),
            (
                &["--node-name=edge-2"],
                Maps(&[
                    "--agent-id edge-2",
                    "--agent-identifiers ipv4=10.0.0.5&host=edge-2",
                ]),
            ),
            (
                &["--node-ip=fd00::5"],
                Maps(&[
                    "--agent-identifiers ipv6=fd00::5&host=edge-1",
                    "--admin-bind [::1]:10266",
                ]),
            ),
            (
                &["--tunnelserver-addr=10.0.0.2:31008"],
                Maps(&["--server-addr 10.0.0.2:31008"]),
            ),
            (
                &["--tunnelserver-addr="],
                Maps(&["--server-service kube-system/x-tunnel-server-svc"]),
            ),
            (&["--apiserver-addr=https://10.0.0.1:6443"], NoEffect),
            (
                &["--kube-config=/etc/kubernetes/kubeconfig"],
                Maps(&["--kube /etc/kubernetes/kubeconfig"]),
            ),
            (
                &["--agent-identifiers=host=edge-1,ipv4=10.0.0.5"],
                Maps(&["--agent-identifiers host=edge-1&ipv4=10.0.0.5"]),
            ),
            (
                &["--agent-identifiers=ipv4=10.0.0.5&host=edge-1"],
                Fails("--agent-identifiers are invalid"),
            ),
            (
                &["--agent-identifiers=host=edge-1,uid=42"],
                Maps(&["--agent-identifiers host=edge-1"]),
            ),
            (
                &["--agent-identifiers=zone=a"],
                Fails("--agent-identifiers are invalid"),
            ),
            (
                &["--meta-host=0.0.0.0"],
                Maps(&["--admin-bind 0.0.0.0:10266"]),
            ),
            (
                &["--meta-port=9999"],
                Maps(&["--admin-bind 127.0.0.1:9999"]),
            ),
            (&["--meta-port=metrics"], Fails("not a TCP port number")),
            (
                &["--cert-dir=/tmp/agent-pki"],
                Maps(&["--certs-dir /tmp/agent-pki"]),
            ),
            (&["--v=6"], Maps(&["--log info,edgetunnel=debug"])),
            (&["--vmodule=agent=4"], NoEffect),
            (&["--logtostderr=true"], Maps(&[])),
            (
                &["--logtostderr=false", "--log-file=/var/log/a.log"],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/a.log",
                    "--log-stderr-threshold error",
                ]),
            ),
            (
                &[
                    "--logtostderr=false",
                    "--log-file=/var/log/a.log",
                    "--alsologtostderr",
                ],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/a.log",
                    "--log-stderr-threshold all",
                ]),
            ),
            (
                &[
                    "--logtostderr=false",
                    "--log-file=/var/log/a.log",
                    "--stderrthreshold=WARNING",
                ],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/a.log",
                    "--log-stderr-threshold warn",
                ]),
            ),
            (&["--alsologtostderr"], Same),
            (&["--log_file=/var/log/a.log"], Same),
            (&["--log-dir=/var/log"], Same),
            (&["--log_file_max_size=1"], Same),
            (&["--stderrthreshold=WARNING"], Same),
            (&["--alsologtostderrthreshold=WARNING"], Same),
            (&["--legacy_stderr_threshold_behavior=false"], NoEffect),
            (&["--add_dir_header"], NoEffect),
            (&["--skip_headers"], NoEffect),
            (&["--skip_log_headers"], NoEffect),
            (&["--one_output"], NoEffect),
            (&["--log_backtrace_at=agent.go:1"], NoEffect),
        ];
        check_table(Binary::YurtTunnelAgent, BASE, &host(), cases);
    }

    #[test]
    fn environment_fallbacks_and_required_values() {
        let h = host()
            .with_env("NODE_NAME", "edge-9")
            .with_env("NODE_IP", "10.0.0.9")
            .with_env("EDGETUNNEL_COMPAT_SERVICEACCOUNT_DIR", "/tmp/sa");
        // The newest chart (openyurt PR 2605) passes only the server.
        let t = run(
            Binary::YurtTunnelAgent,
            &["--tunnelserver-addr=x-tunnel-server-svc.kube-system.svc:10262"],
            &h,
        )
        .unwrap();
        let got = pairs(&t);
        assert!(got.contains(&"--agent-id edge-9".to_string()), "{got:?}");
        assert!(got.contains(&"--agent-identifiers ipv4=10.0.0.9&host=edge-9".to_string()));
        assert!(got.contains(&"--ca /tmp/sa/ca.crt".to_string()));
        assert_eq!(
            run(
                Binary::YurtTunnelAgent,
                &["--tunnelserver-addr=x:1"],
                &host()
            )
            .unwrap_err()
            .to_string(),
            "either --node-name or $NODE_NAME has to be set"
        );
        assert_eq!(
            run(
                Binary::YurtTunnelAgent,
                &["--tunnelserver-addr=x:1", "--node-name=n"],
                &host()
            )
            .unwrap_err()
            .to_string(),
            "either --node-ip or $NODE_IP has to be set"
        );
    }
}
