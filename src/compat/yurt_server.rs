//! OpenYurt's `yurt-tunnel-server` flags (v1.3
//! `cmd/yurt-tunnel-server/app/options/options.go`) as `edgetunnel server`
//! flags, onto edgetunnel's yurt-tunnel features.
//!
//! yurt-tunnel-server always talks to Kubernetes (`--kube-config`, else
//! the in-cluster service account) and always gets its certificates from
//! CertificateSigningRequests into `--cert-dir`
//! (`/var/lib/yurttunnel-server/pki`): so `--kube`, `--cert-mode csr`,
//! `--certs-dir`, with `--cert-dns-names`/`--cert-ips` as `--csr-dns-name`/
//! `--csr-ip` (the Services `x-tunnel-server-svc` and
//! `x-tunnel-server-internal-svc` are edgetunnel's `--csr-service` default,
//! as in yurt-tunnel). The CA that verifies agents is the kubeconfig's
//! `certificate-authority-data` (written to `CERT_DIR/ca.crt` before start)
//! or the service account's `ca.crt`.
//!
//! Listeners: `--bind-address` with `--tunnel-agent-connect-port` (10262)
//! -> `--agent-bind`, with `--secure-port` (10263) ->
//! `--interception-tls-bind` (kubelet certificates not verified, as
//! yurt-tunnel's interceptor does not); `--insecure-bind-address` (empty:
//! loopback of the bind address's family) with `--insecure-port` (10264) ->
//! `--interception-bind`, with `--meta-port` (10265) -> `--admin-bind`.
//! `--enable-iptables` (default true) -> `--iptables` with
//! `--iptables-sync-period-secs`, DNAT to the plain listener's address.
//!
//! `--enable-dns-controller` (default true) publishes the DNS records as
//! yurt-tunnel's controller does (openyurt v1.3
//! `pkg/yurttunnel/trafficforward/dns/dns.go`, `handler.go`, `util.go`):
//! ConfigMap `kube-system/yurt-tunnel-nodes`, key `tunnel-nodes`, sorted
//! `IP<TAB>name` lines, edge nodes (label `openyurt.io/is-edge-worker=true`)
//! at the ClusterIP of `kube-system/x-tunnel-server-internal-svc`, other
//! nodes at their InternalIP (else ExternalIP); one writer elected by the
//! Lease `kube-system/tunnel-dns-controller` (15 s), the lock Go uses, so a
//! Go and an edgetunnel server take turns rather than both write. So:
//! `--dns-configmap`, `--dns-tunnel-service`, `--leader-lease`. Unlike Go,
//! a node with a connected agent also counts as an edge node, and the
//! records follow node and agent changes within a second (a full rewrite
//! at least every 15 s), so `--dns-sync-period` changes nothing. The
//! elected writer also keeps a `dnat-PORT` port on
//! `x-tunnel-server-internal-svc` for each extra proxy port of
//! `yurt-tunnel-server-cfg` (`dns.go` `updateTunnelServerSvcDnatPorts`,
//! `util.go` `GetConfiguredProxyPortsAndMappings`):
//! `--dns-service-dnat-ports`, see `control::dnat_ports`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use super::goflag::Kind;
use super::Conv;
use super::Effect::{self, *};
use super::{flag, invalid, klog, parse_bind_ip, port_str, CompatError, Flag, Host, Out, Prepare};
use crate::compat::goflag::Parsed;

/// yurt-tunnel's DNS records ConfigMap (`YurttunnelDNSRecordConfigMapName`
/// with the project prefix `yurt`, in `kube-system`).
pub const DNS_CONFIGMAP: &str = "kube-system/yurt-tunnel-nodes";
/// The Service whose ClusterIP edge node names resolve to
/// (`YurttunnelServerInternalServiceName`).
pub const DNS_TUNNEL_SERVICE: &str = "kube-system/x-tunnel-server-internal-svc";
/// The Lease electing the one DNS writer (`dns.go` `Run`).
pub const DNS_LEASE: &str = "kube-system/tunnel-dns-controller";

