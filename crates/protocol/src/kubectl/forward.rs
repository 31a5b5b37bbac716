//! Rewriting heads between the client and the upstream, as kubectl's
//! `UpgradeAwareHandler` (Go's `httputil.ReverseProxy` and HTTP client
//! underneath) does: hop-by-hop headers dropped, `X-Forwarded-For`
//! appended, the upstream's Host, credentials added where the request
//! carries none, the body re-framed. What the rewrite needs of the upstream
//! comes as plain data ([`UpstreamHead`]); the main crate's `Upstream`
//! (TLS configurations, token sources) builds it per request. The clock is
//! read only for `Date` headers ([`now_http_date`]).

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::go::url::RequestUrl;
use crate::http1::{self, Framing, Header, RequestHead, ResponseHead};
use crate::kubectl::upstream::impersonation::Impersonation;

/// Sent upstream when the client sent no User-Agent.
pub const DEFAULT_USER_AGENT: &str = concat!("edgetunnel/", env!("CARGO_PKG_VERSION"));

/// What an upstream answer's head may hold, as kubectl's transport reads
/// it: Go's `Transport.MaxResponseHeaderBytes` defaults to 10 MiB
/// (net/http/transport.go, `maxHeaderResponseSize`) and `textproto` counts
/// no lines; kubectl relays an answer with 600 header lines. Lines are
/// bounded here only by the bytes (a line takes at least 3 of them).
pub const UPSTREAM_HEAD_LIMIT: http1::HeadLimit = http1::HeadLimit {
    bytes: 10 << 20,
    headers: (10 << 20) / 3,
};

/// What the request head rewrite needs of the upstream, as plain data.
#[derive(Debug, Clone)]
pub struct UpstreamHead<'a> {
    /// The Host header: the server URL's host as written (port kept when
    /// given).
    pub host: &'a str,
    /// The `Authorization` value added to requests that carry none.
    pub authorization: Option<String>,
    /// `Impersonate-*` headers to add.
    pub impersonation: &'a Impersonation,
    /// Set when the request goes to an HTTP proxy in absolute form (a
    /// plain-http upstream behind an HTTP(S) proxy: Go's transport sends no
    /// CONNECT then).
    pub forward_proxy: Option<ForwardProxy>,
}

/// The HTTP proxy a plain-http request is written to in absolute form.
#[derive(Debug, Clone, Default)]
pub struct ForwardProxy {
    /// Its `Proxy-Authorization` value (Basic, from the proxy URL's
    /// userinfo), if any.
    pub authorization: Option<String>,
}

/// Go's `singleJoiningSlash` for `--append-server-path`.
fn join_path(base: &str, path: &str) -> String {
    match (base.ends_with('/'), path.starts_with('/')) {
        (true, true) => format!("{}{}", base, &path[1..]),
        (false, false) => format!("{base}/{path}"),
        _ => format!("{base}{path}"),
    }
}

/// The target written upstream (Go's `joinURLPath` for
/// `--append-server-path`, which keeps an encoded form such as `%2F`).
/// `base_path` is the server URL's path.
pub fn upstream_target(url: &RequestUrl, base_path: &str, append_server_path: bool) -> String {
    if append_server_path && !base_path.is_empty() {
        let mut u = url.clone();
        let base = RequestUrl::parse(base_path).unwrap_or_default();
        u.path = join_path(&base.path, &url.path);
        u.raw_path = if base.raw_path.is_empty() && url.raw_path.is_empty() {
            String::new()
        } else {
            join_path(&base.escaped_path(), &url.escaped_path())
        };
        return u.request_uri();
    }
    url.request_uri()
}

