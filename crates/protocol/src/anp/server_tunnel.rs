//! Server side of one agent connection (sans-I/O): which frontend waits for
//! which dial (keyed by the dial's `random`) and which frontend owns which
//! open connection (keyed by the agent's `connectID`).
//!
//! The runtime feeds it the agent's packets and the frontends' requests and
//! carries out the returned actions; it never blocks and owns no sockets.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use super::packet::{self, Frame};
use crate::spare::ReleaseSpare;

/// What the runtime must do after an agent packet.
#[derive(Debug, PartialEq)]
pub enum ServerAction<F> {
    /// Tell the frontend its dial succeeded.
    DialSucceeded { frontend: F, connect_id: i64 },
    /// Tell the frontend its dial failed with the agent's message.
    DialFailed { frontend: F, error: String },
    /// Hand payload to the frontend.
    Data {
        frontend: F,
        connect_id: i64,
        payload: Bytes,
    },
    /// The agent will send no more data on this connection (half-close).
    PeerFinished { frontend: F },
    /// The agent acknowledged `bytes` of this connection's data (the
    /// negotiated window extension).
    Window { frontend: F, bytes: u64 },
    /// The connection is gone; tell the frontend and forget it.
    Closed { frontend: F, error: String },
    /// The agent is draining: route no new dials to it.
    Drain,
    /// Send this packet back to the agent.
    Reply(Frame),
    /// Nothing to do; worth a log line.
    Ignored(String),
}

/// Pending dials and open connections of one agent connection.
pub struct ServerTunnel<F> {
    pending: HashMap<i64, F>,
    open: HashMap<i64, F>,
    /// connectIDs we sent CLOSE_REQ for, to ignore their trailing packets
    /// without answering each one (bounded).
    closing: HashMap<i64, u64>,
    closing_order: VecDeque<(i64, u64)>,
    closing_seq: u64,
}

const MAX_CLOSING: usize = 4096;

impl<F> Default for ServerTunnel<F> {
    fn default() -> Self {
        Self {
            pending: HashMap::new(),
            open: HashMap::new(),
            closing: HashMap::new(),
            closing_order: VecDeque::new(),
            closing_seq: 0,
        }
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("a dial with random {0} is already pending on this agent")]
pub struct DuplicateRandom(pub i64);

impl<F: Clone> ServerTunnel<F> {
    pub fn pending_dials(&self) -> usize {
        self.pending.len()
    }

    pub fn open_connections(&self) -> usize {
        self.open.len()
    }

    /// Records a dial about to be sent as DIAL_REQ.
    pub fn begin_dial(
        &mut self,
        random: i64,
        address: &str,
        frontend: F,
    ) -> Result<Frame, DuplicateRandom> {
        if self.pending.contains_key(&random) {
            return Err(DuplicateRandom(random));
        }
        self.pending.insert(random, frontend);
        Ok(packet::dial_request("tcp", address, random))
    }

    /// The frontend gave up on a pending dial (timeout, disconnect): returns
    /// the DIAL_CLS to send and the frontend it was pending for, if the dial
    /// was still pending.
    pub fn cancel_dial(&mut self, random: i64) -> Option<(Frame, F)> {
        let cancelled = self.pending.remove(&random);
        self.pending.release_spare();
        cancelled.map(|f| (packet::dial_close(random), f))
    }

    /// The frontend closed an open connection: returns the CLOSE_REQ to send.
    pub fn close(&mut self, connect_id: i64) -> Option<Frame> {
        self.open.remove(&connect_id)?;
        self.open.release_spare();
        self.remember_closing(connect_id);
        Some(packet::close_request(connect_id))
    }

    /// Forgets everything (the agent connection ended): every frontend that
    /// was waiting or connected, to be told.
    pub fn drain_all(&mut self) -> Vec<F> {
        let mut all: Vec<F> = self.pending.drain().map(|(_, f)| f).collect();
        all.extend(self.open.drain().map(|(_, f)| f));
        all
    }

    /// Whether `connect_id` is open here.
    pub fn is_open(&self, connect_id: i64) -> bool {
        self.open.contains_key(&connect_id)
    }

