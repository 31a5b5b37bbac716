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
//! buffer, which the caller may drop or reuse at once), DATA payload is
//! copied into its stream's own blocks as it arrives (a DATA frame is never
//! collected whole, and nothing of the caller's buffer is kept: see
//! `recv_buffer`), and output is a queue
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
//!   granted and the credit is given back once the caller has used the
//!   data ([`ServerConn::consumed`], after [`ServerConn::take_data`]), so
//!   that what a caller gathers counts against the windows too; sent DATA
//!   waits for the client's windows and for the output queue to drain
//!   below [`OUT_HIGH`];
//! * the output: the caller keeps reading while it waits for the client
//!   (stopping could deadlock with a client that stops reading too, as
//!   grpc-go does); what reading adds to it is bounded (see `output.rs`),
//!   answers past [`MAX_UNWRITTEN_ANSWERS`] a flood;
//! * response heads and trailers encoded without the dynamic table
//!   (static indexes and literals), split into CONTINUATION frames when
//!   needed;
//! * limits: concurrent streams (REFUSED_STREAM past them), counted as
//!   grpc-go counts them: a stream whose END_STREAM or RST_STREAM is
//!   written, or that the client reset, no longer counts, even while the
//!   caller still holds it; the header list size, the frame size we advertise; a
//!   protocol violation is a connection error (GOAWAY, then the caller
//!   closes) or, where RFC 9113 allows, a stream error (RST_STREAM);
//! * floods ([`Flood`]), GOAWAY ENHANCE_YOUR_CALM as the h2 crate does:
//!   more than [`MAX_PENDING_RESETS`] streams reset by the client before
//!   the caller took them (rapid reset, CVE-2023-44487), and a header
//!   block in more CONTINUATION frames than its largest size needs (empty
//!   ones add no bytes to the size limit), and more than
//!   [`MAX_ERROR_RESETS`] streams we had to reset for the client's errors
//!   over the connection's life (CVE-2025-8671, as the h2 crate counts:
//!   refusals past the concurrency limit and malformed requests too),
//!   and more than [`MAX_UNWRITTEN_ANSWERS`] answers waiting unwritten,
//!   each checked after every frame;
//! * stream states (RFC 9113 5.1): a new stream id not above the last is
//!   a connection error; HEADERS or DATA on a half-closed (remote) or
//!   closed stream is STREAM_CLOSED, except what was in flight when we
//!   reset the stream (the last few ids we reset are remembered);
//!   `content-length` is checked against the DATA (8.1.1), trailers must
//!   end the request and carry no pseudo-header (8.1);
//! * a response that ends before its request keeps the stream, without
//!   its caller, until the client ends or resets its side, so what the
//!   client still sends is checked, and one whose end waits behind data
//!   when its caller lets it go is still sent ([`ServerConn::release`]).
//!
//! `tests/h2_differential.rs` sends hostile client sequences to this
//! server and to the h2 crate's and compares what each does; the
//! differences it finds are deliberate, each with its reason there.
//!
//! Streams carry a caller value `U` (the runtime keeps its wakers there).
//! [`Event::Wake`] names a stream whose state changed for its reader or
//! writer (data, end, reset, window).

use std::borrow::Cow;
use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use loona_hpack::decoder::DecoderError;

mod flow_control;
mod frame;
mod headers;
mod output;
mod recv;
mod recv_buffer;
mod streams;
mod wire;
pub use wire::{encode_field, put_frame_header, write_block, FRAME_HEADER_LEN, PREFACE};

use frame::frame_type::*;
use frame::*;
pub use frame::{frame_type, reason};
use headers::Block;
use output::Out;
use recv::In;
use recv_buffer::RecvBuffer;
use streams::{RecvSide, SendSide, Stream};
use wire::{END_HEADERS, END_STREAM, PADDED, PRIORITY as PRIORITY_FLAG};

/// Output queued past this many bytes: stream DATA and window credit wait
/// for it to drain. The caller keeps reading meanwhile (see
/// [`MAX_UNWRITTEN_ANSWERS`] for what bounds the rest).
pub const OUT_HIGH: usize = 64 * 1024;

/// Answers to the client's frames (PING and SETTINGS acknowledgements,
/// RST_STREAMs of streams that never counted) that may wait unwritten at
/// once; one more is a flood (a client that sends without reading):
/// GOAWAY ENHANCE_YOUR_CALM. Go's server allows 10,000
/// (`maxQueuedControlFrames`); grpc-go's client, whose answers to ours
/// are the same kinds of frame, stops reading at 50.
pub const MAX_UNWRITTEN_ANSWERS: u32 = 1024;

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

/// Streams a connection may make us reset with its errors (RST_STREAM
/// for a bad frame on a stream, a frame on a closed one, a malformed
/// request, a stream past the concurrency limit), over its life: the h2
/// crate's default `max_local_error_reset_streams`, which counts its
/// refusals too (`count_pending_refusal`). Refusals after our GOAWAY are
/// not counted (the client sent them before it saw it).
pub const MAX_ERROR_RESETS: u32 = 1024;