fn push(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends the client address to `X-Forwarded-For` (one header, prior values
/// joined with ", ").
fn forwarded_for(headers: &mut Vec<Header>, client: Option<IpAddr>) {
    let Some(ip) = client else { return };
    let prior: Vec<String> = http1::values(headers, "x-forwarded-for")
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    headers.retain(|h| !h.name.eq_ignore_ascii_case("x-forwarded-for"));
    let mut value = prior.join(", ");
    if !value.is_empty() {
        value.push_str(", ");
    }
    value.push_str(&ip.to_string());
    headers.push(Header {
        name: "X-Forwarded-For".into(),
        value: value.into_bytes(),
    });
}

/// Whether Go's transport would ask for gzip on this request (and then
/// decompress the answer): no Accept-Encoding, no Range, not HEAD.
pub fn wants_gzip(head: &RequestHead, upgrade: bool, disable_compression: bool) -> bool {
    !upgrade
        && !disable_compression
        && http1::get(&head.headers, "accept-encoding").is_none_or(str::is_empty)
        && http1::get(&head.headers, "range").is_none_or(str::is_empty)
        && head.method != "HEAD"
}

/// Serializes a request head toward the upstream. `upgrade` keeps the
/// connection-level headers (the request is relayed raw after it); `gzip`
/// adds `Accept-Encoding: gzip` as Go's transport does.
pub fn request_head(
    head: &RequestHead,
    target: &str,
    framing: Framing,
    client: Option<IpAddr>,
    upstream: &UpstreamHead<'_>,
    upgrade: bool,
    gzip: bool,
) -> Vec<u8> {
    let headers = upstream_headers(head, framing, client, upstream, upgrade, gzip);
    let mut out = Vec::with_capacity(512);
    // Through an HTTP proxy, a plain-http request goes in absolute form
    // with the proxy's credentials (Go's `Request.write` with usingProxy).
    let proxy = upstream.forward_proxy.as_ref();
    let scheme = if proxy.is_some() { "http://" } else { "" };
    let authority = if proxy.is_some() { upstream.host } else { "" };
    let _ = write!(
        out_string(&mut out),
        "{} {scheme}{authority}{} HTTP/1.1\r\nHost: {}\r\n",
        head.method,
        target,
        upstream.host
    );
    for h in &headers {
        push(&mut out, &h.name, &h.value);
    }
    if let Some(auth) = proxy.and_then(|p| p.authorization.as_deref()) {
        push(&mut out, "Proxy-Authorization", auth.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The header fields sent upstream after Host, in order: User-Agent and
/// Authorization where the client gave none, the client's own (hop-by-hop
/// ones dropped unless upgrading), X-Forwarded-For, Accept-Encoding for
/// gzip, then the body framing.
pub fn upstream_headers(
    head: &RequestHead,
    framing: Framing,
    client: Option<IpAddr>,
    upstream: &UpstreamHead<'_>,
    upgrade: bool,
    gzip: bool,
) -> Vec<Header> {
    let mut headers: Vec<Header> = head
        .headers
        .iter()
        .filter(|h| {
            !h.name.eq_ignore_ascii_case("host")
                && !h.name.eq_ignore_ascii_case("content-length")
                && (upgrade || !h.name.eq_ignore_ascii_case("transfer-encoding"))
        })
        .cloned()
        .collect();
    if !upgrade {
        let te_trailers = http1::has_token(&head.headers, "te", "trailers");
        http1::remove_hop_headers(&mut headers);
        if te_trailers {
            headers.push(Header {
                name: "Te".into(),
                value: b"trailers".to_vec(),
            });
        }
    }
    forwarded_for(&mut headers, client);
    let mut out = Vec::with_capacity(headers.len() + 4);
    let field = |name: &str, value: &[u8]| Header {
        name: name.to_string(),
        value: value.to_vec(),
    };
    if http1::get(&headers, "user-agent").is_none_or(str::is_empty) {
        headers.retain(|h| !h.name.eq_ignore_ascii_case("user-agent"));
        out.push(field("User-Agent", DEFAULT_USER_AGENT.as_bytes()));
    }
    if http1::get(&headers, "authorization").is_none_or(str::is_empty) {
        if let Some(a) = &upstream.authorization {
            headers.retain(|h| !h.name.eq_ignore_ascii_case("authorization"));
            out.push(field("Authorization", a.as_bytes()));
        }
    }
    // client-go's impersonatingRoundTripper: Set user (and uid), Add
    // groups and extras after the client's own.
    let (replace, imp) = upstream
        .impersonation
        .fields(http1::get(&headers, "impersonate-user"));
    headers.retain(|h| !replace.iter().any(|r| h.name.eq_ignore_ascii_case(r)));
    out.extend(headers);
    out.extend(imp.iter().map(|(n, v)| field(n, v.as_bytes())));
    if gzip {
        out.push(field("Accept-Encoding", b"gzip"));
    }
    match framing {
        Framing::Length(n) => out.push(field("Content-Length", n.to_string().as_bytes())),
        Framing::Chunked if !upgrade => out.push(field("Transfer-Encoding", b"chunked")),
        Framing::None if matches!(head.method.as_str(), "POST" | "PUT" | "PATCH") => {
            out.push(field("Content-Length", b"0"))
        }
        _ => {}
    }
    out
}

/// A `fmt::Write` view of a byte vector.
fn out_string(out: &mut Vec<u8>) -> impl std::fmt::Write + '_ {
    struct W<'a>(&'a mut Vec<u8>);
    impl std::fmt::Write for W<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.extend_from_slice(s.as_bytes());
            Ok(())
        }
    }
    W(out)
}

/// How the response body goes to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientBody {
    None,
    /// Bytes relayed as they are (Content-Length, or chunked to a 1.1 client).
    Verbatim,
    /// Chunked upstream, payload only to an HTTP/1.0 client, then close.
    Dechunk,
    /// Until the upstream closes, then close.
    UntilClose,
    /// gzip from upstream (which we asked for), decompressed and sent
    /// chunked (to HTTP/1.0 clients: raw, then close).
    Gunzip,
}

