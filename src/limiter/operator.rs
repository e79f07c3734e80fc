//! What the operator verbs ask of the limiter: a key's state without taking anything
//! (`INSPECT`), a key's state deleted (`RESET`), the rules in force (`RULES`); `TOP` is
//! [`Limiter::top_keys`]. The server formats the answers; the access check
//! (`server.admin_uids`) is the server's too.
//!
//! Neither verb counts as a decision: no decision counter, no hot key, no deny cache
//! entry comes from them.

use super::query::redis_decision;
use super::{ActiveRule, CheckError, Limiter};
use crate::admission::Peer;
use crate::algorithm::{Kind, Outcome};
use crate::clock::local_clock_us;
use crate::config::Rule;
use crate::decision::Decision;
use crate::fallback::decide_without_redis;
use crate::key::{fits, tag_in, KeyHash, TAG_MAX};
use crate::store::{Store, StoreError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What `INSPECT <rule> <key>` reports.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The rule in force, its parameters.
    pub rule: Arc<Rule>,
    /// The answer a `CHECK` of cost 0 would get now (nothing taken; from Redis by a dry
    /// run, else as the rule decides without Redis).
    pub decision: Decision,
    /// The rule's policy window, ms.
    pub window_ms: u64,
    /// Leases this daemon holds on the key, and their unspent units.
    pub lease_grants: u64,
    /// Units of those leases not spent yet.
    pub lease_units: u64,
    /// The key's hash slot, when the store has slots.
    pub slot: Option<u16>,
    /// The primary owning the key (`host:port`), when known.
    pub primary: Option<String>,
    /// This daemon holds a DENY for the key in its deny cache.
    pub cached_deny: bool,
    /// This daemon holds a local bucket for the key.
    pub local_bucket: bool,
    /// Why the store was not asked, or failed (the decision is then decided without it).
    pub store_error: Option<String>,
    /// A `concurrency` rule's slots (`None` for the rate algorithms).
    pub slots: Option<SlotsSeen>,
    /// The key's run-time override (`OVERRIDE`) in Redis, as `param=value` pairs;
    /// `None` without one (or when Redis was not asked).
    pub override_text: Option<String>,
    /// That override's remaining ttl, ms (`None`: until cleared).
    pub override_ttl_ms: Option<u64>,
}

/// What `INSPECT` reports of a `concurrency` key's slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotsSeen {
    /// Slots the key holds, by all hosts: from Redis (`limit − remaining` of a dry run,
    /// so `limit` when it holds more, as slots handed back after an outage may make it);
    /// this daemon's in `mode = "none"`; `None` when Redis could not be asked.
    pub held: Option<u64>,
    /// Slots of the key this daemon's clients hold (their `max_hold` not ended).
    pub held_here: u64,
    /// The rule's `max_hold`, ms.
    pub max_hold_ms: u64,
}

