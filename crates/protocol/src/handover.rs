//! The listener handover between two servers on one host: the one running
//! (the *incumbent*) gives its listening sockets to one starting with the
//! same listeners (the *successor*), so that there is no moment without a
//! listener and no socket path is ever unlinked; the incumbent then drains.
//!
//! The exchange runs on a unix `SOCK_SEQPACKET` socket (one message per
//! packet, so a message and the descriptors passed beside it never merge
//! with the next); this module is its messages and the successor's choice
//! of what to take, without any I/O:
//!
//! ```text
//!   successor                          incumbent
//!   Hello { versions, pid }      ->
//!                                <-    Offer { version, pid, listeners }
//!                                <-    the sockets, in the offer's order
//!                                      (SCM_RIGHTS, in batches)
//!   (listening on them now)
//!   Taken { names }              ->
//!                                <-    Draining { pid }
//! ```
//!
//! Either side may answer `Refused { reason }` instead and close; a
//! successor that closes before `Taken` leaves the incumbent serving as if
//! nothing happened.
//!
//! Versions: a `Hello` names the range the successor speaks and the offer
//! the version chosen (the highest both speak, [`choose_version`]), so old
//! and new releases can hand over in either direction. Within a version a
//! message's unknown `key=value` fields and unknown item lines are ignored,
//! so later releases may add to a message without a new version.
//!
//! Encoding: UTF-8 text, a head line (`kind key=value ...`) and item lines,
//! each ending with `\n`. A socket path is written with every byte outside
//! printable ASCII, and `%` and space, as `%XX`. Bounds: a message is at
//! most [`MAX_MESSAGE`] bytes, an offer names at most [`MAX_LISTENERS`]
//! listeners and [`MAX_SOCKETS`] sockets in all, a name at most
//! [`MAX_NAME`] bytes of `[A-Za-z0-9._-]`, a reason at most [`MAX_REASON`].

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The versions of the exchange this build speaks.
pub const VERSION_MIN: u32 = 1;
pub const VERSION_MAX: u32 = 1;
/// Largest message, in bytes (also the receive buffer's size).
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Most listeners an offer may name.
pub const MAX_LISTENERS: usize = 64;
/// Most sockets an offer may pass in all (a TCP listener is one socket per
/// worker of the incumbent).
pub const MAX_SOCKETS: usize = 4096;
/// Longest listener name.
pub const MAX_NAME: usize = 64;
/// Longest refusal reason.
pub const MAX_REASON: usize = 1024;
/// Most sockets passed beside one packet (the kernel's `SCM_MAX_FD`).
pub const SOCKETS_PER_PACKET: usize = 253;

/// Where a listener listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// One listener of an offer: `sockets` descriptors of it follow, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    pub name: String,
    pub endpoint: Endpoint,
    pub sockets: u32,
}

/// A message of the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Successor to incumbent: the versions it speaks.
    Hello { min: u32, max: u32, pid: u32 },
    /// Incumbent to successor: its listeners; their sockets follow.
    Offer {
        version: u32,
        pid: u32,
        listeners: Vec<Offered>,
    },
    /// Successor to incumbent: it listens on these (by name) now.
    Taken { names: Vec<String> },
    /// Incumbent to successor: it stopped accepting and drains; dials it
    /// can still carry (through agents linked to it only) reach it as
    /// HTTP CONNECT on `forward`'s unix socket paths, its own first, then
    /// those of its own predecessors still draining.
    Draining { pid: u32, forward: Vec<PathBuf> },
    /// Either side: no handover, and why.
    Refused { reason: String },
}

