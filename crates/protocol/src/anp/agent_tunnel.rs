//! Agent side of one server connection (sans-I/O): dials in progress and open
//! connections keyed by the `connectID` this agent assigns.
//!
//! Answers follow ANP's agent: DATA for an unknown connection gets
//! `CLOSE_RSP{error: "unrecognized connectID"}`, CLOSE_REQ for an unknown one
//! `CLOSE_RSP{error: "Unknown connectID"}`; DIAL_CLS cancels a dial still in
//! progress.

use std::collections::HashMap;

use bytes::Bytes;

use super::packet::{self, Frame};
use crate::spare::ReleaseSpare;

/// What the runtime must do after a server packet.
#[derive(Debug, PartialEq)]
pub enum AgentAction<C> {
    /// Dial `address` for the dial `random`, then call
    /// [`AgentTunnel::dial_succeeded`] or [`AgentTunnel::dial_failed`].
    Dial {
        random: i64,
        connect_id: i64,
        protocol: String,
        address: String,
    },
    /// Write payload to the local connection.
    Write { conn: C, payload: Bytes },
    /// The server side will send nothing more: shut down our write side.
    ShutdownWrite { conn: C },
    /// The server acknowledged `bytes` of this connection's data (the
    /// negotiated window extension).
    Window { conn: C, bytes: u64 },
    /// Close the local connection, then send the reply.
    Close { conn: C, reply: Frame },
    /// Send this packet to the server.
    Reply(Frame),
    /// Abort the dial in progress for this connectID.
    CancelDial { connect_id: i64 },
    /// The server is shutting down (edgetunnel's server sends DRAIN, which
    /// ANP defines only from agents): connect again for new dials, keep
    /// this connection for the open ones.
    ServerDraining,
    /// Nothing to do; worth a log line.
    Ignored(String),
}

pub struct AgentTunnel<C> {
    next_id: i64,
    /// random -> connectID of dials in progress.
    dialing: HashMap<i64, i64>,
    open: HashMap<i64, C>,
}

impl<C> Default for AgentTunnel<C> {
    fn default() -> Self {
        Self {
            next_id: 0,
            dialing: HashMap::new(),
            open: HashMap::new(),
        }
    }
}

/// What to do with a finished dial.
#[derive(Debug, PartialEq)]
pub enum DialOutcome {
    /// Send this DIAL_RSP; the connection is open.
    Respond(Frame),
    /// The server cancelled the dial meanwhile: close the new connection.
    Cancelled,
}

impl<C: Clone> AgentTunnel<C> {
    pub fn open_connections(&self) -> usize {
        self.open.len()
    }

    pub fn dials_in_progress(&self) -> usize {
        self.dialing.len()
    }

    /// Handles a later piece of a DATA packet whose first piece went to
    /// [`Self::on_server_frame`] (`PacketDecoder` hands a large DATA on as
    /// the HTTP/2 chunks' slices): its payload for an open connection, and no
    /// second `CLOSE_RSP` for an unknown one (ANP answers a packet once).
    pub fn on_server_data_piece(&mut self, d: super::pb::Data) -> AgentAction<C> {
        match self.open.get(&d.connect_id) {
            Some(c) => AgentAction::Write {
                conn: c.clone(),
                payload: d.data,
            },
            None => AgentAction::Ignored(format!(
                "later piece of DATA for unknown connectID {}",
                d.connect_id
            )),
        }
    }

    /// Handles one packet from the server.
    pub fn on_server_frame(&mut self, frame: Frame) -> AgentAction<C> {
        let action = self.handle_server_frame(frame);
        self.release_spare();
        action
    }

    /// Gives back the room a burst of dials or tunnels grew (see
    /// [`crate::spare`]).
    fn release_spare(&mut self) {
        self.dialing.release_spare();
        self.open.release_spare();
    }

