//! The anchors: systems that do the same work as an edgetunnel tunnel
//! (four sockets, mutual TLS between the halves), so that a ratio against
//! them measures how well the work is done rather than how much of it
//! there is.
//!
//! - `haproxy-tls-pair` and `stunnel-pair`: a cloud relay that takes the
//!   client's plain connection and originates mutual TLS 1.3 to an edge
//!   relay that terminates it and connects to the target, one port pair
//!   per target (as plain haproxy: no CONNECT, a port per target);
//! - `anp-uds` and `anp-tcp`: the real Go ANP proxy-server (http-connect
//!   mode; unix socket frontend, or TCP frontend which Go serves with
//!   mutual TLS only) and proxy-agent (mutual TLS to the server), found
//!   as the tests find them (`EDGETUNNEL_PEERS`, else `../shared/peers`
//!   beside the repository, unpacked into `target/peers`).
//!
//! Every anchor uses the certificates `edgetunnel certs init` makes for
//! edgetunnel's own agent link (CA, server, agent and proxy-client), and
//! the pairs the cipher suite rustls picks first for that link
//! (TLS_AES_128_GCM_SHA256, crates/engine/src/tls.rs); Go's crypto/tls picks the
//! same on processors with AES instructions.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use super::{
    fd_fit, find_tool, free_ports, run_tool, tcp_entries, Limit, Ready, Recipe, RestartHow,
    Running, StartOptions,
};
use crate::client::Entry;
use crate::model::SystemKind;

// The pair's configurations, shared with the WAN bench.
#[path = "../../shared/haproxy_pair.rs"]
mod haproxy_pair;
use haproxy_pair::SUITE;

/// The gauge of ANP's server that counts connected agents
/// (pkg/server/metrics/metrics.go, `ready_backend_connections`).
pub(super) const ANP_READY: &str = "konnectivity_network_proxy_server_ready_backend_connections";

/// `edgetunnel certs init` into `<scratch>/certs` (agent name `bench`):
/// ca.crt, server.{crt,key}, agent.{crt,key}, proxy-client.{crt,key}.
pub(super) fn certs(run: &Running, opts: &StartOptions) -> Result<PathBuf, String> {
    let dir = run.dir().join("certs");
    run_tool(
        Command::new(&opts.edgetunnel_bin)
            .args(["certs", "init"])
            .arg(&dir)
            .args(["--agent-name", "bench"]),
    )?;
    Ok(dir)
}

/// The haproxy pair: `haproxy-edge` listens with TLS on one port per
/// target (server certificate, client certificates required from the CA,
/// TLS 1.3 and [`SUITE`] only) and connects to the target in clear;
/// `haproxy-cloud` listens in clear on one port per target and connects
/// to its edge port with TLS (agent certificate, the edge's certificate
/// checked against the CA and the name `localhost`). TCP mode, timeouts
/// 1 h, `maxconn` as plain haproxy; haproxy's default TLS session cache
/// resumes sessions between the two.
pub(super) fn start_haproxy_tls_pair(
    run: &mut Running,
    targets: &[SocketAddr],
    opts: &StartOptions,
) -> Result<(), String> {
    let haproxy = find_tool("haproxy")?;
    let fit = fd_fit("haproxy-tls-pair", opts.max_conns, 2, Limit::Hard)?;
    let maxconn = (opts.max_conns + super::CONN_MARGIN).min(fit);
    let certs = haproxy_pair::PairCerts::bundle(&certs(run, opts)?)?;
    let ports = free_ports(2 * targets.len())?;
    let (cloud_ports, edge_ports) = ports.split_at(targets.len());
    let routes: Vec<haproxy_pair::Route> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| haproxy_pair::Route {
            cloud_bind: format!("127.0.0.1:{}", cloud_ports[i]),
            edge_addr: format!("127.0.0.1:{}", edge_ports[i]),
            edge_bind: format!("127.0.0.1:{}", edge_ports[i]),
            target: t.to_string(),
        })
        .collect();
    let (edge, cloud) = haproxy_pair::configs(maxconn, &routes, &certs);
    for (name, cfg, ports) in [
        ("haproxy-edge", edge, edge_ports),
        ("haproxy-cloud", cloud, cloud_ports),
    ] {
        let path = run.dir().join(format!("{name}.cfg"));
        std::fs::write(&path, cfg).map_err(|e| format!("{name}: writing its config: {e}"))?;
        let mut cmd = Command::new(&haproxy);
        cmd.arg("-db").arg("-f").arg(&path);
        run.spawn(name, &mut cmd, false)?;
        run.wait_listening(ports)?;
    }
    run.entries = tcp_entries(cloud_ports);
    Ok(())
}

