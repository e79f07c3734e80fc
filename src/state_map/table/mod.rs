//! One shard of [`super::StateMap`]: a set-associative table of per-key state in which
//! finding a key costs one cache miss, not three.
//!
//! A general hash map keeps its control bytes, its index and its entries apart
//! (hashbrown's control group, then quick_cache's slab index, then the slab entry for
//! the key compare): three dependent cache misses per lookup once the map outgrows the
//! CPU caches, which was half the daemon's time with 10⁶ keys held
//! (docs/perf-log.md, "Local buckets"). Here a key's home bucket is one aligned block:
//! the keys and their metadata in its first 64-byte line, the values in the lines right
//! after it, so the key compare reads one line and the value is next to it.
//!
//! The design is that of a CPU cache, bucketized:
//! - **Buckets of [`WAYS`] slots**, the home bucket from the low 32 bits of the key
//!   (already a well-mixed hash) by multiply-shift (Lemire, "Fast random integer
//!   generation in an interval", 2019), so the table need not be a power of two. A key
//!   whose home bucket is full takes a free slot in one of the next [`PROBE_LIMIT`]
//!   buckets (bucketized linear probing); the home bucket records how far its keys went,
//!   so a lookup reads exactly those buckets (usually one).
//! - **Eviction by RRIP** (re-reference interval prediction: Jaleel, Theobald, Steely,
//!   Emer, "High Performance Cache Replacement Using Re-Reference Interval Prediction",
//!   ISCA 2010), a 2-bit CLOCK: a slot's value 0 means used recently, 3 means evict
//!   first; a use sets 0, a new key enters at 2 (so a flood of keys used once evicts
//!   itself before the keys used again), and aging adds one. A new key whose home bucket
//!   is full evicts within it; a new key when the table holds its whole share evicts
//!   the first slot at 3 under a hand sweeping the table (aging what it passes), so
//!   buckets keep their room to vary: a working set as large as the share, spread over
//!   the buckets unlike the keys that filled the table, is then 91 % held (evicting in
//!   the home bucket instead froze each bucket at its count when the share filled: 78 %;
//!   `buckets_keep_room_to_vary_once_the_share_is_held`).
//! - **What is worth nothing goes first**: each slot carries its value's [`Stamp`],
//!   set by the value's owner at each write (when the value becomes equal to a new
//!   key's, and how drained it is). A victim is chosen among the slots whose value is
//!   worth nothing now before the others (in the home bucket: worthless first, then by
//!   RRIP; under the hand: a slot at 3 that still matters gives way to a worthless one
//!   among the next [`LOOKAHEAD`] slots). Evicting those loses nothing. A value evicted
//!   while it still matters is recorded in the shard's [`Sketch`], and a new key that
//!   finds a record there is handed it ([`Slot::recorded`]), so its owner can restart it
//!   no fuller than it left. Values whose owner keeps no account
//!   ([`Stamp::WORTHLESS`]) are evicted by RRIP alone, as before.
//! - **Growth**: the table starts small and doubles (rehashing) when it passes
//!   [`LOAD`] or when a key finds no free slot within reach, up to the size where its
//!   share fills it to [`LOAD`] (straight to it once doubling would come within 3/2 of
//!   it: the last step is never a small one); only there does a full bucket evict below
//!   the share.

mod bucket;
mod evict;
mod memory;
#[cfg(test)]
mod tests;

pub use memory::prefetch;

use super::sketch::{ticks_floor, Sketch, Stamp};
use bucket::{free_near, home, wrap, Bucket, OCCUPIED, RRPV_NEW};
use memory::new_buckets;
use std::mem;

/// Slots per bucket: 6 keys (48 bytes) and their metadata fill the bucket's first
/// 64-byte line; with a 32-byte value (a local bucket's state) the values fill the next
/// three lines and the stamps most of a fifth, a 320-byte bucket.
pub const WAYS: usize = 6;

/// Slots after the hand in which a worthless value is looked for before the hand
/// evicts a value that still matters (four buckets).
pub const LOOKAHEAD: usize = 4 * WAYS;

/// Buckets after its home bucket in which a key may be placed (so a lookup reads at
/// most `1 + PROBE_LIMIT` buckets; at [`LOAD`] almost always 1 or 2).
pub const PROBE_LIMIT: usize = 8;

