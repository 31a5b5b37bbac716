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
//!
//! Watches are shared by every core and keyed by the watched socket's
//! [`Identity`], not its number: the tunnel end often closes (on another
//! core) while its watch still lives, and the number then goes to the next
//! socket opened; keyed by number, that stranger's abnormal end would have
//! reset this watch's caller (issue 47).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::fd_ref::{FdRef, Identity};
use protocol::spare::ReleaseSpare;

fn watched() -> &'static Mutex<HashMap<Identity, Arc<AtomicBool>>> {
    static W: OnceLock<Mutex<HashMap<Identity, Arc<AtomicBool>>>> = OnceLock::new();
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
    let Some(id) = Identity::of(sock) else {
        return;
    };
    let flag = watched()
        .lock()
        .expect("abort watch lock")
        .get(&id)
        .cloned();
    if let Some(f) = flag {
        f.store(true, Ordering::Release);
    }
}

/// Watches the tunnel end `sock` of a socket pair for [`abort`] while this
/// lives (by the socket's identity: it may outlive `sock`).
pub struct Watch {
    id: Option<Identity>,
    flag: Arc<AtomicBool>,
}

pub fn watch(sock: &impl AsRawFd) -> Watch {
    let flag = Arc::new(AtomicBool::new(false));
    let id = Identity::of(sock);
    if let Some(id) = id {
        watched()
            .lock()
            .expect("abort watch lock")
            .insert(id, flag.clone());
    }
    Watch { id, flag }
}

impl Watch {
    /// Whether the tunnel ended abnormally.
    pub fn aborted(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        let mut w = watched().lock().expect("abort watch lock");
        if w.get(&id).is_some_and(|f| Arc::ptr_eq(f, &self.flag)) {
            w.remove(&id);
            w.release_spare();
        }
    }
}

thread_local! {
    /// Tunnel sockets open on this core (see [`track`]).
    static OPEN: std::cell::RefCell<HashMap<RawFd, FdRef>> = Default::default();
}

/// Counts `sock` among this core's open tunnels while the guard lives, so
/// that [`reset_open`] can reset it when the server stops under it. The
/// guard must not outlive `sock` (debug builds check, see [`FdRef`]).
pub fn track(sock: &FdRef) -> Tracked {
    OPEN.with(|o| o.borrow_mut().insert(sock.number(), *sock));
    Tracked(sock.number())
}

pub struct Tracked(RawFd);

impl Drop for Tracked {
    fn drop(&mut self) {
        OPEN.with(|o| {
            let mut o = o.borrow_mut();
            o.remove(&self.0);
            o.release_spare();
        });
    }
}

/// The server stops with tunnels still open on this core: each caller gets
/// a reset when its socket closes (call just before the core's runtime
/// ends).
pub fn reset_open() -> usize {
    OPEN.with(|o| {
        let o = o.borrow();
        for fd in o.values() {
            abort(fd);
        }
        o.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch outlives the socket it watches; the socket that gets the
    /// same number next is a stranger, and its abnormal end must not set
    /// the watch (before, watches were keyed by number).
    #[test]
    fn a_closed_sockets_watch_ignores_the_next_owner_of_its_number() {
        let (a, _a2) = std::os::unix::net::UnixStream::pair().unwrap();
        let n = a.as_raw_fd();
        let w = watch(&a);
        drop(a);
        let mut held = Vec::new();
        let stranger = loop {
            let (c, d) = std::os::unix::net::UnixStream::pair().unwrap();
            if c.as_raw_fd() == n {
                break c;
            }
            held.push((c, d));
            assert!(held.len() < 1000, "number {n} never came back");
        };
        abort(&stranger);
        assert!(!w.aborted(), "a stranger's end reached a watch by number");
        // Its own socket's end does.
        let (b, _b2) = std::os::unix::net::UnixStream::pair().unwrap();
        let wb = watch(&b);
        abort(&b);
        assert!(wb.aborted());
    }
}
