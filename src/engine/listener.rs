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

/// Binds `count` SO_REUSEPORT listeners on `addr`. With port 0 the first
/// socket picks the port and the rest join it.
pub fn bind_tcp(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    let first = reuseport_socket(addr)?;
    let bound = first.local_addr()?;
    let mut out = vec![first];
    for _ in 1..count {
        out.push(reuseport_socket(bound)?);
    }
    Ok(out)
}

/// Binds a unix listener at `path` (replacing a stale socket file) and
/// returns `count` descriptors for it.
pub fn bind_unix(path: &Path, count: usize) -> io::Result<Vec<std::os::unix::net::UnixListener>> {
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
