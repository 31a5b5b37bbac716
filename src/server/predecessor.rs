//! Dials through the predecessor after a listener handover.
//!
//! ANP's Go agent cannot follow a handover the way our agent does: an
//! HTTP/2 GOAWAY makes it drop its link, and the tunnels on it, within its
//! probe interval, and it links to another server only once its link has
//! ended (its `ClientSet` dials while it holds fewer links than the server
//! count; `pkg/agent/clientset.go` `connectOnce`, `client.go` `probe`,
//! ANP v0.36.0). So the old server keeps a Go agent's link, unannounced,
//! while tunnels on it are open, and closes it the first moment none is
//! (`agent_conn::drive`); the agent then links to the new server at its
//! next sync.
//!
//! Meanwhile the new server has no link to that agent. Rather than fail
//! those dials, it sends them to the old server, which still has the link,
//! as HTTP CONNECT on the old server's forward socket (the path the old
//! one named when it confirmed the handover): to the frontends this looks
//! like one more agent ([`handle`], one per core), which answers "gone"
//! when the old server has no agent for the address either, so that the
//! dial waits for an agent of our own ([`super::ServerState::pick_or_wait`]).
//! The old server takes forwarded dials only while callers of its own are
//! still connected: under a steady load, forwarded dials would otherwise
//! keep the Go agent's link busy, never idle, until the graceful timeout.
//! Once its own callers are gone it answers "gone" too, the link ends with
//! its last forwarded tunnel, and the dials wait here for the agent to
//! link (`--takeover-dial-wait-secs`).
//!
//! Bytes from the old server are charged to a budget per tunnel, so a
//! caller that stops reading holds at most [`BUDGET`] here; bytes toward it
//! queue at most [`QUEUE`] chunks per tunnel before this core's forwarded
//! tunnels wait for that one.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::channel::{mpsc, oneshot};
use futures::{SinkExt, StreamExt};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, Splitable};
use monoio::net::UnixStream;

use super::{AgentCmd, AgentHandle, FrontendEvent, FrontendSink, ServerState};
use engine::budget::Budget;

/// What a forwarded tunnel may hold of the old server's bytes while its
/// caller does not read them.
const BUDGET: usize = 256 * 1024;
/// Chunks toward the old server queued per tunnel.
const QUEUE: usize = 16;
/// Largest answer head read from the old server.
const MAX_HEAD: usize = 8 * 1024;
/// Agent keys this module uses (one per core), far from the registry's.
const KEY_BASE: u64 = u64::MAX - 4096;

/// What the new server knows of its predecessors: the forward sockets the
/// server it took over from named (its own, then those of its own
/// predecessors still draining), newest first, and which were seen gone.
#[derive(Debug, Default)]
pub(crate) struct Predecessor {
    paths: OnceLock<Vec<PathBuf>>,
    /// Per path, when a dial found it gone (no longer answering).
    gone: Mutex<Vec<Option<Instant>>>,
}

impl Predecessor {
    pub(super) fn set_paths(&self, paths: Vec<PathBuf>) {
        *self.gone.lock().expect("predecessor") = vec![None; paths.len()];
        let _ = self.paths.set(paths);
    }

    /// Whether a predecessor may still carry dials.
    pub(super) fn running(&self) -> bool {
        self.gone
            .lock()
            .expect("predecessor")
            .iter()
            .any(Option::is_none)
    }

    /// The forward sockets not seen gone, newest first.
    pub(super) fn running_paths(&self) -> Vec<PathBuf> {
        let Some(paths) = self.paths.get() else {
            return Vec::new();
        };
        let gone = self.gone.lock().expect("predecessor");
        paths
            .iter()
            .zip(gone.iter())
            .filter(|(_, g)| g.is_none())
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Since when every predecessor is gone, if they all were seen gone.
    pub(super) fn gone_since(&self) -> Option<Instant> {
        let gone = self.gone.lock().expect("predecessor");
        if gone.is_empty() || gone.iter().any(Option::is_none) {
            return None;
        }
        gone.iter().flatten().max().copied()
    }

    fn set_gone(&self, i: usize) {
        let mut gone = self.gone.lock().expect("predecessor");
        if let Some(g @ None) = gone.get_mut(i) {
            *g = Some(Instant::now());
            let path = self.paths.get().and_then(|p| p.get(i));
            tracing::info!(path = ?path, "a predecessor is gone: no more dials forwarded to it");
        }
    }

    fn is_gone(&self, i: usize) -> bool {
        self.gone
            .lock()
            .expect("predecessor")
            .get(i)
            .is_none_or(Option::is_some)
    }
}

thread_local! {
    static HANDLE: RefCell<Option<AgentHandle>> = const { RefCell::new(None) };
}

/// Whether `key` is a predecessor's handle.
pub(super) fn is_predecessor(key: u64) -> bool {
    key >= KEY_BASE
}

/// This core's handle to the predecessor, started on first use; `None`
/// when there is none, or it is known to be gone.
pub(super) fn handle(shared: &ServerState, core: usize) -> Option<AgentHandle> {
    if !shared.predecessor.running() {
        return None;
    }
    HANDLE.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(a) = h.as_ref().filter(|a| !a.cmds.is_closed()) {
            return Some(a.clone());
        }
        let (tx, rx) = mpsc::channel(64);
        let a = AgentHandle {
            key: KEY_BASE + core as u64,
            core,
            agent_id: Arc::from("predecessor"),
            half_close: true,
            window: false,
            cmds: tx,
        };
        let ctx = Ctx {
            pred: shared.predecessor.clone(),
            dial_timeout: shared.cfg.dial_timeout,
        };
        monoio::spawn(serve(Rc::new(ctx), rx));
        *h = Some(a.clone());
        Some(a)
    })
}

