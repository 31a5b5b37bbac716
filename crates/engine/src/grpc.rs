//! gRPC over HTTP/2: sending and receiving ANP Packets on one stream, on
//! the h2 crate (our agent's client side: [`PacketSender`]) or on our own
//! server ([`h2_conn`]: [`StreamSender`], the gRPC frontend and the
//! server's agent links).
//!
//! Outgoing messages go out as `head ++ payload` (no copy) and only once
//! the message before left, so at most about one message per stream waits
//! in the HTTP/2 layer. Incoming DATA chunks feed a [`PacketDecoder`],
//! which hands DATA payload on as slices of those chunks (never joined);
//! flow-control credit is returned as the decoder hands bytes on, not as it
//! takes them: a message gathered whole counts against the windows until
//! it is decoded (issue 39, finding 4).

use std::task::{ready, Context, Poll};

use bytes::buf::Chain;
use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue};

use crate::h2_conn;
use protocol::anp::grpc_frame::FrameError;
use protocol::anp::packet::{self, Encoded, Frame, PacketError};
use protocol::anp::packet_decoder::PacketDecoder;

/// The buffer type every h2 stream of ours sends.
pub type SendBuf = Chain<Bytes, Bytes>;

/// HTTP/2 windows: the agent stream carries every tunneled connection of an
/// agent, so it gets a large window.
pub const STREAM_WINDOW: u32 = 16 * 1024 * 1024;
pub const H2_CONNECTION_WINDOW: u32 = 32 * 1024 * 1024;
/// An agent link's HTTP/2 windows (stream and connection) once both ends
/// grow per-connection windows with the path (`window-growth`): the
/// tunnels' own windows then bound what is in flight (each up to
/// [`crate::window::MAX_TUNNEL_WINDOW`], all of a link's growth within
/// [`crate::window::LINK_GROWTH_BUDGET`]), and the link's must not bind
/// first: fixed ones of 16 and 32 MiB, credit back at half, moved at most
/// 8 MiB a round trip.
pub const GROWN_LINK_WINDOW: u32 = 256 * 1024 * 1024;
pub const MAX_FRAME: u32 = 256 * 1024;
pub const MAX_SEND_BUFFER: usize = 1024 * 1024;

/// A stream window of at least `at_least` that holds a whole message of
/// `max_message` bytes and its prefix: a message gathered whole gives its
/// window back only once decoded, so a smaller window could never take it.
pub fn stream_window_for(max_message: usize, at_least: u32) -> u32 {
    let whole = max_message.saturating_add(protocol::anp::grpc_frame::HEADER_LEN);
    at_least.max(whole.min(MAX_WINDOW as usize) as u32)
}

/// The largest HTTP/2 window (RFC 9113 6.9.1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// The HTTP/2 settings an agent dials its servers with: the same windows
/// and frame size as the server's agent links (`server::agent_conn`).
pub fn h2_client(stream_window: u32) -> h2::client::Builder {
    let mut b = h2::client::Builder::new();
    b.initial_window_size(stream_window)
        .initial_connection_window_size(H2_CONNECTION_WINDOW.max(stream_window))
        .max_frame_size(MAX_FRAME)
        .max_send_buffer_size(MAX_SEND_BUFFER);
    b
}

