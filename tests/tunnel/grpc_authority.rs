//! Clients whose `:authority` the h2 crate would reject are served: the
//! percent-encoded socket path grpc-go sends when kube-apiserver dials the
//! konnectivity socket through its custom dialer
//! (`%2Fetc%2Fkubernetes%2F...`), a raw path, an empty value. The gRPC
//! frontend and the agent listener run on our own HTTP/2 server
//! (`protocol::h2_server`), which takes any value (the h2 crate answers such
//! a request with RST_STREAM(PROTOCOL_ERROR)).
//!
//! * a hand-made HTTP/2 client (literal HPACK, no Huffman) over the gRPC
//!   frontend's unix socket and TCP port: DIAL_REQ -> DIAL_RSP, bytes echoed
//!   through the agent, CLOSE_REQ -> CLOSE_RSP, on two streams of one
//!   connection;
//! * Python grpcio (C-core HPACK, Huffman and dynamic table) over the unix
//!   socket with its own percent-encoded `:authority`
//!   (`proxy_client.py --raw-authority`);
//! * the agent listener (mutual TLS): a hand-made agent Connect with an
//!   odd `:authority` is accepted.
//!
//! The venv comes from `tests/interop/setup.sh`, as for `tests/interop.rs`;
//! set `EDGETUNNEL_INTEROP_VENV` to reuse one.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use support::raw_h2::*;
use support::*;

/// What kube-apiserver's grpc-go sends for the default konnectivity socket.
const PERCENT: &str = "%2Fetc%2Fkubernetes%2Fkonnectivity-server%2Fkonnectivity-server.socket";
const ODD_AUTHORITIES: [&str; 3] = [PERCENT, "/tmp/x.sock", ""];

/// One ProxyService/Proxy call on `stream`: dial `target`, echo a few
/// bytes through it, close it.
fn proxy_call<S: Read + Write>(c: &mut RawH2<S>, stream: u32, authority: &str, target: SocketAddr) {
    let connect_id = c.dial(stream, authority, target, 4200 + i64::from(stream));
    c.echo(
        stream,
        connect_id,
        &format!("through {authority:?} on stream {stream}"),
    );
    c.close(stream, connect_id);
    // Half-close our side of the call.
    c.write_frame(DATA, END_STREAM, stream, &[]);
}

fn setup() -> (Env, Server, Agent, Echo) {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let agent = Agent::start(&env, server.agent, "node1", "host=node1", &[]);
    let echo = echo_server("127.0.0.1");
    (env, server, agent, echo)
}

#[test]
fn raw_h2_odd_authority_over_unix_socket() {
    let (_env, server, _agent, echo) = setup();
    for a in ODD_AUTHORITIES {
        let s = UnixStream::connect(&server.grpc_uds).expect("connect grpc uds");
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut c = RawH2::start(s);
        proxy_call(&mut c, 1, a, echo.addr);
        proxy_call(&mut c, 3, a, echo.addr);
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

#[test]
fn raw_h2_odd_authority_over_tcp() {
    let (_env, server, _agent, echo) = setup();
    for a in ODD_AUTHORITIES.into_iter().chain(["localhost:8090"]) {
        let s = TcpStream::connect(server.grpc).expect("connect grpc tcp");
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.set_nodelay(true).unwrap();
        let mut c = RawH2::start(s);
        proxy_call(&mut c, 1, a, echo.addr);
        proxy_call(&mut c, 3, a, echo.addr);
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
}

/// A hand-made agent: mutual TLS with the agent certificate, then an
/// `AgentService/Connect` call with an odd `:authority`.
#[test]
fn agent_connect_with_odd_authority_over_tls() {
    let env = Env::new();
    let server = Server::start(&env, &[]);
    let files = engine::tls::TlsFiles {
        cert: env.certs().join("agent.crt"),
        key: env.certs().join("agent.key"),
        ca: env.certs().join("ca.crt"),
    };
    let (cfg, _) = engine::tls::client_config(&files).expect("client TLS config");
    for (i, a) in ODD_AUTHORITIES.into_iter().enumerate() {
        let tcp = TcpStream::connect(server.agent).expect("connect agent listener");
        tcp.set_read_timeout(Some(WAIT)).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = rustls::ClientConnection::new(Arc::clone(&cfg), name).unwrap();
        let mut c = RawH2::start(rustls::StreamOwned::new(tls, tcp));
        let id = format!("raw-agent-{i}");
        c.open(
            1,
            &[
                (":method", "POST"),
                (":scheme", "https"),
                (":path", "/AgentService/Connect"),
                (":authority", a),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("agentid", &id),
                ("agentidentifiers", "host=raw-node"),
            ],
        );
        match c.next_event(1) {
            Event::Headers(h) => {
                assert_eq!(header(&h, ":status"), Some("200"), "{h:?}");
                assert_eq!(header(&h, "grpc-status"), None, "refused: {h:?}");
            }
            e => panic!("expected response headers, got {e:?}"),
        }
        server.wait_metric("edgetunnel_agents_connected", 1.0);
        drop(c);
        server.wait_metric("edgetunnel_agents_connected", 0.0);
    }
}

/// grpc C-core over `unix:PATH` with its own `:authority` (the
/// percent-encoded path): several calls, multiplexed and one after the
/// other on one channel, so its HPACK dynamic table is in play.
#[test]
fn grpcio_raw_authority_over_unix_socket() {
    let (env, server, _agent, echo) = setup();
    for streams in ["per-connection", "shared"] {
        let args: Vec<String> = vec![
            "--target".into(),
            format!("unix:{}", server.grpc_uds.display()),
            "--raw-authority".into(),
            "--dial".into(),
            echo.addr.to_string(),
            "--payload-size".into(),
            (256 << 10).to_string(),
            "--connections".into(),
            "4".into(),
            "--streams".into(),
            streams.into(),
        ];
        let mut client = script(&env, "proxy_client.py", &args);
        let last = client.wait_line_any(&["OK", "FAIL"], Duration::from_secs(120));
        let status = client.wait_exit(Duration::from_secs(30));
        assert!(
            last.starts_with("OK") && status.is_some_and(|s| s.success()),
            "proxy_client.py --raw-authority failed: {last} ({status:?})\n{}\nserver log:\n{}",
            client.log_text(),
            server.proc.log_text()
        );
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
}