/// A message that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("handover message of {0} bytes, over the limit of {MAX_MESSAGE}")]
    TooLong(usize),
    #[error("handover message is not UTF-8 text")]
    NotText,
    #[error("handover message is empty")]
    Empty,
    #[error("unknown handover message kind {0:?}")]
    UnknownKind(String),
    #[error("handover message {kind}: field {field} missing")]
    Missing {
        kind: &'static str,
        field: &'static str,
    },
    #[error("handover message {kind}: field {field} malformed: {value:?}")]
    Malformed {
        kind: &'static str,
        field: &'static str,
        value: String,
    },
    #[error("handover offer names over {MAX_LISTENERS} listeners")]
    TooManyListeners,
    #[error("handover offer passes over {MAX_SOCKETS} sockets")]
    TooManySockets,
    #[error("handover offer names listener {0:?} twice")]
    DuplicateName(String),
    #[error("handover hello names no version range: {min}..={max}")]
    EmptyRange { min: u32, max: u32 },
}

impl Message {
    /// The message's kind, as written on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Offer { .. } => "offer",
            Message::Taken { .. } => "taken",
            Message::Draining { .. } => "draining",
            Message::Refused { .. } => "refused",
        }
    }

    /// The message's bytes. Names and reasons the decoder would refuse are
    /// the caller's error: names are checked by [`valid_name`] in debug
    /// builds, a reason is cut to one line of [`MAX_REASON`] bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = String::new();
        match self {
            Message::Hello { min, max, pid } => {
                let _ = writeln!(s, "hello min={min} max={max} pid={pid}");
            }
            Message::Offer {
                version,
                pid,
                listeners,
            } => {
                let _ = writeln!(s, "offer version={version} pid={pid}");
                for l in listeners {
                    debug_assert!(valid_name(&l.name), "{:?}", l.name);
                    let _ = writeln!(
                        s,
                        "listener {} {} {}",
                        l.name,
                        encode_endpoint(&l.endpoint),
                        l.sockets
                    );
                }
            }
            Message::Taken { names } => {
                s.push_str("taken\n");
                for n in names {
                    debug_assert!(valid_name(n), "{n:?}");
                    let _ = writeln!(s, "listener {n}");
                }
            }
            Message::Draining { pid, forward } => {
                let _ = writeln!(s, "draining pid={pid}");
                for p in forward {
                    let _ = writeln!(s, "forward {}", encode_endpoint(&Endpoint::Unix(p.clone())));
                }
            }
            Message::Refused { reason } => {
                let line = one_line(reason);
                let mut cut = line.len().min(MAX_REASON);
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                let _ = writeln!(s, "refused {}", &line[..cut]);
            }
        }
        s.into_bytes()
    }

    /// Reads one message (one packet's bytes).
    pub fn decode(bytes: &[u8]) -> Result<Message, Error> {
        if bytes.len() > MAX_MESSAGE {
            return Err(Error::TooLong(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| Error::NotText)?;
        let mut lines = text.lines();
        let head = lines.next().filter(|l| !l.is_empty()).ok_or(Error::Empty)?;
        let (kind, rest) = head.split_once(' ').unwrap_or((head, ""));
        match kind {
            "hello" => {
                let f = Fields::new("hello", rest);
                let (min, max) = (f.number("min")?, f.number("max")?);
                if min > max {
                    return Err(Error::EmptyRange { min, max });
                }
                Ok(Message::Hello {
                    min,
                    max,
                    pid: f.number("pid")?,
                })
            }
            "offer" => {
                let f = Fields::new("offer", rest);
                let (version, pid) = (f.number("version")?, f.number("pid")?);
                let mut listeners: Vec<Offered> = Vec::new();
                let mut total: u64 = 0;
                for line in lines {
                    let Some(item) = line.strip_prefix("listener ") else {
                        continue;
                    };
                    let l = offered(item)?;
                    if listeners.len() == MAX_LISTENERS {
                        return Err(Error::TooManyListeners);
                    }
                    if listeners.iter().any(|o| o.name == l.name) {
                        return Err(Error::DuplicateName(l.name));
                    }
                    total += u64::from(l.sockets);
                    if total > MAX_SOCKETS as u64 {
                        return Err(Error::TooManySockets);
                    }
                    listeners.push(l);
                }
                Ok(Message::Offer {
                    version,
                    pid,
                    listeners,
                })
            }
            "taken" => {
                let mut names: Vec<String> = Vec::new();
                for line in lines {
                    let Some(name) = line.strip_prefix("listener ") else {
                        continue;
                    };
                    let name = checked_name("taken", name)?;
                    if names.len() == MAX_LISTENERS {
                        return Err(Error::TooManyListeners);
                    }
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
                Ok(Message::Taken { names })
            }
            "draining" => {
                let pid = Fields::new("draining", rest).number("pid")?;
                let mut forward = Vec::new();
                for line in lines {
                    let Some(item) = line.strip_prefix("forward ") else {
                        continue;
                    };
                    match decode_endpoint(item) {
                        Some(Endpoint::Unix(p)) if forward.len() < MAX_LISTENERS => forward.push(p),
                        Some(Endpoint::Unix(_)) => return Err(Error::TooManyListeners),
                        _ => {
                            return Err(Error::Malformed {
                                kind: "draining",
                                field: "forward",
                                value: item.chars().take(80).collect(),
                            })
                        }
                    }
                }
                Ok(Message::Draining { pid, forward })
            }
            "refused" => {
                if rest.len() > MAX_REASON {
                    return Err(Error::Malformed {
                        kind: "refused",
                        field: "reason",
                        value: format!("{} bytes", rest.len()),
                    });
                }
                // As written: control characters read as spaces.
                Ok(Message::Refused {
                    reason: one_line(rest),
                })
            }
            other => Err(Error::UnknownKind(other.chars().take(32).collect())),
        }
    }
}

/// `text` with every control character (line ends, NUL) as a space.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The version both sides speak, the highest of them; `None` when the
/// ranges do not meet.
pub fn choose_version(min: u32, max: u32) -> Option<u32> {
    let (lo, hi) = (min.max(VERSION_MIN), max.min(VERSION_MAX));
    (lo <= hi).then_some(hi)
}

/// Whether `name` may name a listener on the wire.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn checked_name(kind: &'static str, name: &str) -> Result<String, Error> {
    if valid_name(name) {
        Ok(name.to_string())
    } else {
        Err(Error::Malformed {
            kind,
            field: "name",
            value: name.chars().take(MAX_NAME + 1).collect(),
        })
    }
}

fn offered(item: &str) -> Result<Offered, Error> {
    let malformed = |field: &'static str, value: &str| Error::Malformed {
        kind: "offer",
        field,
        value: value.chars().take(80).collect(),
    };
    let mut parts = item.split(' ');
    let (Some(name), Some(endpoint), Some(sockets), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("listener", item));
    };
    let sockets: u32 = sockets
        .parse()
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| malformed("sockets", sockets))?;
    Ok(Offered {
        name: checked_name("offer", name)?,
        endpoint: decode_endpoint(endpoint).ok_or_else(|| malformed("endpoint", endpoint))?,
        sockets,
    })
}

