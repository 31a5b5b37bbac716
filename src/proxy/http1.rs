//! Sans-I/O HTTP/1.x for the proxy: request and response heads, message
//! body framing, and a chunked-encoding tracker that finds where a chunked
//! body ends (and, when asked, which bytes are payload) without copying.
//! Every limit is explicit so that memory stays bounded on hostile input.

use std::ops::Range;

/// Largest request or response head, as Go's `DefaultMaxHeaderBytes`
/// (1 MiB) plus its 4 KiB slack.
pub const MAX_HEAD: usize = (1 << 20) + 4096;
/// Most header lines accepted in one head.
pub const MAX_HEADERS: usize = 512;
/// Longest chunk-size line (with extensions) and all trailers together.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 64 * 1024;

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

/// Parses a request head from the start of `buf`: `Ok(None)` while it is
/// incomplete, else the head and its length.
pub fn parse_request(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, HeadError> {
    // Most heads fit a small array on the stack; retry big only when not.
    let mut small = [httparse::EMPTY_HEADER; 48];
    match parse_request_with(buf, &mut small) {
        Err(HeadError::TooLarge) if buf.len() < MAX_HEAD => {
            parse_request_with(buf, &mut vec![httparse::EMPTY_HEADER; MAX_HEADERS])
        }
        other => other,
    }
}

fn parse_request_with<'b>(
    buf: &'b [u8],
    headers: &mut [httparse::Header<'b>],
) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let mut req = httparse::Request::new(headers);
    match req.parse(buf).map_err(map_err)? {
        httparse::Status::Partial => {
            if buf.len() >= MAX_HEAD {
                Err(HeadError::TooLarge)
            } else {
                Ok(None)
            }
        }
        httparse::Status::Complete(n) => {
            if n > MAX_HEAD {
                return Err(HeadError::TooLarge);
            }
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
    }
}

/// Parses a response head, as [`parse_request`].
pub fn parse_response(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, HeadError> {
    let mut small = [httparse::EMPTY_HEADER; 48];
    match parse_response_with(buf, &mut small) {
        Err(HeadError::TooLarge) if buf.len() < MAX_HEAD => {
            parse_response_with(buf, &mut vec![httparse::EMPTY_HEADER; MAX_HEADERS])
        }
        other => other,
    }
}

fn parse_response_with<'b>(
    buf: &'b [u8],
    headers: &mut [httparse::Header<'b>],
) -> Result<Option<(ResponseHead, usize)>, HeadError> {
    let mut res = httparse::Response::new(headers);
    match res.parse(buf).map_err(map_err)? {
        httparse::Status::Partial => {
            if buf.len() >= MAX_HEAD {
                Err(HeadError::TooLarge)
            } else {
                Ok(None)
            }
        }
        httparse::Status::Complete(n) => Ok(Some((
            ResponseHead {
                status: res.code.unwrap_or(0),
                reason: res.reason.unwrap_or_default().to_string(),
                minor: res.version.unwrap_or(1),
                headers: convert(res.headers),
            },
            n,
        ))),
    }
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Size { digits: u8, ext: bool, line: usize },
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf { empty: bool },
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed chunked encoding: {0}")]
pub struct ChunkError(&'static str);

/// What one call to [`ChunkedDecoder::advance`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ChunkProgress {
    /// Bytes of the input that belong to this body.
    pub consumed: usize,
    /// Payload byte ranges within the consumed input.
    pub data: Vec<Range<usize>>,
    /// The body ended at `consumed`.
    pub done: bool,
}

/// Tracks a chunked body byte by byte (payload in bulk).
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: ChunkState,
    size: u64,
    trailers: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        ChunkedDecoder {
            state: ChunkState::Size {
                digits: 0,
                ext: false,
                line: 0,
            },
            size: 0,
            trailers: 0,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    fn start_size() -> ChunkState {
        ChunkState::Size {
            digits: 0,
            ext: false,
            line: 0,
        }
    }

    /// Feeds `input`; stops at the end of the body.
    pub fn advance(&mut self, input: &[u8]) -> Result<ChunkProgress, ChunkError> {
        use ChunkState::*;
        let mut p = ChunkProgress::default();
        let mut i = 0;
        while i < input.len() && self.state != Done {
            if self.state == Data {
                let take = (self.size.min((input.len() - i) as u64)) as usize;
                p.data.push(i..i + take);
                i += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = DataCr;
                }
                continue;
            }
            let c = input[i];
            i += 1;
            self.state = match self.state {
                Size { digits, ext, line } => {
                    if line >= MAX_CHUNK_LINE {
                        return Err(ChunkError("chunk size line too long"));
                    }
                    match c {
                        b'\r' | b'\n' if digits == 0 => return Err(ChunkError("empty chunk size")),
                        b'\r' => SizeLf,
                        b'\n' => self.size_done(),
                        _ if ext => Size {
                            digits,
                            ext,
                            line: line + 1,
                        },
                        b';' | b' ' | b'\t' => Size {
                            digits,
                            ext: true,
                            line: line + 1,
                        },
                        c if c.is_ascii_hexdigit() => {
                            if digits >= 16 {
                                return Err(ChunkError("chunk size too large"));
                            }
                            let d = (c as char).to_digit(16).unwrap_or(0) as u64;
                            self.size = self.size << 4 | d;
                            Size {
                                digits: digits + 1,
                                ext,
                                line: line + 1,
                            }
                        }
                        _ => return Err(ChunkError("invalid chunk size")),
                    }
                }
                SizeLf => match c {
                    b'\n' => self.size_done(),
                    _ => return Err(ChunkError("expected LF after chunk size")),
                },
                DataCr => match c {
                    b'\r' => DataLf,
                    b'\n' => Self::start_size(),
                    _ => return Err(ChunkError("missing CRLF after chunk data")),
                },
                DataLf => match c {
                    b'\n' => Self::start_size(),
                    _ => return Err(ChunkError("missing LF after chunk data")),
                },
                TrailerStart | TrailerLine => {
                    self.trailers += 1;
                    if self.trailers > MAX_TRAILERS {
                        return Err(ChunkError("trailers too large"));
                    }
                    let empty = self.state == TrailerStart;
                    match c {
                        b'\r' => TrailerLf { empty },
                        b'\n' if empty => Done,
                        b'\n' => TrailerStart,
                        _ => TrailerLine,
                    }
                }
                TrailerLf { empty } => match c {
                    b'\n' if empty => Done,
                    b'\n' => TrailerStart,
                    _ => return Err(ChunkError("expected LF in trailer")),
                },
                Data | Done => unreachable!("handled above"),
            };
        }
        p.consumed = i;
        p.done = self.state == Done;
        Ok(p)
    }

    fn size_done(&mut self) -> ChunkState {
        if self.size == 0 {
            ChunkState::TrailerStart
        } else {
            ChunkState::Data
        }
    }
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
        let (h, n) = parse_request(raw).unwrap().unwrap();
        assert_eq!(
            (h.method.as_str(), h.target.as_str(), h.minor),
            ("POST", "/a?b", 1)
        );
        assert_eq!(&raw[n..], b"abc");
        assert_eq!(request_framing(&h).unwrap(), Framing::Length(3));
        assert!(parse_request(b"GET / HTTP/1.1\r\nHost").unwrap().is_none());
        assert!(
            parse_request(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n")
                .map(|r| request_framing(&r.unwrap().0))
                .unwrap()
                .is_err()
        );
        assert!(matches!(
            parse_request(b"\x00\x01 / HTTP/1.1\r\n\r\n"),
            Err(HeadError::Malformed(_))
        ));
        let big = vec![b'a'; MAX_HEAD + 10];
        let mut req = b"GET /".to_vec();
        req.extend_from_slice(&big);
        assert_eq!(parse_request(&req), Err(HeadError::TooLarge));
    }

    #[test]
    fn response_framing_rules() {
        let (h, _) = parse_response(b"HTTP/1.1 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!(response_framing("GET", &h).unwrap(), Framing::UntilClose);
        assert_eq!(response_framing("HEAD", &h).unwrap(), Framing::None);
        let (h, _) = parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(response_framing("GET", &h).unwrap(), Framing::Chunked);
        let (h, _) = parse_response(b"HTTP/1.1 304 x\r\nContent-Length: 5\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(response_framing("GET", &h).unwrap(), Framing::None);
    }

    fn decode_all(input: &[u8], step: usize) -> Result<(Vec<u8>, usize), ChunkError> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < input.len() && !d.is_done() {
            let end = (pos + step).min(input.len());
            let p = d.advance(&input[pos..end])?;
            for r in p.data {
                out.extend_from_slice(&input[pos + r.start..pos + r.end]);
            }
            pos += p.consumed;
            if p.consumed == 0 {
                break;
            }
        }
        assert!(d.is_done(), "not done");
        Ok((out, pos))
    }

    #[test]
    fn chunked_in_any_split() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for step in 1..body.len() {
            let (data, end) = decode_all(body, step).unwrap();
            assert_eq!(data, b"hello world");
            assert_eq!(&body[end..], b"NEXT");
        }
        assert!(decode_all(b"zz\r\n", 3).is_err());
        assert!(decode_all(b"1\r\nab\r\n", 8).is_err());
        assert!(decode_all(b"11111111111111111\r\n", 30).is_err());
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
