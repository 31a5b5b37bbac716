//! A raw HTTP/1.1 client for the proxy tests: sends exactly the bytes a
//! test writes (tricky targets, odd Host headers) and reads one response.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

pub(crate) trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

impl Endpoint {
    pub(crate) fn parse(shown: &str) -> Endpoint {
        match shown.parse() {
            Ok(a) => Endpoint::Tcp(a),
            Err(_) => Endpoint::Unix(PathBuf::from(shown)),
        }
    }

    pub(crate) fn connect(&self) -> Box<dyn Stream> {
        match self {
            Endpoint::Tcp(a) => {
                let s = TcpStream::connect(a).expect("connect proxy");
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                Box::new(s)
            }
            Endpoint::Unix(p) => {
                let s = UnixStream::connect(p).expect("connect proxy socket");
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                Box::new(s)
            }
        }
    }

    pub(crate) fn port(&self) -> u16 {
        match self {
            Endpoint::Tcp(a) => a.port(),
            Endpoint::Unix(_) => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    pub status: u16,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response from `s` (to a request with `method`). Bytes read
/// past it are lost: use [`read_response_from`] on a pipelined connection.
pub(crate) fn read_response(s: &mut dyn Stream, method: &str) -> std::io::Result<Response> {
    read_response_from(s, &mut Vec::new(), method)
}

/// Reads one response, starting with the bytes in `carry` and leaving any
/// bytes of later responses there.
pub(crate) fn read_response_from(
    s: &mut dyn Stream,
    carry: &mut Vec<u8>,
    method: &str,
) -> std::io::Result<Response> {
    let mut buf = std::mem::take(carry);
    let mut tmp = [0u8; 16384];
    let (status, headers, mut rest) = loop {
        let mut hs = [httparse::EMPTY_HEADER; 128];
        let mut r = httparse::Response::new(&mut hs);
        if let Ok(httparse::Status::Complete(n)) = r.parse(&buf) {
            let headers: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            break (r.code.unwrap_or(0), headers, buf[n..].to_vec());
        }
        let n = s.read(&mut tmp)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "EOF before response head: {:?}",
                    String::from_utf8_lossy(&buf)
                ),
            ));
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let no_body =
        method == "HEAD" || status == 204 || status == 304 || (100..200).contains(&status);
    let body = if no_body {
        // What follows (a 1xx's final answer, a pipelined answer) is kept.
        *carry = std::mem::take(&mut rest);
        Vec::new()
    } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut out = Vec::new();
        loop {
            // Ensure a full size line.
            while !rest.windows(2).any(|w| w == b"\r\n") {
                let n = s.read(&mut tmp)?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                rest.extend_from_slice(&tmp[..n]);
            }
            let pos = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let line = String::from_utf8_lossy(&rest[..pos]).to_string();
            let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk line {line:?}")))?;
            rest.drain(..pos + 2);
            while rest.len() < size + 2 {
                let n = s.read(&mut tmp)?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                rest.extend_from_slice(&tmp[..n]);
            }
            if size == 0 {
                rest.drain(..2);
                *carry = std::mem::take(&mut rest);
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest.drain(..size + 2);
        }
        out
    } else if let Some(cl) = get("content-length") {
        let n: usize = cl.trim().parse().unwrap_or(0);
        while rest.len() < n {
            let k = s.read(&mut tmp)?;
            if k == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            rest.extend_from_slice(&tmp[..k]);
        }
        *carry = rest.split_off(n);
        rest
    } else {
        loop {
            let k = s.read(&mut tmp)?;
            if k == 0 {
                break;
            }
            rest.extend_from_slice(&tmp[..k]);
        }
        rest
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// Sends `raw` on a new connection and reads one response.
pub(crate) fn exchange(ep: &Endpoint, raw: &[u8], method: &str) -> std::io::Result<Response> {
    let mut s = ep.connect();
    s.write_all(raw)?;
    read_response(&mut *s, method)
}

/// Reads one HTTP/1.1 request from a test server's connection: method,
/// target and a Content-Length body (no chunked bodies). `None` once the
/// peer closed or broke off.
pub(crate) fn read_request(r: &mut impl std::io::BufRead) -> Option<(String, String, Vec<u8>)> {
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            if n.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body).ok()?;
    Some((method, target, body))
}

/// A port-forward upgrade (SPDY/3.1) through `ep`: `Ok` when the answer is
/// 101 with `Upgrade: SPDY/3.1` and `size` random bytes then echo back
/// byte-exact in lock-step (the fake API server echoes upgraded streams);
/// otherwise what happened instead (the status line, or where it broke).
pub(crate) fn upgrade_echo(ep: &Endpoint, size: usize) -> Result<(), String> {
    let mut c = ep.connect();
    let req = format!(
        "POST /api/v1/namespaces/d/pods/p/portforward HTTP/1.1\r\nHost: localhost:{}\r\nUser-Agent: t\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n",
        ep.port()
    );
    c.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match c.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => {
                return Err(format!(
                    "EOF in the answer's head: {:?}",
                    String::from_utf8_lossy(&head)
                ))
            }
        }
    }
    let head = String::from_utf8_lossy(&head);
    let status = head.lines().next().unwrap_or("").to_string();
    if !head.starts_with("HTTP/1.1 101") {
        return Err(status);
    }
    if !head.to_ascii_lowercase().contains("upgrade: spdy/3.1") {
        return Err(format!("101 without the protocol: {head}"));
    }
    // Lock-step: send a piece, read its echo back.
    let data = super::random_bytes(size, size as u64);
    let mut buf = vec![0u8; 65536];
    for piece in data.chunks(65536) {
        c.write_all(piece).map_err(|e| format!("write: {e}"))?;
        let mut got = Vec::with_capacity(piece.len());
        while got.len() < piece.len() {
            match c.read(&mut buf) {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => return Err("upgrade echo ended early".into()),
            }
        }
        if got != piece {
            return Err("upgrade echo differs".into());
        }
    }
    Ok(())
}

/// A GET of `path` through `ep` as the kubectl-diff tests send it, and the
/// fake API server's JSON echo of what reached it (`Null` when the body is
/// not JSON, e.g. an answer the proxy wrote itself).
pub(crate) fn get_echo(
    ep: &Endpoint,
    path: &str,
) -> std::io::Result<(Response, serde_json::Value)> {
    let raw = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost:{}\r\nUser-Agent: difftest/1\r\n\r\n",
        ep.port()
    );
    let r = exchange(ep, raw.as_bytes(), "GET")?;
    let v = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
    Ok((r, v))
}

/// A request header as the fake API server echoed it (lower-case `name`).
pub(crate) fn echoed_header(echo: &serde_json::Value, name: &str) -> Option<String> {
    echo["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str().map(str::to_string))
}
