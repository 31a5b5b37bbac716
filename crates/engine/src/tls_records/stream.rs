//! [`RecordStream`]: a TLS 1.3 connection after its handshake, sealing and
//! opening records itself (AsyncRead + AsyncWrite, as tokio-rustls'
//! stream). Written plaintext is copied once into a record buffer that is
//! reused, and sealed there in place; read records are opened in place in
//! the buffer the socket read them into, and their content is copied once
//! to the reader. rustls (its [`KernelConnection`]) only computes the
//! next traffic secrets on a KeyUpdate and takes session tickets.
//!
//! Memory: an idle stream holds no buffer. Reads go into the thread's
//! buffer (a stream keeps only a record cut by a read), and sealed records
//! wait in a buffer only while the socket is full.
//!
//! [`KernelConnection`]: rustls::kernel::KernelConnection

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::keys::RecordKey;
use protocol::tls_record::{
    self as rec, Inbound, Message, Receiver, RecordError, HEADER_LEN, MAX_PLAINTEXT, MAX_RECORD,
    TAG_LEN,
};

/// A read's room in the thread's buffer: four full records.
const READ_SIZE: usize = 4 * MAX_RECORD;
/// A record cut by a read up to this size is copied out of the thread's
/// buffer (which then serves the next stream); a larger one keeps it.
const SMALL_REST: usize = 4 * 1024;
/// Plaintext taken per write: four full records, sealed and sent in one
/// system call.
const WRITE_BATCH: usize = 4 * MAX_PLAINTEXT;

use crate::thread_buf::{give, TLS_READ as READ_BUF, TLS_WRITE as WRITE_BUF};

fn take(pool: &'static crate::thread_buf::Key, size: usize) -> BytesMut {
    crate::thread_buf::take(pool, size, size)
}

/// rustls' side of a connection once the handshake is done.
pub enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    fn update(&mut self, tx: bool) -> Result<RecordKey, io::Error> {
        let r = match (self, tx) {
            (Kernel::Client(k), true) => k.update_tx_secret(),
            (Kernel::Client(k), false) => k.update_rx_secret(),
            (Kernel::Server(k), true) => k.update_tx_secret(),
            (Kernel::Server(k), false) => k.update_rx_secret(),
        };
        let (seq, secrets) = r.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        RecordKey::new(secrets, seq).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    fn ticket(&mut self, body: &[u8]) -> Result<(), io::Error> {
        match self {
            Kernel::Client(k) => k
                .handle_new_session_ticket(body)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            // protocol::tls_record refuses tickets sent to a server.
            Kernel::Server(_) => Ok(()),
        }
    }

    fn confidentiality_limit(&self) -> u64 {
        let suite = match self {
            Kernel::Client(k) => k.negotiated_cipher_suite(),
            Kernel::Server(k) => k.negotiated_cipher_suite(),
        };
        suite
            .tls13()
            .map(|s| s.common.confidentiality_limit)
            .unwrap_or(u64::MAX)
    }
}

/// How the read side ended.
enum ReadEnd {
    /// close_notify received: EOF.
    Closed,
    /// A fatal error, returned to every later read.
    Failed(io::ErrorKind, String),
}

pub struct RecordStream<T> {
    io: T,
    pub(super) rx: RecordKey,
    pub(super) tx: RecordKey,
    kernel: Box<Kernel>,
    receiver: Receiver,
    /// Records sealed with one key before this end moves to the next (a
    /// KeyUpdate well before the suite's confidentiality limit).
    refresh_at: u64,
    /// Bytes read: opened records' unread content from `plain.0` to
    /// `plain.1`, then records not yet opened. Empty (no allocation) when
    /// idle.
    pub(super) rbuf: BytesMut,
    /// `rbuf` is a thread's read buffer (given back when emptied).
    rbuf_pooled: bool,
    plain: (usize, usize),
    /// Where the record whose content is being read ends in `rbuf`.
    record_end: usize,
    read_end: Option<ReadEnd>,
    /// Sealed records not yet written.
    wbuf: BytesMut,
    close_sent: bool,
    /// A KeyUpdate answering the peer's request is sealed and not yet
    /// written: a second request until then gets no second answer (RFC 8446
    /// section 4.6.3 asks for one before our next record; rustls queues one
    /// too), so a peer that requests without reading cannot grow `wbuf`.
    key_update_owed: bool,
    /// A fatal alert is sealed: nothing more may be written after it (RFC
    /// 8446 section 6.2), close_notify included.
    fatal_sent: bool,
}

