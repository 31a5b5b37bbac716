//! The server side of an HTTP/2 connection (RFC 9113), sans-I/O, for the
//! gRPC frontend and the agent listener: it holds no buffer while the
//! connection is idle.
//!
//! The h2 crate allocates three fixed buffers per connection (16 KiB to
//! write, 8 KiB to read, 4 KiB for HPACK) and keeps them while the
//! connection lives; konnectivity-client opens one HTTP/2 connection per
//! tunnel, so an idle tunnel cost about 28 KB, and a server holds one
//! connection per agent (thousands, mostly idle). Here input is handed in by
//! the caller ([`ServerConn::recv`] takes what it can from the caller's
//! buffer, which the caller may drop or reuse once it is empty), DATA
//! payload is passed on as slices of that buffer (no copy) as soon as it
//! arrives (a DATA frame is never collected whole), and output is a queue
//! of `Bytes` chunks ([`ServerConn::take_output`]) that is empty, and holds
//! no allocation, when nothing is waiting to go out.
//!
//! What it does:
//! * the client preface and the first SETTINGS; our SETTINGS and the
//!   connection window at the start; SETTINGS ACK, PING ACK, PRIORITY
//!   (ignored), GOAWAY both ways, RST_STREAM both ways, unknown frame types
//!   (ignored);
//! * request header blocks (HEADERS, CONTINUATION, padding, priority)
//!   decoded with the client's HPACK state, any `:authority` accepted (the
//!   Go server accepts any; grpc-go sends a percent-encoded socket path);
//!   the other fields kept for the caller when it asks
//!   ([`Config::keep_fields`]: an agent's metadata);
//!   request trailers end the request;
//! * our keepalive PINGs ([`ServerConn::ping`], [`Event::Pong`]);
//! * flow control both ways: received DATA counts against the windows we
//!   granted and the credit is given back as the caller takes the data
//!   ([`ServerConn::take_data`]); sent DATA waits for the client's windows
//!   and for the output queue to drain below [`OUT_HIGH`];
//! * response heads and trailers encoded without the dynamic table
//!   (static indexes and literals), split into CONTINUATION frames when
//!   needed;
//! * limits: concurrent streams (REFUSED_STREAM past them), counted as
//!   grpc-go counts them: a stream whose END_STREAM or RST_STREAM is out,
//!   or that the client reset, no longer counts, even while the caller
//!   still holds it; the header list size, the frame size we advertise; a
//!   protocol violation is a connection error (GOAWAY, then the caller
//!   closes) or, where RFC 9113 allows, a stream error (RST_STREAM);
//! * floods ([`Flood`]), GOAWAY ENHANCE_YOUR_CALM as the h2 crate does:
//!   more than [`MAX_PENDING_RESETS`] streams reset by the client before
//!   the caller took them (rapid reset, CVE-2023-44487), and a header
//!   block in more CONTINUATION frames than its largest size needs (empty
//!   ones add no bytes to the size limit);
//! * stream states (RFC 9113 5.1): a new stream id not above the last is
//!   a connection error; HEADERS or DATA on a half-closed (remote) or
//!   closed stream is STREAM_CLOSED, except what was in flight when we
//!   reset the stream (the last few ids we reset are remembered);
//!   `content-length` is checked against the DATA (8.1.1), trailers must
//!   end the request and carry no pseudo-header (8.1);
//! * a response that ends before its request keeps the stream, without
//!   its caller, until the client ends or resets its side, so what the
//!   client still sends is checked ([`ServerConn::release`]).
//!
//! Streams carry a caller value `U` (the runtime keeps its wakers there).
//! [`Event::Wake`] names a stream whose state changed for its reader or
//! writer (data, end, reset, window).

use std::borrow::Cow;
use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use loona_hpack::decoder::DecoderError;

mod wire;
pub use wire::{encode_field, put_frame_header, write_block, FRAME_HEADER_LEN, PREFACE};

/// Frame types (RFC 9113 section 6).
pub mod frame_type {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}
use frame_type::*;

use wire::{END_HEADERS, END_STREAM, PADDED, PRIORITY as PRIORITY_FLAG};
const ACK: u8 = 0x1;

/// Error codes (RFC 9113 section 7).
pub mod reason {
    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const INTERNAL_ERROR: u32 = 0x2;
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const STREAM_CLOSED: u32 = 0x5;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// SETTINGS identifiers.
const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

const DEFAULT_WINDOW: i64 = 65_535;
const MAX_WINDOW: i64 = (1 << 31) - 1;
const MIN_MAX_FRAME: u32 = 16_384;
const MAX_MAX_FRAME: u32 = (1 << 24) - 1;

/// Output queued past this many bytes: stream DATA waits (and the caller
/// should stop reading input until the queue drains, so that a client
/// that sends PINGs or SETTINGS without reading cannot grow it).
pub const OUT_HIGH: usize = 64 * 1024;

/// What the connection advertises and enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// SETTINGS_INITIAL_WINDOW_SIZE: each stream's receive window.
    pub stream_window: u32,
    /// The connection's receive window.
    pub conn_window: u32,
    /// SETTINGS_MAX_FRAME_SIZE we accept.
    pub max_frame: u32,
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113 counting: name + value + 32
    /// per field); also bounds a header block's encoded size.
    pub max_header_list: u32,
    /// DATA payload pieces shorter than this are copied out of the input
    /// rather than sliced: a slice keeps the caller's whole read buffer
    /// alive, so a client sending tiny DATA frames among other bytes
    /// could otherwise hold a buffer per byte of window. Pieces this long
    /// or longer keep at most `buffer size / copy_below` times their size.
    pub copy_below: usize,
    /// Keep a request's other header fields in [`RequestHead::fields`]
    /// (the agent listener reads its metadata there; the gRPC frontend
    /// needs none and keeps none).
    pub keep_fields: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            stream_window: 4 * 1024 * 1024,
            conn_window: 32 * 1024 * 1024,
            max_frame: 256 * 1024,
            max_streams: 1_024,
            max_header_list: 64 * 1024,
            copy_below: 4 * 1024,
            keep_fields: false,
        }
    }
}

/// A connection error: the connection is over. The GOAWAY carrying `code`
/// is already queued in the output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP/2 connection error {code:#x}: {what}")]
pub struct ConnError {
    pub code: u32,
    pub what: &'static str,
    /// The error is a flood the connection bounds (for metrics).
    pub flood: Option<Flood>,
}

fn conn_err(code: u32, what: &'static str) -> ConnError {
    ConnError {
        code,
        what,
        flood: None,
    }
}

fn flood_err(flood: Flood, what: &'static str) -> ConnError {
    ConnError {
        code: reason::ENHANCE_YOUR_CALM,
        what,
        flood: Some(flood),
    }
}

/// The parts of a request head the frontend looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub path: String,
    pub authority: Option<String>,
    pub content_type: Option<String>,
    /// `content-length`, checked against the DATA received (RFC 9113
    /// 8.1.1).
    pub content_length: Option<u64>,
    /// The regular fields besides `content-type` and `content-length`, in
    /// order, with [`Config::keep_fields`] (empty otherwise).
    pub fields: Vec<(String, Vec<u8>)>,
}

