//! Socket side of a tunneled connection: reading a socket into `Bytes`
//! chunks and writing `Bytes` back, with ownership-passing (io_uring) I/O.
//! Chunks are carved out of one large buffer, so a read allocates only when
//! the buffer runs low, and the chunk travels on as the DATA payload as is.

use std::io;
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};

use bytes::{Bytes, BytesMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

/// Size of the buffer reads are carved from.
const READ_BUFFER: usize = 256 * 1024;
/// Largest single read (and so the largest DATA payload we send).
const MAX_CHUNK: usize = 64 * 1024;

/// Reads a socket into `Bytes` chunks.
pub struct ChunkReader<R> {
    inner: R,
    buf: BytesMut,
}

impl<R: AsyncReadRent> ChunkReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: BytesMut::new(),
        }
    }

    /// The next chunk, `None` at end of stream.
    pub async fn next(&mut self) -> io::Result<Option<Bytes>> {
        if self.buf.capacity() < MAX_CHUNK {
            self.buf = BytesMut::with_capacity(READ_BUFFER);
        }
        // Read into the first MAX_CHUNK of the buffer; keep the rest.
        let rest = self.buf.split_off(MAX_CHUNK);
        let window = std::mem::replace(&mut self.buf, rest);
        let (res, mut window) = self.inner.read(window).await;
        let n = res?;
        if n == 0 {
            return Ok(None);
        }
        window.truncate(n);
        Ok(Some(window.freeze()))
    }

    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Writes every chunk fully.
pub async fn write_chunk<W: AsyncWriteRent>(w: &mut W, chunk: Bytes) -> io::Result<()> {
    let (res, _) = w.write_all(chunk).await;
    res.map(|_| ())
}

/// A socket being moved between cores: the descriptor and its kind.
#[derive(Debug)]
pub enum MovedSocket {
    Tcp(RawFd),
    Unix(RawFd),
}

impl MovedSocket {
    pub fn from_tcp(s: monoio::net::TcpStream) -> Self {
        MovedSocket::Tcp(s.into_raw_fd())
    }

    pub fn from_unix(s: monoio::net::UnixStream) -> Self {
        MovedSocket::Unix(s.into_raw_fd())
    }
}

impl Drop for MovedSocket {
    fn drop(&mut self) {
        // Only reached when the socket was never adopted: close it.
        let fd = match *self {
            MovedSocket::Tcp(fd) | MovedSocket::Unix(fd) => fd,
        };
        if fd >= 0 {
            // SAFETY: we own the descriptor.
            unsafe { libc::close(fd) };
        }
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
        let this = std::mem::ManuallyDrop::new(self);
        Ok(match *this {
            MovedSocket::Tcp(fd) => {
                // SAFETY: the descriptor came from `into_raw_fd` and is owned
                // by us; ManuallyDrop keeps Drop from closing it.
                let std = unsafe { std::net::TcpStream::from_raw_fd(fd) };
                LocalSocket::Tcp(monoio::net::TcpStream::from_std(std)?)
            }
            MovedSocket::Unix(fd) => {
                // SAFETY: as above.
                let std = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
                LocalSocket::Unix(monoio::net::UnixStream::from_std(std)?)
            }
        })
    }
}

/// A socket the relay can split into owned read and write halves.
pub trait Duplex:
    AsyncReadRent
    + AsyncWriteRent
    + monoio::io::Splitable<OwnedRead: AsyncReadRent, OwnedWrite: AsyncWriteRent>
    + 'static
{
}

impl<T> Duplex for T where
    T: AsyncReadRent
        + AsyncWriteRent
        + monoio::io::Splitable<OwnedRead: AsyncReadRent, OwnedWrite: AsyncWriteRent>
        + 'static
{
}
