//! The gRPC frontend's per-stream state machine driven by arbitrary client
//! packets and agent events against a model of the agents: it never panics,
//! and once the stream is finished and every agent has had its last word,
//! no agent holds a connection or a dial for this stream.
#![no_main]

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use bytes::Bytes;
use edgetunnel_protocol::anp::packet::{self, Frame};
use edgetunnel_protocol::anp::proxy_service_stream::{AgentEvent, ProxyStream, StreamAction, Token};
use libfuzzer_sys::fuzz_target;

/// What the agents hold for this stream.
#[derive(Default)]
struct Agents {
    /// Dials sent and not answered: token -> (agent, agent's random).
    pending: HashMap<Token, (u8, i64)>,
    /// Connections opened: (agent, connectID) -> token.
    open: HashMap<(u8, i64), Token>,
    /// Every connection ever opened (data may cross an agent's close).
    ever_open: HashSet<(u8, i64)>,
    /// Events on their way to the stream.
    queued: Vec<(Token, AgentEvent<u32>)>,
    next_id: i64,
}

fuzz_target!(|data: &[u8]| {
    let mut s: ProxyStream<u8, u32> = ProxyStream::new(1);
    let mut agents = Agents {
        next_id: 1,
        ..Default::default()
    };
    let mut open_for_client: HashSet<i64> = HashSet::new();
    let now = Instant::now();
    let mut it = data.chunks(3);
    let mut finished = false;
    while let Some(op) = it.next() {
        let (a, b, c) = (op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0));
        match a % 10 {
            0 => s.on_client_frame(packet::dial_request("tcp", "n:1", (b % 4) as i64), now),
            1 => s.on_client_frame(packet::data(b as i64 % 8, Bytes::from_static(b"x")), now),
            2 => s.on_client_frame(packet::close_request(b as i64 % 8), now),
            3 => s.on_client_frame(packet::dial_close((b % 4) as i64), now),
            4 => {
                // The agent answers a pending dial.
                if let Some((&t, &(agent, _))) = agents
                    .pending
                    .iter()
                    .nth(b as usize % agents.pending.len().max(1))
                {
                    agents.pending.remove(&t);
                    let ev = match c % 3 {
                        0 => AgentEvent::DialErr("refused".into()),
                        1 => AgentEvent::AgentGone,
                        _ => {
                            // Sometimes reuse an ID another agent chose.
                            let id = if c % 7 == 0 { 1 } else { agents.next_id };
                            agents.next_id += 1;
                            if agents.open.contains_key(&(agent, id)) {
                                AgentEvent::DialErr("in use".into())
                            } else {
                                agents.open.insert((agent, id), t);
                                agents.ever_open.insert((agent, id));
                                AgentEvent::DialOk { connect_id: id }
                            }
                        }
                    };
                    agents.queued.push((t, ev));
                }
            }
            5 => {
                // The agent sends data, finishes, closes or goes away.
                if let Some((&(agent, id), &t)) = agents
                    .open
                    .iter()
                    .nth(b as usize % agents.open.len().max(1))
                {
                    let ev = match c % 4 {
                        0 => AgentEvent::Data(c as u32),
                        1 => AgentEvent::Finished,
                        2 => {
                            agents.open.remove(&(agent, id));
                            AgentEvent::Closed(String::new())
                        }
                        _ => {
                            agents.open.remove(&(agent, id));
                            AgentEvent::AgentGone
                        }
                    };
                    agents.queued.push((t, ev));
                }
            }
            6 => {
                // Deliver queued events (in order).
                for (t, ev) in std::mem::take(&mut agents.queued) {
                    s.on_agent_event(t, ev);
                }
            }
            7 => {
                if let Ok(f) = packet::decode(Bytes::copy_from_slice(&op[1..])) {
                    s.on_client_frame(f, now);
                }
            }
            8 => {
                // The stream ends; nothing more comes from the client.
                s.finish();
                finished = true;
            }
            _ => {}
        }
        run_actions(&mut s, &mut agents, &mut open_for_client, b);
        if finished {
            break;
        }
    }
    if !finished {
        s.finish();
        run_actions(&mut s, &mut agents, &mut open_for_client, 0);
    }
    // Let every agent have its last word, dials included.
    for _ in 0..8 {
        for (t, (agent, _)) in std::mem::take(&mut agents.pending) {
            let id = agents.next_id;
            agents.next_id += 1;
            agents.open.insert((agent, id), t);
            agents
                .queued
                .push((t, AgentEvent::DialOk { connect_id: id }));
        }
        for (t, ev) in std::mem::take(&mut agents.queued) {
            s.on_agent_event(t, ev);
        }
        run_actions(&mut s, &mut agents, &mut open_for_client, 0);
    }
    assert_eq!(s.open_connections(), 0);
    assert_eq!(s.pending_dials(), 0);
    assert!(
        agents.open.is_empty(),
        "leaked at the agents: {:?}",
        agents.open
    );
});

fn run_actions(
    s: &mut ProxyStream<u8, u32>,
    agents: &mut Agents,
    open_for_client: &mut HashSet<i64>,
    choice: u8,
) {
    while let Some(a) = s.poll_action() {
        match a {
            StreamAction::Dial {
                token,
                agent_random,
                ..
            } => {
                if choice % 5 == 4 {
                    s.no_agent(token);
                } else {
                    let agent = choice % 3;
                    agents.pending.insert(token, (agent, agent_random));
                    s.dial_sent(token, agent, agent_random);
                }
            }
            StreamAction::ToClient(Frame::DialResponse(d)) if d.error.is_empty() => {
                assert!(
                    open_for_client.insert(d.connect_id),
                    "connectID given twice"
                );
            }
            StreamAction::ToClient(Frame::CloseResponse(c)) => {
                open_for_client.remove(&c.connect_id);
            }
            StreamAction::ToClientData { connect_id, .. } => {
                assert!(
                    open_for_client.contains(&connect_id),
                    "data for a closed connection"
                );
            }
            StreamAction::ToAgentData {
                agent, connect_id, ..
            } => {
                assert!(
                    agents.ever_open.contains(&(agent, connect_id)),
                    "data to a connection this agent never opened"
                );
            }
            StreamAction::CloseAtAgent { agent, connect_id } => {
                agents.open.remove(&(agent, connect_id));
            }
            StreamAction::CancelAtAgent {
                agent,
                agent_random,
            } => {
                // The agent drops the dial if it is still pending there.
                let t = agents
                    .pending
                    .iter()
                    .find(|(_, p)| **p == (agent, agent_random))
                    .map(|(t, _)| *t);
                if let Some(t) = t {
                    agents.pending.remove(&t);
                    agents.queued.push((t, AgentEvent::DialCancelled));
                }
            }
            _ => {}
        }
    }
}
