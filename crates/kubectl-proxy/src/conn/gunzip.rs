//! Undoing the gzip coding we asked the upstream for (kubectl's transport
//! asks for it and decompresses transparently), streamed toward the client
//! in small steps.

use std::io;

use tokio::io::AsyncWriteExt;

use super::body::{write_piece, BodyReader};
use super::core::UpConn;
use super::hangup::unless_hung_up;
use super::{Client, ProxyMetrics, READ_CHUNK};
use protocol::http1::Framing;

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
    let mut body = BodyReader::response(framing);
    while let Some(piece) = unless_hung_up(client, body.next(&mut up.io, &mut up.buf)).await?? {
        for compressed in piece.data() {
            gz.feed(client, &compressed, metrics).await?;
        }
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
            metrics.bytes_down.inc_by(out.len() as u64);
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
