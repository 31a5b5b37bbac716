//! Differential tests: the real `kubectl proxy` and `edgetunnel proxy`,
//! started with the same kubeconfig and flags against the same fake API
//! server, get the same table of requests; status codes, the bodies of
//! locally answered requests (filter rejections, redirects, 404s) and what
//! the upstream saw (method, target, headers, body) must all match.

use crate::support;

use std::path::{Path, PathBuf};

use support::apiserver::{self, FakeApiServer};
use support::http_raw::{exchange, Response};
use support::proxy_proc::{kubectl, kubectl_cmd, ours_cmd, start, Running};
use support::Env;

/// One flag set: the flags given to both proxies.
struct Setup {
    name: &'static str,
    flags: Vec<String>,
    kubeconfig: PathBuf,
}

struct Pair {
    go: Running,
    ours: Running,
}

fn start_pair(env: &Env, kubectl: &Path, setup: &Setup) -> Pair {
    let mut go_flags = setup.flags.clone();
    let mut our_flags = setup.flags.clone();
    // Unix sockets need distinct paths.
    for (flags, suffix) in [(&mut go_flags, "go"), (&mut our_flags, "ours")] {
        for f in flags.iter_mut() {
            if let Some(p) = f.strip_prefix("--unix-socket=") {
                *f = format!("--unix-socket={p}.{suffix}");
            }
        }
    }
    let go = kubectl_cmd(kubectl, &setup.kubeconfig, &go_flags);
    let ours = ours_cmd(&setup.kubeconfig, &our_flags);
    Pair {
        go: start(go, env.path(&format!("{}-kubectl.log", setup.name))),
        ours: start(ours, env.path(&format!("{}-ours.log", setup.name))),
    }
}

#[derive(Clone, Debug)]
struct Req {
    method: &'static str,
    target: String,
    /// `None`: no Host header; `Some("{port}")` style templates are filled in.
    host: Option<String>,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    chunked: bool,
    /// "HTTP/1.1" unless a case says otherwise.
    version: &'static str,
}

impl Req {
    fn get(target: &str) -> Req {
        Req {
            method: "GET",
            target: target.to_string(),
            host: Some("localhost:{port}".into()),
            headers: vec![("User-Agent".into(), "difftest/1".into())],
            body: None,
            chunked: false,
            version: "HTTP/1.1",
        }
    }

    fn raw(&self, port: u16) -> Vec<u8> {
        let mut s = format!("{} {} {}\r\n", self.method, self.target, self.version).into_bytes();
        if let Some(h) = &self.host {
            s.extend_from_slice(
                format!("Host: {}\r\n", h.replace("{port}", &port.to_string())).as_bytes(),
            );
        }
        for (n, v) in &self.headers {
            s.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
        }
        match (&self.body, self.chunked) {
            (Some(b), false) => {
                s.extend_from_slice(format!("Content-Length: {}\r\n\r\n", b.len()).as_bytes())
            }
            (Some(_), true) => s.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n"),
            (None, _) => s.extend_from_slice(b"\r\n"),
        }
        if let Some(b) = &self.body {
            if self.chunked {
                for part in b.chunks(7) {
                    s.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                    s.extend_from_slice(part);
                    s.extend_from_slice(b"\r\n");
                }
                s.extend_from_slice(b"0\r\n\r\n");
            } else {
                s.extend_from_slice(b);
            }
        }
        s
    }
}

/// The parts of a response that must agree.
fn view(r: &Response) -> String {
    let echo: Option<serde_json::Value> = serde_json::from_slice(&r.body)
        .ok()
        .filter(|v: &serde_json::Value| v.get("target").is_some());
    let body = match echo {
        Some(mut v) => {
            // A request without User-Agent gets the proxy's own: kubectl's
            // names kubectl, ours names edgetunnel (a deliberate difference).
            if let Some(hs) = v.get_mut("headers").and_then(|h| h.as_array_mut()) {
                for h in hs {
                    if h[0] == "user-agent" {
                        let ua = h[1].as_str().unwrap_or("");
                        if ua.starts_with("kubectl/") || ua.starts_with("edgetunnel/") {
                            h[1] = serde_json::Value::from("(the proxy's own)");
                        }
                    }
                }
            }
            format!("upstream saw {v}")
        }
        None if r.status == 500 => "(proxy error text)".to_string(),
        None => format!("body {:?}", String::from_utf8_lossy(&r.body)),
    };
    format!("{} location={:?} {}", r.status, r.header("location"), body)
}

