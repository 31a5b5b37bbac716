//! A bed: a fresh emulated link (two namespaces joined by `wanlink`), the
//! target in the edge namespace and one system carrying the client's
//! streams to it, only the system's own link (an agent's, the haproxy
//! pair's) crossing the emulated WAN. Client and server (or the cloud
//! haproxy) are in the cloud namespace, agent (or the edge haproxy) and
//! target in the edge's. Dropping a bed kills its processes, closes the
//! target's connections and removes the link.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::client::Entry;
use crate::flows;
use crate::haproxy_pair;
use crate::support::netns::sh;
use crate::support::wan::{anp_server_command, Wan, WanConfig, CLOUD_IP, EDGE_IP};
use crate::support::{Agent, Binds, Env, Proc, Server};
use crate::target::Target;

/// A system carrying the client's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum System {
    /// The client connects straight to the target over the link: the
    /// ceiling (one TCP connection per stream).
    Plain,
    /// edgetunnel server + agent, HTTP CONNECT on the server's unix socket.
    EtConnect,
    /// edgetunnel server + agent, gRPC ProxyService on the server's unix
    /// socket (an HTTP/2 connection and a Proxy stream per tunnel).
    EtGrpc,
    /// ANP's Go proxy-server (`--mode=http-connect`, unix socket) and
    /// proxy-agent.
    AnpConnect,
    /// ANP's Go proxy-server (`--mode=grpc`, unix socket) and proxy-agent.
    AnpGrpc,
    /// A cloud haproxy originating mutual TLS 1.3 to an edge haproxy (a
    /// TLS connection over the link per stream).
    HaproxyPair,
}

impl System {
    pub(crate) const ALL: [System; 6] = [
        System::Plain,
        System::EtConnect,
        System::EtGrpc,
        System::AnpConnect,
        System::AnpGrpc,
        System::HaproxyPair,
    ];

    /// The name `--systems` takes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            System::Plain => "plain-tcp",
            System::EtConnect => "edgetunnel-connect",
            System::EtGrpc => "edgetunnel-grpc",
            System::AnpConnect => "anp-connect",
            System::AnpGrpc => "anp-grpc",
            System::HaproxyPair => "haproxy-tls-pair",
        }
    }

    /// The name in tables and plots.
    pub(crate) fn label(self) -> &'static str {
        match self {
            System::Plain => "plain TCP (ceiling)",
            System::EtConnect => "edgetunnel CONNECT",
            System::EtGrpc => "edgetunnel gRPC",
            System::AnpConnect => "ANP http-connect",
            System::AnpGrpc => "ANP grpc",
            System::HaproxyPair => "haproxy TLS pair",
        }
    }

    pub(crate) fn from_name(s: &str) -> Option<System> {
        System::ALL.into_iter().find(|k| k.name() == s)
    }

    /// The Go ANP system doing the same work (same frontend protocol).
    pub(crate) fn anp_twin(self) -> Option<System> {
        match self {
            System::EtConnect => Some(System::AnpConnect),
            System::EtGrpc => Some(System::AnpGrpc),
            _ => None,
        }
    }

    pub(crate) fn is_anp(self) -> bool {
        matches!(self, System::AnpConnect | System::AnpGrpc)
    }
}

/// Fixed ports: every bed has namespaces of its own.
const ANP_AGENT_PORT: u16 = 8091;
const PAIR_CLOUD_PORT: u16 = 15000;
const PAIR_EDGE_PORT: u16 = 15001;
const AGENT_ADMIN_PORT: u16 = 8095;

pub(crate) struct Bed {
    // Dropped in this order: the processes, the target, the link.
    procs: Vec<Proc>,
    /// edgetunnel's admin listeners (server in the cloud, agent at the
    /// edge), for `WAN_DIAG`.
    pub admins: Option<(SocketAddr, SocketAddr)>,
    /// edgetunnel's server and agent processes, for `WAN_DIAG`.
    pub pids: Option<(u32, u32)>,
    pub entry: Entry,
    pub target: Target,
    pub wan: Wan,
}

