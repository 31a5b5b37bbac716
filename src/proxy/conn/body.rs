//! HTTP/1 message bodies over a connection's reader and buffer: one
//! [`BodyReader`] for Content-Length, chunked and until-close bodies that
//! every body pump (draining, request bodies up over HTTP/1.1 and HTTP/2,
//! response bodies down, gunzip) drives; and [`write_piece`], the way a
//! piece goes to the client, chunk-framed or not.

use std::io;

use tokio::io::AsyncWriteExt;

use super::Client;

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
