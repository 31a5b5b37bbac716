//! The differential test of our HTTP/2 server (`h2_server`) against the
//! h2 crate's server (hyperium/h2 0.4, the library it stands in for on the
//! gRPC frontend and the agent link), on hostile client input.
//!
//! Each case is a client byte sequence, made by the small frame writer
//! below, fed to both servers with the same settings (concurrent streams,
//! windows, frame size, header list size) and the same application (take
//! every request, read its body, answer `200` and trailers at its end).
//! What each does is compared as the client sees it on the wire: whether
//! the connection ended and the GOAWAY's code, which streams were reset
//! and with what code, which were answered, and the request bodies the
//! application received whole.
//!
//! Each case runs twice: with a client that reads everything, and with one
//! that reads the server's first flight and then stops reading (its socket
//! takes [`PIPE`] bytes, then the server's writes wait), until all of its
//! input is sent; then it reads everything and the verdict is taken. Our
//! output queue must stay bounded in both.
//!
//! Both servers are driven without a runtime, deterministically: ours
//! through its sans-I/O API as the engine's `h2_conn` drives it (reads of
//! [`READ_SIZE`] handed to [`ServerConn::recv_at_most`] a turn of
//! [`FRAMES_PER_TURN`] frames at a time, the events to the application,
//! the output written as the socket takes it); h2 on an in-memory socket,
//! its connection and its request tasks polled in turns until none moves.
//! The application closes a connection the client sent GOAWAY on once no
//! stream is open, as the gRPC frontend does (h2 does it itself).
//!
//! Where the verdicts differ on purpose, the case says how and why; any
//! other difference fails the test. What h2 does was read in its source
//! (hyperium/h2 v0.4.20: `src/proto/connection.rs`, `settings.rs`,
//! `ping_pong.rs`, `streams/counts.rs`, `streams/streams.rs`,
//! `codec/framed_read.rs`), Go's bounds in golang.org/x/net
//! `http2/server.go`.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use edgetunnel_protocol::h2_server::{
    encode_field, frame_type as ty, reason, Config, Event, Recv, ServerConn, MAX_ERROR_RESETS,
    MAX_PENDING_RESETS, MAX_UNWRITTEN_ANSWERS, OUT_HIGH,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const MAX_STREAMS: u32 = 100;
const STREAM_WINDOW: u32 = 65_535;
const CONN_WINDOW: u32 = 256 * 1024;
const MAX_FRAME: u32 = 16_384;
const MAX_HEADER_LIST: u32 = 16_384;
/// Bytes a client's socket takes from the server while the client does
/// not read.
const PIPE: usize = 16 * 1024;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

// ===== The frame writer =====

/// A client byte sequence, frame by frame.
#[derive(Clone, Default)]
struct Frames(Vec<u8>);

impl Frames {
    fn new() -> Self {
        Frames::default()
    }

    fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }

    fn frame(&mut self, ty: u8, flags: u8, id: u32, payload: &[u8]) -> &mut Self {
        self.frame_len(ty, flags, id, payload.len(), payload)
    }

    /// A frame whose header says `len` (whatever the payload's length).
    fn frame_len(&mut self, ty: u8, flags: u8, id: u32, len: usize, payload: &[u8]) -> &mut Self {
        self.0
            .extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags]);
        self.0.extend_from_slice(&id.to_be_bytes());
        self.0.extend_from_slice(payload);
        self
    }

    fn settings(&mut self, entries: &[(u16, u32)]) -> &mut Self {
        let mut p = Vec::new();
        for (k, v) in entries {
            p.extend_from_slice(&k.to_be_bytes());
            p.extend_from_slice(&v.to_be_bytes());
        }
        self.frame(ty::SETTINGS, 0, 0, &p)
    }

    fn settings_ack(&mut self) -> &mut Self {
        self.frame(ty::SETTINGS, ACK, 0, &[])
    }

    fn ping(&mut self, n: u64) -> &mut Self {
        self.frame(ty::PING, 0, 0, &n.to_be_bytes())
    }

    fn headers_block(&mut self, id: u32, flags: u8, block: &[u8]) -> &mut Self {
        self.frame(ty::HEADERS, flags, id, block)
    }

    /// A request head (END_HEADERS; END_STREAM with `end`).
    fn request(&mut self, id: u32, end: bool) -> &mut Self {
        self.request_with(id, end, &[])
    }

    /// A request head with `extra` fields after the usual ones.
    fn request_with(&mut self, id: u32, end: bool, extra: &[(&str, &str)]) -> &mut Self {
        let mut fields = request_fields().to_vec();
        fields.extend_from_slice(extra);
        let flags = END_HEADERS | if end { END_STREAM } else { 0 };
        self.headers_block(id, flags, &block(&fields))
    }

    fn data(&mut self, id: u32, payload: &[u8], end: bool) -> &mut Self {
        self.frame(ty::DATA, if end { END_STREAM } else { 0 }, id, payload)
    }

    fn rst(&mut self, id: u32, code: u32) -> &mut Self {
        self.frame(ty::RST_STREAM, 0, id, &code.to_be_bytes())
    }

    fn window_update(&mut self, id: u32, inc: u32) -> &mut Self {
        self.frame(ty::WINDOW_UPDATE, 0, id, &inc.to_be_bytes())
    }

    fn priority(&mut self, id: u32, depends_on: u32) -> &mut Self {
        let mut p = depends_on.to_be_bytes().to_vec();
        p.push(15);
        self.frame(ty::PRIORITY, 0, id, &p)
    }

    fn goaway(&mut self, last: u32, code: u32) -> &mut Self {
        let mut p = last.to_be_bytes().to_vec();
        p.extend_from_slice(&code.to_be_bytes());
        self.frame(ty::GOAWAY, 0, 0, &p)
    }
}

fn request_fields() -> [(&'static str, &'static str); 6] {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/pkg.Service/Method"),
        (":authority", "server"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}

/// An HPACK block of the fields (no dynamic table, no Huffman).
fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in fields {
        encode_field(&mut b, n.as_bytes(), v.as_bytes());
    }
    b
}

/// The client's start: preface, SETTINGS (defaults), and the ACK of the
/// server's SETTINGS (h2 applies its own settings once they are acked).
fn handshake() -> Vec<u8> {
    let mut f = Frames::new();
    f.raw(PREFACE).settings(&[]).settings_ack();
    f.0
}

// ===== What the client sees =====

