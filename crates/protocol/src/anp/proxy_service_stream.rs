//! One gRPC `ProxyService/Proxy` stream (konnectivity-client's side of the
//! server), sans-I/O: the client's dials and connections on this stream,
//! which agent serves each, and what the client and the agents must be told.
//!
//! The client picks each dial's `random`; agents see a fresh one drawn here,
//! so two clients (or two dials of one client) never collide at an agent.
//! A dial lives under a stream-local token until the agent answers with a
//! connectID. The runtime routes dials ([`StreamAction::Dial`]), moves bytes
//! and reports what the agent connections say ([`AgentEvent`]); every
//! decision about packets is made here.
//!
//! ANP's clients know no half-close: when the target finishes sending
//! (the half-close extension between edgetunnel peers), the connection ends
//! for the client with CLOSE_RSP after the data already queued, and the agent
//! is told to close. Every way a connection can end (client CLOSE_REQ or
//! DIAL_CLS, the agent's CLOSE_RSP, the agent going away, the stream ending)
//! leaves no state behind here and tells the agent when it still holds
//! something.
//!
//! Never blocks, owns no sockets, reads no clock (times come in as inputs).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::packet::{self, Frame};
use super::small_map::SmallMap;
use crate::{NO_TUNNEL, ROUTE_ATTEMPTS};

/// Identifies one dial (and then its connection) on this stream.
pub type Token = u64;

/// Recently closed connectIDs remembered to answer late packets quietly.
const RECENTLY_CLOSED: usize = 64;

/// What an agent connection reports about one of this stream's dials.
#[derive(Debug, PartialEq)]
pub enum AgentEvent<P> {
    DialOk {
        connect_id: i64,
    },
    DialErr(String),
    /// Payload from the target.
    Data(P),
    /// The target finished sending (half-close between edgetunnel peers).
    Finished,
    /// The agent closed the connection (CLOSE_RSP) with this error text.
    Closed(String),
    /// The agent connection ended. Before the dial was answered this means
    /// the target was never reached through it.
    AgentGone,
    /// The agent connection dropped a pending dial we cancelled: it will
    /// report nothing more about it.
    DialCancelled,
}

/// Why a dial ended before any agent answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandoned {
    /// No agent could take it.
    NoAgent,
    /// The client cancelled it (DIAL_CLS).
    ByClient,
}

/// What the runtime must do next.
#[derive(Debug, PartialEq)]
pub enum StreamAction<A, P> {
    /// Pick an agent for `address` (not `avoid`, whose connection just
    /// ended), send it DIAL_REQ with `agent_random`, and report the outcome
    /// with [`ProxyStream::dial_sent`] or [`ProxyStream::no_agent`].
    Dial {
        token: Token,
        address: String,
        agent_random: i64,
        avoid: Option<A>,
    },
    /// Send this packet to the client (after everything queued before it).
    ToClient(Frame),
    /// Send the target's payload to the client as DATA.
    ToClientData { connect_id: i64, payload: P },
    /// Send the client's payload to the agent as DATA.
    ToAgentData {
        agent: A,
        connect_id: i64,
        payload: Bytes,
    },
    /// Tell the agent to close the connection (CLOSE_REQ).
    CloseAtAgent { agent: A, connect_id: i64 },
    /// Tell the agent to give up a pending dial (DIAL_CLS).
    CancelAtAgent { agent: A, agent_random: i64 },
    /// A dial ended before an agent answered (for metrics).
    DialAbandoned { why: Abandoned, after: Duration },
    /// Nothing to do; worth a debug line.
    Ignored(String),
}

struct Conn<A> {
    /// `None` only while the runtime routes the dial.
    agent: Option<A>,
    address: String,
    /// Agents the dial was sent to.
    attempts: u8,
    client_random: i64,
    agent_random: i64,
    connect_id: Option<i64>,
    started: Instant,
}

