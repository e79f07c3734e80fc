//! One `CHECK`'s path through the limiter (the diagram in [`super`]): the rule
//! looked up, the peer's permission and the cost checked, then the deny cache, the
//! key's primary and its breaker, the store's bounded call, or the fallback.

use super::*;

impl<S: Store> Limiter<S> {
    /// Decides `CHECK rule key cost` for `peer` (key and cost already valid per the
    /// protocol); local decisions and cache hits take the time from `clock`.
    pub fn check(
        self: &Arc<Self>,
        rule: &[u8],
        key: &[u8],
        cost: u32,
        clock: &mut BatchClock,
        peer: &Peer,
    ) -> Check {
        // Read before the rules: a reload puts its rules in force, then clears the
        // cache and bumps this, so a DENY computed under rules loaded before the bump is
        // never remembered after it.
        let generation = self.cache.generation();
        let rules = self.rules.load();
        let Some(entry) = std::str::from_utf8(rule)
            .ok()
            .and_then(|name| rules.get(name))
        else {
            return Check::Ready(Err(CheckError::UnknownRule));
        };
        self.check_entry(entry, key, cost, clock, peer, generation)
    }

    /// Decides `cost` units of `key` under a [`Detached`] rule, as [`Limiter::check`]
    /// does for a named rule.
    pub fn check_detached(
        self: &Arc<Self>,
        rule: &Detached,
        key: &[u8],
        cost: u32,
        clock: &mut BatchClock,
        peer: &Peer,
    ) -> Check {
        let generation = self.cache.generation();
        self.check_entry(&rule.0, key, cost, clock, peer, generation)
    }

    /// Decides `cost` units of `key` under `entry`'s rule; `generation` is the deny
    /// cache's, read before the rule was looked up.
    pub(super) fn check_entry(
        self: &Arc<Self>,
        entry: &Arc<ActiveRule>,
        key: &[u8],
        cost: u32,
        clock: &mut BatchClock,
        peer: &Peer,
        generation: u64,
    ) -> Check {
        if let Some(refused) = unservable(&entry.rule) {
            return Check::Ready(Err(refused));
        }
        // A per-key override decides with its own parameters; a run-time one
        // (`OVERRIDE`, as last seen from Redis) wins over a static one.
        let base = entry.for_key(key);
        let tiered = self
            .tiers
            .get_with(|| self.keys.of(base.rule.name.as_bytes(), key));
        let entry = tiered.as_ref().unwrap_or(base);
        let rule = &entry.rule;
        if let Some(refused) = refusal(entry, base, key, cost, peer) {
            return Check::Ready(Err(refused));
        }
        let key_bytes = key;
        let key = self.keys.of(rule.name.as_bytes(), key_bytes);
        let decided = |decision: Decision, clock: &mut BatchClock| {
            Check::Ready(Ok(entry.decided_now(
                key,
                key_bytes,
                decision,
                clock.now_us(),
            )))
        };

        let Some(redis) = &self.redis else {
            let (limit, now) = (rule.limit(), clock.now_us());
            let local = self
                .local
                .decide(key, limit, &rule.params, rule.sketch_tag, cost, now);
            return decided(local, clock);
        };
        // A cached DENY answers, also the request that claims an expired entry's
        // refresh (below); leased rules decide from their lease, without the cache.
        let refresh = match self.cached(rule, key, cost, clock.now_us()) {
            Lookup::Hit(cached) => return decided(cached, clock),
            Lookup::Miss => None,
            Lookup::Refresh(cached) => Some(cached),
        };
        let mut buf = [0u8; TAG_MAX];
        // Cannot fail: the length was checked above, and rule names and keys are ASCII.
        let Some(tag) = tag_in(&mut buf, &rule.name, key_bytes) else {
            return Check::Ready(Err(CheckError::KeyTooLong));
        };
        if rule.lease {
            return self.check_leased(entry, base, redis, tag, key, cost, peer, clock.now_us());
        }
        let redis_key = redis.key(tag, &rule.params);
        // Only the primary owning this key's slot matters: keys of healthy primaries
        // keep going to Redis while another primary is down.
        let Some(route) = redis.route(&redis_key) else {
            // Answered from the cached DENY it claimed (the entry then lapses at the
            // end of its grace), or per the rule's `on_redis_failure`.
            let now = clock.now_us();
            let without = || decide_without_redis(&self.local, rule, key, cost, now);
            return decided(refresh.unwrap_or_else(without), clock);
        };
        let query = query::Query {
            limiter: Arc::clone(self),
            redis: Arc::clone(redis),
            route,
            entry: Arc::clone(entry),
            base: Arc::clone(base),
            redis_key,
            key,
            cost,
            generation,
        };
        self.ask(query, refresh, key_bytes, peer, clock)
    }

    /// The deny cache's entry for `key` under `rule` at `now_us`; a leased rule's
    /// requests decide from its lease, never from the cache ([`Lookup::Miss`]).
    fn cached(&self, rule: &Rule, key: crate::key::KeyHash, cost: u32, now_us: f64) -> Lookup {
        if rule.lease {
            Lookup::Miss
        } else {
            self.cache.lookup(key, cost, now_us)
        }
    }

