//! The deny cache: recent DENY decisions from Redis, remembered per (rule, key).
//!
//! A hot key that Redis has just denied would be denied again until its `wait_ms` has
//! passed, so the daemon answers it itself (`source = cache`) for
//! `min(cache.ttl_ms, wait_ms)` and saves the round trip. Only DENY is cached, and only
//! for requests of the same cost: a cached answer can never admit anything Redis would
//! not, and stays exact for the cost it was computed for.
//!
//! When a hot key's entry reaches `cache.ttl_ms`, the first request to see it claims its
//! refresh ([`Lookup::Refresh`]): the limiter asks Redis with a dry run, which takes
//! nothing, while that request and the others keep the cached DENY until the answer is
//! back: at most twice `redis.timeout_ms` past the ttl, and never past the DENY's own
//! `wait_ms`, before which Redis itself would deny the key. Otherwise every request in
//! flight on an expiring hot key would go to Redis at once, each holding its
//! connection's in-order replies behind a round trip.

use crate::decision::{Decision, Source};
use crate::key::{KeyHash, Prehashed};
use moka::ops::compute::Op;
use moka::sync::Cache;
use std::sync::atomic::Ordering;
use std::time::Duration;

mod front;
mod page;

#[derive(Debug, Clone, Copy)]
struct CachedDeny {
    decision: Decision,
    cost: u32,
    /// When Redis was asked, wall clock µs.
    at_us: f64,
    /// How long the entry answers as fresh, µs. Past it, the entry still answers until
    /// the grace is over, while the refresh one request claimed
    /// ([`page::PageSlot::claimed`]) is in flight.
    ttl_us: f64,
    /// The cache's generation when the request that Redis answered was made, its low
    /// 32 bits (two generations 2³² reloads apart would have to meet within one DENY's
    /// life to be confused): an entry of an earlier generation (before a reload cleared
    /// the cache) never answers. 32 bits keep a page's slot at 80 bytes.
    generation: u32,
}

/// What the deny cache holds for a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lookup {
    /// A fresh DENY: the answer.
    Hit(Decision),
    /// Nothing usable: ask Redis.
    Miss,
    /// The entry expired and this request claimed its refresh: answer it with this
    /// cached DENY (as the others meanwhile), ask Redis with a dry run of the same cost,
    /// and pass that answer to [`DenyCache::remember`] with `refreshing`.
    Refresh(Decision),
}

/// Bounded map from `"<rule>:<key>"` (as its [`TagKey`](crate::key::TagKey)) to the last DENY Redis returned
/// for it: moka, keyed by the page of the 64-bit hash ([`page`]: a few keys' DENYs per
/// moka entry, weighed by their count), LRU eviction and no time-to-live of moka's own
/// (each entry carries its own expiry, checked on the local clock, which counts a
/// system suspend): a new DENY, the sign of a hot key, is always admitted, and LRU
/// without a time-to-live halves moka's own cost of an insert against TinyLFU with one (docs/perf-log.md).
pub struct DenyCache {
    entries: Option<Cache<u64, page::Page, Prehashed>>,
    /// How many pages the key space is split into (≥ 1).
    pages: u64,
    /// The most DENYs one page holds (`max_entries`, at most [`page::MAX_SLOTS`]).
    max_slots: usize,
    /// This cache's id in the per-thread memos of fresh entries ([`front`]).
    owner: u64,
    /// Bumped by [`DenyCache::clear`].
    generation: std::sync::atomic::AtomicU64,
    ttl: Duration,
    /// How long an expired entry keeps answering while its refresh is in flight, µs.
    grace_us: f64,
}

