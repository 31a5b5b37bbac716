//! An HTTP/2 server connection over a byte stream, driven by the sans-I/O
//! [`ServerConn`]: the runtime glue of the gRPC frontend and of the
//! server's agent links.
//!
//! [`H2Conn::poll_next`] reads, writes and hands out requests; it is
//! polled by the connection's task. Each request's [`StreamRecv`] and
//! [`StreamSend`] work on the shared connection state from the stream's
//! own task and wake the connection's task when they queue output.
//!
//! An idle connection holds no buffer: reads go into one buffer per thread
//! (a connection keeps only the bytes of a frame cut by a read, and copies
//! them out when they are few), DATA payload is copied out of it into each
//! stream's own blocks, and the output queue is empty. What a connection
//! holds of received DATA is what its client sent and the caller did not
//! use yet ([`StreamRecv::consumed`]), at most the connection window.

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

use protocol::h2_server::{Config, ConnError, Event, Recv, RequestHead, SendError, ServerConn};

/// The thread's read buffer (DATA payload is copied out of it, so it is
/// free again once a read is processed).
const READ_SIZE: usize = 64 * 1024;
/// The least room a read is given.
const MIN_READ: usize = 16 * 1024;
/// Leftover input up to this size is copied out of the thread's buffer
/// (a frame header cut by a read), larger leftovers keep their buffer.
const SMALL_LEFTOVER: usize = 256;
/// Reads per poll before the task yields to others.
const READS_PER_POLL: usize = 16;
/// Frames taken in one turn before the task yields to others: a 64 KiB
/// read of tiny frames is 4,681 of them, and a connection that kept
/// sending them held its core (issue 39: a handshake on the same worker
/// took 38 ms at the median, 1.7 s at p90, behind 1,000 streams of 1-byte
/// DATA frames). 256 of grpc-go's 16 KiB frames are 4 MiB: bulk transfers
/// meet the read budget first. The budget is the turn's, not a poll's
/// (each request handed out is a poll: a budget per poll let a turn take
/// 16 x 256 frames), and a turn starts only after the yield's own wake
/// ([`crate::runtime::YieldGate`]).
const FRAMES_PER_TURN: usize = 256;
/// Requests handed out in a row before the task lets the core's other
/// tasks run: a caller opening streams by the thousand (each served by a
/// task of its own) does not keep the worker from the others.
const REQUESTS_PER_TURN: u8 = 16;
/// Output chunks written in one `writev`.
const WRITE_SLICES: usize = 64;

fn take_read_buf() -> BytesMut {
    crate::thread_buf::take(&crate::thread_buf::H2_READ, MIN_READ, READ_SIZE)
}

fn give_read_buf(b: BytesMut) {
    debug_assert!(b.is_empty());
    crate::thread_buf::give(&crate::thread_buf::H2_READ, b);
}