/// Records a read opens without giving the caller any data before it lets
/// the core's other tasks run (monoio has no cooperative budget: a socket
/// that keeps holding records would otherwise hold the core).
const RECORDS_PER_POLL: usize = 32;

/// What the handshake leaves for the record layer.
pub struct Established {
    pub rx: RecordKey,
    pub tx: RecordKey,
    pub kernel: Kernel,
    pub is_client: bool,
    /// Records received after the handshake's (still sealed).
    pub rest: BytesMut,
}

impl<T> RecordStream<T> {
    pub fn new(io: T, e: Established) -> Self {
        let limit = e.kernel.confidentiality_limit();
        RecordStream {
            io,
            rx: e.rx,
            tx: e.tx,
            kernel: Box::new(e.kernel),
            receiver: Receiver::new(e.is_client),
            refresh_at: limit.saturating_sub(limit / 8),
            plain: (0, 0),
            record_end: 0,
            rbuf: e.rest,
            rbuf_pooled: false,
            read_end: None,
            wbuf: BytesMut::new(),
            close_sent: false,
            key_update_owed: false,
            fatal_sent: false,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Application data rustls opened during the handshake: read first.
    pub fn set_early(&mut self, early: Vec<u8>) {
        if early.is_empty() {
            return;
        }
        let mut b = BytesMut::with_capacity(early.len() + self.rbuf.len());
        b.extend_from_slice(&early);
        b.extend_from_slice(&self.rbuf);
        self.rbuf = b;
        self.rbuf_pooled = false;
        self.plain = (0, early.len());
        self.record_end = early.len();
    }

    /// Moves to the next sending key after `n` records (tests use a small
    /// `n` to see the KeyUpdate a long link sends).
    pub fn set_key_refresh_after(&mut self, n: u64) {
        self.refresh_at = self.tx.seq() + n;
    }

    /// Heap bytes held between reads and writes (0 when idle).
    pub fn held(&self) -> usize {
        self.rbuf.capacity() + self.wbuf.capacity()
    }

    /// Seals one record of inner content type `typ` with `content` (at most
    /// 2^14 bytes), whatever it holds: an empty application_data record, an
    /// alert, a handshake message. Nothing a user of the stream needs: tests
    /// and benches play a hostile peer with it (`benches/flood_latency.rs`).
    /// Flush to send it.
    pub fn seal_record(&mut self, typ: u8, content: &[u8]) -> io::Result<()> {
        if content.len() > MAX_PLAINTEXT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a record's content is at most 2^14 bytes",
            ));
        }
        self.seal(typ, &[content])
    }

    /// Sends a KeyUpdate (asking for the peer's, or not); see
    /// [`Self::seal_record`] for whom it is for. Flush to send it.
    pub fn seal_key_update(&mut self, update_requested: bool) -> io::Result<()> {
        self.send_key_update(update_requested)
    }

    /// Appends one record of content type `typ` with content `parts` (at
    /// most [`MAX_PLAINTEXT`] bytes in all) to the output, sealed; moves to
    /// the next key when this one sealed its share.
    pub(super) fn seal(&mut self, typ: u8, parts: &[&[u8]]) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(len <= MAX_PLAINTEXT);
        if self.wbuf.capacity() == 0 {
            self.wbuf = take(&WRITE_BUF, WRITE_BATCH + 8 * (HEADER_LEN + 1 + TAG_LEN));
        }
        self.wbuf.reserve(HEADER_LEN + len + 1 + TAG_LEN);
        let start = self.wbuf.len();
        self.wbuf.put_bytes(0, HEADER_LEN);
        for p in parts {
            self.wbuf.extend_from_slice(p);
        }
        self.wbuf.put_u8(typ);
        self.tx.seal(&mut self.wbuf, start);
        if self.tx.seq() >= self.refresh_at {
            self.send_key_update(false)?;
        }
        Ok(())
    }

    /// Sends a KeyUpdate sealed with the current key, then moves to the
    /// next one (RFC 8446 section 4.6.3).
    pub(super) fn send_key_update(&mut self, update_requested: bool) -> io::Result<()> {
        let msg = rec::key_update(update_requested);
        let start = self.wbuf.len();
        self.wbuf.reserve(HEADER_LEN + msg.len() + 1 + TAG_LEN);
        self.wbuf.put_bytes(0, HEADER_LEN);
        self.wbuf.extend_from_slice(&msg);
        self.wbuf.put_u8(rec::HANDSHAKE);
        self.tx.seal(&mut self.wbuf, start);
        self.tx = self.kernel.update(true)?;
        let limit = self.kernel.confidentiality_limit();
        self.refresh_at = limit.saturating_sub(limit / 8);
        tracing::debug!("TLS KeyUpdate sent: sealing with the next traffic key");
        Ok(())
    }

    fn fail(&mut self, e: RecordError) -> io::Error {
        if let Some(code) = e.alert() {
            // Best effort: the alert goes with the next write attempt.
            if !self.fatal_sent && !self.close_sent {
                let _ = self.seal(rec::ALERT, &[&rec::alert_message(code)]);
            }
            self.fatal_sent = true;
        }
        let msg = format!("TLS record layer: {e}");
        let kind = io::ErrorKind::InvalidData;
        self.read_end = Some(ReadEnd::Failed(kind, msg.clone()));
        io::Error::new(kind, msg)
    }
}

