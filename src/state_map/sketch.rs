//! What a bounded map remembers of the keys it evicted while their state still
//! mattered, so that such a key comes back no fuller than it left.
//!
//! Each value carries a [`Stamp`], set by its owner at every write: when the value
//! becomes worth nothing (equal to a new key's: a full token bucket, an empty queue or
//! window), how drained it is (an upper bound, in 1/255ths of its limit) and an 8-bit
//! tag of its kind (the owner's choice: the local buckets tag a state with a hash of
//! its rule's parameters). A value
//! evicted before its `fresh_at` is recorded here, in a fixed-size sketch in the manner
//! of a count-min sketch (Cormode, Muthukrishnan, "An improved data stream summary: the
//! count-min sketch and its applications", 2005), with `max` for `+`: [`ROWS`] rows of
//! cells, a key's cell in each row chosen by its own hash function. A cell holds the
//! largest `fresh_at` and the largest drained fraction of the keys recorded in it since
//! it was last empty, their tag (0 once keys of two tags met in it) and a 10-bit
//! fingerprint of them: that of the one key recorded, or 0 ("several") once two keys
//! with different fingerprints met in it. A cell whose `fresh_at` has passed holds
//! nothing that matters any more and counts as empty.
//!
//! **A recorded key is never missed.** Each of its cells received its record; a merge
//! only raises a cell's `fresh_at` and drained fraction and keeps its tag and
//! fingerprint or turns them to 0; a cell is overwritten only once its `fresh_at` ≤ now, which for a
//! cell holding the key means the key's own `fresh_at` has passed (the clock is
//! monotonic). So while the key's `fresh_at` is ahead, every one of its cells is live,
//! carries its tag or 0 and its fingerprint or 0, and bounds its `fresh_at` and drained fraction from
//! above; [`Sketch::lookup`] returns the smallest of those bounds, still bounds.
//!
//! **An unrelated key may be found** (a false positive) when each of its [`ROWS`] cells
//! is live and holds keys of its own tag (or of several tags) and either several keys
//! or one with the same fingerprint. Such a key then starts less than full (by at most
//! the largest drain of the keys it collided with), never fuller. With `n` used keys of
//! its tag recorded whose `fresh_at` is still ahead, spread over `w` cells per row
//! (λ = n ÷ w), a cell is shared with probability about `1 − e^−λ − λe^−λ`, so a key is
//! a false positive with probability about `(1 − e^−λ − λe^−λ)^4` (plus a fingerprint
//! term, `λe^−λ ÷ 1023` per row): with the map's 65,536 cells per row, about 10⁻⁸ at
//! 10⁴ such keys, 0.04 at 10⁵, 0.98 at 3 × 10⁵, and 1 at 10⁷. Keys of other tags
//! (other rules) are not affected but by cells where tags met.
//!
//! Past a few hundred thousand used keys of one tag evicted within their refill time,
//! every new key of that tag starts drained by what the keys in its cells lost, and,
//! once used and evicted in turn, is recorded with that drain plus its own use: the
//! drain ratchets up until new keys of that tag start empty, until the flood's
//! `fresh_at` pass (at most one policy window of its rule after the flood). Any
//! eviction that never over-admits does the same with a fixed memory: telling 10⁷ used
//! keys from unused ones takes about `10⁷ × log2(1 ÷ error)` bits, and a key started
//! drained because it could not be told apart must be recorded as such.

/// Rows of the sketch (independent hash functions).
pub const ROWS: usize = 4;

/// Ticks per second: the unit of [`Stamp`] times (1/64 s ≈ 15.6 ms).
pub const TICKS_PER_S: u64 = 64;

/// µs per tick (exact).
const US_PER_TICK: u64 = 1_000_000 / TICKS_PER_S;

/// Bits of a stamp's `fresh_at` (in ticks since the epoch: up to the year 2106).
const TIME_BITS: u32 = 38;
const TIME_MASK: u64 = (1 << TIME_BITS) - 1;
/// Where a stamp's drained fraction, tag and (in a cell) fingerprint start.
const DRAINED_AT: u32 = TIME_BITS;
const TAG_AT: u32 = DRAINED_AT + 8;
const FP_AT: u32 = TAG_AT + 8;

