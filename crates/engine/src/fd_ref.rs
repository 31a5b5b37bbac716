//! A descriptor named by its number, away from the object that owns it
//! (issue 47). A number outlives its descriptor: once the owner closes it,
//! the kernel hands the same number to the next socket any core opens, and
//! whatever still holds the number would reach that stranger's connection
//! (reset it, read its bytes, write into it). Ownership-passing types
//! (monoio's streams, `OwnedFd`, [`crate::relay::MovedSocket`]) cannot do
//! that; a bare `RawFd` kept for later can.
//!
//! So a number kept for later is an [`FdRef`]: it remembers which socket
//! it named (device and inode: unique while the socket exists) and, in
//! debug and test builds, every use checks that the number still names
//! that socket, and panics with the number and both identities when it
//! does not. The whole test suite runs with the check on; release builds
//! keep the number only. [`Identity`] is also what tables shared between
//! cores key sockets by (see [`crate::abort`]), so that an entry left
//! behind can never match a newcomer with the same number.

use std::os::fd::{AsRawFd, RawFd};

/// Which socket (or file) a descriptor is: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
}

impl Identity {
    /// The identity of what `fd` names now; `None` when it names nothing.
    pub fn of_raw(fd: RawFd) -> Option<Identity> {
        crate::sys::fd_identity(fd)
    }

    pub fn of(sock: &impl AsRawFd) -> Option<Identity> {
        Self::of_raw(sock.as_raw_fd())
    }
}

/// A descriptor number kept for later (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct FdRef {
    fd: RawFd,
    #[cfg(debug_assertions)]
    named: Option<Identity>,
}

impl FdRef {
    /// Names `sock`, which must be open now.
    pub fn of(sock: &impl AsRawFd) -> FdRef {
        FdRef {
            fd: sock.as_raw_fd(),
            #[cfg(debug_assertions)]
            named: Identity::of(sock),
        }
    }

    /// The number, for a call made now; in debug builds, checks that it
    /// still names the socket it named when this was made.
    pub fn raw(&self) -> RawFd {
        #[cfg(debug_assertions)]
        {
            let now = Identity::of_raw(self.fd);
            assert!(
                now == self.named,
                "descriptor {} was closed while still named here: it named {:?} and now names {:?} (a use after close; with the number reused, I/O on another connection)",
                self.fd,
                self.named,
                now
            );
        }
        self.fd
    }

    /// The number without the check (a key in a table, a log field).
    pub fn number(&self) -> RawFd {
        self.fd
    }
}

impl AsRawFd for FdRef {
    fn as_raw_fd(&self) -> RawFd {
        self.raw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_tells_sockets_apart_and_follows_the_socket() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (ia, ib) = (Identity::of(&a).unwrap(), Identity::of(&b).unwrap());
        assert_ne!(ia, ib);
        let r = FdRef::of(&a);
        assert_eq!(r.raw(), a.as_raw_fd());
        assert_eq!(Identity::of_raw(r.number()), Some(ia));
    }

    /// The guard fires on the very thing it is for: a number kept after
    /// its socket closed (and, almost always at once, handed to a new one:
    /// the kernel gives out the lowest free number).
    #[test]
    #[cfg(debug_assertions)]
    fn a_number_kept_after_close_is_caught() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let kept = FdRef::of(&a);
        let n = a.as_raw_fd();
        drop(a);
        let stranger = std::os::unix::net::UnixStream::pair().unwrap();
        let caught = std::panic::catch_unwind(|| kept.raw());
        let msg = caught.expect_err("a use after close must be caught");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains(&format!("descriptor {n} was closed")), "{msg}");
        drop(stranger);
    }
}