impl Bed {
    /// A new link of `cfg` with `system` on it, once a stream through it
    /// echoes. `peers`: the directory of ANP's binaries; `cc`: the TCP
    /// congestion control of both namespaces (None: the host's);
    /// `rmem_default`: their initial TCP receive buffer (None: the
    /// kernel's).
    pub(crate) fn start(
        system: System,
        cfg: &WanConfig,
        env: &Env,
        peers: Option<&Path>,
        cc: Option<&str>,
        rmem_default: Option<u64>,
        tag: &str,
    ) -> Result<Bed, String> {
        let wan = Wan::start(cfg);
        if let Some(d) = rmem_default {
            for ns in [&wan.cloud, &wan.edge] {
                sh(
                    &ns.0,
                    &format!(
                        "sysctl -qw net.ipv4.tcp_rmem='4096 {d} {}'",
                        crate::support::wan::TCP_BUFFER_MAX
                    ),
                );
            }
        }
        if let Some(cc) = cc {
            for ns in [&wan.cloud, &wan.edge] {
                sh(
                    &ns.0,
                    &format!("sysctl -qw net.ipv4.tcp_congestion_control={cc}"),
                );
            }
        }
        let target = Target::start(&wan);
        let to = SocketAddr::from(([127, 0, 0, 1], target.port));
        let mut admins = None;
        let mut pids = None;
        let (procs, entry) = match system {
            System::Plain => (
                Vec::new(),
                Entry::Tcp(SocketAddr::from((EDGE_IP, target.port))),
            ),
            System::EtConnect | System::EtGrpc => {
                let (procs, connect, grpc, a) = start_edgetunnel(env, &wan, tag);
                admins = Some(a);
                pids = Some((procs[0].child.id(), procs[1].child.id()));
                let entry = if system == System::EtConnect {
                    Entry::ConnectUds {
                        path: connect,
                        target: to,
                    }
                } else {
                    Entry::GrpcUds {
                        path: grpc,
                        target: to,
                    }
                };
                (procs, entry)
            }
            System::AnpConnect | System::AnpGrpc => {
                let peers = peers.ok_or("no real peers (set EDGETUNNEL_PEERS)")?;
                let grpc = system == System::AnpGrpc;
                let (procs, uds) = start_anp(env, &wan, peers, grpc, tag);
                let entry = if grpc {
                    Entry::GrpcUds {
                        path: uds,
                        target: to,
                    }
                } else {
                    Entry::ConnectUds {
                        path: uds,
                        target: to,
                    }
                };
                (procs, entry)
            }
            System::HaproxyPair => {
                let procs = start_haproxy_pair(env, &wan, to, tag)?;
                let entry = Entry::Tcp(SocketAddr::from(([127, 0, 0, 1], PAIR_CLOUD_PORT)));
                (procs, entry)
            }
        };
        let bed = Bed {
            procs,
            admins,
            pids,
            entry,
            target,
            wan,
        };
        bed.wait_ready(system)?;
        Ok(bed)
    }

