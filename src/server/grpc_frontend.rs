//! The gRPC `ProxyService/Proxy` frontend (konnectivity-client): each HTTP/2
//! stream carries DIAL_REQ/DATA/CLOSE_REQ/DIAL_CLS from the client; the
//! server answers DIAL_RSP/DATA/CLOSE_RSP. The client's `random` is kept on
//! this side; agents see a fresh server-chosen one, so clients cannot collide.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::StreamExt;
use monoio::io::IntoPollIo;

use super::connect_frontend::{NO_TUNNEL, ROUTE_ATTEMPTS};
use super::session::{AgentCmd, AgentHandle, FrontendEvent, FrontendSink};
use super::Shared;
use crate::engine::grpc::{self, code, PacketReceiver, PacketSender, SendBuf};
use crate::engine::window::{self, ConnWindow};
use crate::metrics::DialResult;
use crate::protocol::packet::{self, Frame};
use crate::protocol::PROXY_PATH;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(super) async fn accept_tcp(shared: Arc<Shared>, l: monoio::net::TcpListener) {
    loop {
        match l.accept().await {
            Ok((s, peer)) => {
                crate::engine::listener::nodelay(&s);
                let shared = shared.clone();
                monoio::spawn(async move {
                    match s.into_poll_io() {
                        Ok(io) => serve_conn(shared, io, peer.to_string()).await,
                        Err(e) => tracing::warn!(error = %e, "poll-io conversion failed"),
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "gRPC frontend accept failed");
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

pub(super) async fn accept_unix(shared: Arc<Shared>, l: monoio::net::UnixListener) {
    loop {
        match l.accept().await {
            Ok((s, _)) => {
                let shared = shared.clone();
                monoio::spawn(async move {
                    match s.into_poll_io() {
                        Ok(io) => serve_conn(shared, io, "unix".to_string()).await,
                        Err(e) => tracing::warn!(error = %e, "poll-io conversion failed"),
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "gRPC frontend accept failed");
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_conn<T>(shared: Arc<Shared>, io: T, peer: String)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let conn = h2::server::Builder::new()
        .initial_window_size(4 * 1024 * 1024)
        .initial_connection_window_size(grpc::CONNECTION_WINDOW)
        .max_frame_size(grpc::MAX_FRAME)
        .max_send_buffer_size(grpc::MAX_SEND_BUFFER)
        .handshake::<_, SendBuf>(crate::engine::h2_server_io::wrap(io))
        .await;
    let mut conn = match conn {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(%peer, error = %e, "gRPC frontend handshake failed");
            return;
        }
    };
    while let Some(next) = conn.accept().await {
        let (req, mut respond) = match next {
            Ok(r) => r,
            Err(e) => {
                tracing::info!(%peer, error = %e, "gRPC frontend connection failed");
                return;
            }
        };
        if req.uri().path() != PROXY_PATH || !grpc::is_grpc(req.headers()) {
            let msg = format!("unknown method {}", req.uri().path());
            let _ = respond.send_response(grpc::error_head(code::UNIMPLEMENTED, &msg), true);
            continue;
        }
        let send = match respond.send_response(grpc::response_head(&[]), false) {
            Ok(s) => s,
            Err(_) => continue,
        };
        let rx = PacketReceiver::new(req.into_body(), shared.cfg.max_message);
        let shared = shared.clone();
        monoio::spawn(async move {
            let mut tx = PacketSender::new(send);
            match proxy_stream(&shared, rx, &mut tx).await {
                Ok(()) => {
                    let _ = tx.finish_with_status(code::OK, "");
                }
                Err(e) => {
                    tracing::info!(error = %e, "proxy stream ended with error");
                    let _ = tx.finish_with_status(code::INVALID_ARGUMENT, &e.to_string());
                }
            }
        });
    }
}

struct Conn {
    agent: AgentHandle,
    /// The dial's address, kept to route it again if the agent goes away
    /// before answering.
    address: String,
    attempts: u8,
    client_random: i64,
    agent_random: i64,
    connect_id: Option<i64>,
    started: Instant,
    /// Flow-control window, used when the agent negotiated it.
    window: Arc<ConnWindow>,
}

/// Picks an agent for `address` (not `gone`, whose connection just ended)
/// and sends it the dial; tries again while sends find the agent gone.
async fn dial_agent(
    shared: &Shared,
    address: &str,
    random: i64,
    reply: FrontendSink,
    mut gone: Option<u64>,
) -> Option<AgentHandle> {
    for _ in 0..ROUTE_ATTEMPTS {
        let agent = match gone {
            Some(key) => shared.repick(address, key).await?,
            None => shared.pick(address)?,
        };
        let cmd = AgentCmd::Dial {
            random,
            address: address.to_string(),
            reply: reply.clone(),
        };
        if agent.send(cmd).await {
            return Some(agent);
        }
        gone = Some(agent.key);
    }
    None
}

/// One Proxy stream: any number of dials, each to its own agent.
async fn proxy_stream(
    shared: &Shared,
    mut rx: PacketReceiver,
    tx: &mut PacketSender,
) -> Result<(), BoxError> {
    let (ev_tx, mut events) = mpsc::unbounded::<(u64, FrontendEvent)>();
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut by_id: HashMap<i64, u64> = HashMap::new();
    let mut next_token = 0u64;
    let result = loop {
        let next = futures::select_biased! {
            ev = events.next() => Err(ev),
            p = rx.next().fuse_pinned() => Ok(p),
        };
        match next {
            Err(None) => break Ok(()),
            Err(Some((token, ev))) => {
                let Some(c) = conns.get_mut(&token) else {
                    continue;
                };
                match ev {
                    FrontendEvent::DialOk { connect_id } => {
                        if by_id.contains_key(&connect_id) {
                            // Another agent used this connectID on this stream.
                            c.agent.send(AgentCmd::Close { connect_id }).await;
                            let random = c.client_random;
                            conns.remove(&token);
                            tx.send_frame(packet::dial_response(
                                random,
                                0,
                                "connectID collision on this stream",
                            ))
                            .await?;
                            continue;
                        }
                        c.connect_id = Some(connect_id);
                        by_id.insert(connect_id, token);
                        tx.send_frame(packet::dial_response(c.client_random, connect_id, ""))
                            .await?;
                    }
                    FrontendEvent::DialErr(e) => {
                        let random = c.client_random;
                        conns.remove(&token);
                        tx.send_frame(packet::dial_response(random, 0, e)).await?;
                    }
                    FrontendEvent::Data(b) => {
                        if let Some(id) = c.connect_id {
                            tx.send(packet::encode_data(id, b.bytes().clone())).await?;
                        }
                    }
                    FrontendEvent::Finished => {}
                    FrontendEvent::AgentGone
                        if c.connect_id.is_none() && c.attempts < ROUTE_ATTEMPTS =>
                    {
                        // Never reached the target: route the dial again.
                        let sink = FrontendSink {
                            tx: ev_tx.clone(),
                            token,
                            window: Some(c.window.clone()),
                        };
                        let gone = c.agent.key;
                        match dial_agent(shared, &c.address, c.agent_random, sink, Some(gone)).await
                        {
                            Some(agent) => {
                                c.agent = agent;
                                c.attempts += 1;
                            }
                            None => {
                                let random = c.client_random;
                                conns.remove(&token);
                                shared
                                    .metrics
                                    .dial_done(DialResult::NoAgent, Duration::ZERO);
                                tx.send_frame(packet::dial_response(random, 0, NO_TUNNEL))
                                    .await?;
                            }
                        }
                    }
                    FrontendEvent::AgentGone => {
                        let c = conns.remove(&token).expect("present");
                        if let Some(id) = c.connect_id {
                            by_id.remove(&id);
                            tx.send_frame(packet::close_response(id, "agent disconnected"))
                                .await?;
                        } else {
                            tx.send_frame(packet::dial_response(
                                c.client_random,
                                0,
                                "agent disconnected",
                            ))
                            .await?;
                        }
                    }
                    FrontendEvent::Closed(e) => {
                        let c = conns.remove(&token).expect("present");
                        match c.connect_id {
                            Some(id) => {
                                by_id.remove(&id);
                                tx.send_frame(packet::close_response(id, e)).await?;
                            }
                            None => {
                                tx.send_frame(packet::dial_response(c.client_random, 0, e))
                                    .await?;
                            }
                        }
                    }
                }
            }
            Ok(Err(e)) => break Err(e.into()),
            Ok(Ok(None)) => break Ok(()),
            Ok(Ok(Some(frame))) => match frame {
                Frame::DialRequest(req) => {
                    next_token += 1;
                    let agent_random = loop {
                        let r = fastrand::i64(..);
                        if r != 0 {
                            break r;
                        }
                    };
                    let window = ConnWindow::new(window::CONNECTION_WINDOW);
                    let sink = FrontendSink {
                        tx: ev_tx.clone(),
                        token: next_token,
                        window: Some(window.clone()),
                    };
                    let Some(agent) =
                        dial_agent(shared, &req.address, agent_random, sink, None).await
                    else {
                        shared
                            .metrics
                            .dial_done(DialResult::NoAgent, Duration::ZERO);
                        tx.send_frame(packet::dial_response(req.random, 0, NO_TUNNEL))
                            .await?;
                        continue;
                    };
                    conns.insert(
                        next_token,
                        Conn {
                            agent,
                            address: req.address,
                            attempts: 1,
                            client_random: req.random,
                            agent_random,
                            connect_id: None,
                            started: Instant::now(),
                            window,
                        },
                    );
                }
                Frame::Data(d) => {
                    if let Some(c) = by_id.get(&d.connect_id).and_then(|t| conns.get(t)) {
                        if c.agent.window {
                            // Past the window this stream waits: the client
                            // multiplexes on it, the agent's other
                            // connections do not.
                            c.window.ready().await;
                            c.window.sent(d.data.len());
                        }
                        c.agent
                            .send(AgentCmd::Data {
                                connect_id: d.connect_id,
                                payload: d.data,
                            })
                            .await;
                    } else {
                        tx.send_frame(packet::close_response(
                            d.connect_id,
                            "unrecognized connectID",
                        ))
                        .await?;
                    }
                }
                Frame::CloseRequest(c) => {
                    let Some(token) = by_id.remove(&c.connect_id) else {
                        tx.send_frame(packet::close_response(c.connect_id, "Unknown connectID"))
                            .await?;
                        continue;
                    };
                    if let Some(conn) = conns.remove(&token) {
                        conn.agent
                            .send(AgentCmd::Close {
                                connect_id: c.connect_id,
                            })
                            .await;
                    }
                    tx.send_frame(packet::close_response(c.connect_id, ""))
                        .await?;
                }
                Frame::DialClose(c) => {
                    let token = conns
                        .iter()
                        .find(|(_, v)| v.client_random == c.random && v.connect_id.is_none())
                        .map(|(t, _)| *t);
                    if let Some(token) = token {
                        let conn = conns.remove(&token).expect("present");
                        shared
                            .metrics
                            .dial_done(DialResult::Timeout, conn.started.elapsed());
                        conn.agent
                            .send(AgentCmd::CancelDial {
                                random: conn.agent_random,
                            })
                            .await;
                    }
                }
                other => {
                    tracing::debug!(packet = other.name(), "ignored packet from proxy client");
                }
            },
        }
    };
    // The stream is over: release every connection it held.
    for (_, c) in conns.drain() {
        match c.connect_id {
            Some(id) => c.agent.send(AgentCmd::Close { connect_id: id }).await,
            None => {
                c.agent
                    .send(AgentCmd::CancelDial {
                        random: c.agent_random,
                    })
                    .await
            }
        };
    }
    result
}

/// `select_biased!` wants fused futures; ours are polled afresh each turn.
trait FusePinned: std::future::Future + Sized {
    fn fuse_pinned(self) -> futures::future::Fuse<std::pin::Pin<Box<Self>>> {
        futures::FutureExt::fuse(Box::pin(self))
    }
}
impl<F: std::future::Future> FusePinned for F {}