    fn handle_server_frame(&mut self, frame: Frame) -> AgentAction<C> {
        match frame {
            Frame::DialRequest(req) => {
                if self.dialing.contains_key(&req.random) {
                    return AgentAction::Ignored(format!(
                        "duplicate DIAL_REQ for random {}",
                        req.random
                    ));
                }
                self.next_id += 1;
                let connect_id = self.next_id;
                self.dialing.insert(req.random, connect_id);
                AgentAction::Dial {
                    random: req.random,
                    connect_id,
                    protocol: req.protocol,
                    address: req.address,
                }
            }
            Frame::Data(d) => {
                if let Some(bytes) = packet::window_grant(&d) {
                    return match self.open.get(&d.connect_id) {
                        Some(c) => AgentAction::Window {
                            conn: c.clone(),
                            bytes,
                        },
                        // Updates may trail a close: nothing to answer.
                        None => AgentAction::Ignored(format!(
                            "window update for unknown connectID {}",
                            d.connect_id
                        )),
                    };
                }
                match self.open.get(&d.connect_id) {
                    Some(c) if packet::is_half_close(&d) => {
                        AgentAction::ShutdownWrite { conn: c.clone() }
                    }
                    Some(c) => AgentAction::Write {
                        conn: c.clone(),
                        payload: d.data,
                    },
                    None => AgentAction::Reply(packet::close_response(
                        d.connect_id,
                        "unrecognized connectID",
                    )),
                }
            }
            Frame::CloseRequest(c) => match self.open.remove(&c.connect_id) {
                Some(conn) => AgentAction::Close {
                    conn,
                    reply: packet::close_response(c.connect_id, ""),
                },
                None => {
                    AgentAction::Reply(packet::close_response(c.connect_id, "Unknown connectID"))
                }
            },
            Frame::DialClose(c) => match self.dialing.remove(&c.random) {
                Some(connect_id) => AgentAction::CancelDial { connect_id },
                None => AgentAction::Ignored(format!("DIAL_CLS for unknown random {}", c.random)),
            },
            Frame::Drain => AgentAction::ServerDraining,
            other => AgentAction::Ignored(format!(
                "server sent {} which agents do not expect",
                other.name()
            )),
        }
    }

    /// The dial for `random` connected.
    pub fn dial_succeeded(&mut self, random: i64, connect_id: i64, conn: C) -> DialOutcome {
        let dialing = self.dialing.remove(&random);
        self.dialing.release_spare();
        if dialing.is_none() {
            return DialOutcome::Cancelled;
        }
        self.open.insert(connect_id, conn);
        DialOutcome::Respond(packet::dial_response(random, connect_id, ""))
    }

    /// The dial for `random` failed; `None` if it was cancelled meanwhile.
    pub fn dial_failed(&mut self, random: i64, error: &str) -> Option<Frame> {
        let dialing = self.dialing.remove(&random);
        self.dialing.release_spare();
        dialing?;
        Some(packet::dial_response(random, 0, error))
    }

    /// The local connection ended on its own: the CLOSE_RSP to send, if the
    /// server had not closed it already.
    pub fn local_closed(&mut self, connect_id: i64) -> Option<Frame> {
        let open = self.open.remove(&connect_id);
        self.open.release_spare();
        open?;
        Some(packet::close_response(connect_id, ""))
    }

