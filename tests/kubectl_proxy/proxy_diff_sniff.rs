//! `Content-Type` of upstream answers that carry none, against the real
//! `kubectl proxy` (issue 14): Go's server under kubectl's `ReverseProxy`
//! adds `http.DetectContentType` of the first body bytes to an answer of
//! known length without `Content-Type` or `Content-Encoding`, and to none
//! of: HEAD answers, empty bodies, 204, chunked or gunzipped answers, an
//! answer whose `Content-Type` is present but empty.
//!
//! The upstream is a scripted plain-HTTP server writing each answer byte
//! for byte (thread per connection, keep-alive).

use crate::support;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;

use support::http_raw::{exchange, read_request, Endpoint, Response};
use support::proxy_proc::{kubectl, kubectl_cmd, ours_cmd, start};
use support::Env;

const HTML: &[u8] = b"<html><body>hi there";

fn gzipped(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// The upstream's answer to `target` (head and body, as bytes).
fn answer(method: &str, target: &str) -> Vec<u8> {
    let with = |head: &str, body: &[u8]| {
        let mut out = format!("HTTP/1.1 {head}Content-Length: {}\r\n\r\n", body.len()).into_bytes();
        if method != "HEAD" {
            out.extend_from_slice(body);
        }
        out
    };
    match target {
        "/html" => with("200 OK\r\n", HTML),
        "/empty" => with("200 OK\r\n", b""),
        "/ctempty" => with("200 OK\r\nContent-Type:\r\n", HTML),
        "/ce" => with("200 OK\r\nContent-Encoding: br\r\n", HTML),
        "/ceempty" => with("200 OK\r\nContent-Encoding:\r\n", b"%PDF-1.4 x"),
        "/gz" => with("200 OK\r\nContent-Encoding: gzip\r\n", &gzipped(HTML)),
        "/404" => with("404 Not Found\r\n", b"{}x"),
        "/png" => with("200 OK\r\n", b"\x89PNG\r\n\x1a\n"),
        "/bin" => with("200 OK\r\n", &[0u8, 1, 2, 3, 4, 5]),
        "/big" => with("200 OK\r\n", &b"plain text, ".repeat(2000)),
        "/204" => b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
        "/chunked" => {
            if method == "HEAD" {
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec()
            } else {
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n<html>\r\n0\r\n\r\n"
                    .to_vec()
            }
        }
        _ => with("200 OK\r\nContent-Type: application/json\r\n", b"{}"),
    }
}

fn scripted_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            thread::spawn(move || serve(s));
        }
    });
    addr
}

fn serve(s: TcpStream) {
    let mut w = s.try_clone().expect("clone");
    let mut r = BufReader::new(s);
    while let Some((method, target, _)) = read_request(&mut r) {
        if w.write_all(&answer(&method, &target)).is_err() {
            return;
        }
    }
}

fn kubeconfig(env: &Env, upstream: SocketAddr) -> std::path::PathBuf {
    let p = env.path("kubeconfig-sniff");
    std::fs::write(
        &p,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{upstream}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )
    .expect("write kubeconfig");
    p
}

/// What a client sees of one answer: status, Content-Type, body.
fn seen(ep: &Endpoint, method: &str, path: &str, gzip: bool) -> (u16, Option<String>, Vec<u8>) {
    let ae = if gzip {
        "Accept-Encoding: gzip\r\n"
    } else {
        ""
    };
    let raw = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: t\r\n{ae}\r\n");
    let r: Response = exchange(ep, raw.as_bytes(), method).expect("exchange");
    (
        r.status,
        r.header("content-type").map(str::to_string),
        r.body,
    )
}

#[test]
fn sniffed_content_type_matches_kubectl() {
    let env = Env::new();
    let up = scripted_upstream();
    let kc = kubeconfig(&env, up);
    let ours = start(
        ours_cmd(&kc, &["--port=0".to_string()]),
        env.path("sniff-ours.log"),
    );
    let go = start(
        kubectl_cmd(&kubectl(), &kc, &["--port=0".to_string()]),
        env.path("sniff-kubectl.log"),
    );
    let paths = [
        "/html", "/empty", "/ctempty", "/ce", "/ceempty", "/gz", "/404", "/png", "/bin", "/big",
        "/204", "/chunked", "/json",
    ];
    let mut diffs = Vec::new();
    let mut sniffed = 0;
    for path in paths {
        for method in ["GET", "HEAD"] {
            for gzip in [false, true] {
                let want = seen(&go.ep, method, path, gzip);
                let got = seen(&ours.ep, method, path, gzip);
                if want.1.is_some() && path != "/json" && path != "/ctempty" {
                    sniffed += 1;
                }
                if want != got {
                    diffs.push(format!(
                        "{method} {path} gzip={gzip}: kubectl {:?} {:?}, ours {:?} {:?}",
                        want.0, want.1, got.0, got.1
                    ));
                }
            }
        }
    }
    assert_eq!(diffs, Vec::<String>::new());
    // The comparison covered answers kubectl does sniff.
    assert!(sniffed >= 8, "kubectl sniffed only {sniffed} answers");
}
