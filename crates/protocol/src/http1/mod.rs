//! Sans-I/O HTTP/1.x: request and response heads read within a limit each
//! caller chooses, message body framing, header helpers, the chunked
//! transfer coding ([`chunked`]) and a follower of exchanges in a relayed
//! byte stream ([`trace`]). Used by `proxy` (kubectl proxy), the server's
//! interception listeners and the admin listener. Every limit is explicit
//! so that memory stays bounded on hostile input.

pub mod chunked;
pub mod trace;

pub use chunked::{ChunkError, ChunkProgress, ChunkedDecoder};

/// How large a head may grow before it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimit {
    /// Bytes of the head, request or status line included.
    pub bytes: usize,
    /// Header lines.
    pub headers: usize,
}

impl HeadLimit {
    /// Go's `http.Server`: `DefaultMaxHeaderBytes` (1 MiB) plus its 4 KiB
    /// slack (what kubectl proxy accepts); also used for upstream answers.
    pub const GO_SERVER: HeadLimit = HeadLimit {
        bytes: (1 << 20) + 4096,
        headers: 512,
    };
    /// Kubelet requests caught by the interception listeners, and the heads
    /// the tracing follower looks for in relayed streams.
    pub const KUBELET: HeadLimit = HeadLimit {
        bytes: 64 * 1024,
        headers: 128,
    };
    /// The HTTP CONNECT frontend (kube-apiserver's egress dials).
    pub const CONNECT: HeadLimit = HeadLimit {
        bytes: 16 * 1024,
        headers: 64,
    };
    /// The admin listener's /metrics and health probes.
    pub const ADMIN: HeadLimit = HeadLimit {
        bytes: 8 * 1024,
        headers: 32,
    };
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("request header fields too large")]
    TooLarge,
    #[error("malformed HTTP message: {0}")]
    Malformed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    /// Minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    pub headers: Vec<Header>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub reason: String,
    pub minor: u8,
    pub headers: Vec<Header>,
}

fn convert(headers: &[httparse::Header<'_>]) -> Vec<Header> {
    headers
        .iter()
        .map(|h| Header {
            name: h.name.to_string(),
            value: h.value.to_vec(),
        })
        .collect()
}

fn map_err(e: httparse::Error) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooLarge,
        e => HeadError::Malformed(e.to_string()),
    }
}

/// Header slots tried on the stack before a heap array of the limit's size.
const STACK_HEADERS: usize = 48;

/// Parses a request head from the start of `buf`: `Ok(None)` while it is
/// incomplete, else the head and its length.
pub fn parse_request(
    buf: &[u8],
    limit: HeadLimit,
) -> Result<Option<(RequestHead, usize)>, HeadError> {
    with_header_slots(buf, limit, parse_request_with)
}

/// Parses a response head, as [`parse_request`].
pub fn parse_response(
    buf: &[u8],
    limit: HeadLimit,
) -> Result<Option<(ResponseHead, usize)>, HeadError> {
    with_header_slots(buf, limit, parse_response_with)
}

type ParseWith<T> =
    for<'b> fn(&'b [u8], &mut [httparse::Header<'b>], HeadLimit) -> Result<Option<T>, HeadError>;

/// Runs `parse` with header slots on the stack, and again on the heap only
/// when they were too few: as many as the limit allows and the buffer can
/// hold (one per line seen), so a large limit costs nothing up front.
fn with_header_slots<T>(
    buf: &[u8],
    limit: HeadLimit,
    parse: ParseWith<T>,
) -> Result<Option<T>, HeadError> {
    let mut small = [httparse::EMPTY_HEADER; STACK_HEADERS];
    let slots = STACK_HEADERS.min(limit.headers);
    match parse(buf, &mut small[..slots], limit) {
        Err(HeadError::TooLarge) if buf.len() < limit.bytes && limit.headers > slots => {
            let lines = buf.iter().filter(|&&b| b == b'\n').count() + 1;
            let n = limit.headers.min(lines.max(slots + 1));
            parse(buf, &mut vec![httparse::EMPTY_HEADER; n], limit)
        }
        other => other,
    }
}

/// The head's length if httparse found a complete one within `limit`.
fn within_limit(
    status: httparse::Status<usize>,
    buf_len: usize,
    limit: HeadLimit,
) -> Result<Option<usize>, HeadError> {
    match status {
        httparse::Status::Partial if buf_len >= limit.bytes => Err(HeadError::TooLarge),
        httparse::Status::Partial => Ok(None),
        httparse::Status::Complete(n) if n > limit.bytes => Err(HeadError::TooLarge),
        httparse::Status::Complete(n) => Ok(Some(n)),
    }
}

fn parse_request_with<'b>(
    buf: &'b [u8],
    headers: &mut [httparse::Header<'b>],
    limit: HeadLimit,
) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let mut req = httparse::Request::new(headers);
    let status = req.parse(buf).map_err(map_err)?;
    let Some(n) = within_limit(status, buf.len(), limit)? else {
        return Ok(None);
    };
    Ok(Some((
        RequestHead {
            method: req.method.unwrap_or_default().to_string(),
            target: req.path.unwrap_or_default().to_string(),
            minor: req.version.unwrap_or(1),
            headers: convert(req.headers),
        },
        n,
    )))
}

