//! The byte stream the agent listener's h2 server reads (the gRPC frontend
//! runs on [`crate::engine::h2_conn`], which takes any `:authority` by
//! itself): the client's bytes
//! go through [`AuthorityFilter`] before h2 sees them, so a request whose
//! `:authority` h2 would reject (grpc-go's percent-encoded socket path, a
//! raw path, an empty value) arrives without one instead of being reset.
//! Writes pass straight through.
//!
//! Reads go straight into h2's buffer while the filter is between frames
//! or inside a pass-through frame (DATA above all): the filter then only
//! looks at the bytes in place. From the start of a header frame on, the
//! rest of that read is moved aside and fed to the filter, whose rewritten
//! frames are handed to h2 next; bytes the filter holds (a frame header cut
//! by a read, a header block) are read into a small buffer of our own.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::protocol::h2_authority::AuthorityFilter;

/// Bytes read at once while the filter holds part of a frame (header
/// blocks are usually far smaller).
const READ_CHUNK: usize = 4 * 1024;

/// Wraps a server connection's (decrypted) stream before h2 sees it.
pub fn wrap<T>(io: T) -> impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    H2ServerIo::new(io)
}

/// See the module documentation. Between header blocks it holds no
/// buffer: only the filter's HPACK table (at most 4 KiB of fields).
pub struct H2ServerIo<T> {
    inner: T,
    filter: AuthorityFilter,
    /// Input read but not yet passed or fed: `stash[start..end]`.
    stash: Vec<u8>,
    start: usize,
    end: usize,
    /// Output of the filter not yet handed on: `out[out_pos..]`.
    out: Vec<u8>,
    out_pos: usize,
    /// `:authority` values dropped and already logged.
    logged_drops: u64,
}

impl<T> H2ServerIo<T> {
    pub fn new(inner: T) -> Self {
        H2ServerIo {
            inner,
            filter: AuthorityFilter::new(),
            stash: Vec::new(),
            start: 0,
            end: 0,
            out: Vec::new(),
            out_pos: 0,
            logged_drops: 0,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Copies pending output into `buf`; whether there was any.
    fn give_output(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        if self.out_pos == self.out.len() {
            return false;
        }
        let n = (self.out.len() - self.out_pos).min(buf.remaining());
        buf.put_slice(&self.out[self.out_pos..self.out_pos + n]);
        self.out_pos += n;
        if self.out_pos == self.out.len() {
            // Header blocks are rare: hold no memory between them.
            self.out_pos = 0;
            self.out = Vec::new();
        }
        true
    }

    /// Keeps `bytes` (the tail of a read) for the filter.
    fn set_aside(&mut self, bytes: &[u8]) {
        debug_assert_eq!(self.start, self.end);
        if self.stash.len() < bytes.len() {
            self.stash.resize(bytes.len(), 0);
        }
        self.stash[..bytes.len()].copy_from_slice(bytes);
        self.start = 0;
        self.end = bytes.len();
    }

    fn stash_drained(&mut self) {
        self.start = 0;
        self.end = 0;
        if self.filter.may_pass() {
            // Between header blocks (most of a connection's life): an idle
            // connection holds no buffer of ours.
            self.stash = Vec::new();
        }
    }

    fn log_drops(&mut self) {
        let dropped = self.filter.dropped_authorities();
        if dropped > self.logged_drops {
            if self.logged_drops == 0 {
                tracing::debug!("dropped an HTTP/2 :authority that is not a valid URI authority");
            }
            self.logged_drops = dropped;
        }
    }
}

fn eof_inside_frame() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "connection closed inside an HTTP/2 frame",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for H2ServerIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.give_output(buf) {
                return Poll::Ready(Ok(()));
            }
            if this.start < this.end {
                let avail = &this.stash[this.start..this.end];
                let lim = avail.len().min(buf.remaining());
                let n = this.filter.skip(&avail[..lim]);
                if n > 0 {
                    buf.put_slice(&avail[..n]);
                    this.start += n;
                    if this.start == this.end {
                        this.stash_drained();
                    }
                    return Poll::Ready(Ok(()));
                }
                // The same bytes skip looked at: one of the two always
                // makes progress on them.
                let n = this
                    .filter
                    .feed(&avail[..lim], &mut this.out)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                this.start += n;
                if this.start == this.end {
                    this.stash_drained();
                }
                this.log_drops();
                continue;
            }
            if this.filter.may_pass() {
                // Straight into h2's buffer; anything from a header frame on
                // is moved aside.
                let before = buf.filled().len();
                ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                let got = &buf.filled()[before..];
                if got.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                let n = this.filter.skip(got);
                if n < got.len() {
                    this.set_aside(&got[n..]);
                    buf.set_filled(before + n);
                }
                if n > 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if let Some(e) = this.filter.error() {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e.clone())));
            }
            // The filter holds part of a frame: read into our own buffer.
            if this.stash.len() < READ_CHUNK {
                this.stash.resize(READ_CHUNK, 0);
            }
            let mut rb = ReadBuf::new(&mut this.stash[..]);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                return Poll::Ready(Err(eof_inside_frame()));
            }
            this.start = 0;
            this.end = n;
        }
    }
}