/// Whether the upstream answered with gzip we must undo.
pub fn is_gzipped(resp: &ResponseHead) -> bool {
    http1::get(&resp.headers, "content-encoding").is_some_and(|v| v.eq_ignore_ascii_case("gzip"))
}

/// Serializes the response head toward the client; says how to send the
/// body and whether the client connection stays open afterwards.
pub fn response_head(
    resp: &ResponseHead,
    framing: Framing,
    client_minor: u8,
    client_keep_alive: bool,
    gunzip: bool,
) -> (Vec<u8>, ClientBody, bool) {
    let mut headers = resp.headers.clone();
    http1::remove_hop_headers(&mut headers);
    // With Transfer-Encoding the length is not the message's (RFC 9112
    // 6.3): Go's transport drops it, and so the relayed answer has none.
    if framing == Framing::Chunked {
        headers.retain(|h| !h.name.eq_ignore_ascii_case("content-length"));
    }
    // Go's server suppresses these on answers that cannot have a body
    // (`suppressedHeaders`): no length on 1xx/204/304, no type on 304.
    if !body_allowed(resp.status) {
        let suppressed = |name: &str| {
            name.eq_ignore_ascii_case("content-length")
                || (resp.status == 304 && name.eq_ignore_ascii_case("content-type"))
        };
        headers.retain(|h| !suppressed(&h.name));
    }
    // Go's server dates every answer whose handler set no Date.
    if http1::get(&headers, "date").is_none() {
        headers.push(Header {
            name: "Date".into(),
            value: now_http_date().into_bytes(),
        });
    }
    let gunzip = gunzip && framing != Framing::None;
    if gunzip {
        headers.retain(|h| {
            !h.name.eq_ignore_ascii_case("content-encoding")
                && !h.name.eq_ignore_ascii_case("content-length")
        });
    }
    let (body, mut keep) = match framing {
        _ if gunzip => (ClientBody::Gunzip, client_keep_alive && client_minor >= 1),
        Framing::None => (ClientBody::None, client_keep_alive),
        Framing::Length(_) => (ClientBody::Verbatim, client_keep_alive),
        Framing::Chunked if client_minor >= 1 => (ClientBody::Verbatim, client_keep_alive),
        Framing::Chunked => (ClientBody::Dechunk, false),
        Framing::UntilClose => (ClientBody::UntilClose, false),
    };
    if framing == Framing::None {
        // A bodiless response keeps a declared Content-Length only for HEAD
        // (it describes the entity a GET would get, not this message).

        keep = client_keep_alive;
    }
    let mut out = Vec::with_capacity(256);
    let _ = write!(
        out_string(&mut out),
        "HTTP/1.{} {} {}\r\n",
        client_minor.min(1),
        resp.status,
        resp.reason
    );
    for h in &headers {
        push(&mut out, &h.name, &h.value);
    }
    if (framing == Framing::Chunked && body == ClientBody::Verbatim)
        || (body == ClientBody::Gunzip && client_minor >= 1)
    {
        push(&mut out, "Transfer-Encoding", b"chunked");
    }
    if !keep {
        push(&mut out, "Connection", b"close");
    } else if client_minor == 0 {
        push(&mut out, "Connection", b"keep-alive");
    }
    out.extend_from_slice(b"\r\n");
    (out, body, keep)
}

