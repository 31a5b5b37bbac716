//! The CONNECT frontend over mutual TLS (kube-apiserver's HTTPConnect
//! egress over TCP, `--frontend-cert/--frontend-key/--frontend-ca`) with
//! Go's TLS client (anptool `-via connect -ca -cert -key`): an answer the
//! target sends and then keeps its connection open after (anptool's
//! `SRC n`, a kubelet with keep-alive) arrives whole (issue F1: the last
//! records stayed in the server's TLS session).

use crate::common::{cert_pair, client, peers, serial, tail, GoTarget, Peers};
use crate::support::{Agent, Env, Server, WAIT};

/// Our server with TLS on its CONNECT frontend, our agent, anptool's
/// target, and the client flags for TLS with a client certificate.
struct TlsStack {
    env: Env,
    server: Server,
    agent: Agent,
    target: GoTarget,
}

impl TlsStack {
    fn start(peers: &Peers) -> TlsStack {
        let env = Env::new();
        let target = GoTarget::start(peers, &env, "127.0.0.1:0");
        let certs = env.certs();
        let (cert, key) = cert_pair(&certs, "server");
        let ca = certs.join("ca.crt").display().to_string();
        let server = Server::start(
            &env,
            &[
                "--frontend-cert",
                &cert,
                "--frontend-key",
                &key,
                "--frontend-ca",
                &ca,
            ],
        );
        let agent = Agent::start(
            &env,
            server.agent,
            "node-1",
            "host=node-1&ipv4=127.0.0.1",
            &[],
        );
        server.wait_agent_links(workers_started(&server), &agent.proc);
        TlsStack {
            env,
            server,
            agent,
            target,
        }
    }

    /// `anptool client -via connect` over TLS with the proxy-client
    /// certificate, then `args`.
    fn run(&self, peers: &Peers, args: &[&str]) -> crate::common::ClientRun {
        let certs = self.env.certs();
        let (cert, key) = cert_pair(&certs, "proxy-client");
        let ca = certs.join("ca.crt").display().to_string();
        let addr = self.server.connect.to_string();
        let target = self.target.target();
        let mut all: Vec<&str> = vec![
            "-via", "connect", "-addr", &addr, "-target", &target, "-ca", &ca, "-cert", &cert,
            "-key", &key,
        ];
        all.extend_from_slice(args);
        client(peers, &all)
    }

    fn logs(&self, r: &crate::common::ClientRun) -> String {
        format!(
            "{}\n--- server:\n{}\n--- agent:\n{}\n--- target:\n{}",
            r.describe(),
            tail(&self.server.proc.log_text(), 30),
            tail(&self.agent.proc.log_text(), 30),
            tail(&self.target.proc.text(), 20)
        )
    }

    fn assert_clean(&self) {
        self.server.wait_metric("edgetunnel_open_connections", 0.0);
        self.server.wait_metric("edgetunnel_pending_dials", 0.0);
        self.target.wait_idle(WAIT);
    }
}

/// The server's worker count, from its start line (`workers=N`): its
/// metrics list a worker only once that worker has set up, which on a busy
/// machine can be after the agent's first link.
fn workers_started(server: &Server) -> f64 {
    let log = server.proc.wait_log("workers=");
    log.split_whitespace()
        .find_map(|w| w.strip_prefix("workers=")?.parse().ok())
        .expect("the server's start line names its workers")
}

/// The largest send buffer Linux gives a TCP socket (`tcp_wmem`'s third
/// value), which the server's socket toward a loopback caller starts with.
fn wmem_max() -> usize {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(4 << 20)
}

/// Go's client pauses (`closemid -stall`), then reads exactly `n` bytes
/// of a `SRC n` answer, which the target follows with nothing (it waits
/// for the client's close). When `n` is a little more than the server's
/// socket and the client's hold together, the last bytes reach the
/// server's TLS session with the socket full, and before the fix stayed
/// there: with `tcp_wmem` at 4 MiB here, 3,891,188, 3,914,199, 3,960,221
/// and 3,983,232 bytes stalled (4 of 41 sizes from 3.5 MB), and no size
/// of 61 from 40 KB to 5.9 MB in steps of 97 KB did. So the sizes swept
/// here surround 15/16 of `tcp_wmem`'s maximum, in steps smaller than the
/// 64 KiB a TLS session takes. Then a 16 MiB download read at once and
/// the target's `SRCCLOSE` (close_notify and EOF after the bytes).
#[test]
fn connect_over_tls_answers_kept_open_arrive_whole() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let s = TlsStack::start(p);
    let center = wmem_max() / 16 * 15;
    let mut n = center - 200_000;
    while n < center + 200_000 {
        let size = n.to_string();
        let r = s.run(
            p,
            &[
                "-test", "closemid", "-stall", "60ms", "-after", &size, "-size", &size, "-timeout",
                "3s",
            ],
        );
        assert!(r.ok, "{size} bytes, kept open:\n{}", s.logs(&r));
        n += 23_011;
    }
    for args in [
        &["-test", "down", "-size", "16777216"][..],
        &["-test", "srcclose", "-size", "1000003", "-timeout", "10s"][..],
    ] {
        let r = s.run(p, args);
        assert!(r.ok, "{args:?}:\n{}", s.logs(&r));
    }
    s.assert_clean();
}
