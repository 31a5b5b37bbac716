//! Bad input from agents: a hand-driven agent (real TLS, real HTTP/2) sends
//! malformed frames, oversized and compressed messages, unknown connectIDs
//! and wrong-direction packets, while a well-behaved agent keeps a tunneled
//! connection busy. Each bad stream is answered or closed; the good one
//! never stalls.

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use engine::grpc::{self, PacketReceiver, SendBuf};
use engine::runtime::{block_on, Driver};
use engine::tls::{client_config, TlsFiles};
use monoio::io::IntoPollIo;
use protocol::anp::grpc_frame;
use protocol::anp::packet::{self, Frame};
use support::*;

/// What a raw agent saw after sending its bytes.
#[derive(Debug)]
struct Outcome {
    frames: Vec<Frame>,
    /// Why the stream ended, or None if it was still open after `watch`.
    ended: Option<String>,
}

fn raw_agent(
    server: SocketAddr,
    certs: &Path,
    id: &str,
    sends: Vec<Vec<u8>>,
    watch: Duration,
) -> Outcome {
    let certs = certs.to_path_buf();
    let id = id.to_string();
    thread::spawn(move || {
        block_on(Driver::Auto, async move {
            let files = TlsFiles {
                cert: certs.join("agent.crt"),
                key: certs.join("agent.key"),
                ca: certs.join("ca.crt"),
            };
            let tls = client_config(&files).unwrap().0;
            let tcp = monoio::net::TcpStream::connect(server).await.unwrap();
            let io = tcp.into_poll_io().unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let tls = tokio_rustls::TlsConnector::from(tls)
                .connect(name, io)
                .await
                .unwrap();
            let (client, conn) = h2::client::Builder::new()
                .handshake::<_, SendBuf>(tls)
                .await
                .unwrap();
            monoio::spawn(async move {
                let _ = conn.await;
            });
            let mut client = client.ready().await.unwrap();
            let req = grpc::request_head(
                &server.to_string(),
                "/AgentService/Connect",
                &[
                    ("agentid", id.clone()),
                    ("agentidentifiers", format!("host={id}")),
                ],
            )
            .unwrap();
            let (resp, mut send) = client.send_request(req, false).unwrap();
            let resp = resp.await.unwrap();
            assert_eq!(resp.status(), 200);
            for chunk in sends {
                send.send_data(grpc::chain(Bytes::from(chunk), Bytes::new()), false)
                    .unwrap();
            }
            let mut rx = PacketReceiver::new(resp.into_body(), 1 << 20);
            let mut frames = Vec::new();
            let deadline = monoio::time::Instant::now() + watch;
            let ended = loop {
                let left = deadline.saturating_duration_since(monoio::time::Instant::now());
                match monoio::time::timeout(left, rx.next()).await {
                    Err(_) => break None,
                    Ok(Ok(Some(f))) => frames.push(f),
                    Ok(Ok(None)) => break Some("ended cleanly".to_string()),
                    Ok(Err(e)) => break Some(e.to_string()),
                }
            };
            drop(send);
            Outcome { frames, ended }
        })
        .unwrap()
    })
    .join()
    .unwrap()
}

fn framed(frame: Frame) -> Vec<u8> {
    packet::encode(frame).to_vec()
}

fn raw_message(body: &[u8]) -> Vec<u8> {
    let mut v = grpc_frame::header(body.len()).to_vec();
    v.extend_from_slice(body);
    v
}

#[test]
fn misbehaving_agents_are_answered_or_closed_and_others_keep_flowing() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let _good = Agent::start(
        &env,
        server.agent,
        "good",
        "host=localhost&ipv4=127.0.0.1",
        &[],
    );
    let echo = echo_server("127.0.0.1");

    // A busy tunneled connection through the good agent for the whole test.
    let busy = busy_tunnel(server.connect, echo.addr.to_string(), 48 << 20, 5);

    let certs = env.certs();
    let watch = Duration::from_millis(700);

    // DATA for a connection that was never dialed (also: DATA before any
    // DIAL_RSP): the server asks the agent to close it, nothing else.
    let o = raw_agent(
        server.agent,
        &certs,
        "bad-data",
        vec![framed(packet::data(4242, Bytes::from_static(b"x")))],
        watch,
    );
    assert_eq!(o.frames, vec![packet::close_request(4242)], "{o:?}");
    assert!(o.ended.is_none(), "{o:?}");

    // A DIAL_RSP nobody asked for, with a connectID: closed right away.
    let o = raw_agent(
        server.agent,
        &certs,
        "bad-rsp",
        vec![framed(packet::dial_response(99, 77, ""))],
        watch,
    );
    assert_eq!(o.frames, vec![packet::close_request(77)], "{o:?}");

    // Wrong-direction and unknown-id packets are ignored; the stream stays up.
    let o = raw_agent(
        server.agent,
        &certs,
        "bad-dir",
        vec![
            framed(packet::dial_request("tcp", "127.0.0.1:1", 5)),
            framed(packet::close_request(3)),
            framed(packet::close_response(8, "")),
            framed(packet::dial_close(12)),
        ],
        watch,
    );
    assert!(o.frames.is_empty() && o.ended.is_none(), "{o:?}");

    // An unknown packet type (a newer peer) is skipped, not fatal.
    let o = raw_agent(
        server.agent,
        &certs,
        "new-type",
        vec![raw_message(&[0x08, 0x63])],
        watch,
    );
    assert!(o.ended.is_none(), "{o:?}");

    let errors_before = server.metric("edgetunnel_agent_protocol_errors_total");
    // Undecodable protobuf inside a valid gRPC frame.
    let o = raw_agent(
        server.agent,
        &certs,
        "bad-proto",
        vec![raw_message(&[0xff, 0xff, 0xff, 0xff])],
        watch,
    );
    assert!(o.ended.is_some(), "{o:?}");
    // A DATA packet whose type and payload disagree.
    let mismatched = {
        use prost::Message;
        let p = protocol::anp::pb::Packet {
            r#type: protocol::anp::pb::PacketType::Data as i32,
            payload: None,
        };
        raw_message(&p.encode_to_vec())
    };
    let o = raw_agent(server.agent, &certs, "bad-kind", vec![mismatched], watch);
    assert!(o.ended.is_some(), "{o:?}");
    // A message larger than the limit (only its header is needed).
    let o = raw_agent(
        server.agent,
        &certs,
        "too-big",
        vec![grpc_frame::header(5 << 20).to_vec()],
        watch,
    );
    assert!(o.ended.is_some(), "{o:?}");
    // A compressed message without negotiated compression.
    let o = raw_agent(
        server.agent,
        &certs,
        "gzip",
        vec![vec![1, 0, 0, 0, 1, 0]],
        watch,
    );
    assert!(o.ended.is_some(), "{o:?}");
    // Garbage split across frames mid-header.
    let o = raw_agent(
        server.agent,
        &certs,
        "split",
        vec![vec![0, 0], vec![0, 0, 3, 0xff], vec![0xff, 0xff]],
        watch,
    );
    assert!(o.ended.is_some(), "{o:?}");

    let errors = server.metric("edgetunnel_agent_protocol_errors_total") - errors_before;
    assert_eq!(errors, 5.0);
    assert!(busy.join().unwrap(), "the good tunnel was corrupted");
    // Reasons are logged (through the log thread: waited for).
    server.proc.wait_log("bad input");
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    server.wait_metric("edgetunnel_open_connections", 0.0);
}
