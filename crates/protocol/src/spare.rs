//! Giving back what a burst grew.
//!
//! A table that held 5,000 tunnels at the peak of a burst keeps room for
//! 5,000 once they end: `HashMap` and `VecDeque` never shrink on their own.
//! Each such table is small, but a process that serves tunnels for months
//! meets its peak sooner or later on every table, and the room stays
//! allocated (and resident) for good. [`ReleaseSpare::release_spare`],
//! called after a removal, shrinks a collection to twice what it holds
//! once it holds less than a quarter of its capacity, above a floor of
//! [`KEEP`]: the same hysteresis as a growing table's doubling, so a size
//! that goes up and down costs amortised O(1) per operation, never a
//! reallocation on each.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hash};

/// Capacity a table always keeps (a few hundred bytes to a few KiB).
pub const KEEP: usize = 64;

/// Whether a collection of capacity `cap` holding `len` gives room back.
pub fn is_sparse(len: usize, cap: usize) -> bool {
    cap > KEEP && len.saturating_mul(4) < cap
}

/// What a sparse collection keeps.
fn target(len: usize) -> usize {
    (len * 2).max(KEEP / 2)
}

/// A collection that can give back spare capacity.
pub trait ReleaseSpare {
    /// Shrinks the collection if it holds less than a quarter of its
    /// capacity (see the module docs); cheap when it does not.
    fn release_spare(&mut self);
}

impl<K: Eq + Hash, V, S: BuildHasher> ReleaseSpare for HashMap<K, V, S> {
    fn release_spare(&mut self) {
        if is_sparse(self.len(), self.capacity()) {
            self.shrink_to(target(self.len()));
        }
    }
}

impl<K: Eq + Hash, S: BuildHasher> ReleaseSpare for HashSet<K, S> {
    fn release_spare(&mut self) {
        if is_sparse(self.len(), self.capacity()) {
            self.shrink_to(target(self.len()));
        }
    }
}

impl<T> ReleaseSpare for VecDeque<T> {
    fn release_spare(&mut self) {
        if is_sparse(self.len(), self.capacity()) {
            self.shrink_to(target(self.len()));
        }
    }
}

impl<T> ReleaseSpare for Vec<T> {
    fn release_spare(&mut self) {
        if is_sparse(self.len(), self.capacity()) {
            self.shrink_to(target(self.len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_given_back_once_it_ends() {
        let mut m: HashMap<i64, [u8; 64]> = HashMap::new();
        for i in 0..10_000 {
            m.insert(i, [0; 64]);
        }
        let peak = m.capacity();
        assert!(peak >= 10_000);
        for i in 0..10_000 {
            m.remove(&i);
            m.release_spare();
        }
        assert!(m.capacity() <= 2 * KEEP, "kept {} of {peak}", m.capacity());
    }

    #[test]
    fn a_size_that_goes_up_and_down_does_not_reallocate_each_time() {
        // Around a steady size, inserting and removing one entry at a time
        // must not shrink (and so regrow) the table.
        let mut m: HashMap<u32, u32> = HashMap::new();
        for i in 0..1_000 {
            m.insert(i, i);
        }
        let cap = m.capacity();
        for round in 0..1_000u32 {
            m.remove(&(round % 1_000));
            m.release_spare();
            m.insert(round % 1_000, round);
            assert_eq!(m.capacity(), cap);
        }
    }

    #[test]
    fn shrinking_is_amortised() {
        // From a peak down to nothing, one removal at a time: the number of
        // shrinks is logarithmic in the peak, not linear.
        let mut d: VecDeque<u64> = (0..100_000).collect();
        let mut shrinks = 0;
        while d.pop_front().is_some() {
            let before = d.capacity();
            d.release_spare();
            shrinks += usize::from(d.capacity() != before);
        }
        assert!(shrinks <= 20, "{shrinks} shrinks");
        assert!(d.capacity() <= KEEP);
    }

    #[test]
    fn small_tables_keep_their_room() {
        let mut v: Vec<u8> = Vec::with_capacity(KEEP);
        v.push(1);
        v.release_spare();
        assert_eq!(v.capacity(), KEEP);
        assert!(!is_sparse(0, KEEP));
        assert!(is_sparse(KEEP / 4, KEEP * 2));
        assert!(!is_sparse(KEEP / 2, KEEP * 2));
    }
}
