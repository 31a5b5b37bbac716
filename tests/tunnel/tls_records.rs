//! The agent link's own TLS record layer (`engine::tls_records`) against a
//! real TLS stack as the agent: a tokio-rustls client that sends a
//! KeyUpdate mid-stream (rustls' `refresh_traffic_keys`, which also asks
//! for the server's), and one whose record is corrupted on the wire. A
//! well-behaved agent (ours: our record layer at both ends) keeps a
//! tunneled connection busy meanwhile; it must never notice.
//!
//! And TLS 1.2 peers, which stay on rustls' records: a relay that speaks
//! only TLS 1.2 on both sides sits between our agent and our server (the
//! Go peers cannot be limited to TLS 1.2: ANP's proxy-server has only
//! `--tls-min-version` and `--cipher-suites`, "no effect on TLS1.3",
//! cmd/server/app/options/options.go; its getTLSConfig in
//! cmd/server/app/server.go sets MinVersion and CipherSuites, no
//! MaxVersion; the agent's pkg/util/certificates.go sets MinVersion
//! only). One case runs with `EDGETUNNEL_TLS_RECORDS=rustls`, the way
//! back from the default.

use crate::support;

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use engine::grpc::{self, PacketReceiver, SendBuf};
use engine::runtime::{block_on, Driver};
use engine::tls::{client_config, load_certs, load_key, load_roots, TlsFiles};
use monoio::io::IntoPollIo;
use protocol::anp::packet::{self, Frame};
use support::*;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A socket whose next write, once armed, has its 11th byte (inside the
/// first record's encrypted part) inverted.
struct Flip<T> {
    inner: T,
    armed: Rc<Cell<bool>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Flip<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Flip<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.armed.get() || buf.len() <= 10 {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        let mut bad = buf.to_vec();
        bad[10] ^= 0xff;
        let r = Pin::new(&mut this.inner).poll_write(cx, &bad);
        if let Poll::Ready(Ok(n)) = r {
            if n > 10 {
                this.armed.set(false);
            }
        }
        r
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Misdeed {
    /// A KeyUpdate (asking for the server's) before each packet sent.
    KeyUpdate,
    /// The record carrying the packet corrupted on the wire.
    Corrupt,
}

/// A rustls agent: TLS, HTTP/2, Connect; then `rounds` times: its misdeed,
/// and a DATA packet for a connection that was never dialed (the server
/// answers each with a CLOSE_REQ). Returns the frames it got and why its
/// stream ended (None: still open after `watch`).
fn rustls_agent(
    server: SocketAddr,
    certs: &Path,
    id: &str,
    misdeed: Misdeed,
    rounds: i64,
    watch: Duration,
) -> (Vec<Frame>, Option<String>) {
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
            let armed = Rc::new(Cell::new(false));
            let io = Flip {
                inner: tcp.into_poll_io().unwrap(),
                armed: armed.clone(),
            };
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let tls = tokio_rustls::TlsConnector::from(tls)
                .connect(name, io)
                .await
                .unwrap();
            assert_eq!(
                tls.get_ref().1.protocol_version(),
                Some(rustls::ProtocolVersion::TLSv1_3)
            );
            // The connection is the h2 crate's from here on; the test asks
            // for a KeyUpdate through KEY_UPDATE.
            let (client, conn) = h2::client::Builder::new()
                .handshake::<_, SendBuf>(KeyUpdating(tls))
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
            let mut rx = PacketReceiver::new(resp.into_body(), 1 << 20);
            let mut frames = Vec::new();
            let mut ended = None;
            for round in 0..rounds {
                match misdeed {
                    Misdeed::KeyUpdate => KEY_UPDATE.with(|k| k.set(true)),
                    Misdeed::Corrupt => armed.set(true),
                }
                let p = packet::encode(packet::data(4000 + round, Bytes::from_static(b"x")));
                send.send_data(grpc::chain(p.head, p.payload), false)
                    .unwrap();
                match monoio::time::timeout(watch, rx.next()).await {
                    Err(_) => {}
                    Ok(Ok(Some(f))) => frames.push(f),
                    Ok(Ok(None)) => {
                        ended = Some("ended cleanly".to_string());
                        break;
                    }
                    Ok(Err(e)) => {
                        ended = Some(e.to_string());
                        break;
                    }
                }
            }
            drop(send);
            (frames, ended)
        })
        .unwrap()
    })
    .join()
    .unwrap()
}

