//! ANP's metric names on the server's /metrics and the agent's health and
//! admin listeners (`--health-bind`, `--admin-bind`), checked end to end:
//! a CONNECT dial, a gRPC dial (Python grpcio client, when the interop
//! venv is there) and a refused dial.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

const S: &str = "konnectivity_network_proxy_server_";
const A: &str = "konnectivity_network_proxy_agent_";

fn sample(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(sample).and_then(|r| r.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
}

fn get(text: &str, name: &str) -> f64 {
    sample(text, name).unwrap_or_else(|| panic!("{name} missing in:\n{text}"))
}

/// Polls `addr`'s /metrics until `name` satisfies `ok`.
fn wait_for(addr: SocketAddr, name: &str, ok: impl Fn(f64) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = http_get(addr, "/metrics").1;
        if sample(&text, name).is_some_and(&ok) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never as wanted in:\n{text}"
        );
        thread::sleep(Duration::from_millis(25));
    }
}

fn wait_status(addr: SocketAddr, path: &str, want: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http_get(addr, path);
        if status == want {
            return;
        }
        assert!(Instant::now() < deadline, "{path} stayed {status} ({body})");
        thread::sleep(Duration::from_millis(25));
    }
}

/// The response head of GET `path`.
fn head(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n").unwrap().0.to_string()
}

fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("EDGETUNNEL_INTEROP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/interop-venv"));
    let py = venv.join("bin/python");
    py.exists().then_some(py)
}