/// The stunnel pair, laid out as the haproxy pair: `stunnel-edge`
/// terminates TLS (server certificate, client certificate required,
/// `verifyChain`), `stunnel-cloud` originates it (agent certificate, the
/// edge checked against the CA and `localhost`); TLS 1.3 and [`SUITE`]
/// only, foreground, no logging below errors.
pub(super) fn start_stunnel_pair(
    run: &mut Running,
    targets: &[SocketAddr],
    opts: &StartOptions,
) -> Result<(), String> {
    let stunnel = find_tool("stunnel")?;
    fd_fit("stunnel-pair", opts.max_conns, 2, Limit::Soft)?;
    let certs = certs(run, opts)?;
    let ca = certs.join("ca.crt");
    let ports = free_ports(2 * targets.len())?;
    let (cloud_ports, edge_ports) = ports.split_at(targets.len());
    let head = "foreground = yes\npid =\ndebug = 3\nsyslog = no\n\n";
    let (mut edge, mut cloud) = (head.to_string(), head.to_string());
    for (i, t) in targets.iter().enumerate() {
        let tls = |side: &str| {
            format!(
                "cert = {}\nkey = {}\nCAfile = {}\nverifyChain = yes\n\
                 sslVersionMin = TLSv1.3\nciphersuites = {SUITE}\n",
                certs.join(format!("{side}.crt")).display(),
                certs.join(format!("{side}.key")).display(),
                ca.display()
            )
        };
        edge.push_str(&format!(
            "[e{i}]\naccept = 127.0.0.1:{}\nconnect = {t}\n{}\n",
            edge_ports[i],
            tls("server")
        ));
        cloud.push_str(&format!(
            "[c{i}]\nclient = yes\naccept = 127.0.0.1:{}\nconnect = 127.0.0.1:{}\n\
             checkHost = localhost\nsni = localhost\n{}\n",
            cloud_ports[i],
            edge_ports[i],
            tls("agent")
        ));
    }
    for (name, cfg, ports) in [
        ("stunnel-edge", edge, edge_ports),
        ("stunnel-cloud", cloud, cloud_ports),
    ] {
        let path = run.dir().join(format!("{name}.conf"));
        std::fs::write(&path, cfg).map_err(|e| format!("{name}: writing its config: {e}"))?;
        let mut cmd = Command::new(&stunnel);
        cmd.arg(&path);
        run.spawn(name, &mut cmd, false)?;
        run.wait_listening(ports)?;
    }
    run.entries = tcp_entries(cloud_ports);
    Ok(())
}

/// The directory of the real peers' binaries: `EDGETUNNEL_PEERS`, else
/// `../shared/peers` beside the repository; a folder with an `unpack`
/// script (the shared one) is unpacked into `target/peers` first, once
/// per run, as tests/support/peer_bins.rs does. Err says why not.
pub(crate) fn peers_dir() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = match std::env::var_os("EDGETUNNEL_PEERS") {
            Some(d) => PathBuf::from(d),
            None => {
                let shared = repo.join("../shared/peers");
                if !shared.is_dir() {
                    return Err(
                        "not run: no peers (set EDGETUNNEL_PEERS to the real peers' folder, \
                         or put it at ../shared/peers beside the repository)"
                            .to_string(),
                    );
                }
                shared
            }
        };
        let bins = if dir.join("unpack").is_file() {
            let into = repo.join("target/peers");
            run_tool(Command::new(dir.join("unpack")).arg(&into))?;
            into
        } else {
            dir
        };
        for b in ["anp-server", "anp-agent"] {
            if !super::is_executable(&bins.join(b)) {
                return Err(format!("not run: no peers ({} has no {b})", bins.display()));
            }
        }
        Ok(bins)
    })
    .clone()
}

