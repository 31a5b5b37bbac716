//! Listening sockets, bound on the main thread before any worker starts.
//!
//! A role lists the listeners it wants as [`Spec`]s (its own kind, a name,
//! a TCP address or a socket path, which workers accept) and binds them all
//! with [`bind_all`], which fails at the first listener that cannot be
//! bound with `NAME listener: binding ADDRESS: CAUSE`.
//!
//! TCP: one SO_REUSEPORT socket per worker on the same address (the kernel
//! spreads connections across cores), made exclusive to this process; unix
//! sockets: one socket shared by the workers (duplicated descriptors),
//! created with a fixed mode, replacing only a stale socket file, and removed
//! again when the server stops (see [`UnixSocketFile`]).
//!
//! # Why the SO_REUSEPORT group is exclusive
//!
//! The kernel lets any later socket of the same user with SO_REUSEPORT join
//! a group, so a second instance on the same port used to start silently and
//! take a share of the connections. What was measured (Linux 6.18, 4
//! members, 400 loopback dials each, a Python harness):
//!
//! - a plain second SO_REUSEPORT socket joins and gets ~1/5 of the dials;
//! - a socket with SO_REUSEADDR and *without* SO_REUSEPORT fails with
//!   EADDRINUSE against the live group (`inet_bind_conflict`: a listener
//!   only tolerates another binder when both have SO_REUSEPORT);
//! - clearing SO_REUSEPORT on one member after listen() does not stop
//!   joiners: `inet_csk_get_port` takes the `sk_reuseport_match` fast path
//!   on the bind bucket's cached `fastreuseport`, which only a bind updates,
//!   so the conflict check never runs. It also breaks spreading when the
//!   cleared member is the one `inet_lhash2_lookup` finds first (the newest,
//!   at the bucket's head: all 400 dials went to it), because the lookup
//!   only consults the group through a member that still has SO_REUSEPORT;
//! - a classic BPF program (SO_ATTACH_REUSEPORT_CBPF) returning
//!   `rxhash % n` spreads as evenly as the kernel's own hash (91/90/114/105
//!   against 95/96/106/103) and a stranger that joins afterwards (index n)
//!   gets no connection at all.
//!
//! So a group is built as: take a per-address lock (an abstract unix socket
//! name, released by the kernel when the process dies) so two instances
//! starting at the same moment are serialised; probe-bind the address
//! without SO_REUSEPORT (fails while anyone listens there; retried for 2 s
//! because a process that used io_uring releases its sockets late after it
//! exits); bind the group; attach the BPF steering so that any socket that
//! still joins later (a program that does not probe) receives nothing. A
//! single listener (count 1) simply binds without SO_REUSEPORT.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use socket2::{Domain, Protocol, Type};

const BACKLOG: i32 = 4096;
/// How long EADDRINUSE is retried (a restarted process's old sockets).
const RETRY_FOR: Duration = Duration::from_secs(2);
const RETRY_EVERY: Duration = Duration::from_millis(50);

fn tcp_socket(addr: SocketAddr, reuseport: bool) -> io::Result<socket2::Socket> {
    let socket =
        socket2::Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // SO_REUSEADDR: binding over a previous run's TIME_WAIT connections.
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(reuseport)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

fn listening(addr: SocketAddr, reuseport: bool) -> io::Result<std::net::TcpListener> {
    let socket = tcp_socket(addr, reuseport)?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// Runs `f` until it stops failing with EADDRINUSE or [`RETRY_FOR`] passed.
fn retry_in_use<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let deadline = std::time::Instant::now() + RETRY_FOR;
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                if std::time::Instant::now() >= deadline {
                    return Err(e);
                }
                std::thread::sleep(RETRY_EVERY);
            }
            other => return other,
        }
    }
}

/// Binds `count` listeners on `addr`, one per worker, that no other process
/// can join (see the module docs). An address someone else listens on fails
/// with `binding ADDR: address in use`.
///
/// Port 0 is special: the kernel may hand a port-0 bind a port already held
/// by another process's SO_REUSEPORT group (of the same user), which would
/// silently share its traffic. So for port 0 we bind one ordinary socket and
/// give every worker a duplicate of it.
pub fn bind_tcp(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    bind_tcp_inner(addr, count.max(1)).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(e.kind(), in_use_message(addr, listening_ports()))
        } else {
            io::Error::new(e.kind(), format!("binding {addr}: {e}"))
        }
    })
}

