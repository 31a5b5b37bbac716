//! Differential tests of `--www` static files: the real `kubectl proxy
//! --www` (Go's `http.FileServer`) and `edgetunnel proxy --www` serve the
//! same directory and get the same requests: conditional headers in all
//! three date formats, single, multiple and unsatisfiable ranges, MIME
//! types from the extension (built-in and system tables) and by sniffing,
//! directory listings and redirects, GET/HEAD/POST. Status, headers (all
//! but Date; the multipart boundary normalised) and bodies must match.
//!
//! `DIFF_STATIC_BIN=/path/to/edgetunnel` runs another build as "ours"
//! (to check the test fails on an older build).
#![allow(unsafe_code)] // system calls the test/bench harness makes directly

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use support::apiserver;
use support::http_raw::{exchange, Response};
use support::proxy_proc::{kubectl, kubectl_cmd, start};
use support::{Env, BIN};

/// Modification time of every served file: Tue, 02 Jan 2024 03:04:05 GMT.
const MTIME: u64 = 1_704_164_645;
const DATE_IMF: &str = "Tue, 02 Jan 2024 03:04:05 GMT";
const DATE_850: &str = "Tuesday, 02-Jan-24 03:04:05 GMT";
const DATE_ASC: &str = "Tue Jan  2 03:04:05 2024";
const BEFORE_IMF: &str = "Tue, 02 Jan 2024 03:04:04 GMT";
const AFTER_850: &str = "Tuesday, 02-Jan-24 03:04:06 UTC";

fn set_mtime(p: &Path) {
    let t = UNIX_EPOCH + Duration::from_secs(MTIME);
    let f = std::fs::File::options().read(true).open(p).unwrap();
    f.set_modified(t).unwrap();
}

/// The served tree; names cover built-in, system and sniffed types.
fn www(env: &Env) -> PathBuf {
    let d = env.path("www");
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.txt", b"hello world, this is a test file\n".to_vec()),
        ("page.html", b"<p>page</p>".to_vec()),
        ("UPPER.HTML", b"<p>upper</p>".to_vec()),
        ("data.JSON", b"{}".to_vec()),
        ("style.css", b"a{}".to_vec()),
        ("script.py", b"print(1)\n".to_vec()),
        ("archive.tar.gz", b"\x1f\x8b\x08\x00rest".to_vec()),
        ("notes.md", b"# notes\n".to_vec()),
        ("weird.zzqq", b"unknown ext text".to_vec()),
        (".hidden", b"dot file".to_vec()),
        ("empty", Vec::new()),
        ("plain", b"just some text".to_vec()),
        ("binary", b"\x00\x01\x02\x03\x04".to_vec()),
        ("html-sniff", b"  <HTML><body>x</body></html>".to_vec()),
        ("xml-sniff", b"\n<?xml version=\"1.0\"?><a/>".to_vec()),
        ("png-sniff", b"\x89PNG\r\n\x1a\n0000".to_vec()),
        ("gif-sniff", b"GIF89a....".to_vec()),
        ("pdf-sniff", b"%PDF-1.4 ...".to_vec()),
        ("zip-sniff", b"PK\x03\x04....".to_vec()),
        ("bom-sniff", b"\xEF\xBB\xBFbom text".to_vec()),
        ("utf16-sniff", b"\xFF\xFEh\x00i\x00".to_vec()),
        ("wasm-sniff", b"\x00asm\x01\x00\x00\x00".to_vec()),
        (
            "mp4-sniff",
            b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom<\x06t\xbfmdat".to_vec(),
        ),
        (
            "big.bin",
            (0..200_000u32).map(|i| (i % 251) as u8).collect(),
        ),
        ("sub/index.html", b"<h1>index</h1>".to_vec()),
        ("list/one.txt", b"1".to_vec()),
        ("list/a b.txt", b"2".to_vec()),
        ("list/q?x", b"3".to_vec()),
        ("list/h#1", b"4".to_vec()),
        ("list/c:d", b"5".to_vec()),
        ("list/<tag>&", b"6".to_vec()),
        ("list/deeper/x.txt", b"7".to_vec()),
    ];
    for (name, data) in &files {
        let p = d.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    for (name, _) in &files {
        set_mtime(&d.join(name));
    }
    for dir in ["sub", "list/deeper", "list", ""] {
        set_mtime(&d.join(dir));
    }
    d
}

