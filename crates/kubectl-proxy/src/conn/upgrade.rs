//! Upgraded connections (exec, attach, port-forward, websockets): the
//! request goes on a new upstream connection, then bytes flow raw both
//! ways, spliced in the kernel when no TLS sits on either side.

use std::io;
use std::rc::Rc;

use tokio::io::AsyncWriteExt;

use super::local::proxy_error;
use super::round_trip::fresh_auth;
use super::{Client, Core};
use crate::forward;
use crate::io::{ClientIo, UpstreamIo};
use protocol::http1::{Framing, RequestHead};

/// Relays an upgrade request (exec, attach, port-forward, websockets) on a
/// new upstream connection, raw in both directions from the request on.
/// Without TLS on either side the two sockets are spliced in the kernel.
pub(super) async fn upgrade(
    mut client: Client,
    head: &RequestHead,
    target: &str,
    framing: Framing,
    core: &Rc<Core>,
) {
    let shared = &core.shared;
    if let Err(e) = fresh_auth(head, shared).await {
        proxy_error(&mut client, core, &e).await;
        return;
    }
    let upstream_head = forward::request_head(
        head,
        target,
        framing,
        client.peer,
        &shared.upstream,
        true,
        false,
    );
    let mut up = match core.dial().await {
        Ok(c) => c,
        Err(e) => {
            proxy_error(&mut client, core, &e).await;
            return;
        }
    };
    let mut first = upstream_head;
    first.extend_from_slice(&client.buf);
    client.buf.clear();
    if up.io.write_all(&first).await.is_err() || up.io.flush().await.is_err() {
        return;
    }
    if let Err(e) = relay_upgraded(client.io, up.io).await {
        tracing::debug!("upgraded connection ended: {e}");
    }
}

pub(super) async fn relay_upgraded(client: ClientIo, up: UpstreamIo) -> io::Result<()> {
    match (client, up) {
        (ClientIo::Tcp(c), UpstreamIo::Plain(u)) => {
            let c = c.try_into_comp_io().map_err(|(e, _)| e)?;
            let u = u.try_into_comp_io().map_err(|(e, _)| e)?;
            splice_both(c, u).await
        }
        (ClientIo::Unix(c), UpstreamIo::Plain(u)) => {
            let c = c.try_into_comp_io().map_err(|(e, _)| e)?;
            let u = u.try_into_comp_io().map_err(|(e, _)| e)?;
            splice_both(c, u).await
        }
        (mut c, mut u) => tokio::io::copy_bidirectional(&mut c, &mut u)
            .await
            .map(|_| ()),
    }
}

/// Splices two sockets both ways, half-closing each direction at its EOF.
pub(super) async fn splice_both<A, B>(a: A, b: B) -> io::Result<()>
where
    A: monoio::io::Splitable,
    B: monoio::io::Splitable,
    A::OwnedRead: monoio::io::as_fd::AsReadFd,
    A::OwnedWrite: monoio::io::as_fd::AsWriteFd + monoio::io::AsyncWriteRent,
    B::OwnedRead: monoio::io::as_fd::AsReadFd,
    B::OwnedWrite: monoio::io::as_fd::AsWriteFd + monoio::io::AsyncWriteRent,
{
    use monoio::io::AsyncWriteRent;
    let (mut ar, mut aw) = a.into_split();
    let (mut br, mut bw) = b.into_split();
    let ab = async {
        let r = monoio::io::zero_copy(&mut ar, &mut bw).await;
        let _ = bw.shutdown().await;
        r
    };
    let ba = async {
        let r = monoio::io::zero_copy(&mut br, &mut aw).await;
        let _ = aw.shutdown().await;
        r
    };
    let (x, y) = futures::join!(ab, ba);
    x.and(y).map(|_| ())
}