/// An operator's answer on its way (a Redis call, bounded by `redis.timeout_ms`).
pub type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S: Store> Limiter<S> {
    /// The rule named `name` in force, if any.
    pub fn rule(&self, name: &str) -> Option<Arc<Rule>> {
        self.rules.load().get(name).map(|e| Arc::clone(&e.rule))
    }

    /// Every rule in force, by name.
    pub fn rules(&self) -> Vec<Arc<Rule>> {
        let mut rules: Vec<Arc<Rule>> = self
            .rules
            .load()
            .values()
            .map(|e| Arc::clone(&e.rule))
            .collect();
        rules.sort_by(|a, b| a.name.cmp(&b.name));
        rules
    }

    /// The entry of rule `rule` and the hash of its tag with `key`.
    pub(super) fn operated(
        &self,
        rule: &[u8],
        key: &[u8],
    ) -> Result<(Arc<ActiveRule>, KeyHash), CheckError> {
        let rules = self.rules.load();
        let entry = std::str::from_utf8(rule)
            .ok()
            .and_then(|name| rules.get(name))
            .ok_or(CheckError::UnknownRule)?;
        if !fits(rule, key) {
            return Err(CheckError::KeyTooLong);
        }
        Ok((Arc::clone(entry), self.keys.of(rule, key)))
    }

    /// `INSPECT`: the state of `key` under `rule` as a `CHECK` of cost 0 would see it,
    /// and what this daemon holds for it. A Redis call holds one of `peer`'s slots of
    /// requests in flight to Redis.
    ///
    /// # Errors
    /// Unknown rule, a key too long, or `peer` at its share of requests in flight
    /// ([`CheckError::Busy`]).
    pub fn inspect(
        self: &Arc<Self>,
        rule: &[u8],
        key: &[u8],
        peer: &Peer,
    ) -> Result<Pending<Inspection>, CheckError> {
        let (entry, hash) = self.operated(rule, key)?;
        let now = local_clock_us();
        let mut seen = self.seen_here(Arc::clone(&entry.rule), hash, now);
        let Some(redis) = &self.redis else {
            self.inspect_locally(&mut seen, hash, now);
            return Ok(Box::pin(std::future::ready(seen)));
        };
        let mut buf = [0u8; TAG_MAX];
        let tag = tag_in(&mut buf, &seen.rule.name, key).ok_or(CheckError::KeyTooLong)?;
        let redis_key = redis.key(tag, &seen.rule.params);
        (seen.slot, seen.primary) = redis.locate(&redis_key);
        let Some(route) = redis.route(&redis_key) else {
            if seen.slots.is_none() {
                seen.decision = decide_without_redis(&self.local, &seen.rule, hash, 0, now);
            }
            seen.store_error = Some("the key's primary is bypassed (its breaker is open)".into());
            return Ok(Box::pin(std::future::ready(seen)));
        };
        let slot = peer.call_permit().ok_or_else(|| CheckError::busy(peer))?;
        // The override's text and ttl: a second call, when a slot is free.
        let second = peer.call_permit();
        let (this, redis) = (Arc::clone(self), Arc::clone(redis));
        let base = Arc::clone(entry.for_key(key));
        Ok(Box::pin(async move {
            let r = Arc::clone(&seen.rule);
            if let Some(second) = second {
                let (route, key) = (route.clone(), redis_key.clone());
                if let Ok(Some((text, ttl))) = redis.read_tier(route, key, second).await {
                    seen.override_text = Some(text);
                    seen.override_ttl_ms = ttl;
                }
            }
            let answer = redis
                .decide(route, redis_key, r.params, 0, true, slot)
                .await;
            this.seen_in_redis(&mut seen, &base, hash, answer);
            seen
        }))
    }

    /// What this daemon holds for `hash` under `rule`, before any Redis call: its
    /// leases, deny cache entry and local bucket, and (a concurrency rule) its slots.
    fn seen_here(&self, rule: Arc<Rule>, hash: u64, now: f64) -> Inspection {
        let (lease_grants, lease_units) = self.leases.held_by(hash);
        let mut seen = Inspection {
            decision: Decision {
                allowed: true,
                limit: rule.limit(),
                remaining: 0,
                reset_ms: 0,
                wait_ms: 0,
                source: crate::decision::Source::Local,
            },
            window_ms: rule.window_ms,
            lease_grants,
            lease_units,
            slot: None,
            primary: None,
            cached_deny: self.cache.holds(hash, now),
            local_bucket: self.local.holds(hash),
            store_error: None,
            slots: None,
            override_text: None,
            override_ttl_ms: None,
            rule,
        };
        if seen.rule.params.kind() == Kind::Concurrency {
            let held_here = self.slots_held_of(hash);
            // Until Redis answers: this daemon's slots, as `mode = "none"` counts them.
            seen.decision.remaining = seen.rule.limit().saturating_sub(held_here);
            seen.slots = Some(SlotsSeen {
                held: None,
                held_here,
                max_hold_ms: seen.rule.window_ms,
            });
        }
        seen
    }

    /// `seen` without a store (`redis.mode = "none"`): this daemon's slots, its local
    /// bucket's state, or a new key's, without making it a bucket.
    fn inspect_locally(&self, seen: &mut Inspection, hash: u64, now: f64) {
        if let Some(s) = &mut seen.slots {
            s.held = Some(s.held_here);
            return;
        }
        let r = &seen.rule;
        seen.decision = if seen.local_bucket {
            self.local
                .decide(hash, r.limit(), &r.params, r.sketch_tag, 0, now)
        } else {
            let o = r.params.decide(&mut None, now, 0);
            Decision {
                allowed: o.allowed,
                limit: r.limit(),
                remaining: o.remaining,
                reset_ms: o.reset_ms,
                wait_ms: o.wait_ms,
                source: crate::decision::Source::Local,
            }
        };
    }

    /// `seen` after the store's dry run `answer`: the key's state under the parameters
    /// in force (a run-time override's, if any), or the error and the local view.
    fn seen_in_redis(
        &self,
        seen: &mut Inspection,
        base: &Arc<ActiveRule>,
        hash: u64,
        answer: Result<Outcome, StoreError>,
    ) {
        match answer {
            Ok(o) => {
                let r = self.tiers.resolve(base, hash, o.tier).rule.clone();
                seen.window_ms = r.window_ms;
                seen.decision = redis_decision(&r, &o);
                if let Some(s) = &mut seen.slots {
                    s.held = Some(r.limit().saturating_sub(o.remaining));
                }
                seen.rule = r;
            }
            Err(e) => {
                if seen.slots.is_none() {
                    let now = local_clock_us();
                    seen.decision = decide_without_redis(&self.local, &seen.rule, hash, 0, now);
                }
                seen.store_error = Some(e.to_string());
            }
        }
    }

    /// `RESET`: deletes `key`'s state under `rule` in the store, then in this daemon's
    /// local buckets, and clears this daemon's deny cache (whole: a DENY is remembered
    /// per thread too, and a reset is rare; the keys it held are asked of Redis once
    /// more). Other daemons' cached DENYs of the key end within `cache.ttl_ms`; a lease
    /// a daemon holds on the key is spent until its deadline (its grant is gone from
    /// Redis: its unspent units lapse).
    ///
    /// # Errors
    /// As [`Limiter::inspect`]. The future's `Err` says why the store's state was not
    /// deleted (the key's primary bypassed, or the call failed); the local state is
    /// forgotten anyway.
    pub fn reset(
        self: &Arc<Self>,
        rule: &[u8],
        key: &[u8],
        peer: &Peer,
    ) -> Result<Pending<Result<(), String>>, CheckError> {
        let (entry, hash) = self.operated(rule, key)?;
        let slots = entry.rule.params.kind() == Kind::Concurrency;
        let forget = move |this: &Self| {
            this.local.forget(hash);
            this.cache.clear();
            if slots {
                this.slots_reset(hash);
            }
        };
        let Some(redis) = &self.redis else {
            forget(self);
            return Ok(Box::pin(std::future::ready(Ok(()))));
        };
        let mut buf = [0u8; TAG_MAX];
        let tag = tag_in(&mut buf, &entry.rule.name, key).ok_or(CheckError::KeyTooLong)?;
        let redis_key = redis.key(tag, &entry.rule.params);
        let Some(route) = redis.route(&redis_key) else {
            forget(self);
            return Ok(Box::pin(std::future::ready(Err(
                "the key's primary is bypassed (its breaker is open): its state in Redis is unchanged; retry when it is back".into(),
            ))));
        };
        let slot = peer.call_permit().ok_or_else(|| CheckError::busy(peer))?;
        let (this, redis) = (Arc::clone(self), Arc::clone(redis));
        Ok(Box::pin(async move {
            let deleted = redis.delete(route, redis_key, slot).await;
            // After the delete: a DENY Redis gave before it is not remembered after.
            forget(&this);
            deleted.map_err(|e| format!("Redis did not delete the key's state: {e}"))
        }))
    }
}