/// Compares every request; returns how many were compared and how many of
/// ours reached the upstream (so a table where both proxies fail alike
/// cannot pass unnoticed).
fn compare(pair: &Pair, setup: &Setup, reqs: &[Req], failures: &mut Vec<String>) -> (usize, usize) {
    let mut n = 0;
    let mut reached = 0;
    for req in reqs {
        let go = exchange(&pair.go.ep, &req.raw(pair.go.ep.port()), req.method);
        let ours = exchange(&pair.ours.ep, &req.raw(pair.ours.ep.port()), req.method);
        n += 1;
        let (g, o) = match (go, ours) {
            (Ok(g), Ok(o)) => {
                let v = view(&o);
                if v.contains("upstream saw") {
                    reached += 1;
                }
                (view(&g), v)
            }
            (Err(g), Err(_)) => (format!("error {}", g.kind()), format!("error {}", g.kind())),
            (g, o) => (
                format!("{:?}", g.map(|r| view(&r))),
                format!("{:?}", o.map(|r| view(&r))),
            ),
        };
        if g != o {
            failures.push(format!(
                "[{}] {} {} host={:?}\n   kubectl: {g}\n   ours:    {o}\n   logs: {} {}",
                setup.name,
                req.method,
                req.target,
                req.host,
                pair.go.log.display(),
                pair.ours.log.display()
            ));
        }
    }
    (n, reached)
}

const TRICKY_PATHS: &[&str] = &[
    "/",
    "/api",
    "/api/",
    "/api/v1/namespaces/default/pods",
    "/api/v1/namespaces/default/pods?watch=false&labelSelector=a%3Db",
    "/apis/apps/v1/deployments",
    "/api/v1/namespaces/default/pods/p1/exec?command=ls",
    "/api/v1/namespaces/default/pods/p1/attach",
    "/api/v1/namespaces/default/pods/p1/log",
    "/apis/v1/namespaces/default/pods/p1/exec",
    "/api/v1/namespaces/kube-system/secrets",
    "/api/v1/nodes/n1/proxy/metrics",
    "/api/v1/a%2Fb",
    "/api/v1/a%2fb/c",
    "/api/v1/%7Euser",
    "/api/v1/a%20b",
    "/api/v1/a+b",
    "/api/v1/caf%C3%A9",
    "/api/v1/x;y=1",
    "/api/../api/v1",
    "/api/./v1",
    "//api/v1",
    "/api//v1",
    "/api/v1/",
    "/api/v1/pods/%2e%2e/exec",
    "/api/v1?",
    "/api/v1?a=1&a=2&b",
    "/custom",
    "/custom/",
    "/custom/api/v1/pods",
    "/custom/api/v1/namespaces/x/pods/y/exec",
    "/custom/%61pi/v1",
    "/k8s-api/v1/pods",
    "/static",
    "/static/",
    "/static/hello.txt",
    "/static/sub",
    "/static/sub/",
    "/static/index.html",
    "/static/../../etc/passwd",
    "/static/missing",
    "/base",
    "/%zz",
    "/api/v1/%",
    "*",
    "http://localhost:8001/api/v1/pods",
    "/gzip",
    "/gzip-chunked",
    "/status/418",
    "/status/204",
    "/close",
    "/bytes/300000",
];

const HOSTS: &[Option<&str>] = &[
    Some("localhost:{port}"),
    Some("127.0.0.1:{port}"),
    Some("[::1]:{port}"),
    Some("localhost"),
    Some("evil.example.com:{port}"),
    Some("LOCALHOST:{port}"),
    None,
];

