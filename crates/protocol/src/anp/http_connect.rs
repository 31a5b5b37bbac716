//! The HTTP CONNECT frontend's request parser and responses (sans-I/O).
//!
//! kube-apiserver's EgressSelector sends `CONNECT host:port HTTP/1.1` plus a
//! few headers; the tunnel answers `200` only once the agent's dial
//! succeeded, then both sides speak raw bytes. Like Go's `net/http` (which
//! ANP uses), the dial address is the request-target's authority.

use crate::http1::{self, HeadError, HeadLimit};

/// Largest request head accepted, like a conservative `MaxHeaderBytes`.
pub const LIMIT: HeadLimit = HeadLimit::CONNECT;
pub const MAX_HEAD: usize = LIMIT.bytes;

/// A parsed CONNECT request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// `host:port` to dial.
    pub address: String,
    /// Bytes of the head, including the blank line; anything after it already
    /// belongs to the tunneled stream.
    pub head_len: usize,
}

/// Why a request is refused, with the HTTP status to answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    #[error("method {0} not allowed: this proxy only supports CONNECT")]
    MethodNotAllowed(String),
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("request head exceeds {MAX_HEAD} bytes")]
    TooLarge,
    /// The HTTP/2 client preface: a gRPC caller on the CONNECT frontend.
    #[error(
        "the HTTP/2 client preface (a gRPC caller) arrived on the HTTP CONNECT frontend: the \
         caller speaks gRPC (an EgressSelectorConfiguration with proxyProtocol: GRPC, or \
         konnectivity-client) but this socket serves HTTP CONNECT (--connect-uds/--connect-bind, \
         ANP's --mode=http-connect): make the two agree (proxyProtocol: HTTPConnect, or serve \
         this socket with --grpc-uds/--grpc-bind)"
    )]
    Http2Preface,
}

impl ConnectError {
    pub fn status(&self) -> u16 {
        match self {
            ConnectError::MethodNotAllowed(_) => 405,
            ConnectError::Malformed(_) => 400,
            ConnectError::TooLarge => 431,
            ConnectError::Http2Preface => 400,
        }
    }
}

/// The HTTP/2 client preface's first line (RFC 9113 section 3.4).
const HTTP2_PREFACE_LINE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// Parses a request head. `Ok(None)` means more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<ConnectRequest>, ConnectError> {
    if buf.starts_with(HTTP2_PREFACE_LINE) {
        return Err(ConnectError::Http2Preface);
    }
    let (req, head_len) = match http1::parse_request(buf, LIMIT) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => return Ok(None),
        Err(HeadError::TooLarge) => return Err(ConnectError::TooLarge),
        Err(HeadError::Malformed(e)) => return Err(ConnectError::Malformed(e)),
    };
    if req.method != "CONNECT" {
        return Err(ConnectError::MethodNotAllowed(req.method));
    }
    let target = req.target.as_str();
    check_authority(target).map_err(|why| {
        ConnectError::Malformed(format!("CONNECT target {target:?} is not host:port: {why}"))
    })?;
    Ok(Some(ConnectRequest {
        address: target.to_string(),
        head_len,
    }))
}

/// Longest host name (RFC 1035, without a trailing dot).
pub const MAX_HOST: usize = 253;
/// Longest label of a host name.
pub const MAX_LABEL: usize = 63;

/// Checks a CONNECT request-target: `host:port`, `1.2.3.4:port` or
/// `[v6]:port` with a port of 1..=65535. A host name is ASCII letters,
/// digits, `-` and `_` in dot-separated labels of 1..=63 bytes, at most 253
/// bytes (one trailing dot allowed); all-numeric dotted hosts must be IPv4
/// addresses. No userinfo, no path, no zone, no brackets around anything
/// but an IPv6 address. The reason is returned for the 400 body.
pub fn check_authority(target: &str) -> Result<(), &'static str> {
    let (host, port) = if let Some(rest) = target.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or("unclosed [")?;
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("not an IPv6 address inside [ ]");
        }
        let port = after.strip_prefix(':').ok_or("missing port")?;
        (None, port)
    } else {
        let (host, port) = target.rsplit_once(':').ok_or("missing port")?;
        (Some(host), port)
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err("port is not a number");
    }
    match port.parse::<u32>() {
        Ok(1..=65535) => {}
        _ => return Err("port out of range 1-65535"),
    }
    if let Some(host) = host {
        check_host(host)?;
    }
    Ok(())
}

fn check_host(host: &str) -> Result<(), &'static str> {
    if host.is_empty() {
        return Err("empty host");
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.len() > MAX_HOST {
        return Err("host name longer than 253 bytes");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label in host name");
        }
        if label.len() > MAX_LABEL {
            return Err("host name label longer than 63 bytes");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("invalid character in host");
        }
    }
    let numeric = name.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if numeric && name.parse::<std::net::Ipv4Addr>().is_err() {
        return Err("not an IPv4 address");
    }
    Ok(())
}

/// The success line sent once the tunnel is up.
pub const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";

