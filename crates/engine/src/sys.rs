//! Every `unsafe` block of the crate: the few system calls that neither
//! std, socket2 nor monoio wrap, each behind a safe function whose contract
//! holds for any argument. The rest of the crate denies `unsafe_code`.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};

use bytes::{Bytes, BytesMut};

/// Runs `f` with a socket2 view of `sock` (for socket options that monoio's
/// types do not expose). The view cannot outlive the borrow of `sock`.
pub fn with_sock<R>(sock: &impl AsRawFd, f: impl FnOnce(socket2::SockRef<'_>) -> R) -> R {
    // SAFETY: `sock` owns an open descriptor and is borrowed for the whole
    // call, so the descriptor stays open while the view exists.
    let fd = unsafe { BorrowedFd::borrow_raw(sock.as_raw_fd()) };
    f(socket2::SockRef::from(&fd))
}

/// The device and inode of what `fd` names now (`fstat`); `None` when the
/// number is not open.
pub fn fd_identity(fd: std::os::fd::RawFd) -> Option<super::fd_ref::Identity> {
    // SAFETY: fstat writes a stat struct we own and reads no memory of
    // ours; any number is a valid argument (EBADF when not open).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::fstat(fd, &mut st) };
    #[allow(clippy::unnecessary_cast)] // u32 or u64 by target
    (rc == 0).then_some(super::fd_ref::Identity {
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
    })
}

/// Takes a descriptor out of a socket that gives up its ownership.
pub fn into_owned(sock: impl IntoRawFd) -> OwnedFd {
    // SAFETY: `into_raw_fd` hands over sole ownership of an open descriptor.
    unsafe { OwnedFd::from_raw_fd(sock.into_raw_fd()) }
}

/// Disconnects a TCP socket at once: `connect(AF_UNSPEC)` makes Linux send
/// a RST (`tcp_disconnect`). Unix sockets refuse it, which callers ignore.
pub fn disconnect(sock: &impl AsRawFd) -> io::Result<()> {
    let unspec = libc::sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    // SAFETY: a valid sockaddr of the given length, read by the call only.
    let rc = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            &unspec,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The kernel's smoothed round-trip time of a TCP connection (`TCP_INFO`'s
/// `tcpi_rtt`); `None` for another kind of socket or before a sample.
pub fn tcp_rtt(sock: &impl AsRawFd) -> Option<std::time::Duration> {
    // SAFETY: tcp_info is plain integers: all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which we
    // own and which is that large; any descriptor number is a valid
    // argument (EBADF or ENOTSOCK/EOPNOTSUPP otherwise).
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // tcpi_rtt ends at byte 72 of the struct on every kernel since 2.6.
    (rc == 0 && len >= 72 && info.tcpi_rtt > 0)
        .then(|| std::time::Duration::from_micros(u64::from(info.tcpi_rtt)))
}

/// The destination a connection had before iptables DNAT/REDIRECT
/// (`SO_ORIGINAL_DST`, IPv4 then IPv6), if it was redirected.
pub fn original_dst(sock: &impl AsRawFd) -> Option<SocketAddr> {
    with_sock(sock, |s| {
        s.original_dst()
            .ok()
            .or_else(|| s.original_dst_ipv6().ok())
            .and_then(|a| a.as_socket())
    })
}

/// Attaches a classic BPF program that picks the SO_REUSEPORT group member
/// for each new connection (`SO_ATTACH_REUSEPORT_CBPF`).
pub fn attach_reuseport_cbpf(
    member: &impl AsRawFd,
    prog: &mut [libc::sock_filter],
) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "BPF program too long"))?,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel
    // copies the program.
    let rc = unsafe {
        libc::setsockopt(
            member.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::from_ref(&fprog).cast::<libc::c_void>(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Runs `f` with the process umask set to `mask`, then restores it. The
/// umask is per process: call only while no other thread creates files.
pub fn with_umask<R>(mask: u32, f: impl FnOnce() -> R) -> R {
    // SAFETY: umask only swaps an integer in the process; no memory effects.
    let old = unsafe { libc::umask(mask as libc::mode_t) };
    let out = f();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    out
}

/// SIGTERM, SIGINT and SIGHUP, blocked in the calling thread (and in the
/// threads it spawns afterwards) so that only [`ShutdownSignals::wait`]
/// receives them (SIGHUP's default action would end the process and leave
/// its unix sockets behind).
pub struct ShutdownSignals {
    set: libc::sigset_t,
}

impl ShutdownSignals {
    pub fn block() -> io::Result<Self> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, initialised signal set owned here, and
        // SIGTERM/SIGINT/SIGHUP are valid signal numbers.
        let rc = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(Self { set })
    }

    /// Blocks until one of the signals arrives; returns its number.
    pub fn wait(&self) -> Option<i32> {
        let mut sig: libc::c_int = 0;
        // SAFETY: `self.set` is an initialised signal set; `sig` is written.
        let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
        (rc == 0).then_some(sig)
    }
}

/// Sends one packet of `bytes` on a unix `SOCK_SEQPACKET` socket, with
/// `fds` passed beside it (`SCM_RIGHTS`; at most
/// [`protocol::handover::SOCKETS_PER_PACKET`]). The caller keeps
/// its own descriptors; the receiver gets new ones for the same files.
pub fn send_packet(sock: &impl AsRawFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use protocol::handover::SOCKETS_PER_PACKET;
    if fds.len() > SOCKETS_PER_PACKET {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} descriptors in one packet, over {SOCKETS_PER_PACKET}",
                fds.len()
            ),
        ));
    }
    let raw: Vec<std::os::fd::RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let data_len = std::mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(data_len as u32) } as usize;
    // u64 words: the control buffer is aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(8).max(1)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds `space` bytes, room for one
        // header and `data_len` bytes of data, so CMSG_FIRSTHDR is non-null
        // and CMSG_DATA points at `data_len` writable bytes inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len as u32) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr() as *const u8,
                libc::CMSG_DATA(cmsg),
                data_len,
            );
        }
    }
    let n = loop {
        // SAFETY: `msg` and everything it points at are valid for the call;
        // the kernel only reads them.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    if n as usize != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "packet sent in part",
        ));
    }
    Ok(())
}