#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("HTTP/2: {0}")]
    H2(#[from] h2::Error),
    #[error("gRPC framing: {0}")]
    Frame(#[from] FrameError),
    #[error("{0}")]
    Packet(#[from] PacketError),
    #[error("gRPC status {code}: {message}")]
    Status { code: u32, message: String },
    #[error("stream closed by peer")]
    Closed,
    #[error("HTTP/2: {0}")]
    Recv(#[from] crate::h2_conn::RecvError),
    #[error("HTTP/2: {0}")]
    Send(#[from] protocol::h2_server::SendError),
}

/// The sending half of a Packet stream.
pub struct PacketSender {
    stream: SendStream<SendBuf>,
}

impl PacketSender {
    pub fn new(stream: SendStream<SendBuf>) -> Self {
        Self { stream }
    }

    /// Sends one encoded message, waiting for flow-control capacity first.
    pub async fn send(&mut self, msg: Encoded) -> Result<(), GrpcError> {
        let len = msg.len();
        self.stream.reserve_capacity(len);
        while self.stream.capacity() == 0 {
            match futures::future::poll_fn(|cx| self.stream.poll_capacity(cx)).await {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Err(GrpcError::Closed),
            }
        }
        self.stream.send_data(msg.head.chain(msg.payload), false)?;
        Ok(())
    }

    pub async fn send_frame(&mut self, frame: Frame) -> Result<(), GrpcError> {
        self.send(packet::encode(frame)).await
    }

    /// Ends the stream with gRPC trailers (server side).
    pub fn finish_with_status(&mut self, code: u32, message: &str) -> Result<(), GrpcError> {
        self.stream.send_trailers(status_trailers(code, message))?;
        Ok(())
    }

    /// Ends the stream without trailers (client side half-close).
    pub fn finish(&mut self) -> Result<(), GrpcError> {
        self.stream
            .send_data(Bytes::new().chain(Bytes::new()), true)?;
        Ok(())
    }

    /// Ready when the peer resets the stream (or the connection fails).
    pub fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<Result<h2::Reason, GrpcError>> {
        self.stream.poll_reset(cx).map_err(Into::into)
    }

    pub fn reset(&mut self) {
        self.stream.send_reset(h2::Reason::CANCEL);
    }
}

/// A body of gRPC messages: an h2 stream's, or a frontend stream's
/// ([`h2_conn::StreamRecv`]).
pub trait Body {
    /// The next chunk; its flow-control credit comes back with
    /// [`Self::consumed`].
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, GrpcError>>>;
    /// `n` bytes of the chunks taken were used: their credit goes back.
    fn consumed(&mut self, n: usize);
    /// After the last chunk: a non-OK `grpc-status` in the trailers.
    fn poll_status(&mut self, cx: &mut Context<'_>) -> Poll<Option<GrpcError>>;
}

impl Body for RecvStream {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, GrpcError>>> {
        Poll::Ready(match ready!(self.poll_data(cx)) {
            Some(Ok(chunk)) => Some(Ok(chunk)),
            Some(Err(e)) => Some(Err(e.into())),
            None => None,
        })
    }

    fn consumed(&mut self, n: usize) {
        let _ = self.flow_control().release_capacity(n);
    }

    fn poll_status(&mut self, cx: &mut Context<'_>) -> Poll<Option<GrpcError>> {
        Poll::Ready(match ready!(self.poll_trailers(cx)) {
            Ok(Some(trailers)) => status_error(&trailers),
            _ => None,
        })
    }
}

impl Body for h2_conn::StreamRecv {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, GrpcError>>> {
        self.poll_data(cx).map(|c| c.map(|r| r.map_err(Into::into)))
    }

    fn consumed(&mut self, n: usize) {
        h2_conn::StreamRecv::consumed(self, n)
    }

    /// A caller's request trailers carry no status.
    fn poll_status(&mut self, _: &mut Context<'_>) -> Poll<Option<GrpcError>> {
        Poll::Ready(None)
    }
}

/// The receiving half of a Packet stream.
pub struct PacketReceiver<B = RecvStream> {
    body: B,
    decoder: PacketDecoder,
    /// The body ended; only trailers remain.
    body_done: bool,
}

impl<B: Body> PacketReceiver<B> {
    pub fn new(body: B, max_message: usize) -> Self {
        Self {
            body,
            decoder: PacketDecoder::new(max_message),
            body_done: false,
        }
    }

    /// Whether the last packet given continues the one before: a later
    /// piece of one DATA packet's payload (count packets only when not).
    pub fn continued(&self) -> bool {
        self.decoder.continued()
    }

    /// The next packet; `Ok(None)` at a clean end of stream. A DATA
    /// packet's payload may come as several packets of the same connection
    /// (see [`PacketDecoder`]). Packets of a type this build does not know
    /// are skipped with a log line.
    /// Cancel-safe: bytes already received stay in the decoder.
    pub async fn next(&mut self) -> Result<Option<Frame>, GrpcError> {
        futures::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// [`Self::next`] as a poll function.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Frame>, GrpcError>> {
        loop {
            // The bytes the decoder hands on (or skips) give their
            // flow-control credit back; those it keeps do not.
            let before = self.decoder.buffered();
            let next = self.decoder.next_packet();
            let used = before - self.decoder.buffered();
            if used > 0 {
                self.body.consumed(used);
            }
            if let Some(decoded) = next? {
                match decoded {
                    Ok(f) => return Poll::Ready(Ok(Some(f))),
                    Err(PacketError::UnknownType(t)) => {
                        tracing::debug!(packet_type = t, "skipping packet of unknown type");
                        continue;
                    }
                    Err(e) => return Poll::Ready(Err(e.into())),
                }
            }
            if !self.body_done {
                let Poll::Ready(chunk) = self.body.poll_chunk(cx) else {
                    // Waiting for the peer: an idle stream keeps no room,
                    // and a few bytes kept (a message's start) do not keep
                    // the whole chunk they came in.
                    self.decoder.compact();
                    return Poll::Pending;
                };
                match chunk {
                    Some(Ok(chunk)) => {
                        self.decoder.push(chunk);
                        continue;
                    }
                    Some(Err(e)) => return Poll::Ready(Err(e)),
                    None => {
                        self.decoder.finish()?;
                        self.body_done = true;
                    }
                }
            }
            if let Some(err) = ready!(self.body.poll_status(cx)) {
                return Poll::Ready(Err(err));
            }
            return Poll::Ready(Ok(None));
        }
    }
}

/// The sending half of a frontend stream ([`h2_conn::StreamSend`]): the
/// response head, Packets, and the status that ends it.
pub struct StreamSender {
    stream: h2_conn::StreamSend,
}

impl StreamSender {
    /// Sends the response head (`content-type: application/grpc`).
    pub fn start(stream: h2_conn::StreamSend) -> Result<Self, GrpcError> {
        Self::start_with(stream, &[])
    }

    /// Sends the response head with `metadata` after the content type.
    pub fn start_with(
        mut stream: h2_conn::StreamSend,
        metadata: &[(&str, String)],
    ) -> Result<Self, GrpcError> {
        let mut fields = Vec::with_capacity(1 + metadata.len());
        fields.push(("content-type", "application/grpc"));
        fields.extend(metadata.iter().map(|(k, v)| (*k, v.as_str())));
        stream.send_head(&fields, false)?;
        Ok(StreamSender { stream })
    }

    /// A trailers-only error answer (the call is over).
    pub fn refuse(stream: &mut h2_conn::StreamSend, code: u32, message: &str) {
        let status = Status::new(code, message);
        let fields: Vec<_> = std::iter::once(("content-type", "application/grpc"))
            .chain(status.fields())
            .collect();
        let _ = stream.send_head(&fields, true);
    }

    /// Sends one encoded message once the one before went out.
    pub async fn send(&mut self, msg: Encoded) -> Result<(), GrpcError> {
        futures::future::poll_fn(|cx| self.stream.poll_ready(cx)).await?;
        self.stream.send_data([msg.head, msg.payload])?;
        Ok(())
    }

    pub async fn send_frame(&mut self, frame: Frame) -> Result<(), GrpcError> {
        self.send(packet::encode(frame)).await
    }

    /// Ends the stream with gRPC trailers.
    pub fn finish_with_status(&mut self, code: u32, message: &str) -> Result<(), GrpcError> {
        let status = Status::new(code, message);
        let fields: Vec<_> = status.fields().collect();
        self.stream.send_trailers(&fields)?;
        Ok(())
    }

    /// Ready when the caller resets the stream (or the connection ends).
    pub fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<Result<u32, GrpcError>> {
        self.stream.poll_reset(cx).map_err(Into::into)
    }
}

/// A call's status as header fields: `grpc-status`, and `grpc-message`
/// (percent-encoded) when there is a message.
struct Status {
    code: String,
    message: String,
}

impl Status {
    fn new(code: u32, message: &str) -> Self {
        Status {
            code: code.to_string(),
            message: encode_message(message),
        }
    }

    fn fields(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let message = (!self.message.is_empty()).then_some(("grpc-message", &*self.message));
        std::iter::once(("grpc-status", &*self.code)).chain(message)
    }
}

/// `grpc-message` as gRPC percent-encodes it: printable ASCII but `%`
/// stays, every other byte is `%XX`.
fn encode_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `grpc-status` and `grpc-message` trailers.
pub fn status_trailers(code: u32, message: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in Status::new(code, message).fields() {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    }
    h
}

/// A non-OK `grpc-status` in headers or trailers, as an error.
pub fn status_error(headers: &HeaderMap) -> Option<GrpcError> {
    let code: u32 = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    if code == 0 {
        return None;
    }
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    Some(GrpcError::Status { code, message })
}

/// gRPC status codes used here.
pub mod code {
    pub const OK: u32 = 0;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const NOT_FOUND: u32 = 5;
    pub const ALREADY_EXISTS: u32 = 6;
    pub const PERMISSION_DENIED: u32 = 7;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const FAILED_PRECONDITION: u32 = 9;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;
    pub const UNAUTHENTICATED: u32 = 16;

    /// The codes the server refuses an agent's Connect with, by the names
    /// grpc-go's `codes.Code.String()` gives them (metric labels).
    pub const REFUSALS: [(u32, &str); 6] = [
        (INVALID_ARGUMENT, "InvalidArgument"),
        (ALREADY_EXISTS, "AlreadyExists"),
        (PERMISSION_DENIED, "PermissionDenied"),
        (FAILED_PRECONDITION, "FailedPrecondition"),
        (UNIMPLEMENTED, "Unimplemented"),
        (UNAUTHENTICATED, "Unauthenticated"),
    ];
}

/// The name grpc-go's `codes.Code.String()` gives status `code`.
pub fn code_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    NAMES.get(code as usize).copied().unwrap_or("Unknown")
}

/// The status code a grpc-go server's `stream.Recv()` reports for a read
/// that ended in `e`, by name (the `code` label of ANP's
/// `stream_errors_total`). Taken from grpc-go's `internal/transport`: a
/// client's RST_STREAM maps through `http2ErrConvTab` (CANCEL: Canceled,
/// REFUSED_STREAM: Unavailable, FLOW_CONTROL_ERROR and ENHANCE_YOUR_CALM:
/// ResourceExhausted, INADEQUATE_SECURITY: PermissionDenied, the rest
/// Internal); a connection that goes away cancels its streams' contexts,
/// read as Canceled; a message that does not decode is Internal. ANP's
/// Go server (pkg/server/server.go, `GrpcFrontend.Recv`) counts every
/// error but io.EOF, so a client closing its tunnel the usual way (its
/// context canceled) is `Canceled` there.
pub fn recv_error_code(e: &GrpcError) -> &'static str {
    use crate::h2_conn::RecvError;
    let reset = |r: u32| match r {
        0x8 => "Canceled",
        0x7 => "Unavailable",
        0x3 | 0xb => "ResourceExhausted",
        0xc => "PermissionDenied",
        _ => "Internal",
    };
    match e {
        GrpcError::Recv(RecvError::Reset(r)) => reset(*r),
        GrpcError::Recv(RecvError::ConnClosed) => "Canceled",
        GrpcError::H2(h) => match h.reason() {
            Some(r) => reset(r.into()),
            None if h.is_io() || h.is_go_away() => "Canceled",
            None => "Unknown",
        },
        GrpcError::Status { code, .. } => code_name(*code),
        GrpcError::Frame(_) | GrpcError::Packet(_) => "Internal",
        GrpcError::Closed | GrpcError::Send(_) => "Unknown",
    }
}

/// A gRPC request head for `path` on `authority`.
pub fn request_head(
    authority: &str,
    path: &str,
    metadata: &[(&str, String)],
) -> Result<http::Request<()>, http::Error> {
    let mut r = http::Request::builder()
        .method("POST")
        .uri(format!("https://{authority}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header(
            "user-agent",
            concat!("edgetunnel/", env!("CARGO_PKG_VERSION")),
        );
    for (k, v) in metadata {
        r = r.header(*k, v.as_str());
    }
    r.body(())
}

/// Whether a request head is a gRPC call.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_grpc_content_type)
}

/// Whether a `content-type` value is gRPC's.
pub fn is_grpc_content_type(value: &str) -> bool {
    value.starts_with("application/grpc")
}

/// The single value of a metadata key, if exactly one is present.
pub fn single(headers: &HeaderMap, key: &str) -> Result<Option<String>, String> {
    let mut values = headers.get_all(key).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("metadata {key} given more than once"));
    }
    first
        .to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| format!("metadata {key} is not text"))
}

/// Convenience: a DATA frame payload copy-free chain.
pub fn chain(head: Bytes, payload: Bytes) -> SendBuf {
    head.chain(payload)
}

/// Remaining bytes of a send buffer (for metrics).
pub fn remaining(b: &SendBuf) -> usize {
    b.remaining()
}
