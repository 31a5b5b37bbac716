//! The listener handover's I/O: a successor takes a running server's
//! listening sockets ([`take_over`]); an incumbent offers its own to the
//! next one ([`Incumbent`], on a thread of its own, off the data plane).
//! The messages and the choice of what to take are
//! [`protocol::handover`]; this is the unix `SOCK_SEQPACKET` socket
//! they travel on and the descriptors passed beside them (`SCM_RIGHTS`,
//! [`super::sys::send_packet`]).
//!
//! A successor connects to the handover socket's path; nobody there (no
//! file, or a stale one) means it starts as it would without one. An
//! incumbent offers everything it listens on plus the handover socket
//! itself, so the successor answers the next successor at the same path:
//! no path is unlinked and bound again, and there is no moment without a
//! listener. The incumbent treats a successor that fails or goes away
//! before confirming as if it had never come.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, Type};

use protocol::handover::{self as wire, Endpoint, Message, Offered, Plan, Want};

use super::signals::Shutdown;
use super::sys;

/// What the listener for the handover socket is called in offers.
pub const HANDOVER_LISTENER: &str = "handover";
/// How long one step of the exchange may take before the other side is
/// given up (a successor reading the offer, an incumbent its hello).
const STEP: Duration = Duration::from_secs(10);
/// How long an incumbent waits for a successor to confirm once it holds
/// the sockets (it starts its workers in between).
const CONFIRM: Duration = Duration::from_secs(30);
/// How often the incumbent's thread looks at the shutdown latch while no
/// successor comes.
const POLL: Duration = Duration::from_millis(50);

/// What went wrong in an exchange.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("handover socket {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("handover: {0}")]
    Wire(#[from] wire::Error),
    #[error("handover refused by the other side: {0}")]
    Refused(String),
    #[error("handover: expected {expected}, got {got}")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
    #[error("handover: the other side closed the exchange before {0}")]
    Closed(&'static str),
    #[error("handover: listener {name}: the socket passed is not {what}")]
    Mismatch { name: String, what: String },
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn seqpacket() -> io::Result<Socket> {
    let s = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
    s.set_cloexec(true)?;
    Ok(s)
}

fn send(conn: &Socket, m: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    sys::send_packet(conn, &m.encode(), fds)
}

/// One message; `what` names the step for errors.
fn recv(conn: &Socket, what: &'static str) -> Result<Message, Error> {
    let mut buf = vec![0u8; wire::MAX_MESSAGE];
    let (n, fds) = sys::recv_packet(conn, &mut buf, 0).map_err(|e| Error::Io {
        path: PathBuf::from("(connection)"),
        source: e,
    })?;
    drop(fds);
    if n == 0 {
        return Err(Error::Closed(what));
    }
    let m = Message::decode(&buf[..n])?;
    if let Message::Refused { reason } = m {
        return Err(Error::Refused(reason));
    }
    Ok(m)
}

/// What a successor took: per wanted listener (in the order given to
/// [`take_over`]) the sockets it got, empty where it binds its own.
pub struct Takeover {
    conn: Socket,
    /// The incumbent's process ID.
    pub incumbent: u32,
    /// The exchange's version.
    pub version: u32,
    pub sockets: Vec<Vec<OwnedFd>>,
    names: Vec<String>,
}

impl std::fmt::Debug for Takeover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Takeover")
            .field("incumbent", &self.incumbent)
            .field("version", &self.version)
            .field("taken", &self.names)
            .finish()
    }
}

impl Takeover {
    /// The names of the listeners taken.
    pub fn taken(&self) -> &[String] {
        &self.names
    }

    /// Tells the incumbent that this process listens on the sockets now;
    /// returns once the incumbent answers that it drains: its process ID,
    /// and the socket path it still takes dials on, if any.
    pub fn confirm(self) -> Result<(u32, Vec<PathBuf>), Error> {
        send(
            &self.conn,
            &Message::Taken {
                names: self.names.clone(),
            },
            &[],
        )
        .map_err(io_err(Path::new("(connection)")))?;
        match recv(&self.conn, "draining")? {
            Message::Draining { pid, forward } => Ok((pid, forward)),
            other => Err(Error::Unexpected {
                expected: "draining",
                got: other.kind(),
            }),
        }
    }
}

