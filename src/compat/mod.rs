//! Drop-in command lines for the Go binaries edgetunnel replaces: ANP's
//! `proxy-server` and `proxy-agent`, OpenYurt's `yurt-tunnel-server` and
//! `yurt-tunnel-agent`. Existing Kubernetes manifests keep their `command`
//! and `args`: `edgetunnel proxy-server ARGS`, or a symlink named
//! `proxy-server` (or `/proxy-server`, as ANP's images have it) pointing at
//! edgetunnel, accepts every flag of the Go binary in Go's syntax and runs
//! `edgetunnel server` / `edgetunnel agent` with the equivalent flags.
//!
//! How: [`goflag`] parses the Go command line (sans-I/O); one table per
//! binary ([`anp_server`], [`anp_agent`], [`yurt_server`], [`yurt_agent`],
//! plus [`klog`]'s flags, which all four take) declares every flag with its
//! Go type and default and what it becomes ([`Effect`]); the translation
//! is an argument vector for edgetunnel's own clap parser, so
//! the roles' `args.rs` stay the one place where configurations are built. A flag
//! edgetunnel accepts but cannot honour yet is logged at start, one
//! `warn` line per flag ("accepted, no effect: ..."), never silently.
//! Mapping such a flag later is a one-line change of its table entry from
//! `NoEffect(...)` to `To("--edgetunnel-flag", Conv::...)`.
//!
//! What the translation needs from the machine (environment variables such
//! as `PROXY_AGENT_ID`, a random UUID, whether a file exists, reading a
//! kubeconfig) comes through [`Host`], so every table is unit-tested; the
//! few things to do before starting (create yurt-tunnel's certificate
//! directory, write a CA taken from a kubeconfig) come back as [`Prepare`]
//! steps that [`from_process_args`] performs.
//!
//! # Where each fact comes from
//!
//! - ANP (kubernetes-sigs/apiserver-network-proxy at 4f8517c, 2026-08-21):
//!   flags, types and defaults from `cmd/server/app/options/
//!   options.go` (`Flags`, `NewProxyRunOptions`, `Validate`) and
//!   `cmd/agent/app/options/options.go` (`Flags`, `NewGrpcProxyAgentOptions`,
//!   `Validate`); `PROXY_SERVER_ID`/`PROXY_AGENT_ID` and the UUID defaults
//!   from `defaultServerID`/`defaultAgentID` there; UDS versus TCP, the
//!   mode, which listener serves what (admin: `/metrics` + pprof; health:
//!   `/healthz`, `/readyz`, `/metrics`) and the TLS setup of each listener
//!   from `cmd/server/app/server.go` (`runFrontendServer`,
//!   `runAgentServer`, `getTLSConfig`: no `--cluster-ca-cert` means no
//!   client certificates asked; `runAdminServer`, `runHealthServer`; the
//!   lease controller's client from `--kubeconfig`) and
//!   `cmd/agent/app/server.go` (`runHealthServer`, `runAdminServer`) with
//!   `pkg/util/certificates.go` (`GetClientTLSConfig`); `-v=4` and the `_`
//!   to `-` renaming of klog flags from `cmd/*/main.go` and
//!   `pkg/util/flags.go`; proxy strategy names from
//!   `pkg/server/proxystrategies/proxystrategies.go`; grpc-go's keepalive
//!   rules (server: 0 means 2h; client: at least 10s) from the vendored
//!   `google.golang.org/grpc` (`dialoptions.go` `WithKeepaliveParams`,
//!   `internal/transport/defaults.go`, `http2_server.go`); pflag's syntax
//!   and messages from the vendored `github.com/spf13/pflag` (`flag.go`,
//!   `errors.go`, `int.go`, `string_slice.go`); klog's flags from the
//!   vendored `k8s.io/klog/v2/klog.go`. Example argument lists:
//!   `examples/kind/konnectivity-{server,agent-ds}.yaml`,
//!   `examples/kind-multinode/templates/k8s/*.yaml`,
//!   `examples/kubernetes/konnectivity-{server,agent}.yaml`.
//! - The Kubernetes documentation's manifests (kubernetes/website
//!   `content/en/examples/admin/konnectivity/konnectivity-server.yaml`,
//!   image v0.0.37, and `konnectivity-agent.yaml`): the argument lists
//!   `tests/operate/compat_flags.rs` runs.
//! - yurt-tunnel (openyurtio/openyurt v1.3.4; unchanged in substance up to
//!   v1.7): `cmd/yurt-tunnel-server/app/options/options.go` (flags,
//!   `NewServerOptions`, `Validate`: an empty `--insecure-bind-address`
//!   becomes the loopback address of `--bind-address`'s family; ports are
//!   strings), `cmd/yurt-tunnel-server/app/config/config.go` (cert dir
//!   `/var/lib/yurttunnel-server/pki`), `.../app/start.go` (always a
//!   Kubernetes client, always CSR certificates: serving with
//!   `--cert-dns-names`/`--cert-ips` added, proxy-client for kubelets),
//!   `pkg/util/certmanager/pki.go` (`GenRootCertPool`: the CA is the
//!   kubeconfig's `certificate-authority-data`, else the service account's
//!   `ca.crt`), `pkg/yurttunnel/server/anpserver.go`
//!   (`--egress-selector-enable` refuses to start; TLS listener on
//!   `--bind-address:--secure-port`, plain on `--insecure-bind-address:
//!   --insecure-port`), `pkg/yurttunnel/server/interceptor.go` (kubelet
//!   certificates not verified), `pkg/yurttunnel/trafficforward/iptables/
//!   iptables.go` (sync period at least 15 s) and `.../dns/dns.go` (records
//!   point at the `x-tunnel-server-internal-svc` ClusterIP);
//!   `cmd/yurt-tunnel-agent/app/options/options.go` (flags, `NODE_NAME`/
//!   `NODE_IP` fallbacks, default identifiers `ipv4=IP&host=NAME`, kubeconfig
//!   default `/etc/kubernetes/kubelet.conf`, identifiers written as a comma
//!   list), `.../app/start.go` and `.../app/config/config.go` (cert dir
//!   `/var/lib/yurttunnel-agent/pki`, CA the service account's `ca.crt`);
//!   `cmd/*/server.go`/`agent.go` (klog via `flag.CommandLine`);
//!   `pkg/yurttunnel/constants/constants.go` (ports 10262-10266, names);
//!   `pkg/projectinfo/projectinfo.go` (`yurttunnel-server`). Example
//!   argument lists: the last released chart, v1.1.1
//!   `charts/openyurt/templates/yurt-tunnel-{server,agent}.yaml`.
//! - Go's own syntax: `strconv` (`ParseBool`, `ParseInt`, `ParseUint`,
//!   `underscoreOK`), `time.ParseDuration`, `encoding/csv`.
//!
//! # Known differences
//!
//! Beyond the per-flag notes in the tables (each logged when it applies):
//! ANP's server refuses ports below 1024 or above 49151, edgetunnel does
//! not (port 0 picks a free port). Bind addresses must be IP addresses (or
//! `localhost`); an empty one means `0.0.0.0`, where Go listens on every
//! address of both families. Things edgetunnel cannot do yet stop the start
//! with the reason rather than run differently: agents without a client
//! certificate (ANP's token-only agents), an ANP server without a CA for
//! agent certificates (unless `ca.crt` sits beside `--cluster-cert`), and ANP's
//! TCP frontend (it needs TLS toward kube-apiserver). Accepting more than Go does is
//! deliberate: Go-style single-dash long flags everywhere, and klog flags
//! with `_` or `-` in every binary.
//!
//! For running outside a pod, `EDGETUNNEL_COMPAT_SERVICEACCOUNT_DIR`
//! replaces `/var/run/secrets/kubernetes.io/serviceaccount`, where
//! yurt-tunnel's binaries find the cluster CA.
//!
//! What the Go servers cannot do comes in through the environment, so that
//! a manifest's `args` stay Go's: `EDGETUNNEL_HANDOVER_SOCKET` gives every
//! face edgetunnel's handover (`--handover-socket`, the upgrade without a
//! failed dial, deploy/README.md "Upgrades").