fn table(paths: &[&str], methods: &[&'static str], hosts: &[Option<&str>]) -> Vec<Req> {
    let mut out = Vec::new();
    for p in paths {
        for m in methods {
            for h in hosts {
                let mut r = Req::get(p);
                r.method = m;
                r.host = h.map(str::to_string);
                if matches!(*m, "POST" | "PUT" | "PATCH") {
                    r.body = Some(format!("{{\"kind\":\"Test\",\"path\":\"{p}\"}}").into_bytes());
                    r.headers
                        .push(("Content-Type".into(), "application/json".into()));
                }
                out.push(r);
            }
        }
    }
    out
}

fn header_cases() -> Vec<Req> {
    let mut out = Vec::new();
    let mut with = |name: &str, value: &str| {
        let mut r = Req::get("/api/v1/namespaces/default/configmaps");
        r.headers.push((name.to_string(), value.to_string()));
        out.push(r);
    };
    with("Authorization", "Bearer from-client");
    with("X-Forwarded-For", "10.0.0.1");
    with("Connection", "keep-alive, X-Secret");
    with("X-Secret", "drop me");
    with("Te", "trailers");
    with("Te", "gzip");
    with("Keep-Alive", "timeout=5");
    with("Proxy-Authorization", "Basic Zm9vOmJhcg==");
    with("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io");
    with("Accept-Encoding", "identity");
    with("Range", "bytes=0-10");
    with("x-lower-case", "v");
    with("Impersonate-User", "admin");
    with("Trailer", "X-T");
    // Repeated headers.
    let mut r = Req::get("/api/v1/pods");
    r.headers.push(("X-Multi".into(), "a".into()));
    r.headers.push(("X-Multi".into(), "b".into()));
    out.push(r);
    // CONNECT, and HTTP/1.0 with and without Host.
    for target in ["localhost:443", "/api/v1/pods", "127.0.0.1:8001"] {
        let mut r = Req::get(target);
        r.method = "CONNECT";
        out.push(r);
    }
    for host in [Some("localhost:{port}"), None] {
        let mut r = Req::get("/api/v1/pods");
        r.version = "HTTP/1.0";
        r.host = host.map(str::to_string);
        out.push(r);
        let mut r = Req::get("/static/hello.txt");
        r.version = "HTTP/1.0";
        r.host = host.map(str::to_string);
        out.push(r);
    }
    let mut r = Req::get("/gzip-chunked");
    r.version = "HTTP/1.0";
    out.push(r);
    // Expect: 100-continue with a body.
    let mut r = Req::get("/api/v1/namespaces/default/configmaps");
    r.method = "POST";
    r.body = Some(b"{}".to_vec());
    r.headers.push(("Expect".into(), "100-continue".into()));
    out.push(r);
    // No User-Agent at all.
    let mut r = Req::get("/api/v1/pods");
    r.headers.clear();
    out.push(r);
    // Bodies: chunked, empty POST, larger.
    let mut r = Req::get("/api/v1/namespaces/default/configmaps");
    r.method = "POST";
    r.body = Some(b"chunked body in several pieces".to_vec());
    r.chunked = true;
    out.push(r);
    let mut r = Req::get("/api/v1/namespaces/default/configmaps");
    r.method = "POST";
    r.body = Some(Vec::new());
    out.push(r);
    let mut r = Req::get("/api/v1/namespaces/default/configmaps");
    r.method = "PUT";
    r.body = Some((0..200_000u32).map(|i| (i % 251) as u8).collect());
    out.push(r);
    let mut r = Req::get("/api/v1/namespaces/default/configmaps");
    r.method = "DELETE";
    r.body = Some(b"{\"propagationPolicy\":\"Foreground\"}".to_vec());
    out.push(r);
    out
}

fn www_dir(env: &Env) -> PathBuf {
    let d = env.path("www");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    std::fs::write(d.join("hello.txt"), "hello from www\n").unwrap();
    std::fs::write(d.join("sub/page.html"), "<p>page</p>").unwrap();
    d
}

#[test]
fn proxy_matches_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let api: FakeApiServer = apiserver::start(&certs);
    let server = format!("https://127.0.0.1:{}", api.addr.port());
    let kc_token = env.path("kc-token.yaml");
    apiserver::kubeconfig(&kc_token, &server, &certs, Some("sekret"), false);
    let kc_cert = env.path("kc-cert.yaml");
    apiserver::kubeconfig(&kc_cert, &server, &certs, None, true);
    let kc_base = env.path("kc-base.yaml");
    apiserver::kubeconfig(
        &kc_base,
        &format!("{server}/base"),
        &certs,
        Some("t2"),
        false,
    );
    let kc_none = env.path("kc-none.yaml");
    apiserver::kubeconfig(&kc_none, "https://127.0.0.1:1", &certs, None, false);
    let api2 = apiserver::start_h2(&certs);
    let kc_h2 = env.path("kc-h2.yaml");
    apiserver::kubeconfig(
        &kc_h2,
        &format!("https://127.0.0.1:{}", api2.addr.port()),
        &certs,
        Some("h2tok"),
        false,
    );
    let www = www_dir(&env);
    let sock = env.path("proxy.sock");

    let all_methods: &[&'static str] =
        &["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let p0 = "--port=0".to_string();
    let setups: Vec<(Setup, Vec<Req>)> = vec![
        (
            Setup {
                name: "defaults",
                flags: vec![p0.clone()],
                kubeconfig: kc_token.clone(),
            },
            {
                let mut t = table(TRICKY_PATHS, &["GET"], &HOSTS[..3]);
                t.extend(table(&TRICKY_PATHS[..12], &all_methods[1..], &HOSTS[..1]));
                t.extend(table(&["/api/v1/pods", "/", "//x"], &["GET"], &HOSTS[3..]));
                t.extend(header_cases());
                t.extend(table(
                    &TRICKY_PATHS[TRICKY_PATHS.len() - 6..],
                    &["GET", "HEAD"],
                    &HOSTS[..1],
                ));
                let mut gz = Req::get("/gzip");
                gz.headers.push(("Accept-Encoding".into(), "gzip".into()));
                t.push(gz);
                t
            },
        ),
        (
            Setup {
                name: "custom-prefix-www",
                flags: [
                    vec![p0.clone()],
                    s(&[
                        "--api-prefix=/custom",
                        &format!("--www={}", www.display()),
                        "-P",
                        "/static",
                    ]),
                ]
                .concat(),
                kubeconfig: kc_token.clone(),
            },
            table(TRICKY_PATHS, &["GET"], &HOSTS[..1]),
        ),
        (
            Setup {
                name: "api-prefix",
                flags: [vec![p0.clone()], s(&["--api-prefix=/api/"])].concat(),
                kubeconfig: kc_token.clone(),
            },
            table(TRICKY_PATHS, &["GET"], &HOSTS[..1]),
        ),
        (
            Setup {
                name: "filters",
                flags: [
                    vec![p0.clone()],
                    s(&[
                        "--accept-paths=^/api/v1/namespaces/.*,^/apis/",
                        "--reject-paths=^/api/v1/namespaces/kube-system",
                        "--reject-methods=POST,PUT",
                        "--accept-hosts=.*",
                    ]),
                ]
                .concat(),
                kubeconfig: kc_token.clone(),
            },
            table(
                &TRICKY_PATHS[..16],
                &["GET", "POST", "PUT", "DELETE"],
                &[Some("evil.example.com:{port}")],
            ),
        ),
        (
            Setup {
                name: "disable-filter",
                flags: [
                    vec![p0.clone()],
                    s(&[
                        "--disable-filter",
                        "--api-prefix=/k8s-api",
                        "--address=127.0.0.1",
                    ]),
                ]
                .concat(),
                kubeconfig: kc_token.clone(),
            },
            table(
                &[
                    "/k8s-api/v1/pods",
                    "/k8s-api/api/v1/namespaces/x/pods/y/exec",
                    "/k8s-api",
                    "/api/v1",
                ],
                &["GET", "POST"],
                &HOSTS[3..],
            ),
        ),
        (
            Setup {
                name: "unix-socket",
                flags: vec![format!("--unix-socket={}", sock.display())],
                kubeconfig: kc_token.clone(),
            },
            table(
                &TRICKY_PATHS[..14],
                &["GET"],
                &[Some("localhost:8001"), Some("localhost")],
            ),
        ),
        (
            Setup {
                name: "append-server-path",
                flags: [vec![p0.clone()], s(&["--append-server-path"])].concat(),
                kubeconfig: kc_base.clone(),
            },
            table(&TRICKY_PATHS[..14], &["GET"], &HOSTS[..1]),
        ),
        (
            Setup {
                name: "no-append",
                flags: [vec![p0.clone()], s(&["--append-server-path=false"])].concat(),
                kubeconfig: kc_base.clone(),
            },
            table(&TRICKY_PATHS[..6], &["GET"], &HOSTS[..1]),
        ),
        (
            Setup {
                name: "client-cert",
                flags: [vec![p0.clone()], s(&["--keepalive=30s"])].concat(),
                kubeconfig: kc_cert.clone(),
            },
            table(&TRICKY_PATHS[..6], &["GET", "POST"], &HOSTS[..1]),
        ),
        (
            Setup {
                name: "override-flags",
                flags: [
                    vec![p0.clone()],
                    vec![
                        format!("--server={server}"),
                        "--token=flag-token".into(),
                        format!("--certificate-authority={}", certs.join("ca.crt").display()),
                        format!("--client-certificate={}", certs.join("agent.crt").display()),
                        format!("--client-key={}", certs.join("agent.key").display()),
                        "--namespace=default".into(),
                    ],
                ]
                .concat(),
                kubeconfig: kc_none.clone(),
            },
            table(&TRICKY_PATHS[..6], &["GET"], &HOSTS[..1]),
        ),
        (
            Setup {
                name: "insecure",
                flags: [
                    vec![p0.clone()],
                    vec![
                        format!("--server={server}"),
                        "--insecure-skip-tls-verify".into(),
                        "--token=t3".into(),
                    ],
                ]
                .concat(),
                kubeconfig: kc_none.clone(),
            },
            table(&TRICKY_PATHS[..4], &["GET"], &HOSTS[..1]),
        ),
        (
            Setup {
                name: "context-select",
                flags: [
                    vec![p0.clone()],
                    s(&["--context=test", "--cluster=test", "--user=test"]),
                ]
                .concat(),
                kubeconfig: kc_token.clone(),
            },
            table(&TRICKY_PATHS[..4], &["GET"], &HOSTS[..1]),
        ),
        (
            Setup {
                name: "http2-upstream",
                flags: vec![p0.clone()],
                kubeconfig: kc_h2.clone(),
            },
            {
                let mut t = table(&TRICKY_PATHS[..20], &["GET", "POST", "HEAD"], &HOSTS[..1]);
                t.extend(header_cases());
                t.extend(table(&["/gzip"], &["GET"], &HOSTS[..1]));
                t
            },
        ),
        (
            Setup {
                name: "upstream-down",
                flags: vec![p0.clone(), "--token=t4".into()],
                kubeconfig: kc_none.clone(),
            },
            table(&TRICKY_PATHS[..3], &["GET"], &HOSTS[..1]),
        ),
    ];

    let mut failures = Vec::new();
    let mut total = 0;
    for (setup, reqs) in &setups {
        eprintln!("setup {}", setup.name);
        let pair = start_pair(&env, &kubectl, setup);
        let (n, reached) = compare(&pair, setup, reqs, &mut failures);
        total += n;
        if setup.name == "upstream-down" {
            assert_eq!(reached, 0, "[{}] reached a dead upstream?", setup.name);
        } else {
            assert!(
                reached > 0,
                "[{}] none of {n} requests reached the upstream",
                setup.name
            );
            eprintln!(
                "[{}] {n} requests, {reached} reached the upstream",
                setup.name
            );
        }
        drop(pair);
    }
    eprintln!("{total} requests compared, {} differ", failures.len());
    if !failures.is_empty() {
        eprintln!(
            "logs in {} (KEEP_TEST_DIR=1 keeps them)",
            env.dir.path().display()
        );
    }
    assert!(total >= 300, "only {total} requests in the table");
    assert!(
        failures.is_empty(),
        "{} of {total} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
