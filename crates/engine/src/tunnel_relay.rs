//! The two directions of a tunneled connection, written once for both ends
//! of a tunnel: the server's CONNECT tunnels (`server::connect_frontend`,
//! the caller's socket) and the agent's dialed connections
//! (`agent::connection`, the target's socket).
//!
//! - [`pump_up`]: the socket's bytes, read as chunks within the peer's
//!   flow-control window ([`ChunkReader`], [`super::window`]), go to the
//!   tunnel's other end through a [`ChunkSink`] (an agent command on the
//!   server, an encoded DATA packet on the agent).
//! - [`pump_down`]: the other end's events are written to the socket, as
//!   many queued chunks per system call as there are
//!   ([`relay::write_queued`]); a half-close shuts the socket's write side.
//!
//! Each counts the chunks it moves, so that a half-closed tunnel's
//! [`relay::linger`] counts idle time only. What ends a tunnel and what each
//! end then sends (CLOSE_REQ or HalfClose, a CLOSE_RSP with the socket's
//! error, a reset of the socket) is the role's: the two ends differ there
//! (the server resets its caller when the agent reports a failed target;
//! the agent reports its target's failure in the CLOSE_RSP).
//!
//! Both take what they own in place and hold nothing across their awaits
//! that the role's task did not hold before: an idle tunnel's task is
//! allocated at its largest state for its whole life (the roles' unit tests
//! guard those sizes).

use std::borrow::BorrowMut;
use std::cell::Cell;
use std::future::Future;
use std::io;

use bytes::Bytes;
use futures::channel::mpsc::UnboundedReceiver;
use futures::StreamExt;
use monoio::io::{AsyncReadRent, AsyncWriteRent};

use super::budget::Credit;
use super::relay::{self, ChunkReader, Readable};

/// Where a tunnel's socket bytes go: the tunnel's other end.
pub trait ChunkSink {
    /// Sends one chunk read from the socket on; `false` when the other end
    /// no longer takes any.
    fn send(&mut self, chunk: Bytes) -> impl Future<Output = bool>;
}

/// How [`pump_up`] ended.
#[derive(Debug)]
pub enum UpEnd {
    /// End of stream: the socket's peer is done sending.
    Eof,
    /// The tunnel's other end took no more chunks.
    SinkGone,
    /// Reading the socket failed.
    Failed(io::Error),
}

/// Moves the socket's bytes to `sink` until the socket ends or the sink is
/// gone; `moved` counts the chunks.
///
/// An async block, not an `async fn`, with the arguments used in place: an
/// `async fn` moves its arguments into locals and keeps both copies.
#[allow(clippy::manual_async_fn)] // deliberate: see above
pub fn pump_up<'a, R, S>(
    mut reader: ChunkReader<R>,
    mut sink: S,
    moved: &'a Cell<u32>,
) -> impl Future<Output = UpEnd> + 'a
where
    R: AsyncReadRent + Readable + 'a,
    S: ChunkSink + 'a,
{
    async move {
        loop {
            match reader.next().await {
                Ok(Some(chunk)) => {
                    moved.set(moved.get().wrapping_add(1));
                    if !sink.send(chunk).await {
                        return UpEnd::SinkGone;
                    }
                }
                Ok(None) => return UpEnd::Eof,
                Err(e) => return UpEnd::Failed(e),
            }
        }
    }
}

/// What one event from the tunnel's other end means to the socket.
pub enum Incoming<E> {
    /// Payload to write.
    Data(Credit),
    /// The other end finished sending (half-close): shut the socket's
    /// write side down.
    Finish,
    /// The tunnel ends; `E` says how, for the role to judge.
    End(E),
    /// Not for the relay.
    Skip,
}

/// How [`pump_down`] ended.
#[derive(Debug)]
pub enum DownEnd<E> {
    /// The other end finished sending; the socket's write side is shut
    /// down.
    Finished,
    /// The other end ended the tunnel ([`Incoming::End`]), or with `None`
    /// its event channel closed.
    Ended(Option<E>),
    /// Writing the socket failed.
    Failed(io::Error),
}