/// What happened, for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new request (stream). `end_stream`: the request has no body.
    Request {
        stream: u32,
        head: RequestHead,
        end_stream: bool,
    },
    /// A stream's reader or writer may proceed (data, end, reset, window).
    Wake(u32),
    /// The PING we sent was answered.
    Pong,
    /// The client sent GOAWAY: it opens no new stream.
    GoAway { last_stream: u32, code: u32 },
}

/// What [`ServerConn::take_data`] finds on a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recv {
    Data(Bytes),
    /// The request ended (END_STREAM; trailers, if any, are dropped).
    End,
    /// The stream was reset (by the client, or by us for an error).
    Reset(u32),
    /// Nothing yet: wait for [`Event::Wake`].
    Pending,
}

/// Why a stream cannot send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("stream reset ({0:#x})")]
    Reset(u32),
    #[error("stream already ended")]
    Ended,
    #[error("no such stream")]
    Gone,
    #[error("connection closed")]
    ConnClosed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecvSide {
    Open,
    Ended,
    /// We reset the stream (or the connection failed): frames the client
    /// had sent before it saw our RST_STREAM are ignored.
    Reset(u32),
    /// The client reset it: it sends nothing more on it (RFC 9113 5.1).
    PeerReset(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendSide {
    /// No response head yet.
    Idle,
    Open,
    /// The end (trailers or an empty END_STREAM DATA) waits behind the
    /// queued data.
    Ending,
    Ended,
    Reset(u32),
}

struct Stream<U> {
    id: u32,
    user: U,
    recv: VecDeque<Bytes>,
    recv_side: RecvSide,
    /// Window we granted minus what arrived.
    recv_window: i64,
    /// Taken by the caller and not yet granted back.
    recv_unacked: i64,
    send_side: SendSide,
    send_window: i64,
    pending: VecDeque<Bytes>,
    pending_len: usize,
    /// The encoded trailer block that ends the stream; `None` with
    /// `Ending`: an empty DATA frame with END_STREAM.
    trailers: Option<Vec<u8>>,
    /// Request body bytes the `content-length` still announces (`None`:
    /// no content-length).
    content_left: Option<u64>,
    /// The caller released it after the response ended while the request
    /// goes on: what the client still sends is checked and dropped until
    /// it ends its side (see [`ServerConn::release`]).
    released: bool,
    /// The caller took its [`Event::Request`].
    taken: bool,
}

enum In {
    /// Bytes of the client preface still expected.
    Preface(usize),
    /// At a frame boundary.
    Head,
    /// Inside a DATA frame: payload bytes still to pass on, then padding
    /// to skip. `stream` is 0 when the frame is ignored; with `keep`
    /// false the payload is dropped (its window was given back) but
    /// END_STREAM still ends the stream.
    Data {
        stream: u32,
        keep: bool,
        left: usize,
        pad: usize,
        end: bool,
    },
}

/// A header block being collected (HEADERS then CONTINUATION).
struct Block {
    stream: u32,
    end_stream: bool,
    /// The HEADERS frame's priority made the stream depend on itself.
    self_dependent: bool,
    bytes: Vec<u8>,
    /// CONTINUATION frames so far without END_HEADERS.
    continuations: u32,
}

/// How many ids of streams we reset (and forgot) are remembered, so that
/// frames the client sent before it saw our RST_STREAM are ignored (RFC
/// 9113 5.1, "closed"); a frame on an older one is answered as on any
/// closed stream. Inline: an idle connection holds no buffer.
const RECENT_RESETS: usize = 8;

/// Client resets of streams the caller had not taken yet (their request
/// still queued) allowed at once; one more is a flood (CVE-2023-44487,
/// "rapid reset"): GOAWAY ENHANCE_YOUR_CALM. The h2 crate bounds the same
/// count, 20 by default (`max_pending_accept_reset_streams`,
/// src/proto/mod.rs `DEFAULT_REMOTE_RESET_STREAM_MAX`).
pub const MAX_PENDING_RESETS: usize = 20;

/// A flood the connection ended (GOAWAY ENHANCE_YOUR_CALM), for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flood {
    /// Streams opened and reset faster than the caller takes them.
    RapidReset = 0,
    /// A header block in more CONTINUATION frames than its size needs.
    Continuation = 1,
}

impl Flood {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Flood::RapidReset => "rapid_reset",
            Flood::Continuation => "continuation",
        }
    }
}

/// The connection; see the module documentation.
pub struct ServerConn<U> {
    cfg: Config,
    input: In,
    /// The client's first frame must be SETTINGS.
    got_settings: bool,
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    streams: Vec<Stream<U>>,
    /// Streams kept after their caller released them (`Stream::released`).
    lingering: usize,
    /// Ids of streams we reset and forgot, newest at `recent_next - 1`
    /// (0: empty slot).
    recent_resets: [u32; RECENT_RESETS],
    recent_next: usize,
    /// The highest stream id the client opened.
    last_stream: u32,
    /// Streams the client reset whose request the caller has not taken
    /// (see [`MAX_PENDING_RESETS`]).
    pending_resets: u32,
    /// The GOAWAY we sent (its last stream id).
    goaway_sent: Option<u32>,
    goaway_received: bool,
    closed: Option<ConnError>,
    peer_max_frame: usize,
    peer_initial_window: i64,
    send_window: i64,
    recv_window: i64,
    recv_unacked: i64,
    ping_out: bool,
    out: VecDeque<Bytes>,
    out_len: usize,
    events: VecDeque<Event>,
}

/// The PING payload of our keepalive.
const PING_PAYLOAD: [u8; 8] = *b"edgetnl!";

impl<U: Default> ServerConn<U> {
    /// A connection before the client preface; our SETTINGS and connection
    /// window are queued.
    pub fn new(cfg: Config) -> Self {
        let mut c = ServerConn {
            cfg,
            input: In::Preface(PREFACE.len()),
            got_settings: false,
            block: None,
            decoder: {
                let mut d = loona_hpack::Decoder::new();
                d.set_max_allowed_table_size(4_096);
                d.set_max_table_size(4_096);
                d
            },
            streams: Vec::new(),
            lingering: 0,
            recent_resets: [0; RECENT_RESETS],
            recent_next: 0,
            last_stream: 0,
            pending_resets: 0,
            goaway_sent: None,
            goaway_received: false,
            closed: None,
            peer_max_frame: MIN_MAX_FRAME as usize,
            peer_initial_window: DEFAULT_WINDOW,
            send_window: DEFAULT_WINDOW,
            recv_window: DEFAULT_WINDOW,
            recv_unacked: 0,
            ping_out: false,
            out: VecDeque::new(),
            out_len: 0,
            events: VecDeque::new(),
        };
        let mut s = Vec::with_capacity(FRAME_HEADER_LEN + 24 + 13);
        let settings = [
            (SETTINGS_MAX_CONCURRENT_STREAMS, cfg.max_streams),
            (SETTINGS_INITIAL_WINDOW_SIZE, cfg.stream_window),
            (SETTINGS_MAX_FRAME_SIZE, cfg.max_frame),
            (SETTINGS_MAX_HEADER_LIST_SIZE, cfg.max_header_list),
        ];
        put_frame_header(&mut s, settings.len() * 6, SETTINGS, 0, 0);
        for (id, v) in settings {
            s.extend_from_slice(&id.to_be_bytes());
            s.extend_from_slice(&v.to_be_bytes());
        }
        let grow = i64::from(cfg.conn_window) - DEFAULT_WINDOW;
        if grow > 0 {
            put_window_update(&mut s, 0, grow as u32);
            c.recv_window += grow;
        }
        c.push_out(s);
        c
    }
}

