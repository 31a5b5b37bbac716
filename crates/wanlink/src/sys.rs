//! Every `unsafe` block of the tool: the four system calls std does not
//! wrap (`setns`, the `TUNSETIFF` ioctl, `ppoll`, `prctl`), each behind a
//! safe function whose contract holds for any argument. The rest of the
//! crate denies `unsafe_code`.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Moves the calling thread (only it) into the network namespace `ns`
/// refers to (an open `/run/netns/NAME` or `/proc/PID/ns/net`).
pub(crate) fn enter_netns(ns: &File) -> io::Result<()> {
    // SAFETY: setns reads only its two integer arguments; `ns` keeps the
    // descriptor open for the call.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `tun` (an open `/dev/net/tun`) the TUN device `name` (IP packets,
/// no packet-information header), created in the calling thread's network
/// namespace if it does not exist. Returns the name the kernel gave.
pub(crate) fn tun_attach(tun: &File, name: &str) -> io::Result<String> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("device name {name:?}: 1 to {} bytes", libc::IFNAMSIZ - 1),
        ));
    }
    // SAFETY: ifreq is plain old data (integers, arrays and a union of
    // them); all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `req`
    // is, alive and exclusively borrowed for the call; `tun` keeps the
    // descriptor open.
    let rc = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = req
        .ifr_name
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(req.ifr_name.len());
    Ok(req.ifr_name[..len]
        .iter()
        // `c_char` is i8 on x86-64 and u8 on ARM.
        .map(|&c| u8::from_ne_bytes(c.to_ne_bytes()) as char)
        .collect())
}

/// Waits until `f` is readable or `timeout` passed (`None`: no limit), with
/// nanosecond resolution (`ppoll`). Returns whether it is readable; an
/// interrupted wait counts as a timeout.
pub(crate) fn wait_readable(f: &File, timeout: Option<Duration>) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: one valid pollfd, exclusively borrowed for the call; the
    // timespec is null or points to a live local; the signal mask is null
    // (unchanged).
    let rc = unsafe { libc::ppoll(&mut pfd, 1, ts_ptr, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(rc > 0)
}

/// Sets the calling thread's timer slack (how late the kernel may wake a
/// sleep, 50 us by default) to `ns` nanoseconds.
pub(crate) fn set_timer_slack(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes one integer and touches no memory of
    // ours.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0);
    }
}
