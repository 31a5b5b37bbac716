//! `edgetunnel proxy`: a drop-in `kubectl proxy` on the thread-per-core
//! data plane. Same flags, same filter, same routing quirks (Go's
//! `ServeMux` and `net/url` rules are reproduced in [`gourl`] and [`mux`]);
//! kept-alive upstream connections per core, streaming responses, upgrades
//! relayed raw (spliced when no TLS sits on either side).
//!
//! A crate of its own (`crates/kubectl-proxy`, `edgetunnel-kubectl-proxy`)
//! built on the protocol crate (kubectl's Go rules, `protocol::kubectl`)
//! and the engine crate (workers, listeners, admin, logging), and on
//! nothing of the tunnel: `tests/crate_deps.rs` fails if it depends on the
//! root package. Its flags ([`ProxyArgs`]) are clap's; the `edgetunnel`
//! command mounts them as the `proxy` subcommand and calls [`run`].

// `protocol::...` paths, as in the other crates.

mod conn;
pub mod credentials;
pub mod exec_cert;
pub mod flags;
mod io;
pub mod klog;
mod kubeconfig_names;
pub mod oidc;
mod proxy_dial;
pub mod server_version;
pub mod static_files;
pub mod upstream_config;

// kubectl's Go behaviour, sans-I/O, lives in the protocol crate
// (`protocol::kubectl`); the old paths stay.
pub use protocol::go::{regexp as goregex, url as gourl};
pub use protocol::kubectl::{filter, mux};

/// kubectl's command line ([`protocol::kubectl::go_args`]), and
/// reading this process's.
pub mod goargs {
    pub use protocol::kubectl::go_args::*;

    /// For `main`: when the command line runs `edgetunnel [--log X] proxy
    /// ARGS`, the whole argument vector for clap with ARGS made canonical;
    /// `None` for every other subcommand. A command line kubectl would refuse
    /// ends the process with pflag's message, as kubectl does.
    pub fn from_process_args() -> Option<Vec<String>> {
        let args: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let at = subcommand_index(&args)?;
        if args[at] != "proxy" {
            return None;
        }
        let mut argv = args[..=at].to_vec();
        match canonical(&args[at + 1..]) {
            Ok(Outcome::Args(a)) => argv.extend(a),
            Ok(Outcome::Help) => argv.push("--help".into()),
            Err(e) => {
                eprintln!("Error: {e}");
                eprintln!("See '{} proxy --help' for usage.", args[0]);
                std::process::exit(1);
            }
        }
        Some(argv)
    }
}

/// The head rewrite ([`protocol::kubectl::forward`]), here taking
/// the upstream as [`upstream_config::Upstream`] holds it.
pub mod forward {
    use std::net::IpAddr;

    use super::gourl::RequestUrl;
    use super::upstream_config::Upstream;
    use protocol::http1::{Framing, Header, RequestHead};
    use protocol::kubectl::forward as pure;
    pub use protocol::kubectl::forward::*;

    /// [`pure::upstream_target`] with the upstream's base path.
    pub fn upstream_target(
        url: &RequestUrl,
        upstream: &Upstream,
        append_server_path: bool,
    ) -> String {
        pure::upstream_target(url, &upstream.base_path, append_server_path)
    }

    /// [`pure::request_head`] toward `upstream`.
    pub fn request_head(
        head: &RequestHead,
        target: &str,
        framing: Framing,
        client: Option<IpAddr>,
        upstream: &Upstream,
        upgrade: bool,
        gzip: bool,
    ) -> Vec<u8> {
        let up = upstream.head();
        pure::request_head(head, target, framing, client, &up, upgrade, gzip)
    }

    /// [`pure::upstream_headers`] toward `upstream`.
    pub fn upstream_headers(
        head: &RequestHead,
        framing: Framing,
        client: Option<IpAddr>,
        upstream: &Upstream,
        upgrade: bool,
        gzip: bool,
    ) -> Vec<Header> {
        let up = upstream.head();
        pure::upstream_headers(head, framing, client, &up, upgrade, gzip)
    }
}

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use monoio::io::IntoPollIo;

use engine::{listener, runtime, BoxError};
pub use flags::ProxyArgs;

/// The proxy's listeners, bound by [`listener::bind_all`] from [`specs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `--port`/`--address` or `--unix-socket`: every worker accepts.
    Proxy,
    /// `--metrics-bind-address` (edgetunnel's own): worker 0.
    Metrics,
}

impl Kind {
    /// What errors and readiness lines call it.
    fn name(self) -> &'static str {
        match self {
            Kind::Proxy => "proxy",
            Kind::Metrics => "metrics",
        }
    }
}