fn parse_response_with<'b>(
    buf: &'b [u8],
    headers: &mut [httparse::Header<'b>],
    limit: HeadLimit,
) -> Result<Option<(ResponseHead, usize)>, HeadError> {
    let mut res = httparse::Response::new(headers);
    let status = res.parse(buf).map_err(map_err)?;
    let Some(n) = within_limit(status, buf.len(), limit)? else {
        return Ok(None);
    };
    Ok(Some((
        ResponseHead {
            status: res.code.unwrap_or(0),
            reason: res.reason.unwrap_or_default().to_string(),
            minor: res.version.unwrap_or(1),
            headers: convert(res.headers),
        },
        n,
    )))
}

/// All values of header `name` (case-insensitive).
pub fn values<'a>(headers: &'a [Header], name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_slice())
}

/// The first value of header `name`, as text.
pub fn get<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .and_then(|h| std::str::from_utf8(&h.value).ok())
}

/// Whether any comma-separated token of header `name` equals `token`
/// (case-insensitive), as Go's `httpguts.HeaderValuesContainsToken`.
pub fn has_token(headers: &[Header], name: &str, token: &str) -> bool {
    values(headers, name).any(|v| {
        std::str::from_utf8(v)
            .unwrap_or("")
            .split(',')
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    })
}

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
    /// Until the peer closes (responses only).
    UntilClose,
}

fn content_length(headers: &[Header]) -> Result<Option<u64>, HeadError> {
    let mut found: Option<u64> = None;
    for v in values(headers, "content-length") {
        let s = std::str::from_utf8(v).unwrap_or("").trim();
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(HeadError::Malformed(format!("bad Content-Length {s:?}")));
        }
        let n: u64 = s
            .parse()
            .map_err(|_| HeadError::Malformed(format!("bad Content-Length {s:?}")))?;
        if found.is_some_and(|f| f != n) {
            return Err(HeadError::Malformed("conflicting Content-Length".into()));
        }
        found = Some(n);
    }
    Ok(found)
}

fn transfer_chunked(headers: &[Header]) -> Result<bool, HeadError> {
    let codings: Vec<String> = values(headers, "transfer-encoding")
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    match codings.as_slice() {
        [] => Ok(false),
        [one] if one == "chunked" => Ok(true),
        _ => Err(HeadError::Malformed(format!(
            "unsupported transfer encoding: {codings:?}"
        ))),
    }
}

/// Body framing of a request.
pub fn request_framing(head: &RequestHead) -> Result<Framing, HeadError> {
    if transfer_chunked(&head.headers)? {
        return Ok(Framing::Chunked);
    }
    Ok(match content_length(&head.headers)? {
        Some(0) | None => Framing::None,
        Some(n) => Framing::Length(n),
    })
}

