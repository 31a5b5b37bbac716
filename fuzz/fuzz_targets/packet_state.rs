//! ServerTunnel and AgentTunnel driven by a gRPC-framed packet stream, each
//! checked against a small model of what it must track.
//!
//! Input: gRPC messages (`0 | len:u32be | body`). A message's first body byte
//! picks an operation (`op = b % 12`, `arg = b / 12`: a small random or
//! connectID, so they collide); the rest is an ANP Packet for the operations
//! that deliver one. Packets the tunnels emit are queued for the other side
//! and delivered by ops 10 and 11, so the two also talk to each other.
#![no_main]

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use edgetunnel_protocol::anp::agent_tunnel::{AgentAction, AgentTunnel, DialOutcome};
use edgetunnel_protocol::anp::grpc_frame::{FrameDecoder, HEADER_LEN};
use edgetunnel_protocol::anp::packet::{self, Frame};
use edgetunnel_protocol::anp::server_tunnel::{ServerAction, ServerTunnel};
use libfuzzer_sys::fuzz_target;

/// encode -> FrameDecoder -> decode gives the frame back.
fn roundtrip(f: &Frame) {
    let enc = packet::encode(f.clone());
    let wire = enc.to_vec();
    let body_len = u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize;
    assert_eq!(wire[0], 0);
    assert_eq!(body_len + HEADER_LEN, wire.len());
    let mut d = FrameDecoder::new(usize::MAX);
    d.push(enc.head);
    d.push(enc.payload);
    let m = d.next_message().unwrap().unwrap();
    assert_eq!(
        &packet::decode(m).unwrap(),
        f,
        "re-encoding changed the frame"
    );
    d.finish().unwrap();
}

#[derive(Default)]
struct ServerModel {
    /// random -> frontend
    pending: HashMap<i64, u32>,
    /// connectID -> frontend
    open: HashMap<i64, u32>,
    next_frontend: u32,
}

#[derive(Default)]
struct AgentModel {
    /// random -> connectID
    dialing: HashMap<i64, i64>,
    /// connectID -> conn
    open: HashMap<i64, u32>,
    /// Every connectID handed out (random -> connectID), for dial_succeeded.
    assigned: HashMap<i64, i64>,
    max_id: i64,
    next_conn: u32,
}

struct Sim {
    server: ServerTunnel<u32>,
    agent: AgentTunnel<u32>,
    sm: ServerModel,
    am: AgentModel,
    to_agent: VecDeque<Frame>,
    to_server: VecDeque<Frame>,
}

impl Sim {
    fn send_to_agent(&mut self, f: Frame) {
        roundtrip(&f);
        if self.to_agent.len() < 64 {
            self.to_agent.push_back(f);
        }
    }

    fn send_to_server(&mut self, f: Frame) {
        roundtrip(&f);
        if self.to_server.len() < 64 {
            self.to_server.push_back(f);
        }
    }

    fn server_frame(&mut self, f: Frame) {
        let before = f.clone();
        match self.server.on_agent_frame(f) {
            ServerAction::DialSucceeded {
                frontend,
                connect_id,
            } => {
                let Frame::DialResponse(r) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(self.sm.pending.remove(&r.random), Some(frontend));
                assert_eq!(connect_id, r.connect_id);
                assert!(connect_id != 0 && r.error.is_empty());
                assert!(self.sm.open.insert(connect_id, frontend).is_none());
            }
            ServerAction::DialFailed { frontend, .. } => {
                let random = match &before {
                    Frame::DialResponse(r) => r.random,
                    Frame::DialClose(c) => c.random,
                    other => panic!("DialFailed for {other:?}"),
                };
                assert_eq!(self.sm.pending.remove(&random), Some(frontend));
            }
            ServerAction::Data {
                frontend,
                connect_id,
                payload,
            } => {
                let Frame::Data(d) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(connect_id, d.connect_id);
                assert_eq!(self.sm.open.get(&d.connect_id), Some(&frontend));
                assert_eq!(payload, d.data);
            }
            ServerAction::PeerFinished { frontend } => {
                let Frame::Data(d) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(self.sm.open.get(&d.connect_id), Some(&frontend));
            }
            ServerAction::Window { frontend, bytes } => {
                let Frame::Data(d) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(self.sm.open.get(&d.connect_id), Some(&frontend));
                assert_eq!(packet::window_grant(d), Some(bytes));
            }
            ServerAction::Closed { frontend, .. } => {
                let Frame::CloseResponse(c) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(self.sm.open.remove(&c.connect_id), Some(frontend));
            }
            ServerAction::Drain => assert_eq!(before, Frame::Drain),
            ServerAction::Reply(reply) => {
                assert!(matches!(reply, Frame::CloseRequest(_)), "{reply:?}");
                self.send_to_agent(reply);
            }
            ServerAction::Ignored(_) => {}
        }
    }

