//! Readiness events: the moments a supervisor or a test waits for (a
//! listener bound, the server ready, an agent link up, the proxy serving).
//! The roles report them through an [`Announce`] they are given; the binary
//! (`main.rs`) prints each as one line on stdout, in the fixed wording
//! scripts parse ([`Ready`]'s `Display`). Library users get nothing unless
//! they ask.

use std::fmt;
use std::sync::Arc;

/// One readiness event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ready {
    /// A listener is bound: `LISTEN <what> <address>`.
    Listen { what: String, addr: String },
    /// The server serves: `READY`.
    Ready,
    /// An agent's first link to a server is up: `CONNECTED <addr> <server ID>`.
    Connected { server: String, server_id: String },
    /// A further link to the same server is up:
    /// `LINKED <addr> <server ID> <server worker>`.
    Linked {
        server: String,
        server_id: String,
        worker: Option<usize>,
    },
    /// `edgetunnel proxy` serves, in kubectl's words: `Starting to serve on <where>`.
    Serving { on: String },
}

impl fmt::Display for Ready {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ready::Listen { what, addr } => write!(f, "LISTEN {what} {addr}"),
            Ready::Ready => f.write_str("READY"),
            Ready::Connected { server, server_id } => write!(f, "CONNECTED {server} {server_id}"),
            Ready::Linked {
                server,
                server_id,
                worker,
            } => {
                write!(f, "LINKED {server} {server_id} ")?;
                match worker {
                    Some(w) => write!(f, "{w}"),
                    None => Ok(()),
                }
            }
            Ready::Serving { on } => write!(f, "Starting to serve on {on}"),
        }
    }
}

/// Where a role reports [`Ready`] events (from any thread); the default
/// reports nowhere.
#[derive(Clone, Default)]
pub struct Announce(Option<Arc<Sink>>);

/// What receives readiness events.
type Sink = dyn Fn(&Ready) + Send + Sync;

impl Announce {
    pub fn new(f: impl Fn(&Ready) + Send + Sync + 'static) -> Announce {
        Announce(Some(Arc::new(f)))
    }

    pub fn send(&self, ready: Ready) {
        if let Some(f) = &self.0 {
            f(&ready);
        }
    }
}

impl fmt::Debug for Announce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Announce(set)"
        } else {
            "Announce(none)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn lines_keep_their_wording() {
        let cases = [
            (
                Ready::Listen {
                    what: "agent".into(),
                    addr: "127.0.0.1:1".into(),
                },
                "LISTEN agent 127.0.0.1:1",
            ),
            (Ready::Ready, "READY"),
            (
                Ready::Connected {
                    server: "s:1".into(),
                    server_id: "id".into(),
                },
                "CONNECTED s:1 id",
            ),
            (
                Ready::Linked {
                    server: "s:1".into(),
                    server_id: "id".into(),
                    worker: Some(1),
                },
                "LINKED s:1 id 1",
            ),
            (
                Ready::Serving {
                    on: "127.0.0.1:8001".into(),
                },
                "Starting to serve on 127.0.0.1:8001",
            ),
        ];
        for (r, want) in cases {
            assert_eq!(r.to_string(), want);
        }
    }

    #[test]
    fn announce_reaches_its_sink_and_default_is_silent() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let a = Announce::new(move |r| s2.lock().unwrap().push(r.to_string()));
        a.clone().send(Ready::Ready);
        Announce::default().send(Ready::Ready);
        assert_eq!(*seen.lock().unwrap(), ["READY"]);
    }
}