/// `YurttunnelServerCertDir` with the server's name.
pub const DEFAULT_CERT_DIR: &str = "/var/lib/yurttunnel-server/pki";

/// Where a pod's service-account files are (`YurttunnelCAFile`'s
/// directory); `EDGETUNNEL_COMPAT_SERVICEACCOUNT_DIR` overrides it, for
/// running outside a pod.
pub fn serviceaccount_dir(host: &dyn Host) -> PathBuf {
    host.env("EDGETUNNEL_COMPAT_SERVICEACCOUNT_DIR")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/var/run/secrets/kubernetes.io/serviceaccount".to_string())
        .into()
}

const fn f(name: &'static str, kind: Kind, default: &'static str, effect: Effect) -> Flag {
    flag(name, kind, default, effect)
}

/// Every flag of yurt-tunnel-server, with Go's defaults.
pub fn flags() -> Vec<Flag> {
    use Kind::*;
    let mut v = vec![
        f("version", Bool, "false", Version),
        f(
            "kube-config",
            String,
            "",
            Composite("--kube (else in-cluster) and the CA"),
        ),
        f(
            "bind-address",
            String,
            "0.0.0.0",
            Composite("--agent-bind, --interception-tls-bind"),
        ),
        f(
            "insecure-bind-address",
            String,
            "",
            Composite("--interception-bind, --admin-bind"),
        ),
        f("cert-dns-names", String, "", Composite("--csr-dns-name")),
        f("cert-ips", String, "", Composite("--csr-ip")),
        f(
            "cert-dir",
            String,
            "",
            Composite("--certs-dir (default /var/lib/yurttunnel-server/pki)"),
        ),
        f("enable-iptables", Bool, "true", Composite("--iptables")),
        f(
            "iptables-sync-period",
            Int,
            "60",
            Composite("--iptables-sync-period-secs"),
        ),
        f(
            "enable-dns-controller",
            Bool,
            "true",
            Composite("--dns-configmap, --dns-tunnel-service, --leader-lease, --dns-service-dnat-ports"),
        ),
        f(
            "dns-sync-period",
            Int,
            "1800",
            Same("the records follow node and agent changes within a second, and are rewritten in full at least every 15 s"),
        ),
        f(
            "egress-selector-enable",
            Bool,
            "false",
            Composite("refused, as yurt-tunnel refuses it"),
        ),
        f("server-count", Int, "1", To("--server-count", Conv::Text)),
        f(
            "proxy-strategy",
            String,
            "destHost",
            To("--proxy-strategies", Conv::Text),
        ),
        f(
            "tunnel-agent-connect-port",
            String,
            "10262",
            Composite("--agent-bind"),
        ),
        f(
            "secure-port",
            String,
            "10263",
            Composite("--interception-tls-bind"),
        ),
        f(
            "insecure-port",
            String,
            "10264",
            Composite("--interception-bind"),
        ),
        f(
            "meta-port",
            String,
            "10265",
            Composite("--admin-bind (/metrics; no pprof)"),
        ),
    ];
    v.extend(klog::flags("0"));
    v
}