    fn remember_closing(&mut self, connect_id: i64) {
        self.closing_seq += 1;
        self.closing.insert(connect_id, self.closing_seq);
        self.closing_order.push_back((connect_id, self.closing_seq));
        while self.closing_order.len() > MAX_CLOSING {
            if let Some((old, seq)) = self.closing_order.pop_front() {
                // Only forget the entry this queue slot was made for.
                if self.closing.get(&old) == Some(&seq) {
                    self.closing.remove(&old);
                }
            }
        }
    }

    /// Drops the oldest entries of the closing order whose CLOSE_RSP came
    /// (closes are mostly answered in order), so the order holds about as
    /// many as still wait rather than the last [`MAX_CLOSING`] ever sent:
    /// 64 KiB on every agent link that had served that many tunnels. An
    /// empty order and table give their memory back.
    fn forget_answered_closes(&mut self) {
        while let Some(&(id, seq)) = self.closing_order.front() {
            if self.closing.get(&id) == Some(&seq) {
                break;
            }
            self.closing_order.pop_front();
        }
        if self.closing_order.is_empty() {
            self.closing_order = VecDeque::new();
            self.closing = HashMap::new();
        }
    }

    /// Handles one packet from the agent.
    pub fn on_agent_frame(&mut self, frame: Frame) -> ServerAction<F> {
        let action = self.handle_agent_frame(frame);
        self.release_spare();
        action
    }

    /// Gives back the room a burst of dials or tunnels grew (see
    /// [`crate::spare`]).
    fn release_spare(&mut self) {
        self.pending.release_spare();
        self.open.release_spare();
        self.closing.release_spare();
        self.closing_order.release_spare();
    }