    /// Until a stream through the system echoes (agents may still be
    /// linking), at most 30 s.
    fn wait_ready(&self, system: System) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match flows::echoes(&self.wan, &self.entry) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    let logs: Vec<String> = self.procs.iter().map(Proc::log_text).collect();
                    return Err(format!(
                        "{}: no stream after 30 s: {e}\n{}",
                        system.name(),
                        logs.join("\n")
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

/// The admin listeners of an edgetunnel bed: server's, agent's.
type Admins = (SocketAddr, SocketAddr);

/// Our server in the cloud namespace (agent listener on the link, both
/// frontends on unix sockets) and our agent in the edge's, default flags
/// but for logging (warnings only); returns once the agent has a link to
/// every server worker. (processes, CONNECT socket, gRPC socket, admin
/// listeners of server and agent)
fn start_edgetunnel(env: &Env, wan: &Wan, tag: &str) -> (Vec<Proc>, PathBuf, PathBuf, Admins) {
    let connect = env.path(&format!("et-connect-{tag}.sock"));
    let grpc = env.path(&format!("et-grpc-{tag}.sock"));
    let binds = Binds {
        agent: format!("{CLOUD_IP}:0"),
        connect_uds: Some(connect.clone()),
        grpc_uds: Some(grpc.clone()),
        ..Binds::default()
    };
    let certs = env.certs().display().to_string();
    // WAN_ET_LOG: edgetunnel's log filter for diagnosing a cell (the logs
    // stay in the bench's temporary directory).
    let level = std::env::var("WAN_ET_LOG").unwrap_or_else(|_| "warn".into());
    let quiet = ["--log", level.as_str()];
    let (cmd, n, cu, gu) = Server::command(env, &["--certs-dir", &certs], &binds, &quiet);
    let server = Server::spawn(env, wan.cloud.exec(&cmd), n, cu, gu);
    let agent_admin = SocketAddr::from(([127, 0, 0, 1], AGENT_ADMIN_PORT));
    let admin_bind = agent_admin.to_string();
    let agent_args = ["--log", level.as_str(), "--admin-bind", &admin_bind];
    let agent_cmd = Agent::command(env, server.agent, "node-1", "host=node-1", &agent_args);
    let agent = Proc::spawn(
        wan.edge.exec(&agent_cmd),
        env.path(&format!("et-agent-{tag}.log")),
    );
    agent.wait_line("CONNECTED");
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    for _ in 1..workers {
        agent.wait_line("LINKED");
    }
    let admins = (server.admin, agent_admin);
    (vec![server.proc, agent], connect, grpc, admins)
}

/// ANP's Go server in the cloud namespace (http-connect or grpc mode,
/// frontend on a unix socket, keepalive 1 h as tests/peers run it), its Go
/// agent in the edge's, both logging errors only. (processes, socket)
fn start_anp(env: &Env, wan: &Wan, peers: &Path, grpc: bool, tag: &str) -> (Vec<Proc>, PathBuf) {
    let c = env.certs();
    let uds = env.path(&format!("anp-{tag}.sock"));
    let mode = if grpc { "grpc" } else { "http-connect" };
    let cmd = anp_server_command(env, peers, mode, &uds, ANP_AGENT_PORT, tag, 0);
    let server = Proc::spawn(
        wan.cloud.exec(&cmd),
        env.path(&format!("anp-server-{tag}.log")),
    );
    let mut cmd = Command::new(peers.join("anp-agent"));
    cmd.arg(format!("--proxy-server-host={CLOUD_IP}"))
        .arg(format!("--proxy-server-port={ANP_AGENT_PORT}"))
        .arg("--agent-id=node-1")
        .arg("--agent-identifiers=host=node-1")
        .arg("--admin-server-port=8093")
        .arg("--health-server-port=8094")
        .arg(format!("--ca-cert={}", c.join("ca.crt").display()))
        .arg(format!("--agent-cert={}", c.join("agent.crt").display()))
        .arg(format!("--agent-key={}", c.join("agent.key").display()))
        .arg("-v=0")
        .env_remove("PROXY_AGENT_ID");
    let agent = Proc::spawn(
        wan.edge.exec(&cmd),
        env.path(&format!("anp-agent-{tag}.log")),
    );
    (vec![server, agent], uds)
}

/// The haproxy pair (benches/shared/haproxy_pair.rs): the cloud haproxy
/// listens on the cloud's loopback, the edge haproxy on the link's edge
/// address and connects to the target on the edge's loopback.
fn start_haproxy_pair(
    env: &Env,
    wan: &Wan,
    target: SocketAddr,
    tag: &str,
) -> Result<Vec<Proc>, String> {
    let haproxy = ["/usr/sbin/haproxy", "/usr/local/sbin/haproxy"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .ok_or("haproxy not installed (scripts/ensure-bench-tools)")?;
    let certs = haproxy_pair::PairCerts::bundle(&env.certs())?;
    let route = haproxy_pair::Route {
        cloud_bind: format!("127.0.0.1:{PAIR_CLOUD_PORT}"),
        edge_addr: format!("{EDGE_IP}:{PAIR_EDGE_PORT}"),
        edge_bind: format!("{EDGE_IP}:{PAIR_EDGE_PORT}"),
        target: target.to_string(),
    };
    let (edge, cloud) = haproxy_pair::configs(1024, &[route], &certs);
    let mut procs = Vec::new();
    for (side, cfg, ns) in [("edge", edge, &wan.edge), ("cloud", cloud, &wan.cloud)] {
        let path = env.path(&format!("haproxy-{side}-{tag}.cfg"));
        std::fs::write(&path, cfg).map_err(|e| format!("writing {}: {e}", path.display()))?;
        let mut cmd = Command::new(haproxy);
        cmd.arg("-db").arg("-f").arg(&path);
        procs.push(Proc::spawn(
            ns.exec(&cmd),
            env.path(&format!("haproxy-{side}-{tag}.log")),
        ));
    }
    Ok(procs)
}