/// Highest fill of a table (keys ÷ slots) as a fraction: past it the table doubles,
/// and the largest table is the one its share fills to it. 4/5 keeps the bytes per key
/// near `256 ÷ 6 ÷ 0.8 ≈ 53` while buckets rarely overflow.
pub const LOAD: (usize, usize) = (4, 5);

/// Buckets of a new table (per shard: 16 shards × 4 × 256 bytes = 16 kB for an idle map).
const INITIAL_BUCKETS: usize = 4;

/// Evictions made by one [`Table::entry`]: of values worth nothing, and of values
/// that still mattered (recorded in the sketch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Values equal to a new key's (no record needed).
    pub fresh: u32,
    /// Values that still mattered.
    pub used: u32,
}

/// A key's slot, as [`Table::entry`] found or made it.
pub struct Slot<'a, V> {
    /// The value (`V::default()` for a key just inserted).
    pub value: &'a mut V,
    /// The value's stamp: the owner sets it after each write ([`Stamp::WORTHLESS`]
    /// for a key just inserted).
    pub stamp: &'a mut Stamp,
    /// The evictions that made room for it.
    pub evicted: Evicted,
    /// The key was just inserted.
    pub new: bool,
    key: u64,
    now: u64,
    sketch: &'a Sketch,
}

impl<V> Slot<'_, V> {
    /// For a key just inserted, of kind `tag`: what the sketch recorded of it when it
    /// was evicted while it still mattered (or a false positive's record: an upper bound
    /// either way). `None` for a key that was held.
    pub fn recorded(&self, tag: u8) -> Option<Stamp> {
        if self.new {
            self.sketch.lookup(self.key, tag, self.now)
        } else {
            None
        }
    }
}

/// A bounded table of at most `share` values keyed by a 64-bit hash.
pub struct Table<V> {
    buckets: Box<[Bucket<V>]>,
    /// Values held.
    len: usize,
    /// The most values held at once.
    share: usize,
    /// The largest table: `share` fills it to [`LOAD`].
    max_buckets: usize,
    /// The eviction hand: the next slot (bucket × WAYS + way) it looks at.
    hand: usize,
    /// What this shard evicted while it still mattered.
    sketch: Sketch,
    /// The tick of the operation under way (what "worth nothing now" is measured at).
    now: u64,
    /// Evictions of the operation under way.
    evicted: Evicted,
}

impl<V: Default> Table<V> {
    /// An empty table for at most `share` (≥ 1) values, small until it fills, with a
    /// sketch of `sketch_width` cells per row for the values it evicts.
    pub fn new(share: usize, sketch_width: usize) -> Self {
        let share = share.max(1);
        let max_buckets = (share * LOAD.1).div_ceil(LOAD.0 * WAYS).max(1);
        Table {
            buckets: new_buckets(INITIAL_BUCKETS.min(max_buckets)),
            len: 0,
            share,
            max_buckets,
            hand: 0,
            sketch: Sketch::new(sketch_width),
            now: 0,
            evicted: Evicted::default(),
        }
    }

    /// Values held now.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes of the buckets allocated now.
    pub fn bytes(&self) -> usize {
        mem::size_of_val(&*self.buckets)
    }

    /// Slots allocated now (for tests and sizing).
    pub fn slots(&self) -> usize {
        self.buckets.len() * WAYS
    }

    /// Where the buckets lie now and how many there are, for [`prefetch`] (the address
    /// changes only when the table grows).
    pub fn place_of_buckets(&self) -> (*const u8, usize) {
        (self.buckets.as_ptr().cast(), self.buckets.len())
    }

