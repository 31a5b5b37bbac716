//! Abnormal tunnel ends made visible to the caller (issue 13): when a
//! tunnel ends because the agent, the server or the target died rather than
//! by a clean close, a TCP caller gets a reset (SO_LINGER 0, then close)
//! instead of a FIN that looks like a complete answer.
//!
//! A caller whose plaintext reaches the tunnel through a socket pair (a TLS
//! caller, see `server::connect_frontend::tls_front`) cannot be reset
//! through the pair (unix sockets have no RST): the pair's tunnel end is
//! [`watch`]ed, [`abort`] raises its flag, and the relay in front of the
//! caller resets the caller's TCP connection itself.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

fn watched() -> &'static Mutex<HashMap<RawFd, Arc<AtomicBool>>> {
    static W: OnceLock<Mutex<HashMap<RawFd, Arc<AtomicBool>>>> = OnceLock::new();
    W.get_or_init(Default::default)
}

/// Resets a TCP connection now: SO_LINGER 0 and a `connect(AF_UNSPEC)`,
/// which makes Linux send the RST at once (`tcp_disconnect`). Closing with
/// SO_LINGER 0 alone is not enough: monoio's write half shuts the socket
/// down on drop, which would send a FIN first. A no-op on other sockets.
pub fn reset(sock: &impl AsRawFd) {
    super::sys::with_sock(sock, |s| {
        let _ = s.set_linger(Some(std::time::Duration::ZERO));
    });
    if let Err(error) = super::sys::disconnect(sock) {
        tracing::debug!(fd = sock.as_raw_fd(), %error, "reset: disconnect refused");
    }
}

/// The tunnel on `sock` ended abnormally: reset its caller (directly, or
/// through the flag of a [`Watch`] on it). Call while `sock` is open.
pub fn abort(sock: &impl AsRawFd) {
    reset(sock);
    let flag = watched()
        .lock()
        .expect("abort watch lock")
        .get(&sock.as_raw_fd())
        .cloned();
    if let Some(f) = flag {
        f.store(true, Ordering::Release);
    }
}

/// Watches the tunnel end `sock` of a socket pair for [`abort`] while this
/// lives; drop it before `sock`'s descriptor can be reused (that is, keep
/// the pair's other end open until then).
pub struct Watch {
    fd: RawFd,
    flag: Arc<AtomicBool>,
}

pub fn watch(sock: &impl AsRawFd) -> Watch {
    let flag = Arc::new(AtomicBool::new(false));
    let fd = sock.as_raw_fd();
    watched()
        .lock()
        .expect("abort watch lock")
        .insert(fd, flag.clone());
    Watch { fd, flag }
}

impl Watch {
    /// Whether the tunnel ended abnormally.
    pub fn aborted(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut w = watched().lock().expect("abort watch lock");
        if w.get(&self.fd).is_some_and(|f| Arc::ptr_eq(f, &self.flag)) {
            w.remove(&self.fd);
        }
    }
}

thread_local! {
    /// Tunnel sockets open on this core (see [`track`]).
    static OPEN: std::cell::RefCell<std::collections::HashSet<RawFd>> = Default::default();
}

/// Counts `sock` among this core's open tunnels while the guard lives, so
/// that [`reset_open`] can reset it when the server stops under it.
pub fn track(sock: &impl AsRawFd) -> Tracked {
    let fd = sock.as_raw_fd();
    OPEN.with(|o| o.borrow_mut().insert(fd));
    Tracked(fd)
}

pub struct Tracked(RawFd);

impl Drop for Tracked {
    fn drop(&mut self) {
        OPEN.with(|o| o.borrow_mut().remove(&self.0));
    }
}

/// The server stops with tunnels still open on this core: each caller gets
/// a reset when its socket closes (call just before the core's runtime
/// ends).
pub fn reset_open() -> usize {
    OPEN.with(|o| {
        let o = o.borrow();
        for fd in o.iter() {
            abort(fd);
        }
        o.len()
    })
}