impl<U: Default> ServerConn<U> {
    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        let e = self.events.pop_front();
        if let Some(Event::Request { stream, .. }) = &e {
            if let Some(i) = self.index(*stream) {
                let s = &mut self.streams[i];
                s.taken = true;
                if matches!(s.recv_side, RecvSide::PeerReset(_)) {
                    self.pending_resets = self.pending_resets.saturating_sub(1);
                }
            }
        }
        if e.is_none() && self.events.capacity() > 0 {
            self.events = VecDeque::new();
        }
        e
    }

    /// The event [`Self::poll_event`] would return next.
    pub fn peek_event(&self) -> Option<&Event> {
        self.events.front()
    }

    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Whether the client's preface and first SETTINGS came.
    pub fn started(&self) -> bool {
        self.got_settings
    }

    /// Heap bytes the connection holds besides its HPACK table: 0 while
    /// idle (no stream, nothing queued). For tests and metrics.
    pub fn buffered_capacity(&self) -> usize {
        self.out.capacity() * std::mem::size_of::<Bytes>()
            + self.events.capacity() * std::mem::size_of::<Event>()
            + self.streams.capacity() * std::mem::size_of::<Stream<U>>()
            + self.block.as_ref().map_or(0, |b| b.bytes.capacity())
    }

    /// Consumes what it can of `input` (the caller keeps the rest and
    /// appends to it). DATA payload leaves as slices of `input`'s buffer.
    /// An `Err` is final: the GOAWAY is queued; write the output and close.
    pub fn recv(&mut self, input: &mut BytesMut) -> Result<(), ConnError> {
        if let Some(e) = &self.closed {
            input.clear();
            return Err(e.clone());
        }
        match self.recv_frames(input) {
            Ok(()) => Ok(()),
            Err(e) => {
                input.clear();
                self.fail(e.clone());
                Err(e)
            }
        }
    }

    /// The flood that ended the connection, if one did.
    pub fn flood(&self) -> Option<Flood> {
        self.closed.as_ref().and_then(|e| e.flood)
    }

    /// Whether the connection is over (a connection error).
    pub fn error(&self) -> Option<&ConnError> {
        self.closed.as_ref()
    }

    fn fail(&mut self, e: ConnError) {
        if self.closed.is_some() {
            return;
        }
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 8);
        put_goaway(&mut f, self.last_stream, e.code);
        self.push_out(f);
        self.closed = Some(e);
        for s in &mut self.streams {
            if matches!(s.recv_side, RecvSide::Open) {
                s.recv_side = RecvSide::Reset(reason::CANCEL);
            }
            if !matches!(s.send_side, SendSide::Ended | SendSide::Reset(_)) {
                s.send_side = SendSide::Reset(reason::CANCEL);
            }
            s.pending.clear();
            s.pending_len = 0;
            self.events.push_back(Event::Wake(s.id));
        }
    }

    fn recv_frames(&mut self, input: &mut BytesMut) -> Result<(), ConnError> {
        loop {
            match self.input {
                In::Preface(left) => {
                    let at = PREFACE.len() - left;
                    let n = left.min(input.len());
                    if input[..n] != PREFACE[at..at + n] {
                        return Err(conn_err(reason::PROTOCOL_ERROR, "bad client preface"));
                    }
                    input.advance(n);
                    if n == left {
                        self.input = In::Head;
                    } else {
                        self.input = In::Preface(left - n);
                        return Ok(());
                    }
                }
                In::Data {
                    stream,
                    keep,
                    left,
                    pad,
                    end,
                } => {
                    if left > 0 {
                        let n = left.min(input.len());
                        if n == 0 {
                            return Ok(());
                        }
                        if !keep {
                            input.advance(n);
                            self.input = In::Data {
                                stream,
                                keep,
                                left: left - n,
                                pad,
                                end,
                            };
                            continue;
                        }
                        let chunk = if n < self.cfg.copy_below {
                            let c = Bytes::copy_from_slice(&input[..n]);
                            input.advance(n);
                            c
                        } else {
                            input.split_to(n).freeze()
                        };
                        self.data_chunk(stream, chunk);
                        self.input = In::Data {
                            stream,
                            keep,
                            left: left - n,
                            pad,
                            end,
                        };
                        continue;
                    }
                    let n = pad.min(input.len());
                    input.advance(n);
                    if n < pad {
                        self.input = In::Data {
                            stream,
                            keep,
                            left: 0,
                            pad: pad - n,
                            end,
                        };
                        return Ok(());
                    }
                    self.input = In::Head;
                    if end && stream != 0 {
                        self.end_of_request(stream);
                    }
                }
                In::Head => {
                    if input.len() < FRAME_HEADER_LEN {
                        return Ok(());
                    }
                    let len = usize::from(input[0]) << 16
                        | usize::from(input[1]) << 8
                        | usize::from(input[2]);
                    let (ty, flags) = (input[3], input[4]);
                    let id =
                        u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;
                    if len > self.cfg.max_frame as usize {
                        return Err(conn_err(reason::FRAME_SIZE_ERROR, "frame too large"));
                    }
                    if !self.got_settings && (ty != SETTINGS || flags & ACK != 0) {
                        return Err(conn_err(
                            reason::PROTOCOL_ERROR,
                            "first frame is not SETTINGS",
                        ));
                    }
                    if self.block.is_some() && ty != CONTINUATION {
                        return Err(conn_err(reason::PROTOCOL_ERROR, "header block interrupted"));
                    }
                    if ty == DATA {
                        let padded = flags & PADDED != 0;
                        if padded && input.len() < FRAME_HEADER_LEN + 1 {
                            return Ok(());
                        }
                        let pad = if padded {
                            usize::from(input[FRAME_HEADER_LEN])
                        } else {
                            0
                        };
                        if padded && pad + 1 > len {
                            return Err(conn_err(reason::PROTOCOL_ERROR, "padding too long"));
                        }
                        input.advance(FRAME_HEADER_LEN + usize::from(padded));
                        let (stream, keep) = self.data_head(id, len, pad + usize::from(padded))?;
                        self.input = In::Data {
                            stream,
                            keep,
                            left: len - pad - usize::from(padded),
                            pad,
                            end: flags & END_STREAM != 0,
                        };
                        continue;
                    }
                    if input.len() < FRAME_HEADER_LEN + len {
                        // Wait for the whole frame (at most max_frame).
                        input.reserve(FRAME_HEADER_LEN + len - input.len());
                        return Ok(());
                    }
                    input.advance(FRAME_HEADER_LEN);
                    let payload = input.split_to(len);
                    self.frame(ty, flags, id, &payload)?;
                }
            }
        }
    }

    /// Checks a DATA frame's header and charges the windows; the stream
    /// the frame belongs to (0: ignored) and whether its payload is kept.
    fn data_head(&mut self, id: u32, len: usize, padding: usize) -> Result<(u32, bool), ConnError> {
        if id == 0 {
            return Err(conn_err(reason::PROTOCOL_ERROR, "DATA on stream 0"));
        }
        let body = (len - padding) as u64;
        let len = len as i64;
        if len > self.recv_window {
            return Err(conn_err(
                reason::FLOW_CONTROL_ERROR,
                "DATA past the connection window",
            ));
        }
        self.recv_window -= len;
        if id > self.last_stream {
            return Err(conn_err(reason::PROTOCOL_ERROR, "DATA on an idle stream"));
        }
        let Some(i) = self.index(id) else {
            // Closed: a stream error STREAM_CLOSED (RFC 9113 5.1), unless
            // we reset it ourselves lately (what was in flight is ignored).
            self.conn_credit(len);
            self.closed_stream_frame(id);
            return Ok((0, false));
        };
        match self.streams[i].recv_side {
            RecvSide::Open => {}
            RecvSide::Ended => {
                // Half-closed (remote): RFC 9113 5.1, STREAM_CLOSED.
                self.conn_credit(len);
                self.reset_stream(i, reason::STREAM_CLOSED);
                return Ok((0, false));
            }
            RecvSide::PeerReset(_) => {
                self.conn_credit(len);
                self.closed_stream_frame(id);
                return Ok((0, false));
            }
            RecvSide::Reset(_) => {
                self.conn_credit(len);
                return Ok((0, false));
            }
        }
        if len > self.streams[i].recv_window {
            self.conn_credit(len);
            self.reset_stream(i, reason::FLOW_CONTROL_ERROR);
            return Ok((0, false));
        }
        if let Some(left) = self.streams[i].content_left {
            if body > left {
                // More than the content-length announced (RFC 9113 8.1.1).
                self.conn_credit(len);
                self.reset_stream(i, reason::PROTOCOL_ERROR);
                return Ok((0, false));
            }
            self.streams[i].content_left = Some(left - body);
        }
        self.streams[i].recv_window -= len;
        if self.streams[i].released {
            // Nobody reads it: the connection's window comes back at once,
            // the stream's does not (the client is not asked for more).
            self.conn_credit(len);
            return Ok((id, false));
        }
        // Padding is given back at once.
        let padding = padding as i64;
        if padding > 0 {
            self.streams[i].recv_unacked += padding;
            self.conn_credit(padding);
            self.stream_credit(i);
        }
        Ok((id, true))
    }

    /// A DATA or HEADERS frame on a stream that is closed: RST_STREAM
    /// STREAM_CLOSED (RFC 9113 5.1), once, unless we reset the stream
    /// lately (then the frame was in flight: ignored).
    fn closed_stream_frame(&mut self, id: u32) {
        if !self.recent_resets.contains(&id) {
            self.push_rst(id, reason::STREAM_CLOSED);
        }
    }

    fn data_chunk(&mut self, stream: u32, chunk: Bytes) {
        if stream == 0 {
            // Dropped; its window was given back at the frame's head.
            return;
        }
        let n = chunk.len() as i64;
        match self.index(stream) {
            Some(i) if self.streams[i].recv_side == RecvSide::Open => {
                self.streams[i].recv.push_back(chunk);
                self.wake(stream);
            }
            // Reset meanwhile (or dropped): the bytes are not wanted.
            _ => self.conn_credit(n),
        }
    }

    /// END_STREAM from the client (on DATA or trailers).
    fn end_of_request(&mut self, stream: u32) {
        let Some(i) = self.index(stream) else { return };
        if self.streams[i].recv_side != RecvSide::Open {
            return;
        }
        if self.streams[i].content_left.is_some_and(|n| n > 0) {
            // Less than the content-length announced (RFC 9113 8.1.1).
            self.reset_stream(i, reason::PROTOCOL_ERROR);
            return;
        }
        self.streams[i].recv_side = RecvSide::Ended;
        if self.streams[i].released {
            self.remove(i);
        } else {
            self.wake(stream);
        }
    }

    fn frame(&mut self, ty: u8, flags: u8, id: u32, p: &[u8]) -> Result<(), ConnError> {
        match ty {
            HEADERS => self.headers(flags, id, p),
            CONTINUATION => self.continuation(flags, id, p),
            PRIORITY => {
                if id == 0 {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                if p.len() != 5 {
                    return Err(conn_err(reason::FRAME_SIZE_ERROR, "PRIORITY size"));
                }
                if u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff == id {
                    // A stream cannot depend on itself (RFC 9113 5.3.1).
                    match self.index(id) {
                        Some(i) => self.reset_stream(i, reason::PROTOCOL_ERROR),
                        None => self.push_rst(id, reason::PROTOCOL_ERROR),
                    }
                }
                Ok(())
            }
            RST_STREAM => {
                if id == 0 {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
                }
                if p.len() != 4 {
                    return Err(conn_err(reason::FRAME_SIZE_ERROR, "RST_STREAM size"));
                }
                if id > self.last_stream {
                    return Err(conn_err(
                        reason::PROTOCOL_ERROR,
                        "RST_STREAM on an idle stream",
                    ));
                }
                let code = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
                if let Some(i) = self.index(id) {
                    if !self.streams[i].taken
                        && !matches!(self.streams[i].recv_side, RecvSide::PeerReset(_))
                    {
                        self.pending_resets += 1;
                        if self.pending_resets as usize > MAX_PENDING_RESETS {
                            return Err(flood_err(
                                Flood::RapidReset,
                                "too many streams reset before they were taken",
                            ));
                        }
                    }
                    self.drop_received(i);
                    let s = &mut self.streams[i];
                    s.recv_side = RecvSide::PeerReset(code);
                    if !matches!(s.send_side, SendSide::Ended) {
                        s.send_side = SendSide::Reset(code);
                    }
                    s.pending.clear();
                    s.pending_len = 0;
                    if s.released {
                        self.remove(i);
                    } else {
                        self.wake(id);
                    }
                }
                Ok(())
            }
            SETTINGS => self.settings(flags, id, p),
            PUSH_PROMISE => Err(conn_err(
                reason::PROTOCOL_ERROR,
                "PUSH_PROMISE from a client",
            )),
            PING => {
                if id != 0 {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "PING on a stream"));
                }
                if p.len() != 8 {
                    return Err(conn_err(reason::FRAME_SIZE_ERROR, "PING size"));
                }
                if flags & ACK != 0 {
                    if self.ping_out && p == PING_PAYLOAD {
                        self.ping_out = false;
                        self.events.push_back(Event::Pong);
                    }
                } else {
                    let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 8);
                    put_frame_header(&mut f, 8, PING, ACK, 0);
                    f.extend_from_slice(p);
                    self.push_out(f);
                }
                Ok(())
            }
            GOAWAY => {
                if id != 0 {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
                }
                if p.len() < 8 {
                    return Err(conn_err(reason::FRAME_SIZE_ERROR, "GOAWAY size"));
                }
                self.goaway_received = true;
                self.events.push_back(Event::GoAway {
                    last_stream: u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff,
                    code: u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
                });
                Ok(())
            }
            WINDOW_UPDATE => self.window_update(id, p),
            // Unknown types are ignored (RFC 9113 section 4.1).
            _ => Ok(()),
        }
    }

    fn settings(&mut self, flags: u8, id: u32, p: &[u8]) -> Result<(), ConnError> {
        if id != 0 {
            return Err(conn_err(reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if flags & ACK != 0 {
            if !p.is_empty() {
                return Err(conn_err(
                    reason::FRAME_SIZE_ERROR,
                    "SETTINGS ACK with payload",
                ));
            }
            return Ok(());
        }
        if !p.len().is_multiple_of(6) {
            return Err(conn_err(reason::FRAME_SIZE_ERROR, "SETTINGS size"));
        }
        self.got_settings = true;
        for s in p.chunks_exact(6) {
            let key = u16::from_be_bytes([s[0], s[1]]);
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match key {
                SETTINGS_ENABLE_PUSH if v > 1 => {
                    return Err(conn_err(reason::PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1"));
                }
                SETTINGS_INITIAL_WINDOW_SIZE => {
                    if i64::from(v) > MAX_WINDOW {
                        return Err(conn_err(
                            reason::FLOW_CONTROL_ERROR,
                            "INITIAL_WINDOW_SIZE too large",
                        ));
                    }
                    let delta = i64::from(v) - self.peer_initial_window;
                    self.peer_initial_window = i64::from(v);
                    for s in &mut self.streams {
                        s.send_window += delta;
                        if s.send_window > MAX_WINDOW {
                            return Err(conn_err(
                                reason::FLOW_CONTROL_ERROR,
                                "stream window overflow",
                            ));
                        }
                    }
                }
                SETTINGS_MAX_FRAME_SIZE => {
                    if !(MIN_MAX_FRAME..=MAX_MAX_FRAME).contains(&v) {
                        return Err(conn_err(
                            reason::PROTOCOL_ERROR,
                            "MAX_FRAME_SIZE out of range",
                        ));
                    }
                    self.peer_max_frame = v as usize;
                }
                // Our encoder never uses the dynamic table; we open no
                // streams; header list sizes of our heads are tiny.
                SETTINGS_HEADER_TABLE_SIZE
                | SETTINGS_MAX_CONCURRENT_STREAMS
                | SETTINGS_MAX_HEADER_LIST_SIZE => {}
                _ => {}
            }
        }
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN);
        put_frame_header(&mut f, 0, SETTINGS, ACK, 0);
        self.push_out(f);
        self.flush_all();
        Ok(())
    }

    fn window_update(&mut self, id: u32, p: &[u8]) -> Result<(), ConnError> {
        if p.len() != 4 {
            return Err(conn_err(reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE size"));
        }
        let inc = i64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff);
        if id == 0 {
            if inc == 0 {
                return Err(conn_err(reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0"));
            }
            self.send_window += inc;
            if self.send_window > MAX_WINDOW {
                return Err(conn_err(
                    reason::FLOW_CONTROL_ERROR,
                    "connection window overflow",
                ));
            }
            self.flush_all();
            return Ok(());
        }
        if id > self.last_stream {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "WINDOW_UPDATE on an idle stream",
            ));
        }
        let Some(i) = self.index(id) else {
            return Ok(());
        };
        if inc == 0 {
            self.reset_stream(i, reason::PROTOCOL_ERROR);
            return Ok(());
        }
        self.streams[i].send_window += inc;
        if self.streams[i].send_window > MAX_WINDOW {
            self.reset_stream(i, reason::FLOW_CONTROL_ERROR);
            return Ok(());
        }
        self.flush_stream(i);
        Ok(())
    }

    fn headers(&mut self, flags: u8, id: u32, p: &[u8]) -> Result<(), ConnError> {
        if id == 0 {
            return Err(conn_err(reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        let mut p = p;
        let mut pad = 0;
        if flags & PADDED != 0 {
            let Some((&n, rest)) = p.split_first() else {
                return Err(conn_err(reason::FRAME_SIZE_ERROR, "HEADERS size"));
            };
            pad = usize::from(n);
            p = rest;
        }
        let mut self_dependent = false;
        if flags & PRIORITY_FLAG != 0 {
            if p.len() < 5 {
                return Err(conn_err(reason::FRAME_SIZE_ERROR, "HEADERS size"));
            }
            self_dependent = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff == id;
            p = &p[5..];
        }
        if pad > p.len() {
            return Err(conn_err(reason::PROTOCOL_ERROR, "padding too long"));
        }
        let fragment = &p[..p.len() - pad];
        let block = Block {
            stream: id,
            end_stream: flags & END_STREAM != 0,
            self_dependent,
            bytes: fragment.to_vec(),
            continuations: 0,
        };
        self.check_block_size(block.bytes.len())?;
        if flags & END_HEADERS != 0 {
            self.header_block(block)
        } else {
            self.block = Some(block);
            Ok(())
        }
    }

    fn continuation(&mut self, flags: u8, id: u32, p: &[u8]) -> Result<(), ConnError> {
        let Some(mut block) = self.block.take() else {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "CONTINUATION outside a block",
            ));
        };
        if block.stream != id {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "CONTINUATION on another stream",
            ));
        }
        block.bytes.extend_from_slice(p);
        self.check_block_size(block.bytes.len())?;
        if flags & END_HEADERS == 0 {
            // An empty CONTINUATION adds nothing to the block's size: the
            // frames are counted too, up to what the largest header list
            // takes in the smallest frames a client may send, plus a
            // quarter, at least 5 (the h2 crate's bound,
            // src/codec/framed_read.rs `calc_max_continuation_frames`).
            block.continuations += 1;
            let needed = (self.cfg.max_header_list / MIN_MAX_FRAME).max(1);
            if block.continuations > (needed + needed / 4).max(5) {
                return Err(flood_err(
                    Flood::Continuation,
                    "too many CONTINUATION frames",
                ));
            }
        }
        if flags & END_HEADERS != 0 {
            self.header_block(block)
        } else {
            self.block = Some(block);
            Ok(())
        }
    }

    fn check_block_size(&self, n: usize) -> Result<(), ConnError> {
        if n > self.cfg.max_header_list as usize {
            return Err(conn_err(
                reason::ENHANCE_YOUR_CALM,
                "header block too large",
            ));
        }
        Ok(())
    }

    /// A whole header block: decoded (always, for the HPACK state), then a
    /// request, a request's trailers, or a stream or connection error.
    fn header_block(&mut self, block: Block) -> Result<(), ConnError> {
        let id = block.stream;
        let known = self.index(id);
        let trailers = known.is_some_and(|i| self.streams[i].recv_side == RecvSide::Open);
        let decoded = decode_head(
            &mut self.decoder,
            &block.bytes,
            self.cfg.max_header_list,
            trailers,
            self.cfg.keep_fields,
        )?;
        if let Some(i) = known {
            match self.streams[i].recv_side {
                // Trailers end the request; without END_STREAM, or with a
                // pseudo-header, the request is malformed (RFC 9113 8.1).
                RecvSide::Open => {
                    if !block.end_stream || decoded.is_err() || block.self_dependent {
                        self.reset_stream(i, reason::PROTOCOL_ERROR);
                    } else {
                        self.end_of_request(id);
                    }
                }
                // Half-closed (remote): RFC 9113 5.1, STREAM_CLOSED.
                RecvSide::Ended => self.reset_stream(i, reason::STREAM_CLOSED),
                RecvSide::PeerReset(_) => self.closed_stream_frame(id),
                // We reset it: sent before the client saw that.
                RecvSide::Reset(_) => {}
            }
            return Ok(());
        }
        if id <= self.last_stream {
            if self.recent_resets.contains(&id) {
                // Trailers in flight when we reset the stream.
                return Ok(());
            }
            // A stream already closed, or a new one whose id is not above
            // the last: RFC 9113 5.1.1, a connection error.
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "HEADERS on a closed stream or below the last stream id",
            ));
        }
        if id.is_multiple_of(2) {
            return Err(conn_err(
                reason::PROTOCOL_ERROR,
                "even stream id from a client",
            ));
        }
        self.last_stream = id;
        if block.self_dependent {
            // RFC 9113 5.3.1: a stream error.
            self.push_rst(id, reason::PROTOCOL_ERROR);
            return Ok(());
        }
        if self.goaway_sent.is_some() {
            // Past our GOAWAY: not processed (the client retries elsewhere).
            // (The client's own GOAWAY concerns streams we would open.)
            self.push_rst(id, reason::REFUSED_STREAM);
            return Ok(());
        }
        if self.active_streams() >= self.cfg.max_streams as usize {
            self.push_rst(id, reason::REFUSED_STREAM);
            return Ok(());
        }
        let head = match decoded {
            // A body announced on a request that has none is malformed.
            Ok(h) if !(block.end_stream && h.content_length.is_some_and(|n| n > 0)) => h,
            _ => {
                self.push_rst(id, reason::PROTOCOL_ERROR);
                return Ok(());
            }
        };
        // Most connections carry one stream (konnectivity-client opens a
        // connection per tunnel): the first few grow the table one at a
        // time rather than to 4 at once.
        if self.streams.len() < 4 {
            self.streams.reserve_exact(1);
        }
        self.streams.push(Stream {
            id,
            user: Default::default(),
            recv: VecDeque::new(),
            recv_side: if block.end_stream {
                RecvSide::Ended
            } else {
                RecvSide::Open
            },
            recv_window: i64::from(self.cfg.stream_window),
            recv_unacked: 0,
            send_side: SendSide::Idle,
            send_window: self.peer_initial_window,
            pending: VecDeque::new(),
            pending_len: 0,
            trailers: None,
            content_left: head.content_length,
            released: false,
            taken: false,
        });
        self.events.push_back(Event::Request {
            stream: id,
            head,
            end_stream: block.end_stream,
        });
        Ok(())
    }

    /// Streams that count against SETTINGS_MAX_CONCURRENT_STREAMS the way
    /// the client counts them: grpc-go takes a stream off its count when it
    /// receives our END_STREAM or a RST_STREAM, or sends its own RST_STREAM
    /// (internal/transport/http2_client.go, closeStream and the stream
    /// quota), so a stream whose response is out or that was reset does
    /// not count, even while its caller still holds it.
    fn active_streams(&self) -> usize {
        self.streams
            .iter()
            .filter(|s| !matches!(s.send_side, SendSide::Ended | SendSide::Reset(_)))
            .count()
    }
}

/// Header fields of a request: what [`RequestHead`] keeps, or why the
/// request is malformed (a stream error). An HPACK failure or an
/// oversized list is a connection error (the HPACK state is lost).
///
/// With `trailers`, the block ends a request: any pseudo-header makes it
/// malformed (RFC 9113 8.1) and none is required.
fn decode_head(
    decoder: &mut loona_hpack::Decoder<'static>,
    block: &[u8],
    max_list: u32,
    trailers: bool,
    keep_fields: bool,
) -> Result<Result<RequestHead, &'static str>, ConnError> {
    let mut head = RequestHead::default();
    let mut list = 0usize;
    let mut over = false;
    let mut malformed: Option<&'static str> = None;
    let mut regular_seen = false;
    let (mut method, mut path, mut scheme) = (false, false, false);
    let res = decoder.decode_with_cb(block, |name: Cow<[u8]>, value: Cow<[u8]>| {
        list += name.len() + value.len() + 32;
        if list > max_list as usize {
            over = true;
        }
        if over || malformed.is_some() {
            return;
        }
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        if let Some(pseudo) = name.strip_prefix(b":") {
            if trailers {
                malformed = Some("pseudo-header in trailers");
                return;
            }
            if regular_seen {
                malformed = Some("pseudo-header after a regular field");
                return;
            }
            let seen = match pseudo {
                b"method" => std::mem::replace(&mut method, true),
                b"path" => std::mem::replace(&mut path, true),
                b"scheme" => std::mem::replace(&mut scheme, true),
                b"authority" => head.authority.is_some(),
                _ => {
                    malformed = Some("unknown pseudo-header");
                    return;
                }
            };
            if seen {
                malformed = Some("pseudo-header repeated");
                return;
            }
            match pseudo {
                b"method" => head.method = text(&value),
                b"path" => head.path = text(&value),
                b"authority" => head.authority = Some(text(&value)),
                _ => {}
            }
            return;
        }
        regular_seen = true;
        if name.iter().any(|b| b.is_ascii_uppercase()) {
            malformed = Some("upper-case field name");
            return;
        }
        match &*name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => malformed = Some("connection-specific field"),
            b"te" if &*value != b"trailers" => malformed = Some("te other than trailers"),
            b"content-type" if head.content_type.is_none() => {
                head.content_type = Some(text(&value))
            }
            b"content-length" => {
                let n = std::str::from_utf8(&value)
                    .ok()
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<u64>().ok());
                match (n, head.content_length) {
                    (Some(n), None) => head.content_length = Some(n),
                    (Some(n), Some(m)) if n == m => {}
                    _ => malformed = Some("bad content-length"),
                }
            }
            _ if keep_fields && !trailers => head.fields.push((text(&name), value.into_owned())),
            _ => {}
        }
    });
    match res {
        Ok(()) => {}
        // A size update must open a block (RFC 7541 4.2): one at the end is
        // a decoding error.
        Err(DecoderError::SizeUpdateAtEnd) => {
            return Err(conn_err(
                reason::COMPRESSION_ERROR,
                "HPACK table size update at the end of a block",
            ))
        }
        Err(_) => return Err(conn_err(reason::COMPRESSION_ERROR, "HPACK decoding failed")),
    }
    if over {
        return Err(conn_err(reason::ENHANCE_YOUR_CALM, "header list too large"));
    }
    if let Some(m) = malformed {
        return Ok(Err(m));
    }
    if !trailers && (!(method && path && scheme) || head.path.is_empty()) {
        return Ok(Err("missing pseudo-header"));
    }
    Ok(Ok(head))
}

