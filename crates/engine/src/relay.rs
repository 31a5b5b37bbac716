//! Socket side of a tunneled connection: reading a socket into `Bytes`
//! chunks and writing `Bytes` back, with ownership-passing (io_uring) I/O.
//! Chunks are carved out of one large buffer, so a read allocates only when
//! the buffer runs low, and the chunk travels on as the DATA payload as is.
//!
//! A bulk connection keeps a read (and its buffer) in the kernel; an idle or
//! chatty one waits for readability first and takes a buffer only once
//! bytes are there, so an idle tunnel holds no read buffer at all.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, OnceLock};

use bytes::{Buf, Bytes, BytesMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

use super::budget::Credit;
use super::window::ConnWindow;

/// Largest buffer reads are carved from.
const READ_BUFFER: usize = 256 * 1024;
/// Largest single read (and so the largest DATA payload we send).
const MAX_CHUNK: usize = 64 * 1024;
/// Smallest read.
const MIN_CHUNK: usize = 4 * 1024;
/// From this read size on a connection counts as bulk: its reads are
/// handed to the kernel with their buffer. Below it, reads wait for
/// readability without a buffer.
const LEND_FROM: usize = 16 * 1024;

/// How much the next read asks for: it doubles while reads fill it (a bulk
/// transfer reaches [`MAX_CHUNK`] within a few reads) and halves when reads
/// return less than a quarter of it, so an idle or chatty connection's
/// pending read holds a small buffer (with io_uring the buffer belongs to
/// the kernel for as long as the read waits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadWindow(usize);

impl Default for ReadWindow {
    fn default() -> Self {
        Self(MIN_CHUNK)
    }
}

impl ReadWindow {
    pub fn size(self) -> usize {
        self.0
    }

    /// Size of the allocation reads are carved from: several large reads
    /// share one, a small read has its own.
    pub fn block(self) -> usize {
        if self.0 >= 16 * 1024 {
            (self.0 * 4).min(READ_BUFFER)
        } else {
            self.0
        }
    }

    /// Whether the next read is handed to the kernel with its buffer (a bulk
    /// transfer: the buffer fills soon) rather than waiting for readability
    /// with none (an idle or chatty connection).
    pub fn lends_buffer(self) -> bool {
        self.0 >= LEND_FROM
    }

    /// Adapts to a read that returned `n` bytes.
    pub fn after_read(&mut self, n: usize) {
        if n >= self.0 {
            self.0 = (self.0 * 2).min(MAX_CHUNK);
        } else if n < self.0 / 4 {
            self.0 = (self.0 / 2).max(MIN_CHUNK);
        }
    }
}

/// A socket whose readability can be awaited without lending a buffer.
pub trait Readable {
    /// Waits until the socket has bytes (or an end) to read.
    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>>;
    /// The descriptor to read from directly once readable.
    fn read_fd(&self) -> RawFd;
}

macro_rules! readable_stream {
    ($t:ty) => {
        impl Readable for $t {
            async fn readable(&self) -> io::Result<()> {
                // Not relaxed: the epoll driver then checks real readiness,
                // as our own reads do not update its readiness state.
                <$t>::readable(self, false).await
            }
            fn read_fd(&self) -> RawFd {
                self.as_raw_fd()
            }
        }

        impl Readable for monoio::io::OwnedReadHalf<$t> {
            async fn readable(&self) -> io::Result<()> {
                <$t>::readable(super::sys::split_stream(self), false).await
            }
            fn read_fd(&self) -> RawFd {
                super::sys::split_stream(self).as_raw_fd()
            }
        }
    };
}
readable_stream!(monoio::net::TcpStream);
readable_stream!(monoio::net::UnixStream);

/// Whether chatty reads wait for readability before taking a buffer (the
/// default). `EDGETUNNEL_IDLE_READ=buffered` lends every read its buffer,
/// as before, for comparisons.
fn reads_wait_for_readiness() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("EDGETUNNEL_IDLE_READ").as_deref() != Ok("buffered"))
}

/// Reads a socket into `Bytes` chunks.
pub struct ChunkReader<R> {
    inner: R,
    buf: BytesMut,
    window: ReadWindow,
    /// The last read drained the socket (it returned less than asked): the
    /// next one waits for readability before reading.
    drained: bool,
    /// The peer's flow-control window for what is read, if negotiated.
    flow: Option<Arc<ConnWindow>>,
}

