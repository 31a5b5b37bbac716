//! The server's listeners as data: [`specs`] lists what the configuration
//! asks for, [`engine::listener::bind_all`] binds them on the main
//! thread, and [`serve`] starts each worker's accept loops.
//!
//! | kind              | on            | workers | accept loop                          | TLS                         | on drain    |
//! |-------------------|---------------|---------|--------------------------------------|-----------------------------|-------------|
//! | `Agent`           | TCP           | every   | `agent_conn::accept_loop`            | agent (mutual)              | closed      |
//! | `Connect`         | TCP, unix     | every   | `connect_frontend::accept_tcp/unix`  | frontend `http/1.1`, if set | closed      |
//! | `Grpc`            | TCP, unix     | every   | `grpc_frontend::accept_tcp/unix`     | frontend `h2`, if set       | closed      |
//! | `Interception`    | TCP           | every   | `intercept_frontend::accept_tcp`     | none                        | closed      |
//! | `InterceptionTls` | TCP           | every   | `intercept_frontend::accept_tls`     | interception + kubelet      | closed      |
//! | `Admin`, `Health` | TCP           | first   | `admin::serve`                       | none                        | kept open (closed after a handover) |
//! | `Forward`         | unix          | every   | `connect_frontend::accept_forwarded` | none                        | kept open   |
//!
//! TLS applies to TCP sockets only: a unix socket's callers are local.

use std::rc::Rc;
use std::sync::Arc;

use engine::listener::{Endpoint, Listening, Socket, Spec, Spread};

use super::{
    agent_conn, connect_frontend, grpc_frontend, intercept_frontend, ServerConfig, ServerState,
    WorkerTls,
};

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Agent,
    Connect,
    Grpc,
    Interception,
    InterceptionTls,
    Admin,
    Health,
    /// CONNECT from this server's successor while this one drains (see
    /// `predecessor.rs`): with `--handover-socket` only.
    Forward,
}

/// Where a server with `--handover-socket` takes dials from its successor
/// once it handed over: beside the handover socket, named after the
/// process, so that old and new never share it.
pub(super) fn forward_path(cfg: &ServerConfig) -> Option<std::path::PathBuf> {
    let h = cfg.handover_socket.as_ref()?;
    let mut name = h.file_name()?.to_os_string();
    name.push(format!(".forward-{}", forward_suffix()));
    Some(h.with_file_name(name))
}

/// This process's part of its forward socket's name: its pid and the
/// time it first asked, since in containers old and new server are both
/// pid 1 (the same name made the successor's bind fail, and the
/// handover with it).
fn forward_suffix() -> &'static str {
    static SUFFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SUFFIX.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
    })
}

/// The listeners `cfg` asks for, in the order they are bound (the first
/// that fails ends the start; the agent listener is tried first).
pub(super) fn specs(cfg: &ServerConfig) -> Vec<Spec<Kind>> {
    let every = |kind, name, at| Spec {
        kind,
        name,
        at,
        spread: Spread::EveryWorker,
    };
    let first = |kind, name, at| Spec {
        kind,
        name,
        at,
        spread: Spread::FirstWorker,
    };
    let tcp = Endpoint::Tcp;
    let unix = Endpoint::Unix;
    let mut out = vec![every(Kind::Agent, "agent", tcp(cfg.agent_bind))];
    out.extend(
        cfg.connect_bind
            .map(|a| every(Kind::Connect, "connect", tcp(a))),
    );
    out.extend(
        cfg.connect_uds
            .clone()
            .map(|p| every(Kind::Connect, "connect-uds", unix(p))),
    );
    out.extend(cfg.grpc_bind.map(|a| every(Kind::Grpc, "grpc", tcp(a))));
    out.extend(
        cfg.grpc_uds
            .clone()
            .map(|p| every(Kind::Grpc, "grpc-uds", unix(p))),
    );
    out.extend(cfg.admin_bind.map(|a| first(Kind::Admin, "admin", tcp(a))));
    out.extend(
        cfg.health_bind
            .map(|a| first(Kind::Health, "health", tcp(a))),
    );
    out.extend(
        cfg.interception_bind
            .map(|a| every(Kind::Interception, "interception", tcp(a))),
    );
    out.extend(
        cfg.interception_tls
            .as_ref()
            .map(|t| every(Kind::InterceptionTls, "interception-tls", tcp(t.bind))),
    );
    out.extend(forward_path(cfg).map(|p| every(Kind::Forward, "forward", unix(p))));
    out
}