impl DenyCache {
    /// A cache keeping each DENY at most `ttl_ms` ms (0 disables the cache) and at most
    /// `max_entries` DENYs (the least recently used page of them is evicted, and a page
    /// beyond `min(max_entries, 32)` DENYs drops its oldest; moka counts and evicts
    /// lazily, so the count can run a little over between its housekeeping runs); an
    /// expired entry whose refresh is in flight answers for up to `grace_ms` more (the
    /// time a Redis call may take: twice `redis.timeout_ms`).
    pub fn new(ttl_ms: u64, max_entries: u64, grace_ms: u64) -> Self {
        let ttl = Duration::from_millis(ttl_ms);
        let entries = (ttl_ms > 0 && max_entries > 0).then(|| {
            Cache::builder()
                .max_capacity(max_entries)
                .weigher(|_, page| page::weight(page))
                .eviction_policy(moka::policy::EvictionPolicy::lru())
                .build_with_hasher(Prehashed)
        });
        DenyCache {
            entries,
            pages: max_entries.div_ceil(page::KEYS_PER_PAGE).max(1),
            max_slots: max_entries.min(page::MAX_SLOTS as u64) as usize,
            owner: front::new_owner(),
            ttl,
            grace_us: grace_ms as f64 * 1000.0,
            generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Remembers `decision` (Redis's answer for `cost` units, asked at `asked_us`, wall
    /// clock µs, when the cache's generation was `generation`) under `key`: a DENY for
    /// `min(ttl, wait_ms)` from then, so it never outlives Redis's own `wait_ms`. An
    /// ALLOW or a zero wait is not remembered, and when it answers a refresh
    /// ([`Lookup::Refresh`], `refreshing`: a dry run's answer) it drops the claimed
    /// entry at once (Redis would admit the key now, e.g. it was reset), so the next
    /// request asks Redis for real. A refresh that got no answer from Redis leaves the
    /// entry to lapse at the end of its grace.
    pub fn remember(
        &self,
        key: KeyHash,
        cost: u32,
        decision: &Decision,
        asked_us: f64,
        generation: u64,
        refreshing: bool,
    ) {
        let Some(entries) = &self.entries else { return };
        front::forget(self.owner, key);
        let id = page::page_of(key, self.pages);
        if decision.allowed || decision.wait_ms == 0 {
            if refreshing {
                entries.entry(id).and_compute_with(|current| {
                    let Some(current) = current else {
                        return Op::Nop;
                    };
                    if page::find(current.value(), key).is_none() {
                        return Op::Nop;
                    }
                    match page::without(current.value(), key) {
                        Some(rest) => Op::Put(rest),
                        None => Op::Remove,
                    }
                });
            }
            return;
        }
        if generation != self.generation() {
            return;
        }
        let generation = low_bits(generation);
        let ttl = self.ttl.min(Duration::from_millis(decision.wait_ms));
        let entry = CachedDeny {
            decision: *decision,
            cost,
            at_us: asked_us,
            ttl_us: ttl.as_micros() as f64,
            generation,
        };
        // A slot that can no longer answer: of an earlier generation, or past its ttl
        // and any grace (`asked_us` stands in for now: at most a Redis call earlier).
        let dead = |e: &CachedDeny| {
            e.generation != generation || asked_us - e.at_us >= e.ttl_us + self.grace_us
        };
        entries.entry(id).and_compute_with(|current| {
            let current = current.map(|p| p.into_value());
            Op::Put(page::with(
                current.as_deref(),
                key,
                entry,
                self.max_slots,
                dead,
            ))
        });
    }

    /// The generation to pass to [`DenyCache::remember`]:
    /// read it before asking Redis, so that an answer computed before a reload (which
    /// clears the cache) is never remembered after it.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The cached DENY for `key` ([`TagKey::of`] of the tag's parts) and `cost` at `now_us` (wall
    /// clock µs), if one is fresh, with `reset_ms` and `wait_ms` reduced by the whole ms
    /// since Redis was asked and `source = cache`. The clock is the one local decisions
    /// read (once per batch, [`crate::clock::local_clock_us`], monotonic on
    /// `CLOCK_BOOTTIME`, so a system suspend ages the entry too), so an entry
    /// answers for at most `min(cache.ttl_ms, wait_ms)` (plus the refresh grace, never
    /// past `wait_ms`) whatever the wall clock does; a `now_us` before the entry counts
    /// as no time passed. The first request to find an entry of its cost expired, less
    /// than the grace past its ttl and with its `wait_ms` not yet over, gets
    /// [`Lookup::Refresh`] with the entry's answer: the entry answers every request
    /// until the grace is over. An
    /// expired entry stays until a new DENY replaces it, a write to its page leaves it
    /// out, or its page is evicted: it only takes room, never answers.
    ///
    /// [`TagKey::of`]: crate::key::TagKey::of
    pub fn lookup(&self, key: KeyHash, cost: u32, now_us: f64) -> Lookup {
        let Some(entries) = &self.entries else {
            return Lookup::Miss;
        };
        // This thread's memo first: a fresh entry answers without a moka read.
        if let Some(entry) = front::get(self.owner, key) {
            let elapsed = (now_us - entry.at_us).max(0.0);
            if entry.cost == cost
                && entry.generation == low_bits(self.generation())
                && elapsed < entry.ttl_us
            {
                return Lookup::Hit(answer(&entry, elapsed));
            }
        }
        let id = page::page_of(key, self.pages);
        let Some(current) = entries.get(&id) else {
            return Lookup::Miss;
        };
        let Some(slot) = page::slot(&current, key) else {
            return Lookup::Miss;
        };
        let entry = slot.entry;
        if entry.cost != cost || entry.generation != low_bits(self.generation()) {
            return Lookup::Miss;
        }
        let elapsed = (now_us - entry.at_us).max(0.0);
        if elapsed >= entry.ttl_us {
            // At most the grace past its ttl, and never past its wait_ms.
            let wait_us = entry.decision.wait_ms as f64 * 1000.0;
            let until = (entry.ttl_us + self.grace_us).min(wait_us);
            if elapsed >= until {
                return Lookup::Miss;
            }
            // Of the requests that find it expired, the one that flips the flag claims
            // its refresh; all are answered from it until the grace is over. A copy of
            // the page written meanwhile (another key's DENY, a newer DENY, an eviction)
            // can miss this claim or take it from a stale copy: one more dry run per
            // such write at most, never an admission.
            return if slot.claimed.swap(true, Ordering::AcqRel) {
                Lookup::Hit(answer(&entry, elapsed))
            } else {
                Lookup::Refresh(answer(&entry, elapsed))
            };
        }
        front::put(self.owner, key, entry);
        Lookup::Hit(answer(&entry, elapsed))
    }

    /// Whether a DENY for `key` (any cost) would answer now, at `now_us` (for operators:
    /// `INSPECT`; claims no refresh and changes nothing).
    pub fn holds(&self, key: KeyHash, now_us: f64) -> bool {
        let Some(entries) = &self.entries else {
            return false;
        };
        let Some(current) = entries.get(&page::page_of(key, self.pages)) else {
            return false;
        };
        page::find(&current, key).is_some_and(|e| {
            e.generation == low_bits(self.generation()) && now_us - e.at_us < e.ttl_us
        })
    }

    /// Forgets everything (after a config reload changed the rules).
    pub fn clear(&self) {
        // First the generation: an answer in flight from before is no longer stored,
        // and an entry stored meanwhile no longer answers.
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        if let Some(entries) = &self.entries {
            entries.invalidate_all();
        }
    }

    /// DENYs currently held, for logs and metrics (runs moka's pending maintenance
    /// first so the count is current: not for the hot path).
    pub fn len(&self) -> u64 {
        self.entries.as_ref().map_or(0, |e| {
            e.run_pending_tasks();
            e.weighted_size()
        })
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The low 32 bits of a generation, as an entry keeps it.
fn low_bits(generation: u64) -> u32 {
    generation as u32
}

/// The cached DENY of `entry`, `elapsed` µs after Redis was asked: `reset_ms` and
/// `wait_ms` reduced by the whole ms since (`wait_ms` at least 1), `source = cache`.
fn answer(entry: &CachedDeny, elapsed: f64) -> Decision {
    let elapsed_ms = (elapsed / 1000.0) as u64;
    let d = entry.decision;
    Decision {
        reset_ms: d.reset_ms.saturating_sub(elapsed_ms),
        wait_ms: d.wait_ms.saturating_sub(elapsed_ms).max(1),
        source: Source::Cache,
        ..d
    }
}

#[cfg(test)]
mod tests;