impl<R: AsyncReadRent + Readable> ChunkReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: BytesMut::new(),
            window: ReadWindow::default(),
            drained: false,
            flow: None,
        }
    }

    /// Reads only while the peer's window has room, and charges every chunk
    /// to it (see [`crate::window`]).
    pub fn with_flow_control(mut self, flow: Option<Arc<ConnWindow>>) -> Self {
        self.flow = flow;
        self
    }

    /// The next chunk, `None` at end of stream.
    pub async fn next(&mut self) -> io::Result<Option<Bytes>> {
        if let Some(flow) = &self.flow {
            flow.ready().await;
        }
        let chunk = if self.window.lends_buffer() || !reads_wait_for_readiness() {
            self.read_lent().await?
        } else {
            self.read_when_readable().await?
        };
        let Some(chunk) = chunk else {
            return Ok(None);
        };
        let n = chunk.len();
        self.drained = n < self.window.size();
        self.window.after_read(n);
        if let Some(flow) = &self.flow {
            flow.sent(n);
        }
        Ok(Some(chunk))
    }

    /// A read handed to the kernel with its buffer.
    async fn read_lent(&mut self) -> io::Result<Option<Bytes>> {
        let want = self.window.size();
        if self.buf.capacity() < want {
            self.buf = BytesMut::with_capacity(self.window.block());
        }
        // Read into the first `want` bytes of the buffer; keep the rest.
        let rest = self.buf.split_off(want);
        let window = std::mem::replace(&mut self.buf, rest);
        let (res, mut window) = self.inner.read(window).await;
        let n = res?;
        if n == 0 {
            return Ok(None);
        }
        window.truncate(n);
        Ok(Some(window.freeze()))
    }

    /// Waits for readability holding no buffer, then reads what is there.
    async fn read_when_readable(&mut self) -> io::Result<Option<Bytes>> {
        // The rest of a bulk block is not kept through an idle wait.
        self.buf = BytesMut::new();
        let want = self.window.size();
        loop {
            if !self.drained {
                if let Some(read) = try_read(self.inner.read_fd(), want)? {
                    return Ok(read);
                }
            }
            self.inner.readable().await?;
            self.drained = false;
        }
    }
}