#[test]
fn anp_metrics_on_server_and_agent() {
    let env = Env::new();
    // The agent starts first, towards a server that is not there yet.
    let port: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let agent = Agent::spawn(
        &env,
        port,
        "node1",
        "host=node1",
        &[
            "--health-bind",
            "127.0.0.1:0",
            "--admin-bind",
            "127.0.0.1:0",
        ],
    );
    let health = listen_addr(&agent.proc, "health");
    let admin = listen_addr(&agent.proc, "admin");
    assert_eq!(http_get(health, "/healthz").0, 200);
    assert_eq!(http_get(health, "/readyz").0, 500);
    assert_eq!(http_get(health, "/ready").0, 500);
    let text = http_get(admin, "/metrics").1;
    assert_eq!(get(&text, &format!("{A}open_server_connections")), 0.0);
    assert!(head(admin, "/metrics").contains("Content-Type: text/plain; version=0.0.4"));

    let server = Server::start_on(&env, &port.to_string(), &[]);
    agent.proc.wait_line("CONNECTED");
    wait_status(health, "/readyz", 200);
    wait_status(health, "/ready", 200);
    let text = wait_for(admin, &format!("{A}open_server_connections"), |v| v == 1.0);
    assert_eq!(get(&text, "edgetunnel_agent_servers_connected"), 1.0);
    assert_eq!(get(&text, &format!("{A}known_server_count")), 1.0);
    assert!(head(server.admin, "/metrics").contains("Content-Type: text/plain; version=0.0.4"));
    server.wait_metric(&format!("{S}ready_backend_connections"), 1.0);
    server.wait_metric(
        &format!("{S}ready_backends{{proxy_strategy=\"default\"}}"),
        1.0,
    );
    server.wait_metric(
        &format!("{S}grpc_connections{{service_method=\"Connect\"}}"),
        1.0,
    );

    // A CONNECT dial.
    let echo = echo_server("127.0.0.1");
    let (status, _, conn) = connect_tcp(server.connect, &echo.addr.to_string());
    assert_eq!(status, 200);
    server.wait_metric(&format!("{S}established_connections"), 1.0);
    server.wait_metric(&format!("{S}http_connections"), 1.0);
    wait_for(admin, &format!("{A}open_endpoint_connections"), |v| {
        v == 1.0
    });
    assert_eq!(echo_roundtrip(conn, b"hello"), b"hello");
    server.wait_metric(&format!("{S}established_connections"), 0.0);
    server.wait_metric(&format!("{S}http_connections"), 0.0);
    wait_for(admin, &format!("{A}open_endpoint_connections"), |v| {
        v == 0.0
    });

    // A refused dial.
    let (_held, dead) = refused_addr();
    let (status, _, _) = connect_tcp(server.connect, &dead.to_string());
    assert_ne!(status, 200);
    server.wait_metric(
        &format!("{S}dial_failure_count{{reason=\"error_response\"}}"),
        1.0,
    );
    wait_for(
        admin,
        &format!("{A}endpoint_dial_failure_total{{reason=\"unknown\"}}"),
        |v| v == 1.0,
    );

    // A gRPC dial (ProxyService/Proxy).
    let mut grpc_dials = 0.0;
    match venv_python() {
        Some(py) => {
            let mut cmd = Command::new(py);
            cmd.arg(
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/proxy_client.py"),
            )
            .args(["--target", &server.grpc.to_string()])
            .args(["--dial", &echo.addr.to_string()])
            .args(["--payload-size", "1000"]);
            let mut p = Proc::spawn(cmd, env.path("proxy_client.log"));
            let last = p.wait_line_any(&["OK", "FAIL"], Duration::from_secs(60));
            assert!(last.starts_with("OK"), "{last}\n{}", p.log_text());
            p.wait_exit(Duration::from_secs(30));
            grpc_dials = 1.0;
            server.wait_metric(
                &format!("{S}grpc_connections{{service_method=\"Proxy\"}}"),
                0.0,
            );
            let t = server.metrics();
            let from_client = format!(
                "{S}stream_packets_total{{segment=\"from_client\",packet_type=\"DIAL_REQ\"}}"
            );
            assert!(get(&t, &from_client) >= 1.0);
            let to_client = format!(
                "{S}stream_packets_total{{segment=\"to_client\",packet_type=\"DIAL_RSP\"}}"
            );
            assert!(get(&t, &to_client) >= 1.0);
            let data =
                format!("{S}stream_packets_total{{segment=\"to_client\",packet_type=\"DATA\"}}");
            assert!(get(&t, &data) >= 1.0);
        }
        None => eprintln!("no interop venv (tests/interop/setup.sh): gRPC dial skipped"),
    }
    server.wait_metric(&format!("{S}established_connections"), 0.0);

    let t = server.metrics();
    for (name, want) in [
        (format!("{S}pending_backend_dials"), 0.0),
        (format!("{S}dial_failure_count{{reason=\"no_agent\"}}"), 0.0),
        (format!("{S}dial_duration_seconds_count"), 1.0 + grpc_dials),
        (
            format!("{S}dial_duration_seconds_bucket{{le=\"+Inf\"}}"),
            1.0 + grpc_dials,
        ),
        (
            "edgetunnel_dials_total{result=\"success\"}".to_string(),
            1.0 + grpc_dials,
        ),
        (
            "edgetunnel_dials_total{result=\"failure\"}".to_string(),
            1.0,
        ),
    ] {
        assert_eq!(get(&t, &name), want, "{name} in\n{t}");
    }
    let rsp = format!("{S}stream_packets_total{{segment=\"from_agent\",packet_type=\"DIAL_RSP\"}}");
    assert_eq!(get(&t, &rsp), 2.0 + grpc_dials);
    let req = format!("{S}stream_packets_total{{segment=\"to_agent\",packet_type=\"DIAL_REQ\"}}");
    assert_eq!(get(&t, &req), 2.0 + grpc_dials);
    assert!(t.contains(&format!("# TYPE {S}dial_duration_seconds histogram\n")));
    assert!(t.contains(&format!("{S}dial_duration_seconds_bucket{{le=\"1e-06\"}} ")));

    let t = http_get(admin, "/metrics").1;
    let got = format!("{A}stream_packets_total{{segment=\"to_agent\",packet_type=\"DIAL_REQ\"}}");
    assert_eq!(get(&t, &got), 2.0 + grpc_dials);
    let sent =
        format!("{A}stream_packets_total{{segment=\"from_agent\",packet_type=\"DIAL_RSP\"}}");
    assert_eq!(get(&t, &sent), 2.0 + grpc_dials);
    assert_eq!(
        get(&t, &format!("{A}dial_duration_seconds_count")),
        1.0 + grpc_dials
    );

    // The server goes away: the agent is not ready any more.
    drop(server);
    wait_status(health, "/readyz", 500);
    wait_for(admin, &format!("{A}open_server_connections"), |v| v == 0.0);
}