    /// Sends `query` to Redis for a client waiting on it; or, when this request claimed
    /// the refresh of an expired cached DENY (`refresh`), answers from that entry like
    /// the other requests, and a dry run refreshes the entry in the background,
    /// gathered with the other refreshes claimed within a few ms (unless the daemon is
    /// at its cap of calls in flight to Redis: then the entry lapses at the end of its
    /// grace).
    fn ask(
        self: &Arc<Self>,
        query: query::Query<S>,
        refresh: Option<Decision>,
        key_bytes: &[u8],
        peer: &Peer,
        clock: &mut BatchClock,
    ) -> Check {
        let (key, cost) = (query.key, query.cost);
        if let Some(cached) = refresh {
            let answer = query
                .entry
                .decided_now(key, key_bytes, cached, clock.now_us());
            if let Some(slot) = peer.background_permit() {
                self.refreshes.push(query, slot);
            }
            return Check::Ready(Ok(answer));
        }
        let Some(slot) = peer.call_permit() else {
            return self.no_redis_slot(&query.entry, key, cost, peer);
        };
        query.entry.sent(key, key_bytes, clock.now_us());
        Check::Redis(Box::pin(query.decide(slot)))
    }

    /// The answer when `peer` holds its share of the requests in flight to Redis (or the
    /// daemon its cap): `ERR BUSY` for a socket client, which retries or fails open by
    /// its own policy; for a detached rule (the Envoy front end, one peer standing for
    /// every application behind Envoy) a decision without Redis, per the rule's
    /// `on_redis_failure`, as when Redis is slow: an error would hand the decision to
    /// Envoy's `failure_mode_deny`.
    pub(super) fn no_redis_slot(
        &self,
        entry: &ActiveRule,
        key: u64,
        cost: u32,
        peer: &Peer,
    ) -> Check {
        if entry.detached {
            let now = local_clock_us();
            let decision = decide_without_redis(&self.local, &entry.rule, key, cost, now);
            // A detached rule keeps no hot keys: the key's bytes are not needed.
            return Check::Ready(Ok(entry.decided_now(key, &[], decision, now)));
        }
        Check::Ready(Err(CheckError::busy(peer)))
    }

    /// Logs a per-key Redis error, at most once per [`KEY_ERROR_LOG_INTERVAL`]. The key
    /// is client data: the line names the rule and a hash of the Redis key
    /// ([`crate::key::log_hash`]), never the key.
    pub(super) fn log_key_error(&self, rule: &str, redis_key: &str, error: &dyn std::fmt::Display) {
        if let Some(suppressed) = self.key_errors.admit() {
            let key_hash = crate::key::log_hash(redis_key);
            tracing::warn!(rule, key_hash, %error, suppressed, "Redis could not decide a key; decided per on_redis_failure (further such errors logged at most every 10 s)");
        }
    }
}

/// Why a `CHECK` of `rule` is refused whatever its key: a composite rule is decided by
/// [`Limiter::check_composite`], a concurrency rule's slots by `ACQUIRE`.
fn unservable(rule: &Rule) -> Option<CheckError> {
    if !rule.all_of.is_empty() {
        return Some(CheckError::Composite {
            rule: rule.name.clone(),
        });
    }
    (rule.params.kind() == crate::algorithm::Kind::Concurrency).then(|| CheckError::Concurrency {
        rule: rule.name.clone(),
    })
}

/// Why `peer`'s request of `cost` units of `key` is refused under `entry` (the rule in
/// force for the key; `base` the rule's own, without a run-time override), if it is.
fn refusal(
    entry: &ActiveRule,
    base: &ActiveRule,
    key: &[u8],
    cost: u32,
    peer: &Peer,
) -> Option<CheckError> {
    let rule = &entry.rule;
    if let Some(refused) = forbidden_or_above(entry, base, cost, peer) {
        return Some(refused);
    }
    // The tag "<rule>:<key>" is hashed from its parts: local decisions and cache
    // hits never build it; a Redis call builds it on the stack, then its Redis key.
    (!fits(rule.name.as_bytes(), key)).then_some(CheckError::KeyTooLong)
}

/// Why `peer` may not ask `cost` units under `entry` (`base`: the rule's own entry for
/// the key, before a run-time override), if it may not: the rule forbidden to it, or a
/// cost above the limit.
pub(super) fn forbidden_or_above(
    entry: &ActiveRule,
    base: &ActiveRule,
    cost: u32,
    peer: &Peer,
) -> Option<CheckError> {
    let rule = &entry.rule;
    // Against the rules in force for this request: a reload that removes a uid
    // applies to connections already open.
    if !entry.detached && !peer.may(&rule.access) {
        return Some(CheckError::Forbidden {
            rule: rule.name.clone(),
            uid: peer.uid,
            gid: peer.gid,
        });
    }
    // Above the rule's own limit too: an override seen may be stale (Redis says).
    if u64::from(cost) > rule.limit() && u64::from(cost) > base.rule.limit() {
        return Some(CheckError::CostAboveLimit {
            cost,
            rule: rule.name.clone(),
            limit: rule.limit(),
        });
    }
    None
}