/// The state of one Proxy stream.
pub struct ProxyStream<A, P> {
    /// The stream's dials and connections. The maps are [`SmallMap`]s:
    /// konnectivity-client opens a stream per tunnel, so they hold one
    /// entry nearly always.
    conns: SmallMap<Token, Conn<A>>,
    /// Established connections.
    by_id: SmallMap<i64, Token>,
    /// Pending dials by the client's random (for DIAL_CLS).
    by_random: SmallMap<i64, Token>,
    /// Dials cancelled at an agent that may still answer (a DIAL_RSP can
    /// cross our DIAL_CLS): an answer that opened a connection is closed.
    cancelled: SmallMap<Token, A>,
    recently_closed: VecDeque<i64>,
    next_token: Token,
    rng: fastrand::Rng,
    actions: VecDeque<StreamAction<A, P>>,
}

impl<A: Clone, P> ProxyStream<A, P> {
    /// `seed` draws the randoms agents see.
    pub fn new(seed: u64) -> Self {
        Self {
            conns: SmallMap::new(),
            by_id: SmallMap::new(),
            by_random: SmallMap::new(),
            cancelled: SmallMap::new(),
            recently_closed: VecDeque::new(),
            next_token: 0,
            rng: fastrand::Rng::with_seed(seed),
            actions: VecDeque::new(),
        }
    }

    /// The next thing to do, in order. The queue's room is released once
    /// it is empty: konnectivity-client opens a stream per tunnel, and an
    /// idle tunnel's stream would keep four actions' room (about 380
    /// bytes) for nothing; an allocation per packet costs far less.
    pub fn poll_action(&mut self) -> Option<StreamAction<A, P>> {
        let a = self.actions.pop_front();
        if self.actions.is_empty() && self.actions.capacity() > 0 {
            self.actions = VecDeque::new();
        }
        a
    }

    /// Connections established on this stream.
    pub fn open_connections(&self) -> usize {
        self.by_id.len()
    }

    /// Dials not answered yet.
    pub fn pending_dials(&self) -> usize {
        self.conns.len() - self.by_id.len()
    }

    /// Dials cancelled at an agent whose last word is still due.
    pub fn cancelled_dials(&self) -> usize {
        self.cancelled.len()
    }

    fn push(&mut self, a: StreamAction<A, P>) {
        self.actions.push_back(a);
    }

    fn agent_random(&mut self) -> i64 {
        loop {
            let r = self.rng.i64(..);
            if r != 0 {
                return r;
            }
        }
    }

    /// A later piece of a client DATA packet whose first piece went to
    /// [`Self::on_client_frame`] (`PacketDecoder` hands a large DATA on as
    /// the HTTP/2 chunks' slices): its payload goes to the agent; an unknown
    /// connectID was answered once, at the first piece, as ANP answers a
    /// packet once.
    pub fn on_client_data_piece(&mut self, d: super::pb::Data) {
        let agent = self
            .by_id
            .get(&d.connect_id)
            .and_then(|t| self.conns.get(t))
            .and_then(|c| c.agent.clone());
        if let Some(agent) = agent {
            self.push(StreamAction::ToAgentData {
                agent,
                connect_id: d.connect_id,
                payload: d.data,
            });
        }
    }