super::forward_async_write!(H2ServerIo);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::h2_authority::{
        encode_field, put_frame_header, FLAG_END_HEADERS, FLAG_END_STREAM, PREFACE,
        TYPE_CONTINUATION, TYPE_HEADERS,
    };
    use std::task::Waker;
    use tokio::io::AsyncWrite;

    const PERCENT: &[u8] =
        b"%2Fetc%2Fkubernetes%2Fkonnectivity-server%2Fkonnectivity-server.socket";

    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        put_frame_header(&mut v, payload.len(), ty, flags, stream);
        v.extend_from_slice(payload);
        v
    }

    fn request_block(authority: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        for (n, v) in [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/ProxyService/Proxy"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ] {
            encode_field(&mut b, n, v);
        }
        b
    }

    fn client_stream() -> Vec<u8> {
        let mut s = PREFACE.to_vec();
        s.extend(frame(0x4, 0, 0, &[]));
        s.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &request_block(PERCENT),
        ));
        s.extend(frame(0x0, 0, 1, &vec![5u8; 50_000]));
        let b = request_block(b"/tmp/x.sock");
        s.extend(frame(TYPE_HEADERS, 0, 3, &b[..7]));
        s.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &b[7..]));
        s.extend(frame(0x0, FLAG_END_STREAM, 3, &[6u8; 3000]));
        s.extend(frame(0x8, 0, 0, &[0, 0, 1, 0]));
        s
    }

    /// Hands out `data` in reads of the given sizes, `Pending` before
    /// every third one.
    struct Chunked {
        data: Vec<u8>,
        pos: usize,
        sizes: Vec<usize>,
        reads: usize,
        pending: bool,
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if self.reads % 3 == 2 && !self.pending {
                self.pending = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.pending = false;
            let size = self.sizes[self.reads % self.sizes.len()];
            self.reads += 1;
            let n = size.min(buf.remaining()).min(self.data.len() - self.pos);
            let pos = self.pos;
            buf.put_slice(&self.data[pos..pos + n]);
            self.pos += n;
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Chunked {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Everything the wrapper gives out, read with buffers of `out_sizes`.
    fn read_all(data: Vec<u8>, sizes: Vec<usize>, out_sizes: &[usize]) -> io::Result<Vec<u8>> {
        let mut io = H2ServerIo::new(Chunked {
            data,
            pos: 0,
            sizes,
            reads: 0,
            pending: false,
        });
        let mut cx = Context::from_waker(Waker::noop());
        let mut got = Vec::new();
        let mut space = vec![0u8; 70_000];
        for i in 0.. {
            assert!(i < 2_000_000, "no progress");
            let size = out_sizes[i % out_sizes.len()];
            // Some bytes already filled, as a caller's buffer may have.
            let mut rb = ReadBuf::new(&mut space[..size + 3]);
            rb.advance(3);
            match Pin::new(&mut io).poll_read(&mut cx, &mut rb) {
                Poll::Pending => continue,
                Poll::Ready(Ok(())) => {
                    let new = &rb.filled()[3..];
                    if new.is_empty() {
                        return Ok(got);
                    }
                    got.extend_from_slice(new);
                }
                Poll::Ready(Err(e)) => return Err(e),
            }
        }
        unreachable!()
    }

    #[test]
    fn output_matches_the_filter_for_any_read_sizes() {
        let input = client_stream();
        let mut want = Vec::new();
        AuthorityFilter::new().process(&input, &mut want).unwrap();
        assert_ne!(want, input);
        for sizes in [
            vec![1],
            vec![9],
            vec![4, 17, 1000],
            vec![65_536],
            vec![5, 16_384, 3],
        ] {
            for out_sizes in [&[1usize][..], &[8192], &[100, 70_000 - 3], &[60_000]] {
                let got = read_all(input.clone(), sizes.clone(), out_sizes).unwrap();
                assert_eq!(got, want, "reads {sizes:?}, buffers {out_sizes:?}");
            }
        }
    }

    #[test]
    fn errors_and_truncation() {
        let mut bad = PREFACE.to_vec();
        bad.extend(frame(TYPE_HEADERS, 0, 1, &request_block(b"a")));
        bad.extend(frame(0x0, 0, 1, b"x"));
        let e = read_all(bad, vec![1000], &[8192]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let mut cut = PREFACE.to_vec();
        cut.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &request_block(b"a"),
        ));
        cut.truncate(PREFACE.len() + 20);
        let e = read_all(cut, vec![1000], &[8192]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// The requests h2 hands out, up to the one for `/last`.
    async fn accept_all<T>(io: T) -> Vec<(String, Option<http::uri::Authority>)>
    where
        T: AsyncRead + AsyncWrite + Unpin,
    {
        let mut conn = h2::server::handshake(io).await.unwrap();
        let mut paths = Vec::new();
        while let Some(r) = conn.accept().await {
            let (req, _respond) = r.unwrap();
            paths.push((req.uri().path().to_string(), req.uri().authority().cloned()));
            if req.uri().path() == "/last" {
                break;
            }
        }
        paths
    }

    /// h2 itself: the request with a percent-encoded `:authority` is reset
    /// without the wrapper and served (without an authority) with it.
    #[tokio::test(flavor = "current_thread")]
    async fn h2_accepts_what_it_would_reset() {
        use tokio::io::AsyncWriteExt;
        for wrapped in [false, true] {
            let (client, server) = tokio::io::duplex(1 << 20);
            let conn = async move {
                if wrapped {
                    accept_all(wrap(server)).await
                } else {
                    accept_all(server).await
                }
            };
            let send = async move {
                let mut client = client;
                let mut s = PREFACE.to_vec();
                s.extend(frame(0x4, 0, 0, &[]));
                s.extend(frame(
                    TYPE_HEADERS,
                    FLAG_END_HEADERS | FLAG_END_STREAM,
                    1,
                    &request_block(PERCENT),
                ));
                let mut last = Vec::new();
                for (n, v) in [
                    (&b":method"[..], &b"GET"[..]),
                    (b":scheme", b"http"),
                    (b":path", b"/last"),
                    (b":authority", b"localhost"),
                ] {
                    encode_field(&mut last, n, v);
                }
                s.extend(frame(
                    TYPE_HEADERS,
                    FLAG_END_HEADERS | FLAG_END_STREAM,
                    3,
                    &last,
                ));
                client.write_all(&s).await.unwrap();
                client
            };
            let (paths, _client) = tokio::join!(conn, send);
            let last = ("/last".to_string(), Some("localhost".parse().unwrap()));
            if wrapped {
                assert_eq!(paths, vec![("/ProxyService/Proxy".to_string(), None), last]);
            } else {
                assert_eq!(paths, vec![last]);
            }
        }
    }
}
