use clap::Parser;
use edgetunnel::cli::{Cli, Command, IptablesCommand};
use edgetunnel::readiness::Announce;

// `--features system-alloc` keeps the system allocator, for heap profilers
// that see only malloc (heaptrack, valgrind massif).
// Either counts the live heap (`edgetunnel_heap_live_bytes`).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: engine::heap::Counting<mimalloc::MiMalloc> =
    engine::heap::Counting(mimalloc::MiMalloc);
#[cfg(feature = "system-alloc")]
#[global_allocator]
static GLOBAL: engine::heap::Counting<std::alloc::System> =
    engine::heap::Counting(std::alloc::System);

fn main() {
    GLOBAL.start();
    // Before the runtimes allocate: no huge pages (memory per idle tunnel).
    let thp = engine::memory::at_start();
    // `proxy-server`, `yurt-tunnel-agent`, ...: the Go binaries' flags.
    let compat = edgetunnel::compat::from_process_args();
    let cli = match &compat {
        Some(t) => Cli::parse_from(&t.argv),
        // `proxy`: kubectl's flags in Go's syntax.
        None => match kubectl_proxy::goargs::from_process_args() {
            Some(argv) => Cli::parse_from(argv),
            None => Cli::parse(),
        },
    };
    // kubectl's -v/--vmodule raise the proxy's log filter.
    let log = match &cli.command {
        Command::Proxy(a) => {
            kubectl_proxy::klog::filter(&cli.log, kubectl_proxy::klog::verbosity(a.v, &a.vmodule))
        }
        _ => cli.log.clone(),
    };
    let spec = edgetunnel::logging::LogSpec {
        filter: log,
        format: cli.log_format,
        file: cli.log_file.clone(),
        stderr_threshold: cli.log_stderr_threshold,
    };
    if let Err(e) = edgetunnel::logging::init(&spec) {
        say(&format!("edgetunnel: {e}"));
        std::process::exit(2);
    }
    if let Some(t) = &compat {
        t.log_notes();
    }
    // Every role: the soft descriptor limit up to the hard one (Go's
    // runtime does the same at start since Go 1.19, os/rlimit.go), so that
    // the usual soft 1,024 does not bound tunnels and handshakes.
    match engine::sys::raise_nofile_limit() {
        // The drop-in `proxy` keeps kubectl's quiet stderr.
        Ok((soft, hard)) if matches!(cli.command, Command::Proxy(_)) => {
            tracing::debug!(soft, hard, "descriptor limit (RLIMIT_NOFILE)")
        }
        Ok((soft, hard)) => tracing::info!(soft, hard, "descriptor limit (RLIMIT_NOFILE)"),
        Err(e) => tracing::warn!(error = %e, "soft descriptor limit not raised to the hard one"),
    }
    if let Err(e) = thp {
        tracing::warn!(error = %e, "transparent huge pages stay on: more memory per idle tunnel");
    }
    // kubectl's wording for the drop-in `proxy`.
    let prefix = match cli.command {
        Command::Proxy(_) => "error",
        _ => "edgetunnel",
    };
    let result: Result<(), Box<dyn std::error::Error + Send + Sync>> = match cli.command {
        Command::Server(args) => (*args).into_config().and_then(|mut cfg| {
            cfg.announce = stdout_announce();
            edgetunnel::server::run(cfg)
        }),
        Command::Agent(args) => (*args).into_config().and_then(|mut cfg| {
            cfg.announce = stdout_announce();
            edgetunnel::agent::run(cfg)
        }),
        Command::Proxy(args) => kubectl_proxy::run(*args, stdout_announce()),
        Command::Iptables(cmd) => iptables(cmd),
        Command::Certs(cmd) => edgetunnel::certs::run(cmd),
    };
    // Lines still queued for the log thread are written before exiting.
    edgetunnel::logging::flush(std::time::Duration::from_secs(1));
    if let Err(e) = result {
        say(&format!("{prefix}: {e}"));
        std::process::exit(1);
    }
}

fn iptables(cmd: IptablesCommand) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use edgetunnel::control::{iptables::Family, iptables_sync, manager};
    match cmd {
        IptablesCommand::Sync {
            ports,
            dnat_ip,
            dnat_port,
            edge_ip,
            cloud_node_ip,
        } => {
            let spec = manager::IptablesSpec {
                ports: manager::port_rules(&ports, &dnat_ip, dnat_port),
                dnat: manager::DnatTarget {
                    addrs: dnat_ip.clone(),
                    plain_port: dnat_port,
                    tls_port: dnat_port,
                },
                cloud_nodes: (!cloud_node_ip.is_empty())
                    .then(|| cloud_node_ip.into_iter().collect()),
                period: manager::MIN_SYNC_PERIOD,
                keep_rules: true,
            };
            let edges = edge_ip.into_iter().collect();
            manager::try_sync_once(&spec, &edges)?;
            Ok(())
        }
        IptablesCommand::Cleanup => {
            iptables_sync::cleanup(Family::V4)?;
            if let Err(e) = iptables_sync::cleanup(Family::V6) {
                say(&format!("edgetunnel: ip6tables cleanup skipped: {e}"));
            }
            Ok(())
        }
    }
}

/// Readiness lines on stdout, where supervisors and tests wait for them. A
/// closed stdout is ignored (`println!` would panic the reporting thread).
fn stdout_announce() -> Announce {
    Announce::new(|ready| {
        use std::io::Write;
        // What was logged before a LISTEN or READY line is written before
        // it (lines go through the log thread), waiting at most 1 s.
        edgetunnel::logging::flush(std::time::Duration::from_secs(1));
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{ready}").and_then(|()| out.flush());
    })
}

/// One line on stderr that cannot panic (`eprintln!` does when stderr is
/// closed).
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