/// Takes the listening sockets of the server at `path`, if one answers
/// there: `Ok(None)` when nobody listens at `path` (no file, or a stale
/// socket). `wanted` lists what this process would bind (including the
/// handover socket itself, named [`HANDOVER_LISTENER`]).
pub fn take_over(path: &Path, wanted: &[Want<'_>]) -> Result<Option<Takeover>, Error> {
    let conn = seqpacket().map_err(io_err(path))?;
    let addr = SockAddr::unix(path).map_err(io_err(path))?;
    match conn.connect(&addr) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            tracing::info!(path = %path.display(), error = %e, "handover: nobody answers at the handover socket");
            return Ok(None);
        }
        Err(e) => return Err(io_err(path)(e)),
    }
    conn.set_read_timeout(Some(STEP)).map_err(io_err(path))?;
    conn.set_write_timeout(Some(STEP)).map_err(io_err(path))?;
    let hello = Message::Hello {
        min: wire::VERSION_MIN,
        max: wire::VERSION_MAX,
        pid: std::process::id(),
    };
    send(&conn, &hello, &[]).map_err(io_err(path))?;
    let (version, incumbent, listeners) = match recv(&conn, "the offer")? {
        Message::Offer {
            version,
            pid,
            listeners,
        } => (version, pid, listeners),
        other => {
            return Err(Error::Unexpected {
                expected: "offer",
                got: other.kind(),
            })
        }
    };
    if wire::choose_version(version, version) != Some(version) {
        let reason = format!(
            "version {version} chosen, this build speaks {}..={}",
            wire::VERSION_MIN,
            wire::VERSION_MAX
        );
        let _ = send(
            &conn,
            &Message::Refused {
                reason: reason.clone(),
            },
            &[],
        );
        return Err(Error::Refused(reason));
    }
    let total: usize = listeners.iter().map(|l| l.sockets as usize).sum();
    let mut passed: Vec<OwnedFd> = Vec::with_capacity(total);
    let mut buf = [0u8; 16];
    for batch in wire::socket_batches(total) {
        let (n, fds) = sys::recv_packet(&conn, &mut buf, batch).map_err(io_err(path))?;
        if n == 0 {
            return Err(Error::Closed("the sockets"));
        }
        if fds.len() != batch {
            return Err(Error::Mismatch {
                name: "(batch)".into(),
                what: format!("{batch} descriptors (got {})", fds.len()),
            });
        }
        passed.extend(fds);
    }
    if let Err(e) = check(&listeners, &passed) {
        let _ = send(
            &conn,
            &Message::Refused {
                reason: e.to_string(),
            },
            &[],
        );
        return Err(e);
    }
    let plan = Plan::new(wanted, &listeners);
    let mut slots: Vec<Option<OwnedFd>> = passed.into_iter().map(Some).collect();
    let mut sockets: Vec<Vec<OwnedFd>> = wanted.iter().map(|_| Vec::new()).collect();
    for (w, _, range) in &plan.take {
        sockets[*w] = range.clone().filter_map(|i| slots[i].take()).collect();
    }
    // What is not taken closes here (the incumbent keeps its own copies).
    drop(slots);
    Ok(Some(Takeover {
        names: plan.taken_names(&listeners),
        conn,
        incumbent,
        version,
        sockets,
    }))
}

/// Each passed socket is a listening socket at its listener's endpoint.
fn check(listeners: &[Offered], passed: &[OwnedFd]) -> Result<(), Error> {
    let mut at = 0;
    for l in listeners {
        for fd in &passed[at..at + l.sockets as usize] {
            let sock = socket2::SockRef::from(fd);
            let mismatch = |what: String| Error::Mismatch {
                name: l.name.clone(),
                what,
            };
            if !sock.is_listener().unwrap_or(false) {
                return Err(mismatch("a listening socket".into()));
            }
            let local = sock.local_addr().map_err(|e| mismatch(e.to_string()))?;
            let same = match &l.endpoint {
                Endpoint::Tcp(a) => local.as_socket() == Some(*a),
                Endpoint::Unix(p) => local.as_pathname() == Some(p.as_path()),
            };
            if !same {
                return Err(mismatch(wire::encode_endpoint(&l.endpoint)));
            }
        }
        at += l.sockets as usize;
    }
    Ok(())
}

/// One listener an incumbent offers, with its distinct sockets.
pub struct Offering {
    pub name: String,
    pub endpoint: Endpoint,
    pub sockets: Vec<OwnedFd>,
}

/// The incumbent's side: the handover socket and what it offers.
pub struct Incumbent {
    listener: Socket,
    path: PathBuf,
    offer: Vec<Offering>,
}

/// Binds the handover socket at `path` (mode 0600; with `may_replace`, a
/// socket file there is replaced: [`take_over`] found nobody answering at
/// it), or adopts the one a predecessor passed.
pub fn handover_listener(
    path: &Path,
    inherited: Option<OwnedFd>,
    may_replace: bool,
) -> Result<Socket, Error> {
    if let Some(fd) = inherited {
        return Ok(Socket::from(fd));
    }
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if !may_replace {
            return Err(io_err(path)(io::Error::new(
                io::ErrorKind::AddrInUse,
                "a server may still answer there (the handover with it failed); not replacing it",
            )));
        }
        use std::os::unix::fs::FileTypeExt;
        if !md.file_type().is_socket() {
            return Err(io_err(path)(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket; not removing it",
            )));
        }
        // Nobody answered at it (take_over found it stale): replace it.
        std::fs::remove_file(path).map_err(io_err(path))?;
    }
    let s = seqpacket().map_err(io_err(path))?;
    let addr = SockAddr::unix(path).map_err(io_err(path))?;
    sys::with_umask(0o177, || s.bind(&addr)).map_err(io_err(path))?;
    s.listen(4).map_err(io_err(path))?;
    Ok(s)
}

