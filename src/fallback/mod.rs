//! Decisions made without Redis: local twins of the algorithms, fail-open, fail-closed.
//!
//! Used for every decision when `redis.mode = "none"` (full limits, one host), and when
//! Redis cannot decide, per the rule's `on_redis_failure`:
//! * `local`: the rule's algorithm run locally with `limit ÷ hosts` (buckets: capacity
//!   and rate ÷ hosts; windows: limit ÷ hosts, same window), so `hosts` daemons
//!   together stay within the global limit (source `local`);
//! * `allow`: ALLOW (source `fail_open`);
//! * `deny`: DENY (source `fail_closed`).
//!
//! The local states are bounded (`fallback.max_keys`); evicting one never hands its
//! key a fresh budget: a state worth nothing (equal to a new key's) goes first, and a
//! key evicted while its state mattered comes back no fuller than it left
//! ([`restart`]).

mod restart;

use crate::algorithm::{Outcome, Params, State};
use crate::config::{OnRedisFailure, Rule};
use crate::decision::{Decision, Source};
use crate::key::KeyHash;
use crate::state_map::{Evicted, Slot, StateMap};
use metrics::Counter;
use std::sync::atomic::{AtomicU32, Ordering};

/// `wait_ms`/`reset_ms` of a `fail_closed` DENY: about when the circuit is probed again.
pub const FAIL_CLOSED_RETRY_MS: u64 = 1000;

/// The daemons sharing the limits as last seen in Redis (`fallback.hosts = "auto"`):
/// set by the heartbeat, kept through an outage. At least 1 (this daemon); 1 until the
/// first heartbeat answers.
#[derive(Debug, Default)]
pub struct LiveHosts(AtomicU32);

impl LiveHosts {
    /// The count in force (at least 1).
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed).max(1)
    }

    /// Records `n` daemons alive; returns the count seen before (0: none yet).
    pub fn set(&self, n: u32) -> u32 {
        self.0.swap(n, Ordering::Relaxed)
    }
}

/// Per-key algorithm states kept in this process ("local buckets", whatever the
/// algorithm), keyed by the hash of `"<rule>:<key>"`, at most `fallback.max_keys` of
/// them. The state lives inline in a [`StateMap`] slot (32 bytes: two doubles for the
/// buckets and the fixed window, three for the sliding window counter; the sliding
/// window log keeps its entries in a heap buffer of its own, 24 bytes per admission
/// instant in its window).
pub struct LocalBuckets {
    buckets: StateMap<Option<State>>,
    /// The hosts sharing the limits of rules with `fallback.hosts = "auto"`.
    pub hosts: LiveHosts,
    /// Evictions of states worth nothing, and of states that still mattered.
    evictions: [Counter; 2],
}

impl LocalBuckets {
    /// Room for `max_keys` buckets; beyond that one is evicted: a state worth nothing
    /// (equal to a new key's) first, else the least useful by RRIP (a 2-bit CLOCK: a
    /// key not asked again recently goes first, a key asked only once before a key
    /// asked again). A key evicted while its state mattered comes back no fuller than
    /// it left (module [`restart`]).
    pub fn new(max_keys: u64) -> Self {
        LocalBuckets {
            buckets: StateMap::new(max_keys),
            hosts: LiveHosts::default(),
            evictions: crate::metrics::local_evictions(),
        }
    }

    /// Counts the evictions one decision made.
    fn count(&self, evicted: Evicted) {
        if evicted != Evicted::default() {
            self.evictions[0].increment(u64::from(evicted.fresh));
            self.evictions[1].increment(u64::from(evicted.used));
        }
    }

    /// The parameters of `rule`'s local share: `limit ÷ fallback_hosts`, or for `auto`
    /// `limit ÷` the daemons alive as last seen.
    pub fn share(&self, rule: &Rule) -> Params {
        if rule.fallback_auto {
            rule.algorithm.params(self.hosts.get())
        } else {
            rule.fallback_params
        }
    }