/// `us` µs (since the epoch, local clock) in whole ticks, rounded down (integer
/// arithmetic: no call to a software `floor` on CPUs without SSE4.1).
pub fn ticks_floor(us: f64) -> u64 {
    // `as` saturates: a negative or NaN time is 0 (a conversion to i64 is cheaper
    // than to u64 on x86-64; times fit in either).
    ((us as i64).max(0) as u64 / US_PER_TICK).min(TIME_MASK)
}

/// `us` µs plus `plus_ms` ms, in whole ticks, rounded up (possibly one tick more;
/// saturating at the largest stamp time): `us` is below the end of its tick, and
/// `plus_ms` is rounded up to ticks.
pub fn ticks_ceil(us: f64, plus_ms: u64) -> u64 {
    let plus = plus_ms.saturating_mul(TICKS_PER_S).div_ceil(1000);
    (ticks_floor(us) + 1).saturating_add(plus).min(TIME_MASK)
}

/// The start of tick `t`, µs since the epoch (exact in doubles).
pub fn ticks_to_us(t: u64) -> f64 {
    (t * US_PER_TICK) as f64
}

/// What a value's owner tells the map about it: from when it is worth nothing
/// (`fresh_at`, ticks, rounded up), how drained it is at most (`drained`, in 1/255ths
/// of its limit, rounded up), and its kind (`tag`, 1–255; 0 in a sketch cell: several).
/// Packed in one `u64`: bits 0–37 `fresh_at`, 38–45 `drained`, 46–53 `tag` (bits 54–63
/// hold a sketch cell's fingerprint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp(u64);

impl Stamp {
    /// A value worth nothing from the start (a new key's state, or one whose owner
    /// keeps no account): evicted first and without a record.
    pub const WORTHLESS: Stamp = Stamp(0);

    /// A value of kind `tag` (1–255), worth nothing from tick `fresh_at` on, drained
    /// at most `drained` ÷ 255.
    pub fn new(fresh_at: u64, drained: u8, tag: u8) -> Self {
        Stamp(fresh_at.min(TIME_MASK) | u64::from(drained) << DRAINED_AT | u64::from(tag) << TAG_AT)
    }

    /// The tick from which the value equals a new key's.
    pub fn fresh_at(self) -> u64 {
        self.0 & TIME_MASK
    }

    /// How drained the value is at most, in 1/255ths of its limit.
    pub fn drained(self) -> u8 {
        (self.0 >> DRAINED_AT) as u8
    }

    /// The value's kind (0 in a cell where kinds met).
    pub fn tag(self) -> u8 {
        (self.0 >> TAG_AT) as u8
    }

    /// A cell's fingerprint (0: several keys).
    fn fingerprint(self) -> u64 {
        self.0 >> FP_AT
    }

    /// True while the value still differs from a new key's at tick `now`.
    pub fn matters(self, now: u64) -> bool {
        self.fresh_at() > now
    }
}

/// Multipliers of the rows' hash functions (odd, from the golden ratio and splitmix64).
const MIX: [u64; ROWS + 1] = [
    0x9e37_79b9_7f4a_7c15,
    0xbf58_476d_1ce4_e5b9,
    0x94d0_49bb_1331_11eb,
    0xd6e8_feb8_6659_fd93,
    0xa076_1d64_78bd_642f,
];

/// The sketch of one shard: [`ROWS`] rows of `width` cells (allocated at the first
/// record: a map that never evicts a used key pays nothing).
pub struct Sketch {
    cells: Option<Box<[u64]>>,
    /// log2 of the cells per row.
    bits: u32,
    /// The largest `fresh_at` ever recorded: from then on nothing recorded matters.
    latest: u64,
}

impl Sketch {
    /// A sketch of [`ROWS`] rows of `width` cells (rounded up to a power of two, ≥ 2).
    pub fn new(width: usize) -> Self {
        Sketch {
            cells: None,
            bits: width.max(2).next_power_of_two().trailing_zeros(),
            latest: 0,
        }
    }

    /// `key`'s fingerprint (1..=1023; 0 marks a shared cell).
    fn fingerprint(key: u64) -> u64 {
        (key.wrapping_mul(MIX[ROWS]) >> FP_AT).max(1)
    }