pub mod anp_agent;
pub mod anp_server;
/// Go command lines (pflag), sans-I/O, in the protocol crate.
pub use protocol::go::pflag as goflag;
pub mod klog;
pub mod yurt_agent;
pub mod yurt_server;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use goflag::{FlagError, Kind, Parsed, Spec, Value};

/// The environment variable that gives a Go-named server or agent
/// edgetunnel's `--handover-socket`.
pub const HANDOVER_SOCKET_ENV: &str = "EDGETUNNEL_HANDOVER_SOCKET";

/// The Go binaries this entry stands in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    ProxyServer,
    ProxyAgent,
    YurtTunnelServer,
    YurtTunnelAgent,
}

impl Binary {
    pub const ALL: [Binary; 4] = [
        Binary::ProxyServer,
        Binary::ProxyAgent,
        Binary::YurtTunnelServer,
        Binary::YurtTunnelAgent,
    ];

    /// The program name, as in the Go images and manifests.
    pub fn name(self) -> &'static str {
        match self {
            Binary::ProxyServer => "proxy-server",
            Binary::ProxyAgent => "proxy-agent",
            Binary::YurtTunnelServer => "yurt-tunnel-server",
            Binary::YurtTunnelAgent => "yurt-tunnel-agent",
        }
    }

    pub fn from_name(name: &str) -> Option<Binary> {
        Binary::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The edgetunnel subcommand it runs.
    pub fn role(self) -> &'static str {
        match self {
            Binary::ProxyServer | Binary::YurtTunnelServer => "server",
            Binary::ProxyAgent | Binary::YurtTunnelAgent => "agent",
        }
    }

    /// Every flag the Go binary takes, klog's included.
    pub fn table(self) -> Vec<Flag> {
        match self {
            Binary::ProxyServer => anp_server::flags(),
            Binary::ProxyAgent => anp_agent::flags(),
            Binary::YurtTunnelServer => yurt_server::flags(),
            Binary::YurtTunnelAgent => yurt_agent::flags(),
        }
    }
}