/// `tcp:ADDR` or `unix:PATH` (the path escaped, see the module docs).
pub fn encode_endpoint(e: &Endpoint) -> String {
    match e {
        Endpoint::Tcp(a) => format!("tcp:{a}"),
        Endpoint::Unix(p) => {
            let mut s = String::from("unix:");
            for &b in p.as_os_str().as_encoded_bytes() {
                if b.is_ascii_graphic() && b != b'%' {
                    s.push(b as char);
                } else {
                    let _ = write!(s, "%{b:02X}");
                }
            }
            s
        }
    }
}

fn decode_endpoint(s: &str) -> Option<Endpoint> {
    if let Some(a) = s.strip_prefix("tcp:") {
        return a.parse().ok().map(Endpoint::Tcp);
    }
    let p = s.strip_prefix("unix:")?;
    let mut out = Vec::with_capacity(p.len());
    let mut bytes = p.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            let hex = std::str::from_utf8(&hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    if out.is_empty() || out.contains(&0) {
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        Some(Endpoint::Unix(PathBuf::from(std::ffi::OsString::from_vec(
            out,
        ))))
    }
    #[cfg(not(unix))]
    {
        String::from_utf8(out)
            .ok()
            .map(|s| Endpoint::Unix(s.into()))
    }
}

/// A head line's `key=value` fields.
struct Fields<'a> {
    kind: &'static str,
    rest: &'a str,
}