/// To one forwarded tunnel's writer.
enum Out {
    Data(Bytes),
    HalfClose,
}

#[derive(Default)]
struct Table {
    /// Open tunnels: the writer's queue (dropped: the tunnel closes).
    open: HashMap<i64, mpsc::Sender<Out>>,
    /// Dials not answered yet, by the frontend's `random`.
    pending: HashMap<i64, oneshot::Sender<()>>,
    next_id: i64,
}

/// What a core's forwarding task needs of the server.
struct Ctx {
    pred: Arc<Predecessor>,
    dial_timeout: Duration,
}

async fn serve(ctx: Rc<Ctx>, mut cmds: mpsc::Receiver<AgentCmd>) {
    let table = Rc::new(RefCell::new(Table::default()));
    while let Some(cmd) = cmds.next().await {
        match cmd {
            AgentCmd::Dial {
                random,
                address,
                reply,
            } => {
                let (cancel_tx, cancel_rx) = oneshot::channel();
                let id = {
                    let mut t = table.borrow_mut();
                    t.next_id += 1;
                    t.pending.insert(random, cancel_tx);
                    t.next_id
                };
                monoio::spawn(tunnel(
                    ctx.clone(),
                    table.clone(),
                    Dial {
                        random,
                        id,
                        address,
                        reply,
                        cancel: cancel_rx,
                    },
                ));
            }
            AgentCmd::Data {
                connect_id,
                payload,
            } => {
                let tx = table.borrow().open.get(&connect_id).cloned();
                if let Some(mut tx) = tx {
                    let _ = tx.send(Out::Data(payload)).await;
                }
            }
            AgentCmd::HalfClose { connect_id } => {
                let tx = table.borrow().open.get(&connect_id).cloned();
                if let Some(mut tx) = tx {
                    let _ = tx.send(Out::HalfClose).await;
                }
            }
            AgentCmd::Close { connect_id } => {
                table.borrow_mut().open.remove(&connect_id);
            }
            AgentCmd::CancelDial { random } => {
                if let Some(c) = table.borrow_mut().pending.remove(&random) {
                    let _ = c.send(());
                }
            }
        }
    }
}

struct Dial {
    random: i64,
    id: i64,
    address: String,
    reply: FrontendSink,
    cancel: oneshot::Receiver<()>,
}

/// How the old server answered a forwarded CONNECT.
enum Answer {
    Open(UnixStream, Bytes),
    /// It has no agent for the address either.
    NoAgent,
    /// It reached an agent, which could not dial: the caller's answer.
    Failed(String),
}