/// Stream operations (the caller's side of a request).
impl<U: Default> ServerConn<U> {
    fn index(&self, id: u32) -> Option<usize> {
        self.streams.iter().position(|s| s.id == id)
    }

    /// The caller's value on stream `id`.
    pub fn user(&mut self, id: u32) -> Option<&mut U> {
        let i = self.index(id)?;
        Some(&mut self.streams[i].user)
    }

    /// Every live stream's caller value (to wake them all).
    pub fn users(&mut self) -> impl Iterator<Item = &mut U> {
        self.streams.iter_mut().map(|s| &mut s.user)
    }

    /// Open streams.
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// The next piece of a request body. Taking data gives its flow-control
    /// credit back to the client.
    pub fn take_data(&mut self, id: u32) -> Recv {
        let Some(i) = self.index(id) else {
            return Recv::Reset(reason::CANCEL);
        };
        let s = &mut self.streams[i];
        if let Some(b) = s.recv.pop_front() {
            if s.recv.is_empty() {
                s.recv = VecDeque::new();
            }
            let n = b.len() as i64;
            s.recv_unacked += n;
            self.conn_credit(n);
            self.stream_credit(i);
            return Recv::Data(b);
        }
        match s.recv_side {
            RecvSide::Open => Recv::Pending,
            RecvSide::Ended => Recv::End,
            RecvSide::Reset(code) | RecvSide::PeerReset(code) => Recv::Reset(code),
        }
    }

