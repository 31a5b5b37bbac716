//! HTTP/1 message bodies over a connection's reader and buffer: one
//! [`BodyReader`] for Content-Length, chunked and until-close bodies that
//! every body pump (draining, request bodies up over HTTP/1.1 and HTTP/2,
//! response bodies down, gunzip) drives; and [`write_piece`], the way a
//! piece goes to the client, chunk-framed or not.

use std::io;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWriteExt};

use super::{read_more, Client};
use protocol::http1::{ChunkError, ChunkedDecoder, Framing};

/// Why a body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub(super) enum BodyError {
    /// The peer closed before the body's end.
    #[error("unexpected end of file")]
    Eof,
    #[error(transparent)]
    Read(io::Error),
    #[error(transparent)]
    Malformed(ChunkError),
}

impl From<BodyError> for io::Error {
    /// The errors the pumps gave before they shared a reader (their text
    /// reaches clients in 500 answers).
    fn from(e: BodyError) -> io::Error {
        match e {
            BodyError::Eof => io::ErrorKind::UnexpectedEof.into(),
            BodyError::Read(e) => e,
            BodyError::Malformed(e) => io::Error::new(io::ErrorKind::InvalidData, e),
        }
    }
}

/// Where a body stands.
#[derive(Debug)]
enum State {
    /// Bytes left of a Content-Length body.
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Everything until the peer closes (responses only).
    UntilClose,
    Done,
}

/// One message body read off a connection's buffer (reading more from its
/// socket when the buffer is empty), piece by piece until its end. Each
/// piece holds the bytes as they came ([`Piece::raw`], chunk framing
/// included) and the payload in them ([`Piece::data`]); bytes past the
/// body's end stay in the buffer for the next message.
#[derive(Debug)]
pub(super) struct BodyReader {
    state: State,
}

/// A piece of a body: the raw bytes taken from the buffer and, for a
/// chunked body, where its payload lies in them (else all of it is).
#[derive(Debug)]
pub(super) struct Piece {
    raw: Bytes,
    payload: Option<Vec<Range<usize>>>,
}

impl Piece {
    /// The bytes as the peer sent them.
    pub(super) fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// The payload, without chunk framing (shares the raw bytes).
    pub(super) fn data(&self) -> impl Iterator<Item = Bytes> + '_ {
        let whole = self.payload.is_none().then(|| self.raw.clone());
        let parts = self.payload.iter().flatten();
        whole
            .into_iter()
            .chain(parts.map(|r| self.raw.slice(r.clone())))
    }
}

impl BodyReader {
    /// A request body: never delimited by the close (RFC 9112 6.3), so
    /// `UntilClose` reads as no body.
    pub(super) fn request(framing: Framing) -> Self {
        match framing {
            Framing::UntilClose => Self::response(Framing::None),
            f => Self::response(f),
        }
    }

    /// A response body with `framing`.
    pub(super) fn response(framing: Framing) -> Self {
        let state = match framing {
            Framing::None | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Chunked(ChunkedDecoder::new()),
            Framing::UntilClose => State::UntilClose,
        };
        BodyReader { state }
    }

    /// Whether the body has ended.
    pub(super) fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The next piece of the body, from `buf` or, when it is empty, from
    /// what one read of `io` brings; `None` at the body's end.
    pub(super) async fn next<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        buf: &mut BytesMut,
    ) -> Result<Option<Piece>, BodyError> {
        if self.is_done() {
            return Ok(None);
        }
        if buf.is_empty() && read_more(io, buf).await.map_err(BodyError::Read)? == 0 {
            return match self.state {
                State::UntilClose => {
                    self.state = State::Done;
                    Ok(None)
                }
                _ => Err(BodyError::Eof),
            };
        }
        self.take(buf).map(Some).map_err(BodyError::Malformed)
    }

    /// Takes the body's next piece from a non-empty `buf` (sans I/O).
    fn take(&mut self, buf: &mut BytesMut) -> Result<Piece, ChunkError> {
        let (n, payload, done) = match &mut self.state {
            State::Length(left) => {
                let n = (*left).min(buf.len() as u64);
                *left -= n;
                (n as usize, None, *left == 0)
            }
            State::Chunked(dec) => {
                let p = dec.advance(buf)?;
                (p.consumed, Some(p.data), p.done)
            }
            State::UntilClose => (buf.len(), None, false),
            State::Done => (0, None, true),
        };
        if done {
            self.state = State::Done;
        }
        Ok(Piece {
            raw: buf.split_to(n).freeze(),
            payload,
        })
    }
}

