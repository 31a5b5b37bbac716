//! Messages between frontends and an agent connection's tasks.

use std::sync::Arc;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::SinkExt;

/// How a frontend reaches an agent connection (cloneable, any core).
#[derive(Clone)]
pub struct AgentHandle {
    pub key: u64,
    pub core: usize,
    pub agent_id: Arc<str>,
    pub half_close: bool,
    pub cmds: mpsc::Sender<AgentCmd>,
}

impl AgentHandle {
    /// Sends a command; `false` if the agent connection is gone.
    pub async fn send(&self, cmd: AgentCmd) -> bool {
        self.cmds.clone().send(cmd).await.is_ok()
    }
}

/// Requests from frontends to an agent connection.
pub enum AgentCmd {
    Dial {
        random: i64,
        address: String,
        reply: FrontendSink,
    },
    Data {
        connect_id: i64,
        payload: Bytes,
    },
    /// The frontend will send no more (TCP half-close).
    HalfClose {
        connect_id: i64,
    },
    Close {
        connect_id: i64,
    },
    CancelDial {
        random: i64,
    },
}

/// Events from an agent connection to one frontend connection.
#[derive(Debug)]
pub enum FrontendEvent {
    DialOk {
        connect_id: i64,
    },
    DialErr(String),
    Data(Bytes),
    /// The agent side finished sending (half-close).
    Finished,
    Closed(String),
}

/// Where an agent connection delivers a frontend connection's events.
/// `token` tells connections apart when several share one channel.
#[derive(Clone)]
pub struct FrontendSink {
    pub tx: mpsc::Sender<(u64, FrontendEvent)>,
    pub token: u64,
}

impl FrontendSink {
    /// Delivers an event, waiting while the frontend's queue is full (this is
    /// the tunnel's backpressure). `false` if the frontend is gone.
    pub async fn deliver(&mut self, ev: FrontendEvent) -> bool {
        self.tx.send((self.token, ev)).await.is_ok()
    }

    /// Delivers without waiting (teardown paths); drops the event if full.
    pub fn try_deliver(&mut self, ev: FrontendEvent) {
        let _ = self.tx.try_send((self.token, ev));
    }
}
