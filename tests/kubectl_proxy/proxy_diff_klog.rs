//! kubectl's `--match-server-version` and klog verbosity (`-v`,
//! `--vmodule`) in `edgetunnel proxy`, against the real `kubectl proxy`
//! (issue 14): the same start-up verdicts and error texts (the client
//! version in them is each program's own), and the per-round-trip log line
//! kubectl writes from -v6 on.

use crate::support;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use support::http_raw::{exchange, read_request};
use support::proxy_proc::{kubectl, kubectl_cmd, ours_cmd, start, Running};
use support::Env;

/// The kubectl release edgetunnel emulates (crates/kubectl-proxy/src/server_version.rs).
const OURS_VERSION: &str = r#"{"major":"1","minor":"32","gitVersion":"v1.32.4","gitCommit":"59526cd4867447956156ae3a602fcbac10a2c335","gitTreeState":"clean"}"#;

/// A plain-HTTP upstream answering `/version` with the current `version`
/// body and everything else with `{}`.
fn upstream(version: Arc<Mutex<Vec<u8>>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let version = Arc::clone(&version);
            thread::spawn(move || serve(s, version));
        }
    });
    addr
}

fn serve(s: TcpStream, version: Arc<Mutex<Vec<u8>>>) {
    let mut w = s.try_clone().expect("clone");
    let mut r = BufReader::new(s);
    while let Some((_, target, _)) = read_request(&mut r) {
        let path = target.split('?').next().unwrap_or("");
        let (status, body) = match path {
            "/version" => ("200 OK", version.lock().unwrap().clone()),
            "/404" => ("404 Not Found", b"{}".to_vec()),
            _ => ("200 OK", b"{}".to_vec()),
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        if w.write_all(&[head.as_bytes(), &body].concat()).is_err() {
            return;
        }
    }
}

fn kubeconfig(env: &Env, server: &str) -> std::path::PathBuf {
    let p = env.path("kubeconfig-klog");
    std::fs::write(
        &p,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )
    .expect("write kubeconfig");
    p
}

fn flags(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Runs a proxy that should refuse to start; its exit code and first
/// `error:`/`Error:` line.
fn refused(mut cmd: Command) -> (Option<i32>, String) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    for _ in 0..100 {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("Starting to serve"),
        "it started: {stdout}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("error: ") || l.starts_with("Error: "))
        .unwrap_or_default()
        .to_string();
    (out.status.code(), line)
}

/// kubectl's own client version, as its `/version` would report it.
fn kubectl_version(k: &Path) -> Vec<u8> {
    let out = Command::new(k)
        .args(["version", "--client", "-o", "json"])
        .output()
        .expect("kubectl version");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    serde_json::to_vec(&v["clientVersion"]).unwrap()
}

#[test]
fn match_server_version_as_kubectl() {
    let env = Env::new();
    let k = kubectl();
    let version = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(Arc::clone(&version));
    let kc = kubeconfig(&env, &format!("http://{up}"));
    let msv = flags(&["--port=0", "--match-server-version"]);

    // Each starts when the server reports its own client version.
    *version.lock().unwrap() = kubectl_version(&k);
    drop(start(kubectl_cmd(&k, &kc, &msv), env.path("msv-k.log")));
    *version.lock().unwrap() = OURS_VERSION.as_bytes().to_vec();
    drop(start(ours_cmd(&kc, &msv), env.path("msv-o.log")));

    // Another version: the same refusal, up to the client's own version.
    *version.lock().unwrap() = br#"{"major":"1","gitVersion":"v1.0.0","gitCommit":"abc"}"#.to_vec();
    let (kc_code, kc_err) = refused(kubectl_cmd(&k, &kc, &msv));
    let (o_code, o_err) = refused(ours_cmd(&kc, &msv));
    assert_eq!(o_code, kc_code);
    let cut = |s: &str| {
        s.split("differs from client version")
            .next()
            .unwrap()
            .to_string()
    };
    assert!(kc_err.contains("differs from client version"), "{kc_err}");
    assert_eq!(cut(&o_err), cut(&kc_err));
    assert!(
        o_err.ends_with("differs from client version (version.Info{Major:\"1\", Minor:\"32\", GitVersion:\"v1.32.4\", GitCommit:\"59526cd4867447956156ae3a602fcbac10a2c335\", GitTreeState:\"clean\", BuildDate:\"2025-04-22T16:03:58Z\", GoVersion:\"go1.23.6\", Compiler:\"gc\", Platform:\"linux/amd64\"})")
            || !cfg!(target_arch = "x86_64"),
        "{o_err}"
    );

    // A body that is no JSON: word for word.
    *version.lock().unwrap() = b"xx".to_vec();
    let want = refused(kubectl_cmd(&k, &kc, &msv));
    assert_eq!(refused(ours_cmd(&kc, &msv)), want);
    // Without the flag both start whatever the server says.
    drop(start(
        kubectl_cmd(&k, &kc, &flags(&["--port=0"])),
        env.path("nomsv-k.log"),
    ));
    drop(start(
        ours_cmd(&kc, &flags(&["--port=0"])),
        env.path("nomsv-o.log"),
    ));

    // No server at all.
    // (with a token: kubectl asks for a user name toward an https server
    // with no credentials, and reads EOF from the test's stdin).
    let gone = kubeconfig(&env, "https://127.0.0.1:1");
    let msv = flags(&["--port=0", "--match-server-version", "--token=t"]);
    let want = refused(kubectl_cmd(&k, &gone, &msv));
    assert!(want.1.contains("connection refused"), "{want:?}");
    assert_eq!(refused(ours_cmd(&gone, &msv)), want);
}

/// The round-trip lines (`METHOD URL STATUS in`) a proxy logged.
fn round_trips(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| {
            let i = l.find(" http://")?;
            let start = l[..i].rfind(' ').map_or(0, |j| j + 1);
            let line = &l[start..];
            let end = line.find(" in ")?;
            line.ends_with(" milliseconds")
                .then(|| line[..end].to_string())
        })
        .collect()
}

#[test]
fn verbosity_six_logs_each_round_trip_as_kubectl() {
    let env = Env::new();
    let k = kubectl();
    let up = upstream(Arc::new(Mutex::new(b"{}".to_vec())));
    let kc = kubeconfig(&env, &format!("http://{up}"));
    let reqs = |ep: &support::http_raw::Endpoint| {
        for (m, p) in [("GET", "/api/x?y=1"), ("POST", "/404")] {
            let raw = format!(
                "{m} {p} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: t\r\nContent-Length: 0\r\n\r\n"
            );
            exchange(ep, raw.as_bytes(), m).expect("exchange");
        }
    };
    // The round trips a proxy logged, once it logged `n` (a line may reach
    // the file a moment after the answer); with none expected, after half
    // a second of not logging one.
    let logged = |p: &Running, n: usize| -> Vec<String> {
        if n == 0 {
            thread::sleep(Duration::from_millis(500));
            return round_trips(&p.log_text());
        }
        let deadline = std::time::Instant::now() + support::WAIT;
        loop {
            let got = round_trips(&p.log_text());
            if got.len() >= n || std::time::Instant::now() > deadline {
                return got;
            }
            thread::sleep(Duration::from_millis(20));
        }
    };
    let want = vec![
        format!("GET http://{up}/api/x?y=1 200 OK"),
        format!("POST http://{up}/404 404 Not Found"),
    ];
    for (i, v) in [&["-v=6"][..], &["--vmodule=round_trip*=6"], &["-v", "5"]]
        .iter()
        .enumerate()
    {
        let mut f = flags(&["--port=0"]);
        f.extend(flags(v));
        let go = start(kubectl_cmd(&k, &kc, &f), env.path(&format!("v{i}-k.log")));
        let ours = start(ours_cmd(&kc, &f), env.path(&format!("v{i}-o.log")));
        reqs(&go.ep);
        reqs(&ours.ep);
        let expected = if i < 2 { want.clone() } else { Vec::new() };
        assert_eq!(logged(&go, expected.len()), expected, "kubectl {v:?}");
        assert_eq!(logged(&ours, expected.len()), expected, "ours {v:?}");
    }
}

#[test]
fn malformed_vmodule_is_refused_as_kubectl() {
    let env = Env::new();
    let kc = kubeconfig(&env, "http://127.0.0.1:1");
    let f = flags(&["--port=0", "--vmodule=foo"]);
    let want = refused(kubectl_cmd(&kubectl(), &kc, &f));
    assert!(want.1.contains("expect comma-separated list"), "{want:?}");
    assert_eq!(refused(ours_cmd(&kc, &f)), want);
}
