//! Messages between frontends and an agent connection's tasks.

use std::sync::Arc;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::SinkExt;

use engine::budget::Credit;
use engine::window::ConnWindow;

/// How a frontend reaches an agent connection (cloneable, any core).
#[derive(Clone)]
pub struct AgentHandle {
    pub key: u64,
    pub core: usize,
    pub agent_id: Arc<str>,
    pub half_close: bool,
    /// The agent speaks the per-connection window extension.
    pub window: bool,
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
    Data(Credit),
    /// The agent side finished sending (half-close).
    Finished,
    Closed(String),
    /// The agent connection ended. Before the dial was answered this means
    /// the target was never reached through it, so the frontend may route
    /// the dial to another agent.
    AgentGone,
    /// A pending dial the frontend cancelled was dropped: nothing more will
    /// come for it.
    DialCancelled,
}

/// Where an agent connection delivers a frontend connection's events.
/// `token` tells connections apart when several share one channel.
#[derive(Clone)]
pub struct FrontendSink {
    pub tx: mpsc::UnboundedSender<(u64, FrontendEvent)>,
    pub token: u64,
    /// The connection's flow-control window, when the agent negotiated it.
    pub window: Option<Arc<ConnWindow>>,
}

impl FrontendSink {
    /// Delivers an event; `false` if the frontend is gone. The queue is
    /// unbounded in count; payload is bounded by the agent connection's
    /// [`engine::budget::Budget`], charged before delivery.
    pub fn deliver(&self, ev: FrontendEvent) -> bool {
        self.tx.unbounded_send((self.token, ev)).is_ok()
    }
}