/// A connection closed without a GOAWAY.
const NO_GOAWAY: u32 = u32::MAX;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Verdict {
    /// The GOAWAY's code (with `NO_GOAWAY`: closed without one); `None`:
    /// open.
    closed: Option<u32>,
    /// Streams the server reset, with the code (the first reset of each).
    resets: BTreeMap<u32, u32>,
    /// Streams the server ended (END_STREAM).
    answered: BTreeSet<u32>,
    /// Request bodies the application received whole, by stream.
    bodies: BTreeMap<u32, usize>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.closed {
            None => write!(f, "open")?,
            Some(NO_GOAWAY) => write!(f, "closed without GOAWAY")?,
            Some(c) => write!(f, "GOAWAY {}", code_name(c))?,
        }
        if !self.resets.is_empty() {
            let mut by_code: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
            for (s, c) in &self.resets {
                by_code.entry(*c).or_default().push(*s);
            }
            for (c, ids) in by_code {
                write!(f, ", RST {} x{} {}", code_name(c), ids.len(), ranges(&ids))?;
            }
        }
        if !self.answered.is_empty() {
            let ids: Vec<u32> = self.answered.iter().copied().collect();
            write!(f, ", answered x{} {}", ids.len(), ranges(&ids))?;
        }
        if !self.bodies.is_empty() {
            let ids: Vec<u32> = self.bodies.keys().copied().collect();
            let total: usize = self.bodies.values().sum();
            write!(f, ", bodies x{} {} {total} B", ids.len(), ranges(&ids))?;
        }
        Ok(())
    }
}

fn ranges(ids: &[u32]) -> String {
    match ids {
        [] => String::new(),
        [a] => format!("[{a}]"),
        [a, .., b] => format!("[{a}..{b}]"),
    }
}

fn code_name(c: u32) -> String {
    match c {
        reason::NO_ERROR => "NO_ERROR".into(),
        reason::PROTOCOL_ERROR => "PROTOCOL_ERROR".into(),
        reason::INTERNAL_ERROR => "INTERNAL_ERROR".into(),
        reason::FLOW_CONTROL_ERROR => "FLOW_CONTROL_ERROR".into(),
        reason::STREAM_CLOSED => "STREAM_CLOSED".into(),
        reason::FRAME_SIZE_ERROR => "FRAME_SIZE_ERROR".into(),
        reason::REFUSED_STREAM => "REFUSED_STREAM".into(),
        reason::CANCEL => "CANCEL".into(),
        reason::COMPRESSION_ERROR => "COMPRESSION_ERROR".into(),
        reason::ENHANCE_YOUR_CALM => "ENHANCE_YOUR_CALM".into(),
        c => format!("{c:#x}"),
    }
}

/// Reads the server's frames into `v` (all but the connection's end).
fn read_wire(mut b: &[u8], v: &mut Verdict) {
    while b.len() >= 9 {
        let len = usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]);
        let (t, flags) = (b[3], b[4]);
        let id = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff;
        assert!(
            b.len() >= 9 + len,
            "a frame cut short in the server's output"
        );
        let p = &b[9..9 + len];
        match t {
            ty::GOAWAY if v.closed.is_none() => {
                v.closed = Some(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
            }
            ty::RST_STREAM => {
                v.resets
                    .entry(id)
                    .or_insert(u32::from_be_bytes([p[0], p[1], p[2], p[3]]));
            }
            ty::HEADERS | ty::DATA if flags & END_STREAM != 0 => {
                v.answered.insert(id);
            }
            _ => {}
        }
        b = &b[9 + len..];
    }
}

/// The client's socket, seen from the server: what the client sent and
/// what the server wrote.
#[derive(Default)]
struct Peer {
    /// Client bytes the server has not read yet.
    input: BytesMut,
    /// Everything the server wrote.
    received: Vec<u8>,
    /// How much of it the client read.
    read: usize,
    reading: bool,
}

impl Peer {
    /// Bytes the server may write now.
    fn room(&self) -> usize {
        if self.reading {
            usize::MAX
        } else {
            PIPE.saturating_sub(self.received.len() - self.read)
        }
    }

    fn set_reading(&mut self, on: bool) {
        self.reading = on;
        self.read = self.received.len();
    }
}

/// What the application does with a request, the same on both servers.
#[derive(Debug, Clone, Copy)]
struct AppMode {
    /// It reads the body (and answers at its end); otherwise it holds the
    /// request unread.
    reads: bool,
    /// Response body bytes it sends before the trailers.
    reply: usize,
}

const SERVE: AppMode = AppMode {
    reads: true,
    reply: 0,
};

/// The application's record, the same for both servers.
#[derive(Default)]
struct App {
    /// Bodies being received, by stream.
    partial: BTreeMap<u32, usize>,
    /// Bodies received whole.
    bodies: BTreeMap<u32, usize>,
    /// Moves the application made (for the h2 driver's idle check).
    moves: u64,
}

/// What a run saw besides the verdict.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    /// Ours: the most output queued at once; h2: 0.
    peak_output: usize,
    /// Ours: the most heap held at once (`buffered_capacity`).
    peak_heap: usize,
    /// Client bytes the server had not read when the client began to
    /// read again (h2 stops reading while its output waits).
    unread_input: usize,
}

// ===== Ours, through the sans-I/O API =====

/// What the engine's `h2_conn` reads at once, and the frames it hands
/// [`ServerConn::recv_at_most`] in one turn (`READ_SIZE`,
/// `FRAMES_PER_TURN` there).
const READ_SIZE: usize = 64 * 1024;
const FRAMES_PER_TURN: usize = 256;

struct Ours {
    conn: ServerConn<()>,
    mode: AppMode,
    /// The client sent GOAWAY: once no stream is open the connection is
    /// closed with ours (as the gRPC frontend does).
    told: bool,
    peer: Peer,
    /// Input read and not yet taken (a frame cut by a read, or frames past
    /// the turn's budget).
    buf: BytesMut,
    /// `buf` holds whole frames past the last turn's budget: taken before
    /// the next read.
    more: bool,
    app: App,
    /// Streams the application holds.
    open: BTreeSet<u32>,
    held: Held,
}

fn our_config() -> Config {
    Config {
        stream_window: STREAM_WINDOW,
        conn_window: CONN_WINDOW,
        max_frame: MAX_FRAME,
        max_streams: MAX_STREAMS,
        max_header_list: MAX_HEADER_LIST,
        keep_fields: false,
    }
}

impl Ours {
    fn new(mode: AppMode) -> Self {
        Ours {
            conn: ServerConn::new(our_config()),
            mode,
            told: false,
            peer: Peer {
                reading: true,
                ..Peer::default()
            },
            buf: BytesMut::new(),
            more: false,
            app: App::default(),
            open: BTreeSet::new(),
            held: Held::default(),
        }
    }