struct Req {
    method: &'static str,
    target: String,
    headers: Vec<(&'static str, String)>,
}

fn req(method: &'static str, target: &str, headers: &[(&'static str, &str)]) -> Req {
    Req {
        method,
        target: target.to_string(),
        headers: headers.iter().map(|(n, v)| (*n, v.to_string())).collect(),
    }
}

impl Req {
    fn raw(&self) -> Vec<u8> {
        let mut s = format!(
            "{} {} HTTP/1.1\r\nHost: localhost\r\n",
            self.method, self.target
        );
        for (n, v) in &self.headers {
            s.push_str(&format!("{n}: {v}\r\n"));
        }
        if self.method == "POST" {
            s.push_str("Content-Length: 0\r\n");
        }
        s.push_str("\r\n");
        s.into_bytes()
    }
}

/// Status, headers without Date (sorted) and body, the multipart boundary
/// replaced by a marker after checking it has Go's form (60 hex digits).
fn view(r: &Response) -> String {
    let mut headers: Vec<(String, String)> = r
        .headers
        .iter()
        .filter(|(n, _)| n != "date")
        .cloned()
        .collect();
    let mut body = r.body.clone();
    for (_, v) in headers.iter_mut() {
        if let Some(b) = v.strip_prefix("multipart/byteranges; boundary=") {
            let b = b.to_string();
            assert!(
                b.len() == 60 && b.bytes().all(|c| c.is_ascii_hexdigit()),
                "boundary {b:?}"
            );
            *v = "multipart/byteranges; boundary=B".into();
            body = String::from_utf8_lossy(&body).replace(&b, "B").into_bytes();
        }
    }
    headers.sort();
    format!(
        "{} {:?} body[{}]={:?}",
        r.status,
        headers,
        body.len(),
        String::from_utf8_lossy(&body[..body.len().min(400)])
    )
}