/// What to tell about an address in use: a listener there (some process
/// serves that port), or only connections (a socket bound to the port as
/// its local end: an outgoing connection's port, or one closing), which
/// no `ss -ltn` shows. `listening`: the TCP ports in LISTEN state, `None`
/// when /proc/net could not be read.
fn in_use_message(addr: SocketAddr, listening: Option<Vec<u16>>) -> String {
    match listening {
        Some(ports) if !ports.contains(&addr.port()) => format!(
            "binding {addr}: address in use, but nothing listens on port {port}: a connection \
             holds it as its local port (an outgoing connection's port from \
             net.ipv4.ip_local_port_range, or one closing; see `ss -tan sport = :{port}`); \
             choose a port outside that range, or reserve it with \
             net.ipv4.ip_local_reserved_ports",
            port = addr.port()
        ),
        _ => format!(
            "binding {addr}: address in use (another process listens there; see `ss -ltnp sport = :{}`)",
            addr.port()
        ),
    }
}

/// The local ports of TCP sockets in LISTEN state (`/proc/net/tcp` and
/// `tcp6`, state `0A`), of this network namespace.
fn listening_ports() -> Option<Vec<u16>> {
    let mut ports = Vec::new();
    let mut read_any = false;
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        read_any = true;
        ports.extend(listening_in(&text));
    }
    read_any.then_some(ports)
}

/// The LISTEN ports in a `/proc/net/tcp` table.
fn listening_in(table: &str) -> Vec<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let local = f.nth(1)?;
            let state = f.nth(1)?;
            let port = local.rsplit(':').next()?;
            (state == "0A").then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect()
}

fn bind_tcp_inner(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    if addr.port() == 0 || count == 1 {
        let l = retry_in_use(|| listening(addr, false))?;
        let mut out = Vec::with_capacity(count);
        for _ in 1..count {
            out.push(l.try_clone()?);
        }
        out.push(l);
        return Ok(out);
    }
    let _lock = retry_in_use(|| bind_lock(addr))?;
    // The probe: without SO_REUSEPORT it conflicts with any listener there.
    drop(retry_in_use(|| tcp_socket(addr, false))?);
    let group = (0..count)
        .map(|_| listening(addr, true))
        .collect::<io::Result<Vec<_>>>()?;
    if let Err(e) = steer_to_first(&group[0], count) {
        tracing::warn!(%addr, error = %e, "SO_ATTACH_REUSEPORT_CBPF failed: later SO_REUSEPORT binders could share this port");
    }
    Ok(group)
}

/// Held while a group is built: an abstract unix socket named after the
/// address. Abstract names live in the network namespace, like ports, and
/// vanish with the process.
fn bind_lock(addr: SocketAddr) -> io::Result<UnixListener> {
    let name =
        std::os::unix::net::SocketAddr::from_abstract_name(format!("edgetunnel-bind {addr}"))?;
    UnixListener::bind_addr(&name)
}

/// Attaches `return rxhash % count` to the SO_REUSEPORT group of `member`:
/// connections go to the first `count` sockets of the group (ours, which
/// joined first) and never to a later joiner.
fn steer_to_first(member: &std::net::TcpListener, count: usize) -> io::Result<()> {
    const SKF_AD_RXHASH: u32 = 32;
    let ld_rxhash = (libc::SKF_AD_OFF as u32).wrapping_add(SKF_AD_RXHASH);
    let mut prog = [
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: ld_rxhash,
        },
        libc::sock_filter {
            code: (libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: count as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_A) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
    ];
    super::sys::attach_reuseport_cbpf(member, &mut prog)
}

/// How a unix listener treats its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdsOptions {
    /// Permission bits of the socket file, set before anyone can connect.
    pub mode: u32,
    /// Remove an existing socket file nobody listens on. Never anything else:
    /// not a regular file, a symlink, or a live server's socket.
    pub replace_stale: bool,
}

impl Default for UdsOptions {
    fn default() -> Self {
        Self {
            mode: 0o600,
            replace_stale: true,
        }
    }
}

