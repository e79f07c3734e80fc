//! The hottest keys of each rule over the last minute, in bounded memory: what `TOP`
//! answers and the dashboard lists. Keys are client data: they are shown to operators
//! through `TOP` only, never as a metrics label (one series per key would grow the
//! scrape without bound) and never in a log line.
//!
//! Each rule keeps a ring of [`EPOCHS`] summaries of [`EPOCH_MS`] each; a summary is the
//! Space-Saving algorithm of Metwally, Agrawal and El Abbadi ("Efficient Computation of
//! Frequent and Top-k Elements in Data Streams", ICDT 2005): [`COUNTERS`] counters, a
//! key not counted yet takes over the counter with the smallest count `m` and starts at
//! `m + 1`. Its guarantees, for `N` decisions in an epoch: each count overestimates its
//! key's true count by at most `m ≤ N / COUNTERS`, and every key decided more than
//! `N / COUNTERS` times holds a counter. [`RuleKeys::top`] adds up the epochs of the
//! last minute, so a key's `decisions` there is within `max_error ≤ N / COUNTERS` of its
//! true count, `N` now being the rule's decisions over those epochs (a key missing from
//! an epoch's summary was decided at most that epoch's `m` times in it). `denies` are
//! counted from when the key last took its counter: a lower bound, short by at most the
//! same `max_error`.
//!
//! Sampling: the first [`EXACT_FIRST`] decisions of a rule in an epoch are each
//! counted; past them, one decision in [`SAMPLE`] (drawn from a mixed sequence number,
//! so no pattern of keys can line up with it) is counted with weight [`SAMPLE`]. A busy
//! rule's counts are then estimates: a key decided `c` times is off by about
//! `√(SAMPLE · c)` (3 % at `c` = 10⁴) on top of `max_error`, and a key decided less than
//! a few times `SAMPLE` may be missed; the keys that matter to `TOP`, decided
//! thousands of times a minute, keep their rank. A quiet rule's counts stay exact.
//!
//! Cost per decision counted: one uncontended lock, one lookup by the key's hash (the
//! 64-bit hash the deny cache already computed), and an `O(log COUNTERS)` sift of a heap
//! of counter numbers; no allocation once a counter's key buffer has grown to its key.
//! A decision sampled out costs an atomic increment and a multiply.
//! Memory per rule: at most `EPOCHS × COUNTERS` counters of about 60 bytes plus the
//! key (≤ 256 bytes): ≤ 160 KiB, typically a tenth of that.

use crate::key::{KeyHash, Prehashed};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Counters per epoch summary: keys decided more than `1 / COUNTERS` of the time are
/// never missed, and counts are within `N / COUNTERS` (`N`: the rule's decisions).
pub const COUNTERS: usize = 128;
/// Length of one epoch, ms.
pub const EPOCH_MS: u64 = 20_000;
/// Epochs kept: the current one (partial) and the three before it, so [`RuleKeys::top`]
/// covers the last 60 to 80 s.
pub const EPOCHS: usize = 4;
/// Decisions of a rule counted one by one in each epoch before sampling starts.
pub const EXACT_FIRST: u64 = 4096;
/// Past [`EXACT_FIRST`], one decision in this many is counted, with this weight.
pub const SAMPLE: u64 = 8;
/// Most keys [`RuleKeys::top`] returns (more than [`COUNTERS`] would list keys whose
/// counts are mostly error).
pub const MAX_TOP: usize = COUNTERS;

/// One key's counts over the last minute (the epochs [`RuleKeys::top`] adds up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKey {
    /// The client's key (printable ASCII for keys from the socket; other bytes are
    /// replaced by U+FFFD).
    pub key: String,
    /// Decisions on the key (an upper bound: at most `max_error` above the truth).
    pub decisions: u64,
    /// DENY decisions on the key, counted since it last took a counter (a lower bound).
    pub denies: u64,
    /// How far `decisions` may be from the truth (0: exact).
    pub max_error: u64,
}

