//! Buffers a data-plane thread lends to one connection at a time.
//!
//! A connection borrows its thread's buffer for one read or one batch of
//! writes and gives it back when the bytes are consumed, so thousands of
//! idle connections hold no buffer of their own. Each kind of buffer has
//! one [`Pool`] per thread.
//!
//! A buffer that served a busy spell has had all its pages written: kept
//! as it is, an idle thread holds them for good (about 360 KB per process
//! of the 1.1 MB an idle server kept after a soak, issue 40). The quiet
//! trim ([`super::memory`]) therefore calls [`release_all`] before it asks
//! the allocator for free memory: the buffers are dropped, and the next
//! read takes a fresh one.

use std::cell::RefCell;

use bytes::BytesMut;

use crate::sharded_count::ShardedCount;

/// One thread's buffer of one kind (a `thread_local!` static).
#[derive(Default)]
pub struct Pool(RefCell<BytesMut>);

/// The pools [`release_all`] empties: every kind a thread lends.
pub type Key = std::thread::LocalKey<Pool>;

thread_local! {
    /// The HTTP/2 connections' read buffer ([`super::h2_conn`]).
    pub static H2_READ: Pool = Pool::default();
    /// The read-ahead layer's buffer ([`super::read_ahead`]).
    pub static READ_AHEAD: Pool = Pool::default();
    /// Our TLS record layer's read buffer ([`super::tls_records`]).
    pub static TLS_READ: Pool = Pool::default();
    /// Our TLS record layer's write buffer ([`super::tls_records`]).
    pub static TLS_WRITE: Pool = Pool::default();
}

const ALL: [&Key; 4] = [&H2_READ, &READ_AHEAD, &TLS_READ, &TLS_WRITE];

/// Capacity every thread's pools hold between loans
/// (`edgetunnel_thread_buffer_bytes`; a shard a thread, as every loan
/// changes it).
static HELD: ShardedCount = ShardedCount::new();

/// Capacity the threads' pools hold, in bytes: buffers kept between loans
/// (a buffer lent to a connection is not counted).
pub fn held_bytes() -> usize {
    HELD.get()
}

/// Borrows the thread's buffer from `pool`, empty, with room for at least
/// `min` bytes (reserving `size` when it has less; a fresh buffer after a
/// [`release_all`] or while another connection holds it).
pub fn take(pool: &'static Key, min: usize, size: usize) -> BytesMut {
    let mut b = empty(pool);
    b.clear();
    if b.capacity() < min {
        b.reserve(size.max(min));
    }
    b
}

/// Gives a buffer back to `pool`; the larger of the two is kept.
pub fn give(pool: &'static Key, mut b: BytesMut) {
    b.clear();
    pool.with(|p| {
        let mut slot = p.0.borrow_mut();
        if b.capacity() > slot.capacity() {
            HELD.add((b.capacity() - slot.capacity()) as isize);
            *slot = b;
        }
    });
}

/// Drops every buffer this thread holds in its pools (a buffer lent out
/// stays with its connection).
pub fn release_all() {
    for pool in ALL {
        drop(empty(pool));
    }
}

/// Takes the buffer `pool` holds out of it (and out of the count).
fn empty(pool: &'static Key) -> BytesMut {
    let b = pool.with(|p| std::mem::take(&mut *p.0.borrow_mut()));
    HELD.add(-(b.capacity() as isize));
    b
}

/// Capacity this thread's pools hold, in bytes.
#[cfg(test)]
fn held_here() -> usize {
    ALL.iter()
        .map(|pool| pool.with(|p| p.0.borrow().capacity()))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_serves_the_next_take_until_released() {
        let b = take(&TLS_READ, 1024, 4096);
        assert!(b.capacity() >= 4096);
        let first = b.as_ptr();
        give(&TLS_READ, b);
        assert!(held_here() >= 4096);
        let mut again = take(&TLS_READ, 1024, 4096);
        assert_eq!(again.as_ptr(), first, "the same buffer, lent again");
        again.extend_from_slice(b"abc");
        give(&TLS_READ, again);
        let again = take(&TLS_READ, 1024, 4096);
        assert!(again.is_empty(), "given back empty");
        give(&TLS_READ, again);
        release_all();
        assert_eq!(held_here(), 0);
        assert!(take(&TLS_READ, 1024, 4096).capacity() >= 4096);
    }

    #[test]
    fn the_larger_buffer_is_kept_and_a_small_one_grows() {
        give(&H2_READ, BytesMut::with_capacity(100));
        give(&H2_READ, BytesMut::with_capacity(50));
        assert_eq!(take(&H2_READ, 10, 10).capacity(), 100);
        assert!(take(&H2_READ, 1000, 2000).capacity() >= 2000);
        release_all();
    }
}