    fn handle_agent_frame(&mut self, frame: Frame) -> ServerAction<F> {
        match frame {
            Frame::DialResponse(rsp) => {
                let Some(frontend) = self.pending.remove(&rsp.random) else {
                    if rsp.error.is_empty()
                        && rsp.connect_id != 0
                        && !self.open.contains_key(&rsp.connect_id)
                    {
                        // The dialer is gone: close what the agent opened.
                        self.remember_closing(rsp.connect_id);
                        return ServerAction::Reply(packet::close_request(rsp.connect_id));
                    }
                    return ServerAction::Ignored(format!(
                        "DIAL_RSP for unknown dial random={}",
                        rsp.random
                    ));
                };
                if !rsp.error.is_empty() {
                    return ServerAction::DialFailed {
                        frontend,
                        error: rsp.error,
                    };
                }
                if rsp.connect_id == 0 || self.open.contains_key(&rsp.connect_id) {
                    return ServerAction::DialFailed {
                        frontend,
                        error: format!("agent answered with unusable connectID {}", rsp.connect_id),
                    };
                }
                self.open.insert(rsp.connect_id, frontend.clone());
                ServerAction::DialSucceeded {
                    frontend,
                    connect_id: rsp.connect_id,
                }
            }
            Frame::Data(d) => {
                if let Some(bytes) = packet::window_grant(&d) {
                    return match self.open.get(&d.connect_id) {
                        Some(f) => ServerAction::Window {
                            frontend: f.clone(),
                            bytes,
                        },
                        // Updates may trail a close: nothing to answer.
                        None => ServerAction::Ignored(format!(
                            "window update for unknown connectID {}",
                            d.connect_id
                        )),
                    };
                }
                match self.open.get(&d.connect_id) {
                    Some(f) if packet::is_half_close(&d) => ServerAction::PeerFinished {
                        frontend: f.clone(),
                    },
                    Some(f) => ServerAction::Data {
                        frontend: f.clone(),
                        connect_id: d.connect_id,
                        payload: d.data,
                    },
                    None if self.closing.contains_key(&d.connect_id) => ServerAction::Ignored(
                        format!("DATA for closing connectID {}", d.connect_id),
                    ),
                    None => {
                        self.remember_closing(d.connect_id);
                        ServerAction::Reply(packet::close_request(d.connect_id))
                    }
                }
            }
            Frame::CloseResponse(c) => {
                if self.closing.remove(&c.connect_id).is_some() {
                    self.forget_answered_closes();
                }
                match self.open.remove(&c.connect_id) {
                    Some(frontend) => ServerAction::Closed {
                        frontend,
                        error: c.error,
                    },
                    None => ServerAction::Ignored(format!(
                        "CLOSE_RSP for unknown connectID {}",
                        c.connect_id
                    )),
                }
            }
            Frame::DialClose(c) => match self.pending.remove(&c.random) {
                Some(frontend) => ServerAction::DialFailed {
                    frontend,
                    error: "dial closed by agent".to_string(),
                },
                None => ServerAction::Ignored(format!("DIAL_CLS for unknown random {}", c.random)),
            },
            Frame::Drain => ServerAction::Drain,
            Frame::DialRequest(_) | Frame::CloseRequest(_) => ServerAction::Ignored(format!(
                "agent sent {} which only servers send",
                frame.name()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries the tables have room for.
    fn room(t: &ServerTunnel<u32>) -> usize {
        t.pending.capacity() + t.open.capacity() + t.closing.capacity() + t.closing_order.capacity()
    }

    #[test]
    fn a_burst_of_tunnels_gives_its_room_back_when_it_ends() {
        let mut t: ServerTunnel<u32> = ServerTunnel::default();
        for round in 0..3i64 {
            let base = round * 100_000;
            for i in 0..5_000 {
                t.begin_dial(base + i, "a:1", i as u32).unwrap();
            }
            for i in 0..5_000 {
                let a = t.on_agent_frame(packet::dial_response(base + i, base + i + 1, ""));
                assert!(matches!(a, ServerAction::DialSucceeded { .. }));
            }
            let peak = room(&t);
            assert!(peak >= 5_000, "{peak}");
            // Half end from the frontend (CLOSE_REQ, then the agent's
            // CLOSE_RSP), half from the agent.
            for i in 0..5_000 {
                let id = base + i + 1;
                if i % 2 == 0 {
                    t.close(id).unwrap();
                }
                t.on_agent_frame(packet::close_response(id, ""));
            }
            assert_eq!((t.open_connections(), t.pending_dials()), (0, 0));
            assert!(
                room(&t) <= 4 * crate::spare::KEEP,
                "kept room for {} of {peak}",
                room(&t)
            );
        }
    }

    #[test]
    fn dial_data_close_lifecycle() {
        let mut t: ServerTunnel<u8> = ServerTunnel::default();
        t.begin_dial(7, "a:1", 1).unwrap();
        assert_eq!(t.begin_dial(7, "a:1", 2), Err(DuplicateRandom(7)));
        assert_eq!(
            t.on_agent_frame(packet::dial_response(7, 100, "")),
            ServerAction::DialSucceeded {
                frontend: 1,
                connect_id: 100
            }
        );
        assert_eq!(
            t.on_agent_frame(packet::data(100, Bytes::from_static(b"hi"))),
            ServerAction::Data {
                frontend: 1,
                connect_id: 100,
                payload: Bytes::from_static(b"hi")
            }
        );
        assert_eq!(
            t.on_agent_frame(packet::close_response(100, "")),
            ServerAction::Closed {
                frontend: 1,
                error: String::new()
            }
        );
        assert_eq!(t.open_connections(), 0);
    }

    #[test]
    fn failed_and_cancelled_dials() {
        let mut t: ServerTunnel<u8> = ServerTunnel::default();
        t.begin_dial(1, "a:1", 1).unwrap();
        assert_eq!(
            t.on_agent_frame(packet::dial_response(1, 0, "connection refused")),
            ServerAction::DialFailed {
                frontend: 1,
                error: "connection refused".into()
            }
        );
        t.begin_dial(2, "a:1", 2).unwrap();
        assert_eq!(t.cancel_dial(2), Some((packet::dial_close(2), 2)));
        // The late answer opens a connection nobody wants: close it.
        assert_eq!(
            t.on_agent_frame(packet::dial_response(2, 55, "")),
            ServerAction::Reply(packet::close_request(55))
        );
        // ...and its stray DATA is ignored, not answered again.
        assert!(matches!(
            t.on_agent_frame(packet::data(55, Bytes::new())),
            ServerAction::Ignored(_)
        ));
    }

    #[test]
    fn unknown_ids_and_wrong_direction() {
        let mut t: ServerTunnel<u8> = ServerTunnel::default();
        assert_eq!(
            t.on_agent_frame(packet::data(9, Bytes::from_static(b"x"))),
            ServerAction::Reply(packet::close_request(9))
        );
        assert!(matches!(
            t.on_agent_frame(packet::close_response(9, "")),
            ServerAction::Ignored(_)
        ));
        assert!(matches!(
            t.on_agent_frame(packet::dial_response(3, 0, "x")),
            ServerAction::Ignored(_)
        ));
        assert!(matches!(
            t.on_agent_frame(packet::close_request(1)),
            ServerAction::Ignored(_)
        ));
        assert_eq!(t.on_agent_frame(Frame::Drain), ServerAction::Drain);
    }

    #[test]
    fn stray_dial_response_never_closes_a_live_connection() {
        let mut t: ServerTunnel<u8> = ServerTunnel::default();
        t.begin_dial(1, "a:1", 1).unwrap();
        t.on_agent_frame(packet::dial_response(1, 7, ""));
        assert!(matches!(
            t.on_agent_frame(packet::dial_response(99, 7, "")),
            ServerAction::Ignored(_)
        ));
        assert!(t.is_open(7));
    }

    /// Closes that were answered are forgotten: an agent link that served
    /// 10,000 tunnels closed by their frontends keeps only the closes not
    /// answered yet (and those behind them in order), and nothing once
    /// they are.
    #[test]
    fn answered_closes_leave_nothing_behind() {
        let mut t: ServerTunnel<u8> = ServerTunnel::default();
        let late = 9_990;
        for id in 1..=10_000i64 {
            t.begin_dial(id, "a:1", 1).unwrap();
            t.on_agent_frame(packet::dial_response(id, id, ""));
            t.close(id);
            if id != late {
                t.on_agent_frame(packet::close_response(id, ""));
            }
        }
        assert_eq!(t.closing.len(), 1);
        assert_eq!(t.closing_order.len(), 11);
        t.on_agent_frame(packet::close_response(late, ""));
        assert_eq!(t.closing_order.len(), 0);
        assert_eq!(t.closing_order.capacity(), 0);
        assert_eq!(t.closing.capacity(), 0);
    }

    #[test]
    fn closing_memory_survives_reuse_of_an_id() {
        let mut t: ServerTunnel<u8> = ServerTunnel::default();
        for random in [1, 2] {
            t.begin_dial(random, "a:1", 1).unwrap();
            t.on_agent_frame(packet::dial_response(random, 5, ""));
            t.close(5);
            if random == 1 {
                t.on_agent_frame(packet::close_response(5, ""));
            }
        }
        for id in 100..(100 + MAX_CLOSING as i64 - 1) {
            t.on_agent_frame(packet::data(id, Bytes::new()));
        }
        assert!(matches!(
            t.on_agent_frame(packet::data(5, Bytes::new())),
            ServerAction::Ignored(_)
        ));
    }

    #[test]
    fn zero_or_duplicate_connect_id_fails_the_dial() {
        let mut t: ServerTunnel<u8> = ServerTunnel::default();
        t.begin_dial(1, "a:1", 1).unwrap();
        t.on_agent_frame(packet::dial_response(1, 5, ""));
        t.begin_dial(2, "a:1", 2).unwrap();
        assert!(matches!(
            t.on_agent_frame(packet::dial_response(2, 5, "")),
            ServerAction::DialFailed { frontend: 2, .. }
        ));
    }

    #[test]
    fn half_close_mark_and_teardown() {
        let mut t: ServerTunnel<u8> = ServerTunnel::default();
        t.begin_dial(1, "a:1", 1).unwrap();
        t.on_agent_frame(packet::dial_response(1, 5, ""));
        assert_eq!(
            t.on_agent_frame(packet::half_close(5)),
            ServerAction::PeerFinished { frontend: 1 }
        );
        assert_eq!(
            t.on_agent_frame(packet::window_update(5, 4096)),
            ServerAction::Window {
                frontend: 1,
                bytes: 4096
            }
        );
        assert_eq!(t.close(5), Some(packet::close_request(5)));
        assert_eq!(t.close(5), None);
        assert!(matches!(
            t.on_agent_frame(packet::window_update(5, 4096)),
            ServerAction::Ignored(_)
        ));
        t.begin_dial(3, "a:1", 3).unwrap();
        assert_eq!(t.drain_all(), vec![3]);
    }
}