    /// Decides `cost` units for `key` (the [`crate::key::TagKey`] of `"<rule>:<key>"`)
    /// at `now_us`, the local clock ([`crate::clock::local_clock_us`]: µs since the
    /// epoch, so windows align as in Redis, and monotonic on the boot clock, so a
    /// wall-clock step neither refills nor freezes a bucket, and a suspend counts).
    /// `limit` is the rule's capacity/limit, reported as is (docs/PROTOCOL.md), even
    /// when `params` is a share of it. `tag` is the rule's
    /// [`crate::config::Rule::sketch_tag`]: what an evicted key of this rule left is
    /// found again by it, whatever the share is now.
    pub fn decide(
        &self,
        key: KeyHash,
        limit: u64,
        params: &Params,
        tag: u8,
        cost: u32,
        now_us: f64,
    ) -> Decision {
        let cost = u64::from(cost);
        let (mut outcome, evicted) = self.buckets.with_slot(key, now_us, |slot: Slot<'_, _>| {
            let mut wrote = false;
            if slot.new {
                if let Some(rec) = slot.recorded(tag) {
                    *slot.value = Some(restart::restart(params, rec, now_us));
                    wrote = true;
                }
            }
            let outcome = params.decide(slot.value, now_us, cost);
            // A decision that wrote nothing (a DENY, a cost of 0) left the state
            // as it was or fresher (a log dropping old entries): the stamp stays
            // an upper bound.
            if wrote || (outcome.allowed && cost > 0) {
                *slot.stamp = restart::stamp(&outcome, params, tag, now_us);
            }
            (outcome, slot.evicted)
        });
        self.count(evicted);
        if !outcome.allowed && !params.can_ever_pass(cost) {
            // This host's share is below `cost`: it cannot pass until Redis is back;
            // ask to retry about when the circuit is probed again, not in 1 ms.
            outcome.wait_ms = outcome.wait_ms.max(FAIL_CLOSED_RETRY_MS);
        }
        Decision {
            allowed: outcome.allowed,
            limit,
            remaining: outcome.remaining,
            reset_ms: outcome.reset_ms,
            wait_ms: outcome.wait_ms,
            source: Source::Local,
        }
    }

    /// Remembers what Redis just decided for `key` under `rule` (`outcome`, at `now_us`
    /// on the local clock): should Redis go away, the key's local bucket starts from
    /// there (its share of what Redis left), not full, so a drained key stays drained.
    ///
    /// A report only ever takes from the local bucket: it replaces the local state when
    /// it leaves less than the local state does now, never more. So the local bucket
    /// admits at most its own share over time, however often decisions go back and forth
    /// between Redis and it (Redis's own count does not know what was admitted locally).
    pub fn observe(&self, key: KeyHash, rule: &Rule, outcome: &Outcome, now_us: f64) {
        let params = self.share(rule);
        let unused = outcome.remaining as f64 / rule.limit().max(1) as f64;
        let reset_us = outcome.reset_ms as f64 * 1000.0;
        let mut seeded = Some(params.seed(unused, reset_us, now_us));
        let evicted = self.buckets.with_slot(key, now_us, |slot: Slot<'_, _>| {
            if let Some(rec) = slot.recorded(rule.sketch_tag) {
                *slot.value = Some(restart::restart(&params, rec, now_us));
            }
            let state = slot.value;
            // A cost of 0 reads what each would admit now and changes nothing that
            // matters (a log drops the entries that left its window).
            if state.is_none() {
                *state = seeded;
            } else {
                let here = params.decide(state, now_us, 0).remaining;
                let there = params.decide(&mut seeded, now_us, 0).remaining;
                if state.is_none() || there < here {
                    *state = seeded;
                }
            }
            let now = params.decide(state, now_us, 0);
            *slot.stamp = restart::stamp(&now, &params, rule.sketch_tag, now_us);
            slot.evicted
        });
        self.count(evicted);
    }

    /// Starts loading the local state of `key` into the CPU cache (a hint, before the
    /// batch of requests that will decide it: [`StateMap::prefetch`]).
    pub fn prefetch(&self, key: KeyHash) {
        self.buckets.prefetch(key);
    }

    /// Whether the map has outgrown the CPU caches ([`StateMap::outgrew_caches`]).
    pub fn outgrew_caches(&self) -> bool {
        self.buckets.outgrew_caches()
    }

    /// Whether a local bucket is held for `key` (for operators: `INSPECT`).
    pub fn holds(&self, key: KeyHash) -> bool {
        self.buckets.get_mut(key, |state| state.is_some()) == Some(true)
    }

    /// Forgets `key`'s local state (`RESET`): its next local decision starts as a new
    /// key's. Returns whether a bucket was held.
    pub fn forget(&self, key: KeyHash) -> bool {
        self.buckets.get_mut(key, |state| state.take().is_some()) == Some(true)
    }

    /// Keys currently held (exact; locks each shard in turn: for logs and metrics, not
    /// the hot path).
    pub fn len(&self) -> u64 {
        self.buckets.len()
    }

    /// True when no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The decision for a request Redis could not decide, per `rule.on_redis_failure`, at