/// Writes one piece of body to the client, as one chunk when `chunked`
/// (an empty piece writes nothing: it would end a chunked body).
pub(super) async fn write_piece(client: &mut Client, data: &[u8], chunked: bool) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    if chunked {
        let mut framed = Vec::with_capacity(data.len() + 16);
        framed.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        framed.extend_from_slice(data);
        framed.extend_from_slice(b"\r\n");
        client.io.write_all(&framed).await
    } else {
        client.io.write_all(data).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw bytes, payload, and what is left after the body.
    type Read = (Vec<u8>, Vec<u8>, Vec<u8>);

    /// Reads a whole body from `wire`, offered to the reader `step` bytes
    /// at a time.
    fn read_all(framing: Framing, wire: &[u8], step: usize) -> Result<Read, BodyError> {
        let mut io = Steps(wire.chunks(step).map(<[u8]>::to_vec).collect());
        let mut buf = BytesMut::new();
        let mut body = BodyReader::response(framing);
        let (mut raw, mut data) = (Vec::new(), Vec::new());
        let run = async {
            while let Some(p) = body.next(&mut io, &mut buf).await? {
                raw.extend_from_slice(p.raw());
                p.data().for_each(|d| data.extend_from_slice(&d));
            }
            Ok::<_, BodyError>(())
        };
        block_on(run)?;
        let mut rest = buf.to_vec();
        io.0.iter().for_each(|c| rest.extend_from_slice(c));
        Ok((raw, data, rest))
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        use engine::runtime::{block_on, Driver};
        block_on(Driver::Legacy, f).expect("a test runtime")
    }

    /// A reader that gives its pieces one read at a time.
    struct Steps(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Steps {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            out: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            if let Some(c) = self.0.pop_front() {
                out.put_slice(&c);
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn content_length_stops_at_its_end() {
        for step in [1, 3, 100] {
            let (raw, data, rest) = read_all(Framing::Length(5), b"hello NEXT", step).unwrap();
            assert_eq!((&raw[..], &data[..]), (&b"hello"[..], &b"hello"[..]));
            assert_eq!(rest, b" NEXT");
        }
        assert!(matches!(
            read_all(Framing::Length(9), b"short", 2),
            Err(BodyError::Eof)
        ));
    }

    #[test]
    fn chunked_gives_raw_and_payload() {
        let wire = b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: v\r\n\r\nNEXT";
        let end = wire.len() - 4;
        for step in [1, 2, 7, 1000] {
            let (raw, data, rest) = read_all(Framing::Chunked, wire, step).unwrap();
            assert_eq!(raw, &wire[..end]);
            assert_eq!(data, b"abcde");
            assert_eq!(rest, b"NEXT");
        }
        assert!(matches!(
            read_all(Framing::Chunked, b"3\r\nab", 1),
            Err(BodyError::Eof)
        ));
        assert!(matches!(
            read_all(Framing::Chunked, b"zz\r\n", 1),
            Err(BodyError::Malformed(_))
        ));
    }

    #[test]
    fn until_close_and_none() {
        let (raw, data, _) = read_all(Framing::UntilClose, b"all of it", 4).unwrap();
        assert_eq!((raw.clone(), data), (b"all of it".to_vec(), raw));
        let (raw, _, rest) = read_all(Framing::None, b"NEXT", 4).unwrap();
        assert_eq!((raw, rest), (Vec::new(), b"NEXT".to_vec()));
        let mut r = BodyReader::request(Framing::UntilClose);
        assert!(r.is_done());
        let mut buf = BytesMut::from(&b"x"[..]);
        let none = block_on(r.next(&mut &b""[..], &mut buf));
        assert!(matches!(none, Ok(None)));
    }

    #[test]
    fn errors_keep_the_pumps_texts() {
        let eof: io::Error = BodyError::Eof.into();
        assert_eq!(eof.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(eof.to_string(), BodyError::Eof.to_string());
    }
}
