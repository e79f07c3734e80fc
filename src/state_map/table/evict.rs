//! Which key goes when one must come in: the victim of a full home bucket (worthless
//! first, then by RRIP), or the first slot at 3 under the CLOCK hand (a worthless one
//! close after it preferred). Eviction is where a key could lose a budget it earned, so
//! it is kept apart: a value evicted while it still matters is recorded in the sketch.

use super::bucket::{wrap, Bucket, OCCUPIED, RRPV};
use super::memory::prefetch_lines;
use super::{Table, LOOKAHEAD, WAYS};
use crate::state_map::sketch::Stamp;
use std::mem;

impl<V: Default> Table<V> {
    /// Frees slot `w` of bucket `b` (its value dropped, the slot back to default).
    fn clear(&mut self, b: usize, w: usize) {
        let bucket = &mut self.buckets[b];
        bucket.meta[w] = 0;
        bucket.stamps[w] = Stamp::WORTHLESS;
        drop(mem::take(&mut bucket.values[w]));
        self.len -= 1;
    }

    /// Counts the eviction of `key` with `stamp`, and records it in the sketch if its
    /// value still matters now.
    pub(super) fn forget(&mut self, key: u64, stamp: Stamp) {
        if stamp.matters(self.now) {
            self.sketch.record(key, stamp, self.now);
            self.evicted.used += 1;
        } else {
            self.evicted.fresh += 1;
        }
    }

    /// Evicts the key in slot `w` of bucket `b` (occupied).
    pub(super) fn evict(&mut self, b: usize, w: usize) {
        let bucket = &self.buckets[b];
        self.forget(bucket.keys[w], bucket.stamps[w]);
        self.clear(b, w);
    }

    /// Evicts the victim of full bucket `b`; the slot freed.
    pub(super) fn evict_in(&mut self, b: usize) -> usize {
        let w = self.buckets[b].victim(self.now).unwrap_or(0);
        if self.buckets[b].meta[w] & OCCUPIED != 0 {
            self.evict(b, w);
        }
        w
    }

    /// The first occupied slot worth nothing now among the [`LOOKAHEAD`] after slot
    /// index `from` (bucket × WAYS + way).
    fn worthless_after(&self, from: usize) -> Option<(usize, usize)> {
        let slots = self.slots();
        (1..=LOOKAHEAD.min(slots - 1)).find_map(|j| {
            let i = (from + j) % slots;
            let (b, w) = (i / WAYS, i % WAYS);
            let bucket = &self.buckets[b];
            (bucket.meta[w] & OCCUPIED != 0 && !bucket.stamps[w].matters(self.now))
                .then_some((b, w))
        })
    }

    /// Evicts the first slot at RRIP value 3 under the hand, aging the slots it passes
    /// (a CLOCK sweep: each key is looked at at most four times per eviction cycle);
    /// if that slot's value still matters, a worthless one among the next
    /// [`LOOKAHEAD`] slots goes instead.
    pub(super) fn evict_by_hand(&mut self) {
        if self.len == 0 {
            return;
        }
        let slots = self.slots();
        loop {
            let at = self.hand;
            let (b, w) = (at / WAYS, at % WAYS);
            self.hand = wrap(self.hand + 1, slots);
            let m = &mut self.buckets[b].meta[w];
            if *m & OCCUPIED == 0 {
                continue;
            }
            if *m & RRPV == RRPV {
                let (b, w) = if self.buckets[b].stamps[w].matters(self.now) {
                    self.worthless_after(at).unwrap_or((b, w))
                } else {
                    (b, w)
                };
                self.evict(b, w);
                // The hand moves slowly and evictions come between lookups anywhere
                // else: load the next bucket now, or the next eviction waits on it.
                let next = wrap(b + 1, self.buckets.len());
                prefetch_lines(
                    std::ptr::from_ref(&self.buckets[next]).cast(),
                    mem::size_of::<Bucket<V>>(),
                );
                return;
            }
            *m += 1;
        }
    }
}