/// One flag of a Go binary and what edgetunnel does with it.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    pub spec: Spec,
    pub effect: Effect,
}

/// Shorthand for a table entry.
pub const fn flag(name: &'static str, kind: Kind, default: &'static str, effect: Effect) -> Flag {
    Flag {
        spec: Spec::new(name, kind, default),
        effect,
    }
}

/// What a Go flag becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// One edgetunnel flag carries the value, the Go default included when
    /// the flag is absent (empty strings and `false` are left out).
    To(&'static str, Conv),
    /// Read with other flags by the binary's translation; the text says
    /// what it becomes.
    Composite(&'static str),
    /// Accepted, nothing in edgetunnel does this yet: a `warn` line when
    /// given. The text says what happens instead.
    NoEffect(&'static str),
    /// Accepted; edgetunnel already behaves so. An `info` line when given.
    Same(&'static str),
    /// `--version`: print and exit.
    Version,
}

/// How a value is written for edgetunnel's flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conv {
    /// As text (numbers in decimal, lists joined by commas).
    Text,
    /// A duration as (fractional) seconds.
    Seconds,
    /// A bool as a bare switch, present when true.
    Switch,
}

/// A message for the log once tracing is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    Warn(String),
    Info(String),
}

/// Something to do on the machine before edgetunnel starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepare {
    CreateDir(PathBuf),
    WriteFile { path: PathBuf, contents: Vec<u8> },
}

/// The translated command line.
#[derive(Debug, Clone)]
pub struct Translation {
    pub binary: Binary,
    /// `edgetunnel server|agent ...`, for clap.
    pub argv: Vec<String>,
    pub notes: Vec<Note>,
    pub prepare: Vec<Prepare>,
}

impl Translation {
    /// Logs what was translated and every note; call once tracing is set up.
    pub fn log_notes(&self) {
        tracing::info!(
            binary = self.binary.name(),
            "compatibility entry: running `{}`",
            self.argv.join(" ")
        );
        for n in &self.notes {
            match n {
                Note::Warn(t) => tracing::warn!("{}: {t}", self.binary.name()),
                Note::Info(t) => tracing::info!("{}: {t}", self.binary.name()),
            }
        }
    }
}

/// Why a command line cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompatError {
    #[error(transparent)]
    Flag(FlagError),
    /// A value the Go binary refuses too, or one edgetunnel cannot honour.
    #[error("{0}")]
    Invalid(String),
    /// `--help`: the usage text.
    #[error("help requested")]
    Help(String),
    /// `--version`: the text to print.
    #[error("version requested")]
    Version(String),
}

fn invalid(msg: impl Into<String>) -> CompatError {
    CompatError::Invalid(msg.into())
}

/// What the translation reads from the machine.
pub trait Host {
    fn env(&self, name: &str) -> Option<String>;
    /// A random UUID in Go's `uuid.New().String()` form.
    fn uuid(&self) -> String;
    fn exists(&self, path: &Path) -> bool;
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>>;
}

/// The real machine.
pub struct System;

impl Host for System {
    fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn uuid(&self) -> String {
        let mut b = [0u8; 16];
        for x in &mut b {
            *x = fastrand::u8(..);
        }
        uuid_v4(b)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        std::fs::read(path)
    }
}

