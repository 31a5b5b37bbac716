//! The Go konnectivity-client (through anptool) against our server and
//! agent: gRPC over TCP and over a unix socket dialed exactly as
//! kube-apiserver dials it, echo / upload / download of 1 KiB to 100 MiB
//! with sha256 checks, the target closing first, the client closing or
//! dying mid-download, DIAL_CLS on a dial deadline, no agent, TLS on the
//! frontend.

use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{cert_pair, client, peers, serial, GoTarget, Logged, Stack};
use crate::support::{Env, Server, WAIT};

/// gRPC over TCP and over the unix socket: the three transfers at three
/// sizes, each checked by sha256, each leaving nothing open.
#[test]
fn grpc_echo_upload_download_over_tcp_and_unix_socket() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let s = Stack::start(p, &[]);
    let grpc = s.server.grpc.to_string();
    let uds = s.server.grpc_uds.display().to_string();
    let target = s.target.target();
    for (via, addr) in [("grpc", &grpc), ("grpc-uds", &uds)] {
        for test in ["echo", "up", "down"] {
            for size in ["1024", "1048576", "104857600"] {
                s.expect_ok(
                    p,
                    &[
                        "-via", via, "-addr", addr, "-target", &target, "-test", test, "-size",
                        size,
                    ],
                );
                s.assert_clean();
            }
        }
    }
}

/// The target sends 0 B or 1 MiB and closes first: the client must see
/// exactly those bytes and then EOF (our agent negotiates half-close), on
/// every frontend.
#[test]
fn target_closes_first_reaches_the_client_as_eof() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let s = Stack::start(p, &[]);
    let vias = frontends(&s);
    let target = s.target.target();
    for (via, addr) in &vias {
        for size in ["0", "1048576"] {
            let r = s.expect_ok(
                p,
                &[
                    "-via", via, "-addr", addr, "-target", &target, "-test", "srcclose", "-size",
                    size, "-timeout", "10s",
                ],
            );
            assert!(r.line.contains("eof_after="), "{}", r.line);
            s.assert_clean();
        }
    }
}

/// The client closes mid-download (at once, and after reading nothing for
/// a while so that the tunnel's buffers are full), or is killed with
/// SIGKILL: the tunnel and the target's connection close, nothing leaks.
///
/// Over gRPC, konnectivity-client's `Close()` waits for CLOSE_RSP, which
/// its read loop only sees after the DATA before it was taken: with 10
/// messages queued unread (`readCh`, konnectivity-client/pkg/client/
/// client.go) that loop stops, and after `readTimeoutSeconds` (10 s) it
/// drops the gRPC connection, so `Close()` returns after about 10 s
/// against any server (ANP v0.36.0's Go server: 10.01 s, checked by hand
/// on 2026-12-05). One such case per gRPC mode.
#[test]
fn client_close_or_death_mid_download_leaves_nothing_open() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let s = Stack::start(p, &[]);
    let target = s.target.target();
    for (via, addr) in &frontends(&s) {
        let (stalls, limit): (&[&str], f64) = match *via {
            "grpc" => (&["1s"], 12.0),
            "grpc-uds" => (&["0s"], 12.0),
            _ => (&["0s", "1s"], 2.0),
        };
        for stall in stalls {
            let r = s.expect_ok(
                p,
                &[
                    "-via",
                    via,
                    "-addr",
                    addr,
                    "-target",
                    &target,
                    "-test",
                    "closemid",
                    "-size",
                    "1073741824",
                    "-after",
                    "8388608",
                    "-stall",
                    stall,
                ],
            );
            let took: f64 = r
                .line
                .split("Close() took ")
                .nth(1)
                .and_then(|t| t.split('s').next())
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("no Close() time in {}", r.line));
            assert!(took < limit, "Close() blocked {took}s: {}", s.logs(&r));
            s.assert_clean();
        }
        // SIGKILL while the download runs.
        let accepted = s.target.counts().0;
        let client = Logged::spawn(
            p.anptool(&[
                "client",
                "-via",
                via,
                "-addr",
                addr,
                "-target",
                &target,
                "-test",
                "down",
                "-size",
                "10737418240",
            ]),
            s.env.path("killed-client.log"),
        );
        wait_until(
            WAIT,
            || s.target.counts().0 > accepted,
            "the download to start",
        );
        thread::sleep(Duration::from_millis(300));
        client.signal(libc::SIGKILL);
        drop(client);
        s.assert_clean();
    }
}

