//! Undoing the gzip coding we asked the upstream for (kubectl's transport
//! asks for it and decompresses transparently), streamed toward the client
//! in small steps.

use std::io;
use std::sync::atomic::Ordering;

use tokio::io::AsyncWriteExt;

use super::body::write_piece;
use super::core::UpConn;
use super::{read_more, Client, ProxyMetrics, READ_CHUNK};
use bytes::Buf;

use crate::protocol::http1::{ChunkedDecoder, Framing};

/// Decompresses a gzip body we asked for, streaming it to the client in
/// chunks (or raw to an HTTP/1.0 client). Input goes in small steps so a
/// compression bomb cannot grow memory past a few MiB.
pub(super) async fn relay_gunzip(
    client: &mut Client,
    up: &mut UpConn,
    framing: Framing,
    chunked: bool,
    metrics: &ProxyMetrics,
) -> io::Result<()> {
    let mut gz = Gunzip::new(chunked);
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    let mut dec = ChunkedDecoder::new();
    let mut finished = false;
    while !finished {
        if left == 0 {
            break;
        }
        if up.buf.is_empty() && read_more(&mut up.io, &mut up.buf).await? == 0 {
            if framing == Framing::UntilClose {
                break;
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // The compressed payload in what we have.
        let (ranges, consumed) = match framing {
            Framing::Chunked => {
                let p = dec
                    .advance(&up.buf)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                finished = p.done;
                (p.data, p.consumed)
            }
            _ => {
                let take = (left.min(up.buf.len() as u64)) as usize;
                left -= take as u64;
                (std::iter::once(0..take).collect::<Vec<_>>(), take)
            }
        };
        for r in ranges {
            gz.feed(client, &up.buf[r], metrics).await?;
        }
        up.buf.advance(consumed);
    }
    gz.finish(client).await
}

/// Streaming gzip decompression toward the client, in small steps.
pub(super) struct Gunzip {
    gz: flate2::write::GzDecoder<Vec<u8>>,
    chunked: bool,
}

impl Gunzip {
    const STEP: usize = 4096;

    pub(super) fn new(chunked: bool) -> Self {
        Gunzip {
            gz: flate2::write::GzDecoder::new(Vec::with_capacity(READ_CHUNK)),
            chunked,
        }
    }

    pub(super) async fn feed(
        &mut self,
        client: &mut Client,
        data: &[u8],
        metrics: &ProxyMetrics,
    ) -> io::Result<()> {
        use std::io::Write as _;
        for piece in data.chunks(Self::STEP) {
            self.gz.write_all(piece)?;
            let out = std::mem::take(self.gz.get_mut());
            write_piece(client, &out, self.chunked).await?;
            metrics
                .bytes_down
                .fetch_add(out.len() as u64, Ordering::Relaxed);
            *self.gz.get_mut() = out;
            self.gz.get_mut().clear();
        }
        Ok(())
    }

    pub(super) async fn finish(mut self, client: &mut Client) -> io::Result<()> {
        self.gz.try_finish()?;
        let out = std::mem::take(self.gz.get_mut());
        write_piece(client, &out, self.chunked).await?;
        if self.chunked {
            client.io.write_all(b"0\r\n\r\n").await?;
        }
        Ok(())
    }
}
