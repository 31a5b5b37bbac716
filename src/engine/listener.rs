//! Listening sockets: one SO_REUSEPORT TCP socket per worker on the same
//! address (the kernel spreads connections across cores), and unix sockets
//! shared between workers by duplicating the descriptor.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;

use socket2::{Domain, Protocol, Socket, Type};

const BACKLOG: i32 = 4096;

fn reuseport_socket(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// Binds `count` SO_REUSEPORT listeners on `addr`, one per worker.
///
/// Port 0 is special: the kernel may hand a port-0 bind a port already held
/// by another process's SO_REUSEPORT group (of the same user), which would
/// silently share its traffic. So for port 0 we bind one ordinary socket and
/// give every worker a duplicate of it.
pub fn bind_tcp(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    bind_tcp_inner(addr, count)
        .map_err(|e| io::Error::new(e.kind(), format!("binding {addr}: {e}")))
}

fn bind_tcp_inner(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    if addr.port() == 0 {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let mut out = Vec::with_capacity(count);
        for _ in 1..count {
            out.push(l.try_clone()?);
        }
        out.push(l);
        return Ok(out);
    }
    (0..count).map(|_| reuseport_with_retry(addr)).collect()
}

/// A process that used io_uring releases its sockets asynchronously after
/// it exits, so right after a restart the port can still look taken for a
/// moment: retry EADDRINUSE for up to two seconds.
fn reuseport_with_retry(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let mut tries = 0;
    loop {
        match reuseport_socket(addr) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 40 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// Binds a unix listener at `path` (replacing a stale socket file) and
/// returns `count` descriptors for it.
pub fn bind_unix(path: &Path, count: usize) -> io::Result<Vec<std::os::unix::net::UnixListener>> {
    bind_unix_inner(path, count)
        .map_err(|e| io::Error::new(e.kind(), format!("binding {}: {e}", path.display())))
}

fn bind_unix_inner(path: &Path, count: usize) -> io::Result<Vec<std::os::unix::net::UnixListener>> {
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let l = std::os::unix::net::UnixListener::bind(path)?;
    l.set_nonblocking(true)?;
    let mut out = Vec::with_capacity(count);
    for _ in 1..count {
        // SAFETY: dup returns a new descriptor we own.
        let fd = unsafe { libc::dup(l.as_raw_fd()) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        out.push(unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) });
    }
    out.push(l);
    Ok(out)
}

/// Sets TCP_NODELAY, ignoring failures (not every socket is TCP).
pub fn nodelay(fd: &impl AsRawFd) {
    let one: libc::c_int = 1;
    // SAFETY: plain setsockopt on a valid descriptor.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}
