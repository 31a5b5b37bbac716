//! A read-ahead layer under rustls. rustls pulls TLS bytes from its socket
//! in reads of about 4 KiB, so a bulk transfer costs one read system call
//! (and one readiness round trip) per 4 KiB. `ReadAhead` reads up to
//! `capacity` bytes per call and hands rustls its small reads from memory:
//! one extra in-cache copy instead of dozens of system calls per MiB.
//! Writes pass straight through.
//!
//! [`ReadAhead`] owns its buffer (256 KiB for as long as the connection
//! lives); [`SharedReadAhead`] borrows one buffer per thread for each read
//! and keeps only what rustls did not take yet, so an idle connection
//! holds no buffer (the server's agent links: thousands of them idle).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

pub const DEFAULT_CAPACITY: usize = 256 * 1024;

/// The thread's buffer of [`SharedReadAhead`]: one read's room.
const SHARED_CAPACITY: usize = 64 * 1024;
/// Unread bytes up to this many are copied out of the thread's buffer
/// when a read ends; more keep the buffer (the thread takes a new one)
/// until they are read.
const SMALL_REST: usize = 4 * 1024;

fn take_shared() -> BytesMut {
    crate::thread_buf::take(
        &crate::thread_buf::READ_AHEAD,
        SHARED_CAPACITY,
        SHARED_CAPACITY,
    )
}

fn give_shared(b: BytesMut) {
    crate::thread_buf::give(&crate::thread_buf::READ_AHEAD, b);
}

/// A read-ahead layer that holds no buffer between reads (see the module
/// documentation): each read from the socket goes into the thread's
/// buffer, the caller takes what it asked for, and the rest stays here
/// until it is read (a few bytes copied out, more with the buffer).
pub struct SharedReadAhead<T> {
    inner: T,
    /// Read and not yet taken (empty, no allocation, most of the time).
    rest: BytesMut,
}

impl<T> SharedReadAhead<T> {
    pub fn new(inner: T) -> Self {
        SharedReadAhead {
            inner,
            rest: BytesMut::new(),
        }
    }

    /// With `rest` already read from `inner` (a ClientHello looked at),
    /// served first.
    pub fn with_rest(inner: T, rest: BytesMut) -> Self {
        SharedReadAhead { inner, rest }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Heap bytes held between reads (0 once everything read was taken).
    pub fn held(&self) -> usize {
        self.rest.capacity()
    }

    /// Hands out what is kept; the buffer goes back once empty.
    fn serve_rest(&mut self, out: &mut ReadBuf<'_>) {
        let n = self.rest.len().min(out.remaining());
        out.put_slice(&self.rest[..n]);
        self.rest.advance(n);
        if self.rest.is_empty() {
            give_shared(std::mem::take(&mut self.rest));
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SharedReadAhead<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.rest.is_empty() {
            this.serve_rest(out);
            return Poll::Ready(Ok(()));
        }
        // A caller asking for at least a buffer's worth reads directly.
        if out.remaining() >= SHARED_CAPACITY {
            return Pin::new(&mut this.inner).poll_read(cx, out);
        }
        let mut buf = take_shared();
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut buf);
        match read {
            Poll::Ready(Ok(n)) if n > 0 => {
                let k = n.min(out.remaining());
                out.put_slice(&buf[..k]);
                buf.advance(k);
                if buf.is_empty() {
                    give_shared(buf);
                } else if buf.len() <= SMALL_REST {
                    this.rest = BytesMut::from(&buf[..]);
                    give_shared(buf);
                } else {
                    this.rest = buf;
                }
                Poll::Ready(Ok(()))
            }
            other => {
                give_shared(buf);
                other.map_ok(|_| ())
            }
        }
    }
}

super::forward_async_write!(SharedReadAhead);

pub struct ReadAhead<T> {
    inner: T,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<T> ReadAhead<T> {
    pub fn new(inner: T) -> Self {
        Self::with_capacity(inner, DEFAULT_CAPACITY)
    }

    pub fn with_capacity(inner: T, capacity: usize) -> Self {
        ReadAhead {
            inner,
            buf: vec![0u8; capacity.max(1)].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The inner stream and any bytes read ahead but not yet consumed.
    pub fn into_parts(self) -> (T, Vec<u8>) {
        let rest = self.buf[self.start..self.end].to_vec();
        (self.inner, rest)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.start == this.end {
            // A caller asking for at least our capacity reads directly.
            if out.remaining() >= this.buf.len() {
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            let mut rb = ReadBuf::new(&mut this.buf);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    this.start = 0;
                    this.end = rb.filled().len();
                    if this.end == 0 {
                        return Poll::Ready(Ok(()));
                    }
                }
                other => return other,
            }
        }
        let n = (this.end - this.start).min(out.remaining());
        out.put_slice(&this.buf[this.start..this.start + n]);
        this.start += n;
        Poll::Ready(Ok(()))
    }
}

super::forward_async_write!(ReadAhead);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    /// Writes 300,000 patterned bytes through `wrap`'s reader, read in
    /// chunks of `sizes` (cycled), checks every byte arrived in order and
    /// hands the reader to `after` once it saw the end.
    fn read_through<R: AsyncRead + Unpin>(
        wrap: impl FnOnce(DuplexStream) -> R,
        sizes: &[usize],
        after: impl FnOnce(&R),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            let (a, mut b) = tokio::io::duplex(1 << 20);
            let expected = data.clone();
            let writer = async move {
                b.write_all(&data).await.unwrap();
                drop(b);
            };
            let reader = async move {
                let mut r = wrap(a);
                let mut got = Vec::new();
                for k in 0.. {
                    let mut buf = vec![0u8; sizes[k % sizes.len()]];
                    let n = r.read(&mut buf).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                after(&r);
                assert!(got == expected);
            };
            tokio::join!(writer, reader);
        });
    }

    #[test]
    fn small_reads_are_served_from_one_big_read() {
        read_through(|a| ReadAhead::with_capacity(a, 64 * 1024), &[4096], |_| {});
    }

    /// Small reads through the shared buffer get every byte in order, and
    /// nothing is held once the reader caught up.
    #[test]
    fn the_shared_buffer_serves_small_reads_and_is_given_back() {
        // Sizes that leave small and large rests behind.
        read_through(
            SharedReadAhead::new,
            &[4096, 100, 16_000, 7, 65_536 + 10],
            |r| assert_eq!(r.held(), 0),
        );
    }
}
