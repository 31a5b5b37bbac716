//! Reading an HTTP/1 request head off a socket: the one loop the
//! interception and admin listeners share. Parsing is
//! [`protocol::http1::parse_request`] with the caller's limit.

use bytes::{Bytes, BytesMut};
use monoio::buf::IoBufMut;
use monoio::io::AsyncReadRent;

use protocol::http1::{self, HeadError, HeadLimit, RequestHead};

/// Bytes asked of the socket per read.
const READ_SIZE: usize = 4096;

/// A complete request head and every byte read with it.
#[derive(Debug)]
pub struct ReadHead {
    pub head: RequestHead,
    /// Length of the head within `bytes`.
    pub head_len: usize,
    /// The head and whatever followed it in the same reads.
    pub bytes: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadHeadError {
    #[error("connection closed before a request head")]
    Closed,
    #[error(transparent)]
    Head(#[from] HeadError),
    #[error("read: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads until a complete request head within `limit`.
pub async fn read_request_head<R: AsyncReadRent>(
    r: &mut R,
    limit: HeadLimit,
) -> Result<ReadHead, ReadHeadError> {
    let mut acc = BytesMut::new();
    loop {
        acc.reserve(READ_SIZE.min(limit.bytes.saturating_sub(acc.len()).max(1)));
        // monoio reads into the start of a buffer: append through a slice.
        let start = acc.len();
        let end = acc.capacity();
        let (res, slice) = r.read(acc.slice_mut(start..end)).await;
        acc = slice.into_inner();
        if res? == 0 {
            return Err(ReadHeadError::Closed);
        }
        if let Some((head, head_len)) = http1::parse_request(&acc, limit)? {
            return Ok(ReadHead {
                head,
                head_len,
                bytes: acc.freeze(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monoio::io::AsyncWriteRentExt;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    async fn pair() -> (monoio::net::TcpStream, monoio::net::TcpStream) {
        let l = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = monoio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    #[test]
    fn head_split_over_writes_keeps_what_follows() {
        run(async {
            let (mut c, mut s) = pair().await;
            monoio::spawn(async move {
                for part in [&b"GET /a HTTP/1.1\r\nHo"[..], b"st: n1\r\n\r\nbody"] {
                    let _ = c.write_all(part.to_vec()).await;
                    monoio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            });
            let got = read_request_head(&mut s, HeadLimit::ADMIN).await.unwrap();
            assert_eq!(got.head.target, "/a");
            assert_eq!(&got.bytes[got.head_len..], b"body");
            assert_eq!(http1::get(&got.head.headers, "host"), Some("n1"));
        });
    }

    #[test]
    fn oversized_and_closed_heads_are_errors() {
        run(async {
            let (mut c, mut s) = pair().await;
            monoio::spawn(async move {
                let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
                big.resize(HeadLimit::ADMIN.bytes + 100, b'a');
                let _ = c.write_all(big).await;
                monoio::time::sleep(std::time::Duration::from_millis(200)).await;
            });
            let err = read_request_head(&mut s, HeadLimit::ADMIN)
                .await
                .unwrap_err();
            assert!(
                matches!(err, ReadHeadError::Head(HeadError::TooLarge)),
                "{err}"
            );

            let (c, mut s) = pair().await;
            drop(c);
            let err = read_request_head(&mut s, HeadLimit::ADMIN)
                .await
                .unwrap_err();
            assert!(matches!(err, ReadHeadError::Closed), "{err}");
        });
    }
}