    /// Whether the stream was reset (by the client or an error), and how.
    pub fn reset_reason(&self, id: u32) -> Option<u32> {
        let i = self.index(id)?;
        match self.streams[i].send_side {
            SendSide::Reset(code) => Some(code),
            _ => None,
        }
    }

    /// Sends the response head (`:status` 200 and `fields`); with `end`,
    /// the response ends there (a trailers-only response).
    pub fn send_head(
        &mut self,
        id: u32,
        fields: &[(&str, &str)],
        end: bool,
    ) -> Result<(), SendError> {
        let i = self.live(id)?;
        if self.streams[i].send_side != SendSide::Idle {
            return Err(SendError::Ended);
        }
        let mut block = Vec::with_capacity(64);
        encode_field(&mut block, b":status", b"200");
        for (n, v) in fields {
            encode_field(&mut block, n.as_bytes(), v.as_bytes());
        }
        self.push_block(id, end, &block);
        self.streams[i].send_side = if end { SendSide::Ended } else { SendSide::Open };
        Ok(())
    }

    /// Queues response body bytes; they go out as the client's windows
    /// allow. Wait for [`Self::send_pending`] to reach 0 before queuing
    /// more (an [`Event::Wake`] comes when it does).
    pub fn send_data(&mut self, id: u32, data: Bytes) -> Result<(), SendError> {
        let i = self.live(id)?;
        let s = &mut self.streams[i];
        if s.send_side != SendSide::Open {
            return Err(SendError::Ended);
        }
        if data.is_empty() {
            return Ok(());
        }
        s.pending_len += data.len();
        s.pending.push_back(data);
        self.flush_stream(i);
        Ok(())
    }