    /// The value of `key` if held, marked as used.
    pub fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        let (b, w) = self.find(key)?;
        let bucket = &mut self.buckets[b];
        bucket.meta[w] = OCCUPIED;
        Some(&mut bucket.values[w])
    }

    /// The slot of `key` at `now_us` (µs on the owner's clock, which must never go
    /// back), `V::default()` inserted first if not held (which may evict another key,
    /// worthless ones first); marked as used.
    pub fn entry(&mut self, key: u64, now_us: f64) -> Slot<'_, V> {
        let (b, w, new) = match self.find(key) {
            Some((b, w)) => {
                self.buckets[b].meta[w] = OCCUPIED;
                (b, w, false)
            }
            None => {
                // Only an insert needs the time (what is worth nothing now).
                self.now = ticks_floor(now_us);
                let (b, w) = self.insert_new(key);
                (b, w, true)
            }
        };
        let now = self.now;
        let evicted = mem::take(&mut self.evicted);
        let bucket = &mut self.buckets[b];
        Slot {
            value: &mut bucket.values[w],
            stamp: &mut bucket.stamps[w],
            evicted,
            new,
            key,
            now,
            sketch: &self.sketch,
        }
    }

    /// Bytes of the sketch (0 until a value is evicted while it still matters).
    pub fn sketch_bytes(&self) -> usize {
        self.sketch.bytes()
    }

    /// The bucket and slot of `key`.
    fn find(&self, key: u64) -> Option<(usize, usize)> {
        let n = self.buckets.len();
        let h = home(key, n);
        let probe = usize::from(self.buckets[h].probe);
        (0..=probe).find_map(|j| {
            let b = wrap(h + j, n);
            self.buckets[b].find(key).map(|w| (b, w))
        })
    }

    /// Places `key` (not held), evicting or growing first as needed; its slot.
    fn insert_new(&mut self, key: u64) -> (usize, usize) {
        loop {
            let n = self.buckets.len();
            let h = home(key, n);
            if self.len >= self.share {
                // The whole share is held: one key goes before one comes in, under the
                // hand if its home bucket has room, else that bucket's victim (not a
                // free slot further on: lookups would then read ever more buckets).
                let w = match self.buckets[h].free() {
                    Some(w) => {
                        self.evict_by_hand();
                        w
                    }
                    None => self.evict_in(h),
                };
                return self.place(h, w, h, key);
            }
            let can_grow = n < self.max_buckets;
            if can_grow && (self.len + 1) * LOAD.1 > n * WAYS * LOAD.0 {
                self.grow();
                continue;
            }
            if let Some((b, w)) = free_near(&self.buckets, h) {
                return self.place(b, w, h, key);
            }
            if can_grow {
                self.grow();
                continue;
            }
            // The largest table, and no room within reach: evict in the home bucket.
            let w = self.evict_in(h);
            return self.place(h, w, h, key);
        }
    }

    /// Stores `key` in the free slot `w` of bucket `b` (its home bucket being `h`).
    fn place(&mut self, b: usize, w: usize, h: usize, key: u64) -> (usize, usize) {
        let n = self.buckets.len();
        let distance = if b >= h { b - h } else { b + n - h };
        let home = &mut self.buckets[h];
        home.probe = home.probe.max(distance as u8);
        let bucket = &mut self.buckets[b];
        bucket.keys[w] = key;
        bucket.meta[w] = OCCUPIED | RRPV_NEW;
        self.len += 1;
        (b, w)
    }

    /// Grows the table, rehashing every key with its value and RRIP value: doubles it,
    /// or goes straight to `max_buckets` once doubling would come within 3/2 of it, so
    /// the last step is never a small one (a rehash into a table barely larger, at the
    /// load that triggered it, would find buckets full).
    fn grow(&mut self) {
        let n = self.buckets.len();
        let n = if n * 2 * 3 >= self.max_buckets * 2 {
            self.max_buckets
        } else {
            n * 2
        };
        let old = mem::replace(&mut self.buckets, new_buckets(n));
        self.len = 0;
        self.hand = 0;
        for mut bucket in old.into_vec() {
            for w in 0..WAYS {
                if bucket.meta[w] & OCCUPIED == 0 {
                    continue;
                }
                let key = bucket.keys[w];
                let h = home(key, n);
                // At most 4/5 ÷ 3/2 full after growing: a slot within reach is all but
                // certain. A key that finds none is an eviction in its full home
                // bucket: it replaces the bucket's victim only if that deserves
                // eviction more ([`Bucket::rank`]), else it is the one evicted.
                let (b, slot) = match free_near(&self.buckets, h) {
                    Some(found) => found,
                    None => {
                        let now = self.now;
                        let v = self.buckets[h].victim(now).unwrap_or(0);
                        if self.buckets[h].rank(v, now) <= bucket.rank(w, now) {
                            self.forget(key, bucket.stamps[w]);
                            continue;
                        }
                        self.evict(h, v);
                        (h, v)
                    }
                };
                self.place(b, slot, h, key);
                self.buckets[b].meta[slot] = bucket.meta[w];
                self.buckets[b].stamps[slot] = bucket.stamps[w];
                self.buckets[b].values[slot] = mem::take(&mut bucket.values[w]);
            }
        }
    }
}