    fn send(&mut self, b: &[u8]) {
        self.peer.input.extend_from_slice(b);
        self.settle();
    }

    /// Reads, serves and writes until nothing moves.
    fn settle(&mut self) {
        loop {
            let before = (
                self.peer.input.len() + self.buf.len(),
                self.conn.output_len(),
                self.peer.received.len(),
                self.app.moves,
            );
            if self.conn.error().is_none() {
                self.read_turn();
            }
            self.serve();
            self.held.peak_output = self.held.peak_output.max(self.conn.output_len());
            self.held.peak_heap = self.held.peak_heap.max(self.conn.buffered_capacity());
            self.write();
            let after = (
                self.peer.input.len() + self.buf.len(),
                self.conn.output_len(),
                self.peer.received.len(),
                self.app.moves,
            );
            if before == after {
                return;
            }
        }
    }

    /// One turn of the engine's read loop: a read (unless whole frames
    /// wait from the last turn), then at most a turn's frames.
    fn read_turn(&mut self) {
        if !self.more {
            let n = self.peer.input.len().min(READ_SIZE);
            if n == 0 {
                return;
            }
            let read = self.peer.input.split_to(n);
            self.buf.extend_from_slice(&read);
        }
        match self.conn.recv_at_most(&mut self.buf, FRAMES_PER_TURN) {
            Ok(left) => self.more = left == 0 && !self.buf.is_empty(),
            // Final; the GOAWAY is queued.
            Err(_) => self.more = false,
        }
    }

    fn serve(&mut self) {
        while let Some(e) = self.conn.poll_event() {
            match e {
                Event::Request { stream, .. } => {
                    self.app.moves += 1;
                    self.open.insert(stream);
                    if self.mode.reads {
                        self.serve_stream(stream);
                    }
                }
                Event::Wake(id) if self.mode.reads && self.open.contains(&id) => {
                    self.serve_stream(id)
                }
                Event::GoAway { .. } => self.told = true,
                _ => {}
            }
        }
        if self.told && self.open.is_empty() {
            self.conn.go_away();
        }
    }

    /// The application's stream task: read the body, answer at its end.
    fn serve_stream(&mut self, id: u32) {
        loop {
            match self.conn.take_data(id) {
                Recv::Data(b) => {
                    self.app.moves += 1;
                    self.conn.consumed(id, b.len());
                    *self.app.partial.entry(id).or_default() += b.len();
                }
                Recv::End => {
                    self.app.moves += 1;
                    let n = self.app.partial.remove(&id).unwrap_or(0);
                    self.app.bodies.insert(id, n);
                    let _ = self
                        .conn
                        .send_head(id, &[("content-type", "application/grpc")], false);
                    if self.mode.reply > 0 {
                        let _ = self
                            .conn
                            .send_data(id, Bytes::from(vec![0; self.mode.reply]));
                    }
                    let _ = self.conn.send_trailers(id, &[("grpc-status", "0")]);
                    self.conn.release(id);
                    self.open.remove(&id);
                    return;
                }
                Recv::Reset(_) => {
                    self.app.moves += 1;
                    self.app.partial.remove(&id);
                    self.conn.release(id);
                    self.open.remove(&id);
                    return;
                }
                Recv::Pending => return,
            }
        }
    }

    /// Writes what the client's socket takes.
    fn write(&mut self) {
        let n = self.conn.output_len().min(self.peer.room());
        if n == 0 {
            return;
        }
        let mut left = n;
        for b in self.conn.output() {
            let k = left.min(b.len());
            self.peer.received.extend_from_slice(&b[..k]);
            left -= k;
            if left == 0 {
                break;
            }
        }
        self.conn.wrote(n);
    }

    fn verdict(&self) -> Verdict {
        let mut v = Verdict::default();
        read_wire(&self.peer.received, &mut v);
        if v.closed.is_none() && self.conn.error().is_some() {
            v.closed = Some(NO_GOAWAY);
        }
        v.bodies = self.app.bodies.clone();
        v
    }
}

// ===== h2, on an in-memory socket =====