    /// Bytes queued on the stream and not yet in the output.
    pub fn send_pending(&self, id: u32) -> Result<usize, SendError> {
        let i = self.live(id)?;
        Ok(self.streams[i].pending_len)
    }

    /// Ends the response with trailers (`fields`), after the queued data.
    pub fn send_trailers(&mut self, id: u32, fields: &[(&str, &str)]) -> Result<(), SendError> {
        let i = self.live(id)?;
        let s = &mut self.streams[i];
        if s.send_side != SendSide::Open {
            return Err(SendError::Ended);
        }
        let mut block = Vec::with_capacity(64);
        for (n, v) in fields {
            encode_field(&mut block, n.as_bytes(), v.as_bytes());
        }
        s.trailers = Some(block);
        s.send_side = SendSide::Ending;
        self.flush_stream(i);
        Ok(())
    }

    /// Resets the stream (our side gives up on it).
    pub fn reset(&mut self, id: u32, code: u32) {
        if let Some(i) = self.index(id) {
            self.reset_stream(i, code);
        }
    }

    /// The caller is done with the stream. A response not ended is reset
    /// (CANCEL). A response ended while the request goes on keeps the
    /// stream, without its caller, until the client ends or resets its
    /// side: what it still sends is checked (content-length, trailers) and
    /// dropped, as RFC 9113 8.1 lets a server answer before the request
    /// ends. At most `max_streams` such streams are kept; past that the
    /// oldest is told to stop (RST_STREAM NO_ERROR) and forgotten.
    /// Otherwise the stream is forgotten.
    pub fn release(&mut self, id: u32) {
        let Some(i) = self.index(id) else { return };
        let s = &self.streams[i];
        if s.released {
            return;
        }
        match (s.send_side, s.recv_side) {
            // Over on both sides, or reset: nothing to tell the client.
            (SendSide::Reset(_), _) | (SendSide::Ended, _) if s.recv_side != RecvSide::Open => {}
            (SendSide::Reset(_), _) => {}
            (SendSide::Ended, RecvSide::Open) => {
                self.drop_received(i);
                let s = &mut self.streams[i];
                s.released = true;
                s.user = U::default();
                self.lingering += 1;
                if self.lingering > self.cfg.max_streams as usize {
                    self.evict_oldest_lingering();
                }
                return;
            }
            _ => self.push_rst(id, reason::CANCEL),
        }
        self.remove(i);
    }

