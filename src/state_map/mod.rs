//! A bounded map from a key's 64-bit hash to its state, for what the daemon keeps per
//! key in memory (the local buckets): compact, allocation-free on a hit, and never
//! holding more than its capacity.
//!
//! Shards of our own set-associative table ([`table`]: a lookup reads one 64-byte line of
//! keys, the value lies next to it; RRIP eviction, a 2-bit CLOCK), each behind its own
//! mutex. A general map (quick_cache, hashbrown) costs three dependent cache misses per
//! lookup once it outgrows the CPU caches, half the daemon's time at 10⁶ keys
//! (docs/perf-log.md, "Local buckets"). The capacity is split exactly across the
//! shards, so the keys held never exceed it (a shard evicts once its own share is full,
//! possibly a little before the whole map is); each shard starts small and grows with
//! the keys it holds.
//!
//! Eviction never hands a key a budget it did not earn: each value carries a [`Stamp`]
//! (when it becomes worth nothing, how drained it is), values worth nothing go first,
//! and a value evicted while it still matters is recorded in a fixed-size sketch
//! ([`sketch`]: 4 rows × 65,536 cells of 8 bytes over all shards, 2 MiB, allocated at
//! the first such eviction), which a key coming back is handed ([`Slot::recorded`]).

mod sketch;
mod table;

pub use sketch::{ticks_ceil, ticks_floor, ticks_to_us, Stamp, ROWS, TICKS_PER_S};
pub use table::{Evicted, Slot};

use crate::key::KeyHash;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use table::Table;

/// Shards of a large map: enough that the few worker threads rarely meet on one lock.
const SHARDS: u64 = 16;

/// Cells per row of the eviction sketch, over all shards (each shard has its part).
pub const SKETCH_WIDTH: usize = 65_536;

/// A shard's table past this size (bytes) no longer fits in a core's L2 cache (1–2 MB
/// on current x86-64 servers, shared with everything else the daemon touches): from
/// then on a lookup waits on memory and [`StateMap::prefetch`] pays for itself.
const CACHED_SHARD_BYTES: usize = 256 << 10;

/// At most `capacity` values keyed by a [`KeyHash`], evicting by RRIP (a 2-bit CLOCK).
pub struct StateMap<V> {
    shards: Box<[Shard<V>]>,
    capacity: u64,
    /// Some shard's table has grown past [`CACHED_SHARD_BYTES`] (never reset).
    large: AtomicBool,
}

/// One shard: its table, and where the table's buckets lie, readable without the lock
/// (for [`StateMap::prefetch`]; updated under the lock when the table grows).
struct Shard<V> {
    table: Mutex<Table<V>>,
    base: AtomicPtr<u8>,
    buckets: AtomicUsize,
}

impl<V: Default> Shard<V> {
    fn new(share: usize, sketch_width: usize) -> Self {
        let table = Table::new(share, sketch_width);
        let (base, n) = table.place_of_buckets();
        Shard {
            table: Mutex::new(table),
            base: AtomicPtr::new(base.cast_mut()),
            buckets: AtomicUsize::new(n),
        }
    }

    /// Publishes where `table` (this shard's, locked) keeps its buckets, if it moved;
    /// sets `large` once the table is past [`CACHED_SHARD_BYTES`].
    fn publish(&self, table: &Table<V>, large: &AtomicBool) {
        let (base, n) = table.place_of_buckets();
        if self.buckets.load(Ordering::Relaxed) != n {
            self.base.store(base.cast_mut(), Ordering::Relaxed);
            self.buckets.store(n, Ordering::Relaxed);
            if table.bytes() > CACHED_SHARD_BYTES {
                large.store(true, Ordering::Relaxed);
            }
        }
    }
}