    /// Records that `key`, with `stamp`, was evicted at tick `now` (only worth it while
    /// `stamp.matters(now)`; otherwise nothing is recorded).
    pub fn record(&mut self, key: u64, stamp: Stamp, now: u64) {
        if !stamp.matters(now) {
            return;
        }
        let width = 1usize << self.bits;
        let cells = self
            .cells
            .get_or_insert_with(|| vec![0; ROWS * width].into_boxed_slice());
        let fp = Self::fingerprint(key);
        for r in 0..ROWS {
            let i = place(self.bits, key, r);
            let old = Stamp(cells[i]);
            cells[i] = if !old.matters(now) {
                stamp.0 | fp << FP_AT
            } else {
                let fresh = old.fresh_at().max(stamp.fresh_at());
                let drained = old.drained().max(stamp.drained());
                let (tag, fp) = if old.tag() != stamp.tag() {
                    (0, 0)
                } else if old.fingerprint() != fp {
                    (old.tag(), 0)
                } else {
                    (old.tag(), fp)
                };
                Stamp::new(fresh, drained, tag).0 | fp << FP_AT
            };
        }
        self.latest = self.latest.max(stamp.fresh_at());
    }

    /// What was recorded of `key`, of kind `tag`, that still matters at tick `now`: an
    /// upper bound of its `fresh_at` and of its drain when it was evicted (or a false
    /// positive's, see the module doc). `None`: nothing that matters was recorded for
    /// it.
    pub fn lookup(&self, key: u64, tag: u8, now: u64) -> Option<Stamp> {
        if self.latest <= now {
            return None;
        }
        let cells = self.cells.as_ref()?;
        let fp = Self::fingerprint(key);
        let mut fresh = u64::MAX;
        let mut drained = u8::MAX;
        for r in 0..ROWS {
            let cell = Stamp(cells[place(self.bits, key, r)]);
            let f = cell.fingerprint();
            let t = cell.tag();
            if !cell.matters(now) || (t != 0 && t != tag) || (t != 0 && f != 0 && f != fp) {
                return None;
            }
            fresh = fresh.min(cell.fresh_at());
            drained = drained.min(cell.drained());
        }
        Some(Stamp::new(fresh, drained, tag))
    }

    /// Bytes allocated (0 until the first record).
    pub fn bytes(&self) -> usize {
        self.cells.as_ref().map_or(0, |c| c.len() * 8)
    }
}

/// The cell of `key` in row `r` of a sketch of `2^bits` cells per row (multiply-shift:
/// the top bits of the product depend on every bit of the key).
fn place(bits: u32, key: u64, r: usize) -> usize {
    let h = (key ^ (r as u64).wrapping_mul(MIX[ROWS])).wrapping_mul(MIX[r]);
    (r << bits) + (h >> (64 - bits)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> u64 {
        use std::hash::BuildHasher;
        foldhash::fast::FixedState::with_seed(11).hash_one(i)
    }

    #[test]
    fn a_recorded_key_is_found_until_its_fresh_at() {
        let mut s = Sketch::new(4096);
        assert_eq!(s.bytes(), 0, "allocated at the first record");
        s.record(key(1), Stamp::new(1000, 255, 7), 10);
        // Many other keys recorded after it only raise its bounds.
        for i in 2..20_000 {
            s.record(
                key(i),
                Stamp::new(500 + i % 400, (i % 50) as u8, 7),
                10 + i / 100,
            );
        }
        let found = s.lookup(key(1), 7, 300).expect("recorded");
        assert!(found.fresh_at() >= 1000 && found.drained() == 255);
        assert_eq!(s.lookup(key(1), 7, 1000), None, "its fresh_at has passed");
        // A worthless stamp records nothing.
        let mut s = Sketch::new(16);
        s.record(key(1), Stamp::new(5, 255, 7), 5);
        assert_eq!((s.lookup(key(1), 7, 0), s.bytes()), (None, 0));
    }

    #[test]
    fn false_positives_as_documented() {
        // 65,536 cells per row (the whole map's), n live records: unrelated keys found.
        for (n, at_most) in [(10_000u64, 0.0001), (100_000, 0.06)] {
            let mut s = Sketch::new(65_536);
            for i in 0..n {
                s.record(key(i), Stamp::new(1000, 51, 7), 0);
            }
            let probes = 200_000u64;
            let found = (0..probes)
                .filter(|i| s.lookup(key(1 << 40 | i), 7, 1).is_some())
                .count();
            let rate = found as f64 / probes as f64;
            assert!(rate <= at_most, "{n} records: {rate}");
            // Every recorded key is found.
            assert!((0..n).all(|i| s.lookup(key(i), 7, 1).is_some()));
        }
    }
}