impl Incumbent {
    /// `listener` from [`handover_listener`]; `offer` lists the other
    /// listeners (the handover socket is added here).
    pub fn new(listener: Socket, path: &Path, offer: Vec<Offering>) -> Self {
        Incumbent {
            listener,
            path: path.to_path_buf(),
            offer,
        }
    }

    /// Runs the incumbent on a thread of its own until a successor takes
    /// over (then `on_taken` runs with the names it took, before the
    /// successor is told that this process drains, and gives the socket
    /// paths where this process and its own predecessors still take the
    /// successor's dials) or `stop` is raised (a
    /// plain shutdown: the thread's copies of the sockets close with it, so
    /// the listeners close as the workers stop accepting).
    pub fn spawn(
        self,
        stop: Arc<Shutdown>,
        on_taken: impl FnOnce(&[String]) -> Vec<PathBuf> + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("edgetunnel-handover".into())
            .spawn(move || self.run(&stop, on_taken))
    }

    fn run(self, stop: &Shutdown, on_taken: impl FnOnce(&[String]) -> Vec<PathBuf>) {
        if let Err(e) = self.listener.set_read_timeout(Some(POLL)) {
            tracing::warn!(error = %e, "handover socket: no accept timeout; handover disabled");
            return;
        }
        loop {
            if stop.requested() > 0 {
                return;
            }
            let conn = match self.listener.accept() {
                Ok((c, _)) => c,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "handover socket: accept failed");
                    std::thread::sleep(POLL);
                    continue;
                }
            };
            match self.offer_to(&conn) {
                Ok(names) => {
                    tracing::info!(taken = ?names, "handover: a successor listens on our sockets; draining");
                    let forward = on_taken(&names);
                    let _ = send(
                        &conn,
                        &Message::Draining {
                            pid: std::process::id(),
                            forward,
                        },
                        &[],
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "handover: no handover, serving on");
                }
            }
        }
    }

    /// One exchange with a successor: the names it took.
    fn offer_to(&self, conn: &Socket) -> Result<Vec<String>, Error> {
        let path = self.path.as_path();
        conn.set_read_timeout(Some(STEP)).map_err(io_err(path))?;
        conn.set_write_timeout(Some(STEP)).map_err(io_err(path))?;
        let (min, max) = match recv(conn, "hello")? {
            Message::Hello { min, max, .. } => (min, max),
            other => {
                return Err(Error::Unexpected {
                    expected: "hello",
                    got: other.kind(),
                })
            }
        };
        let Some(version) = wire::choose_version(min, max) else {
            let reason = format!(
                "versions {min}..={max} asked, this server speaks {}..={}",
                wire::VERSION_MIN,
                wire::VERSION_MAX
            );
            let _ = send(
                conn,
                &Message::Refused {
                    reason: reason.clone(),
                },
                &[],
            );
            return Err(Error::Refused(reason));
        };
        let mut listeners: Vec<Offered> = Vec::with_capacity(self.offer.len() + 1);
        let mut fds: Vec<BorrowedFd<'_>> = Vec::new();
        for o in &self.offer {
            listeners.push(Offered {
                name: o.name.clone(),
                endpoint: o.endpoint.clone(),
                sockets: o.sockets.len() as u32,
            });
            fds.extend(o.sockets.iter().map(|s| s.as_fd()));
        }
        listeners.push(Offered {
            name: HANDOVER_LISTENER.into(),
            endpoint: Endpoint::Unix(self.path.clone()),
            sockets: 1,
        });
        fds.push(self.listener.as_fd());
        let offer = Message::Offer {
            version,
            pid: std::process::id(),
            listeners,
        };
        send(conn, &offer, &[]).map_err(io_err(path))?;
        let mut at = 0;
        for batch in wire::socket_batches(fds.len()) {
            sys::send_packet(conn, b"F", &fds[at..at + batch]).map_err(io_err(path))?;
            at += batch;
        }
        conn.set_read_timeout(Some(CONFIRM)).map_err(io_err(path))?;
        match recv(conn, "taken")? {
            Message::Taken { names } => Ok(names),
            other => Err(Error::Unexpected {
                expected: "taken",
                got: other.kind(),
            }),
        }
    }
}
