//! [`Budgeted`]: what the manager keeps of what it read or wrote (inputs Secrets, states,
//! bootstrap data), within a bound of bytes and of entries, the least lately kept or used
//! going first.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Values by key, each counted as the bytes its keeper says, at most `max_bytes` and
/// `max_entries` in all. Past either bound, the entry kept or used ([`Budgeted::touch`])
/// least lately goes first; one larger than `max_bytes` alone is not kept. Not
/// synchronised: its keeper holds it under its own lock.
pub struct Budgeted<K, V> {
    entries: HashMap<K, Entry<V>>,
    /// The keys by when they were last kept or used, least lately first.
    order: BTreeMap<u64, K>,
    bytes: usize,
    clock: u64,
    max_bytes: usize,
    max_entries: usize,
}

struct Entry<V> {
    value: V,
    bytes: usize,
    at: u64,
}

impl<K: Hash + Eq + Clone, V> Budgeted<K, V> {
    /// An empty store of at most `max_bytes` bytes and `max_entries` entries.
    pub fn new(max_bytes: usize, max_entries: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            bytes: 0,
            clock: 0,
            max_bytes,
            max_entries,
        }
    }

    fn stamp(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Keeps `value` under `key`, counted as `bytes`, in place of what was kept under it;
    /// then drops the least lately kept or used others until both bounds hold. False, and
    /// nothing kept under `key` any more, when `bytes` alone is over the bound.
    pub fn insert(&mut self, key: K, value: V, bytes: usize) -> bool {
        self.remove(&key);
        if bytes > self.max_bytes || self.max_entries == 0 {
            return false;
        }
        while self.bytes + bytes > self.max_bytes || self.entries.len() >= self.max_entries {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.bytes -= e.bytes;
            }
        }
        let at = self.stamp();
        self.bytes += bytes;
        self.order.insert(at, key.clone());
        self.entries.insert(key, Entry { value, bytes, at });
        true
    }

    /// The value kept under `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|e| &e.value)
    }

    /// The value kept under `key`, marked as used now: it goes after every other.
    pub fn touch(&mut self, key: &K) -> Option<&V> {
        let at = self.stamp();
        let e = self.entries.get_mut(key)?;
        let key = self.order.remove(&e.at)?;
        e.at = at;
        self.order.insert(at, key);
        Some(&e.value)
    }

    /// Takes the value kept under `key` out.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let e = self.entries.remove(key)?;
        self.bytes -= e.bytes;
        self.order.remove(&e.at);
        Some(e.value)
    }

    /// Keeps only the entries `keep` says to.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        let (order, bytes) = (&mut self.order, &mut self.bytes);
        self.entries.retain(|k, e| {
            let kept = keep(k, &e.value);
            if !kept {
                *bytes -= e.bytes;
                order.remove(&e.at);
            }
            kept
        });
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.bytes = 0;
    }

    /// The values kept.
    #[cfg(test)]
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.values().map(|e| &e.value)
    }

    /// How many entries are kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is kept.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bytes kept, as counted.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_lately_kept_or_used_go_first_past_either_bound() {
        let mut b = Budgeted::new(100, 3);
        assert!(b.insert("a", 1, 40));
        assert!(b.insert("b", 2, 40));
        // Past the bytes: "a" goes.
        assert!(b.insert("c", 3, 40));
        assert_eq!((b.get(&"a"), b.len(), b.bytes()), (None, 2, 80));
        // "b" used: "c" is now the least lately used, and goes for "d".
        assert_eq!(b.touch(&"b"), Some(&2));
        assert!(b.insert("d", 4, 40));
        assert_eq!(
            (b.get(&"b"), b.get(&"c"), b.get(&"d")),
            (Some(&2), None, Some(&4))
        );
        // Past the count: three small ones at most.
        assert!(b.insert("e", 5, 1));
        assert!(b.insert("f", 6, 1));
        assert_eq!(b.len(), 3);
        assert_eq!(b.get(&"b"), None, "the least lately used of four");
        assert_eq!(b.bytes(), 42);
    }

    #[test]
    fn a_value_kept_again_counts_once_and_one_over_the_bound_is_not_kept() {
        let mut b = Budgeted::new(100, 10);
        assert!(b.insert("a", 1, 60));
        assert!(b.insert("a", 2, 70));
        assert_eq!((b.get(&"a"), b.len(), b.bytes()), (Some(&2), 1, 70));
        assert!(!b.insert("a", 3, 101));
        assert!(
            b.is_empty() && b.bytes() == 0,
            "the earlier value is not served either"
        );
        assert!(b.insert("b", 4, 100));
        assert_eq!(b.remove(&"b"), Some(4));
        assert_eq!((b.remove(&"b"), b.bytes()), (None, 0));
    }

    #[test]
    fn retain_and_clear_keep_the_count_of_bytes() {
        let mut b = Budgeted::new(100, 10);
        for (k, v) in [("a", 1), ("b", 2), ("c", 3)] {
            b.insert(k, v, 10 * v);
        }
        b.retain(|_, v| *v != 2);
        assert_eq!((b.len(), b.bytes()), (2, 40));
        // What retain dropped is out of the order too: two more fit without evicting.
        b.insert("d", 4, 30);
        b.insert("e", 5, 30);
        assert_eq!((b.len(), b.bytes()), (4, 100));
        b.clear();
        assert_eq!((b.len(), b.bytes()), (0, 0));
        assert!(b.insert("f", 6, 100));
    }
}
