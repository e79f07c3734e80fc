//! A query to the store: the decision a client waits for, and the deny cache's refresh,
//! which no client waits for.
//!
//! Both ask the store about the key on its route, hold a place in the cap of calls in
//! flight until the store is done (the peer's for a decision, the daemon's cap only for
//! a refresh), wait at most `redis.timeout_ms` and remember a DENY in the deny cache. The decision is then answered, or decided without Redis when
//! Redis failed. The refresh is a dry run: the script replies as it would to the request
//! but takes nothing, since nobody is admitted by it; the request that claimed it was
//! already answered from the cache.

use super::{ActiveRule, Decided, Limiter};
use crate::admission::CallPermit;
use crate::algorithm::Outcome;
use crate::clock::local_clock_us;
use crate::config::{OnRedisFailure, Rule};
use crate::decision::{Decision, Source};
use crate::fallback::decide_without_redis;
use crate::key::KeyHash;
use crate::store::{Store, StoreError};
use std::sync::Arc;
use std::time::Instant;

/// One decision to ask the store for: everything the call and the reading of its answer
/// need, owned, so that it can run on a task of its own.
pub(super) struct Query<S: Store> {
    pub(super) limiter: Arc<Limiter<S>>,
    pub(super) redis: Arc<S>,
    /// Where `redis_key`'s calls go ([`Store::route`]).
    pub(super) route: S::Route,
    /// The rule in force for the key as this daemon knows it (a run-time override
    /// seen, else `base`).
    pub(super) entry: Arc<ActiveRule>,
    /// The rule's own entry for the key (its static override's, if any).
    pub(super) base: Arc<ActiveRule>,
    pub(super) redis_key: S::Key,
    /// The key of the deny cache and the local buckets.
    pub(super) key: KeyHash,
    pub(super) cost: u32,
    /// The deny cache's generation, read before the rule was looked up (a reload bumps
    /// it after putting its rules in force).
    pub(super) generation: u64,
}

impl<S: Store> Query<S> {
    /// The decision a client waits for: Redis's, or on a Redis failure the rule's
    /// `on_redis_failure`, never an error.
    pub(super) async fn decide(self, slot: CallPermit) -> Decided {
        let (decision, entry) = match self.call(slot, false).await {
            Ok((o, entry)) => {
                let rule = &entry.rule;
                if rule.on_redis_failure == OnRedisFailure::Local {
                    self.limiter
                        .local
                        .observe(self.key, rule, &o, local_clock_us());
                }
                (redis_decision(rule, &o), entry)
            }
            Err(_) => (
                decide_without_redis(
                    &self.limiter.local,
                    &self.entry.rule,
                    self.key,
                    self.cost,
                    local_clock_us(),
                ),
                Arc::clone(&self.entry),
            ),
        };
        entry.came_back(self.key, decision)
    }

    /// Starts the refresh of the deny cache's entry for this key on a task of its own:
    /// a dry run whose DENY replaces the entry and whose ALLOW drops it (the next request
    /// asks Redis for real). A failure leaves the entry to lapse at the end of its grace.
    /// Outside a Tokio runtime nothing starts, with the same effect.
    pub(super) fn refresh(self, slot: CallPermit) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // The dry run's DENY is the real one (a DENY takes nothing): the local
                // bucket follows it, as after any decision from Redis.
                if let Ok((o, entry)) = self.call(slot, true).await {
                    let rule = &entry.rule;
                    if !o.allowed && rule.on_redis_failure == OnRedisFailure::Local {
                        self.limiter
                            .local
                            .observe(self.key, rule, &o, local_clock_us());
                    }
                }
            });
        }
    }

    /// Runs the script (a dry run with `peek`), bounded by `redis.timeout_ms`, and
    /// remembers a DENY in the deny cache (with `peek`, an ALLOW drops the entry whose
    /// refresh this is). Counts the call and its failure in the metrics; a failure of
    /// this key's own is logged when a request is decided without Redis because of it
    /// (not for a dry run: the next request's call logs it).
    ///
    /// Answers the outcome with the entry in force for the key as Redis decided it
    /// (under a run-time override, the override's: [`super::tiers::Tiers::resolve`]).
    ///
    /// # Errors
    /// The [`StoreError`] of a failed call, already counted.
    async fn call(
        &self,
        slot: CallPermit,
        peek: bool,
    ) -> Result<(Outcome, Arc<ActiveRule>), StoreError> {
        let rule = &self.entry.rule;
        let asked = Instant::now();
        let asked_us = local_clock_us();
        // The call owns what it needs and the slot: if the reply goes out on the
        // timeout, or the client goes away, it finishes on its own and frees the slot
        // only when Redis is done with it. Bounded by redis.timeout_ms.
        let answer = self
            .redis
            .decide(
                self.route.clone(),
                self.redis_key.clone(),
                // The rule's own parameters, never an override's as last seen: the
                // script puts the override in force now in their place, and one
                // cleared since must not outlive its clearing.
                self.base.rule.params,
                self.cost,
                peek,
                slot,
            )
            .await;
        let limiter = &self.limiter;
        limiter.redis_calls.took(asked.elapsed());
        match answer {
            Ok(o) => {
                let entry = limiter.tiers.resolve(&self.base, self.key, o.tier);
                // Not remembered if a reload cleared the cache meanwhile (its generation
                // moved on): this DENY was computed with the old limits.
                let d = redis_decision(&entry.rule, &o);
                limiter
                    .cache
                    .remember(self.key, self.cost, &d, asked_us, self.generation, peek);
                Ok((o, entry))
            }
            Err(e) => {
                match &e {
                    StoreError::Unavailable { kind, .. } => limiter.redis_calls.failed(kind),
                    // This key's problem, not Redis's.
                    _ => {
                        limiter.redis_calls.failed("key");
                        if !peek {
                            limiter.log_key_error(&rule.name, S::key_text(&self.redis_key), &e);
                        }
                    }
                }
                Err(e)
            }
        }
    }
}

/// Redis's answer `o` under `rule`, as the reply states it.
pub(super) fn redis_decision(rule: &Rule, o: &Outcome) -> Decision {
    Decision {
        allowed: o.allowed,
        limit: rule.limit(),
        remaining: o.remaining,
        reset_ms: o.reset_ms,
        wait_ms: o.wait_ms,
        source: Source::Redis,
    }
}