/// Why the connection ended.
#[derive(Debug, thiserror::Error)]
pub enum H2Error {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Protocol(#[from] ConnError),
    /// An HTTP/1 request where the HTTP/2 client preface belongs: the
    /// caller and this listener disagree on the protocol (typically
    /// kube-apiserver's egress selector says HTTPConnect and the server
    /// serves gRPC on that socket).
    #[error("{}", http1_on_h2(.method))]
    Http1Request { method: &'static str },
}

fn http1_on_h2(method: &str) -> String {
    if method == "CONNECT" {
        "an HTTP/1.1 CONNECT request arrived on a gRPC (HTTP/2) listener: the caller speaks \
         HTTP CONNECT (an EgressSelectorConfiguration with proxyProtocol: HTTPConnect) but \
         this socket serves gRPC (--grpc-uds/--grpc-bind, ANP's --mode=grpc): make the two \
         agree (proxyProtocol: GRPC, or serve this socket with --connect-uds/--connect-bind)"
            .to_string()
    } else {
        format!(
            "an HTTP/1.1 {method} request arrived on a gRPC (HTTP/2) listener, which speaks \
             HTTP/2 only"
        )
    }
}

/// Bytes of a connection's start kept to explain a bad preface: enough to
/// tell the HTTP/1.1 methods apart, small enough to live in the padding of
/// [`H2Conn`] (every idle gRPC caller's task holds one; its size is a
/// memory budget, see `grpc_frontend`'s task-size test).
const START_KEPT: usize = 4;

/// The HTTP/1.1 methods (RFC 9110 9.1) by their first four bytes.
const METHODS: [(&[u8; 4], &str); 8] = [
    (b"CONN", "CONNECT"),
    (b"GET ", "GET"),
    (b"HEAD", "HEAD"),
    (b"POST", "POST"),
    (b"PUT ", "PUT"),
    (b"DELE", "DELETE"),
    (b"OPTI", "OPTIONS"),
    (b"PATC", "PATCH"),
];

/// The method of an HTTP/1 request line at the start of a connection
/// (`CONNECT host:port HTTP/1.1`), if its first four bytes name one. The
/// HTTP/2 preface's `PRI ` is not one.
fn http1_method(start: &[u8]) -> Option<&'static str> {
    let head = start.get(..START_KEPT)?;
    METHODS
        .iter()
        .find(|(prefix, _)| prefix.as_slice() == head)
        .map(|(_, m)| *m)
}

/// A stream's wakers, kept with the stream in [`ServerConn`].
#[derive(Default)]
struct Wakers {
    recv: Option<Waker>,
    send: Option<Waker>,
    /// Handles alive (the stream is released when both are gone).
    handles: u8,
}

impl Wakers {
    fn wake(&mut self) {
        if let Some(w) = self.recv.take() {
            w.wake();
        }
        if let Some(w) = self.send.take() {
            w.wake();
        }
    }
}

struct Shared {
    conn: ServerConn<Wakers>,
    /// The connection's `leftover` holds frames not yet taken (the frame
    /// budget ran out). (Here, with the next field, rather than in
    /// [`H2Conn`], whose size every idle caller's task carries.)
    more_input: bool,
    /// Requests handed out since the connection's task last yielded.
    handed: u8,
    /// Frames the connection may still take before it yields.
    frames_left: u16,
    /// The connection's task yielded and its turn has not come yet.
    turn: crate::runtime::YieldGate,
    /// The connection's task, woken when a stream queued output.
    driver: Option<Waker>,
    /// The connection's task is gone (or ended): streams fail.
    closed: bool,
}

impl Shared {
    /// The connection's task yields behind the core's others; its next
    /// turn has the budgets afresh.
    fn yield_turn(&mut self, waker: &Waker) {
        self.handed = 0;
        self.frames_left = FRAMES_PER_TURN as u16;
        self.turn.yield_now(waker);
    }

    fn wake_driver(&mut self) {
        if let Some(w) = self.driver.take() {
            w.wake();
        }
    }

    fn wake_all(&mut self) {
        for w in self.conn.users() {
            w.wake();
        }
    }
}

/// What the connection hands out.
pub enum Incoming {
    /// The client's preface and SETTINGS came (once, first).
    Started,
    Request {
        head: RequestHead,
        end_stream: bool,
        recv: StreamRecv,
        send: StreamSend,
    },
    /// Our PING was answered.
    Pong,
    /// The client sent GOAWAY: no new stream comes.
    GoAway,
}

/// The connection; see the module documentation.
pub struct H2Conn<T> {
    io: T,
    shared: Rc<RefCell<Shared>>,
    /// Input of a frame cut by a read.
    leftover: BytesMut,
    flush: bool,
    done: bool,
    started: bool,
    /// The connection's first bytes (up to [`START_KEPT`]), to name an
    /// HTTP/1 caller in the error, and how many there are.
    start: [u8; START_KEPT],
    start_len: u8,
}

impl<T: AsyncRead + AsyncWrite + Unpin> H2Conn<T> {
    pub fn new(io: T, cfg: Config) -> Self {
        H2Conn {
            io,
            shared: Rc::new(RefCell::new(Shared {
                conn: ServerConn::new(cfg),
                more_input: false,
                handed: 0,
                frames_left: FRAMES_PER_TURN as u16,
                turn: Default::default(),
                driver: None,
                closed: false,
            })),
            leftover: BytesMut::new(),
            flush: false,
            done: false,
            started: false,
            start: [0; START_KEPT],
            start_len: 0,
        }
    }

    /// Sends a keepalive PING ([`Incoming::Pong`] answers it).
    pub fn ping(&self) {
        let mut s = self.shared.borrow_mut();
        s.conn.ping();
        s.wake_driver();
    }

    /// Graceful GOAWAY: open streams finish, new ones are refused.
    pub fn go_away(&self) {
        let mut s = self.shared.borrow_mut();
        s.conn.go_away();
        s.wake_driver();
    }

