//! A bounded map from a key's 64-bit hash to its state, for what the daemon keeps per
//! key in memory (the local buckets): compact, allocation-free on a hit, and never
//! holding more than its capacity.
//!
//! Shards of quick_cache's single-threaded cache (CLOCK-PRO eviction: a new key enters
//! "cold" and is evicted first unless it is asked again; keys asked again become "hot"),
//! each behind its own mutex. The state lives inline in quick_cache's slab (no node or
//! `Arc` per key, no background maintenance), which is what makes it several times
//! smaller and cheaper to insert into than moka (docs/PERFORMANCE.md, "Local buckets").
//! The capacity is split exactly across the shards, so the keys held never exceed it
//! (a shard evicts once its own share is full, possibly a little before the whole map
//! is).

use crate::key::{KeyHash, Prehashed};
use quick_cache::unsync::{Cache, DefaultLifecycle};
use quick_cache::{OptionsBuilder, UnitWeighter};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Shards of a large map: enough that the few worker threads rarely meet on one lock.
const SHARDS: u64 = 16;

/// Items a shard reserves room for up front (beyond that it grows): reserving the whole
/// capacity would cost an idle daemon the hash table's control bytes (1 byte per slot).
const RESERVE_PER_SHARD: u64 = 1 << 16;

/// Share of each shard kept for the hashes of recently evicted keys (CLOCK-PRO's
/// "ghosts": a key asked again soon after its eviction comes back hot). quick_cache's
/// default is 0.5; each ghost costs a slab slot, so a smaller share keeps the bytes per
/// tracked key down at a small cost in hit rate under churn.
const GHOST_ALLOCATION: f64 = 0.25;

type Shard<V> = Cache<KeyHash, V, UnitWeighter, Prehashed, DefaultLifecycle<KeyHash, V>>;

/// At most `capacity` values keyed by a [`KeyHash`], evicting by CLOCK-PRO.
pub struct StateMap<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    capacity: u64,
}

impl<V: Clone + Default> StateMap<V> {
    /// A map holding at most `capacity` (≥ 1) values.
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity.max(1);
        let n = SHARDS.min(capacity);
        let shards = (0..n)
            .map(|i| {
                // Shard i holds ⌊capacity / n⌋, plus one for the first capacity mod n.
                let cap = capacity / n + u64::from(i < capacity % n);
                let options = OptionsBuilder::new()
                    .estimated_items_capacity(cap.min(RESERVE_PER_SHARD) as usize)
                    .weight_capacity(cap)
                    .ghost_allocation(GHOST_ALLOCATION)
                    .build()
                    .expect("valid quick_cache options");
                Mutex::new(Shard::with_options(
                    options,
                    UnitWeighter,
                    Prehashed,
                    DefaultLifecycle::default(),
                ))
            })
            .collect();
        StateMap { shards, capacity }
    }

    /// The shard of `key`: bits 40–55 of the hash, which neither the shard's table index
    /// (low bits) nor its control bytes (top 7 bits) use.
    fn shard(&self, key: KeyHash) -> MutexGuard<'_, Shard<V>> {
        let i = ((key >> 40) & 0xffff) as usize % self.shards.len();
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the value of `key`, inserting `V::default()` first if the key is not
    /// held (which may evict another key). The entry counts as used.
    pub fn with<R>(&self, key: KeyHash, f: impl FnOnce(&mut V) -> R) -> R {
        let mut shard = self.shard(key);
        match shard.get_mut_or_insert_with(&key, || Ok::<_, std::convert::Infallible>(V::default()))
        {
            Ok(Some(mut v)) => f(&mut v),
            // quick_cache refuses only an item heavier than the shard's capacity: never
            // with unit weights and a capacity of at least 1. Decide on a value not kept.
            _ => f(&mut V::default()),
        }
    }

    /// Runs `f` on the value of `key` if held (the entry counts as used).
    pub fn get_mut<R>(&self, key: KeyHash, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut shard = self.shard(key);
        shard.get_mut(&key).map(|mut v| f(&mut v))
    }

    /// Stores `value` for `key` (which may evict another key).
    pub fn insert(&self, key: KeyHash, value: V) {
        self.shard(key).insert(key, value);
    }

    /// Values held now (exact).
    pub fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len() as u64)
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
}
