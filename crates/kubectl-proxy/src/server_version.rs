//! `--match-server-version`: the check kubectl makes before it serves
//! (client-go discovery `MatchesServerVersion`): GET `/version?timeout=32s`,
//! then GitVersion, GitCommit and GitTreeState of the server must equal the
//! client's, else `server version (%#v) differs from client version (%#v)`
//! with both `version.Info` values in Go syntax; a failed read is
//! `couldn't read version from server: ...`.
//!
//! edgetunnel emulates kubectl [`EMULATED`] (v1.32.4, the release whose
//! behaviour the proxy copies) as its client version. The check runs once at
//! start on the calling thread (blocking I/O, before any core serves).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::upstream_config::Upstream;

/// k8s.io/apimachinery/pkg/version.Info as kubectl 1.32 has it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Info {
    pub major: String,
    pub minor: String,
    pub git_version: String,
    pub git_commit: String,
    pub git_tree_state: String,
    pub build_date: String,
    pub go_version: String,
    pub compiler: String,
    pub platform: String,
}

/// The kubectl release edgetunnel proxy emulates (its `version.Get()`).
pub fn emulated() -> Info {
    Info {
        major: "1".into(),
        minor: "32".into(),
        git_version: EMULATED.into(),
        git_commit: "59526cd4867447956156ae3a602fcbac10a2c335".into(),
        git_tree_state: "clean".into(),
        build_date: "2025-04-22T16:03:58Z".into(),
        go_version: "go1.23.6".into(),
        compiler: "gc".into(),
        platform: format!("linux/{}", go_arch()),
    }
}

/// The emulated kubectl's GitVersion.
pub const EMULATED: &str = "v1.32.4";

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

/// Go's `%q` of a string (what `%#v` prints for string fields).
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Info {
    /// `%#v` of a `version.Info` (pointer: `&version.Info{...}`).
    pub fn go_syntax(&self, pointer: bool) -> String {
        format!(
            "{}version.Info{{Major:{}, Minor:{}, GitVersion:{}, GitCommit:{}, GitTreeState:{}, BuildDate:{}, GoVersion:{}, Compiler:{}, Platform:{}}}",
            if pointer { "&" } else { "" },
            go_quote(&self.major),
            go_quote(&self.minor),
            go_quote(&self.git_version),
            go_quote(&self.git_commit),
            go_quote(&self.git_tree_state),
            go_quote(&self.build_date),
            go_quote(&self.go_version),
            go_quote(&self.compiler),
            go_quote(&self.platform),
        )
    }
}

/// The verdict on a `/version` body, as `MatchesServerVersion` words it.
pub fn check_body(client: &Info, body: &[u8]) -> Result<(), String> {
    let server: Info = serde_json::from_slice(body).map_err(|e| {
        format!(
            "couldn't read version from server: unable to parse the server version: {}",
            go_json_error(&e, body)
        )
    })?;
    if server.git_version != client.git_version
        || server.git_commit != client.git_commit
        || server.git_tree_state != client.git_tree_state
    {
        return Err(format!(
            "server version ({}) differs from client version ({})",
            server.go_syntax(true),
            client.go_syntax(false)
        ));
    }
    Ok(())
}

/// encoding/json's wording for the common syntax errors.
fn go_json_error(e: &serde_json::Error, body: &[u8]) -> String {
    let trimmed = body.iter().position(|b| !b.is_ascii_whitespace());
    match trimmed {
        None => "unexpected end of JSON input".into(),
        Some(i)
            if !matches!(
                body[i],
                b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'
            ) =>
        {
            format!(
                "invalid character {} looking for beginning of value",
                go_char(body[i])
            )
        }
        _ => e.to_string(),
    }
}

fn go_char(b: u8) -> String {
    match b {
        b'\'' => "'\\''".into(),
        b'"' => "'\"'".into(),
        0x20..=0x7e => format!("'{}'", b as char),
        _ => format!("'\\x{b:02x}'"),
    }
}

/// Reads `/version` from the upstream and checks it (start-up only).
/// `auth` is the `Authorization` value to send (a refreshed token already
/// fetched by the caller).
pub fn check(
    upstream: &Upstream,
    addrs: &[SocketAddr],
    auth: Option<String>,
) -> Result<(), String> {
    let scheme = if upstream.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let target = format!("{}/version?timeout=32s", upstream.base_path);
    let url = format!("{scheme}://{}{target}", upstream.host_header);
    let body = fetch(upstream, addrs, &target, auth)
        .map_err(|e| format!("couldn't read version from server: Get \"{url}\": {e}"))?;
    check_body(&emulated(), &body)
}