    /// The next request or PONG, driving the connection's I/O meanwhile;
    /// `None` once the client closed, `Err` when the connection failed.
    pub async fn next(&mut self) -> Option<Result<Incoming, H2Error>> {
        futures::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Incoming, H2Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        {
            let mut s = self.shared.borrow_mut();
            // Woken by a stream before its turn: it waits for the turn.
            if s.turn.waiting() {
                return Poll::Pending;
            }
            if s.handed >= REQUESTS_PER_TURN || s.frames_left == 0 {
                s.yield_turn(cx.waker());
                return Poll::Pending;
            }
        }
        match self.drive(cx) {
            Poll::Ready(r) => {
                self.done = true;
                self.close_streams();
                Poll::Ready(r.map(Err))
            }
            Poll::Pending => {
                if !self.started && self.shared.borrow().conn.started() {
                    self.started = true;
                    return Poll::Ready(Some(Ok(Incoming::Started)));
                }
                if let Some(i) = self.incoming() {
                    if let Incoming::Request { .. } = i {
                        self.shared.borrow_mut().handed += 1;
                    }
                    return Poll::Ready(Some(Ok(i)));
                }
                Poll::Pending
            }
        }
    }

    /// The next event for the caller, waking streams on the way.
    fn incoming(&mut self) -> Option<Incoming> {
        let mut s = self.shared.borrow_mut();
        while let Some(e) = s.conn.poll_event() {
            match e {
                Event::Wake(id) => {
                    if let Some(w) = s.conn.user(id) {
                        w.wake();
                    }
                }
                Event::Pong => return Some(Incoming::Pong),
                Event::GoAway { .. } => return Some(Incoming::GoAway),
                Event::Request {
                    stream,
                    head,
                    end_stream,
                } => {
                    if let Some(w) = s.conn.user(stream) {
                        w.handles = 2;
                    }
                    let recv = StreamRecv {
                        shared: self.shared.clone(),
                        id: stream,
                    };
                    let send = StreamSend {
                        shared: self.shared.clone(),
                        id: stream,
                    };
                    return Some(Incoming::Request {
                        head,
                        end_stream,
                        recv,
                        send,
                    });
                }
            }
        }
        None
    }