impl<V: Clone + Default> StateMap<V> {
    /// A map holding at most `capacity` (≥ 1) values.
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity.max(1);
        let n = SHARDS.min(capacity);
        let shards = (0..n)
            .map(|i| {
                // Shard i holds ⌊capacity / n⌋, plus one for the first capacity mod n.
                let share = capacity / n + u64::from(i < capacity % n);
                Shard::new(
                    usize::try_from(share).unwrap_or(usize::MAX),
                    SKETCH_WIDTH / n as usize,
                )
            })
            .collect();
        StateMap {
            shards,
            capacity,
            large: AtomicBool::new(false),
        }
    }

    /// The shard index of `key`: bits 40–55 of the hash, which the shard's table (its
    /// low 32 bits) does not use.
    fn index(&self, key: KeyHash) -> usize {
        ((key >> 40) & 0xffff) as usize % self.shards.len()
    }

    /// The table of `key`'s shard, locked.
    fn shard(&self, key: KeyHash) -> MutexGuard<'_, Table<V>> {
        self.shards[self.index(key)]
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the value of `key`, inserting `V::default()` first if the key is not
    /// held (which may evict another key). The entry counts as used. For values whose
    /// owner keeps no account of their worth ([`Stamp::WORTHLESS`]: eviction by RRIP
    /// alone, nothing recorded).
    pub fn with<R>(&self, key: KeyHash, f: impl FnOnce(&mut V) -> R) -> R {
        self.with_slot(key, 0.0, |slot| f(slot.value))
    }

    /// Runs `f` on the slot of `key` at `now_us` (µs on the owner's clock, which must
    /// never go back), inserting `V::default()` first if the key is
    /// not held: then another key may be evicted (one worth nothing first), and the
    /// slot carries what the map recorded of this key if it was evicted while it
    /// still mattered. `f` sets the slot's stamp after writing its value. The entry
    /// counts as used.
    pub fn with_slot<R>(&self, key: KeyHash, now_us: f64, f: impl FnOnce(Slot<'_, V>) -> R) -> R {
        let shard = &self.shards[self.index(key)];
        let mut table = shard.table.lock().unwrap_or_else(PoisonError::into_inner);
        let r = f(table.entry(key, now_us));
        shard.publish(&table, &self.large);
        r
    }

    /// Starts loading the memory that deciding `key` will read (its home bucket's keys
    /// and values) without taking the lock, so that the lookups of a batch of
    /// requests wait on memory together instead of one after another. A hint: it changes
    /// nothing and costs a few ns.
    pub fn prefetch(&self, key: KeyHash) {
        let shard = &self.shards[self.index(key)];
        let n = shard.buckets.load(Ordering::Relaxed);
        table::prefetch::<V>(shard.base.load(Ordering::Relaxed), n, key);
    }

    /// Runs `f` on the value of `key` if held (the entry counts as used).
    pub fn get_mut<R>(&self, key: KeyHash, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        self.shard(key).get_mut(key).map(f)
    }

    /// Stores `value` for `key` (which may evict another key).
    pub fn insert(&self, key: KeyHash, value: V) {
        let shard = &self.shards[self.index(key)];
        let mut table = shard.table.lock().unwrap_or_else(PoisonError::into_inner);
        *table.entry(key, 0.0).value = value;
        shard.publish(&table, &self.large);
    }

    /// Whether a shard's table has outgrown a core's L2 cache, so that a lookup waits on
    /// memory unless prefetched.
    pub fn outgrew_caches(&self) -> bool {
        self.large.load(Ordering::Relaxed)
    }

    /// Values held now (exact).
    pub fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.table.lock().unwrap_or_else(PoisonError::into_inner).len() as u64)
            .sum()
    }

    /// Bytes of the eviction sketch allocated (0 until a value is evicted while it
    /// still matters).
    pub fn sketch_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.table
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .sketch_bytes()
            })
            .sum()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most values held at once.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Well-spread keys, as [`crate::key::TagKey`] makes them.
    fn key(i: u64) -> KeyHash {
        use std::hash::BuildHasher;
        foldhash::fast::FixedState::with_seed(7).hash_one(i)
    }

    #[test]
    fn never_holds_more_than_its_capacity() {
        for cap in [1, 5, 16, 17, 1000, 4099] {
            let m: StateMap<Option<u64>> = StateMap::new(cap);
            for i in 0..cap * 10 {
                // A prefetch is a hint: harmless before and after every growth.
                m.prefetch(key(i));
                m.with(key(i), |v| *v = Some(i));
                assert!(m.len() <= cap, "cap {cap}: {} held", m.len());
            }
            // Every shard fills up to its share: the whole capacity is used.
            assert!(m.len() * 10 >= cap * 9, "cap {cap}: only {} held", m.len());
        }
    }

    #[test]
    fn a_key_used_again_survives_a_flood_of_new_keys() {
        let m: StateMap<Option<u64>> = StateMap::new(1000);
        let hot = key(u64::MAX);
        m.with(hot, |v| *v = Some(42));
        for i in 0..100_000 {
            m.with(key(i), |v| *v = Some(i));
            if i % 100 == 0 {
                assert_eq!(m.get_mut(hot, |v| *v), Some(Some(42)), "evicted at {i}");
            }
        }
    }

    #[test]
    fn insert_replaces_and_with_sees_it() {
        let m: StateMap<Option<u64>> = StateMap::new(10);
        assert_eq!(m.get_mut(1, |v| *v), None);
        m.insert(1, Some(3));
        m.insert(1, Some(4));
        assert_eq!(m.with(1, |v| v.take()), Some(4));
        assert_eq!(m.len(), 1);
        assert!(!m.is_empty());
        assert_eq!(m.capacity(), 10);
    }

    #[test]
    fn a_map_says_when_it_outgrew_the_caches() {
        let m: StateMap<[u64; 4]> = StateMap::new(1_000_000);
        assert!(!m.outgrew_caches(), "an empty map is small");
        for i in 0..20_000 {
            m.with(key(i), |v| v[0] = i);
        }
        assert!(!m.outgrew_caches(), "20,000 keys fit in 16 × 256 kB");
        for i in 0..200_000 {
            m.with(key(i), |v| v[0] = i);
        }
        assert!(m.outgrew_caches());
    }

    proptest::proptest! {
        /// Against a model (a `HashMap` of every value written, never evicting): a key
        /// held has the value last written for it, a key not held was evicted (it
        /// starts again from the default), and the keys held never exceed the capacity.
        #[test]
        fn agrees_with_a_model_and_holds_at_most_its_capacity(
            cap in 1u64..80,
            ops in proptest::collection::vec((0u8..3, 0u64..120, 0u64..1000), 1..600),
        ) {
            let m: StateMap<Option<u64>> = StateMap::new(cap);
            let mut model = std::collections::HashMap::new();
            for (op, k, v) in ops {
                let k = key(k);
                match op {
                    0 => {
                        let seen = m.with(k, |slot| slot.replace(v));
                        proptest::prop_assert!(seen.is_none() || seen == model.get(&k).copied());
                        model.insert(k, v);
                    }
                    1 => {
                        if let Some(seen) = m.get_mut(k, |slot| *slot) {
                            proptest::prop_assert_eq!(seen, model.get(&k).copied());
                        }
                    }
                    _ => {
                        m.insert(k, Some(v));
                        model.insert(k, v);
                    }
                }
                proptest::prop_assert!(m.len() <= cap);
                let held = model.keys().filter(|&&k| m.get_mut(k, |_| ()).is_some()).count();
                proptest::prop_assert_eq!(held as u64, m.len());
            }
        }
    }
}
