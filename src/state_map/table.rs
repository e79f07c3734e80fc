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

use super::sketch::{ticks_floor, Sketch, Stamp};
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

/// Metadata bit: the slot holds a key (a key hash may be any `u64`, 0 included).
const OCCUPIED: u8 = 0x80;
/// Metadata bits: the slot's RRIP value, 0 (used recently) to 3 (evict first).
const RRPV: u8 = 0x03;
/// RRIP value of a new key (SRRIP's "long re-reference interval").
const RRPV_NEW: u8 = 2;

/// One bucket: keys and metadata in the first 64-byte line, the values after, then the
/// stamps. Aligned to a 64-byte line, so the keys are one line.
#[repr(C, align(64))]
struct Bucket<V> {
    keys: [u64; WAYS],
    /// Per slot: [`OCCUPIED`] and the RRIP value.
    meta: [u8; WAYS],
    /// How many buckets after this one hold keys whose home is this one (0: none).
    probe: u8,
    _pad: [u8; 64 - 8 * WAYS - WAYS - 1],
    /// A free slot's value is `V::default()`, so a new key starts from it.
    values: [V; WAYS],
    /// Per slot: its value's stamp ([`Stamp::WORTHLESS`] when free).
    stamps: [Stamp; WAYS],
}

impl<V: Default> Bucket<V> {
    fn new() -> Self {
        Bucket {
            keys: [0; WAYS],
            meta: [0; WAYS],
            probe: 0,
            _pad: [0; 64 - 8 * WAYS - WAYS - 1],
            values: std::array::from_fn(|_| V::default()),
            stamps: [Stamp::WORTHLESS; WAYS],
        }
    }

    /// The slot holding `key`.
    fn find(&self, key: u64) -> Option<usize> {
        (0..WAYS).find(|&w| self.keys[w] == key && self.meta[w] & OCCUPIED != 0)
    }

    /// A free slot.
    fn free(&self) -> Option<usize> {
        (0..WAYS).find(|&w| self.meta[w] & OCCUPIED == 0)
    }

    /// How much slot `w` (occupied) deserves eviction at tick `now`: a value worth
    /// nothing before one that matters, then by RRIP value.
    fn rank(&self, w: usize, now: u64) -> u8 {
        (u8::from(!self.stamps[w].matters(now)) << 2) | (self.meta[w] & RRPV)
    }

    /// The victim among the occupied slots (`None` if none): the first of the highest
    /// [`Bucket::rank`] at tick `now`, after aging them all by what brings the highest
    /// RRIP value to 3.
    fn victim(&mut self, now: u64) -> Option<usize> {
        let mut best: Option<usize> = None;
        let mut top = 0;
        for w in 0..WAYS {
            if self.meta[w] & OCCUPIED != 0 {
                top = top.max(self.meta[w] & RRPV);
                if best.is_none_or(|b| self.rank(w, now) > self.rank(b, now)) {
                    best = Some(w);
                }
            }
        }
        best?;
        let age = RRPV - top;
        for m in &mut self.meta {
            if *m & OCCUPIED != 0 {
                *m += age;
            }
        }
        best
    }
}

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
    fn forget(&mut self, key: u64, stamp: Stamp) {
        if stamp.matters(self.now) {
            self.sketch.record(key, stamp, self.now);
            self.evicted.used += 1;
        } else {
            self.evicted.fresh += 1;
        }
    }

    /// Evicts the key in slot `w` of bucket `b` (occupied).
    fn evict(&mut self, b: usize, w: usize) {
        let bucket = &self.buckets[b];
        self.forget(bucket.keys[w], bucket.stamps[w]);
        self.clear(b, w);
    }

    /// Evicts the victim of full bucket `b`; the slot freed.
    fn evict_in(&mut self, b: usize) -> usize {
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
    fn evict_by_hand(&mut self) {
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

/// Asks the CPU to start loading every line (keys, then the values) of `key`'s home
/// bucket in a table whose buckets lie at `base`, `n` of them, as
/// [`Table::place_of_buckets`] reported; a no-op but on x86-64. All of them: the value
/// found after the key compare was otherwise a second, dependent miss (two thirds of the
/// algorithm's time at 10⁵ keys, docs/perf-log.md). The address is never
/// dereferenced: a stale `base` (the table grew since) only prefetches a useless line.
pub fn prefetch<V>(base: *const u8, n: usize, key: u64) {
    if n == 0 {
        return;
    }
    let size = mem::size_of::<Bucket<V>>();
    prefetch_lines(base.wrapping_add(home(key, n) * size), size);
}

/// Asks the CPU to start loading the `bytes` from `at`, line by line; a no-op but on
/// x86-64. Never dereferences `at`.
fn prefetch_lines(at: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint; it never faults, whatever the address.
        unsafe {
            for line in 0..bytes.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line).cast());
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, bytes);
}