    /// Writes what is queued and reads what came, until both wait.
    /// `Ready(None)`: the client closed; `Ready(Some(e))`: failed.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<Option<H2Error>> {
        self.shared.borrow_mut().driver = Some(cx.waker().clone());
        let mut reads = 0;
        loop {
            if let Poll::Ready(r) = self.write(cx) {
                return Poll::Ready(r.err().map(Into::into));
            }
            let failed = self.shared.borrow().conn.error().cloned();
            if let Some(e) = failed {
                // The GOAWAY is out (or could not be written). A flood's
                // is not waited for: its client may never read.
                if self.shared.borrow().conn.output_len() == 0 || e.flood.is_some() {
                    if !self.started {
                        if let Some(method) = http1_method(&self.start[..self.start_len as usize]) {
                            return Poll::Ready(Some(H2Error::Http1Request { method }));
                        }
                    }
                    return Poll::Ready(Some(e.into()));
                }
                return Poll::Pending;
            }
            // Reading goes on while the output waits for the client: a
            // client that stops reading until its own writes drain (grpc-go
            // does, once 50 of its answers wait) would never read again if
            // we stopped too. The connection bounds what reading adds.
            // The caller takes what was parsed (the start, a request, a
            // PONG) before more is: reads do not run ahead of the requests
            // handed out (`poll_next` returns the event now).
            self.wake_streams();
            if (!self.started && self.shared.borrow().conn.started())
                || self.shared.borrow().conn.has_events()
            {
                return Poll::Pending;
            }
            if reads == READS_PER_POLL || self.shared.borrow().frames_left == 0 {
                // The core's other tasks first (a self-wake would run this
                // one again at once).
                self.shared.borrow_mut().yield_turn(cx.waker());
                return Poll::Pending;
            }
            let mut buf = if self.leftover.is_empty() {
                take_read_buf()
            } else {
                let mut b = std::mem::take(&mut self.leftover);
                if !self.shared.borrow().more_input {
                    b.reserve(MIN_READ);
                }
                b
            };
            let had = buf.len();
            // Frames left from the last budget are taken without a read.
            let fresh = !std::mem::take(&mut self.shared.borrow_mut().more_input);
            let read = if !fresh {
                Poll::Ready(Ok(1))
            } else {
                reads += 1;
                tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut buf)
            };
            match read {
                Poll::Pending => {
                    self.keep(buf);
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Some(e.into())),
                Poll::Ready(Ok(0)) => {
                    let cut = had > 0;
                    buf.clear();
                    give_read_buf(buf);
                    if cut {
                        return Poll::Ready(Some(
                            io::Error::new(io::ErrorKind::UnexpectedEof, "closed inside a frame")
                                .into(),
                        ));
                    }
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(_)) => {
                    let kept = self.start_len as usize;
                    if fresh && !self.started && kept < START_KEPT {
                        let new = &buf[had..];
                        let n = new.len().min(START_KEPT - kept);
                        self.start[kept..kept + n].copy_from_slice(&new[..n]);
                        self.start_len += n as u8;
                    }
                    // Errors are acted on above: the GOAWAY goes out first.
                    let mut s = self.shared.borrow_mut();
                    let budget = s.frames_left as usize;
                    match s.conn.recv_at_most(&mut buf, budget) {
                        Ok(left) => {
                            s.frames_left = left as u16;
                            s.more_input = left == 0 && !buf.is_empty();
                        }
                        Err(_) => s.frames_left = 0,
                    }
                    drop(s);
                    self.keep(buf);
                }
            }
        }
    }

    /// Wakes the streams named by the queued events, leaving requests,
    /// PONGs and GOAWAYs for [`Self::incoming`].
    fn wake_streams(&mut self) {
        let mut s = self.shared.borrow_mut();
        while let Some(Event::Wake(id)) = s.conn.peek_event() {
            let id = *id;
            s.conn.poll_event();
            if let Some(w) = s.conn.user(id) {
                w.wake();
            }
        }
    }

    /// Keeps the unconsumed end of a read buffer; gives an empty one back.
    fn keep(&mut self, mut buf: BytesMut) {
        if buf.is_empty() {
            give_read_buf(buf);
        } else if buf.len() <= SMALL_LEFTOVER {
            self.leftover = BytesMut::from(&buf[..]);
            buf.clear();
            give_read_buf(buf);
        } else {
            self.leftover = buf;
        }
    }

    /// Writes the queued output; `Ready` only on an error.
    fn write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let n = {
                let s = self.shared.borrow();
                let out = s.conn.output();
                if out.is_empty() {
                    break;
                }
                let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
                let mut k = 0;
                for b in out.iter().take(WRITE_SLICES) {
                    slices[k] = IoSlice::new(b);
                    k += 1;
                }
                match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..k]) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                    }
                    Poll::Ready(Ok(n)) => n,
                }
            };
            self.flush = true;
            self.shared.borrow_mut().conn.wrote(n);
            self.wake_streams();
        }
        if self.flush {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => self.flush = false,
            }
        }
        Poll::Pending
    }

    /// The connection is over: its streams fail.
    fn close_streams(&mut self) {
        let mut s = self.shared.borrow_mut();
        s.closed = true;
        s.wake_all();
    }
}

impl<T> Drop for H2Conn<T> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.try_borrow_mut() {
            s.closed = true;
            s.driver = None;
            s.wake_all();
        }
    }
}

/// Runs `f` on a live stream's state; `Err` when the connection is gone.
fn with_stream<R>(
    shared: &RefCell<Shared>,
    f: impl FnOnce(&mut Shared) -> Result<R, SendError>,
) -> Result<R, SendError> {
    let mut s = shared.borrow_mut();
    if s.closed {
        return Err(SendError::ConnClosed);
    }
    let r = f(&mut s);
    if s.conn.output_len() > 0 {
        s.wake_driver();
    }
    r
}

fn release(shared: &RefCell<Shared>, id: u32) {
    let mut s = shared.borrow_mut();
    let Some(w) = s.conn.user(id) else { return };
    w.handles = w.handles.saturating_sub(1);
    if w.handles == 0 {
        s.conn.release(id);
        s.wake_driver();
    }
}

/// The request body of one stream.
pub struct StreamRecv {
    shared: Rc<RefCell<Shared>>,
    id: u32,
}