/// The socket file a unix listener created; removed on drop if the path
/// still names that file (not a successor's socket).
#[derive(Debug)]
pub struct UnixSocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl UnixSocketFile {
    /// The socket file at `path` now (a socket passed over by a
    /// predecessor, which created the file).
    pub fn existing(path: &Path) -> io::Result<Self> {
        let md = std::fs::symlink_metadata(path)?;
        if !md.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a socket file", path.display()),
            ));
        }
        Ok(UnixSocketFile {
            path: path.to_path_buf(),
            dev: md.dev(),
            ino: md.ino(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the file in place (a successor took the socket over).
    pub fn keep(mut self) {
        self.path = PathBuf::new();
    }
}

impl Drop for UnixSocketFile {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        if let Ok(md) = std::fs::symlink_metadata(&self.path) {
            if md.dev() == self.dev && md.ino() == self.ino {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Binds a unix listener at `path` and returns `count` descriptors for it,
/// plus the guard that removes the file again.
pub fn bind_unix(
    path: &Path,
    count: usize,
    opts: UdsOptions,
) -> io::Result<(Vec<UnixListener>, UnixSocketFile)> {
    bind_unix_inner(path, count, opts).map_err(|e| {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        match parent {
            Some(dir) if e.kind() == io::ErrorKind::NotFound && !dir.is_dir() => {
                io::Error::new(
                    e.kind(),
                    format!(
                        "binding {}: the directory {} does not exist; create it (e.g. a volume mounted there) or choose a socket path in an existing directory",
                        path.display(),
                        dir.display()
                    ),
                )
            }
            _ => io::Error::new(e.kind(), format!("binding {}: {e}", path.display())),
        }
    })
}

/// Removes a stale socket file at `path`; an error for anything else there.
fn clear_path(path: &Path, opts: UdsOptions) -> io::Result<()> {
    let md = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    if !md.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket; not removing it",
        ));
    }
    if !opts.replace_stale {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "address in use (a socket file exists and existing files are kept)",
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "address in use (a live server accepts connections on this socket)",
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing stale socket file");
            std::fs::remove_file(path)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("existing socket file could not be checked: {e}"),
        )),
    }
}

fn bind_unix_inner(
    path: &Path,
    count: usize,
    opts: UdsOptions,
) -> io::Result<(Vec<UnixListener>, UnixSocketFile)> {
    clear_path(path, opts)?;
    let mode = opts.mode & 0o777;
    // The file gets 0777 & !umask at bind(): with this umask it is born with
    // `mode`, so there is no moment when it is wider. umask is per process;
    // listeners are bound on the main thread before any other thread starts.
    let bound = super::sys::with_umask(!mode & 0o777, || UnixListener::bind(path));
    let l = bound.map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(e.kind(), "address in use")
        } else {
            e
        }
    })?;
    let md = std::fs::symlink_metadata(path)?;
    let file = UnixSocketFile {
        path: path.to_path_buf(),
        dev: md.dev(),
        ino: md.ino(),
    };
    l.set_nonblocking(true)?;
    let mut out = Vec::with_capacity(count);
    for _ in 1..count.max(1) {
        out.push(l.try_clone()?);
    }
    out.push(l);
    Ok((out, file))
}

/// Where a listener listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// Which workers accept on a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Every worker: an exclusive SO_REUSEPORT group (TCP, see the module
    /// docs) or one duplicated descriptor per worker (unix).
    EveryWorker,
    /// Worker 0 only (admin and health: a few requests, no data plane).
    FirstWorker,
}

/// One listener a role asks for. `kind` is the role's own tag, telling
/// which accept loop (and TLS) serves the sockets; `name` is what messages
/// and `LISTEN` lines call it.
#[derive(Debug, Clone)]
pub struct Spec<K> {
    pub kind: K,
    pub name: &'static str,
    pub at: Endpoint,
    pub spread: Spread,
}

/// A bound listening socket, not yet registered with any runtime.
#[derive(Debug)]
pub enum Socket {
    Tcp(std::net::TcpListener),
    Unix(UnixListener),
}

/// One worker's socket of a listener.
#[derive(Debug)]
pub struct Listening<K> {
    pub kind: K,
    pub name: &'static str,
    pub socket: Socket,
}

