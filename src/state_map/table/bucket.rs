//! One bucket of [`super::Table`]: a 64-byte line of keys and their metadata (the
//! occupied bit and the RRIP value), the values and their stamps after it; which slot
//! holds a key, which is free, and which deserves eviction. Where a key's home bucket
//! is and which buckets a key may probe, so that a lookup and an insert agree.

use super::{PROBE_LIMIT, WAYS};
use crate::state_map::sketch::Stamp;

/// Metadata bit: the slot holds a key (a key hash may be any `u64`, 0 included).
pub(super) const OCCUPIED: u8 = 0x80;
/// Metadata bits: the slot's RRIP value, 0 (used recently) to 3 (evict first).
pub(super) const RRPV: u8 = 0x03;
/// RRIP value of a new key (SRRIP's "long re-reference interval").
pub(super) const RRPV_NEW: u8 = 2;

/// One bucket: keys and metadata in the first 64-byte line, the values after, then the
/// stamps. Aligned to a 64-byte line, so the keys are one line.
#[repr(C, align(64))]
pub(super) struct Bucket<V> {
    pub(super) keys: [u64; WAYS],
    /// Per slot: [`OCCUPIED`] and the RRIP value.
    pub(super) meta: [u8; WAYS],
    /// How many buckets after this one hold keys whose home is this one (0: none).
    pub(super) probe: u8,
    _pad: [u8; 64 - 8 * WAYS - WAYS - 1],
    /// A free slot's value is `V::default()`, so a new key starts from it.
    pub(super) values: [V; WAYS],
    /// Per slot: its value's stamp ([`Stamp::WORTHLESS`] when free).
    pub(super) stamps: [Stamp; WAYS],
}

impl<V: Default> Bucket<V> {
    pub(super) fn new() -> Self {
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
    pub(super) fn find(&self, key: u64) -> Option<usize> {
        (0..WAYS).find(|&w| self.keys[w] == key && self.meta[w] & OCCUPIED != 0)
    }

    /// A free slot.
    pub(super) fn free(&self) -> Option<usize> {
        (0..WAYS).find(|&w| self.meta[w] & OCCUPIED == 0)
    }

    /// How much slot `w` (occupied) deserves eviction at tick `now`: a value worth
    /// nothing before one that matters, then by RRIP value.
    pub(super) fn rank(&self, w: usize, now: u64) -> u8 {
        (u8::from(!self.stamps[w].matters(now)) << 2) | (self.meta[w] & RRPV)
    }

    /// The victim among the occupied slots (`None` if none): the first of the highest
    /// [`Bucket::rank`] at tick `now`, after aging them all by what brings the highest
    /// RRIP value to 3.
    pub(super) fn victim(&mut self, now: u64) -> Option<usize> {
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

/// The home bucket of `key` among `n`: multiply-shift of its low 32 bits.
pub(super) fn home(key: u64, n: usize) -> usize {
    ((u64::from(key as u32) * n as u64) >> 32) as usize
}

/// `i` for `i < 2n`, taken mod `n`.
pub(super) fn wrap(i: usize, n: usize) -> usize {
    if i >= n {
        i - n
    } else {
        i
    }
}

/// The first free slot in bucket `h` or one of the [`PROBE_LIMIT`] after it.
pub(super) fn free_near<V: Default>(buckets: &[Bucket<V>], h: usize) -> Option<(usize, usize)> {
    let n = buckets.len();
    (0..=PROBE_LIMIT.min(n - 1)).find_map(|j| {
        let b = wrap(h + j, n);
        buckets[b].free().map(|w| (b, w))
    })
}