fn loopback(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

/// The composite mappings.
pub fn translate(p: &Parsed, out: &mut Out, host: &dyn Host) -> Result<(), CompatError> {
    if p.bool("egress-selector-enable") {
        // What yurt-tunnel-server answers (anpserver.go runProxier).
        return Err(invalid(
            "fail to run the proxier: DOESN'T SUPPROT EGRESS SELECTOR YET",
        ));
    }
    let bind = parse_bind_ip("bind-address", p.str("bind-address"))?
        .ok_or_else(|| invalid("yurttunnel-server's bind address can't be empty"))?;
    let insecure = parse_bind_ip("insecure-bind-address", p.str("insecure-bind-address"))?
        .unwrap_or_else(|| loopback(bind.is_ipv6()));
    let at = |ip: IpAddr, flag: &str| -> Result<String, CompatError> {
        Ok(SocketAddr::new(ip, port_str(p, flag)?).to_string())
    };
    out.arg("--agent-bind", at(bind, "tunnel-agent-connect-port")?);
    out.arg("--interception-tls-bind", at(bind, "secure-port")?);
    out.arg("--interception-bind", at(insecure, "insecure-port")?);
    out.arg("--admin-bind", at(insecure, "meta-port")?);
    out.switch("--kubelet-insecure-skip-verify");
    // yurt-tunnel-server (ANP underneath) binds no agent to its
    // certificate; edgetunnel server's default binds them.
    out.switch("--bind-agent-identity=false");

    // Kubernetes and certificates.
    let cert_dir = match p.str("cert-dir") {
        "" => PathBuf::from(DEFAULT_CERT_DIR),
        d => PathBuf::from(d),
    };
    out.prepare(Prepare::CreateDir(cert_dir.clone()));
    out.arg("--certs-dir", cert_dir.display().to_string());
    match p.str("kube-config") {
        "" => {
            out.arg("--kube", "in-cluster");
            out.arg(
                "--ca",
                serviceaccount_dir(host)
                    .join("ca.crt")
                    .display()
                    .to_string(),
            );
        }
        kc => {
            let ca = kubeconfig_ca(host, Path::new(kc))?;
            let path = cert_dir.join("ca.crt");
            out.prepare(Prepare::WriteFile {
                path: path.clone(),
                contents: ca,
            });
            out.arg("--kube", kc);
            out.arg("--ca", path.display().to_string());
        }
    }
    out.arg("--cert-mode", "csr");
    for name in p.str("cert-dns-names").split(',').filter(|s| !s.is_empty()) {
        out.arg("--csr-dns-name", name);
    }
    // yurt-tunnel skips what does not parse as an IP.
    for ip in p.str("cert-ips").split(',') {
        if let Ok(ip) = ip.parse::<IpAddr>() {
            out.arg("--csr-ip", ip.to_string());
        }
    }

    // iptables.
    if p.bool("enable-iptables") {
        out.switch("--iptables");
        out.arg(
            "--iptables-sync-period-secs",
            p.int("iptables-sync-period").max(15).to_string(),
        );
        // One DNAT address for every port: the TLS listener's when it has
        // one (10250, the kubelet API, matters most), else the plain one's.
        let dnat = if !bind.is_unspecified() {
            bind
        } else if !insecure.is_unspecified() {
            insecure
        } else {
            loopback(insecure.is_ipv6())
        };
        out.arg("--iptables-dnat-ip", dnat.to_string());
        if !insecure.is_unspecified() && insecure != dnat {
            out.warn(format!(
                "--insecure-bind-address={insecure} differs from --bind-address={bind}: edgetunnel's rules send every intercepted port to {dnat}, so plain-HTTP kubelet ports (10255) reach no listener; give both the same address"
            ));
        }
    } else if p.is_set("iptables-sync-period") {
        out.info("accepted: --iptables-sync-period: unused, as --enable-iptables=false");
    }
    if p.bool("enable-dns-controller") {
        out.arg("--dns-configmap", DNS_CONFIGMAP);
        out.arg("--dns-tunnel-service", DNS_TUNNEL_SERVICE);
        out.arg("--leader-lease", DNS_LEASE);
        out.switch("--dns-service-dnat-ports");
    }
    Ok(())
}

/// The CA of the kubeconfig's current cluster, as `GenRootCertPool` takes
/// it (only `certificate-authority-data`).
fn kubeconfig_ca(host: &dyn Host, path: &Path) -> Result<Vec<u8>, CompatError> {
    let text = host
        .read(path)
        .map_err(|e| invalid(format!("reading --kube-config {}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&text);
    let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| {
        invalid(format!(
            "failed to load the kubeconfig file({}), {e}",
            path.display()
        ))
    })?;
    let shown = path.display();
    let current = kc
        .current_context
        .filter(|c| !c.is_empty())
        .ok_or_else(|| invalid(format!("'current context' is not set in {shown}")))?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| {
            invalid(format!(
                "'current context({current})' is not found in {shown}"
            ))
        })?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| {
            invalid(format!(
                "'cluster({})' is not found in {shown}",
                ctx.cluster
            ))
        })?;
    let data = cluster
        .certificate_authority_data
        .as_deref()
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            invalid(format!(
                "'certificate authority data of the cluster({}) is not set in {shown}",
                ctx.cluster
            ))
        })?;
    base64_decode(data).ok_or_else(|| {
        invalid(format!(
            "certificate-authority-data of the cluster({}) in {shown} is not base64",
            ctx.cluster
        ))
    })
}