/// Everything [`bind_all`] bound.
#[derive(Debug)]
pub struct Bound<K> {
    /// Each worker's sockets, in the order of the specs.
    pub per_worker: Vec<Vec<Listening<K>>>,
    /// `(name, address)` of every listener: the TCP ones (with the port
    /// the kernel chose for port 0) in the order of the specs, then the
    /// socket paths. Roles announce them as `LISTEN name address` lines,
    /// in this order.
    pub addresses: Vec<(&'static str, String)>,
    /// Removes the socket files when dropped: keep it until the workers
    /// stopped.
    pub files: Vec<UnixSocketFile>,
}

/// Binds every listener of `specs` for `workers` workers, in order. The
/// first that fails ends the start: `NAME listener: binding ADDRESS:
/// CAUSE` (with [`bind_tcp`]'s and [`bind_unix`]'s causes); the socket
/// files created before it are removed again.
pub fn bind_all<K: Clone>(
    specs: &[Spec<K>],
    workers: usize,
    uds: UdsOptions,
) -> io::Result<Bound<K>> {
    bind_all_with(specs, workers, uds, Vec::new())
}

/// [`bind_all`], with sockets a predecessor passed over
/// ([`super::handover`]): `inherited[i]` holds the sockets of `specs[i]`
/// (empty, or missing: bind it). A TCP listener's sockets are spread over
/// the workers (a worker takes several when there are more sockets than
/// workers, and workers share one when there are fewer); a unix listener's
/// one socket is duplicated for each worker.
pub fn bind_all_with<K: Clone>(
    specs: &[Spec<K>],
    workers: usize,
    uds: UdsOptions,
    mut inherited: Vec<Vec<std::os::fd::OwnedFd>>,
) -> io::Result<Bound<K>> {
    let workers = workers.max(1);
    let mut bound = Bound {
        per_worker: (0..workers).map(|_| Vec::new()).collect(),
        addresses: Vec::new(),
        files: Vec::new(),
    };
    let mut paths = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{} listener: {e}", spec.name));
        let count = match spec.spread {
            Spread::EveryWorker => workers,
            Spread::FirstWorker => 1,
        };
        let passed = inherited.get_mut(i).map(std::mem::take).unwrap_or_default();
        if !passed.is_empty() {
            let (sockets, file) = adopt(&spec.at, passed, count).map_err(named)?;
            match (&spec.at, file) {
                (Endpoint::Unix(path), Some(file)) => {
                    bound.files.push(file);
                    paths.push((spec.name, path.display().to_string()));
                }
                _ => {
                    let local = match &sockets[0][0] {
                        Socket::Tcp(l) => l.local_addr().map_err(named)?.to_string(),
                        Socket::Unix(_) => String::new(),
                    };
                    bound.addresses.push((spec.name, local));
                }
            }
            for (worker, mine) in sockets.into_iter().enumerate() {
                for socket in mine {
                    bound.per_worker[worker].push(Listening {
                        kind: spec.kind.clone(),
                        name: spec.name,
                        socket,
                    });
                }
            }
            continue;
        }
        let sockets: Vec<Socket> = match &spec.at {
            Endpoint::Tcp(addr) => {
                let ls = bind_tcp(*addr, count).map_err(named)?;
                let local = ls[0].local_addr().map_err(named)?;
                bound.addresses.push((spec.name, local.to_string()));
                ls.into_iter().map(Socket::Tcp).collect()
            }
            Endpoint::Unix(path) => {
                let (ls, file) = bind_unix(path, count, uds).map_err(named)?;
                bound.files.push(file);
                paths.push((spec.name, path.display().to_string()));
                ls.into_iter().map(Socket::Unix).collect()
            }
        };
        for (worker, socket) in sockets.into_iter().enumerate() {
            bound.per_worker[worker].push(Listening {
                kind: spec.kind.clone(),
                name: spec.name,
                socket,
            });
        }
    }
    bound.addresses.extend(paths);
    Ok(bound)
}

/// Passed sockets spread over `count` workers: each worker's sockets, and
/// for a unix listener the guard of its file.
fn adopt(
    at: &Endpoint,
    passed: Vec<std::os::fd::OwnedFd>,
    count: usize,
) -> io::Result<(Vec<Vec<Socket>>, Option<UnixSocketFile>)> {
    let wrap = |fd: std::os::fd::OwnedFd| -> io::Result<Socket> {
        Ok(match at {
            Endpoint::Tcp(_) => {
                let l = std::net::TcpListener::from(fd);
                l.set_nonblocking(true)?;
                Socket::Tcp(l)
            }
            Endpoint::Unix(_) => {
                let l = UnixListener::from(fd);
                l.set_nonblocking(true)?;
                Socket::Unix(l)
            }
        })
    };
    let dup = |s: &Socket| -> io::Result<Socket> {
        Ok(match s {
            Socket::Tcp(l) => Socket::Tcp(l.try_clone()?),
            Socket::Unix(l) => Socket::Unix(l.try_clone()?),
        })
    };
    let file = match at {
        Endpoint::Unix(path) => Some(UnixSocketFile::existing(path)?),
        Endpoint::Tcp(_) => None,
    };
    let sockets = passed
        .into_iter()
        .map(wrap)
        .collect::<io::Result<Vec<_>>>()?;
    let mut out: Vec<Vec<Socket>> = (0..count).map(|_| Vec::new()).collect();
    let k = sockets.len();
    if k >= count {
        for (j, s) in sockets.into_iter().enumerate() {
            out[j % count].push(s);
        }
    } else {
        for (w, mine) in out.iter_mut().enumerate() {
            mine.push(dup(&sockets[w % k])?);
        }
    }
    Ok((out, file))
}