    /// A packet from the client.
    pub fn on_client_frame(&mut self, frame: Frame, now: Instant) {
        match frame {
            Frame::DialRequest(req) => {
                if self.by_random.contains_key(&req.random) {
                    let msg = format!("a dial with random {} is already pending", req.random);
                    self.push(StreamAction::ToClient(packet::dial_response(
                        req.random, 0, msg,
                    )));
                    return;
                }
                self.next_token += 1;
                let token = self.next_token;
                let agent_random = self.agent_random();
                self.by_random.insert(req.random, token);
                self.conns.insert(
                    token,
                    Conn {
                        agent: None,
                        address: req.address.clone(),
                        attempts: 0,
                        client_random: req.random,
                        agent_random,
                        connect_id: None,
                        started: now,
                    },
                );
                self.push(StreamAction::Dial {
                    token,
                    address: req.address,
                    agent_random,
                    avoid: None,
                });
            }
            Frame::Data(d) => {
                let agent = self
                    .by_id
                    .get(&d.connect_id)
                    .and_then(|t| self.conns.get(t))
                    .and_then(|c| c.agent.clone());
                match agent {
                    Some(agent) => self.push(StreamAction::ToAgentData {
                        agent,
                        connect_id: d.connect_id,
                        payload: d.data,
                    }),
                    // Data that crossed our CLOSE_RSP: already answered.
                    None if self.recently_closed.contains(&d.connect_id) => {}
                    None => self.push(StreamAction::ToClient(packet::close_response(
                        d.connect_id,
                        "unrecognized connectID",
                    ))),
                }
            }
            Frame::CloseRequest(c) => match self.by_id.get(&c.connect_id).copied() {
                Some(token) => {
                    self.forget(token);
                    self.push(StreamAction::ToClient(packet::close_response(
                        c.connect_id,
                        "",
                    )));
                }
                None if self.recently_closed.contains(&c.connect_id) => {
                    self.push(StreamAction::ToClient(packet::close_response(
                        c.connect_id,
                        "",
                    )));
                }
                None => self.push(StreamAction::ToClient(packet::close_response(
                    c.connect_id,
                    "Unknown connectID",
                ))),
            },
            Frame::DialClose(c) => match self.by_random.get(&c.random).copied() {
                Some(token) => {
                    let after = self
                        .conns
                        .get(&token)
                        .map(|c| now.saturating_duration_since(c.started))
                        .unwrap_or_default();
                    self.forget(token);
                    self.push(StreamAction::DialAbandoned {
                        why: Abandoned::ByClient,
                        after,
                    });
                }
                None => self.push(StreamAction::Ignored(format!(
                    "DIAL_CLS for unknown random {}",
                    c.random
                ))),
            },
            other => self.push(StreamAction::Ignored(format!(
                "{} from a proxy client",
                other.name()
            ))),
        }
    }

    /// The runtime sent dial `token` to `agent`.
    pub fn dial_sent(&mut self, token: Token, agent: A, agent_random: i64) {
        match self.conns.get_mut(&token) {
            Some(c) if c.agent.is_none() => {
                c.agent = Some(agent);
                c.attempts += 1;
            }
            _ => {
                // Nobody waits for it any more.
                self.cancelled.insert(token, agent.clone());
                self.push(StreamAction::CancelAtAgent {
                    agent,
                    agent_random,
                });
            }
        }
    }

    /// No agent could take dial `token`.
    pub fn no_agent(&mut self, token: Token) {
        let Some(c) = self.conns.remove(&token) else {
            return;
        };
        self.forget_random(c.client_random);
        self.push(StreamAction::ToClient(packet::dial_response(
            c.client_random,
            0,
            NO_TUNNEL,
        )));
        self.push(StreamAction::DialAbandoned {
            why: Abandoned::NoAgent,
            after: Duration::ZERO,
        });
    }