/// One counter of a summary.
#[derive(Debug)]
struct Counter {
    hash: KeyHash,
    count: u64,
    denies: u64,
    key: Vec<u8>,
}

/// A Space-Saving summary of one epoch.
#[derive(Debug, Default)]
struct Summary {
    /// The epoch (ms since the Unix epoch ÷ [`EPOCH_MS`]); 0: never used.
    id: u64,
    /// Counter number of each key hash counted.
    index: HashMap<KeyHash, u16, Prehashed>,
    counters: Vec<Counter>,
    /// A min-heap of counter numbers by count; `pos[c]` is counter `c`'s place in it.
    heap: Vec<u16>,
    pos: Vec<u16>,
}

impl Summary {
    /// Starts epoch `id` afresh (the counters' key buffers are dropped with them: an
    /// allocation per counter per epoch, not per decision).
    fn reset(&mut self, id: u64) {
        self.id = id;
        self.index.clear();
        self.counters.clear();
        self.heap.clear();
        self.pos.clear();
    }

    /// The smallest count when every counter is taken (the summary's error bound), else 0.
    fn min_error(&self) -> u64 {
        if self.counters.len() < COUNTERS {
            return 0;
        }
        self.heap
            .first()
            .map_or(0, |&c| self.counters[usize::from(c)].count)
    }

    /// Counts `weight` decisions on `key`.
    fn count(&mut self, hash: KeyHash, key: &[u8], denied: bool, weight: u64) {
        let denies = u64::from(denied) * weight;
        if let Some(&c) = self.index.get(&hash) {
            let counter = &mut self.counters[usize::from(c)];
            counter.count += weight;
            counter.denies += denies;
            self.sift_down(usize::from(self.pos[usize::from(c)]));
            return;
        }
        if self.counters.len() < COUNTERS {
            // COUNTERS fits a u16.
            let c = self.counters.len() as u16;
            self.counters.push(Counter {
                hash,
                count: weight,
                denies,
                key: key.to_vec(),
            });
            self.index.insert(hash, c);
            self.heap.push(c);
            self.pos.push(c);
            self.sift_up(self.heap.len() - 1);
            return;
        }
        // Space-Saving: the key takes over the counter with the smallest count.
        let c = self.heap[0];
        let counter = &mut self.counters[usize::from(c)];
        self.index.remove(&counter.hash);
        counter.hash = hash;
        counter.count += weight;
        counter.denies = denies;
        counter.key.clear();
        counter.key.extend_from_slice(key);
        self.index.insert(hash, c);
        self.sift_down(0);
    }

    fn count_at(&self, at: usize) -> u64 {
        self.counters[usize::from(self.heap[at])].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        // Heap places are below COUNTERS, which fits a u16.
        self.pos[usize::from(self.heap[a])] = a as u16;
        self.pos[usize::from(self.heap[b])] = b as u16;
    }

    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.count_at(parent) <= self.count_at(at) {
                break;
            }
            self.swap(parent, at);
            at = parent;
        }
    }

    fn sift_down(&mut self, mut at: usize) {
        loop {
            let (left, right) = (2 * at + 1, 2 * at + 2);
            let mut least = at;
            if left < self.heap.len() && self.count_at(left) < self.count_at(least) {
                least = left;
            }
            if right < self.heap.len() && self.count_at(right) < self.count_at(least) {
                least = right;
            }
            if least == at {
                return;
            }
            self.swap(at, least);
            at = least;
        }
    }
}

/// The ring of one rule's epoch summaries.
#[derive(Debug, Default)]
struct Ring {
    epochs: [Summary; EPOCHS],
    /// The newest epoch counted (0: none yet).
    newest: u64,
}

impl Ring {
    /// The summary of epoch `id`, started if new. A clock that steps back keeps
    /// counting in the newest epoch.
    /// `true` with it when the epoch is new (its first decisions go uncounted by
    /// [`RuleKeys::seen`] no longer).
    fn at(&mut self, id: u64) -> (&mut Summary, bool) {
        let id = id.max(self.newest);
        let summary = &mut self.epochs[(id % EPOCHS as u64) as usize];
        let new = summary.id != id;
        if new {
            summary.reset(id);
        }
        self.newest = id;
        (summary, new)
    }
}