/// Whether the client asked to keep its connection open after this request.
pub fn client_keep_alive(head: &RequestHead) -> bool {
    if http1::has_token(&head.headers, "connection", "close") {
        return false;
    }
    head.minor >= 1 || http1::has_token(&head.headers, "connection", "keep-alive")
}

/// Whether this is an upgrade request (kubectl's `IsUpgradeRequest`:
/// `Connection` holds the `upgrade` token).
pub fn is_upgrade(head: &RequestHead) -> bool {
    http1::has_token(&head.headers, "connection", "upgrade")
}

/// The current time as an HTTP date (the `Date` header).
pub fn now_http_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    super::static_files::httpdate::format(secs)
}

/// Whether a response with `status` may carry a body (Go's
/// `bodyAllowedForStatus`): not 1xx, 204 or 304.
pub fn body_allowed(status: u16) -> bool {
    !((100..200).contains(&status) || status == 204 || status == 304)
}

/// Whether Go's server, writing an upstream answer for kubectl's
/// `ReverseProxy`, would add a sniffed `Content-Type` (net/http server.go,
/// `chunkWriter.writeHeader`: only when the handler set no `Content-Type`
/// at all (an empty one counts as set), no non-empty `Content-Encoding`,
/// the status allows a body, and the first write carries bytes). The first
/// write only precedes the header flush when the answer's length is known:
/// for an answer of unknown length `ReverseProxy` flushes the header at once
/// (flush interval -1), so chunked and gunzipped answers get no type (for
/// answers delimited by close kubectl races and sometimes sniffs; we never
/// do). HEAD answers have no body to sniff.
pub fn sniff_wanted(method: &str, resp: &ResponseHead, framing: Framing) -> bool {
    method != "HEAD"
        && body_allowed(resp.status)
        && matches!(framing, Framing::Length(n) if n > 0)
        && !resp
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("content-type"))
        && resp
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-encoding"))
            .is_none_or(|h| h.value.is_empty())
}

/// Adds the `Content-Type` Go's `http.DetectContentType` finds in the
/// answer's first bytes (call when [`sniff_wanted`] and bytes are at hand).
pub fn add_sniffed_type(resp: &mut ResponseHead, first: &[u8]) {
    if first.is_empty() {
        return;
    }
    let n = first.len().min(super::static_files::sniff::SNIFF_LEN);
    resp.headers.push(Header {
        name: "Content-Type".into(),
        value: super::static_files::sniff::detect(&first[..n])
            .as_bytes()
            .to_vec(),
    });
}