/// Receives one packet from a unix `SOCK_SEQPACKET` socket into `buf`, and
/// the descriptors passed beside it (close-on-exec), at most `max_fds`. A
/// packet longer than `buf`, or one whose descriptors did not all fit, is an
/// error; the descriptors that did arrive are closed. `Ok((0, []))`: the
/// peer closed.
pub fn recv_packet(
    sock: &impl AsRawFd,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let max_fds = max_fds.min(protocol::handover::SOCKETS_PER_PACKET);
    let fd_size = std::mem::size_of::<std::os::fd::RawFd>();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((max_fds.max(1) * fd_size) as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: `msg` points at `buf` and `control`, both writable for
        // their stated lengths for the whole call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_controllen` bytes of `control` with
    // well-formed headers; CMSG_FIRSTHDR/CMSG_NXTHDR stay inside them, and
    // each SCM_RIGHTS header's data holds `(cmsg_len - CMSG_LEN(0)) /
    // size_of::<c_int>()` descriptors that are now ours to own.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / fd_size {
                    let mut raw: std::os::fd::RawFd = 0;
                    std::ptr::copy_nonoverlapping(
                        data.add(i * fd_size),
                        &mut raw as *mut std::os::fd::RawFd as *mut u8,
                        fd_size,
                    );
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("packet longer than {} bytes", buf.len()),
        ));
    }
    // The control buffer is rounded up, so it may have held more than
    // asked for: the bound is `max_fds` all the same.
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > max_fds {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("more than {max_fds} descriptors passed in one packet"),
        ));
    }
    Ok((n as usize, fds))
}