fn cases() -> Vec<Req> {
    let mut out = Vec::new();
    let files = [
        "a.txt",
        "page.html",
        "UPPER.HTML",
        "data.JSON",
        "style.css",
        "script.py",
        "archive.tar.gz",
        "notes.md",
        "weird.zzqq",
        ".hidden",
        "empty",
        "plain",
        "binary",
        "html-sniff",
        "xml-sniff",
        "png-sniff",
        "gif-sniff",
        "pdf-sniff",
        "zip-sniff",
        "bom-sniff",
        "utf16-sniff",
        "wasm-sniff",
        "mp4-sniff",
        "big.bin",
    ];
    for f in files {
        for m in ["GET", "HEAD"] {
            out.push(req(m, &format!("/s/{f}"), &[]));
        }
    }
    // Directories, index pages, redirects, listings.
    for t in [
        "/s/",
        "/s/sub",
        "/s/sub/",
        "/s/sub/index.html",
        "/s/index.html",
        "/s/list",
        "/s/list/",
        "/s/list/deeper/",
        "/s/a.txt/",
        "/s/list/?q=1",
        "/s/sub?x=y",
        "/s/missing",
        "/s/list/q%3Fx",
        "/s/list/h%231",
        "/s/list/a%20b.txt",
    ] {
        out.push(req("GET", t, &[]));
        out.push(req("HEAD", t, &[]));
    }
    out.push(req("GET", "/s/list/", &[("If-Modified-Since", DATE_IMF)]));
    out.push(req("GET", "/s/list/", &[("If-Modified-Since", BEFORE_IMF)]));
    out.push(req("GET", "/s/list/", &[("If-None-Match", "*")]));
    // Ranges.
    for r in [
        "bytes=0-3",
        "bytes=5-",
        "bytes=-5",
        "bytes=-0",
        "bytes=-100",
        "bytes=0-1000",
        "bytes=0-3,5-7",
        "bytes=0-0,-1,10-12",
        "bytes=1-2,1-2",
        "bytes=100-",
        "bytes=100-,200-",
        "bytes=100-,0-1",
        "bytes=3-2",
        "bytes=x-y",
        "bytes=",
        "bytes= 1 - 2 , ",
        "bytes=+1-+2",
        "bytes=--1",
        "items=0-1",
        "bytes=0-10,0-10,0-10,0-10",
    ] {
        out.push(req("GET", "/s/a.txt", &[("Range", r)]));
    }
    out.push(req("HEAD", "/s/a.txt", &[("Range", "bytes=0-3,5-7")]));
    out.push(req("GET", "/s/empty", &[("Range", "bytes=0-")]));
    out.push(req("GET", "/s/empty", &[("Range", "bytes=-5")]));
    out.push(req("GET", "/s/big.bin", &[("Range", "bytes=70000-140000")]));
    out.push(req("GET", "/s/big.bin", &[("Range", "bytes=0-99,199900-")]));
    out.push(req("GET", "/s/binary", &[("Range", "bytes=0-1,3-")]));
    // If-Range with dates in the three formats, entity tags, junk.
    for ir in [
        DATE_IMF, DATE_850, DATE_ASC, BEFORE_IMF, "\"etag\"", "W/\"w\"", "junk",
    ] {
        out.push(req(
            "GET",
            "/s/a.txt",
            &[("Range", "bytes=0-3"), ("If-Range", ir)],
        ));
    }
    // If-Match, If-Unmodified-Since, If-None-Match, If-Modified-Since.
    let dates = [
        DATE_IMF, DATE_850, DATE_ASC, BEFORE_IMF, AFTER_850, "garbage",
    ];
    for m in ["GET", "HEAD", "POST"] {
        for im in ["*", "\"x\"", "\"x\", *", "junk", " , "] {
            out.push(req(m, "/s/a.txt", &[("If-Match", im)]));
        }
        for d in dates {
            out.push(req(m, "/s/a.txt", &[("If-Unmodified-Since", d)]));
            out.push(req(m, "/s/a.txt", &[("If-Modified-Since", d)]));
        }
        for inm in ["*", "\"x\"", "W/\"x\", *", "junk"] {
            out.push(req(m, "/s/a.txt", &[("If-None-Match", inm)]));
        }
    }
    // Combinations whose precedence matters.
    out.push(req(
        "GET",
        "/s/a.txt",
        &[("If-None-Match", "\"x\""), ("If-Modified-Since", DATE_IMF)],
    ));
    out.push(req(
        "GET",
        "/s/a.txt",
        &[("If-Match", "*"), ("If-Unmodified-Since", BEFORE_IMF)],
    ));
    out.push(req(
        "GET",
        "/s/a.txt",
        &[("If-Unmodified-Since", DATE_ASC), ("If-None-Match", "*")],
    ));
    out.push(req(
        "GET",
        "/s/a.txt",
        &[
            ("If-Modified-Since", BEFORE_IMF),
            ("Range", "bytes=0-1,4-5"),
        ],
    ));
    // Lenient date parsing as Go's time.Parse.
    for d in [
        "tue, 02 jan 2024 03:04:05 GMT",
        "Tue,   02 Jan 2024 3:04:05 GMT",
        "Tue, 02 Jan 2024 03:04:05.999 GMT",
        "Tue, 2 Jan 2024 03:04:05 GMT",
        "Tue, 02 Jan 2024 03:04:05 UTC",
        "Tuesday, 02-Jan-24 03:04:05 PST",
        "Tuesday, 02-Jan-24 03:04:05 GMT+5",
        "Tue Jan 2 03:04:05 2024",
        "Tue, 31 Feb 2024 03:04:05 GMT",
    ] {
        out.push(req("GET", "/s/a.txt", &[("If-Modified-Since", d)]));
    }
    out
}

