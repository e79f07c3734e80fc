//! Pages of deny-cache entries: several keys' DENYs in one moka entry.
//!
//! moka's own bookkeeping per entry (its hash-table slot, the entry's `Arc`, its node in
//! the access-order deque and its counters) is about 300 bytes whatever the value
//! (docs/perf-log.md, "Memory per tracked key"), four times the 80 bytes a DENY needs.
//! So the deny cache keys moka by a *page*: a fixed share of the 64-bit key space, one
//! page per [`KEYS_PER_PAGE`] entries of `cache.max_entries`, whose value is the
//! immutable slice of the DENYs its keys hold. moka weighs each page by its slot count,
//! so `cache.max_entries` still counts DENYs; a full cache evicts the least recently
//! used page, a few DENYs at once. A write copies the page (a new slice, the old one
//! dropped when its last reader is done), inside moka's per-key lock so that two writes
//! to one page never lose each other's slots, and drops the slots that can no longer
//! answer on the way.

use super::CachedDeny;
use crate::key::KeyHash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Mean DENYs per page in a full cache (pages = `max_entries` ÷ this, rounded up): moka's
/// ~300 bytes a page spread over 8 keys, next to each key's 80-byte slot. Measured
/// (`cargo run --release -p ratelimitd-tools --bin keymem -- deny - 1000000`): 153–159
/// bytes per DENY held with 8, 194 with 4, 386 with one moka entry per DENY. More keys per page would save less
/// and cost longer scans and copies.
pub(super) const KEYS_PER_PAGE: u64 = 8;

/// The most slots one page holds: beyond it a write drops the oldest slot. With keys
/// spread uniformly (a keyed hash) a page of a full cache holds 8 on average and more
/// than 24 with probability ~10⁻⁶; the cap only bounds the copy a write makes.
pub(super) const MAX_SLOTS: usize = 32;

/// One key's DENY in a page.
#[derive(Debug)]
pub(super) struct PageSlot {
    pub key: KeyHash,
    pub entry: CachedDeny,
    /// Set by the one request that claims the refresh of the expired entry: the page is
    /// shared, read-only otherwise, so the claim is a flag flipped once, not a write to
    /// moka. A copy of the page (another key's write) carries it over.
    pub claimed: AtomicBool,
}

impl PageSlot {
    /// `entry` under `key`, not claimed.
    pub fn new(key: KeyHash, entry: CachedDeny) -> Self {
        PageSlot {
            key,
            entry,
            claimed: AtomicBool::new(false),
        }
    }
}

impl Clone for PageSlot {
    fn clone(&self) -> Self {
        PageSlot {
            key: self.key,
            entry: self.entry,
            claimed: AtomicBool::new(self.claimed.load(Ordering::Acquire)),
        }
    }
}

/// A page's value in moka: its slots, in no particular order, at most one per key.
pub(super) type Page = Arc<[PageSlot]>;