/// A dial the agent cannot finish (the target's accept queue is full, so
/// its SYNs are dropped) and a client whose context deadline passes: the
/// client gives up with a dial error, konnectivity-client sends DIAL_CLS,
/// and the agent abandons its connect (no SYN-SENT socket is left).
#[test]
fn dial_deadline_sends_dial_cls_and_the_agent_abandons_the_dial() {
    let Some(p) = peers() else { return };
    let _g = serial();
    // The agent's own dial timeout far away: only DIAL_CLS ends the dial.
    let s = Stack::start_in(p, Env::new(), &[], &["--dial-timeout-secs", "60"]);
    let (_blackhole, _queued, port) = full_accept_queue();
    let target = format!("127.0.0.1:{port}");
    for (via, addr) in &frontends(&s)[..2] {
        let args: Vec<String> = [
            "-via",
            via,
            "-addr",
            addr,
            "-target",
            &target,
            "-test",
            "dial",
            "-dial-timeout",
            "1s",
            "-timeout",
            "10s",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let run = thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            client(p, &args)
        });
        // The agent is in its connect (the dial reached it) ...
        wait_until(WAIT, || syn_sent_to(port) > 0, "the agent's connect");
        let r = run.join().unwrap();
        assert!(
            !r.ok,
            "a dial into a full accept queue succeeded: {}",
            r.line
        );
        assert!(
            r.line.contains("dial timeout, context") && r.secs < 8.0,
            "{}",
            s.logs(&r)
        );
        s.server.wait_metric("edgetunnel_pending_dials", 0.0);
        s.server.wait_metric("edgetunnel_open_connections", 0.0);
        // ... and gives it up on DIAL_CLS, long before its own dial
        // timeout (60 s here) or the kernel's (about 2 minutes of SYN
        // retries): at once, waited for up to WAIT on a loaded machine.
        wait_until(
            WAIT,
            || syn_sent_to(port) == 0,
            "the agent to abandon its connect after DIAL_CLS",
        );
    }
}

/// No agent linked: the dial fails at once with an error that says so, on
/// gRPC and CONNECT alike.
#[test]
fn no_agent_fails_the_dial_promptly() {
    let Some(p) = peers() else { return };
    let env = Env::new();
    let target = GoTarget::start(p, &env, "127.0.0.1:0");
    let server = Server::start(&env, &[]);
    let grpc = server.grpc.to_string();
    let uds = server.grpc_uds.display().to_string();
    let connect = server.connect_uds.display().to_string();
    for (via, addr) in [
        ("grpc", &grpc),
        ("grpc-uds", &uds),
        ("connect-uds", &connect),
    ] {
        let r = client(
            p,
            &[
                "-via",
                via,
                "-addr",
                addr,
                "-target",
                &target.target(),
                "-test",
                "echo",
                "-size",
                "1024",
                "-timeout",
                "10s",
            ],
        );
        assert!(!r.ok, "a dial with no agent succeeded: {}", r.line);
        assert!(r.secs < 5.0, "took {}s: {}", r.secs, r.describe());
        assert!(
            r.line.to_lowercase().contains("agent"),
            "the error does not name the missing agent: {}",
            r.line
        );
    }
    server.wait_metric("edgetunnel_open_connections", 0.0);
    assert_eq!(target.counts().0, 0, "the target was reached");
}