/// The stream behind one half of a monoio split (monoio's own accessors on
/// split halves borrow it the same way).
pub fn split_stream<T>(half: &monoio::io::OwnedReadHalf<T>) -> &T {
    // SAFETY: a shared borrow tied to the borrow of `half`, which keeps the
    // stream alive; monoio gives the halves no `&mut` access that could
    // overlap a call made through it (each op holds its own fd handle).
    unsafe { &*half.0.get() }
}

/// Turns transparent huge pages on or off for the whole process (see
/// [`super::memory`]).
pub fn set_transparent_huge_pages(on: bool) -> io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory
    // of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, libc::c_ulong::from(!on), 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A positive `sysconf` value (clock ticks, page size) as a float; `None`
/// when the system has no value for `name`.
pub fn sysconf(name: libc::c_int) -> Option<f64> {
    // SAFETY: sysconf only reads a configuration value.
    let v = unsafe { libc::sysconf(name) };
    (v > 0).then_some(v as f64)
}

/// CPU time the calling thread has used.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to; the clock id is a
    // constant every Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Asks the allocator to return the memory it holds free to the system
/// (see [`super::memory`]): mimalloc's forced collect of the calling
/// thread's heap, or glibc's `malloc_trim` in a `system-alloc` build.
pub fn release_free_memory() {
    #[cfg(not(feature = "system-alloc"))]
    // SAFETY: no arguments to uphold; it only frees what is already free.
    unsafe {
        libmimalloc_sys::mi_collect(true)
    };
    #[cfg(feature = "system-alloc")]
    // SAFETY: as above.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A global allocator that counts the bytes live in `A` ([`super::heap`]):
/// `#[global_allocator] static A: Counting<MiMalloc> = Counting(MiMalloc);`.
pub struct Counting<A>(pub A);

// SAFETY: every call goes to the inner allocator unchanged; the count is a
// side effect that allocates nothing (atomics and a const thread-local).
unsafe impl<A: std::alloc::GlobalAlloc> std::alloc::GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            super::heap::add(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            super::heap::add(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(ptr, layout) };
        super::heap::add(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.realloc(ptr, layout, new) };
        if !p.is_null() {
            super::heap::add(new as isize - layout.size() as isize);
        }
        p
    }
}

/// Bytes mimalloc has committed from the system (its process info);
/// `None` in a `system-alloc` build.
pub fn allocator_committed() -> Option<usize> {
    #[cfg(not(feature = "system-alloc"))]
    {
        let mut v = [0usize; 8];
        let [a, b, c, d, e, f, g, h] = &mut v;
        // SAFETY: every pointer is to a distinct local that outlives the
        // call; mimalloc only writes them.
        unsafe { libmimalloc_sys::mi_process_info(a, b, c, d, e, f, g, h) };
        // elapsed, user, system, rss, peak rss, commit, ...
        Some(v[5])
    }
    #[cfg(feature = "system-alloc")]
    None
}