thread_local! {
    /// Set by the test: the next write first asks rustls for a KeyUpdate.
    static KEY_UPDATE: Cell<bool> = const { Cell::new(false) };
}

/// The TLS stream, asking rustls for a KeyUpdate before a write when the
/// test says so (the h2 crate owns the stream).
struct KeyUpdating<T>(tokio_rustls::client::TlsStream<T>);

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for KeyUpdating<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for KeyUpdating<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if KEY_UPDATE.with(|k| k.replace(false)) {
            this.0
                .get_mut()
                .1
                .refresh_traffic_keys()
                .expect("a TLS 1.3 KeyUpdate");
        }
        Pin::new(&mut this.0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[test]
fn a_key_update_mid_stream_and_a_corrupted_record() {
    // Our record layer in the server and the good agent.
    child_env("EDGETUNNEL_TLS_RECORDS", "own");
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
    let busy = busy_tunnel(server.connect, echo.addr.to_string(), 32 << 20, 7);
    let certs = env.certs();
    let watch = Duration::from_secs(3);

    // Three KeyUpdates, each followed by a packet; each answered (sealed
    // with the server's next key, as the update asked).
    let (frames, ended) = rustls_agent(server.agent, &certs, "rekey", Misdeed::KeyUpdate, 3, watch);
    assert_eq!(
        frames,
        (0..3)
            .map(|r| packet::close_request(4000 + r))
            .collect::<Vec<_>>(),
        "{ended:?}"
    );
    assert!(ended.is_none(), "{ended:?}");

    // A corrupted record: that link ends, with the reason in the log.
    let (frames, ended) = rustls_agent(server.agent, &certs, "corrupt", Misdeed::Corrupt, 1, watch);
    assert!(frames.is_empty(), "{frames:?}");
    assert!(ended.is_some(), "the corrupted link is still up");
    server.proc.wait_log("bad_record_mac");

    assert!(busy.join().unwrap(), "the good tunnel was corrupted");
    server.wait_metric("edgetunnel_agents_connected", 1.0);
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

/// A TLS-terminating relay that speaks TLS 1.2 only, on both sides: it
/// takes agent links as the server (the server's certificate, no client
/// certificate asked for) and carries each to `upstream` as a client (the
/// agent's certificate), so our agent meets a TLS 1.2-only server and our
/// server a TLS 1.2-only client. Each side checks that it got TLS 1.2.
fn tls12_relay(certs: &Path, upstream: SocketAddr) -> SocketAddr {
    let provider = || Arc::new(rustls::crypto::ring::default_provider());
    let tls12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(tls12)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            load_certs(&certs.join("server.crt")).unwrap(),
            load_key(&certs.join("server.key")).unwrap(),
        )
        .unwrap();
    server.alpn_protocols = vec![b"h2".to_vec()];
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(tls12)
        .unwrap()
        .with_root_certificates(load_roots(&certs.join("ca.crt")).unwrap())
        .with_client_auth_cert(
            load_certs(&certs.join("agent.crt")).unwrap(),
            load_key(&certs.join("agent.key")).unwrap(),
        )
        .unwrap();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let (server, client) = (Arc::new(server), Arc::new(client));
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        block_on(Driver::Auto, async move {
            let l = monoio::net::TcpListener::from_std(l).unwrap();
            loop {
                let Ok((down, _)) = l.accept().await else {
                    continue;
                };
                let (server, client) = (server.clone(), client.clone());
                monoio::spawn(async move {
                    let down = tokio_rustls::TlsAcceptor::from(server)
                        .accept(down.into_poll_io().unwrap())
                        .await;
                    // Our agent's first try (our record layer) ends when
                    // it finds TLS 1.2; it connects again through rustls.
                    let Ok(mut down) = down else { return };
                    let v = down.get_ref().1.protocol_version();
                    assert_eq!(v, Some(rustls::ProtocolVersion::TLSv1_2));
                    let up = monoio::net::TcpStream::connect(upstream).await.unwrap();
                    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                    let mut up = tokio_rustls::TlsConnector::from(client)
                        .connect(name, up.into_poll_io().unwrap())
                        .await
                        .unwrap();
                    let v = up.get_ref().1.protocol_version();
                    assert_eq!(v, Some(rustls::ProtocolVersion::TLSv1_2));
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                });
            }
        })
        .unwrap()
    });
    addr
}