/// Formats 16 random bytes as a version-4 UUID.
pub fn uuid_v4(mut b: [u8; 16]) -> String {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The translation under construction.
#[derive(Debug, Default)]
pub struct Out {
    argv: Vec<String>,
    notes: Vec<Note>,
    prepare: Vec<Prepare>,
}

impl Out {
    /// `flag value`.
    pub fn arg(&mut self, flag: &str, value: impl Into<String>) {
        self.argv.push(flag.to_string());
        self.argv.push(value.into());
    }

    /// A bare switch.
    pub fn switch(&mut self, flag: &str) {
        self.argv.push(flag.to_string());
    }

    pub fn warn(&mut self, text: impl Into<String>) {
        self.notes.push(Note::Warn(text.into()));
    }

    pub fn info(&mut self, text: impl Into<String>) {
        self.notes.push(Note::Info(text.into()));
    }

    pub fn prepare(&mut self, step: Prepare) {
        self.prepare.push(step);
    }
}

/// Translates `args` (without the program name) for `binary`.
pub fn translate(
    binary: Binary,
    args: &[String],
    host: &dyn Host,
) -> Result<Translation, CompatError> {
    let table = binary.table();
    let specs: Vec<Spec> = table.iter().map(|f| f.spec).collect();
    let p = match goflag::parse(&specs, args) {
        Ok(p) => p,
        Err(FlagError::Help) => return Err(CompatError::Help(usage(binary, &table))),
        Err(e) => return Err(CompatError::Flag(e)),
    };
    if table.iter().any(|f| f.effect == Effect::Version) && p.bool("version") {
        return Err(CompatError::Version(format!(
            "{}: edgetunnel {} (compatibility entry for {})",
            binary.name().replace("yurt-tunnel", "yurttunnel"),
            env!("CARGO_PKG_VERSION"),
            binary.name()
        )));
    }
    let mut out = Out::default();
    out.argv.push("edgetunnel".to_string());
    out.argv.push(binary.role().to_string());
    for d in &p.deprecations {
        out.info(d.clone());
    }
    for f in &table {
        simple(f, &p, &mut out);
    }
    match binary {
        Binary::ProxyServer => anp_server::translate(&p, &mut out, host)?,
        Binary::ProxyAgent => anp_agent::translate(&p, &mut out, host)?,
        Binary::YurtTunnelServer => yurt_server::translate(&p, &mut out, host)?,
        Binary::YurtTunnelAgent => yurt_agent::translate(&p, &mut out, host)?,
    }
    if let Some(sock) = host.env(HANDOVER_SOCKET_ENV).filter(|s| !s.is_empty()) {
        out.arg("--handover-socket", sock);
    }
    klog::translate(&p, &mut out, binary.name());
    if !p.positional.is_empty() {
        match binary {
            // cobra's legacy rule for a root command without subcommands.
            Binary::ProxyServer | Binary::ProxyAgent => out.warn(format!(
                "accepted, no effect: arguments {:?}: ANP ignores them too",
                p.positional
            )),
            // yurt-tunnel's commands declare cobra.NoArgs.
            _ => {
                return Err(invalid(format!(
                    "unknown command {:?} for {:?}",
                    p.positional[0],
                    binary.name()
                )))
            }
        }
    }
    Ok(Translation {
        binary,
        argv: out.argv,
        notes: out.notes,
        prepare: out.prepare,
    })
}

/// The table-driven part: `To`, `NoEffect` and `Same` entries.
fn simple(f: &Flag, p: &Parsed, out: &mut Out) {
    let name = f.spec.name;
    match f.effect {
        Effect::To(target, conv) => match (conv, p.value(name)) {
            (Conv::Switch, Value::Bool(true)) => out.switch(target),
            (Conv::Switch, _) => {}
            (Conv::Seconds, Value::Duration(ns)) => out.arg(target, seconds(*ns)),
            (_, Value::Str(s)) if s.is_empty() => {}
            (_, Value::List(l)) if l.is_empty() => {}
            (_, v) => out.arg(target, text(v)),
        },
        Effect::NoEffect(why) if p.is_set(name) => out.warn(format!(
            "accepted, no effect: --{name}={}: {why}",
            p.text(name)
        )),
        Effect::Same(why) if p.is_set(name) => {
            out.info(format!("accepted: --{name}={}: {why}", p.text(name)))
        }
        _ => {}
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::Bool(b) => b.to_string(),
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Uint(u) => u.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Duration(ns) => seconds(*ns),
        Value::List(l) => l.join(","),
    }
}

/// Nanoseconds as seconds for edgetunnel's `*-secs` flags (`1`, `0.5`).
pub fn seconds(ns: i64) -> String {
    (ns as f64 / 1e9).to_string()
}

/// Whole seconds, rounded up (edgetunnel's integer `*-secs` flags).
pub fn whole_seconds(ns: i64) -> u64 {
    (ns.max(0) as u64).div_ceil(1_000_000_000)
}

/// `host:port` as Go's `net.JoinHostPort` writes it (the protocol crate's,
/// which the control thread uses too).
pub use protocol::go::net::join_host_port;

/// A listen address from a Go bind-address flag and a port: empty means
/// every address (IPv4 here), `localhost` the loopback address; anything
/// else must be an IP address.
pub fn bind_addr(flag: &str, host: &str, port: u16) -> Result<SocketAddr, CompatError> {
    let ip = parse_bind_ip(flag, host)?.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    Ok(SocketAddr::new(ip, port))
}

/// The IP of a bind-address flag; `None` when empty.
pub fn parse_bind_ip(flag: &str, host: &str) -> Result<Option<IpAddr>, CompatError> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if h.is_empty() {
        return Ok(None);
    }
    if h == "localhost" {
        return Ok(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }
    h.parse().map(Some).map_err(|_| {
        invalid(format!(
            "--{flag}={host}: edgetunnel binds IP addresses; give one (or leave it empty for all)"
        ))
    })
}

/// A Go int flag that must be a TCP port.
pub fn port(p: &Parsed, flag: &str) -> Result<u16, CompatError> {
    let v = p.int(flag);
    u16::try_from(v).map_err(|_| invalid(format!("--{flag}={v}: not a TCP port")))
}

/// A Go string flag holding a port (yurt-tunnel's are strings).
pub fn port_str(p: &Parsed, flag: &str) -> Result<u16, CompatError> {
    let v = p.str(flag);
    v.parse()
        .map_err(|_| invalid(format!("--{flag}={v:?}: not a TCP port number")))
}

/// Refuses a negative duration, as ANP's `Validate` does for its timeouts.
pub fn non_negative(p: &Parsed, flag: &str) -> Result<i64, CompatError> {
    let d = p.duration(flag);
    if d < 0 {
        return Err(invalid(format!(
            "{flag} must be >= 0, got {}",
            goflag::format_duration(d)
        )));
    }
    Ok(d)
}

/// The usage text for `--help`: every flag, its Go type and default, and
/// what edgetunnel does with it.
pub fn usage(binary: Binary, table: &[Flag]) -> String {
    let mut s = format!(
        "Usage of {} (edgetunnel's compatibility entry: the Go binary's flags, run as `edgetunnel {}`):\n",
        binary.name(),
        binary.role()
    );
    if binary.role() == "server" {
        // The one behaviour of `edgetunnel server` this face turns back.
        s.push_str(
            "  Agents are not bound to their client certificates, as in ANP: any certificate the \
             CA signed may register any agent ID (edgetunnel server's default is \
             --bind-agent-identity; this face passes --bind-agent-identity=false).\n",
        );
    }
    for f in table {
        let sp = &f.spec;
        let mut names = match sp.shorthand {
            Some(c) => format!("-{c}, --{}", sp.name),
            None => format!("    --{}", sp.name),
        };
        if !sp.kind.type_name().is_empty() {
            names = format!("{names} {}", sp.kind.type_name());
        }
        let default = match (sp.kind, sp.default) {
            (Kind::Bool, "false") | (_, "") => String::new(),
            (Kind::String, d) => format!(" (default {d:?})"),
            (_, d) => format!(" (default {d})"),
        };
        let effect = match f.effect {
            Effect::To(flag, _) => format!("-> {flag}"),
            Effect::Composite(what) => format!("-> {what}"),
            Effect::NoEffect(why) => format!("accepted, no effect: {why}"),
            Effect::Same(why) => format!("accepted: {why}"),
            Effect::Version => "print the version and exit".to_string(),
        };
        s.push_str(&format!("  {names}{default}\n        {effect}\n"));
    }
    s
}

/// The Go binary named by how we were invoked: the program name itself
/// (`/proxy-server`, a symlink) or the first argument
/// (`edgetunnel proxy-server ...`); with the arguments that follow.
pub fn detect(args: &[String]) -> Option<(Binary, &[String])> {
    let prog = args.first()?;
    let base = Path::new(prog).file_name()?.to_str()?;
    if let Some(b) = Binary::from_name(base) {
        return Some((b, &args[1..]));
    }
    let b = Binary::from_name(args.get(1)?)?;
    Some((b, &args[2..]))
}

/// The entry for `main`: `None` unless invoked as one of the Go binaries.
/// Prints usage, version or errors (pflag/cobra style) and exits itself;
/// otherwise performs the [`Prepare`] steps and returns the translation,
/// whose `argv` goes to clap and whose notes are logged once tracing is up.
pub fn from_process_args() -> Option<Translation> {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let (binary, rest) = detect(&args)?;
    match translate(binary, rest, &System) {
        Ok(t) => {
            for step in &t.prepare {
                let done = match step {
                    Prepare::CreateDir(d) => std::fs::create_dir_all(d)
                        .map_err(|e| format!("creating {}: {e}", d.display())),
                    Prepare::WriteFile { path, contents } => std::fs::write(path, contents)
                        .map_err(|e| format!("writing {}: {e}", path.display())),
                };
                if let Err(e) = done {
                    eprintln!("Error: {e}");
                    std::process::exit(1);
                }
            }
            Some(t)
        }
        Err(CompatError::Help(text)) => {
            print!("{text}");
            std::process::exit(0);
        }
        Err(CompatError::Version(text)) => {
            println!("{text}");
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("Error: {e}");
            eprintln!("Run '{} --help' for usage.", binary.name());
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A [`Host`] for the table tests and helpers to read translations.
    use std::collections::HashMap;

    use super::*;

    #[derive(Default)]
    pub(crate) struct FakeHost {
        pub env: HashMap<String, String>,
        pub files: HashMap<PathBuf, Vec<u8>>,
    }

    impl FakeHost {
        pub(crate) fn with_env(mut self, k: &str, v: &str) -> Self {
            self.env.insert(k.into(), v.into());
            self
        }

        pub(crate) fn with_file(mut self, p: &str, contents: &[u8]) -> Self {
            self.files.insert(p.into(), contents.to_vec());
            self
        }
    }

    impl Host for FakeHost {
        fn env(&self, name: &str) -> Option<String> {
            self.env.get(name).cloned()
        }

        fn uuid(&self) -> String {
            "00000000-0000-4000-8000-000000000000".into()
        }

        fn exists(&self, path: &Path) -> bool {
            self.files.contains_key(path)
        }

        fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
            self.files
                .get(path)
                .cloned()
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
        }
    }

    pub(crate) fn run(
        b: Binary,
        args: &[&str],
        host: &FakeHost,
    ) -> Result<Translation, CompatError> {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        translate(b, &v, host)
    }

    /// The translated argv as `--flag value` strings (switches alone),
    /// after `edgetunnel ROLE`.
    pub(crate) fn pairs(t: &Translation) -> Vec<String> {
        let mut out = Vec::new();
        let mut it = t.argv[2..].iter().peekable();
        while let Some(a) = it.next() {
            match it.peek() {
                Some(v) if !v.starts_with("--") => {
                    out.push(format!("{a} {v}"));
                    it.next();
                }
                _ => out.push(a.clone()),
            }
        }
        out
    }

    /// What one flag changed relative to a baseline: pairs added, pairs
    /// gone, warn notes, info notes.
    pub(crate) struct Delta {
        pub added: Vec<String>,
        pub removed: Vec<String>,
        pub warns: Vec<String>,
        pub infos: Vec<String>,
    }

    pub(crate) fn delta(base: &Translation, t: &Translation) -> Delta {
        let (b, n) = (pairs(base), pairs(t));
        let notes = |t: &Translation, warn: bool| -> Vec<String> {
            t.notes
                .iter()
                .filter_map(|x| match (x, warn) {
                    (Note::Warn(s), true) | (Note::Info(s), false) => Some(s.clone()),
                    _ => None,
                })
                .collect()
        };
        let (bw, bi) = (notes(base, true), notes(base, false));
        Delta {
            added: n.iter().filter(|x| !b.contains(x)).cloned().collect(),
            removed: b.iter().filter(|x| !n.contains(x)).cloned().collect(),
            warns: notes(t, true)
                .into_iter()
                .filter(|x| !bw.contains(x))
                .collect(),
            infos: notes(t, false)
                .into_iter()
                .filter(|x| !bi.contains(x))
                .collect(),
        }
    }

    /// What a table test expects of one flag.
    pub(crate) enum Expect {
        /// These pairs appear (replacing whatever they replace), no warning.
        Maps(&'static [&'static str]),
        /// These pairs appear, with a warning containing the text.
        MapsWarn(&'static [&'static str], &'static str),
        /// A warning naming the flag; the argv is unchanged.
        NoEffect,
        /// An info line naming the flag; the argv is unchanged.
        Same,
        /// The translation fails with a message containing this.
        Fails(&'static str),
    }

    /// Runs `cases` (one argument list each, on top of `base_args`) and
    /// checks each against `Expect`; also checks that every flag of the
    /// binary has a case, and that clap takes every translated argv.
    pub(crate) fn check_table(
        b: Binary,
        base_args: &[&str],
        host: &FakeHost,
        cases: &[(&[&str], Expect)],
    ) {
        let base = run(b, base_args, host).expect("baseline translates");
        assert_clap_accepts(&base);
        for f in b.table() {
            let named = |a: &str| {
                let a = a.trim_start_matches('-');
                let n = a.split('=').next().unwrap_or(a);
                n == f.spec.name
                    || Some(n) == f.spec.alias
                    || f.spec.shorthand.map(|c| c.to_string()).as_deref() == Some(n)
            };
            assert!(
                cases.iter().any(|(args, _)| args.iter().any(|a| named(a))),
                "{}: no table case for --{}",
                b.name(),
                f.spec.name
            );
        }
        for (args, expect) in cases {
            let mut all: Vec<&str> = base_args.to_vec();
            all.extend_from_slice(args);
            let got = run(b, &all, host);
            let what = format!("{} {args:?}", b.name());
            if let Expect::Fails(msg) = expect {
                let e = got.expect_err(&what).to_string();
                assert!(e.contains(msg), "{what}: error {e:?} lacks {msg:?}");
                continue;
            }
            let t = got.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_clap_accepts(&t);
            let d = delta(&base, &t);
            // Notes name flags canonically (klog's `log_file` as `log-file`).
            let flag_name = args[0]
                .trim_start_matches('-')
                .split('=')
                .next()
                .unwrap()
                .replace('_', "-");
            let flag_name = flag_name.as_str();
            match expect {
                Expect::Maps(want) => {
                    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
                    assert_eq!(
                        d.added, want,
                        "{what}: added pairs (removed {:?})",
                        d.removed
                    );
                    assert!(
                        d.warns.is_empty(),
                        "{what}: unexpected warnings {:?}",
                        d.warns
                    );
                }
                Expect::MapsWarn(want, warn) => {
                    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
                    assert_eq!(
                        d.added, want,
                        "{what}: added pairs (removed {:?})",
                        d.removed
                    );
                    assert!(
                        d.warns.iter().any(|w| w.contains(warn)),
                        "{what}: no warning with {warn:?}: {:?}",
                        d.warns
                    );
                }
                Expect::NoEffect => {
                    assert!(
                        d.added.is_empty() && d.removed.is_empty(),
                        "{what}: argv changed: +{:?} -{:?}",
                        d.added,
                        d.removed
                    );
                    assert!(
                        d.warns
                            .iter()
                            .any(|w| w.contains("no effect") && w.contains(flag_name)),
                        "{what}: no warning naming {flag_name}: {:?}",
                        d.warns
                    );
                }
                Expect::Same => {
                    assert!(
                        d.added.is_empty() && d.removed.is_empty(),
                        "{what}: argv changed: +{:?} -{:?}",
                        d.added,
                        d.removed
                    );
                    assert!(
                        d.warns.is_empty(),
                        "{what}: unexpected warnings {:?}",
                        d.warns
                    );
                    assert!(
                        d.infos.iter().any(|w| w.contains(flag_name)),
                        "{what}: no info line naming {flag_name}: {:?}",
                        d.infos
                    );
                }
                Expect::Fails(_) => unreachable!(),
            }
        }
    }

    /// edgetunnel's own parser takes the translated command line.
    pub(crate) fn assert_clap_accepts(t: &Translation) {
        use clap::Parser as _;
        if let Err(e) = crate::cli::Cli::try_parse_from(&t.argv) {
            panic!("clap refuses {:?}: {e}", t.argv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// `EDGETUNNEL_HANDOVER_SOCKET` gives every face the handover (Go's
    /// arguments unchanged); an empty value gives nothing.
    #[test]
    fn the_handover_socket_comes_from_the_environment() {
        let anp = [
            "--cluster-cert=/pki/apiserver.crt",
            "--cluster-key=/pki/apiserver.key",
            "--cluster-ca-cert=/pki/ca.crt",
            "--uds-name=/run/konnectivity.sock",
            "--server-port=0",
        ];
        let agent = [
            "--ca-cert=/ca.crt",
            "--agent-cert=/a.crt",
            "--agent-key=/a.key",
        ];
        let with = |v: &str| {
            FakeHost::default()
                .with_file("/pki/ca.crt", b"CA")
                .with_env(HANDOVER_SOCKET_ENV, v)
        };
        let handover = |t: &Translation| {
            pairs(t)
                .into_iter()
                .filter(|p| p.starts_with("--handover-socket"))
                .collect::<Vec<_>>()
        };
        let sock = "/run/konnectivity/handover.socket";
        for (b, args) in [
            (Binary::ProxyServer, &anp[..]),
            (Binary::YurtTunnelServer, &[][..]),
            (Binary::ProxyAgent, &agent[..]),
        ] {
            let t = run(b, args, &with(sock)).unwrap();
            assert_eq!(handover(&t), [format!("--handover-socket {sock}")]);
            let t = run(b, args, &with("")).unwrap();
            assert!(handover(&t).is_empty(), "{:?}", t.argv);
        }
    }

    #[test]
    fn detects_program_name_and_subcommand() {
        let a = s(&["/proxy-server", "--mode=grpc"]);
        let (b, rest) = detect(&a).unwrap();
        assert_eq!(b, Binary::ProxyServer);
        assert_eq!(rest, &a[1..]);
        let a = s(&["/usr/local/bin/yurt-tunnel-agent"]);
        assert_eq!(detect(&a).unwrap().0, Binary::YurtTunnelAgent);
        let a = s(&["edgetunnel", "proxy-agent", "--ca-cert=x"]);
        let (b, rest) = detect(&a).unwrap();
        assert_eq!(b, Binary::ProxyAgent);
        assert_eq!(rest, &a[2..]);
        assert!(detect(&s(&["edgetunnel", "server", "--agent-bind", "x"])).is_none());
        assert!(detect(&s(&["edgetunnel"])).is_none());
        assert!(detect(&s(&["proxy-server-2"])).is_none());
    }

    #[test]
    fn every_default_parses_and_names_are_unique() {
        for b in Binary::ALL {
            let table = b.table();
            let mut names: Vec<&str> = table.iter().map(|f| f.spec.name).collect();
            names.extend(table.iter().filter_map(|f| f.spec.alias));
            let n = names.len();
            names.sort();
            names.dedup();
            assert_eq!(n, names.len(), "{}: duplicate flag names", b.name());
            for f in &table {
                goflag::parse_value(f.spec.kind, f.spec.default)
                    .unwrap_or_else(|e| panic!("{} --{}: {e}", b.name(), f.spec.name));
            }
            let help = usage(b, &table);
            for f in &table {
                let want = format!("--{}", f.spec.name);
                assert!(
                    help.lines().any(|l| l
                        .split_whitespace()
                        .any(|w| w.trim_end_matches(',') == want)),
                    "{}",
                    f.spec.name
                );
            }
        }
    }

    #[test]
    fn help_version_and_unknown_flags() {
        let h = FakeHost::default();
        for b in Binary::ALL {
            match run(b, &["--help"], &h) {
                Err(CompatError::Help(text)) => {
                    assert!(text.starts_with(&format!("Usage of {}", b.name())))
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(
                run(b, &["--no-such-flag"], &h).unwrap_err().to_string(),
                "unknown flag: --no-such-flag"
            );
        }
        assert!(matches!(
            run(Binary::YurtTunnelServer, &["--version"], &h),
            Err(CompatError::Version(v)) if v.starts_with("yurttunnel-server: edgetunnel")
        ));
        assert!(matches!(
            run(Binary::YurtTunnelAgent, &["--version=true"], &h),
            Err(CompatError::Version(_))
        ));
        assert_eq!(
            run(Binary::ProxyServer, &["--version"], &h)
                .unwrap_err()
                .to_string(),
            "unknown flag: --version"
        );
    }

    #[test]
    fn uuids_look_like_go_ones() {
        let u = uuid_v4([0xff; 16]);
        assert_eq!(u, "ffffffff-ffff-4fff-bfff-ffffffffffff");
        let u = System.uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }

    #[test]
    fn addresses() {
        assert_eq!(join_host_port("::1", 8091), "[::1]:8091");
        assert_eq!(join_host_port("node.example", 8091), "node.example:8091");
        assert_eq!(bind_addr("x", "", 1).unwrap().to_string(), "0.0.0.0:1");
        assert_eq!(bind_addr("x", "::", 1).unwrap().to_string(), "[::]:1");
        assert_eq!(bind_addr("x", "[::1]", 1).unwrap().to_string(), "[::1]:1");
        assert_eq!(
            bind_addr("x", "localhost", 1).unwrap().to_string(),
            "127.0.0.1:1"
        );
        assert!(bind_addr("x", "example.com", 1).is_err());
        assert_eq!(seconds(1_500_000_000), "1.5");
        assert_eq!(seconds(3_600_000_000_000), "3600");
        assert_eq!(whole_seconds(1), 1);
        assert_eq!(whole_seconds(2_000_000_000), 2);
    }
}