fn ours_cmd(kubeconfig: &Path, flags: &[String]) -> Command {
    let bin = std::env::var_os("DIFF_STATIC_BIN").unwrap_or_else(|| BIN.into());
    let mut c = Command::new(bin);
    c.arg("proxy")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(flags)
        .env("EDGETUNNEL_LOG", "warn");
    c
}

#[test]
fn static_files_match_kubectl() {
    let kubectl = kubectl();
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let kc = env.path("kc.yaml");
    apiserver::kubeconfig(
        &kc,
        &format!("https://127.0.0.1:{}", api.addr.port()),
        &certs,
        Some("tok"),
        false,
    );
    let root = www(&env);
    let flags = vec![
        "--port=0".to_string(),
        format!("--www={}", root.display()),
        "--www-prefix=/s/".to_string(),
    ];
    let go = start(kubectl_cmd(&kubectl, &kc, &flags), env.path("kubectl.log"));
    let ours = start(ours_cmd(&kc, &flags), env.path("ours.log"));

    let mut failures = Vec::new();
    let mut statuses = std::collections::BTreeMap::new();
    let reqs = cases();
    for r in &reqs {
        let g = exchange(&go.ep, &r.raw(), r.method).map(|x| view(&x));
        let o = exchange(&ours.ep, &r.raw(), r.method).map(|x| view(&x));
        let (g, o) = (format!("{g:?}"), format!("{o:?}"));
        *statuses
            .entry(g.get(4..7).unwrap_or("?").to_string())
            .or_insert(0) += 1;
        if g != o {
            failures.push(format!(
                "{} {} {:?}\n   kubectl: {g}\n   ours:    {o}",
                r.method, r.target, r.headers
            ));
        }
    }
    // The table must exercise every answer kind, not only 200s.
    for s in ["200", "206", "301", "304", "404", "412", "416"] {
        assert!(statuses.contains_key(s), "no {s} answer in {statuses:?}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} requests differ:\n{}",
        failures.len(),
        reqs.len(),
        failures.join("\n")
    );
}

/// A file whose open blocks (a FIFO without a writer) must not stall the
/// core: with one worker, other static and proxied requests still get
/// answers while that request waits. Fails when files are opened or read
/// on the data-plane core.
#[test]
fn a_blocking_file_does_not_stall_the_core() {
    let env = Env::new();
    let certs = env.certs();
    let api = apiserver::start(&certs);
    let kc = env.path("kc.yaml");
    apiserver::kubeconfig(
        &kc,
        &format!("https://127.0.0.1:{}", api.addr.port()),
        &certs,
        Some("tok"),
        false,
    );
    let root = env.path("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.txt"), "fine\n").unwrap();
    let fifo = root.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let flags = vec![
        "--port=0".to_string(),
        "--workers=1".to_string(),
        format!("--www={}", root.display()),
        "--www-prefix=/s/".to_string(),
    ];
    let ours = start(ours_cmd(&kc, &flags), env.path("ours.log"));
    let mut stuck = ours.ep.connect();
    std::io::Write::write_all(
        &mut *stuck,
        b"GET /s/fifo HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The fifo's open never returns while no writer opens it: a request
    // queued behind it would get no answer at all (exchange's read times
    // out and the test fails), so no clock is needed to tell them apart.
    for target in ["/s/a.txt", "/api/v1/pods"] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let r = exchange(&ours.ep, raw.as_bytes(), "GET")
            .unwrap_or_else(|e| panic!("{target}: no answer while a file open blocks: {e}"));
        assert_eq!(r.status, 200, "{target}");
    }
    // Let the blocked open finish so the pool thread is released.
    let _writer = std::fs::File::options().write(true).open(&fifo).unwrap();
    drop(stuck);
}