    /// Forgets stream `i`.
    fn remove(&mut self, i: usize) {
        self.drop_received(i);
        if self.streams[i].released {
            self.lingering -= 1;
        }
        self.streams.swap_remove(i);
        if self.streams.is_empty() {
            self.streams = Vec::new();
        }
    }

    fn evict_oldest_lingering(&mut self) {
        let oldest = self
            .streams
            .iter()
            .enumerate()
            .filter(|(_, s)| s.released)
            .min_by_key(|(_, s)| s.id)
            .map(|(i, _)| i);
        if let Some(i) = oldest {
            let id = self.streams[i].id;
            self.push_rst(id, reason::NO_ERROR);
            self.remove(i);
        }
    }

    fn live(&self, id: u32) -> Result<usize, SendError> {
        if self.closed.is_some() {
            return Err(SendError::ConnClosed);
        }
        let i = self.index(id).ok_or(SendError::Gone)?;
        match self.streams[i].send_side {
            SendSide::Reset(code) => Err(SendError::Reset(code)),
            _ => Ok(i),
        }
    }

    fn reset_stream(&mut self, i: usize, code: u32) {
        let s = &mut self.streams[i];
        if matches!(s.send_side, SendSide::Reset(_)) {
            return;
        }
        s.send_side = SendSide::Reset(code);
        if s.recv_side == RecvSide::Open {
            s.recv_side = RecvSide::Reset(code);
        }
        s.pending.clear();
        s.pending_len = 0;
        let id = s.id;
        self.drop_received(i);
        self.push_rst(id, code);
        if self.streams[i].released {
            self.remove(i);
        } else {
            self.wake(id);
        }
    }