/// The server's end of the client's socket.
struct Socket(Rc<RefCell<Peer>>);

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut p = self.0.borrow_mut();
        if p.input.is_empty() {
            return Poll::Pending;
        }
        let n = p.input.len().min(buf.remaining());
        buf.put_slice(&p.input.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        let mut p = self.0.borrow_mut();
        let n = b.len().min(p.room());
        if n == 0 {
            return Poll::Pending;
        }
        p.received.extend_from_slice(&b[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

type Task = Pin<Box<dyn Future<Output = ()>>>;
type ConnTask = Pin<Box<dyn Future<Output = Result<(), h2::Error>>>>;

struct H2 {
    peer: Rc<RefCell<Peer>>,
    app: Rc<RefCell<App>>,
    /// The connection: handshake, then accepting requests.
    conn: Option<ConnTask>,
    ended: Option<Result<(), h2::Error>>,
    tasks: Vec<Task>,
    spawned: Rc<RefCell<Vec<Task>>>,
}

impl H2 {
    fn new(mode: AppMode) -> Self {
        let peer = Rc::new(RefCell::new(Peer {
            reading: true,
            ..Peer::default()
        }));
        let app = Rc::new(RefCell::new(App::default()));
        let spawned: Rc<RefCell<Vec<Task>>> = Rc::default();
        let io = Socket(peer.clone());
        let (app2, spawned2) = (app.clone(), spawned.clone());
        let conn = async move {
            let mut conn = h2::server::Builder::new()
                .initial_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONN_WINDOW)
                .max_frame_size(MAX_FRAME)
                .max_concurrent_streams(MAX_STREAMS)
                .max_header_list_size(MAX_HEADER_LIST)
                .handshake::<_, Bytes>(io)
                .await?;
            while let Some(r) = conn.accept().await {
                let (req, respond) = r?;
                app2.borrow_mut().moves += 1;
                spawned2
                    .borrow_mut()
                    .push(Box::pin(h2_stream(req, respond, app2.clone(), mode)));
            }
            Ok(())
        };
        H2 {
            peer,
            app,
            conn: Some(Box::pin(conn)),
            ended: None,
            tasks: Vec::new(),
            spawned,
        }
    }

    fn send(&mut self, b: &[u8]) {
        self.peer.borrow_mut().input.extend_from_slice(b);
        self.settle();
    }

    /// Polls the connection and the request tasks in turns until a few
    /// turns in a row move nothing.
    fn settle(&mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut still = 0;
        for _ in 0..100_000 {
            let before = self.stamp();
            if let Some(c) = &mut self.conn {
                if let Poll::Ready(r) = c.as_mut().poll(&mut cx) {
                    self.ended = Some(r);
                    self.conn = None;
                }
            }
            let new = std::mem::take(&mut *self.spawned.borrow_mut());
            self.tasks.extend(new);
            self.tasks
                .retain_mut(|t| t.as_mut().poll(&mut cx).is_pending());
            if self.stamp() == before {
                still += 1;
                if still == 4 {
                    return;
                }
            } else {
                still = 0;
            }
        }
        panic!("h2 kept moving");
    }

    fn stamp(&self) -> (usize, usize, u64, usize, bool) {
        let p = self.peer.borrow();
        (
            p.input.len(),
            p.received.len(),
            self.app.borrow().moves,
            self.tasks.len(),
            self.conn.is_some(),
        )
    }

    fn verdict(&self) -> Verdict {
        let mut v = Verdict::default();
        read_wire(&self.peer.borrow().received, &mut v);
        if v.closed.is_none() && self.ended.is_some() {
            v.closed = Some(NO_GOAWAY);
        }
        v.bodies = self.app.borrow().bodies.clone();
        v
    }
}

/// The application's stream task on h2: read the body (giving its window
/// back), answer at its end.
async fn h2_stream(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    app: Rc<RefCell<App>>,
    mode: AppMode,
) {
    let id: u32 = respond.stream_id().into();
    if !mode.reads {
        // Held, unread, for good.
        let _held = (&req, &respond);
        std::future::pending::<()>().await;
    }
    let mut body = req.into_body();
    let mut n = 0;
    loop {
        match body.data().await {
            Some(Ok(b)) => {
                let _ = body.flow_control().release_capacity(b.len());
                n += b.len();
                app.borrow_mut().moves += 1;
            }
            Some(Err(_)) => {
                app.borrow_mut().moves += 1;
                return;
            }
            None => break,
        }
    }
    if body.trailers().await.is_err() {
        app.borrow_mut().moves += 1;
        return;
    }
    {
        let mut a = app.borrow_mut();
        a.moves += 1;
        a.bodies.insert(id, n);
    }
    let head = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    if let Ok(mut send) = respond.send_response(head, false) {
        if mode.reply > 0 {
            let _ = send.send_data(Bytes::from(vec![0; mode.reply]), false);
        }
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("0"));
        let _ = send.send_trailers(t);
    }
}

// ===== Cases =====

/// How the two verdicts compare.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The same verdict, whole.
    Same,
    /// The same end (open, or GOAWAY and its code); what happened on the
    /// way differs, for the reason given.
    SameEnd(&'static str),
    /// A deliberate difference: our end, h2's, and why.
    Differs {
        ours: Option<u32>,
        h2: Option<u32>,
        why: &'static str,
    },
}
use Expect::*;

const OPEN: Option<u32> = None;

fn goaway(code: u32) -> Option<u32> {
    Some(code)
}

struct Case {
    name: &'static str,
    /// The client's first bytes (read by the server before the client
    /// may stop reading).
    start: Vec<u8>,
    /// The hostile part, in pieces the servers take one after another
    /// (each until nothing moves).
    pieces: Vec<Vec<u8>>,
    app: AppMode,
    expect: Expect,
    /// What is expected instead when the client stops reading.
    when_unread: Option<Expect>,
}

impl Case {
    fn app(mut self, app: AppMode) -> Self {
        self.app = app;
        self
    }

    fn when_unread(mut self, e: Expect) -> Self {
        self.when_unread = Some(e);
        self
    }

    fn start(mut self, f: impl FnOnce(&mut Frames)) -> Self {
        let mut frames = Frames::new();
        frames.raw(&self.start);
        f(&mut frames);
        self.start = frames.0;
        self
    }

    /// One more piece, taken after the servers settled on the last.
    fn then(mut self, f: impl FnOnce(&mut Frames)) -> Self {
        let mut frames = Frames::new();
        f(&mut frames);
        self.pieces.push(frames.0);
        self
    }
}

fn case(name: &'static str, expect: Expect, f: impl FnOnce(&mut Frames)) -> Case {
    let mut frames = Frames::new();
    f(&mut frames);
    Case {
        name,
        start: handshake(),
        pieces: vec![frames.0],
        app: SERVE,
        expect,
        when_unread: None,
    }
}

struct Run {
    verdict: Verdict,
    held: Held,
}

fn run_ours(c: &Case, peer_reads: bool) -> Run {
    let mut s = Ours::new(c.app);
    s.send(&c.start);
    s.peer.set_reading(peer_reads);
    for p in &c.pieces {
        s.send(p);
    }
    s.held.unread_input = s.peer.input.len() + s.buf.len();
    s.peer.set_reading(true);
    s.settle();
    Run {
        verdict: s.verdict(),
        held: s.held,
    }
}

fn run_h2(c: &Case, peer_reads: bool) -> Run {
    let mut s = H2::new(c.app);
    s.send(&c.start);
    s.peer.borrow_mut().set_reading(peer_reads);
    for p in &c.pieces {
        s.send(p);
    }
    let held = Held {
        unread_input: s.peer.borrow().input.len(),
        ..Held::default()
    };
    s.peer.borrow_mut().set_reading(true);
    s.settle();
    Run {
        verdict: s.verdict(),
        held,
    }
}

/// Deliberate differences, each found by this test and kept for its
/// reason.
const WE_READ_ON: &str = "reading never stops here for the output (a grpc-go client stops \
    reading while 50 of its answers wait: if we stopped too, neither would read again), so \
    answers waiting past MAX_UNWRITTEN_ANSWERS are a flood (Go's server: 10,000); h2 answers \
    one SETTINGS or PING at a time and stops reading until it is written, holding the \
    connection open and its input unread";
const GO_SETTINGS: &str = "Go's server's bound (x/net/http2 processSettings: more than 100 \
    settings or one repeated); h2 applies any number, each a walk over the streams";
const RFC_FRAME_SIZE: &str = "RFC 9113 names FRAME_SIZE_ERROR for a PING, SETTINGS, \
    RST_STREAM, WINDOW_UPDATE or PRIORITY frame of the wrong length (6.7, 6.5, 6.4, 6.9, \
    6.3); h2 says PROTOCOL_ERROR";
const RFC_COMPRESSION: &str = "RFC 9113 4.3: a field block that cannot be decoded is a \
    connection error COMPRESSION_ERROR; h2 says PROTOCOL_ERROR";
const RFC_STREAM_ERROR: &str = "RFC 9113 makes it a stream error (5.1: a frame on a \
    half-closed (remote) stream is STREAM_CLOSED; 6.9: a WINDOW_UPDATE of 0 on a stream; \
    8.1.1: a malformed request), so the other streams live on; the reset is counted \
    against MAX_ERROR_RESETS; h2 ends the connection";
const HEADER_LIST: &str = "a header list past SETTINGS_MAX_HEADER_LIST_SIZE, or a block \
    larger than it, ends the connection here (ENHANCE_YOUR_CALM; RFC 9113 10.5.1 lets a \
    server close rather than process it): nothing past the limit is held or decoded; h2 \
    (and Go) answer 431 and keep the connection";
const WHEN_WRITTEN: &str = "which streams are refused on the way, and which answers get out \
    before the GOAWAY, depend on when each server writes (ours after each turn of \
    FRAMES_PER_TURN frames, h2 once all its input is read)";
const PACKED: &str = "h2 keeps each DATA frame as a buffer of its own and bounds them \
    (MAX_RECV_EMPTY_DATA_FRAMES, 100 empty ones a connection; data_frame_budget for small \
    ones); here payload is copied into the stream's packed 16 KiB blocks (recv_buffer): an \
    empty frame holds nothing, small ones hold their bytes, and what is left is a frame's \
    parsing, as for PRIORITY or unknown frames (which h2 does not count either), which the \
    engine's frame budget per turn spreads among the core's tasks";

fn cases() -> Vec<Case> {
    let pending_resets = MAX_PENDING_RESETS as u32;
    let mut v = vec![
        case("one request with a body", Same, |f| {
            f.request(1, false).data(1, &[7; 1000], true);
        }),
        case("PING flood", Same, |f| {
            for i in 0..10_000 {
                f.ping(i);
            }
        })
        .when_unread(Differs {
            ours: goaway(reason::ENHANCE_YOUR_CALM),
            h2: OPEN,
            why: WE_READ_ON,
        }),
        case("SETTINGS flood", Same, |f| {
            for _ in 0..10_000 {
                f.settings(&[]);
            }
        })
        .when_unread(Differs {
            ours: goaway(reason::ENHANCE_YOUR_CALM),
            h2: OPEN,
            why: WE_READ_ON,
        }),
        case(
            "SETTINGS with 101 entries",
            Differs {
                ours: goaway(reason::PROTOCOL_ERROR),
                h2: OPEN,
                why: GO_SETTINGS,
            },
            |f| {
                let e: Vec<(u16, u32)> = (0..101).map(|i| (0x100 + i, 0)).collect();
                f.settings(&e).request(1, true);
            },
        ),
        case("SETTINGS with 100 entries", Same, |f| {
            let e: Vec<(u16, u32)> = (0..100).map(|i| (0x100 + i, 0)).collect();
            f.settings(&e).request(1, true);
        }),
        case(
            "SETTINGS with a setting repeated",
            Differs {
                ours: goaway(reason::PROTOCOL_ERROR),
                h2: OPEN,
                why: GO_SETTINGS,
            },
            |f| {
                f.settings(&[(4, 1000), (4, 2000)]).request(1, true);
            },
        ),
        case("rapid reset past the pending-accept bound", Same, |f| {
            for i in 0..pending_resets + 10 {
                f.request(1 + 2 * i, false).rst(1 + 2 * i, reason::CANCEL);
            }
        }),
        case("rapid reset at the pending-accept bound", Same, |f| {
            for i in 0..pending_resets {
                f.request(1 + 2 * i, false).rst(1 + 2 * i, reason::CANCEL);
            }
            f.request(1001, true);
        }),
        case("WINDOW_UPDATE overflows the connection window", Same, |f| {
            f.window_update(0, 0x7fff_ffff);
        }),
        case("WINDOW_UPDATE overflows a stream window", Same, |f| {
            f.request(1, false).window_update(1, 0x7fff_ffff);
        }),
        case("zero WINDOW_UPDATE on the connection", Same, |f| {
            f.window_update(0, 0);
        }),
        case(
            "zero WINDOW_UPDATE on a stream",
            Differs {
                ours: OPEN,
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_STREAM_ERROR,
            },
            |f| {
                f.request(1, false).window_update(1, 0);
            },
        ),
        case("WINDOW_UPDATE on an idle stream", Same, |f| {
            f.window_update(3, 1);
        }),
        case("WINDOW_UPDATE flood on a stream", Same, |f| {
            f.request(1, false);
            for _ in 0..5_000 {
                f.window_update(1, 1);
            }
            f.data(1, &[], true);
        }),
        case("DATA past a stream's window", Same, |f| {
            f.request(1, false);
            for _ in 0..4 {
                f.data(1, &[1; 16_384], false);
            }
            f.request(3, true);
        }),
        // (With an application that reads, whether the connection window
        // is exceeded depends on when it runs: credit it gives back before
        // the rest arrives is credit granted.)
        case("DATA past the connection window", Same, |f| {
            for i in 0..5 {
                f.request(1 + 2 * i, false);
                for _ in 0..3 {
                    f.data(1 + 2 * i, &[1; 16_384], false);
                }
                f.data(1 + 2 * i, &[1; 16_383], false);
            }
        })
        .app(AppMode {
            reads: false,
            reply: 0,
        }),
        case("DATA filling the windows exactly", Same, |f| {
            f.request(1, false);
            for _ in 0..3 {
                f.data(1, &[1; 16_384], false);
            }
            f.data(1, &[1; 16_383], true);
        }),
        case("DATA on stream 0", Same, |f| {
            f.data(0, &[1], false);
        }),
        case("DATA on an idle stream", Same, |f| {
            f.data(1, &[1], false);
        }),
        case(
            "DATA after END_STREAM",
            Differs {
                ours: OPEN,
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_STREAM_ERROR,
            },
            |f| {
                f.request(1, false)
                    .data(1, &[1; 10], true)
                    .data(1, &[1; 10], false)
                    .request(3, true);
            },
        ),
        case("DATA with padding longer than the frame", Same, |f| {
            f.request(1, false).frame(ty::DATA, PADDED, 1, &[10, 1, 2]);
        }),
        case(
            "empty DATA frames",
            Differs {
                ours: OPEN,
                h2: goaway(reason::ENHANCE_YOUR_CALM),
                why: PACKED,
            },
            |f| {
                f.request(1, false);
                for _ in 0..200 {
                    f.data(1, &[], false);
                }
                f.data(1, &[], true);
            },
        ),
        case("empty DATA frames under h2's bound", Same, |f| {
            f.request(1, false);
            for _ in 0..100 {
                f.data(1, &[], false);
            }
            f.data(1, &[], true);
        }),
        case(
            "one-byte DATA frames",
            Differs {
                ours: OPEN,
                h2: goaway(reason::ENHANCE_YOUR_CALM),
                why: PACKED,
            },
            |f| {
                f.request(1, false);
                for _ in 0..10_000 {
                    f.data(1, &[1], false);
                }
                f.data(1, &[], true);
            },
        ),
        case(
            "one-byte DATA frames, held unread",
            Differs {
                ours: OPEN,
                h2: goaway(reason::ENHANCE_YOUR_CALM),
                why: PACKED,
            },
            |f| {
                f.request(1, false);
                for _ in 0..10_000 {
                    f.data(1, &[1], false);
                }
            },
        )
        .app(AppMode {
            reads: false,
            reply: 0,
        }),
        case("oversized DATA frame", Same, |f| {
            f.request(1, false).data(1, &[0; 16_385], false);
        }),
        case("oversized HEADERS frame", Same, |f| {
            f.frame(ty::HEADERS, END_HEADERS, 1, &[0; 16_385]);
        }),
        case("oversized unknown frame", Same, |f| {
            f.frame(0x20, 0, 0, &[0; 16_385]);
        }),
        case("CONTINUATION flood", Same, |f| {
            let b = block(&request_fields());
            f.headers_block(1, 0, &b[..4]);
            for _ in 0..100 {
                f.frame(ty::CONTINUATION, 0, 1, &[]);
            }
            f.frame(ty::CONTINUATION, END_HEADERS, 1, &b[4..]);
        }),
        case("CONTINUATION at the bound", Same, |f| {
            let b = block(&request_fields());
            f.headers_block(1, END_STREAM, &b[..4]);
            for _ in 0..5 {
                f.frame(ty::CONTINUATION, 0, 1, &[]);
            }
            f.frame(ty::CONTINUATION, END_HEADERS, 1, &b[4..]);
        }),
        case("CONTINUATION past the bound", Same, |f| {
            let b = block(&request_fields());
            f.headers_block(1, END_STREAM, &b[..4]);
            for _ in 0..6 {
                f.frame(ty::CONTINUATION, 0, 1, &[]);
            }
            f.frame(ty::CONTINUATION, END_HEADERS, 1, &b[4..]);
        }),
        case("header block interrupted", Same, |f| {
            f.headers_block(1, 0, &block(&request_fields())).ping(1);
        }),
        case("CONTINUATION on another stream", Same, |f| {
            let b = block(&request_fields());
            f.headers_block(1, 0, &b[..4])
                .frame(ty::CONTINUATION, END_HEADERS, 3, &b[4..]);
        }),
        case("CONTINUATION without HEADERS", Same, |f| {
            f.frame(ty::CONTINUATION, END_HEADERS, 1, &block(&request_fields()));
        }),
        case(
            "header block larger than the list size",
            Differs {
                ours: goaway(reason::ENHANCE_YOUR_CALM),
                h2: OPEN,
                why: HEADER_LIST,
            },
            |f| {
                let big = "v".repeat(10_000);
                let mut fields = request_fields().to_vec();
                fields.push(("x-a", &big));
                fields.push(("x-b", &big));
                let b = block(&fields);
                f.headers_block(1, END_STREAM, &b[..16_000]);
                f.frame(ty::CONTINUATION, END_HEADERS, 1, &b[16_000..]);
                f.request(3, true);
            },
        ),
        case(
            "header list over the limit (small block)",
            Differs {
                ours: goaway(reason::ENHANCE_YOUR_CALM),
                h2: OPEN,
                why: HEADER_LIST,
            },
            |f| {
                let names: Vec<String> = (0..500).map(|i| format!("x-{i}")).collect();
                let mut fields = request_fields().to_vec();
                for n in &names {
                    fields.push((n, "v"));
                }
                f.headers_block(1, END_HEADERS | END_STREAM, &block(&fields));
                f.request(3, true);
            },
        ),
        case("header list just under the limit", Same, |f| {
            let names: Vec<String> = (0..300).map(|i| format!("x-{i}")).collect();
            let mut fields = request_fields().to_vec();
            for n in &names {
                fields.push((n, "v"));
            }
            f.headers_block(1, END_HEADERS | END_STREAM, &block(&fields));
        }),
        case("streams past max_concurrent_streams", Same, |f| {
            for i in 0..MAX_STREAMS + 5 {
                f.request(1 + 2 * i, false);
            }
        }),
        case("streams refused past the error-reset bound", Same, |f| {
            for i in 0..MAX_STREAMS + MAX_ERROR_RESETS + 10 {
                f.request(1 + 2 * i, false);
            }
        }),
        case(
            "streams reset for their errors past the bound",
            SameEnd(WHEN_WRITTEN),
            |f| {
                for i in 0..MAX_ERROR_RESETS + 10 {
                    f.request(1 + 2 * i, false)
                        .window_update(1 + 2 * i, 0x7fff_ffff);
                }
            },
        ),
        case(
            "malformed requests past the error-reset bound",
            SameEnd(
                "h2 sends none of its RST_STREAMs before the GOAWAY; we send them up to the bound",
            ),
            |f| {
                for i in 0..MAX_ERROR_RESETS + 10 {
                    f.request_with(1 + 2 * i, true, &[("connection", "close")]);
                }
            },
        ),
        case(
            "requests in a burst past the concurrency limit",
            SameEnd(WHEN_WRITTEN),
            |f| {
                for i in 0..2_000 {
                    f.request(1 + 2 * i, true);
                }
            },
        ),
        case("large answers to a client that stops reading", Same, |f| {
            for i in 0..MAX_STREAMS {
                f.request(1 + 2 * i, true);
            }
        })
        .start(|f| {
            // Windows that let every answer out at once.
            f.settings(&[(4, 1 << 20)]).window_update(0, 64 << 20);
        })
        .app(AppMode {
            reads: true,
            reply: 32 * 1024,
        }),
        case("PRIORITY on itself, idle stream", Same, |f| {
            f.priority(1, 1).request(3, true);
        }),
        case("PRIORITY on itself, open stream", Same, |f| {
            f.request(1, false).priority(1, 1).request(3, true);
        }),
        case("HEADERS with priority on itself", Same, |f| {
            let mut p = 1u32.to_be_bytes().to_vec();
            p.push(15);
            p.extend_from_slice(&block(&request_fields()));
            f.headers_block(1, END_HEADERS | END_STREAM | PRIORITY, &p);
            f.request(3, true);
        }),
        case(
            "PRIORITY of the wrong size",
            Differs {
                ours: goaway(reason::FRAME_SIZE_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_FRAME_SIZE,
            },
            |f| {
                f.frame(ty::PRIORITY, 0, 1, &[0, 0, 0, 3]);
            },
        ),
        case("PRIORITY on stream 0", Same, |f| {
            f.priority(0, 1);
        }),
        case("unknown frame types", Same, |f| {
            for i in 0..1000u32 {
                f.frame(0x0a + (i % 200) as u8, 0xff, i, &[0; 100]);
            }
            f.request(1, true);
        }),
        case("HEADERS on stream 0", Same, |f| {
            f.request(0, true);
        }),
        case("HEADERS on an even stream", Same, |f| {
            f.request(2, true);
        }),
        case("HEADERS below the last stream id", Same, |f| {
            f.request(5, false).request(3, true);
        }),
        case(
            "HEADERS after END_STREAM",
            Differs {
                ours: OPEN,
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_STREAM_ERROR,
            },
            |f| {
                f.request(1, false).data(1, &[1; 10], true).headers_block(
                    1,
                    END_HEADERS | END_STREAM,
                    &block(&[("x", "y")]),
                );
            },
        ),
        case("HEADERS on a stream answered and closed", Same, |f| {
            f.request(1, true);
        })
        .then(|f| {
            f.request(1, true);
        }),
        case("HEADERS with padding longer than the frame", Same, |f| {
            let mut p = vec![200];
            p.extend_from_slice(&block(&request_fields()));
            f.headers_block(1, END_HEADERS | PADDED, &p);
        }),
        case(
            "HPACK index out of the table",
            Differs {
                ours: goaway(reason::COMPRESSION_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_COMPRESSION,
            },
            |f| {
                f.headers_block(1, END_HEADERS | END_STREAM, &[0xff, 0xff, 0xff, 0x0f]);
            },
        ),
        case(
            "HPACK table size update past the limit",
            Differs {
                ours: goaway(reason::COMPRESSION_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_COMPRESSION,
            },
            |f| {
                let mut b = vec![0x3f, 0xe1, 0xff, 0x03];
                b.extend_from_slice(&block(&request_fields()));
                f.headers_block(1, END_HEADERS | END_STREAM, &b);
            },
        ),
        case(
            "HPACK table size update at the end of a block",
            Differs {
                ours: goaway(reason::COMPRESSION_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_COMPRESSION,
            },
            |f| {
                let mut b = block(&request_fields());
                b.push(0x20);
                f.headers_block(1, END_HEADERS | END_STREAM, &b);
            },
        ),
        case(
            "HPACK block cut inside a field",
            Differs {
                ours: goaway(reason::COMPRESSION_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_COMPRESSION,
            },
            |f| {
                let b = block(&request_fields());
                f.headers_block(1, END_HEADERS | END_STREAM, &b[..b.len() - 3]);
            },
        ),
        case("trailers ending a request", Same, |f| {
            f.request(1, false).data(1, &[1; 10], false).headers_block(
                1,
                END_HEADERS | END_STREAM,
                &block(&[("x", "y")]),
            );
        }),
        case("trailers without END_STREAM", Same, |f| {
            f.request(1, false)
                .headers_block(1, END_HEADERS, &block(&[("x", "y")]))
                .request(3, true);
        }),
        case(
            "trailers with a pseudo-header",
            SameEnd(
                "RFC 9113 8.1: trailers carry no pseudo-header, the request is malformed (a \
                 stream error, as Go's server has it: trailers_pseudo); h2 drops the field and \
                 serves the request",
            ),
            |f| {
                f.request(1, false)
                    .headers_block(1, END_HEADERS | END_STREAM, &block(&[(":path", "/")]))
                    .request(3, true);
            },
        ),
        case("content-length exceeded", Same, |f| {
            f.request_with(1, false, &[("content-length", "5")])
                .data(1, &[1; 10], true)
                .request(3, true);
        }),
        case("content-length not reached", Same, |f| {
            f.request_with(1, false, &[("content-length", "50")])
                .data(1, &[1; 10], true)
                .request(3, true);
        }),
        case("PUSH_PROMISE from the client", Same, |f| {
            f.request(1, false);
            let mut p = 2u32.to_be_bytes().to_vec();
            p.extend_from_slice(&block(&request_fields()));
            f.frame(ty::PUSH_PROMISE, END_HEADERS, 1, &p);
        }),
        case("SETTINGS ENABLE_PUSH 2", Same, |f| {
            f.settings(&[(2, 2)]);
        }),
        case(
            "SETTINGS INITIAL_WINDOW_SIZE past 2^31-1",
            Differs {
                ours: goaway(reason::FLOW_CONTROL_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: "RFC 9113 6.5.2 names FLOW_CONTROL_ERROR",
            },
            |f| {
                f.settings(&[(4, 0x8000_0000)]);
            },
        ),
        case(
            "SETTINGS INITIAL_WINDOW_SIZE overflows a stream window",
            Same,
            |f| {
                f.request(1, false)
                    .window_update(1, 0x7fff_ffff - 65_535)
                    .settings(&[(4, 65_536)]);
            },
        ),
        case("SETTINGS MAX_FRAME_SIZE under 16384", Same, |f| {
            f.settings(&[(5, 16_383)]);
        }),
        case(
            "SETTINGS of a length not a multiple of 6",
            Differs {
                ours: goaway(reason::FRAME_SIZE_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_FRAME_SIZE,
            },
            |f| {
                f.frame(ty::SETTINGS, 0, 0, &[0, 4, 0, 0, 0]);
            },
        ),
        case(
            "SETTINGS ACK with a payload",
            Differs {
                ours: goaway(reason::FRAME_SIZE_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_FRAME_SIZE,
            },
            |f| {
                f.frame(ty::SETTINGS, ACK, 0, &[0, 4, 0, 0, 0, 1]);
            },
        ),
        case(
            "SETTINGS ACK unasked",
            Differs {
                ours: OPEN,
                h2: goaway(reason::PROTOCOL_ERROR),
                why: "an ACK we did not ask for changes nothing here and is not answered; RFC \
                      9113 makes it no error (h2 and Go hang up)",
            },
            |f| {
                f.settings_ack().request(1, true);
            },
        ),
        case("SETTINGS on a stream", Same, |f| {
            f.frame(ty::SETTINGS, 0, 1, &[]);
        }),
        case(
            "PING of the wrong size",
            Differs {
                ours: goaway(reason::FRAME_SIZE_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_FRAME_SIZE,
            },
            |f| {
                f.frame(ty::PING, 0, 0, &[0; 7]);
            },
        ),
        case("PING on a stream", Same, |f| {
            f.frame(ty::PING, 0, 1, &[0; 8]);
        }),
        case("RST_STREAM on an idle stream", Same, |f| {
            f.rst(1, reason::CANCEL);
        }),
        case("RST_STREAM on stream 0", Same, |f| {
            f.rst(0, reason::CANCEL);
        }),
        case(
            "RST_STREAM of the wrong size",
            Differs {
                ours: goaway(reason::FRAME_SIZE_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_FRAME_SIZE,
            },
            |f| {
                f.request(1, false).frame(ty::RST_STREAM, 0, 1, &[0; 3]);
            },
        ),
        case(
            "RST_STREAM after the request ended",
            SameEnd(
                "a client reset after its request ended reaches our application as a reset \
                 (its work can stop); h2 hands the application the whole request and fails \
                 its answer",
            ),
            |f| {
                f.request(1, true);
                for _ in 0..100 {
                    f.rst(1, reason::CANCEL);
                }
                f.request(3, true);
            },
        ),
        case(
            "WINDOW_UPDATE of the wrong size",
            Differs {
                ours: goaway(reason::FRAME_SIZE_ERROR),
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_FRAME_SIZE,
            },
            |f| {
                f.frame(ty::WINDOW_UPDATE, 0, 0, &[0, 0, 1]);
            },
        ),
        case("GOAWAY from the client", Same, |f| {
            f.request(1, false).goaway(1, 0).data(1, &[1; 10], true);
        }),
    ];
    for (name, bad, same) in [
        ("unknown pseudo-header", &[(":foo", "x")][..], false),
        ("upper-case field name", &[("X-Up", "x")], false),
        (
            "connection-specific field",
            &[("connection", "close")],
            true,
        ),
        ("te other than trailers", &[("te", "gzip")], true),
        (
            "pseudo-header after a regular field",
            &[(":method", "GET")],
            true,
        ),
        (":status in a request", &[(":status", "200")], true),
        ("bad content-length", &[("content-length", "x")], true),
    ] {
        let bad = bad.to_vec();
        let expect = if same {
            Same
        } else {
            Differs {
                ours: OPEN,
                h2: goaway(reason::PROTOCOL_ERROR),
                why: RFC_STREAM_ERROR,
            }
        };
        v.push(case(name, expect, move |f| {
            f.request_with(1, true, &bad).request(3, true);
        }));
    }
    for (name, drop) in [
        ("missing :path", ":path"),
        ("missing :method", ":method"),
        ("missing :scheme", ":scheme"),
    ] {
        v.push(case(name, Same, move |f| {
            let fields: Vec<_> = request_fields()
                .into_iter()
                .filter(|(n, _)| *n != drop)
                .collect();
            f.headers_block(1, END_HEADERS | END_STREAM, &block(&fields))
                .request(3, true);
        }));
    }
    v.push(case("empty :path", Same, |f| {
        let fields: Vec<_> = request_fields()
            .into_iter()
            .map(|(n, val)| if n == ":path" { (n, "") } else { (n, val) })
            .collect();
        f.headers_block(1, END_HEADERS | END_STREAM, &block(&fields))
            .request(3, true);
    }));
    let mut bad_preface = case(
        "bad preface",
        Differs {
            ours: goaway(reason::PROTOCOL_ERROR),
            h2: Some(NO_GOAWAY),
            why: "RFC 9113 3.4: a connection error PROTOCOL_ERROR, for which a GOAWAY may \
                  be sent (h2 closes without one)",
        },
        |f| {
            f.raw(b"PRI * HTTP/1.1\r\n\r\nSM\r\n\r\n");
        },
    );
    bad_preface.start.clear();
    v.push(bad_preface);
    let mut not_settings = case(
        "first frame not SETTINGS",
        Differs {
            ours: goaway(reason::PROTOCOL_ERROR),
            h2: OPEN,
            why: "RFC 9113 3.4: the preface is the magic and a SETTINGS frame (Go's server \
                  checks it too: first_settings); h2 takes any frame first",
        },
        |f| {
            f.raw(PREFACE).ping(1).settings(&[]);
        },
    );
    not_settings.start.clear();
    v.push(not_settings);
    v
}

/// Output our server may queue at once, whatever the client sends: DATA
/// stops at [`OUT_HIGH`] (plus a frame), answers at
/// [`MAX_UNWRITTEN_ANSWERS`] (a PING ACK, the largest, is 17 bytes; one
/// turn's frames are taken before the bound is checked), and each stream
/// counted until its end is written has a head, trailers and an end
/// queued (under 256 bytes here).
fn output_bound() -> usize {
    OUT_HIGH
        + MAX_FRAME as usize
        + 9
        + (MAX_UNWRITTEN_ANSWERS as usize + 1) * 17
        + MAX_STREAMS as usize * 256
        + 64
}

/// Heap our server may hold for this test's connections: the stream
/// slots, the output queue's slots, and received DATA the application
/// holds unread (at most the connection window, in blocks of 16 KiB).
fn heap_bound() -> usize {
    MAX_STREAMS as usize * 512 + output_bound() / 8 * 32 + CONN_WINDOW as usize + 16 * 1024
}

#[test]
fn hostile_clients_get_the_verdicts_h2_gives() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for c in cases() {
        for peer_reads in [true, false] {
            let ours = run_ours(&c, peer_reads);
            let theirs = run_h2(&c, peer_reads);
            let who = if peer_reads {
                "client reads"
            } else {
                "client stops reading"
            };
            let expect = match (peer_reads, c.when_unread) {
                (false, Some(e)) => e,
                _ => c.expect,
            };
            let line = format!(
                "{} ({who}):\n  ours {} [output peak {} B, heap peak {} B]\n  h2   {} [input \
                 left unread {} B]",
                c.name,
                ours.verdict,
                ours.held.peak_output,
                ours.held.peak_heap,
                theirs.verdict,
                theirs.held.unread_input,
            );
            let (ok, why) = match expect {
                Same => (ours.verdict == theirs.verdict, ""),
                SameEnd(why) => (ours.verdict.closed == theirs.verdict.closed, why),
                Differs { ours: o, h2, why } => {
                    (ours.verdict.closed == o && theirs.verdict.closed == h2, why)
                }
            };
            let line = if why.is_empty() {
                line
            } else {
                format!("{line}\n  deliberate: {why}")
            };
            if !ok {
                failures.push(format!("{line}\n  expected {expect:?}"));
            }
            if ours.held.peak_output > output_bound() || ours.held.peak_heap > heap_bound() {
                failures.push(format!("{line}\n  past the bounds"));
            }
            report.push(line);
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
