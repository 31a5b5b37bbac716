//! A map that is a short vector while it holds a few entries and a hash
//! map past that. konnectivity-client opens a `ProxyService` stream per
//! tunnel, so a stream's maps almost always hold one entry: a std
//! `HashMap` takes room for four (its smallest table) plus control bytes
//! and its hasher keys, a vector of one takes one entry's room. A stream
//! that carries many connections still gets hashed lookups.

use std::collections::HashMap;
use std::hash::Hash;

/// Entries kept in the vector before the map becomes a hash map.
const FEW: usize = 8;

#[derive(Debug)]
pub(crate) enum SmallMap<K, V> {
    Few(Vec<(K, V)>),
    // Boxed on purpose: the map is then a vector's 24 bytes, where a
    // `HashMap` is 48 inline in every stream's task.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<K, V>>),
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        SmallMap::Few(Vec::new())
    }
}

impl<K: Copy + Eq + Hash, V> SmallMap<K, V> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            SmallMap::Few(v) => v.len(),
            SmallMap::Many(m) => m.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn get(&self, k: &K) -> Option<&V> {
        match self {
            SmallMap::Few(v) => v.iter().find(|(key, _)| key == k).map(|(_, val)| val),
            SmallMap::Many(m) => m.get(k),
        }
    }

    pub(crate) fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        match self {
            SmallMap::Few(v) => v.iter_mut().find(|(key, _)| key == k).map(|(_, val)| val),
            SmallMap::Many(m) => m.get_mut(k),
        }
    }

    pub(crate) fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    /// Inserts `v` at `k`; returns the value it replaced.
    pub(crate) fn insert(&mut self, k: K, v: V) -> Option<V> {
        match self {
            SmallMap::Few(entries) => {
                if let Some((_, old)) = entries.iter_mut().find(|(key, _)| *key == k) {
                    return Some(std::mem::replace(old, v));
                }
                if entries.len() < FEW {
                    if entries.capacity() == 0 {
                        // One entry's room, not the four a push takes.
                        entries.reserve_exact(1);
                    }
                    entries.push((k, v));
                    return None;
                }
                let mut m: HashMap<K, V> = entries.drain(..).collect();
                m.insert(k, v);
                *self = SmallMap::Many(Box::new(m));
                None
            }
            SmallMap::Many(m) => m.insert(k, v),
        }
    }

    /// Removes `k`; the room goes with the last entry.
    pub(crate) fn remove(&mut self, k: &K) -> Option<V> {
        let removed = match self {
            SmallMap::Few(entries) => {
                let i = entries.iter().position(|(key, _)| key == k)?;
                Some(entries.swap_remove(i).1)
            }
            SmallMap::Many(m) => m.remove(k),
        };
        if self.is_empty() {
            *self = SmallMap::default();
        }
        removed
    }

    pub(crate) fn clear(&mut self) {
        *self = SmallMap::default();
    }

    pub(crate) fn keys(&self) -> Vec<K> {
        match self {
            SmallMap::Few(v) => v.iter().map(|(k, _)| *k).collect(),
            SmallMap::Many(m) => m.keys().copied().collect(),
        }
    }

    /// Entries' room the map holds on the heap (for the size tests).
    #[cfg(test)]
    pub(crate) fn heap_entries(&self) -> usize {
        match self {
            SmallMap::Few(v) => v.capacity(),
            SmallMap::Many(m) => m.capacity(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random inserts and removes agree with a `HashMap`, across the
    /// switch to a hash map and back.
    #[test]
    fn agrees_with_a_hash_map() {
        let mut rng = fastrand::Rng::with_seed(7);
        for round in 0..200 {
            let mut small: SmallMap<u64, u64> = SmallMap::new();
            let mut model: HashMap<u64, u64> = HashMap::new();
            let keys = 1 + round % 24;
            for _ in 0..400 {
                let k = rng.u64(0..keys as u64);
                if rng.bool() {
                    let v = rng.u64(..);
                    assert_eq!(small.insert(k, v), model.insert(k, v));
                } else {
                    assert_eq!(small.remove(&k), model.remove(&k));
                }
                assert_eq!(small.len(), model.len());
                assert_eq!(small.get(&k), model.get(&k));
                let mut a = small.keys();
                let mut b: Vec<u64> = model.keys().copied().collect();
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn the_map_is_a_vectors_size() {
        // It sits four times in every Proxy stream's task.
        assert_eq!(std::mem::size_of::<SmallMap<u64, u64>>(), 24);
    }

    #[test]
    fn one_entry_takes_one_entrys_room_and_none_once_gone() {
        let mut m: SmallMap<u64, [u8; 80]> = SmallMap::new();
        m.insert(1, [0; 80]);
        assert_eq!(m.heap_entries(), 1);
        *m.get_mut(&1).unwrap() = [1; 80];
        assert_eq!(m.get(&1).unwrap()[0], 1);
        m.remove(&1);
        assert_eq!(m.heap_entries(), 0);
        for k in 0..20 {
            m.insert(k, [0; 80]);
        }
        assert!(matches!(m, SmallMap::Many(_)));
        for k in 0..20 {
            m.remove(&k);
        }
        assert!(matches!(m, SmallMap::Few(ref v) if v.capacity() == 0));
    }
}