impl<'a> Fields<'a> {
    fn new(kind: &'static str, rest: &'a str) -> Self {
        Fields { kind, rest }
    }

    fn get(&self, field: &'static str) -> Option<&'a str> {
        self.rest
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == field)
            .map(|(_, v)| v)
    }

    fn number(&self, field: &'static str) -> Result<u32, Error> {
        let v = self.get(field).ok_or(Error::Missing {
            kind: self.kind,
            field,
        })?;
        v.parse().map_err(|_| Error::Malformed {
            kind: self.kind,
            field,
            value: v.chars().take(32).collect(),
        })
    }
}

/// A listener the successor wants: the name and endpoint it would bind.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub name: &'a str,
    pub endpoint: &'a Endpoint,
}

/// Which offered sockets a successor takes for which of its listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// `(want index, offered index, range in the offer's socket list)`.
    pub take: Vec<(usize, usize, std::ops::Range<usize>)>,
    /// Wanted listeners nobody offered: the successor binds them itself.
    pub bind: Vec<usize>,
    /// Offered listeners the successor does not want: it closes their
    /// sockets at once (the incumbent keeps serving them until it drains).
    pub unused: Vec<usize>,
}

impl Plan {
    /// Matches `wanted` against `offered` by name and endpoint. A wanted
    /// TCP port 0 ("any port") matches nothing: the successor binds a
    /// fresh one, as it would have without an incumbent.
    pub fn new(wanted: &[Want<'_>], offered: &[Offered]) -> Plan {
        let mut plan = Plan::default();
        let mut starts = Vec::with_capacity(offered.len());
        let mut at = 0usize;
        for o in offered {
            starts.push(at..at + o.sockets as usize);
            at += o.sockets as usize;
        }
        let mut used = vec![false; offered.len()];
        for (w, want) in wanted.iter().enumerate() {
            let any_port = matches!(want.endpoint, Endpoint::Tcp(a) if a.port() == 0);
            let found = offered
                .iter()
                .enumerate()
                .find(|(i, o)| {
                    !used[*i] && !any_port && o.name == want.name && &o.endpoint == want.endpoint
                })
                .map(|(i, _)| i);
            match found {
                Some(i) => {
                    used[i] = true;
                    plan.take.push((w, i, starts[i].clone()));
                }
                None => plan.bind.push(w),
            }
        }
        plan.unused = (0..offered.len()).filter(|&i| !used[i]).collect();
        plan
    }

    /// The names of what is taken, for the `Taken` message.
    pub fn taken_names(&self, offered: &[Offered]) -> Vec<String> {
        self.take
            .iter()
            .map(|(_, i, _)| offered[*i].name.clone())
            .collect()
    }
}

/// The sockets of an offer split into packets of at most
/// [`SOCKETS_PER_PACKET`]: the count in each packet, in order.
pub fn socket_batches(total: usize) -> impl Iterator<Item = usize> {
    let full = total / SOCKETS_PER_PACKET;
    let rest = total % SOCKETS_PER_PACKET;
    std::iter::repeat_n(SOCKETS_PER_PACKET, full).chain((rest > 0).then_some(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(s: &str) -> Endpoint {
        Endpoint::Tcp(s.parse().unwrap())
    }

    fn offer() -> Message {
        Message::Offer {
            version: 1,
            pid: 42,
            listeners: vec![
                Offered {
                    name: "agent".into(),
                    endpoint: tcp("0.0.0.0:8091"),
                    sockets: 4,
                },
                Offered {
                    name: "connect-uds".into(),
                    endpoint: Endpoint::Unix("/var/run/a b/%x\u{e9}.sock".into()),
                    sockets: 1,
                },
                Offered {
                    name: "handover".into(),
                    endpoint: Endpoint::Unix("/run/h.sock".into()),
                    sockets: 1,
                },
            ],
        }
    }

    #[test]
    fn every_message_reads_back_as_written() {
        for m in [
            Message::Hello {
                min: 1,
                max: 3,
                pid: 7,
            },
            offer(),
            Message::Taken {
                names: vec!["agent".into(), "handover".into()],
            },
            Message::Draining {
                pid: 9,
                forward: vec![],
            },
            Message::Draining {
                pid: 9,
                forward: vec![
                    "/run/et/handover.sock.forward-9".into(),
                    "/run/et/handover.sock.forward-7".into(),
                ],
            },
            Message::Refused {
                reason: "listeners differ: agent".into(),
            },
        ] {
            let bytes = m.encode();
            assert!(bytes.len() <= MAX_MESSAGE);
            assert_eq!(Message::decode(&bytes), Ok(m.clone()), "{m:?}");
        }
    }

    #[test]
    fn a_path_with_spaces_percent_and_non_ascii_is_escaped() {
        let e = Endpoint::Unix("/a b/%c\u{e9}".into());
        let s = encode_endpoint(&e);
        assert_eq!(s, "unix:/a%20b/%25c%C3%A9");
        assert_eq!(decode_endpoint(&s), Some(e));
        assert_eq!(decode_endpoint("unix:/a%00b"), None, "NUL in a path");
        assert_eq!(decode_endpoint("unix:/a%4"), None, "cut escape");
        assert_eq!(decode_endpoint("unix:"), None);
        assert_eq!(decode_endpoint("udp:1.2.3.4:5"), None);
        assert_eq!(decode_endpoint("tcp:[::1]:80"), Some(tcp("[::1]:80")));
    }

    #[test]
    fn later_fields_and_items_are_ignored() {
        let m = Message::decode(
            b"offer version=1 pid=5 zone=b\nlistener agent tcp:1.2.3.4:5 2 \
              \nlistener agent2 tcp:1.2.3.4:6 1\nsocket-options agent nodelay\n",
        );
        // The first listener line has a fourth word: malformed, not skipped.
        assert!(
            matches!(
                m,
                Err(Error::Malformed {
                    field: "listener",
                    ..
                })
            ),
            "{m:?}"
        );
        let m = Message::decode(
            b"offer version=1 pid=5 zone=b\nlistener agent tcp:1.2.3.4:5 2\nsocket-options agent nodelay\n",
        )
        .unwrap();
        let Message::Offer { listeners, .. } = m else {
            panic!()
        };
        assert_eq!(listeners.len(), 1);
        assert_eq!(
            Message::decode(b"hello min=1 max=2 pid=3 features=x\n"),
            Ok(Message::Hello {
                min: 1,
                max: 2,
                pid: 3
            })
        );
    }

    #[test]
    fn hostile_messages_get_a_clear_error() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b"\n", "empty"),
            (b"\xff\xfe", "not UTF-8"),
            (b"shutdown now\n", "unknown handover message kind \"shutdown\""),
            (b"hello min=1 pid=3\n", "field max missing"),
            (b"hello min=2 max=1 pid=3\n", "no version range"),
            (b"hello min=1 max=99999999999 pid=3\n", "field max malformed"),
            (b"draining\n", "field pid missing"),
            (b"draining pid=1
forward tcp:1.2.3.4:5
", "field forward malformed"),
            (
                b"offer version=1 pid=1\nlistener a tcp:1.2.3.4:5 0\n",
                "field sockets malformed",
            ),
            (
                b"offer version=1 pid=1\nlistener a tcp:1.2.3.4 1\n",
                "field endpoint malformed",
            ),
            (
                b"offer version=1 pid=1\nlistener a/b tcp:1.2.3.4:5 1\n",
                "field name malformed",
            ),
            (
                b"offer version=1 pid=1\nlistener a tcp:1.2.3.4:5 1\nlistener a tcp:1.2.3.4:6 1\n",
                "names listener \"a\" twice",
            ),
            (
                b"offer version=1 pid=1\nlistener a tcp:1.2.3.4:5 4000\nlistener b tcp:1.2.3.4:6 97\n",
                "over 4096 sockets",
            ),
        ];
        for (bytes, want) in cases {
            let err = Message::decode(bytes).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{:?}: {err}",
                String::from_utf8_lossy(bytes)
            );
        }
        let long = vec![b'a'; MAX_MESSAGE + 1];
        assert_eq!(Message::decode(&long), Err(Error::TooLong(MAX_MESSAGE + 1)));
        let mut many = b"offer version=1 pid=1\n".to_vec();
        for i in 0..=MAX_LISTENERS {
            many.extend_from_slice(format!("listener l{i} tcp:1.2.3.4:{} 1\n", i + 1).as_bytes());
        }
        assert_eq!(Message::decode(&many), Err(Error::TooManyListeners));
    }