    fn agent_frame(&mut self, f: Frame) {
        let before = f.clone();
        match self.agent.on_server_frame(f) {
            AgentAction::Dial {
                random,
                connect_id,
                address,
                ..
            } => {
                let Frame::DialRequest(r) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!((random, address.as_str()), (r.random, r.address.as_str()));
                assert!(connect_id > self.am.max_id, "connectID {connect_id} reused");
                self.am.max_id = connect_id;
                assert!(self.am.dialing.insert(random, connect_id).is_none());
                self.am.assigned.insert(random, connect_id);
            }
            AgentAction::Write { conn, payload } => {
                let Frame::Data(d) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(self.am.open.get(&d.connect_id), Some(&conn));
                assert_eq!(payload, d.data);
            }
            AgentAction::ShutdownWrite { conn } => {
                let Frame::Data(d) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(self.am.open.get(&d.connect_id), Some(&conn));
            }
            AgentAction::Window { conn, bytes } => {
                let Frame::Data(d) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(self.am.open.get(&d.connect_id), Some(&conn));
                assert_eq!(packet::window_grant(d), Some(bytes));
            }
            AgentAction::Close { conn, reply } => {
                let Frame::CloseRequest(c) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(self.am.open.remove(&c.connect_id), Some(conn));
                self.send_to_server(reply);
            }
            AgentAction::Reply(reply) => {
                let id = match &before {
                    Frame::Data(d) => d.connect_id,
                    Frame::CloseRequest(c) => c.connect_id,
                    other => panic!("Reply to {other:?}"),
                };
                assert!(!self.am.open.contains_key(&id));
                self.send_to_server(reply);
            }
            AgentAction::CancelDial { connect_id } => {
                let Frame::DialClose(c) = &before else {
                    panic!("{before:?}")
                };
                assert_eq!(self.am.dialing.remove(&c.random), Some(connect_id));
            }
            AgentAction::ServerDraining => assert_eq!(before, Frame::Drain),
            AgentAction::Ignored(_) => {}
        }
    }

    fn check(&self) {
        assert_eq!(self.server.pending_dials(), self.sm.pending.len());
        assert_eq!(self.server.open_connections(), self.sm.open.len());
        for id in self.sm.open.keys() {
            assert!(self.server.is_open(*id));
        }
        assert_eq!(self.agent.dials_in_progress(), self.am.dialing.len());
        assert_eq!(self.agent.open_connections(), self.am.open.len());
    }

    fn step(&mut self, op: u8, arg: i64, frame: Option<Frame>) {
        match op {
            0 => {
                if let Some(f) = frame {
                    self.server_frame(f)
                }
            }
            1 => {
                if let Some(f) = frame {
                    self.agent_frame(f)
                }
            }
            2 => {
                let frontend = self.sm.next_frontend;
                self.sm.next_frontend += 1;
                let address = match &frame {
                    Some(Frame::DialRequest(r)) => r.address.clone(),
                    _ => "node:10250".to_string(),
                };
                match self.server.begin_dial(arg, &address, frontend) {
                    Ok(req) => {
                        assert!(self.sm.pending.insert(arg, frontend).is_none());
                        assert_eq!(req, packet::dial_request("tcp", &address, arg));
                        self.send_to_agent(req);
                    }
                    Err(e) => {
                        assert_eq!(e.0, arg);
                        assert!(self.sm.pending.contains_key(&arg));
                    }
                }
            }
            3 => {
                let got = self.server.cancel_dial(arg);
                assert_eq!(got.is_some(), self.sm.pending.remove(&arg).is_some());
                if let Some((f, _)) = got {
                    self.send_to_agent(f);
                }
            }
            4 => {
                let got = self.server.close(arg);
                assert_eq!(got.is_some(), self.sm.open.remove(&arg).is_some());
                assert!(!self.server.is_open(arg));
                if let Some(f) = got {
                    self.send_to_agent(f);
                }
            }
            5 => {
                let connect_id = self.am.assigned.get(&arg).copied().unwrap_or(arg);
                let conn = self.am.next_conn;
                self.am.next_conn += 1;
                match self.agent.dial_succeeded(arg, connect_id, conn) {
                    DialOutcome::Respond(rsp) => {
                        assert_eq!(self.am.dialing.remove(&arg), Some(connect_id));
                        self.am.open.insert(connect_id, conn);
                        self.send_to_server(rsp);
                    }
                    DialOutcome::Cancelled => assert!(!self.am.dialing.contains_key(&arg)),
                }
            }
            6 => {
                let got = self.agent.dial_failed(arg, "connection refused");
                assert_eq!(got.is_some(), self.am.dialing.remove(&arg).is_some());
                if let Some(f) = got {
                    self.send_to_server(f);
                }
            }
            7 => {
                let connect_id = self.am.assigned.get(&arg).copied().unwrap_or(arg);
                let got = self.agent.local_closed(connect_id);
                assert_eq!(got.is_some(), self.am.open.remove(&connect_id).is_some());
                if let Some(f) = got {
                    self.send_to_server(f);
                }
            }
            8 => {
                let mut fs = self.server.drain_all();
                let mut want: Vec<u32> = self
                    .sm
                    .pending
                    .drain()
                    .chain(self.sm.open.drain())
                    .map(|(_, f)| f)
                    .collect();
                fs.sort_unstable();
                want.sort_unstable();
                assert_eq!(fs, want);
            }
            9 => {
                let mut cs = self.agent.drain_all();
                let mut want: Vec<u32> = self.am.open.drain().map(|(_, c)| c).collect();
                self.am.dialing.clear();
                cs.sort_unstable();
                want.sort_unstable();
                assert_eq!(cs, want);
            }
            10 => {
                if let Some(f) = self.to_agent.pop_front() {
                    self.agent_frame(f)
                }
            }
            _ => {
                if let Some(f) = self.to_server.pop_front() {
                    self.server_frame(f)
                }
            }
        }
        self.check();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut sim = Sim {
        server: ServerTunnel::default(),
        agent: AgentTunnel::default(),
        sm: ServerModel::default(),
        am: AgentModel::default(),
        to_agent: VecDeque::new(),
        to_server: VecDeque::new(),
    };
    let mut d = FrameDecoder::new(64 * 1024);
    d.push(Bytes::copy_from_slice(data));
    while let Ok(Some(m)) = d.next_message() {
        let Some(&b) = m.first() else { continue };
        let frame = packet::decode(m.slice(1..)).ok();
        if let Some(f) = &frame {
            roundtrip(f);
        }
        sim.step(b % 12, i64::from(b / 12), frame);
    }
});