/// Body framing of a response to a request with `method`.
pub fn response_framing(method: &str, head: &ResponseHead) -> Result<Framing, HeadError> {
    if method == "HEAD"
        || (100..200).contains(&head.status)
        || head.status == 204
        || head.status == 304
    {
        return Ok(Framing::None);
    }
    if transfer_chunked(&head.headers)? {
        return Ok(Framing::Chunked);
    }
    Ok(match content_length(&head.headers)? {
        Some(0) => Framing::None,
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}

/// Hop-by-hop headers a proxy never forwards (Go's `hopHeaders`).
pub const HOP_HEADERS: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes hop-by-hop headers and those named in `Connection`, as Go's
/// `httputil.ReverseProxy` does.
pub fn remove_hop_headers(headers: &mut Vec<Header>) {
    let listed: Vec<String> = values(headers, "connection")
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    headers.retain(|h| {
        let n = h.name.to_ascii_lowercase();
        !HOP_HEADERS.contains(&n.as_str()) && !listed.contains(&n)
    });
}

/// Go's `textproto.CanonicalMIMEHeaderKey`: `x-foo-bar` -> `X-Foo-Bar`
/// (names with bytes outside the token set are left alone).
pub fn canonical_name(name: &str) -> String {
    let valid = name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c));
    if !valid {
        return name.to_string();
    }
    let mut upper = true;
    name.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_and_framing() {
        let raw = b"POST /a?b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc";
        let (h, n) = parse_request(raw, HeadLimit::GO_SERVER).unwrap().unwrap();
        assert_eq!(
            (h.method.as_str(), h.target.as_str(), h.minor),
            ("POST", "/a?b", 1)
        );
        assert_eq!(&raw[n..], b"abc");
        assert_eq!(request_framing(&h).unwrap(), Framing::Length(3));
        assert!(
            parse_request(b"GET / HTTP/1.1\r\nHost", HeadLimit::GO_SERVER)
                .unwrap()
                .is_none()
        );
        assert!(parse_request(
            b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            HeadLimit::GO_SERVER
        )
        .map(|r| request_framing(&r.unwrap().0))
        .unwrap()
        .is_err());
        assert!(matches!(
            parse_request(b"\x00\x01 / HTTP/1.1\r\n\r\n", HeadLimit::GO_SERVER),
            Err(HeadError::Malformed(_))
        ));
        let big = vec![b'a'; HeadLimit::GO_SERVER.bytes + 10];
        let mut req = b"GET /".to_vec();
        req.extend_from_slice(&big);
        assert_eq!(
            parse_request(&req, HeadLimit::GO_SERVER),
            Err(HeadError::TooLarge)
        );
    }

    #[test]
    fn each_caller_has_its_limit() {
        let mut req = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..40 {
            req.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        req.extend_from_slice(b"\r\n");
        assert_eq!(
            parse_request(&req, HeadLimit::ADMIN),
            Err(HeadError::TooLarge)
        );
        let (h, n) = parse_request(&req, HeadLimit::KUBELET).unwrap().unwrap();
        assert_eq!((h.headers.len(), n), (40, req.len()));
        // Partial heads stop at the byte limit, not later.
        let partial = vec![b'a'; HeadLimit::ADMIN.bytes];
        assert_eq!(
            parse_request(&partial, HeadLimit::ADMIN),
            Err(HeadError::TooLarge)
        );
        assert_eq!(parse_request(&partial[..100], HeadLimit::ADMIN), Ok(None));
        let mut resp = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        resp.extend(std::iter::repeat_n(b'v', HeadLimit::ADMIN.bytes));
        resp.extend_from_slice(b"\r\n\r\n");
        assert_eq!(
            parse_response(&resp, HeadLimit::ADMIN),
            Err(HeadError::TooLarge)
        );
        assert!(parse_response(&resp, HeadLimit::KUBELET).unwrap().is_some());
    }

    #[test]
    fn response_framing_rules() {
        let (h, _) = parse_response(b"HTTP/1.1 200 OK\r\n\r\n", HeadLimit::GO_SERVER)
            .unwrap()
            .unwrap();
        assert_eq!(response_framing("GET", &h).unwrap(), Framing::UntilClose);
        assert_eq!(response_framing("HEAD", &h).unwrap(), Framing::None);
        let (h, _) = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            HeadLimit::GO_SERVER,
        )
        .unwrap()
        .unwrap();
        assert_eq!(response_framing("GET", &h).unwrap(), Framing::Chunked);
        let (h, _) = parse_response(
            b"HTTP/1.1 304 x\r\nContent-Length: 5\r\n\r\n",
            HeadLimit::GO_SERVER,
        )
        .unwrap()
        .unwrap();
        assert_eq!(response_framing("GET", &h).unwrap(), Framing::None);
    }

    #[test]
    fn hop_headers_and_names() {
        let mut h = vec![
            Header {
                name: "Connection".into(),
                value: b"close, X-Drop".to_vec(),
            },
            Header {
                name: "x-drop".into(),
                value: b"1".to_vec(),
            },
            Header {
                name: "Keep-Alive".into(),
                value: b"1".to_vec(),
            },
            Header {
                name: "X-Keep".into(),
                value: b"1".to_vec(),
            },
        ];
        remove_hop_headers(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].name, "X-Keep");
        assert_eq!(canonical_name("x-foo-bar"), "X-Foo-Bar");
        assert_eq!(canonical_name("CONTENT-type"), "Content-Type");
        assert_eq!(canonical_name("bad name"), "bad name");
    }
}