async fn tunnel(ctx: Rc<Ctx>, table: Rc<RefCell<Table>>, d: Dial) {
    let Dial {
        random,
        id,
        address,
        reply,
        cancel,
    } = d;
    let answered = monoio::select! {
        a = forward(&ctx, &address) => Some(a),
        _ = cancel => None,
    };
    table.borrow_mut().pending.remove(&random);
    let (stream, early) = match answered {
        None => {
            reply.deliver(FrontendEvent::DialCancelled);
            return;
        }
        Some(Answer::NoAgent) => {
            reply.deliver(FrontendEvent::AgentGone);
            return;
        }
        Some(Answer::Failed(e)) => {
            reply.deliver(FrontendEvent::DialErr(e));
            return;
        }
        Some(Answer::Open(s, early)) => (s, early),
    };
    let (tx, mut rx) = mpsc::channel::<Out>(QUEUE);
    table.borrow_mut().open.insert(id, tx);
    if !reply.deliver(FrontendEvent::DialOk { connect_id: id }) {
        table.borrow_mut().open.remove(&id);
        return;
    }
    let (mut r, mut w) = stream.into_split();
    let budget = Budget::new(BUDGET);
    let down = {
        let reply = reply.clone();
        async move {
            if !early.is_empty() {
                let credit = budget.charge(early).await;
                reply.deliver(FrontendEvent::Data(credit));
            }
            loop {
                let buf = BytesMut::with_capacity(16 * 1024);
                let (res, buf) = r.read(buf).await;
                match res {
                    Ok(0) => return true,
                    Ok(_) => {
                        let credit = budget.charge(buf.freeze()).await;
                        if !reply.deliver(FrontendEvent::Data(credit)) {
                            return false;
                        }
                    }
                    Err(_) => return false,
                }
            }
        }
    };
    // Toward the old server: ends with the caller's half-close (`true`:
    // the other way goes on) or its close (`false`).
    let up = async move {
        while let Some(out) = rx.next().await {
            match out {
                Out::Data(b) => {
                    let (res, _) = w.write_all(b).await;
                    if res.is_err() {
                        return false;
                    }
                }
                Out::HalfClose => {
                    let _ = w.shutdown().await;
                    return true;
                }
            }
        }
        false
    };
    let mut down = std::pin::pin!(down);
    let mut up = std::pin::pin!(up);
    // Both ways finish (then the tunnel closes, as an agent's CLOSE_RSP
    // closes it), or either fails or the caller closes.
    monoio::select! {
        finished = &mut down => {
            if finished {
                reply.deliver(FrontendEvent::Finished);
                up.await;
            }
        }
        half = &mut up => {
            if half && down.await {
                reply.deliver(FrontendEvent::Finished);
            }
        }
    }
    table.borrow_mut().open.remove(&id);
    reply.deliver(FrontendEvent::Closed(String::new()));
}

/// Sends `CONNECT address` to the predecessors' forward sockets, newest
/// first, until one carries it or answers that the dial failed.
async fn forward(ctx: &Ctx, address: &str) -> Answer {
    let Some(paths) = ctx.pred.paths.get() else {
        return Answer::NoAgent;
    };
    for (i, path) in paths.iter().enumerate() {
        if ctx.pred.is_gone(i) {
            continue;
        }
        match forward_to(ctx, i, path, address).await {
            Answer::NoAgent => continue,
            other => return other,
        }
    }
    Answer::NoAgent
}

/// One predecessor's answer to `CONNECT address`.
async fn forward_to(ctx: &Ctx, i: usize, path: &PathBuf, address: &str) -> Answer {
    let mut s = match UnixStream::connect(path).await {
        Ok(s) => s,
        Err(e) => {
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) {
                ctx.pred.set_gone(i);
            }
            tracing::debug!(path = %path.display(), error = %e, "predecessor gone");
            return Answer::NoAgent;
        }
    };
    let head = format!("CONNECT {address} HTTP/1.1\r\nHost: {address}\r\n\r\n");
    if s.write_all(head.into_bytes()).await.0.is_err() {
        return Answer::NoAgent;
    }
    let read = monoio::time::timeout(
        ctx.dial_timeout + Duration::from_secs(1),
        read_answer(&mut s),
    )
    .await;
    match read {
        Ok(Some((200, _, early))) => Answer::Open(s, early),
        Ok(Some((_, body, _))) if body.starts_with(super::connect_frontend::NO_TUNNEL) => {
            Answer::NoAgent
        }
        Ok(Some((status, body, _))) => Answer::Failed(if body.is_empty() {
            format!("the draining server answered {status}")
        } else {
            body
        }),
        Ok(None) | Err(_) => Answer::NoAgent,
    }
}

/// The answer's status, its body (when it has one, up to [`MAX_HEAD`]),
/// and bytes read past the head of a 200.
async fn read_answer(s: &mut UnixStream) -> Option<(u16, String, Bytes)> {
    let mut got: Vec<u8> = Vec::new();
    let end = loop {
        let (res, buf) = s.read(Vec::with_capacity(4096)).await;
        match res {
            Ok(0) | Err(_) => return None,
            Ok(_) => got.extend_from_slice(&buf),
        }
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if got.len() > MAX_HEAD {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&got[..end]).to_string();
    let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
    let rest = Bytes::copy_from_slice(&got[end..]);
    if status == 200 {
        return Some((200, String::new(), rest));
    }
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0)
        .min(MAX_HEAD);
    let mut body = rest.to_vec();
    while body.len() < len {
        let (res, buf) = s.read(Vec::with_capacity(len - body.len())).await;
        match res {
            Ok(0) | Err(_) => break,
            Ok(_) => body.extend_from_slice(&buf),
        }
    }
    body.truncate(len);
    Some((
        status,
        String::from_utf8_lossy(&body).to_string(),
        Bytes::new(),
    ))
}