/// Starts the accept loop of one of worker `core`'s sockets (see the table
/// in the module docs).
pub(super) fn serve(
    core: usize,
    shared: &Arc<ServerState>,
    tls: &WorkerTls,
    l: Listening<Kind>,
) -> std::io::Result<()> {
    use monoio::net::{TcpListener, UnixListener};
    let s = shared.clone();
    let (frontend, name) = (tls.frontend.as_ref(), l.name);
    match (l.kind, l.socket) {
        (Kind::Agent, Socket::Tcp(l)) => {
            let l = TcpListener::from_std(l)?;
            spawn_loop(
                shared,
                agent_conn::accept_loop(core, s, l, tls.agent.clone()),
            )
        }
        (Kind::Connect, Socket::Tcp(l)) => {
            let l = TcpListener::from_std(l)?;
            let tls = frontend.map(|t| t.connect.clone());
            spawn_loop(shared, connect_frontend::accept_tcp(core, s, l, tls))
        }
        (Kind::Connect, Socket::Unix(l)) => {
            let l = UnixListener::from_std(l)?;
            spawn_loop(shared, connect_frontend::accept_unix(core, s, l))
        }
        // Not stopped by the drain: the successor's dials come here then.
        (Kind::Forward, Socket::Unix(l)) => {
            let l = UnixListener::from_std(l)?;
            monoio::spawn(connect_frontend::accept_forwarded(core, s, l));
        }
        (Kind::Grpc, Socket::Tcp(l)) => {
            let l = TcpListener::from_std(l)?;
            let tls = frontend.map(|t| t.grpc.clone());
            spawn_loop(shared, grpc_frontend::accept_tcp(s, l, tls))
        }
        (Kind::Grpc, Socket::Unix(l)) => {
            let l = UnixListener::from_std(l)?;
            spawn_loop(shared, grpc_frontend::accept_unix(s, l))
        }
        (Kind::Interception, Socket::Tcp(l)) => {
            let l = TcpListener::from_std(l)?;
            spawn_loop(shared, intercept_frontend::accept_tcp(core, s, l))
        }
        (Kind::InterceptionTls, Socket::Tcp(l)) => {
            let t = tls.intercept.clone().ok_or_else(|| {
                std::io::Error::other("interception-tls listener without its TLS settings")
            })?;
            let l = TcpListener::from_std(l)?;
            spawn_loop(shared, intercept_frontend::accept_tls(core, s, l, t))
        }
        // Health and admin keep answering while the server drains (/readyz
        // then fails), unless a successor took their sockets over.
        (Kind::Admin | Kind::Health, Socket::Tcp(l)) => {
            let l = TcpListener::from_std(l)?;
            let stop = Some(s.handed_over.clone());
            let view: Rc<dyn crate::admin::AdminState> = Rc::new(super::AdminView(s));
            // Counted apart: these run on through a plain drain.
            spawn_counted(
                &shared.accepting_admin,
                crate::admin::serve(l, name, view, stop),
            );
        }
        (kind, Socket::Unix(_)) => {
            return Err(std::io::Error::other(format!(
                "{name} listener ({kind:?}): no accept loop for a unix socket"
            )))
        }
        (Kind::Forward, Socket::Tcp(_)) => {
            return Err(std::io::Error::other(format!(
                "{name} listener: the forward socket is a unix socket"
            )))
        }
    }
    Ok(())
}

/// Spawns `task`, an accept loop that ends by itself when the server
/// drains ([`ServerState::accept_options`]), losing no connection; counted
/// in [`ServerState::accepting`] while it runs.
fn spawn_loop(shared: &Arc<ServerState>, task: impl std::future::Future<Output = ()> + 'static) {
    spawn_counted(&shared.accepting, task);
}

/// Spawns `task`, counted in `count` while it runs.
fn spawn_counted(
    count: &Arc<std::sync::atomic::AtomicUsize>,
    task: impl std::future::Future<Output = ()> + 'static,
) {
    /// Counts the loop out when it ends, or when its task is dropped.
    struct Counted(Arc<std::sync::atomic::AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let counted = Counted(count.clone());
    monoio::spawn(async move {
        let _counted = counted;
        task.await;
    });
}