/// An interim (1xx) answer relayed to an HTTP/1.1 client as Go's server
/// writes it for `ReverseProxy`'s `Got1xxResponse`: Go's status text,
/// canonical header names sorted, no Content-Length or Transfer-Encoding.
pub fn informational_head(resp: &ResponseHead) -> Vec<u8> {
    let mut headers: Vec<(String, &[u8])> = resp
        .headers
        .iter()
        .filter(|h| {
            !h.name.eq_ignore_ascii_case("content-length")
                && !h.name.eq_ignore_ascii_case("transfer-encoding")
        })
        .map(|h| (http1::canonical_name(&h.name), h.value.as_slice()))
        .collect();
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::with_capacity(64);
    let text = match reason(resp.status) {
        "Unknown" => format!("status code {}", resp.status),
        r => r.to_string(),
    };
    let _ = write!(
        out_string(&mut out),
        "HTTP/1.1 {} {}\r\n",
        resp.status,
        text
    );
    for (n, v) in headers {
        push(&mut out, &n, v);
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A complete short response (errors, redirects, filter rejections) to a
/// GET-like request; see [`local_response`].
pub fn simple_response(
    status: u16,
    content_type: Option<&str>,
    extra: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) -> Vec<u8> {
    local_response("GET", status, content_type, extra, body, keep_alive)
}

/// A complete response written by the proxy itself, framed as Go's server
/// frames a handler's answer: a `Date`; no Content-Length and no body for
/// 1xx, 204 and 304; for HEAD the length of the body a GET would get
/// (none when that body is empty) and no body bytes.
pub fn local_response(
    method: &str,
    status: u16,
    content_type: Option<&str>,
    extra: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + body.len());
    let _ = write!(
        out_string(&mut out),
        "HTTP/1.1 {} {}\r\n",
        status,
        reason(status)
    );
    if let Some(ct) = content_type.filter(|_| status != 304) {
        push(&mut out, "Content-Type", ct.as_bytes());
        if ct.starts_with("text/plain") {
            push(&mut out, "X-Content-Type-Options", b"nosniff");
        }
    }
    for (n, v) in extra {
        push(&mut out, n, v.as_bytes());
    }
    push(&mut out, "Date", now_http_date().as_bytes());
    let allowed = body_allowed(status);
    let head = method == "HEAD";
    if allowed && !(head && body.is_empty()) {
        push(
            &mut out,
            "Content-Length",
            body.len().to_string().as_bytes(),
        );
    }
    if !keep_alive {
        push(&mut out, "Connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    if allowed && !head {
        out.extend_from_slice(body);
    }
    out
}

/// Go's `http.Error`: `text/plain; charset=utf-8`, the text and a newline.
pub fn error_response(status: u16, text: &str, keep_alive: bool) -> Vec<u8> {
    error_response_to("GET", status, text, keep_alive)
}

/// [`error_response`] to a request with `method` (HEAD gets no body).
pub fn error_response_to(method: &str, status: u16, text: &str, keep_alive: bool) -> Vec<u8> {
    local_response(
        method,
        status,
        Some("text/plain; charset=utf-8"),
        &[],
        format!("{text}\n").as_bytes(),
        keep_alive,
    )
}

pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        102 => "Processing",
        103 => "Early Hints",
        200 => "OK",
        301 => "Moved Permanently",
        304 => "Not Modified",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Request Entity Too Large",
        414 => "Request URI Too Long",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static NO_IMPERSONATION: Impersonation = Impersonation {
        user: String::new(),
        uid: String::new(),
        groups: Vec::new(),
        extra: std::collections::BTreeMap::new(),
    };

    fn upstream() -> UpstreamHead<'static> {
        UpstreamHead {
            host: "127.0.0.1:6443",
            authorization: Some("Bearer tok".into()),
            impersonation: &NO_IMPERSONATION,
            forward_proxy: None,
        }
    }

    fn head(raw: &[u8]) -> RequestHead {
        http1::parse_request(raw, http1::HeadLimit::GO_SERVER)
            .unwrap()
            .unwrap()
            .0
    }

    #[test]
    fn request_rewrite_follows_reverse_proxy() {
        let h = head(b"POST /x HTTP/1.1\r\nHost: localhost:8001\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Forwarded-For: 1.2.3.4\r\nTransfer-Encoding: chunked\r\nTe: trailers, deflate\r\n\r\n");
        let out = request_head(
            &h,
            "/x",
            Framing::Chunked,
            Some("127.0.0.1".parse().unwrap()),
            &upstream(),
            false,
            true,
        );
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.starts_with("POST /x HTTP/1.1\r\nHost: 127.0.0.1:6443\r\n"),
            "{s}"
        );
        assert!(s.contains("Authorization: Bearer tok\r\n"));
        assert!(s.contains("User-Agent: edgetunnel/"));
        assert!(s.contains("X-Forwarded-For: 1.2.3.4, 127.0.0.1\r\n"));
        assert!(s.contains("Te: trailers\r\n"));
        assert!(s.contains("Transfer-Encoding: chunked\r\n"));
        assert!(!s.contains("X-Hop"));
        assert!(!s.contains("keep-alive"));
        assert!(s.contains("Accept-Encoding: gzip\r\n"));
    }

    #[test]
    fn own_credentials_win_and_upgrades_keep_connection_headers() {
        let h = head(b"GET /x HTTP/1.1\r\nHost: h:1\r\nAuthorization: Bearer mine\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nUser-Agent: t\r\n\r\n");
        assert!(is_upgrade(&h));
        let s = String::from_utf8(request_head(
            &h,
            "/x",
            Framing::None,
            None,
            &upstream(),
            true,
            false,
        ))
        .unwrap();
        assert!(s.contains("Authorization: Bearer mine\r\n"));
        assert!(!s.contains("Bearer tok"));
        assert!(s.contains("Upgrade: websocket\r\n"));
        assert!(s.contains("User-Agent: t\r\n"));
    }

    #[test]
    fn through_a_forward_proxy_the_target_is_absolute() {
        let h = head(b"GET /x?y=1 HTTP/1.1\r\nHost: h:1\r\n\r\n");
        let mut up = upstream();
        up.forward_proxy = Some(ForwardProxy {
            authorization: Some("Basic dTpw".into()),
        });
        let s = String::from_utf8(request_head(
            &h,
            "/x?y=1",
            Framing::None,
            None,
            &up,
            false,
            false,
        ))
        .unwrap();
        assert!(
            s.starts_with("GET http://127.0.0.1:6443/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:6443\r\n"),
            "{s}"
        );
        assert!(
            s.ends_with("Proxy-Authorization: Basic dTpw\r\n\r\n"),
            "{s}"
        );
        up.forward_proxy = Some(ForwardProxy::default());
        let s = String::from_utf8(request_head(
            &h,
            "/x",
            Framing::None,
            None,
            &up,
            false,
            false,
        ))
        .unwrap();
        assert!(!s.contains("Proxy-Authorization"), "{s}");
    }

    #[test]
    fn sniffing_follows_go_server_rules() {
        let resp = |status: u16, hs: &[(&str, &str)]| ResponseHead {
            status,
            reason: String::new(),
            minor: 1,
            headers: hs
                .iter()
                .map(|(n, v)| Header {
                    name: n.to_string(),
                    value: v.as_bytes().to_vec(),
                })
                .collect(),
        };
        let len = Framing::Length(5);
        assert!(sniff_wanted("GET", &resp(200, &[]), len));
        assert!(sniff_wanted(
            "GET",
            &resp(404, &[("Content-Encoding", "")]),
            len
        ));
        assert!(!sniff_wanted("HEAD", &resp(200, &[]), len));
        assert!(!sniff_wanted("GET", &resp(204, &[]), len));
        assert!(!sniff_wanted("GET", &resp(200, &[]), Framing::Length(0)));
        assert!(!sniff_wanted("GET", &resp(200, &[]), Framing::Chunked));
        assert!(!sniff_wanted("GET", &resp(200, &[]), Framing::UntilClose));
        assert!(!sniff_wanted(
            "GET",
            &resp(200, &[("content-type", "")]),
            len
        ));
        assert!(!sniff_wanted(
            "GET",
            &resp(200, &[("Content-Encoding", "br")]),
            len
        ));
        let mut r = resp(200, &[]);
        add_sniffed_type(&mut r, b"<html><body>");
        assert_eq!(
            http1::get(&r.headers, "content-type"),
            Some("text/html; charset=utf-8")
        );
    }

    #[test]
    fn append_server_path_joins() {
        let u = RequestUrl::parse("/api?x=1").unwrap();
        assert_eq!(upstream_target(&u, "/base", true), "/base/api?x=1");
        assert_eq!(upstream_target(&u, "/base", false), "/api?x=1");
        assert_eq!(upstream_target(&u, "", true), "/api?x=1");
    }

    #[test]
    fn local_answers_are_framed_as_go_frames_them() {
        let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
        let get = s(error_response_to("GET", 403, "Forbidden", true));
        assert!(get.contains("\r\nDate: ") && get.contains("Content-Length: 10\r\n"));
        assert!(get.ends_with("\r\n\r\nForbidden\n"), "{get}");
        // HEAD: the length a GET would get, no body bytes.
        let head = s(error_response_to("HEAD", 403, "Forbidden", true));
        assert!(head.contains("Content-Length: 10\r\n") && head.ends_with("\r\n\r\n"));
        // HEAD with an empty body, 304 and 204: no Content-Length at all.
        let redirect = s(local_response(
            "HEAD",
            301,
            None,
            &[("Location", "/x")],
            b"",
            true,
        ));
        assert!(!redirect.contains("Content-Length"), "{redirect}");
        let nm = s(simple_response(304, Some("text/plain"), &[], b"", true));
        assert!(
            !nm.contains("Content-Length") && !nm.contains("Content-Type"),
            "{nm}"
        );
        assert!(s(simple_response(301, None, &[], b"", true)).contains("Content-Length: 0\r\n"));
    }

    #[test]
    fn relayed_heads_drop_conflicting_and_bodiless_lengths() {
        let parse = |raw: &[u8]| {
            http1::parse_response(raw, http1::HeadLimit::GO_SERVER)
                .unwrap()
                .unwrap()
                .0
        };
        let r =
            parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n");
        let (out, _, _) = response_head(&r, Framing::Chunked, 1, true, false);
        let out = String::from_utf8(out).unwrap();
        assert!(
            !out.contains("Content-Length") && out.contains("Date: "),
            "{out}"
        );
        let r = parse(b"HTTP/1.1 304 Not Modified\r\nContent-Type: a/b\r\nContent-Length: 42\r\nDate: d\r\n\r\n");
        let (out, _, _) = response_head(&r, Framing::None, 1, true, false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 304 Not Modified\r\nDate: d\r\n\r\n"
        );
        let r = parse(b"HTTP/1.1 199 Odd\r\nx-b: 2\r\nContent-Length: 5\r\nA: 1\r\n\r\n");
        assert_eq!(
            String::from_utf8(informational_head(&r)).unwrap(),
            "HTTP/1.1 199 status code 199\r\nA: 1\r\nX-B: 2\r\n\r\n"
        );
    }

    #[test]
    fn response_framing_to_client() {
        let (r, _) = http1::parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            http1::HeadLimit::GO_SERVER,
        )
        .unwrap()
        .unwrap();
        let (out, body, keep) = response_head(&r, Framing::Chunked, 1, true, false);
        let s = String::from_utf8(out).unwrap();
        assert_eq!(body, ClientBody::Verbatim);
        assert!(keep);
        assert!(s.contains("Transfer-Encoding: chunked\r\n"));
        let (_, body, keep) = response_head(&r, Framing::Chunked, 0, true, false);
        assert_eq!((body, keep), (ClientBody::Dechunk, false));
    }
}