/// One non-blocking `recv(MSG_DONTWAIT)` of up to `want` bytes appended to
/// `buf` (which must have that much spare capacity, or it is reserved).
/// Returns the bytes read; 0 is end of stream.
pub fn recv_dontwait(fd: std::os::fd::RawFd, buf: &mut BytesMut, want: usize) -> io::Result<usize> {
    buf.reserve(want);
    // SAFETY: `buf` has at least `want` bytes of spare capacity; recv writes
    // at most that many into it.
    let n = unsafe {
        libc::recv(
            fd,
            buf.spare_capacity_mut().as_mut_ptr().cast(),
            want,
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: recv initialised the first `n` spare bytes.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// Chunks written with one `writev`: the `Bytes` are kept alive (their heap
/// data never moves) while the kernel reads them through `iovecs`.
pub struct BytesVec {
    iovecs: Vec<libc::iovec>,
    chunks: Vec<Bytes>,
}

impl BytesVec {
    pub fn new(chunks: Vec<Bytes>) -> Self {
        let iovecs = chunks
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        Self { iovecs, chunks }
    }

    /// The chunks back, to advance past what was written.
    pub fn into_chunks(self) -> Vec<Bytes> {
        self.chunks
    }
}

// SAFETY: the iovecs point into `chunks`, owned by the same struct and
// immutable until it drops; moving the struct moves no payload.
unsafe impl monoio::buf::IoVecBuf for BytesVec {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iovecs.as_ptr()
    }
    fn read_iovec_len(&self) -> usize {
        self.iovecs.len()
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (as Go's runtime does at
/// start since Go 1.19) and returns the limits then in force, `(soft,
/// hard)`. An infinite limit reads as `u64::MAX`.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit the call writes.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if r.rlim_cur < r.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit the call only reads.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        r = raised;
    }
    Ok((rlim_u64(r.rlim_cur), rlim_u64(r.rlim_max)))
}

/// A limit as `u64`: `rlim_t` is 32 bits on 32-bit targets (armv7), where
/// `RLIM_INFINITY` is `u32::MAX`; infinite is `u64::MAX` everywhere.
#[allow(clippy::useless_conversion)] // `rlim_t` is already u64 on 64-bit targets
fn rlim_u64(v: libc::rlim_t) -> u64 {
    if v == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        u64::from(v)
    }
}

/// The soft RLIMIT_NOFILE in force (`u64::MAX` when infinite or unknown).
pub fn nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit the call writes.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return u64::MAX;
    }
    rlim_u64(r.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_redirected_has_no_original_destination() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(original_dst(&s), None);
        drop(c);
    }

    #[test]
    fn disconnect_resets_a_tcp_connection() {
        use std::io::Read;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        disconnect(&s).unwrap();
        let mut buf = [0u8; 1];
        let err = c.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
    }

    #[test]
    fn packets_carry_descriptors_and_refuse_too_many() {
        use socket2::{Domain, Socket, Type};
        use std::io::{Read, Write};
        use std::os::fd::AsFd;
        let (a, b) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        let (mut p, q) = std::os::unix::net::UnixStream::pair().unwrap();
        // Two descriptors and a message; then one message without any.
        send_packet(&a, b"two", &[p.as_fd(), q.as_fd()]).unwrap();
        send_packet(&a, b"none", &[]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv_packet(&b, &mut buf, 4).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"two"[..], 2));
        let (n, fds2) = recv_packet(&b, &mut buf, 4).unwrap();
        assert_eq!((&buf[..n], fds2.len()), (&b"none"[..], 0));
        // The passed descriptor is the same socket: what is written to
        // `p` comes out of the received copy of `q`.
        p.write_all(b"x").unwrap();
        let mut got = [0u8; 1];
        std::fs::File::from(fds.into_iter().nth(1).unwrap())
            .read_exact(&mut got)
            .unwrap();
        assert_eq!(&got, b"x");
        // More descriptors than asked for, and a packet over the buffer.
        send_packet(&a, b"t", &[p.as_fd(), q.as_fd()]).unwrap();
        let e = recv_packet(&b, &mut buf, 1).unwrap_err();
        assert!(e.to_string().contains("more than 1 descriptors"), "{e}");
        send_packet(&a, &[7u8; 32], &[]).unwrap();
        let e = recv_packet(&b, &mut buf, 1).unwrap_err();
        assert!(e.to_string().contains("longer than 16 bytes"), "{e}");
        let too_many = vec![p.as_fd(); protocol::handover::SOCKETS_PER_PACKET + 1];
        assert!(send_packet(&a, b"m", &too_many).is_err());
        drop(a);
        assert_eq!(recv_packet(&b, &mut buf, 1).unwrap().0, 0, "end");
    }

    #[test]
    fn bytes_vec_keeps_chunks() {
        let v = BytesVec::new(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"c")]);
        assert_eq!(monoio::buf::IoVecBuf::read_iovec_len(&v), 2);
        assert_eq!(v.into_chunks().concat(), b"abc");
    }
}
