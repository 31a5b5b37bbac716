//! Copying into a TLS stream (tokio-rustls) so that nothing stays behind in
//! its session: a write returns once rustls has the bytes, which may be
//! before they reach the socket (it was full), and only a later write, a
//! flush or a shutdown sends them. A copy that then waits for more input
//! that never comes (a kubelet keeps its connection open after an answer)
//! leaves the caller short of the tail for good (issue F1). Here the
//! writer is flushed whenever the input has nothing to give, and only
//! then: bulk transfers keep writes going without a flush per chunk.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

/// How a [`copy`] ended.
#[derive(Debug)]
pub enum CopyEnd {
    /// The input ended (EOF): everything read was written; the last bytes
    /// may still be in the writer's session (its shutdown sends them).
    Eof,
    /// Reading failed.
    Read(io::Error),
    /// Writing or flushing failed.
    Write(io::Error),
}

/// Reads from `r` into `buf`; while `r` has nothing to give, flushes `w`
/// if `dirty` (bytes written and not flushed since), and clears `dirty`
/// when the flush completes. `Ok(0)` is EOF.
pub async fn read_flushing<R, W>(
    r: &mut R,
    w: &mut W,
    buf: &mut [u8],
    dirty: &mut bool,
) -> Result<usize, CopyEnd>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    poll_fn(|cx| {
        let mut rb = ReadBuf::new(buf);
        if let Poll::Ready(res) = Pin::new(&mut *r).poll_read(cx, &mut rb) {
            return Poll::Ready(match res {
                Ok(()) => Ok(rb.filled().len()),
                Err(e) => Err(CopyEnd::Read(e)),
            });
        }
        // No input now: send what the writer holds before waiting. A
        // pending flush (the socket is full) has registered the wakeup for
        // when it can go on; the read's wakeup is registered too.
        if *dirty {
            match Pin::new(&mut *w).poll_flush(cx) {
                Poll::Ready(Ok(())) => *dirty = false,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(CopyEnd::Write(e))),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    })
    .await
}

/// Copies `r` into `w` until EOF or an error, through `buf`, flushing `w`
/// whenever `r` would block (see the module documentation).
pub async fn copy<R, W>(r: &mut R, w: &mut W, buf: &mut [u8]) -> CopyEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut dirty = false;
    loop {
        let n = match read_flushing(r, w, buf, &mut dirty).await {
            Ok(0) => return CopyEnd::Eof,
            Ok(n) => n,
            Err(end) => return end,
        };
        if let Err(e) = w.write_all(&buf[..n]).await {
            return CopyEnd::Write(e);
        }
        dirty = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Waker};

    /// A writer like a TLS stream over a full socket: it takes every
    /// write into its buffer and moves the buffer to `wire` only on flush.
    #[derive(Clone, Default)]
    struct Session {
        held: Arc<Mutex<Vec<u8>>>,
        wire: Arc<Mutex<Vec<u8>>>,
        flushes: Arc<Mutex<usize>>,
    }

    impl AsyncWrite for Session {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.held.lock().unwrap().extend_from_slice(b);
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            let mut held = self.held.lock().unwrap();
            self.wire.lock().unwrap().append(&mut held);
            *self.flushes.lock().unwrap() += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.poll_flush(cx)
        }
    }

    /// Input that gives `chunks` one per read, then has nothing (pending,
    /// as a kept-open connection) forever.
    struct Input(Vec<Vec<u8>>);

    impl AsyncRead for Input {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if self.0.is_empty() {
                return Poll::Pending;
            }
            let c = self.0.remove(0);
            buf.put_slice(&c);
            Poll::Ready(Ok(()))
        }
    }

    /// Everything read reaches the wire once the input has nothing more,
    /// with one flush for the whole burst, not one per chunk.
    #[test]
    fn flushes_when_the_input_would_block() {
        let session = Session::default();
        let mut w = session.clone();
        let mut r = Input(vec![vec![1; 100], vec![2; 7], vec![3; 5000]]);
        let mut buf = vec![0u8; 64 * 1024];
        let mut fut = Box::pin(copy(&mut r, &mut w, &mut buf));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        drop(fut);
        assert_eq!(session.wire.lock().unwrap().len(), 5107);
        assert!(session.held.lock().unwrap().is_empty());
        assert_eq!(*session.flushes.lock().unwrap(), 1);
    }
}
