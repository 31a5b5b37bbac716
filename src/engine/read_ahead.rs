//! A read-ahead layer under rustls. rustls pulls TLS bytes from its socket
//! in reads of about 4 KiB, so a bulk transfer costs one read system call
//! (and one readiness round trip) per 4 KiB. `ReadAhead` reads up to
//! `capacity` bytes per call and hands rustls its small reads from memory:
//! one extra in-cache copy instead of dozens of system calls per MiB.
//! Writes pass straight through.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

pub const DEFAULT_CAPACITY: usize = 256 * 1024;

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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn small_reads_are_served_from_one_big_read() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
            let (a, mut b) = tokio::io::duplex(1 << 20);
            let expected = data.clone();
            let writer = async move {
                b.write_all(&data).await.unwrap();
                drop(b);
            };
            let reader = async move {
                let mut r = ReadAhead::with_capacity(a, 64 * 1024);
                let mut got = Vec::new();
                let mut small = [0u8; 4096];
                loop {
                    let n = r.read(&mut small).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&small[..n]);
                }
                assert!(got == expected);
            };
            tokio::join!(writer, reader);
        });
    }
}