/// Writes the other end's payload to the socket until it finishes or ends
/// the tunnel: `sort` says what each event means; `moved` counts the
/// writes. The events are handed back, so that a role can still hear the
/// tunnel's end after a half-close; `wr` is only borrowed, as dropping a
/// write half sends a FIN, which must not come before a reset.
///
/// An async block, not an `async fn` (see [`pump_up`]).
#[allow(clippy::manual_async_fn)] // deliberate: see pump_up
pub fn pump_down<'a, T, E, W, Rx, F>(
    wr: &'a mut W,
    mut events: Rx,
    sort: F,
    moved: &'a Cell<u32>,
) -> impl Future<Output = (DownEnd<E>, Rx)> + 'a
where
    W: AsyncWriteRent + 'a,
    Rx: BorrowMut<UnboundedReceiver<T>> + 'a,
    F: Fn(T) -> Incoming<E> + 'a,
    T: 'a,
    E: 'a,
{
    async move {
        let mut stashed: Option<Incoming<E>> = None;
        loop {
            if stashed.is_none() {
                match events.borrow_mut().next().await {
                    Some(ev) => stashed = Some(sort(ev)),
                    None => return (DownEnd::Ended(None), events),
                }
            }
            // The event is taken apart in a block of its own, before the
            // write's await: the task does not keep a copy of it (or of the
            // temporary matched on) across the wait.
            let written = {
                let first = match stashed.take() {
                    Some(Incoming::Data(first)) => first,
                    Some(Incoming::Finish) => break,
                    Some(Incoming::End(how)) => return (DownEnd::Ended(Some(how)), events),
                    Some(Incoming::Skip) | None => continue,
                };
                let rx = events.borrow_mut();
                relay::write_queued(
                    wr,
                    first,
                    || rx.try_recv().ok().map(&sort),
                    |ev| match ev {
                        Incoming::Data(c) => Ok(c),
                        other => Err(other),
                    },
                    moved,
                )
            };
            match written.await {
                Ok(next) => stashed = next,
                Err(e) => return (DownEnd::Failed(e), events),
            }
        }
        let _ = wr.shutdown().await;
        (DownEnd::Finished, events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budget;
    use crate::runtime::{block_on, Driver};
    use futures::channel::mpsc;
    use monoio::io::{AsyncWriteRentExt, Splitable};

    fn socket_pair() -> (monoio::net::UnixStream, monoio::net::UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (
            monoio::net::UnixStream::from_std(a).unwrap(),
            monoio::net::UnixStream::from_std(b).unwrap(),
        )
    }

    struct Collect(mpsc::UnboundedSender<Bytes>);

    impl ChunkSink for Collect {
        async fn send(&mut self, chunk: Bytes) -> bool {
            self.0.unbounded_send(chunk).is_ok()
        }
    }

    enum Ev {
        Data(Credit),
        Finish,
        Skip,
        End(u8),
    }

    fn sort(ev: Ev) -> Incoming<u8> {
        match ev {
            Ev::Data(c) => Incoming::Data(c),
            Ev::Finish => Incoming::Finish,
            Ev::Skip => Incoming::Skip,
            Ev::End(n) => Incoming::End(n),
        }
    }

    async fn data(budget: &std::sync::Arc<Budget>, b: &'static [u8]) -> Ev {
        Ev::Data(budget.charge(Bytes::from_static(b)).await)
    }

    /// Up: every chunk reaches the sink, counted, then the end of stream;
    /// a sink that is gone ends the pump.
    #[test]
    fn pump_up_moves_bytes_until_eof_or_sink_gone() {
        for driver in [Driver::Auto, Driver::Legacy] {
            block_on(driver, async {
                let (mut a, b) = socket_pair();
                let (tx, mut rx) = mpsc::unbounded();
                let moved = Cell::new(0);
                let data: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
                let writer = {
                    let data = data.clone();
                    monoio::spawn(async move {
                        let (res, _) = a.write_all(data).await;
                        res.unwrap();
                    })
                };
                let end = pump_up(ChunkReader::new(b), Collect(tx), &moved).await;
                writer.await;
                assert!(matches!(end, UpEnd::Eof), "{end:?}");
                let mut got = Vec::new();
                let mut chunks = 0;
                while let Ok(c) = rx.try_recv() {
                    got.extend_from_slice(&c);
                    chunks += 1;
                }
                assert!(got == data);
                assert_eq!(moved.get(), chunks);

                let (mut a, b) = socket_pair();
                let (tx, rx) = mpsc::unbounded();
                drop(rx);
                let (res, _) = a.write_all(b"x".to_vec()).await;
                res.unwrap();
                let end = pump_up(ChunkReader::new(b), Collect(tx), &moved).await;
                assert!(matches!(end, UpEnd::SinkGone), "{end:?}");
            })
            .unwrap();
        }
    }

    /// Down: payload is written in order, skipped events are skipped, a
    /// half-close shuts the socket's write side (the peer reads EOF), and
    /// an end hands its meaning back; a closed channel ends with `None`.
    #[test]
    fn pump_down_writes_then_finishes_or_ends() {
        for driver in [Driver::Auto, Driver::Legacy] {
            block_on(driver, async {
                let budget = Budget::new(1 << 20);
                let moved = Cell::new(0);
                let (a, b) = socket_pair();
                let (_rd, mut wr) = a.into_split();
                let (tx, rx) = mpsc::unbounded();
                for ev in [
                    data(&budget, b"one ").await,
                    Ev::Skip,
                    data(&budget, b"two").await,
                    Ev::Finish,
                ] {
                    tx.unbounded_send(ev).unwrap();
                }
                let (end, rx) = pump_down(&mut wr, rx, sort, &moved).await;
                assert!(matches!(end, DownEnd::Finished), "{end:?}");
                assert!(moved.get() >= 1);
                // Every credit came back once its bytes were written.
                assert_eq!(budget.used(), 0);
                let mut r = ChunkReader::new(b);
                let mut got = Vec::new();
                while let Some(c) = r.next().await.unwrap() {
                    got.extend_from_slice(&c);
                }
                assert_eq!(got, b"one two");

                tx.unbounded_send(data(&budget, b"x").await).unwrap();
                tx.unbounded_send(Ev::End(7)).unwrap();
                let (a, _b) = socket_pair();
                let (_rd, mut wr) = a.into_split();
                let (end, rx) = pump_down(&mut wr, rx, sort, &moved).await;
                assert!(matches!(end, DownEnd::Ended(Some(7))), "{end:?}");

                drop(tx);
                let mut rx = rx;
                let (end, _) = pump_down(&mut wr, &mut rx, sort, &moved).await;
                assert!(matches!(end, DownEnd::Ended(None)), "{end:?}");
            })
            .unwrap();
        }
    }
}