/// The gRPC frontend on TCP with TLS (ANP's --server-cert, --server-key,
/// --server-ca-cert): konnectivity-client with a client certificate gets
/// its tunnel; without one it is refused.
#[test]
fn grpc_frontend_with_mutual_tls() {
    let Some(p) = peers() else { return };
    let _g = serial();
    let env_certs = |s: &Stack, f: &str| s.env.certs().join(f).display().to_string();
    let env = Env::new();
    let dir = env.certs();
    let (cert, key) = cert_pair(&dir, "server");
    let ca = dir.join("ca.crt").display().to_string();
    let s = Stack::start_in(
        p,
        env,
        &[
            "--frontend-cert",
            &cert,
            "--frontend-key",
            &key,
            "--frontend-ca",
            &ca,
        ],
        &[],
    );
    let grpc = s.server.grpc.to_string();
    let target = s.target.target();
    let (ccert, ckey) = (
        env_certs(&s, "proxy-client.crt"),
        env_certs(&s, "proxy-client.key"),
    );
    for (test, size) in [
        ("echo", "1048576"),
        ("down", "16777216"),
        ("up", "16777216"),
    ] {
        s.expect_ok(
            p,
            &[
                "-via",
                "grpc",
                "-addr",
                &grpc,
                "-target",
                &target,
                "-test",
                test,
                "-size",
                size,
                "-ca",
                &ca,
                "-cert",
                &ccert,
                "-key",
                &ckey,
                "-sni",
                "localhost",
            ],
        );
        s.assert_clean();
    }
    let r = client(
        p,
        &[
            "-via",
            "grpc",
            "-addr",
            &grpc,
            "-target",
            &target,
            "-test",
            "echo",
            "-size",
            "1024",
            "-ca",
            &ca,
            "-sni",
            "localhost",
            "-timeout",
            "5s",
        ],
    );
    assert!(
        !r.ok,
        "a caller without a client certificate got through: {}",
        r.line
    );
    s.assert_clean();
}

/// Every frontend of `s` anptool can dial: (mode, address).
fn frontends(s: &Stack) -> Vec<(&'static str, String)> {
    vec![
        ("grpc", s.server.grpc.to_string()),
        ("grpc-uds", s.server.grpc_uds.display().to_string()),
        ("connect", s.server.connect.to_string()),
        ("connect-uds", s.server.connect_uds.display().to_string()),
    ]
}

fn wait_until(timeout: Duration, mut ok: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "waited {timeout:?} for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A loopback listener whose accept queue (backlog 0) is already full:
/// the kernel drops further SYNs, so a connect to it hangs. Returns the
/// listener, the queued connection and the port.
fn full_accept_queue() -> (socket2::Socket, TcpStream, u16) {
    use socket2::{Domain, Socket, Type};
    let l = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .expect("bind");
    l.listen(0).expect("listen");
    let port = l.local_addr().unwrap().as_socket().unwrap().port();
    let queued = TcpStream::connect(("127.0.0.1", port)).expect("fill the queue");
    // A second one may be let in too (the queue holds backlog + 1); fill
    // it until a connect no longer completes.
    let mut extra = Vec::new();
    loop {
        let s = socket2::Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        match s.connect_timeout(&addr.into(), Duration::from_millis(300)) {
            Ok(()) => extra.push(s),
            Err(_) => break,
        }
        assert!(extra.len() < 8, "the accept queue never fills");
    }
    std::mem::forget(extra);
    (l, queued, port)
}

/// Sockets on this machine in SYN-SENT toward loopback port `port`.
fn syn_sent_to(port: u16) -> usize {
    let out = Command::new("ss")
        .args([
            "-Htn",
            "state",
            "syn-sent",
            "dst",
            &format!("127.0.0.1:{port}"),
        ])
        .output()
        .expect("run ss");
    String::from_utf8_lossy(&out.stdout).lines().count()
}
