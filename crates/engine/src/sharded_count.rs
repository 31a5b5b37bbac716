//! A process-wide count kept in cache-line-sized shards, one per thread (by
//! a number each thread takes once), so that threads on different cores do
//! not contend for one counter: a change costs one uncontended atomic add.
//! A change made on another thread than the one that made its opposite
//! moves count between shards; only the sum means anything. Usable inside
//! the global allocator (nothing here allocates).

use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed};

/// Shards of a count (threads beyond this share them).
const SHARDS: usize = 16;

#[repr(align(64))]
struct Shard(AtomicIsize);

/// The shard the next thread takes.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, `SHARDS` until it takes one. (Const-initialized
    /// and without a destructor: usable inside the allocator.)
    static SHARD: Cell<usize> = const { Cell::new(SHARDS) };
}

fn this_threads_shard() -> usize {
    SHARD
        .try_with(|s| {
            let mut i = s.get();
            if i == SHARDS {
                i = NEXT_SHARD.fetch_add(1, Relaxed) % SHARDS;
                s.set(i);
            }
            i
        })
        // A thread's last changes, after its locals are gone.
        .unwrap_or(0)
}

/// See the module documentation.
pub struct ShardedCount([Shard; SHARDS]);

impl ShardedCount {
    pub const fn new() -> Self {
        ShardedCount([const { Shard(AtomicIsize::new(0)) }; SHARDS])
    }

    /// Adds `n` (subtracts, when negative).
    pub fn add(&self, n: isize) {
        self.0[this_threads_shard()].0.fetch_add(n, Relaxed);
    }

    /// The sum over every thread's changes (never below 0).
    pub fn get(&self) -> usize {
        self.0
            .iter()
            .map(|s| s.0.load(Relaxed))
            .sum::<isize>()
            .max(0) as usize
    }
}

impl Default for ShardedCount {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::ShardedCount;

    #[test]
    fn changes_on_many_threads_sum_up() {
        static C: ShardedCount = ShardedCount::new();
        std::thread::scope(|s| {
            for t in 0..40 {
                s.spawn(move || {
                    for _ in 0..1000 {
                        C.add(3);
                    }
                    // Taken back on another thread than it was given.
                    if t % 2 == 0 {
                        C.add(-1000);
                    }
                });
            }
        });
        assert_eq!(C.get(), 40 * 3000 - 20 * 1000);
    }
}
