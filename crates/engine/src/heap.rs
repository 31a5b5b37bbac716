//! The process's live heap, counted by the global allocator: what the
//! program holds (allocated and not yet freed), apart from what the
//! allocator keeps from the system (resident, committed). A heap that
//! grows with tunnels served is a leak; resident memory that grows while
//! the heap does not is the allocator's retention. Exported as
//! `edgetunnel_heap_live_bytes` beside `process_resident_memory_bytes`, and
//! read by the tests that hold memory flat over many tunnels.
//!
//! The count is a [`ShardedCount`]: an allocation costs one uncontended
//! atomic add.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::sharded_count::ShardedCount;

static LIVE: ShardedCount = ShardedCount::new();
/// A [`Counting`] allocator is the global one (it has counted).
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Counts `n` bytes more (less, when negative) live: called by
/// [`Counting`]'s allocation functions.
pub(crate) fn add(n: isize) {
    LIVE.add(n);
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
    Some(LIVE.get())
}

/// Bytes the allocator has committed from the system (mimalloc's own
/// statistics; resident or not); `None` in a `system-alloc` build.
pub fn committed_bytes() -> Option<usize> {
    crate::sys::allocator_committed()
}
