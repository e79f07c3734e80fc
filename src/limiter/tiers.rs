//! Run-time overrides (`OVERRIDE <rule> <key> <param>=<value>... [ttl=<duration>]`):
//! a key's tier changed while the daemons run, for every host at once.
//!
//! The override lives in Redis with the key's state: in the state hash itself for the
//! algorithms whose state is a hash, else in the hash `<state key>:ov` beside it
//! (`crate::store` writes it), and the key's decision script reads it with the state
//! (`lua/prelude.lua` override()): every host's next decision applies it, with no
//! config push, and Redis stays the one place that decides. The script reports the
//! parameters it used; this daemon remembers them per key ([`Tiers`], bounded) so that
//! its replies carry the overridden `limit` and policy window, and so that its local
//! fallback, when Redis stops answering, decides the key under the override it last
//! saw.
//!
//! A rule with `lease = "auto"` takes one too: its lease scripts decide an overridden
//! key under the override, grant no lease on it while it lasts, and say so; the daemon
//! then decides the key per request (`src/lease/granted.rs`). Leases already out end
//! within their lifetime, so every host honours the override within one lease
//! lifetime (docs/DESIGN.md "Leases", "Run-time overrides on a leased rule").

use super::{ActiveRule, CheckError, Limiter, Pending};
use crate::algorithm::{Algorithm, Kind, Tier};
use crate::config::overrides;
use crate::key::{tag_in, KeyHash, TAG_MAX};
use crate::store::{scripts, Store, TierRecord};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The run-time overrides this daemon has seen, by key: the rule as it applies to
/// each (bounded; an entry not seen for [`IDLE`] is dropped, so the fallback of a key
/// Redis stopped deciding long ago reverts to the rule's own parameters).
pub(super) struct Tiers {
    cache: moka::sync::Cache<KeyHash, Arc<ActiveRule>, crate::key::Prehashed>,
    /// Set at the first entry: until then a decision does not look (one load).
    any: AtomicBool,
}

/// How long a seen override is remembered without being seen again.
const IDLE: std::time::Duration = std::time::Duration::from_secs(600);

impl Tiers {
    /// At most `max_keys` keys' overrides.
    pub(super) fn new(max_keys: u64) -> Self {
        Tiers {
            cache: moka::sync::Cache::builder()
                .max_capacity(max_keys)
                .time_to_idle(IDLE)
                .build_with_hasher(crate::key::Prehashed),
            any: AtomicBool::new(false),
        }
    }

    /// The rule in force for the key whose hash `hash()` gives, as last seen, if under
    /// an override (the hash is not computed while no override was ever seen).
    pub(super) fn get_with(&self, hash: impl FnOnce() -> KeyHash) -> Option<Arc<ActiveRule>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.cache.get(&hash())
    }

    /// [`Tiers::get_with`] of a hash at hand.
    pub(super) fn get(&self, hash: KeyHash) -> Option<Arc<ActiveRule>> {
        self.get_with(|| hash)
    }

    /// The entry a reply of Redis's puts in force for `hash`: `tier`'s, built from
    /// `base` (the rule's own entry) and remembered, or `base` when the reply had none
    /// (any remembered override is forgotten). A tier not valid for the rule's
    /// algorithm (a reload changed it meanwhile) is ignored.
    pub(super) fn resolve(
        &self,
        base: &Arc<ActiveRule>,
        hash: KeyHash,
        tier: Option<Tier>,
    ) -> Arc<ActiveRule> {
        let Some(tier) = tier else {
            if self.any.load(Ordering::Relaxed) {
                self.cache.invalidate(&hash);
            }
            return Arc::clone(base);
        };
        if let Some(known) = self.get(hash) {
            if Tier::of(&known.rule.algorithm) == tier && known.rule.name == base.rule.name {
                return known;
            }
        }
        match tier.algorithm(base.rule.algorithm.kind) {
            Some(algorithm) => self.remember(base, hash, algorithm),
            None => Arc::clone(base),
        }
    }

    /// Remembers `base`'s rule with `algorithm`'s parameters for `hash`.
    fn remember(
        &self,
        base: &Arc<ActiveRule>,
        hash: KeyHash,
        algorithm: crate::algorithm::Algorithm,
    ) -> Arc<ActiveRule> {
        let entry = Arc::new(base.tiered(algorithm));
        self.any.store(true, Ordering::Relaxed);
        self.cache.insert(hash, Arc::clone(&entry));
        entry
    }

    /// Forgets every override (a reload: the entries hold the old rules).
    pub(super) fn clear(&self) {
        self.cache.invalidate_all();
    }
}

impl ActiveRule {
    /// This entry's rule with `algorithm`'s parameters: the same counters' series, hot
    /// keys and shadow log.
    fn tiered(&self, algorithm: crate::algorithm::Algorithm) -> ActiveRule {
        ActiveRule {
            rule: Arc::new(self.rule.with_algorithm(algorithm)),
            counters: crate::metrics::DecisionCounters::new(&self.rule.name),
            detached: self.detached,
            hot: self.hot.clone(),
            overrides: Vec::new(),
            shadow_log: Arc::clone(&self.shadow_log),
        }
    }
}