/// `now_us` (the local clock, µs).
pub fn decide_without_redis(
    local: &LocalBuckets,
    rule: &Rule,
    key: KeyHash,
    cost: u32,
    now_us: f64,
) -> Decision {
    let limit = rule.limit();
    match rule.on_redis_failure {
        OnRedisFailure::Local => local.decide(
            key,
            limit,
            &local.share(rule),
            rule.sketch_tag,
            cost,
            now_us,
        ),
        OnRedisFailure::Allow => Decision {
            allowed: true,
            limit,
            remaining: limit - u64::from(cost).min(limit),
            reset_ms: 0,
            wait_ms: 0,
            source: Source::FailOpen,
        },
        OnRedisFailure::Deny => Decision {
            allowed: false,
            limit,
            remaining: 0,
            reset_ms: FAIL_CLOSED_RETRY_MS,
            wait_ms: FAIL_CLOSED_RETRY_MS,
            source: Source::FailClosed,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Kind, Per};

    fn rule(on: OnRedisFailure, hosts: u32) -> Rule {
        Rule::new(
            "r".into(),
            Algorithm {
                kind: Kind::TokenBucket,
                limit: 20,
                per: Per::Rate(0.001),
            },
            on,
            hosts,
        )
    }

    #[test]
    fn local_fallback_enforces_limit_divided_by_hosts() {
        let local = LocalBuckets::new(100);
        let r = rule(OnRedisFailure::Local, 4);
        let allowed = (0..20)
            .filter(|_| decide_without_redis(&local, &r, 7, 1, 0.0).allowed)
            .count();
        assert_eq!(allowed, 5);
        let d = decide_without_redis(&local, &r, 7, 1, 0.0);
        assert_eq!((d.limit, d.source), (20, Source::Local));
    }

    #[test]
    fn a_cost_above_the_share_waits_for_redis_not_1_ms() {
        let local = LocalBuckets::new(100);
        let r = Rule::new(
            "q".into(),
            Algorithm {
                kind: Kind::FixedWindow,
                limit: 3,
                per: Per::WindowMs(86_400_000),
            },
            OnRedisFailure::Local,
            4,
        );
        let d = decide_without_redis(&local, &r, 8, 1, 1.7e15);
        assert!(!d.allowed);
        assert_eq!(d.wait_ms, FAIL_CLOSED_RETRY_MS);
    }

    #[test]
    fn a_local_bucket_starts_from_what_redis_last_reported() {
        let local = LocalBuckets::new(100);
        let r = rule(OnRedisFailure::Local, 2);
        // Redis drained the key (0 of 20 left, full again in 20,000 s): with Redis gone,
        // this host's share (10) starts drained too, not full.
        let drained = Outcome {
            allowed: false,
            remaining: 0,
            reset_ms: 20_000_000,
            wait_ms: 1000,
            tier: None,
        };
        local.observe(7, &r, &drained, 1.0e15);
        assert!(!decide_without_redis(&local, &r, 7, 1, 1.0e15 + 1000.0).allowed);
        // 8 of 20 left in Redis: 4 of this host's 10.
        let half = Outcome {
            remaining: 8,
            ..drained
        };
        local.observe(8, &r, &half, 1.0e15);
        // A later report leaving more never gives the local bucket more.
        let full = Outcome {
            remaining: 20,
            ..drained
        };
        local.observe(8, &r, &full, 1.0e15);
        let allowed = (0..10)
            .filter(|_| decide_without_redis(&local, &r, 8, 1, 1.0e15).allowed)
            .count();
        assert_eq!(allowed, 4);
        // A key Redis never decided starts with the whole share.
        let allowed = (0..20)
            .filter(|_| decide_without_redis(&local, &r, 9, 1, 1.0e15).allowed)
            .count();
        assert_eq!(allowed, 10);
    }

    #[test]
    fn every_algorithm_seeds_a_drained_key_drained() {
        for kind in Kind::ALL {
            let per = match kind.spec().family {
                crate::algorithm::Family::Bucket { .. } => Per::Rate(0.01),
                crate::algorithm::Family::Window { .. } | crate::algorithm::Family::Slots => {
                    Per::WindowMs(60_000)
                }
            };
            let r = Rule::new(
                "s".into(),
                Algorithm {
                    kind: *kind,
                    limit: 10,
                    per,
                },
                OnRedisFailure::Local,
                1,
            );
            let local = LocalBuckets::new(10);
            let now = 1.7e15;
            let drained = Outcome {
                allowed: false,
                remaining: 0,
                reset_ms: 60_000,
                wait_ms: 60_000,
                tier: None,
            };
            local.observe(1, &r, &drained, now);
            let d = decide_without_redis(&local, &r, 1, 1, now + 1000.0);
            assert!(!d.allowed, "{kind:?}: {d:?}");
        }
    }

    #[test]
    fn auto_hosts_share_by_the_daemons_last_seen() {
        let local = LocalBuckets::new(100);
        let mut r = rule(OnRedisFailure::Local, 1);
        r.fallback_auto = true;
        // No heartbeat yet: the floor, 1 host, the whole capacity.
        assert_eq!(local.share(&r), r.algorithm.params(1));
        assert_eq!(local.hosts.set(4), 0);
        let allowed = (0..20)
            .filter(|_| decide_without_redis(&local, &r, 7, 1, 0.0).allowed)
            .count();
        assert_eq!(allowed, 5);
        local.hosts.set(0);
        assert_eq!(local.hosts.get(), 1);
    }

    #[test]
    fn fail_open_and_fail_closed() {
        let local = LocalBuckets::new(100);
        let d = decide_without_redis(&local, &rule(OnRedisFailure::Allow, 1), 7, 3, 0.0);
        assert!(d.allowed && d.source == Source::FailOpen && d.remaining == 17);
        let d = decide_without_redis(&local, &rule(OnRedisFailure::Deny, 1), 7, 3, 0.0);
        assert!(!d.allowed && d.source == Source::FailClosed && d.wait_ms > 0);
        assert!(local.is_empty());
    }
}