    /// What an agent connection said about dial/connection `token`.
    pub fn on_agent_event(&mut self, token: Token, ev: AgentEvent<P>) {
        if let Some(agent) = self.cancelled.remove(&token) {
            // A dial we cancelled: its last word.
            match ev {
                AgentEvent::DialOk { connect_id } => {
                    self.push(StreamAction::CloseAtAgent { agent, connect_id })
                }
                AgentEvent::DialErr(_)
                | AgentEvent::Closed(_)
                | AgentEvent::AgentGone
                | AgentEvent::DialCancelled => {}
                AgentEvent::Data(_) | AgentEvent::Finished => {
                    // Not a last word; keep waiting for one.
                    self.cancelled.insert(token, agent);
                }
            }
            return;
        }
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        match (ev, c.connect_id) {
            (AgentEvent::DialOk { connect_id }, None) => {
                let client_random = c.client_random;
                if self.by_id.contains_key(&connect_id) || connect_id == 0 {
                    // Another agent used this connectID on this stream.
                    let agent = c.agent.clone();
                    self.conns.remove(&token);
                    self.forget_random(client_random);
                    if let Some(agent) = agent {
                        self.push(StreamAction::CloseAtAgent { agent, connect_id });
                    }
                    self.push(StreamAction::ToClient(packet::dial_response(
                        client_random,
                        0,
                        format!("connectID {connect_id} is already in use on this stream"),
                    )));
                    return;
                }
                c.connect_id = Some(connect_id);
                // Only a dial that is routed again needs its address.
                c.address = String::new();
                self.forget_random(client_random);
                self.by_id.insert(connect_id, token);
                self.push(StreamAction::ToClient(packet::dial_response(
                    client_random,
                    connect_id,
                    "",
                )));
            }
            (AgentEvent::DialErr(e), None) | (AgentEvent::Closed(e), None) => {
                let client_random = c.client_random;
                self.conns.remove(&token);
                self.forget_random(client_random);
                self.push(StreamAction::ToClient(packet::dial_response(
                    client_random,
                    0,
                    e,
                )));
            }
            (AgentEvent::AgentGone, None) => {
                if c.attempts < ROUTE_ATTEMPTS {
                    // Never reached the target: route the dial again.
                    let avoid = c.agent.take();
                    let (address, agent_random) = (c.address.clone(), c.agent_random);
                    self.push(StreamAction::Dial {
                        token,
                        address,
                        agent_random,
                        avoid,
                    });
                } else {
                    let client_random = c.client_random;
                    self.conns.remove(&token);
                    self.forget_random(client_random);
                    self.push(StreamAction::ToClient(packet::dial_response(
                        client_random,
                        0,
                        "agent disconnected",
                    )));
                }
            }
            (AgentEvent::Data(payload), Some(connect_id)) => {
                self.push(StreamAction::ToClientData {
                    connect_id,
                    payload,
                });
            }
            (AgentEvent::Finished, Some(connect_id)) => {
                // ANP clients have no half-close: the connection ends here,
                // after the data queued before this.
                self.forget(token);
                self.push(StreamAction::ToClient(packet::close_response(
                    connect_id, "",
                )));
            }
            (AgentEvent::Closed(e), Some(connect_id)) => {
                self.conns.remove(&token);
                self.by_id.remove(&connect_id);
                self.remember_closed(connect_id);
                self.push(StreamAction::ToClient(packet::close_response(
                    connect_id, e,
                )));
            }
            (AgentEvent::AgentGone, Some(connect_id)) => {
                self.conns.remove(&token);
                self.by_id.remove(&connect_id);
                self.remember_closed(connect_id);
                self.push(StreamAction::ToClient(packet::close_response(
                    connect_id,
                    "agent disconnected",
                )));
            }
            (ev, _) => self.push(StreamAction::Ignored(format!(
                "agent event {} out of order for dial {token}",
                event_name(&ev)
            ))),
        }
    }

    /// The stream ended (the client finished, failed or went away): tell
    /// the agents about everything still open or pending.
    pub fn finish(&mut self) {
        let tokens: Vec<Token> = self.conns.keys();
        for token in tokens {
            self.forget(token);
        }
        self.by_random.clear();
    }

    /// Drops a dial or connection here and tells its agent.
    fn forget(&mut self, token: Token) {
        let Some(c) = self.conns.remove(&token) else {
            return;
        };
        match c.connect_id {
            Some(connect_id) => {
                self.by_id.remove(&connect_id);
                self.remember_closed(connect_id);
                if let Some(agent) = c.agent {
                    self.push(StreamAction::CloseAtAgent { agent, connect_id });
                }
            }
            None => {
                self.forget_random(c.client_random);
                if let Some(agent) = c.agent {
                    self.cancelled.insert(token, agent.clone());
                    self.push(StreamAction::CancelAtAgent {
                        agent,
                        agent_random: c.agent_random,
                    });
                }
            }
        }
    }