fn fetch(
    upstream: &Upstream,
    addrs: &[SocketAddr],
    target: &str,
    auth: Option<String>,
) -> Result<Vec<u8>, String> {
    let mut last = String::from("no address");
    let mut tcp = None;
    for a in addrs {
        match TcpStream::connect_timeout(a, Duration::from_secs(30)) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = format!("dial tcp {a}: connect: {}", super::io::go_error_text(&e)),
        }
    }
    let mut tcp = tcp.ok_or(last)?;
    if let Some(p) = &upstream.proxy {
        let (host, port) = upstream.target_host_port();
        super::proxy_dial::through_proxy_blocking(&mut tcp, p, host, port, upstream.tls.is_some())?;
    }
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(32)));
    let forward = upstream.forward_proxy();
    let target = match forward {
        Some(_) => format!("http://{}{target}", upstream.host_header),
        None => target.to_string(),
    };
    let mut req = format!(
        "GET {target} HTTP/1.1\r\nHost: {}\r\nUser-Agent: kubectl/{EMULATED} (linux/{}) kubernetes/edgetunnel\r\nAccept: application/json, */*\r\nConnection: close\r\n",
        upstream.host_header,
        go_arch()
    );
    if let Some(auth) = auth {
        req.push_str(&format!("Authorization: {auth}\r\n"));
    }
    if let Some(a) = forward.and_then(|p| p.basic_auth()) {
        req.push_str(&format!("Proxy-Authorization: {a}\r\n"));
    }
    for (name, value) in upstream.impersonation.fields(None).1 {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    let mut raw = Vec::new();
    match &upstream.tls {
        Some(cfg) => {
            let name = rustls::pki_types::ServerName::try_from(upstream.server_name.clone())
                .map_err(|e| e.to_string())?;
            let conn =
                rustls::ClientConnection::new(Arc::clone(cfg), name).map_err(|e| e.to_string())?;
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
            read_to_end_lenient(&mut s, &mut raw)?;
        }
        None => {
            let mut s = tcp;
            s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
            read_to_end_lenient(&mut s, &mut raw)?;
        }
    }
    body_of(&raw)
}

/// Reads one whole answer: until its Content-Length is in, its last
/// chunk, or the peer closes (a TLS peer closing without close_notify is
/// fine).
fn read_to_end_lenient(s: &mut impl Read, out: &mut Vec<u8>) -> Result<(), String> {
    let mut buf = [0u8; 8192];
    loop {
        if answer_complete(out) {
            return Ok(());
        }
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {
                return Ok(())
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Whether `raw` holds a whole answer framed by length or chunks.
fn answer_complete(raw: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(n)) = resp.parse(raw) else {
        return false;
    };
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let len: usize = String::from_utf8_lossy(h.value).trim().parse().unwrap_or(0);
            return raw.len() >= n + len;
        }
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return raw[n..].ends_with(b"0\r\n\r\n");
        }
    }
    false
}

/// The body of a whole HTTP/1.1 answer (Content-Length, chunked or close).
fn body_of(raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err("malformed HTTP response".into()),
    };
    let status = resp.code.unwrap_or(0);
    let chunked = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            && String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("chunked")
    });
    let rest = &raw[n..];
    let body = if chunked {
        let mut out = Vec::new();
        let mut at = rest;
        while let Some(eol) = at.windows(2).position(|w| w == b"\r\n") {
            let size_text = String::from_utf8_lossy(&at[..eol]);
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| "malformed chunked encoding".to_string())?;
            if size == 0 || at.len() < eol + 2 + size {
                break;
            }
            out.extend_from_slice(&at[eol + 2..eol + 2 + size]);
            at = &at[(eol + 4 + size).min(at.len())..];
        }
        out
    } else {
        rest.to_vec()
    };
    if !(200..300).contains(&status) {
        // client-go turns a failed answer into a StatusError; its text for
        // an answer that is not a Status object is the body.
        return Err(format!(
            "the server responded with status {status}: {}",
            String::from_utf8_lossy(&body).trim()
        ));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatch_is_worded_as_client_go() {
        let client = Info {
            major: "1".into(),
            minor: "32+".into(),
            git_version: "v1.32.4-x".into(),
            ..Default::default()
        };
        let e = check_body(&client, br#"{"gitVersion":"v1","major":"1"}"#).unwrap_err();
        assert_eq!(
            e,
            "server version (&version.Info{Major:\"1\", Minor:\"\", GitVersion:\"v1\", GitCommit:\"\", GitTreeState:\"\", BuildDate:\"\", GoVersion:\"\", Compiler:\"\", Platform:\"\"}) differs from client version (version.Info{Major:\"1\", Minor:\"32+\", GitVersion:\"v1.32.4-x\", GitCommit:\"\", GitTreeState:\"\", BuildDate:\"\", GoVersion:\"\", Compiler:\"\", Platform:\"\"})"
        );
        // Only the three git fields count.
        assert!(check_body(&client, br#"{"gitVersion":"v1.32.4-x","major":"9"}"#).is_ok());
        let e = check_body(&client, b"xx").unwrap_err();
        assert_eq!(e, "couldn't read version from server: unable to parse the server version: invalid character 'x' looking for beginning of value");
    }

    #[test]
    fn go_quoting() {
        assert_eq!(go_quote("a\"b\\\n\x01"), "\"a\\\"b\\\\\\n\\x01\"");
    }

    #[test]
    fn bodies() {
        assert_eq!(
            body_of(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap(),
            b"{}"
        );
        assert_eq!(
            body_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
                .unwrap(),
            b"{}"
        );
        assert!(body_of(b"HTTP/1.1 500 x\r\n\r\nboom").is_err());
        assert!(answer_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        ));
        assert!(!answer_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{"
        ));
        assert!(!answer_complete(b"HTTP/1.1 200 OK\r\n\r\n{}"));
    }
}
