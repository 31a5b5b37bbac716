//! Differential tests against the real `kubectl proxy` for kubectl's
//! command line (Go flag syntax, global flags, unknown kubeconfig names)
//! and for the filter's regular expressions (Go's RE2 semantics: ASCII
//! `\w \d \s \b`, `\<` a literal, patterns split at commas, invalid UTF-8
//! one rune per byte). Same flags, same requests, same answers.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::apiserver;
use support::http_raw::{exchange, Endpoint};
use support::proxy_proc::{kubectl, kubectl_cmd, ours_cmd, start, Running};
use support::Env;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Runs a command expected to exit at once; (exit code, stderr).
fn run_to_exit(mut cmd: Command) -> (i32, String) {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            return (
                st.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (-1, "still running".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The error line of a failed start: the first `error: ...` line, else
/// the last line.
fn error_line(stderr: &str) -> String {
    stderr
        .lines()
        .find(|l| l.starts_with("error:") || l.starts_with("Error:"))
        .or_else(|| stderr.lines().rfind(|l| !l.trim().is_empty()))
        .unwrap_or("")
        .to_string()
}

fn status(p: &Running, target: &str) -> u16 {
    let port = match &p.ep {
        Endpoint::Tcp(a) => a.port(),
        Endpoint::Unix(_) => 0,
    };
    let raw =
        format!("GET {target} HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n");
    exchange(&p.ep, raw.as_bytes(), "GET")
        .unwrap_or_else(|e| panic!("GET {target}: {e}"))
        .status
}

fn pair(env: &Env, kubectl: &Path, kc: &Path, name: &str, flags: &[String]) -> (Running, Running) {
    let go = start(
        kubectl_cmd(kubectl, kc, flags),
        env.path(&format!("{name}-kubectl.log")),
    );
    let ours = start(ours_cmd(kc, flags), env.path(&format!("{name}-ours.log")));
    (go, ours)
}

#[test]
fn go_flag_syntax_and_global_flags_as_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let kc = env.path("kc.yaml");
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    apiserver::kubeconfig(&kc, &server, &certs, Some("sekret"), false);

    // Each command line, run by both: where they listen and what the
    // filter decides must agree.
    let port = support::free_port();
    let lines: Vec<(&str, Vec<String>)> = vec![
        (
            "hex-port-go-bools",
            vec![
                format!("--port={port:#x}"),
                "--disable-filter=F".into(),
                "--append-server-path=0".into(),
                "--address=localhost".into(),
            ],
        ),
        (
            "globals",
            s(&[
                "--port=0",
                "-v=4",
                "--vmodule=proxy=2",
                "--request-timeout=5s",
                "--cache-dir=/tmp/nowhere",
                "--match-server-version=false",
                "--warnings-as-errors",
                "--profile=none",
                "--profile-output=/tmp/nowhere.pprof",
                "--log-flush-frequency=1s",
                "-n",
                "default",
            ]),
        ),
        (
            "repeated-last-wins",
            s(&[
                "--port",
                "1",
                "--accept-paths=^/nothing$",
                "--port=0",
                "--accept-paths=^/api",
                "ignored-argument",
            ]),
        ),
        ("disable-filter-T", s(&["--port=0", "--disable-filter=T"])),
        ("shorthands", s(&["-p0", "-P/s/", "-w", "/nonexistent"])),
    ];
    for (name, flags) in &lines {
        let go = start(
            kubectl_cmd(&kubectl, &kc, flags),
            env.path(&format!("{name}-kubectl.log")),
        );
        let (go_ep, go_codes) = (
            go.ep.clone_tcp(),
            ["/api/v1", "/apis/x", "/api/v1/namespaces/a/pods/b/exec"].map(|t| status(&go, t)),
        );
        drop(go);
        let ours = start(ours_cmd(&kc, flags), env.path(&format!("{name}-ours.log")));
        let (our_ep, our_codes) = (
            ours.ep.clone_tcp(),
            ["/api/v1", "/apis/x", "/api/v1/namespaces/a/pods/b/exec"].map(|t| status(&ours, t)),
        );
        assert_eq!(our_codes, go_codes, "{name}: statuses");
        if flags[0].starts_with("--port=0x") {
            assert_eq!(go_ep.map(|a| a.port()), Some(port), "{name}");
            assert_eq!(our_ep.map(|a| a.port()), Some(port), "{name}");
            assert_eq!(our_ep.map(|a| a.ip()), go_ep.map(|a| a.ip()), "{name}");
        }
    }

    // Command lines kubectl refuses: both exit 1 with the same message.
    let refused: Vec<Vec<String>> = vec![
        s(&["--port=0", "--user=nope"]),
        s(&["--port=0", "--context=nope"]),
        s(&["--port=0", "--cluster=nope"]),
        s(&["--port=0", "--context=nope", "--user=nope"]),
        s(&["--port=0", "--profile=bogus"]),
        s(&["--port=0", "--request-timeout=x"]),
        s(&["--port=0", "--disable-filter=yes"]),
        s(&["--port=zero"]),
        s(&["--port=0", "--no-such-flag"]),
        s(&["--port=0", "--accept-paths=(?x)a"]),
        s(&["--port=0", "--reject-paths=a**"]),
        s(&["--port=0", r"--accept-hosts=\8"]),
    ];
    for flags in &refused {
        let (go_code, go_err) = run_to_exit(kubectl_cmd(&kubectl, &kc, flags));
        let (our_code, our_err) = run_to_exit(ours_cmd(&kc, flags));
        // 1, or 255 for klog's Fatal (a filter pattern that does not compile).
        assert!(
            go_code == 1 || go_code == 255,
            "{flags:?}: kubectl {go_err}"
        );
        assert_eq!(our_code, go_code, "{flags:?}: ours {our_err}");
        // The cause as kubectl words it (pflag's through cobra as
        // "Error: ...", the others as "error: ..." or in a klog line).
        let ours = error_line(&our_err);
        let cause = ours
            .strip_prefix("error: ")
            .or_else(|| ours.strip_prefix("Error: "))
            .unwrap_or(&ours);
        assert!(
            !cause.is_empty() && go_err.contains(cause),
            "{flags:?}: ours {our_err:?}, kubectl {go_err:?}"
        );
    }
}

trait TcpAddr {
    fn clone_tcp(&self) -> Option<std::net::SocketAddr>;
}

impl TcpAddr for Endpoint {
    fn clone_tcp(&self) -> Option<std::net::SocketAddr> {
        match self {
            Endpoint::Tcp(a) => Some(*a),
            Endpoint::Unix(_) => None,
        }
    }
}

#[test]
fn filter_regexps_decide_as_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let kc = env.path("kc.yaml");
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    apiserver::kubeconfig(&kc, &server, &certs, Some("sekret"), false);

    let targets = [
        "/api/abc",
        "/api/%C3%A9",
        "/api/%E2%84%AA",
        "/api/%D9%A1",
        "/d/123",
        "/d/%D9%A1",
        "/w/%3Cy%3E",
        "/w/y",
        "/v%7B1",
        "/v",
        "/vv",
        "/a3%7D",
        "/b/x",
        "/b/%FF",
        "/b/%F0%9F%98",
        "/b/%F0%9F%98%80",
        "/b/%ED%A0%80",
        "/s%0B",
        "/s%0C",
        "/k",
        "/K",
        "/%E2%84%AA",
        "/c/&",
        "/c/a",
        "/n/%5B%5D",
        "/e/%C3%A9x",
        "/e/ax",
    ];
    let setups: Vec<(&str, Vec<String>)> = vec![
        // ASCII \w and \d; `(?i)` folding (K, k and the Kelvin sign).
        (
            "perl-classes",
            s(&[
                r"--accept-paths=^/api/\w+$,^/d/\d+$,(?i)^/k$,^/s\s$",
                "--reject-paths=^$",
            ]),
        ),
        // `\<` `\>` are literals; `[a&&b]` and `[a[b]]` are plain classes.
        (
            "literals",
            s(&[
                r"--accept-paths=^/w/\<y\>$,^/c/[a&&b]$,^/n/[x[]]$",
                "--reject-paths=^$",
            ]),
        ),
        // Split at commas before compiling: `^/v{1` and `3}`.
        ("comma-split", s(&["--reject-paths=^/v{1,3}"])),
        // One rune per invalid byte.
        (
            "invalid-utf8",
            s(&[r"--accept-paths=^/b/.$,^/e/\B.x", "--reject-paths=^$"]),
        ),
        // ASCII word boundary beside a non-ASCII letter.
        (
            "boundary",
            s(&[r"--accept-paths=^/e/.\bx", "--reject-paths=^$"]),
        ),
    ];
    let mut diffs = Vec::new();
    for (name, flags) in &setups {
        let mut flags = flags.clone();
        flags.push("--port=0".into());
        let (go, ours) = pair(&env, &kubectl, &kc, name, &flags);
        for t in targets {
            let (g, o) = (status(&go, t), status(&ours, t));
            if g != o {
                diffs.push(format!("{name} {t}: kubectl {g}, ours {o}"));
            }
        }
    }
    assert!(
        diffs.is_empty(),
        "filter decisions differ:\n{}",
        diffs.join("\n")
    );
}
