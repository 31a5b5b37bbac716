//! The process's live heap, counted by the global allocator: what the
//! program holds (allocated and not yet freed), apart from what the
//! allocator keeps from the system (resident, committed). A heap that
//! grows with tunnels served is a leak; resident memory that grows while
//! the heap does not is the allocator's retention. Exported as
//! `edgetunnel_heap_live_bytes` beside `process_resident_memory_bytes`, and
//! read by the tests that hold memory flat over many tunnels.
//!
//! The count is spread over cache-line-sized shards, one per thread (by a
//! number each thread takes once), so that threads on different cores do
//! not contend for one counter: an allocation costs one uncontended atomic
//! add. A block freed on another thread than the one that allocated it
//! moves count between shards; only the sum means anything.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering::Relaxed};

/// Shards of the count (threads beyond this share them).
const SHARDS: usize = 16;

#[repr(align(64))]
struct Shard(AtomicIsize);

static COUNT: [Shard; SHARDS] = [const { Shard(AtomicIsize::new(0)) }; SHARDS];
/// The shard the next thread takes.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);
/// A [`Counting`] allocator is the global one (it has counted).
static COUNTING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread's shard, `SHARDS` until it takes one. (Const-initialized
    /// and without a destructor: usable inside the allocator.)
    static SHARD: Cell<usize> = const { Cell::new(SHARDS) };
}

/// Counts `n` bytes more (less, when negative) live: called by
/// [`Counting`]'s allocation functions.
pub(crate) fn add(n: isize) {
    let shard = SHARD
        .try_with(|s| {
            let mut i = s.get();
            if i == SHARDS {
                i = NEXT_SHARD.fetch_add(1, Relaxed) % SHARDS;
                s.set(i);
            }
            i
        })
        // A thread's last frees, after its locals are gone.
        .unwrap_or(0);
    COUNT[shard].0.fetch_add(n, Relaxed);
}

pub use crate::sys::Counting;

impl<A> Counting<A> {
    /// Marks the count as kept (call once at start, from `main`): before
    /// that, [`live_bytes`] is `None`, as in a build whose global allocator
    /// does not count.
    pub fn start(&self) {
        COUNTING.store(true, Relaxed);
    }
}

/// Bytes allocated and not freed, by the global allocator's count; `None`
/// when the global allocator is not [`Counting`].
pub fn live_bytes() -> Option<usize> {
    if !COUNTING.load(Relaxed) {
        return None;
    }
    let sum: isize = COUNT.iter().map(|s| s.0.load(Relaxed)).sum();
    Some(sum.max(0) as usize)
}

/// Bytes the allocator has committed from the system (mimalloc's own
/// statistics; resident or not); `None` in a `system-alloc` build.
pub fn committed_bytes() -> Option<usize> {
    crate::sys::allocator_committed()
}