/// An error response with a plain-text body; the connection closes after it.
pub fn error_response(status: u16, body: &str) -> Vec<u8> {
    let reason = match status {
        400 => "Bad Request",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Maps an agent's dial error to the status ANP's frontend answers with.
/// (ANP's `mapDialErrorToHTTPStatus`: timeouts 504, no agent or no file
/// descriptors 503, anything else 502.)
pub fn dial_error_status(agent_error: &str) -> u16 {
    let e = agent_error.to_ascii_lowercase();
    if ["i/o timeout", "deadline exceeded", "timeout", "timed out"]
        .iter()
        .any(|s| e.contains(s))
    {
        504
    } else if e.contains("no agent available") || e.contains("too many open files") {
        503
    } else {
        502
    }
}

/// Largest error body sent back, as ANP's writer truncates.
pub const MAX_ERROR_BODY: usize = 4096;

/// Truncates an error body the way ANP does.
pub fn truncate_error_body(body: &str) -> String {
    if body.len() <= MAX_ERROR_BODY {
        return body.to_string();
    }
    let mut cut = MAX_ERROR_BODY;
    while !body.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}\n[error response truncated]\n", &body[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_connect_with_trailing_bytes() {
        let buf = b"CONNECT node1:10250 HTTP/1.1\r\nHost: node1:10250\r\n\r\nHELLO";
        let r = parse(buf).unwrap().unwrap();
        assert_eq!(r.address, "node1:10250");
        assert_eq!(&buf[r.head_len..], b"HELLO");
        let v6 = parse(b"CONNECT [fd00::1]:80 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(v6.address, "[fd00::1]:80");
    }

    #[test]
    fn partial_then_complete() {
        assert_eq!(parse(b"CONNECT a:1 HTTP/1.1\r\nHost: a").unwrap(), None);
    }

    #[test]
    fn refusals_have_statuses() {
        let e = parse(b"GET / HTTP/1.1\r\n\r\n").unwrap_err();
        assert_eq!(e.status(), 405);
        assert_eq!(parse(b"\x00\x01garbage\r\n\r\n").unwrap_err().status(), 400);
        assert_eq!(
            parse(b"CONNECT nohost HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            parse(b"CONNECT /x HTTP/1.1\r\n\r\n").unwrap_err().status(),
            400
        );
        let mut big = b"CONNECT a:1 HTTP/1.1\r\n".to_vec();
        big.extend(std::iter::repeat_n(b'x', MAX_HEAD));
        assert_eq!(parse(&big).unwrap_err(), ConnectError::TooLarge);
    }

    #[test]
    fn a_grpc_callers_preface_is_named() {
        let e = parse(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap_err();
        assert_eq!(e, ConnectError::Http2Preface);
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("proxyProtocol: GRPC"), "{e}");
    }

    #[test]
    fn go_rejects_these_targets_too() {
        assert_eq!(
            parse(b"CONNECT a:+80 HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            parse(b"CONNECT u@a:80 HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
    }

    fn status_of(target: &str) -> Result<String, u16> {
        let req = format!("CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        match parse(req.as_bytes()) {
            Ok(Some(r)) => Ok(r.address),
            Ok(None) => panic!("partial: {target:?}"),
            Err(e) => Err(e.status()),
        }
    }

    #[test]
    fn valid_authorities() {
        for t in [
            "node1:10250",
            "node-1.example.com:443",
            "node-1.example.com.:443",
            "under_score:1",
            "1.2.3.4:65535",
            "[::1]:80",
            "[fd00::1:2]:8080",
            "[::ffff:1.2.3.4]:1",
        ] {
            assert_eq!(status_of(t), Ok(t.to_string()), "{t}");
        }
        let label = "a".repeat(63);
        let long = [label.as_str(); 4].join(".");
        assert_eq!(long.len(), 255);
        let ok = format!("{}:1", &long[..253]);
        assert_eq!(status_of(&ok), Ok(ok.clone()));
    }

    #[test]
    fn malformed_authorities_are_400() {
        let long_label = format!("{}.com:80", "a".repeat(64));
        let long_host = format!("{}:80", ["abcdefghi"; 26].join("."));
        assert!(long_host.len() > 253 + 3);
        for t in [
            "[::1",
            "[::1]",
            "[::1]:",
            "[::1]80",
            "[node]:80",
            "[fe80::1%25eth0]:80",
            "::1:80",
            "a:0",
            "a:00",
            "a:65536",
            "a:99999999999999999999",
            "a:-1",
            "a:+80",
            "a: 80",
            "a",
            "a:",
            ":80",
            "a@b:1",
            "u:p@b:1",
            "a..b:1",
            ".a:1",
            "a.b..:1",
            "a/b:1",
            "a%2eb:1",
            "a\tb:1",
            "h\x7fst:1",
            "h\u{e9}st:1",
            "1.2.3:80",
            "999.1.1.1:80",
            "a*b:80",
            long_label.as_str(),
            long_host.as_str(),
        ] {
            assert_eq!(status_of(t), Err(400), "{t:?}");
        }
        // Spaces split the request line: not a valid request at all.
        assert_eq!(status_of("a b:1"), Err(400));
    }

    #[test]
    fn error_responses_are_well_formed() {
        let r = String::from_utf8(error_response(502, "dial tcp: refused")).unwrap();
        assert!(r.starts_with("HTTP/1.1 502 Bad Gateway\r\n"));
        assert!(r.ends_with("\r\n\r\ndial tcp: refused"));
        assert_eq!(
            dial_error_status("dial tcp 1.2.3.4:5: socket: too many open files"),
            503
        );
        assert_eq!(dial_error_status("dial timeout"), 504);
        assert_eq!(dial_error_status("connection refused"), 502);
    }
}
