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
use moka::sync::Cache;
use std::time::Duration;

mod front;

#[derive(Debug, Clone, Copy)]
struct Entry {
    decision: Decision,
    cost: u32,
    /// When Redis was asked, wall clock µs.
    at_us: f64,
    /// How long the entry answers, µs.
    ttl_us: f64,
    /// A request has claimed its refresh and `ttl_us` was extended by the grace (an
    /// entry is extended once: after that, expired means gone).
    extended: bool,
    /// The cache's generation when the request that Redis answered was made: an entry
    /// of an earlier generation (before a reload cleared the cache) never answers.
    generation: u64,
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
/// for it: moka, keyed by the 64-bit hash itself ([`Prehashed`]), LRU eviction and no
/// time-to-live of moka's own (each entry carries its own expiry, checked on the
/// monotonic local clock): a new DENY, the sign of a hot key, is always admitted, and
/// an insert costs about half of TinyLFU's with a time-to-live (docs/PERFORMANCE.md).
pub struct DenyCache {
    entries: Option<Cache<KeyHash, Entry, Prehashed>>,
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
    /// `max_entries` entries (the least recently used is evicted; moka counts and evicts
    /// lazily, so the count can run a little over between its housekeeping runs); an
    /// expired entry whose refresh is in flight answers for up to `grace_ms` more (the
    /// time a Redis call may take: twice `redis.timeout_ms`).
    pub fn new(ttl_ms: u64, max_entries: u64, grace_ms: u64) -> Self {
        let ttl = Duration::from_millis(ttl_ms);
        let entries = (ttl_ms > 0 && max_entries > 0).then(|| {
            Cache::builder()
                .max_capacity(max_entries)
                .eviction_policy(moka::policy::EvictionPolicy::lru())
                .build_with_hasher(Prehashed)
        });
        DenyCache {
            entries,
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
    /// ([`Lookup::Refresh`], `refreshing`: a dry run's answer) it drops the extended
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
        if decision.allowed || decision.wait_ms == 0 {
            if refreshing {
                entries.invalidate(&key);
            }
            return;
        }
        if generation != self.generation() {
            return;
        }
        let ttl = self.ttl.min(Duration::from_millis(decision.wait_ms));
        entries.insert(
            key,
            Entry {
                decision: *decision,
                cost,
                at_us: asked_us,
                ttl_us: ttl.as_micros() as f64,
                extended: false,
                generation,
            },
        );
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
    /// read (once per batch, [`crate::clock::local_clock_us`], monotonic), so an entry
    /// answers for at most `min(cache.ttl_ms, wait_ms)` (plus the refresh grace, never
    /// past `wait_ms`) whatever the wall clock does; a `now_us` before the entry counts
    /// as no time passed. The first request to find an entry of its cost expired, less
    /// than the grace past its ttl and with its `wait_ms` not yet over, gets
    /// [`Lookup::Refresh`] with the entry's answer: the entry answers every request
    /// until the grace is over. An
    /// expired entry stays until a new DENY replaces it or it is evicted: it only takes
    /// room, never answers.
    ///
    /// [`TagKey::of`]: crate::key::TagKey::of
    pub fn lookup(&self, key: KeyHash, cost: u32, now_us: f64) -> Lookup {
        let Some(entries) = &self.entries else {
            return Lookup::Miss;
        };
        // This thread's memo first: a fresh entry answers without a moka read.
        if let Some(entry) = front::get(self.owner, key) {
            let elapsed = (now_us - entry.at_us).max(0.0);
            if entry.cost == cost && entry.generation == self.generation() && elapsed < entry.ttl_us
            {
                return Lookup::Hit(answer(&entry, elapsed));
            }
        }
        let Some(entry) = entries.get(&key) else {
            return Lookup::Miss;
        };
        if entry.cost != cost || entry.generation != self.generation() {
            return Lookup::Miss;
        }
        let elapsed = (now_us - entry.at_us).max(0.0);
        if elapsed >= entry.ttl_us {
            // At most the grace past its ttl, and never past its wait_ms.
            let wait_us = entry.decision.wait_ms as f64 * 1000.0;
            let until = (entry.ttl_us + self.grace_us).min(wait_us);
            if entry.extended || elapsed >= until {
                return Lookup::Miss;
            }
            // Not atomic with a concurrent refresh's answer: at worst that answer's
            // ALLOW is followed by this entry's DENY until `until` (never an admission).
            entries.insert(
                key,
                Entry {
                    ttl_us: until,
                    extended: true,
                    ..entry
                },
            );
            return Lookup::Refresh(answer(&entry, elapsed));
        }
        if !entry.extended {
            front::put(self.owner, key, entry);
        }
        Lookup::Hit(answer(&entry, elapsed))
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

    /// Entries currently held, for logs and metrics (runs moka's pending maintenance
    /// first so the count is current: not for the hot path).
    pub fn len(&self) -> u64 {
        self.entries.as_ref().map_or(0, |e| {
            e.run_pending_tasks();
            e.entry_count()
        })
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The cached DENY of `entry`, `elapsed` µs after Redis was asked: `reset_ms` and
/// `wait_ms` reduced by the whole ms since (`wait_ms` at least 1), `source = cache`.
fn answer(entry: &Entry, elapsed: f64) -> Decision {
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
mod tests {
    use super::*;
    use crate::key::TagKey;

    const T0: f64 = 1_700_000_000_000_000.0;

    /// The key of `tag`, with one hasher for the whole test module.
    fn k(tag: &str) -> KeyHash {
        static KEYS: std::sync::OnceLock<TagKey> = std::sync::OnceLock::new();
        let (rule, key) = tag.split_once(':').unwrap_or(("", tag));
        KEYS.get_or_init(TagKey::default)
            .of(rule.as_bytes(), key.as_bytes())
    }

    fn deny(wait_ms: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 10,
            remaining: 0,
            reset_ms: 1000,
            wait_ms,
            source: Source::Redis,
        }
    }

    fn hit(l: Lookup) -> Decision {
        match l {
            Lookup::Hit(d) => d,
            other => panic!("expected a hit, got {other:?}"),
        }
    }

    /// The cached answer a refresh claim carries.
    fn refresh(l: Lookup) -> Decision {
        match l {
            Lookup::Refresh(d) => d,
            other => panic!("expected a refresh claim, got {other:?}"),
        }
    }

    #[test]
    fn remembers_denies_of_the_same_cost_only() {
        let c = DenyCache::new(500, 100, 50);
        c.remember(k("r:k"), 2, &deny(300), T0, 0, false);
        let h = hit(c.lookup(k("r:k"), 2, T0 + 100_000.0));
        assert_eq!(h.source, Source::Cache);
        assert_eq!((h.allowed, h.wait_ms, h.reset_ms), (false, 200, 900));
        assert_eq!(c.lookup(k("r:k"), 1, T0), Lookup::Miss);
        assert_eq!(c.lookup(k("r:other"), 2, T0), Lookup::Miss);
        // A clock stepping back: no time passed.
        assert_eq!(hit(c.lookup(k("r:k"), 2, T0 - 5e6)).wait_ms, 300);
    }

    #[test]
    fn never_caches_allow_and_expires_with_wait() {
        let c = DenyCache::new(500, 100, 50);
        c.remember(
            k("r:a"),
            1,
            &Decision {
                allowed: true,
                ..deny(0)
            },
            T0,
            0,
            false,
        );
        assert_eq!(c.lookup(k("r:a"), 1, T0), Lookup::Miss);
        c.remember(k("r:b"), 1, &deny(20), T0, 0, false);
        hit(c.lookup(k("r:b"), 1, T0 + 19_999.0));
        // Past wait_ms: no refresh grace either (Redis may admit it now).
        assert_eq!(
            c.lookup(k("r:b"), 1, T0 + 20_000.0),
            Lookup::Miss,
            "kept past wait_ms"
        );
    }

    #[test]
    fn one_request_refreshes_an_expired_entry_while_the_others_keep_it() {
        let c = DenyCache::new(500, 100, 50);
        c.remember(k("r:k"), 1, &deny(10_000), T0, 0, false);
        let t = T0 + 500_000.0;
        // The claimant is answered from the entry too, its wait reduced.
        let claimed = refresh(c.lookup(k("r:k"), 1, t));
        assert_eq!(
            (claimed.allowed, claimed.wait_ms, claimed.source),
            (false, 9_500, Source::Cache)
        );
        // The others: the cached DENY, for the grace (50 ms) and no longer.
        hit(c.lookup(k("r:k"), 1, t + 1_000.0));
        hit(c.lookup(k("r:k"), 1, t + 49_999.0));
        assert_eq!(c.lookup(k("r:k"), 1, t + 50_000.0), Lookup::Miss);
        // The refresh came back DENY: fresh again, for ttl_ms from its own asking.
        c.remember(k("r:k"), 1, &deny(9_000), t, 0, true);
        hit(c.lookup(k("r:k"), 1, t + 499_999.0));
        refresh(c.lookup(k("r:k"), 1, t + 500_000.0));
        // ... then ALLOW: the extended entry goes at once.
        c.remember(
            k("r:k"),
            1,
            &Decision {
                allowed: true,
                ..deny(0)
            },
            t + 500_000.0,
            0,
            true,
        );
        assert_eq!(c.lookup(k("r:k"), 1, t + 500_001.0), Lookup::Miss);
    }

    #[test]
    fn the_grace_ends_at_wait_and_counts_from_the_ttl() {
        let c = DenyCache::new(500, 100, 50);
        c.remember(k("r:k"), 1, &deny(520), T0, 0, false);
        c.remember(k("r:idle"), 1, &deny(10_000), T0, 0, false);
        refresh(c.lookup(k("r:k"), 1, T0 + 500_000.0));
        hit(c.lookup(k("r:k"), 1, T0 + 519_999.0));
        assert_eq!(c.lookup(k("r:k"), 1, T0 + 520_000.0), Lookup::Miss);
        // Not asked again until 5 s later: long past ttl + grace, Redis is asked.
        assert_eq!(c.lookup(k("r:idle"), 1, T0 + 5e6), Lookup::Miss);
    }

    #[test]
    fn a_clear_forgets_entries_and_answers_still_in_flight() {
        let c = DenyCache::new(500, 100, 50);
        let before = c.generation();
        c.remember(k("r:a"), 1, &deny(300), T0, before, false);
        c.clear();
        assert_eq!(c.lookup(k("r:a"), 1, T0), Lookup::Miss);
        // An answer asked for before the clear is not remembered after it.
        c.remember(k("r:b"), 1, &deny(300), T0, before, false);
        assert_eq!(c.lookup(k("r:b"), 1, T0), Lookup::Miss);
        c.remember(k("r:b"), 1, &deny(300), T0, c.generation(), false);
        hit(c.lookup(k("r:b"), 1, T0));
    }

    #[test]
    fn ttl_zero_disables() {
        let c = DenyCache::new(0, 100, 50);
        c.remember(k("r:k"), 1, &deny(300), T0, 0, false);
        assert_eq!(c.lookup(k("r:k"), 1, T0), Lookup::Miss);
    }
}