    /// Forgets every connection (the server connection ended).
    pub fn drain_all(&mut self) -> Vec<C> {
        self.dialing.clear();
        self.open.drain().map(|(_, c)| c).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dial(t: &mut AgentTunnel<u8>, random: i64) -> i64 {
        match t.on_server_frame(packet::dial_request("tcp", "127.0.0.1:80", random)) {
            AgentAction::Dial { connect_id, .. } => connect_id,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_burst_of_tunnels_gives_its_room_back_when_it_ends() {
        let mut t = AgentTunnel::default();
        for round in 0..3i64 {
            let ids: Vec<i64> = (0..5_000)
                .map(|i| dial(&mut t, round * 10_000 + i))
                .collect();
            let peak = t.dialing.capacity();
            assert!(peak >= 5_000, "{peak}");
            for (i, &id) in ids.iter().enumerate() {
                t.dial_succeeded(round * 10_000 + i as i64, id, 1);
            }
            assert!(t.open.capacity() >= 5_000);
            // Half closed by the server, half ended locally.
            for (i, &id) in ids.iter().enumerate() {
                if i % 2 == 0 {
                    t.on_server_frame(packet::close_request(id));
                } else {
                    t.local_closed(id).unwrap();
                }
            }
            assert_eq!(t.open_connections(), 0);
            let room = t.dialing.capacity() + t.open.capacity();
            assert!(
                room <= 4 * crate::spare::KEEP,
                "kept room for {room} of {peak}"
            );
        }
    }

    #[test]
    fn dial_write_close() {
        let mut t = AgentTunnel::default();
        let id = dial(&mut t, 5);
        assert_eq!(
            t.dial_succeeded(5, id, 1),
            DialOutcome::Respond(packet::dial_response(5, id, ""))
        );
        assert_eq!(
            t.on_server_frame(packet::data(id, Bytes::from_static(b"x"))),
            AgentAction::Write {
                conn: 1,
                payload: Bytes::from_static(b"x")
            }
        );
        assert_eq!(
            t.on_server_frame(packet::window_update(id, 70_000)),
            AgentAction::Window {
                conn: 1,
                bytes: 70_000
            }
        );
        assert_eq!(
            t.on_server_frame(packet::close_request(id)),
            AgentAction::Close {
                conn: 1,
                reply: packet::close_response(id, "")
            }
        );
        assert_eq!(t.local_closed(id), None);
        // A window update trailing the close is not answered.
        assert!(matches!(
            t.on_server_frame(packet::window_update(id, 1)),
            AgentAction::Ignored(_)
        ));
    }

    #[test]
    fn unknown_ids_get_anp_answers() {
        let mut t: AgentTunnel<u8> = AgentTunnel::default();
        assert_eq!(
            t.on_server_frame(packet::data(3, Bytes::new())),
            AgentAction::Reply(packet::close_response(3, "unrecognized connectID"))
        );
        assert_eq!(
            t.on_server_frame(packet::close_request(3)),
            AgentAction::Reply(packet::close_response(3, "Unknown connectID"))
        );
        assert_eq!(t.on_server_frame(Frame::Drain), AgentAction::ServerDraining);
    }

    #[test]
    fn a_later_piece_of_unknown_data_is_not_answered_again() {
        let mut t: AgentTunnel<u8> = AgentTunnel::default();
        let Frame::Data(piece) = packet::data(3, Bytes::from_static(b"rest")) else {
            unreachable!()
        };
        assert!(matches!(
            t.on_server_data_piece(piece),
            AgentAction::Ignored(_)
        ));
    }

    #[test]
    fn cancelled_and_failed_dials() {
        let mut t: AgentTunnel<u8> = AgentTunnel::default();
        let id = dial(&mut t, 1);
        assert_eq!(
            t.on_server_frame(packet::dial_close(1)),
            AgentAction::CancelDial { connect_id: id }
        );
        assert_eq!(t.dial_succeeded(1, id, 9), DialOutcome::Cancelled);
        let _ = dial(&mut t, 2);
        assert_eq!(
            t.dial_failed(2, "connection refused"),
            Some(packet::dial_response(2, 0, "connection refused"))
        );
        assert_eq!(t.dials_in_progress(), 0);
    }

    #[test]
    fn local_close_reports_once() {
        let mut t = AgentTunnel::default();
        let id = dial(&mut t, 1);
        t.dial_succeeded(1, id, 4);
        assert_eq!(t.local_closed(id), Some(packet::close_response(id, "")));
        assert_eq!(t.local_closed(id), None);
        assert!(t.drain_all().is_empty());
    }
}