/// `edgetunnel_agent_link_tls_total` for one record layer and version.
fn link_tls(admin: SocketAddr, record_layer: &str, version: &str) -> f64 {
    metric_at(
        admin,
        &format!(
            "edgetunnel_agent_link_tls_total{{record_layer=\"{record_layer}\",tls_version=\"{version}\"}}"
        ),
    )
}

/// A tunnel through `server` carries 4 MiB intact.
fn tunnel_carries_bytes(server: &Server, seed: u64) {
    let echo = echo_server("127.0.0.1");
    let (status, body, s) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200, "{body}");
    let data = random_bytes(4 << 20, seed);
    assert!(
        echo_roundtrip(s, &data) == data,
        "the tunnel corrupted bytes"
    );
}

#[test]
fn tls12_peers_stay_on_rustls_records() {
    // Our record layer asked for at both ends (the default; named here so
    // that the case keeps its meaning whatever the default).
    child_env("EDGETUNNEL_TLS_RECORDS", "own");
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let ids = "host=localhost&ipv4=127.0.0.1";

    // A TLS 1.3 agent: our records at both ends.
    let (direct, admin) = Agent::start_with_admin(&env, server.agent, "direct", ids, &[]);
    tunnel_carries_bytes(&server, 1);
    assert!(link_tls(admin, "own", "1.3") >= 1.0);
    assert_eq!(link_tls(admin, "rustls", "1.2"), 0.0);
    assert!(link_tls(server.admin, "own", "1.3") >= 1.0);
    assert_eq!(link_tls(server.admin, "rustls", "1.2"), 0.0);
    let log = direct.proc.wait_log("connected to server");
    let line = log.lines().find(|l| l.contains("connected to server"));
    assert!(
        line.is_some_and(|l| l.contains("record_layer") && l.contains("own")),
        "{log}"
    );
    drop(direct);
    server.wait_metric("edgetunnel_agents_connected", 0.0);

    // Through the TLS 1.2 relay: the agent finds its server chose TLS 1.2
    // and goes to rustls; the server sees a ClientHello without TLS 1.3.
    let relay = tls12_relay(&env.certs(), server.agent);
    let own_before = link_tls(server.admin, "own", "1.3");
    let (old, admin) = Agent::start_with_admin(&env, relay, "tls12", ids, &[]);
    tunnel_carries_bytes(&server, 2);
    assert_eq!(link_tls(admin, "own", "1.3"), 0.0);
    assert!(link_tls(admin, "rustls", "1.2") >= 1.0);
    assert_eq!(link_tls(server.admin, "own", "1.3"), own_before);
    assert!(link_tls(server.admin, "rustls", "1.2") >= 1.0);
    old.proc.wait_log("the server chose TLS 1.2");
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

#[test]
fn rustls_records_on_request() {
    // The way back: EDGETUNNEL_TLS_RECORDS=rustls at both ends.
    child_env("EDGETUNNEL_TLS_RECORDS", "rustls");
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let ids = "host=localhost&ipv4=127.0.0.1";
    let (_agent, admin) = Agent::start_with_admin(&env, server.agent, "back", ids, &[]);
    tunnel_carries_bytes(&server, 3);
    for at in [admin, server.admin] {
        assert!(link_tls(at, "rustls", "1.3") >= 1.0);
        assert_eq!(link_tls(at, "own", "1.3"), 0.0);
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
}