/// Which page of `pages` (≥ 1) holds `key`: the key's high bits scaled to the page
/// count (multiply-shift, uniform because the key is a well-mixed hash), spread again
/// over 64 bits (an odd multiplier, a bijection) because moka hashes keys with
/// [`crate::key::Prehashed`], which takes the key as its own hash.
pub(super) fn page_of(key: KeyHash, pages: u64) -> u64 {
    let page = ((u128::from(key) * u128::from(pages)) >> 64) as u64;
    page.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The entry `page` holds for `key`.
pub(super) fn find(page: &[PageSlot], key: KeyHash) -> Option<CachedDeny> {
    slot(page, key).map(|s| s.entry)
}

/// The slot `page` holds for `key`.
pub(super) fn slot(page: &[PageSlot], key: KeyHash) -> Option<&PageSlot> {
    page.iter().find(|s| s.key == key)
}

/// A copy of `page` (none: an empty one) with `entry` as `key`'s slot, in place of the
/// key's old slot, without the slots `dead` says can no longer answer, and without the
/// oldest slot when that would still leave more than `max_slots` (at least 1, at most
/// [`MAX_SLOTS`]).
pub(super) fn with(
    page: Option<&[PageSlot]>,
    key: KeyHash,
    entry: CachedDeny,
    max_slots: usize,
    dead: impl Fn(&CachedDeny) -> bool,
) -> Page {
    let page = page.unwrap_or_default();
    // The indices of the slots kept (a page never holds more than MAX_SLOTS), so that
    // the new slice is built in one allocation of its exact size.
    let mut keep = [0u8; MAX_SLOTS];
    let mut n = 0;
    for (i, s) in page.iter().enumerate().take(MAX_SLOTS) {
        if s.key != key && !dead(&s.entry) {
            keep[n] = i as u8;
            n += 1;
        }
    }
    while n >= max_slots.clamp(1, MAX_SLOTS) {
        let at = |j: usize| page[usize::from(keep[j])].entry.at_us;
        let oldest = (0..n).min_by(|&a, &b| at(a).total_cmp(&at(b))).unwrap_or(0);
        keep.copy_within(oldest + 1..n, oldest);
        n -= 1;
    }
    keep[..n]
        .iter()
        .map(|&i| page[usize::from(i)].clone())
        .chain(std::iter::once(PageSlot::new(key, entry)))
        .collect()
}

/// A copy of `page` without `key`'s slot, or `None` when nothing would be left.
pub(super) fn without(page: &[PageSlot], key: KeyHash) -> Option<Page> {
    let slots: Vec<PageSlot> = page.iter().filter(|s| s.key != key).cloned().collect();
    (!slots.is_empty()).then(|| slots.into())
}

/// A page's weight in moka: its slot count, so that moka's capacity counts DENYs.
pub(super) fn weight(page: &Page) -> u32 {
    page.len() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{Decision, Source};

    fn entry(at_us: f64) -> CachedDeny {
        CachedDeny {
            decision: Decision {
                allowed: false,
                limit: 10,
                remaining: 0,
                reset_ms: 1000,
                wait_ms: 500,
                source: Source::Redis,
            },
            cost: 1,
            at_us,
            ttl_us: 500_000.0,
            generation: 0,
        }
    }

    #[test]
    fn a_slot_is_80_bytes() {
        assert_eq!(std::mem::size_of::<PageSlot>(), 80);
    }

    #[test]
    fn pages_split_the_key_space_evenly_and_stay_distinct() {
        let pages = 1000;
        let mut seen = std::collections::HashMap::new();
        for i in 0..pages {
            // The lowest key of each page's share.
            let key = ((u128::from(i) << 64).div_ceil(u128::from(pages))) as u64;
            *seen.entry(page_of(key, pages)).or_insert(0) += 1;
            // The key just below starts in the page before (the last one for key 0).
            assert_ne!(page_of(key.wrapping_sub(1), pages), page_of(key, pages));
            assert_eq!(page_of(key.wrapping_add(1), pages), page_of(key, pages));
        }
        assert_eq!(seen.len(), pages as usize, "two shares map to one page");
        assert_eq!(page_of(u64::MAX, 1), page_of(0, 1));
    }

    #[test]
    fn a_write_replaces_the_keys_slot_and_keeps_the_others() {
        let p = with(None, 1, entry(1.0), 8, |_| false);
        let p = with(Some(&p), 2, entry(2.0), 8, |_| false);
        let p = with(Some(&p), 1, entry(3.0), 8, |_| false);
        assert_eq!(p.len(), 2);
        assert_eq!(find(&p, 1).map(|e| e.at_us), Some(3.0));
        assert_eq!(find(&p, 2).map(|e| e.at_us), Some(2.0));
        assert!(find(&p, 3).is_none());
        let p = without(&p, 1).expect("key 2 is left");
        assert!(find(&p, 1).is_none() && find(&p, 2).is_some());
        assert!(without(&p, 2).is_none());
    }

    #[test]
    fn a_write_drops_dead_slots_and_the_oldest_beyond_the_cap() {
        let mut p = with(None, 10, entry(10.0), 3, |_| false);
        for k in 11..13 {
            p = with(Some(&p), k, entry(k as f64), 3, |_| false);
        }
        // Full: the next write drops the oldest (key 10).
        let p = with(Some(&p), 20, entry(20.0), 3, |_| false);
        let mut keys: Vec<_> = p.iter().map(|s| s.key).collect();
        keys.sort_unstable();
        assert_eq!(keys, [11, 12, 20]);
        // Slots that can no longer answer go on the next write.
        let p = with(Some(&p), 30, entry(30.0), 3, |e| e.at_us < 15.0);
        let mut keys: Vec<_> = p.iter().map(|s| s.key).collect();
        keys.sort_unstable();
        assert_eq!(keys, [20, 30]);
        // A cap of 0 still keeps the key written.
        assert_eq!(with(Some(&p), 40, entry(40.0), 0, |_| false).len(), 1);
    }
}