    /// Drops a pending dial's random; the map's room goes with its last
    /// entry (an idle tunnel has no pending dial).
    fn forget_random(&mut self, client_random: i64) {
        self.by_random.remove(&client_random);
    }

    fn remember_closed(&mut self, connect_id: i64) {
        if self.recently_closed.len() == RECENTLY_CLOSED {
            self.recently_closed.pop_front();
        }
        self.recently_closed.push_back(connect_id);
    }
}

fn event_name<P>(ev: &AgentEvent<P>) -> &'static str {
    match ev {
        AgentEvent::DialOk { .. } => "DialOk",
        AgentEvent::DialErr(_) => "DialErr",
        AgentEvent::Data(_) => "Data",
        AgentEvent::Finished => "Finished",
        AgentEvent::Closed(_) => "Closed",
        AgentEvent::AgentGone => "AgentGone",
        AgentEvent::DialCancelled => "DialCancelled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Stream = ProxyStream<&'static str, &'static str>;
    type Action = StreamAction<&'static str, &'static str>;

    fn now() -> Instant {
        Instant::now()
    }

    fn drain(s: &mut Stream) -> Vec<Action> {
        std::iter::from_fn(|| s.poll_action()).collect()
    }

    fn dial_req(random: i64) -> Frame {
        packet::dial_request("tcp", "node:10250", random)
    }

    /// Dials with client random 5 and returns (token, agent random).
    fn dial(s: &mut Stream, agent: &'static str) -> (Token, i64) {
        s.on_client_frame(dial_req(5), now());
        let (token, agent_random) = match drain(s).as_slice() {
            [StreamAction::Dial {
                token,
                agent_random,
                avoid: None,
                ..
            }] => (*token, *agent_random),
            other => panic!("{other:?}"),
        };
        s.dial_sent(token, agent, agent_random);
        (token, agent_random)
    }

    fn established(s: &mut Stream, agent: &'static str, connect_id: i64) -> Token {
        let (token, _) = dial(s, agent);
        s.on_agent_event(token, AgentEvent::DialOk { connect_id });
        assert_eq!(
            drain(s),
            vec![StreamAction::ToClient(packet::dial_response(
                5, connect_id, ""
            ))]
        );
        token
    }

    #[test]
    fn dial_data_both_ways_and_client_close() {
        let mut s = Stream::new(1);
        let t = established(&mut s, "a1", 9);
        assert_eq!(s.open_connections(), 1);
        s.on_client_frame(packet::data(9, Bytes::from_static(b"up")), now());
        s.on_agent_event(t, AgentEvent::Data("down"));
        assert_eq!(
            drain(&mut s),
            vec![
                StreamAction::ToAgentData {
                    agent: "a1",
                    connect_id: 9,
                    payload: Bytes::from_static(b"up")
                },
                StreamAction::ToClientData {
                    connect_id: 9,
                    payload: "down"
                }
            ]
        );
        s.on_client_frame(packet::close_request(9), now());
        assert_eq!(
            drain(&mut s),
            vec![
                StreamAction::CloseAtAgent {
                    agent: "a1",
                    connect_id: 9
                },
                StreamAction::ToClient(packet::close_response(9, ""))
            ]
        );
        assert_eq!(s.open_connections(), 0);
        // The agent's trailing packets change nothing.
        s.on_agent_event(t, AgentEvent::Data("late"));
        s.on_agent_event(t, AgentEvent::Closed(String::new()));
        assert!(drain(&mut s).is_empty());
        // Client data that crossed the close is dropped quietly.
        s.on_client_frame(packet::data(9, Bytes::from_static(b"x")), now());
        assert!(drain(&mut s).is_empty());
    }

    #[test]
    fn target_finishing_first_closes_for_the_client_after_its_data() {
        let mut s = Stream::new(1);
        let t = established(&mut s, "a1", 3);
        s.on_agent_event(t, AgentEvent::Data("answer"));
        s.on_agent_event(t, AgentEvent::Finished);
        assert_eq!(
            drain(&mut s),
            vec![
                StreamAction::ToClientData {
                    connect_id: 3,
                    payload: "answer"
                },
                StreamAction::CloseAtAgent {
                    agent: "a1",
                    connect_id: 3
                },
                StreamAction::ToClient(packet::close_response(3, "")),
            ]
        );
        assert_eq!(s.open_connections(), 0);
        // The client's own CLOSE_REQ, crossing ours, is answered calmly.
        s.on_client_frame(packet::close_request(3), now());
        assert_eq!(
            drain(&mut s),
            vec![StreamAction::ToClient(packet::close_response(3, ""))]
        );
    }

    #[test]
    fn stream_end_closes_everything_at_the_agents() {
        let mut s = Stream::new(1);
        established(&mut s, "a1", 3);
        s.on_client_frame(dial_req(6), now());
        let (token, agent_random) = match drain(&mut s).as_slice() {
            [StreamAction::Dial {
                token,
                agent_random,
                ..
            }] => (*token, *agent_random),
            other => panic!("{other:?}"),
        };
        s.dial_sent(token, "a2", agent_random);
        s.finish();
        let mut got = drain(&mut s);
        got.sort_by_key(|a| format!("{a:?}"));
        assert_eq!(
            got,
            vec![
                StreamAction::CancelAtAgent {
                    agent: "a2",
                    agent_random
                },
                StreamAction::CloseAtAgent {
                    agent: "a1",
                    connect_id: 3
                },
            ]
        );
        assert_eq!((s.open_connections(), s.pending_dials()), (0, 0));
        // The cancelled dial's answer crossed the DIAL_CLS: close it too.
        s.on_agent_event(token, AgentEvent::DialOk { connect_id: 4 });
        assert_eq!(
            drain(&mut s),
            vec![StreamAction::CloseAtAgent {
                agent: "a2",
                connect_id: 4
            }]
        );
        assert_eq!(s.cancelled_dials(), 0);
    }

    #[test]
    fn dial_close_cancels_at_the_agent_until_its_last_word() {
        let mut s = Stream::new(1);
        let (token, agent_random) = dial(&mut s, "a1");
        s.on_client_frame(packet::dial_close(5), now());
        let got = drain(&mut s);
        assert_eq!(
            got[0],
            StreamAction::CancelAtAgent {
                agent: "a1",
                agent_random
            }
        );
        assert!(matches!(
            got[1],
            StreamAction::DialAbandoned {
                why: Abandoned::ByClient,
                ..
            }
        ));
        assert_eq!(s.cancelled_dials(), 1);
        s.on_agent_event(token, AgentEvent::DialCancelled);
        assert_eq!(s.cancelled_dials(), 0);
        assert!(drain(&mut s).is_empty());
        // Unknown randoms are only logged.
        s.on_client_frame(packet::dial_close(77), now());
        assert!(matches!(
            drain(&mut s).as_slice(),
            [StreamAction::Ignored(_)]
        ));
    }

    #[test]
    fn agent_gone_before_answer_routes_again_then_gives_up() {
        let mut s = Stream::new(1);
        let (token, agent_random) = dial(&mut s, "a1");
        for (attempt, agent) in [(2, "a2"), (3, "a3")] {
            let prev = if attempt == 2 { "a1" } else { "a2" };
            s.on_agent_event(token, AgentEvent::AgentGone);
            assert_eq!(
                drain(&mut s),
                vec![StreamAction::Dial {
                    token,
                    address: "node:10250".into(),
                    agent_random,
                    avoid: Some(prev)
                }]
            );
            s.dial_sent(token, agent, agent_random);
        }
        s.on_agent_event(token, AgentEvent::AgentGone);
        assert_eq!(
            drain(&mut s),
            vec![StreamAction::ToClient(packet::dial_response(
                5,
                0,
                "agent disconnected"
            ))]
        );
        assert_eq!(s.pending_dials(), 0);
    }

    #[test]
    fn no_agent_and_dial_errors_answer_the_client() {
        let mut s = Stream::new(1);
        s.on_client_frame(dial_req(5), now());
        let token = match drain(&mut s).as_slice() {
            [StreamAction::Dial { token, .. }] => *token,
            other => panic!("{other:?}"),
        };
        s.no_agent(token);
        let got = drain(&mut s);
        assert_eq!(
            got[0],
            StreamAction::ToClient(packet::dial_response(5, 0, NO_TUNNEL))
        );
        let (token, _) = dial(&mut s, "a1");
        s.on_agent_event(token, AgentEvent::DialErr("connection refused".into()));
        assert_eq!(
            drain(&mut s),
            vec![StreamAction::ToClient(packet::dial_response(
                5,
                0,
                "connection refused"
            ))]
        );
        assert_eq!(s.pending_dials(), 0);
    }

    #[test]
    fn connect_id_collisions_and_duplicate_randoms_are_refused() {
        let mut s = Stream::new(1);
        established(&mut s, "a1", 9);
        s.on_client_frame(dial_req(6), now());
        let (token, r) = match drain(&mut s).as_slice() {
            [StreamAction::Dial {
                token,
                agent_random,
                ..
            }] => (*token, *agent_random),
            other => panic!("{other:?}"),
        };
        s.dial_sent(token, "a2", r);
        s.on_client_frame(dial_req(6), now());
        assert!(matches!(
            drain(&mut s).as_slice(),
            [StreamAction::ToClient(Frame::DialResponse(d))] if d.random == 6 && !d.error.is_empty()
        ));
        s.on_agent_event(token, AgentEvent::DialOk { connect_id: 9 });
        let got = drain(&mut s);
        assert_eq!(
            got[0],
            StreamAction::CloseAtAgent {
                agent: "a2",
                connect_id: 9
            }
        );
        assert!(
            matches!(&got[1], StreamAction::ToClient(Frame::DialResponse(d)) if d.random == 6 && d.connect_id == 0)
        );
        assert_eq!(s.open_connections(), 1);
    }

    #[test]
    fn agent_gone_or_closed_after_answer_tells_the_client() {
        let mut s = Stream::new(1);
        let t = established(&mut s, "a1", 9);
        s.on_agent_event(t, AgentEvent::Closed("reset by peer".into()));
        assert_eq!(
            drain(&mut s),
            vec![StreamAction::ToClient(packet::close_response(
                9,
                "reset by peer"
            ))]
        );
        let mut s = Stream::new(1);
        let t = established(&mut s, "a1", 9);
        s.on_agent_event(t, AgentEvent::AgentGone);
        assert_eq!(
            drain(&mut s),
            vec![StreamAction::ToClient(packet::close_response(
                9,
                "agent disconnected"
            ))]
        );
        // Unknown connectIDs from the client are answered.
        s.on_client_frame(packet::data(1234, Bytes::new()), now());
        s.on_client_frame(packet::close_request(1234), now());
        assert_eq!(
            drain(&mut s),
            vec![
                StreamAction::ToClient(packet::close_response(1234, "unrecognized connectID")),
                StreamAction::ToClient(packet::close_response(1234, "Unknown connectID")),
            ]
        );
        // A later piece of an unknown connection's DATA is not answered again.
        let Frame::Data(piece) = packet::data(1234, Bytes::from_static(b"rest")) else {
            unreachable!()
        };
        s.on_client_data_piece(piece);
        assert_eq!(drain(&mut s), vec![]);
    }

    #[test]
    fn agents_see_fresh_nonzero_randoms() {
        let mut s = Stream::new(7);
        let mut seen = std::collections::HashSet::new();
        for r in 0..100 {
            s.on_client_frame(dial_req(r), now());
        }
        for a in drain(&mut s) {
            if let StreamAction::Dial { agent_random, .. } = a {
                assert_ne!(agent_random, 0);
                seen.insert(agent_random);
            }
        }
        assert_eq!(seen.len(), 100);
    }
}
