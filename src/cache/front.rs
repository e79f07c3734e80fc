//! A per-thread memo of fresh deny-cache entries, in front of the moka map.
//!
//! A moka read is the deny cache's whole cost on a hit: the concurrent map's lookup, a
//! clock read, and a read record for its LRU that its housekeeping then applies (about a
//! fifth of the daemon's CPU on a pipelined flood of cached DENYs, docs/perf-log.md).
//! Each runtime thread therefore keeps the last entry it read per slot of a small
//! direct-mapped array, and answers from it while that entry is fresh; moka is read
//! again once per entry per thread per `cache.ttl_ms`.
//!
//! Only a fresh entry is memoized (one past its ttl, its refresh claimed or not, is
//! read from moka), and a memo answers only while that entry is fresh: for its cost,
//! within its ttl (itself at most its `wait_ms`), and in the cache's generation (a
//! reload's clear moves it on, which every memo read checks). So a memo answer is
//! always a DENY Redis gave for that cost within `min(cache.ttl_ms, wait_ms)`, the same
//! promise moka's entries keep; what moka may have done since on another thread
//! (evicted the entry, replaced it with a newer DENY or another cost's, or dropped it
//! for a refresh's ALLOW racing with a newer DENY) does not end a memo early: more
//! DENYs of that kind, never an admission. Nor do memo answers tell moka's LRU that the
//! key was read: a full cache may evict it first.
//!
//! Memory: 80 bytes per slot, 320 kB per runtime thread that decided from the cache.

use super::CachedDeny;
use crate::key::KeyHash;
use std::cell::RefCell;

/// Slots per thread (a power of two): 4,096 × 80 bytes = 320 kB, allocated on the
/// thread's first memoized entry.
const SLOTS: usize = 4096;

#[derive(Clone, Copy)]
struct Memo {
    /// The [`super::DenyCache`] the entry is from.
    owner: u64,
    key: KeyHash,
    entry: CachedDeny,
}

thread_local! {
    static MEMO: RefCell<Vec<Option<Memo>>> = const { RefCell::new(Vec::new()) };
}

/// A new owner id, unique in this process.
pub(super) fn new_owner() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn slot_of(key: KeyHash) -> usize {
    // The key is a well-mixed hash: its low bits spread keys evenly.
    key as usize & (SLOTS - 1)
}

/// The entry this thread memoized for `key` of `owner`'s cache, if any (fresh or not:
/// the caller checks).
pub(super) fn get(owner: u64, key: KeyHash) -> Option<CachedDeny> {
    MEMO.with(|memo| {
        let memo = memo.borrow();
        match memo.get(slot_of(key)) {
            Some(Some(s)) if s.owner == owner && s.key == key => Some(s.entry),
            _ => None,
        }
    })
}

/// Memoizes `entry` for `key` of `owner`'s cache on this thread (replacing what its slot
/// held).
pub(super) fn put(owner: u64, key: KeyHash, entry: CachedDeny) {
    MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        if memo.is_empty() {
            memo.resize(SLOTS, None);
        }
        memo[slot_of(key)] = Some(Memo { owner, key, entry });
    })
}

/// Forgets this thread's memo of `key` of `owner`'s cache.
pub(super) fn forget(owner: u64, key: KeyHash) {
    MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        if let Some(slot) = memo.get_mut(slot_of(key)) {
            if slot.is_some_and(|s| s.owner == owner && s.key == key) {
                *slot = None;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_80_bytes_and_owners_keep_apart() {
        assert_eq!(std::mem::size_of::<Option<Memo>>(), 80);
        let (a, b) = (new_owner(), new_owner());
        assert_ne!(a, b);
        assert!(get(a, 7).is_none());
    }
}