/// The listeners `args` ask for: the proxy's (a socket path, or Go's
/// `net.Listen("tcp", address:port)` address), then the metrics one.
fn specs(args: &ProxyArgs) -> Result<Vec<listener::Spec<Kind>>, BoxError> {
    let spec = |kind: Kind, at, spread| listener::Spec {
        kind,
        name: kind.name(),
        at,
        spread,
    };
    let at = if args.unix_socket.is_empty() {
        listener::Endpoint::Tcp(SocketAddr::new(listen_ip(&args.address)?, args.port))
    } else {
        listener::Endpoint::Unix(PathBuf::from(&args.unix_socket))
    };
    let mut specs = vec![spec(Kind::Proxy, at, listener::Spread::EveryWorker)];
    if let Some(a) = args.metrics_bind {
        specs.push(spec(
            Kind::Metrics,
            listener::Endpoint::Tcp(a),
            listener::Spread::FirstWorker,
        ));
    }
    Ok(specs)
}

struct MetricsView(Arc<conn::ProxySettings>);

impl engine::admin::AdminState for MetricsView {
    fn metrics(&self) -> String {
        self.0.metrics.render()
    }
    fn ready(&self) -> Result<String, String> {
        Ok("ok".into())
    }
}

/// Builds the shared state from the flags (kubeconfig read on a
/// current-thread tokio runtime, before any data-plane core starts).
fn shared_from(args: &ProxyArgs) -> Result<conn::ProxySettings, BoxError> {
    let filter = if args.disable_filter {
        if args.unix_socket.is_empty() {
            tracing::warn!("Request filter disabled, your proxy is vulnerable to XSRF attacks, please be cautious");
        }
        None
    } else {
        let f = filter::Filter::new(
            &args.accept_paths,
            &args.reject_paths,
            &args.accept_hosts,
            &args.reject_methods,
        );
        match f {
            Ok(f) => Some(f),
            // kubectl: `klog.Fatalf("Error compiling re: %v", err)`, exit 255.
            Err(e) => {
                eprintln!("Error compiling re: {e}");
                engine::logging::flush(std::time::Duration::from_secs(1));
                std::process::exit(255);
            }
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    kubeconfig_names::check_args(&args.kubeconfig, &args.user, &args.context, &args.cluster)?;
    let upstream = rt.block_on(upstream_config::resolve(args))?;
    let dial_addrs: Vec<SocketAddr> = match &upstream.proxy {
        None => upstream
            .dial
            .to_socket_addrs()
            .map_err(|e| format!("resolving {}: {e}", upstream.dial))?
            .collect(),
        // The proxy is dialed instead; the API server's name is resolved
        // by the proxy (CONNECT, SOCKS5 with a domain name), as Go does.
        Some(p) => match p.addr().to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                tracing::warn!("resolving proxy {}: {e}", p.addr());
                Vec::new()
            }
        },
    };
    // kubectl makes a request through its transport at start, before it
    // serves (what the fake API server sees as its first request): an
    // oidc provider refreshes an expired id-token then, and a failure is
    // not reported. Do the same on the control thread.
    if let Some(d) = upstream.auth.dynamic().filter(|d| d.fetch_at_start()) {
        if let Err(e) = rt.block_on(d.ready()) {
            tracing::debug!("credentials at start: {e}");
        }
    }
    if args.match_server_version {
        let auth = match upstream.auth.dynamic() {
            Some(d) => {
                rt.block_on(d.ready())?;
                upstream.auth.header()
            }
            None => upstream.auth.header(),
        };
        server_version::check(&upstream, &dial_addrs, auth)?;
    }
    let www = (!args.www.is_empty()).then(|| PathBuf::from(&args.www));
    let mux = mux::Mux {
        api_prefix: flags::with_slash(&args.api_prefix),
        static_prefix: www.as_ref().map(|_| flags::with_slash(&args.www_prefix)),
    };
    tracing::debug!(?upstream, "proxy upstream");
    Ok(conn::ProxySettings {
        mux,
        filter,
        upstream,
        dial_addrs,
        append_server_path: args.append_server_path,
        disable_compression: args.disable_compression,
        keepalive: (!args.keepalive.is_zero()).then_some(args.keepalive),
        www,
        idle_per_core: args.upstream_idle_per_core,
        log_round_trips: klog::verbosity(args.v, &args.vmodule) >= klog::ROUND_TRIPS,
        metrics: conn::ProxyMetrics::default(),
    })
}

/// kubectl's `ListenUnix` binds under umask 0077, so the socket is born
/// `srwx------` (0700). The path has been cleared by [`clear_socket_path`]
/// first; `replace_stale` only covers a socket appearing in between.
const KUBECTL_UDS: listener::UdsOptions = listener::UdsOptions {
    mode: 0o700,
    replace_stale: true,
};

/// kubectl's `ListenUnix` (k8s.io/kubectl/pkg/proxy): "Remove any socket,
/// stale or not, but fall through for other files" — `os.Stat` follows a
/// symlink, and `os.Remove` then removes the link itself. Anything that is
/// not a socket stays, and the bind fails on it.
fn clear_socket_path(path: &std::path::Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::debug!(path = %path.display(), "removing the existing socket: {e}");
        }
    }
}