impl<T: AsyncWrite + Unpin> RecordStream<T> {
    /// Writes sealed output until none is left.
    pub(super) fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.wbuf.is_empty() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.wbuf.advance(n);
        }
        self.key_update_owed = false;
        if self.wbuf.capacity() > 0 {
            give(&WRITE_BUF, std::mem::take(&mut self.wbuf));
        }
        Poll::Ready(Ok(()))
    }

    fn write_slices(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.close_sent {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS stream written after close_notify",
            )));
        }
        if self.fatal_sent {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS stream written after a fatal alert",
            )));
        }
        // Output waiting for the socket first: that is the backpressure.
        ready!(self.poll_drain(cx))?;
        let mut taken = 0;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(8);
        let mut record_len = 0;
        'slices: for b in bufs {
            let mut b: &[u8] = b;
            while !b.is_empty() {
                if taken + record_len >= WRITE_BATCH {
                    break 'slices;
                }
                let room = (MAX_PLAINTEXT - record_len).min(WRITE_BATCH - taken - record_len);
                let n = room.min(b.len());
                parts.push(&b[..n]);
                record_len += n;
                b = &b[n..];
                if record_len == MAX_PLAINTEXT {
                    self.seal(rec::APPLICATION_DATA, &parts)?;
                    parts.clear();
                    taken += record_len;
                    record_len = 0;
                }
            }
        }
        if record_len > 0 {
            self.seal(rec::APPLICATION_DATA, &parts)?;
            taken += record_len;
        }
        // Try to send now; what the socket does not take waits for the
        // next write or flush.
        if let Poll::Ready(Err(e)) = self.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> RecordStream<T> {
    /// Opens the record at the front of `rbuf` (`len` bytes) and acts on
    /// it; `Ok(true)` when it holds data now in `plain`.
    fn open_front(&mut self, len: usize) -> Result<bool, RecordError> {
        let inner = self.rx.open(&mut self.rbuf[..len])?;
        let (typ, clen) = rec::inner_content(&self.rbuf[HEADER_LEN..HEADER_LEN + inner])?;
        let content = &self.rbuf[HEADER_LEN..HEADER_LEN + clen];
        match self.receiver.record(typ, content)? {
            Inbound::Data => {
                self.plain = (HEADER_LEN, HEADER_LEN + clen);
                self.record_end = len;
                return Ok(true);
            }
            Inbound::Close => self.read_end = Some(ReadEnd::Closed),
            Inbound::Nothing => {}
            Inbound::Messages(msgs) => {
                for m in msgs {
                    if let Err(e) = self.post_handshake(m) {
                        self.read_end = Some(ReadEnd::Failed(e.kind(), e.to_string()));
                    }
                }
            }
        }
        self.rbuf.advance(len);
        Ok(false)
    }

    fn post_handshake(&mut self, m: Message) -> io::Result<()> {
        match m {
            Message::KeyUpdate { update_requested } => {
                self.rx = self.kernel.update(false)?;
                tracing::debug!(update_requested, "TLS KeyUpdate received");
                if update_requested && !self.close_sent && !self.key_update_owed {
                    self.send_key_update(false)?;
                    self.key_update_owed = true;
                }
            }
            Message::NewSessionTicket(body) => self.kernel.ticket(&body)?,
        }
        Ok(())
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for RecordStream<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = out.filled().len();
        let mut opened = 0;
        loop {
            // Content opened and not read yet.
            if this.plain.0 < this.plain.1 {
                let n = (this.plain.1 - this.plain.0).min(out.remaining());
                out.put_slice(&this.rbuf[this.plain.0..this.plain.0 + n]);
                this.plain.0 += n;
                if this.plain.0 < this.plain.1 {
                    return Poll::Ready(Ok(()));
                }
            }
            if this.record_end > 0 {
                this.rbuf.advance(this.record_end);
                this.record_end = 0;
                this.plain = (0, 0);
            }
            if this.read_end.is_some() {
                this.keep_or_give_back();
            }
            match &this.read_end {
                Some(ReadEnd::Closed) => return Poll::Ready(Ok(())),
                Some(ReadEnd::Failed(kind, msg)) => {
                    if out.filled().len() > before {
                        return Poll::Ready(Ok(()));
                    }
                    return Poll::Ready(Err(io::Error::new(*kind, msg.clone())));
                }
                None => {}
            }
            // A KeyUpdate answered, an alert: sent along with reads too.
            if !this.wbuf.is_empty() {
                if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
                    return Poll::Ready(Err(e));
                }
            }
            match rec::complete_record(&this.rbuf) {
                Ok(Some(len)) => {
                    if opened == RECORDS_PER_POLL && out.filled().len() == before {
                        crate::runtime::wake_behind_others(cx.waker());
                        return Poll::Pending;
                    }
                    opened += 1;
                    if let Err(e) = this.open_front(len) {
                        let e = this.fail(e);
                        let _ = this.poll_drain(cx);
                        if out.filled().len() > before {
                            return Poll::Ready(Ok(()));
                        }
                        return Poll::Ready(Err(e));
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    let e = this.fail(e);
                    let _ = this.poll_drain(cx);
                    if out.filled().len() > before {
                        return Poll::Ready(Ok(()));
                    }
                    return Poll::Ready(Err(e));
                }
            }
            if out.filled().len() > before || out.remaining() == 0 {
                this.keep_or_give_back();
                return Poll::Ready(Ok(()));
            }
            // Need bytes: read into the thread's buffer after what is held.
            if this.rbuf.capacity() - this.rbuf.len() < MAX_RECORD {
                if this.rbuf_pooled {
                    // Moves a cut record to the front when it is small.
                    this.rbuf.reserve(MAX_RECORD);
                } else {
                    let mut b = take(&READ_BUF, READ_SIZE);
                    b.extend_from_slice(&this.rbuf);
                    this.rbuf = b;
                    this.rbuf_pooled = true;
                }
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.io), cx, &mut this.rbuf) {
                Poll::Ready(Ok(0)) => {
                    let e = if this.rbuf.is_empty() {
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "peer closed the connection without sending a TLS close_notify alert",
                        )
                    } else {
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "peer closed the connection in the middle of a TLS record",
                        )
                    };
                    this.read_end = Some(ReadEnd::Failed(e.kind(), e.to_string()));
                    this.keep_or_give_back();
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.keep_or_give_back();
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => {
                    this.keep_or_give_back();
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<T> RecordStream<T> {
    /// Between reads: the thread's buffer goes back, a small cut record
    /// is copied out of it.
    fn keep_or_give_back(&mut self) {
        if self.plain.0 < self.plain.1 || !self.rbuf_pooled {
            return;
        }
        if self.rbuf.is_empty() {
            give(&READ_BUF, std::mem::take(&mut self.rbuf));
            self.rbuf_pooled = false;
        } else if self.rbuf.len() <= SMALL_REST && self.record_end == 0 {
            let small = BytesMut::from(&self.rbuf[..]);
            give(&READ_BUF, std::mem::replace(&mut self.rbuf, small));
            self.rbuf_pooled = false;
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RecordStream<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_slices(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_slices(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent && !this.fatal_sent {
            ready!(this.poll_drain(cx))?;
            this.seal(rec::ALERT, &[&rec::alert_message(rec::CLOSE_NOTIFY)])?;
            this.close_sent = true;
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