/// `n` empty buckets.
fn new_buckets<V: Default>(n: usize) -> Box<[Bucket<V>]> {
    let mut buckets: Vec<Bucket<V>> = Vec::with_capacity(n);
    advise_huge_pages(buckets.as_ptr().cast(), n * mem::size_of::<Bucket<V>>());
    buckets.extend((0..n).map(|_| Bucket::new()));
    buckets.into_boxed_slice()
}

/// Tables from this size (bytes) ask for transparent huge pages.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Asks Linux to back `len` bytes at `at` (allocated, not yet touched) with 2 MB pages
/// where it can (`madvise(MADV_HUGEPAGE)`; with THP in its default `madvise` mode only
/// such ranges get them): a lookup at a random place of a large table then misses the
/// TLB far less often. Advice only: its failure changes nothing.
fn advise_huge_pages(at: *const u8, len: usize) {
    #[cfg(target_os = "linux")]
    if len >= HUGE_PAGE_BYTES {
        const PAGE: usize = 4096;
        let start = (at as usize).div_ceil(PAGE) * PAGE;
        let end = (at as usize + len) / PAGE * PAGE;
        if end > start {
            // SAFETY: advice on whole pages of an allocation this table owns; it does
            // not change their contents or validity.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (at, len);
}

/// The home bucket of `key` among `n`: multiply-shift of its low 32 bits.
fn home(key: u64, n: usize) -> usize {
    ((u64::from(key as u32) * n as u64) >> 32) as usize
}

/// `i` for `i < 2n`, taken mod `n`.
fn wrap(i: usize, n: usize) -> usize {
    if i >= n {
        i - n
    } else {
        i
    }
}

/// The first free slot in bucket `h` or one of the [`PROBE_LIMIT`] after it.
fn free_near<V: Default>(buckets: &[Bucket<V>], h: usize) -> Option<(usize, usize)> {
    let n = buckets.len();
    (0..=PROBE_LIMIT.min(n - 1)).find_map(|j| {
        let b = wrap(h + j, n);
        buckets[b].free().map(|w| (b, w))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_is_one_line_of_keys_then_the_values() {
        assert_eq!(mem::size_of::<Bucket<[u64; 4]>>(), 320);
        assert_eq!(mem::offset_of!(Bucket<[u64; 4]>, values), 64);
    }

    /// A key as the daemon makes it: the hash of a text tag (sequential integers hashed
    /// as integers spread too evenly to show clustering).
    fn tag_key(i: u64) -> u64 {
        use std::hash::BuildHasher;
        foldhash::fast::FixedState::with_seed(3).hash_one(format!("api:k{i}"))
    }

    #[test]
    fn a_share_of_distinct_keys_is_held_then_evicts_one_for_one() {
        for share in [1, 2, 7, 100, 4099, 19_661, 62_500] {
            let mut t: Table<u64> = Table::new(share, 64);
            assert!(t.slots() <= INITIAL_BUCKETS * WAYS, "starts small");
            for i in 0..share as u64 {
                *t.entry(tag_key(i), 0.0).value = i;
            }
            // Growth never drops a key; only the largest table, when a key finds no
            // free slot within reach of its home bucket, evicts before the share is
            // full (rarely: at most 1 % here).
            assert!(
                t.len() * 100 >= share * 99,
                "share {share}: {} held",
                t.len()
            );
            // No larger than the table its share fills to LOAD.
            assert!(
                t.slots() * LOAD.0 < share * LOAD.1 + WAYS * LOAD.0,
                "share {share}"
            );
            // Every key held has its own value.
            let held = (0..share as u64)
                .filter(|&i| match t.get_mut(tag_key(i)) {
                    Some(v) => {
                        assert_eq!(*v, i, "share {share}");
                        true
                    }
                    None => false,
                })
                .count();
            assert_eq!(held, t.len(), "share {share}");
            for i in share as u64..3 * share as u64 {
                *t.entry(tag_key(i), 0.0).value = i;
                assert!(t.len() <= share);
            }
            assert_eq!(t.len(), share, "share {share}: full after churn");
        }
    }

    #[test]
    fn growth_keeps_every_key() {
        // Shares whose largest table is barely above a doubling of the initial one
        // (4097 buckets after 4096): the last growth must not rehash into a table
        // barely larger at the load that triggered it. Several key sets.
        for share in [19_661, 19_700, 40_000] {
            for set in 0..8u64 {
                let key = |i: u64| {
                    use std::hash::BuildHasher;
                    foldhash::fast::FixedState::with_seed(set).hash_one(format!("s{set}:k{i}"))
                };
                let mut t: Table<u64> = Table::new(share, 64);
                let mut slots = t.slots();
                for i in 0..share as u64 {
                    let before = t.len();
                    *t.entry(key(i), 0.0).value = i;
                    if t.slots() != slots {
                        slots = t.slots();
                        assert_eq!(
                            t.len(),
                            before + 1,
                            "share {share}, set {set}: lost in growth"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn buckets_keep_room_to_vary_once_the_share_is_held() {
        // A working set as large as the share but spread over the buckets unlike the
        // keys that filled it: once it has been used a few times, all of it is held but
        // what overflows full home buckets (~9 %: 6 slots, 4.8 keys on average). An
        // eviction that froze each bucket at its count when the share filled held 78 %
        // (the keys of buckets fuller than at the fill evicting each other).
        let share = 20_000;
        let mut t: Table<u64> = Table::new(share, 64);
        for i in 0..share as u64 {
            *t.entry(tag_key(i), 0.0).value = i;
        }
        let working: Vec<u64> = (0..share as u64).map(|i| tag_key(1_000_000 + i)).collect();
        for _ in 0..4 {
            for &k in &working {
                t.entry(k, 0.0);
            }
        }
        let held = working.iter().filter(|&&k| t.get_mut(k).is_some()).count();
        assert!(held * 100 >= share * 90, "{held} of {share} held");
    }

    #[test]
    fn a_worthless_value_is_evicted_before_one_that_matters() {
        // Under the hand (the share is held, the new key's home bucket has room; tables
        // of at most LOOKAHEAD slots, so the slot is within reach) and in a full home
        // bucket alike: whatever the RRIP values, the one slot worth nothing at tick
        // 100 goes, and no record is made.
        for share in [6, 12, 19] {
            for worthless in 0..share as u64 {
                let mut t: Table<u64> = Table::new(share, 64);
                for i in 0..share as u64 {
                    let slot = t.entry(tag_key(i), 0.0);
                    *slot.value = i;
                    // Stamps as a local bucket's: fresh again at tick 50 or at 1000.
                    *slot.stamp = Stamp::new(if i == worthless { 50 } else { 1000 }, 9, 1);
                }
                // The worthless key was used last and most often: RRIP alone keeps it.
                for _ in 0..3 {
                    t.entry(tag_key(worthless), 0.0);
                }
                let slot = t.entry(tag_key(1_000), 1562500.0);
                assert_eq!(
                    (slot.evicted, slot.recorded(1)),
                    (Evicted { fresh: 1, used: 0 }, None),
                    "share {share}"
                );
                assert!(t.get_mut(tag_key(worthless)).is_none(), "share {share}");
                assert_eq!(t.len(), share);
                assert_eq!(t.sketch_bytes(), 0);
            }
        }
    }

    #[test]
    fn a_value_evicted_while_it_matters_is_handed_back_to_its_key() {
        let mut t: Table<u64> = Table::new(100, 64);
        *t.entry(tag_key(0), 0.0).stamp = Stamp::new(5000, 255, 1);
        let mut used = 0;
        for i in 1..1000 {
            let slot = t.entry(tag_key(i), 156250.0);
            *slot.stamp = Stamp::new(20, 1, 1);
            used += slot.evicted.used;
        }
        assert!(t.get_mut(tag_key(0)).is_none(), "flooded out");
        assert_eq!(used, 900, "key 0 and 899 others");
        let back = t.entry(tag_key(0), 296875.0).recorded(1).expect("recorded");
        assert!(back.fresh_at() >= 5000 && back.drained() == 255);
    }

    #[test]
    fn key_zero_is_a_key_like_any_other() {
        let mut t: Table<u64> = Table::new(10, 64);
        assert_eq!(t.get_mut(0), None);
        *t.entry(0, 0.0).value = 5;
        assert_eq!(t.get_mut(0).copied(), Some(5));
        assert_eq!(t.len(), 1);
    }
}