/// The record `OVERRIDE` writes for `params` on `base` (`None`: a clear) with the
/// overridden algorithm, for `ttl_ms`.
///
/// On a leased rule any override is taken: Redis grants no lease under it, and the
/// leases out when it is written are spent for at most one lease lifetime more, under
/// the parameters they were granted under (docs/DESIGN.md "Run-time overrides on a
/// leased rule").
///
/// # Errors
/// [`CheckError::Override`]: a bad parameter.
fn record_of(
    base: &crate::config::Rule,
    params: &[(&str, &str)],
    ttl_ms: Option<u64>,
) -> Result<Option<(TierRecord, Algorithm)>, CheckError> {
    Ok(if params.is_empty() {
        None
    } else {
        let algorithm = overrides::run_time(base, params).map_err(refused)?;
        let tiered = base.with_algorithm(algorithm);
        let args = scripts::args(&tiered.params, 0);
        let [a, b, ..] = &args[..] else {
            return Err(refused("the algorithm takes no parameters".into()));
        };
        Some((
            TierRecord {
                args: [a.clone(), b.clone()],
                tier: Tier::of(&algorithm),
                text: overrides::text(&algorithm),
                ttl_ms,
            },
            algorithm,
        ))
    })
}

/// A refused `OVERRIDE` whose rule cannot take one.
fn refused(why: String) -> CheckError {
    CheckError::Override { message: why }
}

impl<S: Store> Limiter<S> {
    /// `OVERRIDE`: gives `key` of `rule` the parameters `params` (`(param, value)`
    /// pairs, validated as `[[rule.override]]` is) for `ttl_ms` (`None`: until
    /// cleared), or clears its override when `params` is empty. Written to Redis with
    /// the key's state; this daemon's deny cache is cleared (as `RESET` does), other
    /// daemons' cached DENYs of the key end within `cache.ttl_ms`.
    ///
    /// # Errors
    /// Unknown rule, a key too long, `peer` at its share of requests in flight, or
    /// [`CheckError::Override`]: a composite or concurrency rule, no Redis
    /// (`redis.mode = "none"`), or a bad parameter. The future's `Err` says why Redis
    /// did not take it.
    ///
    /// On a leased rule (`lease = "auto"`) only an override that admits at least what
    /// the rule admits is taken (higher capacity and rate, or a higher limit over the
    /// same window): leases taken under the rule may still be spent for a lease
    /// lifetime after it. This daemon stops spending its lease on the key once Redis
    /// holds the override (or may lease it again once it is cleared); other daemons do
    /// at their next call of the key, at the latest when their lease runs out.
    pub fn set_override(
        self: &Arc<Self>,
        rule: &[u8],
        key: &[u8],
        params: &[(&str, &str)],
        ttl_ms: Option<u64>,
        peer: &crate::admission::Peer,
    ) -> Result<Pending<Result<(), String>>, CheckError> {
        let (entry, hash) = self.operated(rule, key)?;
        let base = &entry.rule;
        if !base.all_of.is_empty() {
            return Err(refused(format!(
                "rule '{}' is composite (all_of): override its members",
                base.name
            )));
        }
        if base.params.kind() == Kind::Concurrency {
            return Err(refused(format!("rule '{}' is a concurrency rule: OVERRIDE changes the rate algorithms' parameters (capacity, refill_rate, leak_rate, limit, window), not limit or max_hold of slots", base.name)));
        }
        let record = record_of(base, params, ttl_ms)?;
        let Some(redis) = &self.redis else {
            return Err(refused(
                "redis.mode = \"none\": overrides live in Redis; use [[rule.override]]".into(),
            ));
        };
        let mut buf = [0u8; TAG_MAX];
        let tag = tag_in(&mut buf, &base.name, key).ok_or(CheckError::KeyTooLong)?;
        let redis_key = redis.key(tag, &base.params);
        let Some(route) = redis.route(&redis_key) else {
            return Ok(Box::pin(std::future::ready(Err(
                "the key's primary is bypassed (its breaker is open): the override was not written; retry when it is back".into(),
            ))));
        };
        let slot = peer.call_permit().ok_or_else(|| CheckError::busy(peer))?;
        let (this, redis) = (Arc::clone(self), Arc::clone(redis));
        Ok(Box::pin(async move {
            let (write, algorithm) = match record {
                Some((r, a)) => (Some(r), Some(a)),
                None => (None, None),
            };
            let written = redis.set_tier(route, redis_key, write, slot).await;
            if written.is_ok() && entry.rule.lease {
                let on = algorithm.is_some();
                this.leases.told(hash, on, crate::clock::boottime_us());
            }
            match algorithm {
                // Remembered once Redis holds it: the next decision reports it anyway.
                Some(a) if written.is_ok() => {
                    this.tiers.remember(&entry, hash, a);
                }
                Some(_) => {}
                None => this.tiers.cache.invalidate(&hash),
            }
            // After the write: a DENY given under the old parameters is not remembered.
            this.cache.clear();
            written.map_err(|e| format!("Redis did not take the override: {e}"))
        }))
    }
}
