//! Following HTTP/1.1 exchanges in a relayed byte stream, sans-I/O, for
//! yurt-tunnel's tracing wrapper: the bytes pass through untouched; the
//! tracker finds where each request and response head starts, so every
//! exchange can be logged (method, path, status, duration), pipelined or
//! streamed ones included. After an upgrade (101), a head it cannot parse,
//! or an oversized head, it stops looking and the stream is just relayed.

use super::{self as http1, ChunkedDecoder, Framing, HeadLimit};

/// Heads longer than this end the following (the bytes still pass).
const LIMIT: HeadLimit = HeadLimit::KUBELET;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Request { method: String, path: String },
    Response { status: u16 },
}

#[derive(Debug)]
enum State {
    Head(Vec<u8>),
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Not following any more (upgraded, until-close, or unparsable).
    Raw,
}

/// One direction of an HTTP/1.1 connection.
#[derive(Debug)]
pub struct Tracker {
    requests: bool,
    state: State,
}

impl Tracker {
    pub fn requests() -> Tracker {
        Tracker {
            requests: true,
            state: State::Head(Vec::new()),
        }
    }

    pub fn responses() -> Tracker {
        Tracker {
            requests: false,
            state: State::Head(Vec::new()),
        }
    }

    pub fn stop(&mut self) {
        self.state = State::Raw;
    }

    /// Whether it stopped following the stream.
    pub fn stopped(&self) -> bool {
        matches!(self.state, State::Raw)
    }

    /// Feeds relayed bytes; `method_of_next_response` says which request a
    /// response answers (for HEAD, whose answers have no body).
    pub fn feed(
        &mut self,
        mut data: &[u8],
        mut method_of_next_response: impl FnMut() -> Option<String>,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        while !data.is_empty() {
            match &mut self.state {
                State::Raw => break,
                State::Length(left) => {
                    let take = (*left).min(data.len() as u64) as usize;
                    *left -= take as u64;
                    data = &data[take..];
                    if *left == 0 {
                        self.state = State::Head(Vec::new());
                    }
                }
                State::Chunked(dec) => match dec.advance(data) {
                    Ok(p) => {
                        data = &data[p.consumed..];
                        if p.done {
                            self.state = State::Head(Vec::new());
                        }
                    }
                    Err(_) => self.state = State::Raw,
                },
                State::Head(buf) => {
                    let before = buf.len();
                    buf.extend_from_slice(data);
                    let (framing, used, event) = if self.requests {
                        match http1::parse_request(buf, LIMIT) {
                            Ok(Some((h, n))) => {
                                let f = http1::request_framing(&h).unwrap_or(Framing::UntilClose);
                                let path = h.target.split('?').next().unwrap_or("").to_string();
                                (
                                    f,
                                    n,
                                    Event::Request {
                                        method: h.method,
                                        path,
                                    },
                                )
                            }
                            Ok(None) if buf.len() < LIMIT.bytes => return events,
                            _ => {
                                self.state = State::Raw;
                                return events;
                            }
                        }
                    } else {
                        match http1::parse_response(buf, LIMIT) {
                            Ok(Some((h, n))) => {
                                if (100..200).contains(&h.status) && h.status != 101 {
                                    // An interim answer: the real one follows.
                                    let used = n - before;
                                    data = &data[used.min(data.len())..];
                                    buf.clear();
                                    events.push(Event::Response { status: h.status });
                                    continue;
                                }
                                let method =
                                    method_of_next_response().unwrap_or_else(|| "GET".into());
                                let f = if h.status == 101 {
                                    Framing::UntilClose
                                } else {
                                    http1::response_framing(&method, &h)
                                        .unwrap_or(Framing::UntilClose)
                                };
                                (f, n, Event::Response { status: h.status })
                            }
                            Ok(None) if buf.len() < LIMIT.bytes => return events,
                            _ => {
                                self.state = State::Raw;
                                return events;
                            }
                        }
                    };
                    events.push(event);
                    let used = used - before;
                    data = &data[used.min(data.len())..];
                    self.state = match framing {
                        Framing::None => State::Head(Vec::new()),
                        Framing::Length(n) => State::Length(n),
                        Framing::Chunked => State::Chunked(ChunkedDecoder::new()),
                        Framing::UntilClose => State::Raw,
                    };
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_pipelined_requests_and_their_answers_in_any_split() {
        let reqs = b"GET /a HTTP/1.1\r\nHost: n\r\n\r\nPOST /b?x HTTP/1.1\r\nHost: n\r\nContent-Length: 3\r\n\r\nabcHEAD /c HTTP/1.1\r\nHost: n\r\n\r\n";
        let resps = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nHTTP/1.1 101 Switching\r\n\r\nraw bytes";
        for step in [1, 2, 7, 1000] {
            let mut t = Tracker::requests();
            let mut ev = Vec::new();
            for c in reqs.chunks(step) {
                ev.extend(t.feed(c, || None));
            }
            assert_eq!(
                ev,
                vec![
                    Event::Request {
                        method: "GET".into(),
                        path: "/a".into()
                    },
                    Event::Request {
                        method: "POST".into(),
                        path: "/b".into()
                    },
                    Event::Request {
                        method: "HEAD".into(),
                        path: "/c".into()
                    },
                ]
            );
            let mut methods = vec!["GET", "POST", "HEAD", "GET"]
                .into_iter()
                .map(String::from);
            let mut r = Tracker::responses();
            let mut ev = Vec::new();
            for c in resps.chunks(step) {
                ev.extend(r.feed(c, || methods.next()));
            }
            let statuses: Vec<u16> = ev
                .iter()
                .map(|e| match e {
                    Event::Response { status } => *status,
                    _ => 0,
                })
                .collect();
            assert_eq!(statuses, vec![200, 100, 201, 200, 101], "step {step}");
            assert!(r.stopped());
        }
    }

    #[test]
    fn garbage_stops_tracing() {
        let mut t = Tracker::requests();
        assert!(t.feed(b"\x00\x01\x02 nonsense\r\n\r\n", || None).is_empty());
        assert!(t.stopped());
    }
}