    #[test]
    fn a_refusal_is_one_bounded_line() {
        let m = Message::Refused {
            reason: format!("a\nb{}", "\u{e9}".repeat(MAX_REASON)),
        };
        let bytes = m.encode();
        let Ok(Message::Refused { reason }) = Message::decode(&bytes) else {
            panic!("{:?}", String::from_utf8_lossy(&bytes))
        };
        assert!(reason.starts_with("a b"));
        assert!(reason.len() <= MAX_REASON);
    }

    #[test]
    fn a_refusal_with_control_characters_reads_as_it_is_written_back() {
        let m = Message::decode(b"refused versions }\0\0\x003 asked\n").unwrap();
        assert_eq!(
            m,
            Message::Refused {
                reason: "versions }   3 asked".into()
            }
        );
        assert_eq!(Message::decode(&m.encode()), Ok(m));
    }

    #[test]
    fn the_highest_common_version_is_chosen() {
        assert_eq!(choose_version(1, 1), Some(1));
        assert_eq!(choose_version(0, 9), Some(VERSION_MAX));
        assert_eq!(choose_version(VERSION_MAX + 1, VERSION_MAX + 5), None);
        assert_eq!(choose_version(0, 0), None);
    }

    #[test]
    fn a_successor_takes_what_matches_binds_the_rest_and_drops_the_others() {
        let Message::Offer { listeners, .. } = offer() else {
            unreachable!()
        };
        let agent = tcp("0.0.0.0:8091");
        let moved = tcp("0.0.0.0:8092");
        let any = tcp("0.0.0.0:0");
        let handover = Endpoint::Unix("/run/h.sock".into());
        let wanted = [
            Want {
                name: "handover",
                endpoint: &handover,
            },
            Want {
                name: "agent",
                endpoint: &agent,
            },
            Want {
                name: "grpc",
                endpoint: &moved,
            },
            Want {
                name: "admin",
                endpoint: &any,
            },
        ];
        let plan = Plan::new(&wanted, &listeners);
        assert_eq!(plan.take, vec![(0, 2, 5..6), (1, 0, 0..4)]);
        assert_eq!(plan.bind, vec![2, 3]);
        assert_eq!(plan.unused, vec![1]);
        assert_eq!(plan.taken_names(&listeners), vec!["handover", "agent"]);
        // Same name, another address: not taken.
        let other = tcp("127.0.0.1:8091");
        let plan = Plan::new(
            &[Want {
                name: "agent",
                endpoint: &other,
            }],
            &listeners,
        );
        assert_eq!((plan.take.len(), plan.bind.clone()), (0, vec![0]));
    }

    #[test]
    fn sockets_go_in_batches_the_kernel_accepts() {
        assert_eq!(socket_batches(0).collect::<Vec<_>>(), Vec::<usize>::new());
        assert_eq!(socket_batches(6).collect::<Vec<_>>(), vec![6]);
        assert_eq!(socket_batches(253).collect::<Vec<_>>(), vec![253]);
        assert_eq!(socket_batches(600).collect::<Vec<_>>(), vec![253, 253, 94]);
        assert_eq!(socket_batches(MAX_SOCKETS).sum::<usize>(), MAX_SOCKETS);
    }
}