/// One non-blocking read of up to `want` bytes into a new buffer: `None`
/// when nothing is there yet, `Some(None)` at end of stream.
fn try_read(fd: RawFd, want: usize) -> io::Result<Option<Option<Bytes>>> {
    let mut buf = BytesMut::with_capacity(want);
    loop {
        match super::sys::recv_dontwait(fd, &mut buf, want) {
            Ok(0) => return Ok(Some(None)),
            Ok(_) => return Ok(Some(Some(buf.freeze()))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

impl<R> ChunkReader<R> {
    pub fn into_inner(self) -> R {
        self.inner
    }
}

pub use super::sys::BytesVec;

/// Most chunks gathered into one vectored write.
pub const MAX_BATCH: usize = 64;

/// Writes chunks fully, several per system call.
pub async fn write_chunks<W: AsyncWriteRent>(w: &mut W, chunks: Vec<Bytes>) -> io::Result<()> {
    if chunks.len() == 1 {
        let only = chunks.into_iter().next().expect("one chunk");
        return write_chunk(w, only).await;
    }
    // (monoio's `write_vectored_all` mishandles a write that ends inside an
    // iovec, so partial writes are advanced here, by slicing, not copying.)
    let mut chunks = chunks;
    while !chunks.is_empty() {
        let (res, buf) = w.writev(BytesVec::new(chunks)).await;
        let mut n = res?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        chunks = buf.into_chunks();
        let mut done = 0;
        for c in chunks.iter_mut() {
            if n >= c.len() {
                n -= c.len();
                done += 1;
            } else {
                c.advance(n);
                break;
            }
        }
        chunks.drain(..done);
    }
    Ok(())
}

/// Takes the chunks already queued behind `first` (up to [`MAX_BATCH`]):
/// `data` picks the payload out of an event; the first event that is not
/// payload is returned to be handled after the write.
pub fn gather<E, T>(
    first: T,
    mut try_next: impl FnMut() -> Option<E>,
    data: impl Fn(E) -> Result<T, E>,
) -> (Vec<T>, Option<E>) {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match try_next() {
            None => break,
            Some(ev) => match data(ev) {
                Ok(t) => batch.push(t),
                Err(other) => return (batch, Some(other)),
            },
        }
    }
    (batch, None)
}

/// The receive half of a tunneled connection, one step: `first` and the
/// payload already queued behind it (see [`gather`]) go to the socket in one
/// vectored write, and their credits (budget, flow-control window, see
/// [`crate::budget`]) are returned once the bytes are written.
/// `moved` counts the writes (for [`linger`]). `Ok` holds the first queued
/// event that was not payload, to handle next.
///
/// The write is boxed: it lives only while bytes move, and inline every
/// tunnel's task would reserve room for it (about 550 bytes) even idle.
pub fn write_queued<'a, E: 'a, W: AsyncWriteRent + 'a>(
    wr: &'a mut W,
    first: Credit,
    try_next: impl FnMut() -> Option<E>,
    data: impl Fn(E) -> Result<Credit, E>,
    moved: &std::cell::Cell<u32>,
) -> std::pin::Pin<Box<impl std::future::Future<Output = io::Result<Option<E>>> + 'a>> {
    let (credits, next) = gather(first, try_next, data);
    moved.set(moved.get().wrapping_add(1));
    Box::pin(async move {
        let chunks = credits.iter().map(|c| c.bytes().clone()).collect();
        write_chunks(wr, chunks).await?;
        drop(credits);
        Ok(next)
    })
}

/// Writes every chunk fully.
pub async fn write_chunk<W: AsyncWriteRent>(w: &mut W, chunk: Bytes) -> io::Result<()> {
    let (res, _) = w.write_all(chunk).await;
    res.map(|_| ())
}

/// A socket being moved between cores: the descriptor and its kind.
/// Dropped before it is adopted, it closes the descriptor.
#[derive(Debug)]
pub enum MovedSocket {
    Tcp(OwnedFd),
    Unix(OwnedFd),
}

impl MovedSocket {
    pub fn from_tcp(s: monoio::net::TcpStream) -> Self {
        MovedSocket::Tcp(super::sys::into_owned(s))
    }

    pub fn from_unix(s: monoio::net::UnixStream) -> Self {
        MovedSocket::Unix(super::sys::into_owned(s))
    }
}

/// A socket adopted by the current core's runtime.
pub enum LocalSocket {
    Tcp(monoio::net::TcpStream),
    Unix(monoio::net::UnixStream),
}

impl MovedSocket {
    /// Registers the descriptor with the current runtime.
    pub fn adopt(self) -> io::Result<LocalSocket> {
        Ok(match self {
            MovedSocket::Tcp(fd) => LocalSocket::Tcp(monoio::net::TcpStream::from_std(fd.into())?),
            MovedSocket::Unix(fd) => {
                LocalSocket::Unix(monoio::net::UnixStream::from_std(fd.into())?)
            }
        })
    }
}

/// A socket the relay can split into owned read and write halves.
pub trait Duplex:
    AsyncReadRent
    + AsyncWriteRent
    + Readable
    + monoio::io::Splitable<OwnedRead: AsyncReadRent + Readable, OwnedWrite: AsyncWriteRent>
    + std::os::fd::AsRawFd
    + 'static
{
}

impl<T> Duplex for T where
    T: AsyncReadRent
        + AsyncWriteRent
        + Readable
        + monoio::io::Splitable<OwnedRead: AsyncReadRent + Readable, OwnedWrite: AsyncWriteRent>
        + std::os::fd::AsRawFd
        + 'static
{
}

/// Runs `rest` (what remains of a half-closed tunnel: the other direction
/// until it finishes) as long as it does not stay idle for `linger`: while
/// `moved` (bumped on every chunk the remaining direction moves; it wraps,
/// and is only compared for a change) changes the tunnel lives on. `None`
/// if the linger ran out.
pub async fn linger<F: std::future::Future>(
    linger: std::time::Duration,
    moved: &std::cell::Cell<u32>,
    rest: F,
) -> Option<F::Output> {
    let mut rest = std::pin::pin!(rest);
    loop {
        let before = moved.get();
        // The timer is boxed: a monoio `Sleep` is 640 bytes, and every
        // tunnel's task would otherwise reserve room for it (a task's
        // allocation is its largest state) though few ever linger.
        match Box::pin(monoio::time::timeout(linger, rest.as_mut())).await {
            Ok(out) => return Some(out),
            Err(_) if moved.get() == before => return None,
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{block_on, Driver};

    #[test]
    fn read_window_grows_for_bulk_and_shrinks_when_idle() {
        let mut w = ReadWindow::default();
        assert_eq!((w.size(), w.block()), (MIN_CHUNK, MIN_CHUNK));
        // Full reads double it up to the largest chunk, in a few steps.
        let mut steps = 0;
        while w.size() < MAX_CHUNK {
            w.after_read(w.size());
            steps += 1;
        }
        assert_eq!(steps, 4);
        w.after_read(MAX_CHUNK);
        assert_eq!((w.size(), w.block()), (MAX_CHUNK, READ_BUFFER));
        // Middling reads keep it; tiny ones shrink it back to the minimum.
        w.after_read(MAX_CHUNK / 2);
        assert_eq!(w.size(), MAX_CHUNK);
        for _ in 0..10 {
            w.after_read(100);
        }
        assert_eq!((w.size(), w.block()), (MIN_CHUNK, MIN_CHUNK));
    }

    #[test]
    fn only_bulk_reads_lend_their_buffer() {
        let mut w = ReadWindow::default();
        assert!(!w.lends_buffer(), "a new connection waits for readability");
        w.after_read(MIN_CHUNK);
        assert!(!w.lends_buffer());
        w.after_read(w.size());
        assert!(w.lends_buffer(), "full reads make it a bulk connection");
        for _ in 0..10 {
            w.after_read(1);
        }
        assert!(!w.lends_buffer(), "a connection gone quiet lends nothing");
    }

    /// A connected pair of non-blocking unix sockets on the current runtime.
    fn socket_pair() -> (monoio::net::UnixStream, monoio::net::UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (
            monoio::net::UnixStream::from_std(a).unwrap(),
            monoio::net::UnixStream::from_std(b).unwrap(),
        )
    }

    /// Chatty, idle and bulk phases on one connection, across the switch
    /// between reads that wait for readability and reads lent a buffer:
    /// every byte arrives once, in order, then the end of stream.
    #[test]
    fn reads_switch_between_readiness_and_lent_buffers_without_loss() {
        for driver in [Driver::Auto, Driver::Legacy] {
            block_on(driver, async {
                let (mut a, b) = socket_pair();
                let phases: Vec<Vec<u8>> = vec![
                    b"hello".to_vec(),
                    vec![1; 3000],
                    (0..2_000_000u32).map(|i| (i % 251) as u8).collect(),
                    b"quiet again".to_vec(),
                    vec![7; 100_000],
                    b"!".to_vec(),
                ];
                let expected: Vec<u8> = phases.concat();
                let reader = monoio::spawn(async move {
                    let mut r = ChunkReader::new(b);
                    let mut got = Vec::new();
                    while let Some(c) = r.next().await.unwrap() {
                        got.extend_from_slice(&c);
                    }
                    got
                });
                for p in phases {
                    // The reader waits (idle) between phases.
                    monoio::time::sleep(std::time::Duration::from_millis(5)).await;
                    let (res, _) = a.write_all(p).await;
                    res.unwrap();
                }
                drop(a);
                assert!(reader.await == expected);
            })
            .unwrap();
        }
    }

    /// Vectored writes larger than the socket buffer end in partial writes
    /// inside an iovec; every byte must still arrive once, in order.
    #[test]
    fn vectored_writes_survive_partial_writes() {
        for driver in [Driver::Auto, Driver::Legacy] {
            block_on(driver, async {
                let (mut a, b) = socket_pair();
                let chunks: Vec<Bytes> = (0..MAX_BATCH)
                    .map(|i| Bytes::from(vec![i as u8; 100_003 + i]))
                    .collect();
                let expected: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
                let total = expected.len();
                let reader = monoio::spawn(async move {
                    let mut r = ChunkReader::new(b);
                    let mut got = Vec::new();
                    while got.len() < total {
                        match r.next().await.unwrap() {
                            Some(c) => got.extend_from_slice(&c),
                            None => break,
                        }
                    }
                    got
                });
                write_chunks(&mut a, chunks).await.unwrap();
                assert!(reader.await == expected);
            })
            .unwrap();
        }
    }
}