/// One rule's hottest keys: fed by every decision of the rule, read by
/// [`RuleKeys::top`]. Shared by the rule's versions across reloads.
#[derive(Debug, Default)]
pub struct RuleKeys {
    ring: Mutex<Ring>,
    /// The rule's decisions since its newest epoch started (counted or sampled out):
    /// the sequence [`RuleKeys::weight`] samples.
    seen: AtomicU64,
}

/// The epoch of `now_us` (µs since the Unix epoch).
fn epoch_of(now_us: f64) -> u64 {
    (now_us.max(0.0) as u64 / 1000) / EPOCH_MS + 1
}

impl RuleKeys {
    /// Counts one decision on `key` (`hash`: its [`crate::key::TagKey`] hash), a DENY
    /// if `denied`, at `now_us` (µs since the Unix epoch, the local clock).
    /// Sampled past the epoch's first [`EXACT_FIRST`] decisions (the module's doc).
    pub fn record(&self, hash: KeyHash, key: &[u8], denied: bool, now_us: f64) {
        let Some(weight) = self.weight() else {
            return;
        };
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let (summary, new) = ring.at(epoch_of(now_us));
        summary.count(hash, key, denied, weight);
        if new {
            self.seen.store(1, Ordering::Relaxed);
        }
    }

    /// The weight of the next decision: 1 among the epoch's first [`EXACT_FIRST`], then
    /// [`SAMPLE`] for one in [`SAMPLE`] of them (the sequence number mixed, so that the
    /// ones picked follow no period), `None` for the others.
    fn weight(&self) -> Option<u64> {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        if n < EXACT_FIRST {
            return Some(1);
        }
        let mixed = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed >> 61 == 0).then_some(SAMPLE)
    }

    /// Counts a DENY on a key already counted by [`RuleKeys::record`] (a decision that
    /// came back from Redis after it was counted): added to the newest epoch whose
    /// summary still holds the key, else left out.
    pub fn denied(&self, hash: KeyHash) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let newest = ring.newest;
        for back in 0..2u64 {
            let Some(id) = newest.checked_sub(back) else {
                return;
            };
            let summary = &mut ring.epochs[(id % EPOCHS as u64) as usize];
            if summary.id != id {
                continue;
            }
            if let Some(&c) = summary.index.get(&hash) {
                summary.counters[usize::from(c)].denies += 1;
                return;
            }
        }
    }

    /// The `n` (at most [`MAX_TOP`]) keys decided most often over the epochs of the
    /// last minute at `now_us` (µs since the Unix epoch), most decided first (ties by
    /// key).
    pub fn top(&self, n: usize, now_us: f64) -> Vec<HotKey> {
        let now = epoch_of(now_us);
        let oldest = now.saturating_sub(EPOCHS as u64 - 1);
        let mut merged: HashMap<KeyHash, HotKey, Prehashed> = HashMap::default();
        let mut max_error = 0;
        {
            let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            for summary in ring.epochs.iter().filter(|s| s.id >= oldest && s.id != 0) {
                max_error += summary.min_error();
                for c in &summary.counters {
                    let k = merged.entry(c.hash).or_insert_with(|| HotKey {
                        key: String::from_utf8_lossy(&c.key).into_owned(),
                        decisions: 0,
                        denies: 0,
                        max_error: 0,
                    });
                    k.decisions += c.count;
                    k.denies += c.denies;
                }
            }
        }
        let mut keys: Vec<HotKey> = merged.into_values().collect();
        keys.sort_unstable_by(|a, b| b.decisions.cmp(&a.decisions).then(a.key.cmp(&b.key)));
        keys.truncate(n.min(MAX_TOP));
        for k in &mut keys {
            k.max_error = max_error;
            k.denies = k.denies.min(k.decisions);
        }
        keys
    }
}

#[cfg(test)]
mod tests;