/// Runs `edgetunnel proxy` until killed.
/// Readiness (`Starting to serve on ...`) goes to `announce`.
pub fn run(args: ProxyArgs, announce: engine::readiness::Announce) -> Result<(), BoxError> {
    args.validate()?;
    let shared = Arc::new(shared_from(&args)?);
    let workers = args.workers.unwrap_or_else(runtime::default_workers).max(1);
    if !args.unix_socket.is_empty() {
        let path = PathBuf::from(&args.unix_socket);
        clear_socket_path(&path);
        if std::fs::symlink_metadata(&path).is_ok() {
            // Go's wording for what its bind(2) then says (EADDRINUSE).
            return Err(format!(
                "listen unix {}: bind: address already in use",
                path.display()
            )
            .into());
        }
    }
    let listener::Bound {
        per_worker,
        addresses,
        // The socket file (it carries this user's credentials to the
        // apiserver) is removed when `run` returns.
        files: _socket_files,
    } = listener::bind_all(&specs(&args)?, workers, KUBECTL_UDS)?;
    let address = |name| {
        addresses
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| a.clone())
    };
    tracing::info!(driver = args.driver().name(), workers, "proxy data plane");
    announce.send(engine::readiness::Ready::Serving {
        on: address(Kind::Proxy.name()).unwrap_or_default(),
    });
    // After kubectl's own first line, which scripts read first.
    if let Some(addr) = address(Kind::Metrics.name()) {
        announce.send(engine::readiness::Ready::Listen {
            what: "metrics".into(),
            addr,
        });
    }
    let _ = std::io::stdout().flush();

    let per_worker = Arc::new(std::sync::Mutex::new(per_worker));
    runtime::run_workers(workers, args.driver(), move |idx| {
        let mine = per_worker
            .lock()
            .ok()
            .and_then(|mut v| v.get_mut(idx).map(std::mem::take))
            .unwrap_or_default();
        let shared = shared.clone();
        async move {
            let core = conn::Core::new(shared.clone());
            let mut proxy = None;
            for l in mine {
                match l.kind {
                    Kind::Proxy => proxy = Some(l.socket),
                    Kind::Metrics => {
                        if let listener::Socket::Tcp(m) = l.socket {
                            let m = monoio::net::TcpListener::from_std(m)?;
                            monoio::spawn(engine::admin::serve(
                                m,
                                "metrics",
                                Rc::new(MetricsView(shared.clone())),
                                None,
                            ));
                        }
                    }
                }
            }
            match proxy {
                Some(l) => accept_loop(l, core).await,
                None => Ok(()),
            }
        }
    })?;
    Ok(())
}

/// The address Go's `net.Listen("tcp", address:port)` binds: an IP as
/// given, a host name resolved to one of its addresses (IPv4 first, as Go
/// prefers for a listener), empty meaning every interface. A wildcard,
/// `0.0.0.0` included, is a dual-stack IPv6 socket shown as `[::]:P`, as
/// Go's `favoriteAddrFamily` (net/ipsock_posix.go) picks for a listener on
/// an unspecified address when IPv4-mapped addresses work.
fn listen_ip(address: &str) -> Result<IpAddr, BoxError> {
    if address.is_empty() {
        return Ok(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED));
    }
    if let Ok(ip) = address.parse::<IpAddr>() {
        if ip.is_unspecified() {
            return Ok(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED));
        }
        return Ok(ip);
    }
    let addrs: Vec<SocketAddr> = (address, 0)
        .to_socket_addrs()
        .map_err(|e| format!("listen tcp {address}: lookup {address}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(|a| a.ip())
        .ok_or_else(|| format!("listen tcp {address}: lookup {address}: no such host").into())
}

async fn accept_loop(l: listener::Socket, core: Rc<conn::Core>) -> std::io::Result<()> {
    use engine::accept;
    match l {
        listener::Socket::Tcp(l) => {
            let l = monoio::net::TcpListener::from_std(l)?;
            accept::serve(l, accept::Options::named("proxy"), move |c| {
                let core = core.clone();
                async move {
                    let Ok(io) = c.stream.into_poll_io() else {
                        return;
                    };
                    conn::serve(io::ClientIo::Tcp(io), Some(c.peer.ip()), core).await
                }
            })
            .await
        }
        listener::Socket::Unix(l) => {
            let l = monoio::net::UnixListener::from_std(l)?;
            accept::serve(l, accept::Options::named("proxy-unix"), move |c| {
                let core = core.clone();
                async move {
                    let Ok(io) = c.stream.into_poll_io() else {
                        return;
                    };
                    conn::serve(io::ClientIo::Unix(io), None, core).await
                }
            })
            .await
        }
    }
    Ok(())
}