/// ANP's Go server in http-connect mode (frontend on a unix socket for
/// `anp-uds`, on TCP with mutual TLS for `anp-tcp`), its agent port and
/// the agent's mutual TLS with the `certs init` server certificate, and
/// one Go agent (`certs init` agent certificate); both at `-v=0` (errors
/// only), server keepalive 1 h (agents' pings under 30 s are refused:
/// `too_many_pings`). Flags as tests/peers/go_server.rs and go_agent.rs
/// run them. Ready when the frontend listens and the server's
/// [`ANP_READY`] gauge counts the agent.
pub(super) fn start_anp(
    run: &mut Running,
    targets: &[SocketAddr],
    opts: &StartOptions,
) -> Result<(), String> {
    let bins = peers_dir()?;
    let certs = certs(run, opts)?;
    let c = |f: &str| certs.join(f).display().to_string();
    let tcp = run.kind == SystemKind::AnpTcp;
    let grpc = run.kind == SystemKind::AnpGrpc;
    let ports = free_ports(4)?;
    let (agent, admin, health, frontend) = (ports[0], ports[1], ports[2], ports[3]);
    let uds = run.dir().join("konnectivity-server.socket");
    let mode = if grpc { "grpc" } else { "http-connect" };
    let mut args = vec![
        format!("--mode={mode}"),
        format!("--cluster-cert={}", c("server.crt")),
        format!("--cluster-key={}", c("server.key")),
        format!("--cluster-ca-cert={}", c("ca.crt")),
        "--agent-bind-address=127.0.0.1".into(),
        format!("--agent-port={agent}"),
        format!("--admin-port={admin}"),
        "--health-bind-address=127.0.0.1".into(),
        format!("--health-port={health}"),
        "--keepalive-time=1h".into(),
        format!("-v={}", anp_verbosity()),
    ];
    if tcp {
        args.extend([
            "--server-bind-address=127.0.0.1".to_string(),
            format!("--server-port={frontend}"),
            format!("--server-cert={}", c("server.crt")),
            format!("--server-key={}", c("server.key")),
            format!("--server-ca-cert={}", c("ca.crt")),
        ]);
    } else {
        args.extend([
            format!("--uds-name={}", uds.display()),
            "--server-port=0".to_string(),
        ]);
    }
    let mut cmd = Command::new(bins.join("anp-server"));
    cmd.args(&args).env_remove("PROXY_SERVER_ID");
    run.spawn("anp-server", &mut cmd, false)?;
    run.set_metrics("anp-server", SocketAddr::from(([127, 0, 0, 1], admin)));
    let mut listen = vec![agent, admin];
    if tcp {
        listen.push(frontend);
    }
    run.wait_listening(&listen)?;
    // ANP has no handover: its restart stops the server, then starts it
    // again with the same flags (its graceful shutdown timeout is 0 by
    // default: it exits at once).
    run.recipe = Some(Recipe {
        name: "anp-server",
        program: bins.join("anp-server"),
        args: args.iter().map(Into::into).collect(),
        how: RestartHow::Plain,
        unset_env: vec!["PROXY_SERVER_ID"],
        ready: Ready::Anp {
            ports: listen,
            admin,
            uds: (!tcp).then(|| uds.clone()),
        },
    });

    start_go_agent(run, &certs, agent)?;
    run.wait_until(&format!("{ANP_READY} never reached 1"), || {
        gauge(admin, ANP_READY) >= Some(1.0) && (tcp || uds.exists())
    })?;
    run.entries = if tcp {
        let tls = client_tls(&certs)?;
        let proxy = SocketAddr::from(([127, 0, 0, 1], frontend));
        targets
            .iter()
            .map(|&target| Entry::ConnectTls {
                proxy,
                target,
                tls: tls.clone(),
            })
            .collect()
    } else if grpc {
        targets
            .iter()
            .map(|&target| Entry::GrpcUds {
                path: uds.clone(),
                target,
            })
            .collect()
    } else {
        targets
            .iter()
            .map(|&target| Entry::ConnectUds {
                path: uds.clone(),
                target,
            })
            .collect()
    };
    Ok(())
}