/// A flood the connection ended (GOAWAY ENHANCE_YOUR_CALM), for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flood {
    /// Streams opened and reset faster than the caller takes them.
    RapidReset = 0,
    /// A header block in more CONTINUATION frames than its size needs.
    Continuation = 1,
    /// More than [`MAX_ERROR_RESETS`] streams we reset for the client's
    /// errors ("MadeYouReset", CVE-2025-8671: each reset frees a stream
    /// slot while the work it started goes on).
    ErrorResets = 2,
    /// More than [`MAX_UNWRITTEN_ANSWERS`] answers waiting unwritten.
    ControlFrames = 3,
}

impl Flood {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Flood::RapidReset => "rapid_reset",
            Flood::Continuation => "continuation",
            Flood::ErrorResets => "error_resets",
            Flood::ControlFrames => "control_frames",
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
    /// The streams' ids, in the same order: what a frame's stream is found
    /// by (4 bytes an entry, so a search over 1,000 streams stays in the
    /// first-level cache; over the 216-byte stream states it missed it at
    /// every step and was most of the CPU of a flood of tiny frames).
    ids: Vec<u32>,
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
    /// Streams we reset for the client's errors (see [`MAX_ERROR_RESETS`]).
    error_resets: u32,
    /// Frames [`Self::recv_at_most`] may still take in this call.
    frames_left: usize,
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
    /// Output bytes written since the start: with `out_len`, where each
    /// queued frame ends.
    written: u64,
    /// Where each queued frame a bound counts ends, and its stream (0: an
    /// answer): see [`output::Out`].
    unwritten: VecDeque<(u64, u32)>,
    ends_unwritten: u32,
    answers_unwritten: u32,
    /// Window credit is owed and waits for the output to drain.
    credit_owed: bool,
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
            ids: Vec::new(),
            lingering: 0,
            recent_resets: [0; RECENT_RESETS],
            recent_next: 0,
            last_stream: 0,
            pending_resets: 0,
            error_resets: 0,
            frames_left: usize::MAX,
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
            written: 0,
            unwritten: VecDeque::new(),
            ends_unwritten: 0,
            answers_unwritten: 0,
            credit_owed: false,
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
            + self.unwritten.capacity() * std::mem::size_of::<(u64, u32)>()
            + self.streams.capacity() * std::mem::size_of::<Stream<U>>()
            + self.ids.capacity() * std::mem::size_of::<u32>()
            + self.block.as_ref().map_or(0, |b| b.bytes.capacity())
            + self
                .streams
                .iter()
                .map(|s| s.recv.allocated())
                .sum::<usize>()
    }

    /// Received DATA bytes the connection holds for its streams, and those
    /// its caller took and has not used yet ([`Self::consumed`]): at most
    /// the connection window we granted.
    pub fn received_held(&self) -> usize {
        self.streams
            .iter()
            .map(|s| s.recv.len() + s.held as usize)
            .sum()
    }

    /// [`Self::recv`], taking at most `max` frames; how many of them are
    /// left (0: stopped for the budget, the rest of `input` is unread). A
    /// read of tiny frames is thousands of them: the caller yields its core
    /// between budgets (issue 39: the read loop counted reads, not frames).
    pub fn recv_at_most(&mut self, input: &mut BytesMut, max: usize) -> Result<usize, ConnError> {
        self.frames_left = max;
        let r = self.recv(input);
        let left = self.frames_left;
        self.frames_left = usize::MAX;
        r.map(|()| left)
    }

    /// Consumes what it can of `input` (the caller keeps the rest and
    /// appends to it). DATA payload is copied out: nothing of `input`'s
    /// buffer is kept.
    /// An `Err` is final: the GOAWAY is queued; write the output and close.
    pub fn recv(&mut self, input: &mut BytesMut) -> Result<(), ConnError> {
        if let Some(e) = &self.closed {
            input.clear();
            return Err(e.clone());
        }
        let r = self.recv_frames(input).and_then(|()| self.check_floods());
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                input.clear();
                self.fail(e.clone());
                Err(e)
            }
        }
    }

    /// The counted floods, checked after each frame (a read holds
    /// thousands of small ones): the one past its bound ends the
    /// connection before the next frame is taken.
    fn check_floods(&self) -> Result<(), ConnError> {
        if self.error_resets > MAX_ERROR_RESETS {
            return Err(flood_err(
                Flood::ErrorResets,
                "too many streams reset for the client's errors",
            ));
        }
        if self.answers_unwritten > MAX_UNWRITTEN_ANSWERS {
            return Err(flood_err(
                Flood::ControlFrames,
                "too many answers waiting for the client to read",
            ));
        }
        Ok(())
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
}

/// Bytes of one stream's state (its table slot).
pub fn stream_state_size<U>() -> usize {
    std::mem::size_of::<Stream<U>>() + std::mem::size_of::<u32>()
}

#[cfg(test)]
mod tests;