/// What a stream's reader gets.
#[derive(Debug)]
pub enum RecvError {
    Reset(u32),
    ConnClosed,
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvError::Reset(code) => write!(f, "stream reset by the client ({code:#x})"),
            RecvError::ConnClosed => f.write_str("connection closed"),
        }
    }
}

impl std::error::Error for RecvError {}

impl StreamRecv {
    /// The caller used `n` bytes of what it took: their window goes back to
    /// the client. Until then they count against the windows, so what a
    /// caller gathers (a gRPC message) is bounded by them.
    pub fn consumed(&mut self, n: usize) {
        let mut s = self.shared.borrow_mut();
        s.conn.consumed(self.id, n);
        if s.conn.output_len() > 0 {
            s.wake_driver();
        }
    }

    /// Grows this stream's receive window by `stream` bytes and the
    /// connection's by `conn` (a long-lived stream on a long fat path).
    pub fn grow_windows(&mut self, stream: u32, conn: u32) {
        let mut s = self.shared.borrow_mut();
        s.conn.grow_recv_windows(self.id, stream, conn);
        if s.conn.output_len() > 0 {
            s.wake_driver();
        }
    }

    /// The next piece of the body; `None` at its end. Its window comes back
    /// with [`Self::consumed`].
    pub fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, RecvError>>> {
        let mut s = self.shared.borrow_mut();
        let r = s.conn.take_data(self.id);
        match r {
            Recv::Data(b) => Poll::Ready(Some(Ok(b))),
            Recv::End => Poll::Ready(None),
            Recv::Reset(code) => Poll::Ready(Some(Err(RecvError::Reset(code)))),
            Recv::Pending if s.closed => Poll::Ready(Some(Err(RecvError::ConnClosed))),
            Recv::Pending => {
                if let Some(w) = s.conn.user(self.id) {
                    w.recv = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for StreamRecv {
    fn drop(&mut self) {
        release(&self.shared, self.id);
    }
}

/// The response side of one stream.
pub struct StreamSend {
    shared: Rc<RefCell<Shared>>,
    id: u32,
}

impl StreamSend {
    /// The response head: `:status` 200 and `fields`; with `end`, a
    /// trailers-only response.
    pub fn send_head(&mut self, fields: &[(&str, &str)], end: bool) -> Result<(), SendError> {
        with_stream(&self.shared, |s| s.conn.send_head(self.id, fields, end))
    }

    /// Ready once the data queued before went out to the connection (so at
    /// most one message per stream waits for the client's window).
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        let mut s = self.shared.borrow_mut();
        if s.closed {
            return Poll::Ready(Err(SendError::ConnClosed));
        }
        match s.conn.send_pending(self.id) {
            Ok(0) => Poll::Ready(Ok(())),
            Ok(_) => {
                if let Some(w) = s.conn.user(self.id) {
                    w.send = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Queues body bytes (call [`Self::poll_ready`] first).
    pub fn send_data(&mut self, chunks: [Bytes; 2]) -> Result<(), SendError> {
        with_stream(&self.shared, |s| {
            for c in chunks {
                s.conn.send_data(self.id, c)?;
            }
            Ok(())
        })
    }

    /// Ends the response with trailers, after the queued data.
    pub fn send_trailers(&mut self, fields: &[(&str, &str)]) -> Result<(), SendError> {
        with_stream(&self.shared, |s| s.conn.send_trailers(self.id, fields))
    }

    /// Ready when the client reset the stream (its code) or the connection
    /// ended.
    pub fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<Result<u32, SendError>> {
        let mut s = self.shared.borrow_mut();
        if s.closed {
            return Poll::Ready(Err(SendError::ConnClosed));
        }
        if let Some(code) = s.conn.reset_reason(self.id) {
            return Poll::Ready(Ok(code));
        }
        if let Some(w) = s.conn.user(self.id) {
            w.send = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for StreamSend {
    fn drop(&mut self) {
        release(&self.shared, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::{http1_method, Shared, Wakers};

    /// The HTTP/2 state of one connection (gRPC frontend caller or agent
    /// link) lives behind one `Rc` for as long as the connection: the
    /// sans-I/O connection, the driver's waker and a flag; each open stream
    /// adds a slot to its table. Besides these, an idle connection holds
    /// only the client's HPACK table (what the client indexed, at most
    /// 4,096 bytes as RFC 7541 counts them).
    #[test]
    fn a_connections_http2_state_stays_small() {
        let shared = std::mem::size_of::<Shared>();
        let stream = protocol::h2_server::stream_state_size::<Wakers>();
        eprintln!("per connection {shared} bytes, per open stream {stream}");
        assert!(shared <= 512, "Shared is {shared} bytes");
        assert!(stream <= 256, "a stream's slot is {stream} bytes");
    }

    /// A connection yields after [`super::REQUESTS_PER_TURN`] requests;
    /// each request's stream task, ending, wakes the connection (its
    /// output is due), and that wake must not start the next turn before
    /// the core parked: the driver's readiness of other sockets comes only
    /// then. A task counting timer ticks (one per park) sees at most one
    /// turn's requests per tick.
    #[test]
    fn streams_waking_their_connection_do_not_start_its_next_turn_early() {
        use super::{H2Conn, Incoming, REQUESTS_PER_TURN};
        use crate::runtime::{block_on, Driver};
        use monoio::io::IntoPollIo;
        use protocol::h2_server::Config;
        use std::cell::Cell;
        use std::io::{Read, Write};
        use std::rc::Rc;
        use std::time::Duration;

        const STREAMS: u32 = 400;
        for driver in [Driver::Auto, Driver::Legacy] {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
                out.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
                for k in 0..STREAMS {
                    // HEADERS, END_STREAM | END_HEADERS: POST, http, "/"
                    // from HPACK's static table.
                    out.extend([0, 0, 3, 1, 5]);
                    out.extend((1 + 2 * k).to_be_bytes());
                    out.extend([0x83, 0x86, 0x84]);
                }
                c.write_all(&out).unwrap();
                let mut sink = [0u8; 16 * 1024];
                while matches!(c.read(&mut sink), Ok(n) if n > 0) {}
            });
            let (sock, _) = listener.accept().unwrap();
            sock.set_nonblocking(true).unwrap();
            let per_tick = block_on(driver, async move {
                let io = monoio::net::TcpStream::from_std(sock)
                    .unwrap()
                    .into_poll_io()
                    .unwrap();
                let mut conn = H2Conn::new(io, Config::default());
                let ticks = Rc::new(Cell::new(0u32));
                let t = ticks.clone();
                monoio::spawn(async move {
                    loop {
                        monoio::time::sleep(Duration::ZERO).await;
                        t.set(t.get() + 1);
                    }
                });
                let mut per_tick = std::collections::BTreeMap::<u32, u32>::new();
                let mut handed = 0;
                while handed < STREAMS {
                    match conn.next().await {
                        Some(Ok(Incoming::Request { recv, send, .. })) => {
                            handed += 1;
                            *per_tick.entry(ticks.get()).or_default() += 1;
                            monoio::spawn(async move { drop((recv, send)) });
                        }
                        Some(Ok(_)) => {}
                        other => panic!("the connection ended: {:?}", other.map(|r| r.err())),
                    }
                }
                per_tick
            })
            .unwrap();
            client.join().unwrap();
            let most = per_tick.values().copied().max().unwrap_or(0);
            eprintln!(
                "{driver:?}: {STREAMS} requests over {} ticks, at most {most} in one",
                per_tick.len()
            );
            assert!(
                most <= u32::from(REQUESTS_PER_TURN),
                "{driver:?}: {most} requests handed out between two parks of the core"
            );
        }
    }

    /// A client that reads nothing until it has written every request
    /// (grpc-go's reader stops while 50 of its answers wait to be
    /// written, which comes to the same) is served: the connection keeps
    /// reading while its output waits. Stopping too (as this connection
    /// did once 64 KiB waited) left both sides writing to full sockets
    /// for good; a reusable konnectivity tunnel of 2,000 dials over a
    /// unix socket hung that way about one run in six.
    #[test]
    fn a_client_that_reads_only_after_writing_is_served() {
        use super::{H2Conn, Incoming};
        use crate::runtime::{block_on, Driver};
        use bytes::Bytes;
        use futures::future::poll_fn;
        use monoio::io::IntoPollIo;
        use protocol::h2_server::Config;
        use std::io::{Read, Write};
        use std::time::Duration;

        const STREAMS: u32 = 1_000;
        const BODY: usize = 1_024;
        for driver in [Driver::Auto, Driver::Legacy] {
            let (mut c, server) = std::os::unix::net::UnixStream::pair().unwrap();
            server.set_nonblocking(true).unwrap();
            let client = std::thread::spawn(move || {
                // Far longer than the exchange takes (milliseconds); a
                // stalled server makes the write fail instead of hanging.
                c.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
                // SETTINGS_INITIAL_WINDOW_SIZE 1 MiB, and 16 MiB more for
                // the connection: the answers need no credit from us.
                out.extend([0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0, 0x10, 0, 0]);
                out.extend([0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 0xff, 0, 0]);
                for k in 0..STREAMS {
                    let id = (1 + 2 * k).to_be_bytes();
                    // HEADERS, END_HEADERS: POST, http, "/" (HPACK static).
                    out.extend([0, 0, 3, 1, 4]);
                    out.extend(id);
                    out.extend([0x83, 0x86, 0x84]);
                    // DATA, END_STREAM.
                    out.extend([0, (BODY >> 8) as u8, BODY as u8, 0, 1]);
                    out.extend(id);
                    out.extend(std::iter::repeat_n(k as u8, BODY));
                }
                c.write_all(&out).expect("the server stopped reading");
                // Then read every answer: DATA bytes and ends per stream.
                let mut got = vec![0usize; STREAMS as usize];
                let mut ended = 0;
                let mut buf = Vec::new();
                let mut chunk = [0u8; 64 * 1024];
                while ended < STREAMS {
                    let n = c.read(&mut chunk).expect("read the answers");
                    assert!(n > 0, "closed after {ended} ends");
                    buf.extend_from_slice(&chunk[..n]);
                    while buf.len() >= 9 {
                        let len = usize::from(buf[0]) << 16
                            | usize::from(buf[1]) << 8
                            | usize::from(buf[2]);
                        if buf.len() < 9 + len {
                            break;
                        }
                        let (ty, flags) = (buf[3], buf[4]);
                        let id = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]);
                        assert_ne!(ty, 7, "GOAWAY");
                        assert_ne!(ty, 3, "RST_STREAM on {id}");
                        if id != 0 {
                            let k = (id as usize - 1) / 2;
                            if ty == 0 {
                                got[k] += len;
                            }
                            if flags & 1 != 0 && (ty == 0 || ty == 1) {
                                ended += 1;
                            }
                        }
                        buf.drain(..9 + len);
                    }
                }
                got
            });
            block_on(driver, async move {
                let io = monoio::net::UnixStream::from_std(server)
                    .unwrap()
                    .into_poll_io()
                    .unwrap();
                let mut conn = H2Conn::new(io, Config::default());
                let mut answered = 0;
                while answered < STREAMS {
                    match conn.next().await {
                        Some(Ok(Incoming::Request {
                            mut recv, mut send, ..
                        })) => {
                            answered += 1;
                            monoio::spawn(async move {
                                let mut body = Vec::new();
                                while let Some(b) = poll_fn(|cx| recv.poll_data(cx)).await {
                                    let b = b.unwrap();
                                    body.extend_from_slice(&b);
                                    recv.consumed(b.len());
                                }
                                send.send_head(&[], false).unwrap();
                                poll_fn(|cx| send.poll_ready(cx)).await.unwrap();
                                send.send_data([Bytes::from(body), Bytes::new()]).unwrap();
                                send.send_trailers(&[("grpc-status", "0")]).unwrap();
                                poll_fn(|cx| send.poll_ready(cx)).await.unwrap();
                            });
                        }
                        Some(Ok(_)) => {}
                        other => panic!("the connection ended: {:?}", other.map(|r| r.err())),
                    }
                }
                // Serve on until the client has read every answer.
                monoio::select! {
                    _ = conn.next() => {}
                    _ = monoio::time::sleep(Duration::from_secs(25)) => {}
                }
            })
            .unwrap();
            let got = client.join().expect("the client failed");
            assert!(got.iter().all(|&n| n == BODY), "{driver:?}: echoes {got:?}");
        }
    }

    #[test]
    fn an_http1_request_line_is_told_from_the_http2_preface() {
        assert_eq!(http1_method(b"CONN"), Some("CONNECT"));
        assert_eq!(http1_method(b"GET "), Some("GET"));
        assert_eq!(http1_method(b"PRI "), None);
        assert_eq!(http1_method(b"\x16\x03\x01\x02"), None);
        assert_eq!(http1_method(b"GETX"), None);
        assert_eq!(http1_method(b"CON"), None);
    }
}