/// Standard base64, read leniently as before: whitespace anywhere is
/// ignored, padding is optional and the first `=` ends the data, non-zero
/// trailing bits are kept out of the output, and a last lone symbol (6 bits,
/// no whole byte) gives nothing; a byte outside the alphabet before the
/// first `=` refuses the text.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
    use base64::engine::DecodePaddingMode;
    use base64::Engine as _;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    let mut symbols: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace())
        .take_while(|&c| c != b'=')
        .collect();
    if !symbols
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
    {
        return None;
    }
    if symbols.len() % 4 == 1 {
        symbols.pop();
    }
    LENIENT.decode(symbols).ok()
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{Binary, Prepare};
    use super::*;

    fn host() -> FakeHost {
        FakeHost::default()
    }

    #[test]
    fn go_defaults_when_flags_are_absent() {
        let t = run(Binary::YurtTunnelServer, &[], &host()).unwrap();
        assert_eq!(
            pairs(&t),
            [
                "--server-count 1",
                "--proxy-strategies destHost",
                "--agent-bind 0.0.0.0:10262",
                "--interception-tls-bind 0.0.0.0:10263",
                "--interception-bind 127.0.0.1:10264",
                "--admin-bind 127.0.0.1:10265",
                "--kubelet-insecure-skip-verify",
                "--bind-agent-identity=false",
                "--certs-dir /var/lib/yurttunnel-server/pki",
                "--kube in-cluster",
                "--ca /var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                "--cert-mode csr",
                "--iptables",
                "--iptables-sync-period-secs 60",
                "--iptables-dnat-ip 127.0.0.1",
                "--dns-configmap kube-system/yurt-tunnel-nodes",
                "--dns-tunnel-service kube-system/x-tunnel-server-internal-svc",
                "--leader-lease kube-system/tunnel-dns-controller",
                "--dns-service-dnat-ports",
            ]
        );
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        assert_eq!(t.prepare, [Prepare::CreateDir(DEFAULT_CERT_DIR.into())]);
        assert_clap_accepts(&t);
    }

    #[test]
    fn every_flag() {
        use Expect::*;
        let kubeconfig = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0EK\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user: {}\n";
        let h = host().with_file("/etc/kubernetes/admin.conf", kubeconfig.as_bytes());
        let cases: &[(&[&str], Expect)] = &[
            (&["--version=false"], Maps(&[])),
            (
                &["--kube-config=/etc/kubernetes/admin.conf"],
                Maps(&[
                    "--kube /etc/kubernetes/admin.conf",
                    "--ca /var/lib/yurttunnel-server/pki/ca.crt",
                ]),
            ),
            (
                &["--kube-config=/missing"],
                Fails("reading --kube-config /missing"),
            ),
            (
                &["--bind-address=10.0.0.2"],
                MapsWarn(
                    &[
                        "--agent-bind 10.0.0.2:10262",
                        "--interception-tls-bind 10.0.0.2:10263",
                        "--iptables-dnat-ip 10.0.0.2",
                    ],
                    "plain-HTTP kubelet ports (10255) reach no listener",
                ),
            ),
            (&["--bind-address="], Fails("bind address can't be empty")),
            (
                &["--insecure-bind-address=10.0.0.2"],
                Maps(&[
                    "--interception-bind 10.0.0.2:10264",
                    "--admin-bind 10.0.0.2:10265",
                    "--iptables-dnat-ip 10.0.0.2",
                ]),
            ),
            (
                &["--cert-dns-names=tunnel.example,x-tunnel"],
                Maps(&["--csr-dns-name tunnel.example", "--csr-dns-name x-tunnel"]),
            ),
            (
                &["--cert-ips=10.0.0.2,bogus,::1"],
                Maps(&["--csr-ip 10.0.0.2", "--csr-ip ::1"]),
            ),
            (&["--cert-dir=/tmp/pki"], Maps(&["--certs-dir /tmp/pki"])),
            (&["--enable-iptables=false"], Maps(&[])),
            (
                &["--iptables-sync-period=120"],
                Maps(&["--iptables-sync-period-secs 120"]),
            ),
            (&["--enable-dns-controller=false"], Maps(&[])),
            (&["--dns-sync-period=600"], Same),
            (
                &["--egress-selector-enable"],
                Fails("DOESN'T SUPPROT EGRESS SELECTOR YET"),
            ),
            (&["--server-count=2"], Maps(&["--server-count 2"])),
            (
                &["--proxy-strategy=default"],
                Maps(&["--proxy-strategies default"]),
            ),
            (
                &["--tunnel-agent-connect-port=31008"],
                Maps(&["--agent-bind 0.0.0.0:31008"]),
            ),
            (
                &["--tunnel-agent-connect-port=tcp"],
                Fails("not a TCP port number"),
            ),
            (
                &["--secure-port=443"],
                Maps(&["--interception-tls-bind 0.0.0.0:443"]),
            ),
            (
                &["--insecure-port=80"],
                Maps(&["--interception-bind 127.0.0.1:80"]),
            ),
            (
                &["--meta-port=9090"],
                Maps(&["--admin-bind 127.0.0.1:9090"]),
            ),
            (&["--v=2"], Maps(&["--log info"])),
            (&["--vmodule=dns=4"], NoEffect),
            (&["--logtostderr=true"], Maps(&[])),
            (
                &["--logtostderr=false", "--log-file=/var/log/tunnel.log"],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/tunnel.log",
                    "--log-stderr-threshold error",
                ]),
            ),
            (
                &[
                    "--logtostderr=false",
                    "--log-file=/var/log/tunnel.log",
                    "--alsologtostderr",
                ],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/tunnel.log",
                    "--log-stderr-threshold all",
                ]),
            ),
            (
                &[
                    "--logtostderr=false",
                    "--log-file=/var/log/tunnel.log",
                    "--stderrthreshold=WARNING",
                ],
                Maps(&[
                    "--log-format klog",
                    "--log-file /var/log/tunnel.log",
                    "--log-stderr-threshold warn",
                ]),
            ),
            (&["--alsologtostderr"], Same),
            (&["--log_file=/var/log/tunnel.log"], Same),
            (&["--log_dir=/var/log"], Same),
            (&["--log_file_max_size=10"], Same),
            (&["--stderrthreshold=ERROR"], Same),
            (&["--alsologtostderrthreshold=ERROR"], Same),
            (&["--legacy_stderr_threshold_behavior=false"], NoEffect),
            (&["--add_dir_header"], NoEffect),
            (&["--skip_headers"], NoEffect),
            (&["--skip_log_headers"], NoEffect),
            (&["--one_output"], NoEffect),
            (&["--log_backtrace_at=dns.go:1"], NoEffect),
        ];
        check_table(Binary::YurtTunnelServer, &[], &h, cases);
        let t = run(
            Binary::YurtTunnelServer,
            &["--kube-config=/etc/kubernetes/admin.conf"],
            &h,
        )
        .unwrap();
        assert!(t.prepare.contains(&Prepare::WriteFile {
            path: "/var/lib/yurttunnel-server/pki/ca.crt".into(),
            contents: b"CA\n".to_vec()
        }));
        let no_ca = "apiVersion: v1\nclusters:\n- name: c\n  cluster:\n    server: http://x\ncontexts:\n- name: x\n  context:\n    cluster: c\ncurrent-context: x\n";
        let h = host().with_file("/kc", no_ca.as_bytes());
        let e = run(Binary::YurtTunnelServer, &["--kube-config=/kc"], &h).unwrap_err();
        assert!(
            e.to_string()
                .contains("certificate authority data of the cluster(c) is not set"),
            "{e}"
        );
    }

    #[test]
    fn the_last_chart_arguments() {
        // charts/openyurt/templates/yurt-tunnel-server.yaml (v1.1.1), with
        // $(NODE_IP) = 192.168.0.10 and the chart's empty cert parameters.
        let t = run(
            Binary::YurtTunnelServer,
            &[
                "--bind-address=192.168.0.10",
                "--insecure-bind-address=192.168.0.10",
                "--proxy-strategy=destHost",
                "--cert-dns-names=",
                "--cert-ips=",
                "--v=2",
            ],
            &host(),
        )
        .unwrap();
        let got = pairs(&t);
        for want in [
            "--agent-bind 192.168.0.10:10262",
            "--interception-tls-bind 192.168.0.10:10263",
            "--interception-bind 192.168.0.10:10264",
            "--admin-bind 192.168.0.10:10265",
            "--iptables",
            "--iptables-dnat-ip 192.168.0.10",
            "--log info",
        ] {
            assert!(got.contains(&want.to_string()), "{want} not in {got:?}");
        }
        // The wildcard plain listener: rules DNAT to the bind address.
        let t = run(
            Binary::YurtTunnelServer,
            &["--bind-address=10.0.0.2", "--insecure-bind-address=0.0.0.0"],
            &host(),
        )
        .unwrap();
        assert!(pairs(&t).contains(&"--iptables-dnat-ip 10.0.0.2".to_string()));
        // IPv6 bind: the plain listener on ::1.
        let t = run(
            Binary::YurtTunnelServer,
            &["--bind-address=fd00::2"],
            &host(),
        )
        .unwrap();
        assert!(pairs(&t).contains(&"--interception-bind [::1]:10264".to_string()));
        // No iptables: the period is unused, and said so.
        let t = run(
            Binary::YurtTunnelServer,
            &["--enable-iptables=false", "--iptables-sync-period=30"],
            &host(),
        )
        .unwrap();
        assert!(!pairs(&t).iter().any(|x| x.starts_with("--iptables")));
        assert!(t.notes.iter().any(
            |n| matches!(n, super::super::Note::Info(s) if s.contains("--iptables-sync-period"))
        ));
        // Positional arguments: cobra.NoArgs.
        let e = run(Binary::YurtTunnelServer, &["start"], &host()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown command \"start\" for \"yurt-tunnel-server\""
        );
    }

    #[test]
    fn base64() {
        assert_eq!(base64_decode("Q0EK").unwrap(), b"CA\n");
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVs\nbG8").unwrap(), b"hello");
        assert!(base64_decode("a*b").is_none());
        // The lenient edges the hand-written decoder had, kept with the
        // crate: no padding, text after the first `=` ignored, non-zero
        // trailing bits dropped, a lone last symbol giving nothing,
        // whitespace of every kind, and the standard (not URL) alphabet.
        assert_eq!(base64_decode("YWI").unwrap(), b"ab");
        assert_eq!(base64_decode("Q0EK=*junk").unwrap(), b"CA\n");
        assert_eq!(base64_decode("YWJ").unwrap(), b"ab");
        assert_eq!(base64_decode("QUJDR").unwrap(), b"ABC");
        assert_eq!(base64_decode("Q").unwrap(), b"");
        assert!(base64_decode("QUJD*").is_none());
        assert_eq!(base64_decode(" Q0\tEK\r\n").unwrap(), b"CA\n");
        assert_eq!(base64_decode("+/8=").unwrap(), [0xfb, 0xff]);
        assert!(base64_decode("-_8").is_none());
        assert_eq!(base64_decode("").unwrap(), b"");
    }
}