    /// Received data nobody will take: its connection window is given back.
    fn drop_received(&mut self, i: usize) {
        let recv = std::mem::take(&mut self.streams[i].recv);
        let unread: i64 = recv.iter().map(|b| b.len() as i64).sum();
        if unread > 0 {
            self.conn_credit(unread);
        }
    }

    /// Queues a RST_STREAM; the id is remembered for a while, so that the
    /// frames the client sent before it sees it are ignored.
    fn push_rst(&mut self, id: u32, code: u32) {
        self.recent_resets[self.recent_next] = id;
        self.recent_next = (self.recent_next + 1) % RECENT_RESETS;
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 4);
        put_frame_header(&mut f, 4, RST_STREAM, 0, id);
        f.extend_from_slice(&code.to_be_bytes());
        self.push_out(f);
    }

    /// A header block as HEADERS and CONTINUATION frames.
    fn push_block(&mut self, id: u32, end: bool, block: &[u8]) {
        let mut f = Vec::new();
        write_block(&mut f, id, end, block, self.peer_max_frame);
        self.push_out(f);
    }
}

/// Flow control and output.
impl<U: Default> ServerConn<U> {
    /// Sends a PING for the keepalive; [`Event::Pong`] when it is answered.
    pub fn ping(&mut self) {
        if self.closed.is_some() {
            return;
        }
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 8);
        put_frame_header(&mut f, 8, PING, 0, 0);
        f.extend_from_slice(&PING_PAYLOAD);
        self.push_out(f);
        self.ping_out = true;
    }

    /// Graceful GOAWAY: streams open now finish, no new one is taken.
    pub fn go_away(&mut self) {
        if self.closed.is_some() || self.goaway_sent.is_some() {
            return;
        }
        let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 8);
        put_goaway(&mut f, self.last_stream, reason::NO_ERROR);
        self.push_out(f);
        self.goaway_sent = Some(self.last_stream);
    }

    /// Whether the client sent GOAWAY or we did.
    pub fn going_away(&self) -> bool {
        self.goaway_sent.is_some() || self.goaway_received
    }

    /// The queued output, in order; the caller writes it and then calls
    /// [`Self::wrote`].
    pub fn output(&self) -> &VecDeque<Bytes> {
        &self.out
    }

    /// Bytes of queued output.
    pub fn output_len(&self) -> usize {
        self.out_len
    }

    /// `n` bytes of the output were written: they leave the queue, and
    /// stream data waiting for room follows.
    pub fn wrote(&mut self, mut n: usize) {
        self.out_len -= n;
        while n > 0 {
            let Some(front) = self.out.front_mut() else {
                break;
            };
            if front.len() <= n {
                n -= front.len();
                self.out.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
        if self.out.is_empty() {
            self.out = VecDeque::new();
        }
        self.flush_all();
    }

    /// Takes all queued output at once (tests, fuzzing).
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.out_len);
        for b in &self.out {
            v.extend_from_slice(b);
        }
        let n = v.len();
        self.wrote(n);
        v
    }

    fn push_out(&mut self, frame: Vec<u8>) {
        self.out_len += frame.len();
        self.out.push_back(Bytes::from(frame));
    }

    fn wake(&mut self, id: u32) {
        if self.events.back() != Some(&Event::Wake(id)) {
            self.events.push_back(Event::Wake(id));
        }
    }

    /// Gives `n` bytes of connection window back, in one WINDOW_UPDATE
    /// once half the window is owed.
    fn conn_credit(&mut self, n: i64) {
        self.recv_unacked += n;
        if self.recv_unacked >= i64::from(self.cfg.conn_window) / 2 && self.closed.is_none() {
            let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 4);
            put_window_update(&mut f, 0, self.recv_unacked as u32);
            self.push_out(f);
            self.recv_window += self.recv_unacked;
            self.recv_unacked = 0;
        }
    }

    fn stream_credit(&mut self, i: usize) {
        let s = &mut self.streams[i];
        if s.recv_unacked >= i64::from(self.cfg.stream_window) / 2 && s.recv_side == RecvSide::Open
        {
            let mut f = Vec::with_capacity(FRAME_HEADER_LEN + 4);
            put_window_update(&mut f, s.id, s.recv_unacked as u32);
            s.recv_window += s.recv_unacked;
            s.recv_unacked = 0;
            self.push_out(f);
        }
    }

    fn flush_all(&mut self) {
        for i in 0..self.streams.len() {
            if self.out_len >= OUT_HIGH || self.send_window <= 0 {
                break;
            }
            self.flush_stream(i);
        }
    }

    /// Moves the stream's queued data into the output as far as the windows
    /// and the output's room allow; then its end, once the data is out.
    fn flush_stream(&mut self, i: usize) {
        let max_frame = self.peer_max_frame;
        let had = self.streams[i].pending_len;
        loop {
            let s = &mut self.streams[i];
            if s.pending_len == 0 {
                break;
            }
            let room = s.send_window.min(self.send_window);
            if room <= 0 || self.out_len >= OUT_HIGH {
                break;
            }
            let n = (room as usize).min(max_frame).min(s.pending_len);
            let mut head = Vec::with_capacity(FRAME_HEADER_LEN);
            put_frame_header(&mut head, n, DATA, 0, s.id);
            self.out.push_back(Bytes::from(head));
            let mut left = n;
            while left > 0 {
                let front = s
                    .pending
                    .front_mut()
                    .expect("pending_len counts the chunks");
                if front.len() <= left {
                    left -= front.len();
                    let b = s.pending.pop_front().expect("front exists");
                    self.out.push_back(b);
                } else {
                    self.out.push_back(front.split_to(left));
                    left = 0;
                }
            }
            s.pending_len -= n;
            s.send_window -= n as i64;
            self.send_window -= n as i64;
            self.out_len += FRAME_HEADER_LEN + n;
        }
        let s = &mut self.streams[i];
        if s.pending_len == 0 {
            if s.pending.capacity() > 0 {
                s.pending = VecDeque::new();
            }
            let id = s.id;
            if s.send_side == SendSide::Ending {
                s.send_side = SendSide::Ended;
                match s.trailers.take() {
                    Some(block) => self.push_block(id, true, &block),
                    None => {
                        let mut f = Vec::with_capacity(FRAME_HEADER_LEN);
                        put_frame_header(&mut f, 0, DATA, END_STREAM, id);
                        self.push_out(f);
                    }
                }
            }
            if had > 0 {
                self.wake(id);
            }
        }
    }
}

fn put_window_update(out: &mut Vec<u8>, id: u32, inc: u32) {
    put_frame_header(out, 4, WINDOW_UPDATE, 0, id);
    out.extend_from_slice(&(inc & 0x7fff_ffff).to_be_bytes());
}

fn put_goaway(out: &mut Vec<u8>, last: u32, code: u32) {
    put_frame_header(out, 8, GOAWAY, 0, 0);
    out.put_u32(last & 0x7fff_ffff);
    out.put_u32(code);
}

/// Bytes of one stream's state (its table slot).
pub fn stream_state_size<U>() -> usize {
    std::mem::size_of::<Stream<U>>()
}

#[cfg(test)]
mod tests;