/// ANP's Go agent with the `certs init` agent certificate and agent ID
/// `bench`, linking to the agent port `server_port` on 127.0.0.1 (ANP's
/// server, or ours); its /metrics are served on its health port (its admin
/// port redirects there). Returns once both listen.
pub(super) fn start_go_agent(
    run: &mut Running,
    certs: &Path,
    server_port: u16,
) -> Result<(), String> {
    let bins = peers_dir()?;
    let c = |f: &str| certs.join(f).display().to_string();
    let ports = free_ports(2)?;
    let (admin, health) = (ports[0], ports[1]);
    let mut cmd = Command::new(bins.join("anp-agent"));
    cmd.args([
        "--proxy-server-host=127.0.0.1".to_string(),
        format!("--proxy-server-port={server_port}"),
        "--agent-id=bench".into(),
        format!("--admin-server-port={admin}"),
        // Its default is every address (`[::]`), which a port free on
        // 127.0.0.1 may not be.
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={health}"),
        format!("--ca-cert={}", c("ca.crt")),
        format!("--agent-cert={}", c("agent.crt")),
        format!("--agent-key={}", c("agent.key")),
        format!("-v={}", anp_verbosity()),
    ])
    .env_remove("PROXY_AGENT_ID");
    run.spawn("anp-agent", &mut cmd, false)?;
    run.set_metrics("anp-agent", SocketAddr::from(([127, 0, 0, 1], health)));
    // A port taken meanwhile would leave it without /metrics, silently.
    run.wait_listening(&[admin, health])
}

/// klog verbosity of the Go processes: 0 (errors only) unless
/// `COMPARE_ANP_V` says otherwise (for a post-mortem with COMPARE_KEEP).
fn anp_verbosity() -> String {
    std::env::var("COMPARE_ANP_V").unwrap_or_else(|_| "0".to_string())
}

/// The value of gauge `name` at `127.0.0.1:port/metrics` (None while the
/// admin server does not answer).
pub(super) fn gauge(port: u16, name: &str) -> Option<f64> {
    let text = crate::probe::metrics_text(SocketAddr::from(([127, 0, 0, 1], port)))?;
    crate::probe::metric_sum(&text, name)
}

/// The client side of ANP's TCP frontend: the `certs init` CA as the only
/// root, the proxy-client certificate as the client's.
fn client_tls(certs: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let read = |f: &str| std::fs::read(certs.join(f)).map_err(|e| format!("reading {f}: {e}"));
    let pems = |f: &str| -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
        rustls_pemfile::certs(&mut read(f)?.as_slice())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{f}: {e}"))
    };
    let mut roots = rustls::RootCertStore::empty();
    for ca in pems("ca.crt")? {
        roots.add(ca).map_err(|e| format!("ca.crt: {e}"))?;
    }
    let key = rustls_pemfile::private_key(&mut read("proxy-client.key")?.as_slice())
        .map_err(|e| format!("proxy-client.key: {e}"))?
        .ok_or("proxy-client.key: no key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(pems("proxy-client.crt")?, key)
        .map_err(|e| format!("proxy-client certificate: {e}"))?;
    // kube-apiserver's http-connect dialer keeps no TLS session cache: a
    // full handshake per tunnel, as here.
    cfg.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(cfg))
}