/// Parses a `--uds-mode` value: octal permission bits, e.g. `0600` or `660`.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o777 && !digits.is_empty() => Ok(m),
        _ => Err(format!("{s:?} is not an octal mode like 0600")),
    }
}

/// Sets TCP_NODELAY, ignoring failures (not every socket is TCP).
pub fn nodelay(fd: &impl AsRawFd) {
    let _ = super::sys::with_sock(fd, |s| s.set_nodelay(true));
}

#[cfg(test)]
mod in_use_tests {
    use super::*;

    #[test]
    fn listen_state_ports_are_read_from_proc_net_tcp() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n   1: 0100007F:F591 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2 1\n";
        assert_eq!(listening_in(t), vec![8080]);
        let a: SocketAddr = "127.0.0.1:62865".parse().unwrap();
        assert!(in_use_message(a, Some(vec![8080])).contains("nothing listens on port 62865"));
        assert!(in_use_message(a, Some(vec![62865])).contains("another process listens there"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0600"), Ok(0o600));
        assert_eq!(parse_mode("660"), Ok(0o660));
        assert_eq!(parse_mode("0o770"), Ok(0o770));
        assert!(parse_mode("0800").is_err());
        assert!(parse_mode("1777").is_err());
        assert!(parse_mode("").is_err());
    }

    #[test]
    fn bind_all_spreads_names_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("et-bind-all-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("a.sock");
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let specs = [
            Spec {
                kind: 1,
                name: "one",
                at: Endpoint::Tcp(any),
                spread: Spread::EveryWorker,
            },
            Spec {
                kind: 2,
                name: "two",
                at: Endpoint::Unix(sock.clone()),
                spread: Spread::EveryWorker,
            },
            Spec {
                kind: 3,
                name: "three",
                at: Endpoint::Tcp(any),
                spread: Spread::FirstWorker,
            },
        ];
        let bound = bind_all(&specs, 3, UdsOptions::default()).unwrap();
        let kinds: Vec<Vec<i32>> = bound
            .per_worker
            .iter()
            .map(|w| w.iter().map(|l| l.kind).collect())
            .collect();
        assert_eq!(kinds, vec![vec![1, 2, 3], vec![1, 2], vec![1, 2]]);
        // TCP addresses first (with their real ports), then socket paths.
        let names: Vec<&str> = bound.addresses.iter().map(|a| a.0).collect();
        assert_eq!(names, ["one", "three", "two"]);
        assert!(
            !bound.addresses[0].1.ends_with(":0"),
            "{:?}",
            bound.addresses
        );
        assert_eq!(bound.addresses[2].1, sock.display().to_string());

        // A listener that cannot be bound: named; files bound before it
        // are removed again.
        let taken = match &bound.per_worker[0][0].socket {
            Socket::Tcp(l) => l.local_addr().unwrap(),
            Socket::Unix(_) => unreachable!(),
        };
        let sock2 = dir.join("b.sock");
        let clash = [
            Spec {
                kind: 1,
                name: "fresh",
                at: Endpoint::Unix(sock2.clone()),
                spread: Spread::EveryWorker,
            },
            Spec {
                kind: 2,
                name: "clash",
                at: Endpoint::Tcp(taken),
                spread: Spread::EveryWorker,
            },
        ];
        let e = bind_all(&clash, 2, UdsOptions::default()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("clash listener: binding {taken}: address in use")),
            "{e}"
        );
        assert!(!sock2.exists());
        drop(bound);
        assert!(!sock.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn group_is_exclusive_and_spreads() {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let group = bind_tcp(addr, 3).unwrap();
        let e = bind_tcp(addr, 3).unwrap_err();
        assert!(e.to_string().contains("address in use"), "{e}");
        // A stranger that joins without probing gets nothing.
        let stranger = listening(addr, true).unwrap();
        let mut got = [0usize; 4];
        for _ in 0..120 {
            let _c = std::net::TcpStream::connect(addr).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            'found: loop {
                for (i, l) in group.iter().chain([&stranger]).enumerate() {
                    if l.accept().is_ok() {
                        got[i] += 1;
                        break 'found;
                    }
                }
                assert!(std::time::Instant::now() < deadline, "{got:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert_eq!(got[3], 0, "{got:?}");
        assert!(got[..3].iter().all(|&n| n > 10), "{got:?}");
    }
}
