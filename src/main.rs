use clap::Parser;
use edgetunnel::cli::{CertsCommand, Cli, Command};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // kubectl's wording for the drop-in `proxy`.
    let prefix = match cli.command {
        Command::Proxy(_) => "error",
        _ => "edgetunnel",
    };
    let result: Result<(), Box<dyn std::error::Error + Send + Sync>> = match cli.command {
        Command::Server(args) => args.into_config().and_then(edgetunnel::server::run),
        Command::Agent(args) => args.into_config().and_then(edgetunnel::agent::run),
        Command::Proxy(args) => edgetunnel::proxy::run(*args),
        Command::Certs(CertsCommand::Init {
            dir,
            server_names,
            agent_name,
        }) => {
            let spec = edgetunnel::certs::CertsSpec {
                server_names,
                agent_name,
            };
            edgetunnel::certs::init(&dir, &spec)
                .map(|_| {
                    println!(
                        "wrote ca.crt, server.crt/key, agent.crt/key to {}",
                        dir.display()
                    )
                })
                .map_err(Into::into)
        }
    };
    if let Err(e) = result {
        eprintln!("{prefix}: {e}");
        std::process::exit(1);
    }
}
