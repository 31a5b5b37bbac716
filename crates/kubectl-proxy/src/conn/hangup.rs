//! Noticing a client that hangs up while its request waits on the
//! upstream, so that the upstream request is cancelled at once (HTTP/1.1:
//! the upstream connection is closed; HTTP/2: the stream is reset), as
//! kubectl does.
//!
//! Go's server (net/http/server.go, `connReader.startBackgroundRead` /
//! `backgroundRead`) reads the client's connection in the background once
//! the request body has been read: an EOF or error cancels the request's
//! context, which makes the transport abandon the upstream request; a byte
//! (a pipelined request) is kept and ends the watch.

use std::future::Future;
use std::pin::pin;

use futures::future::{select, Either};

use super::{read_more, Client};

/// The client hung up while its request was forwarded.
#[derive(Debug, thiserror::Error)]
#[error("client hung up")]
pub(super) struct HungUp;

impl From<HungUp> for std::io::Error {
    fn from(e: HungUp) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionAborted, e)
    }
}

/// Runs `work` (which must not use the client) until it ends, or until
/// the client hangs up first. Bytes the client sends meanwhile stay in its
/// buffer and end the watch for this request (`client.watch_hangup`).
pub(super) async fn unless_hung_up<F: Future>(
    client: &mut Client,
    work: F,
) -> Result<F::Output, HungUp> {
    let work = pin!(work);
    if !client.watch_hangup {
        return Ok(work.await);
    }
    let watch = pin!(async {
        match read_more(&mut client.io, &mut client.buf).await {
            Ok(n) if n > 0 => {
                client.watch_hangup = false;
                // Nothing more to watch: the request's work decides.
                std::future::pending::<()>().await;
            }
            _ => {}
        }
    });
    match select(work, watch).await {
        Either::Left((out, _)) => Ok(out),
        // The watch only ends on an EOF or error.
        Either::Right(_) => Err(HungUp),
    }
}
