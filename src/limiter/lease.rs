//! The decision flow of a `CHECK` on a rule with `lease = "auto"` (docs/DESIGN.md
//! "Leases"): paid from this daemon's lease on the key when it holds one, else one call
//! of the rule's lease script, which decides the request and, for a hot key, takes a
//! lease in the same call. Requests arriving while that call is in flight wait for it
//! (at most `redis.timeout_ms`) and are paid from its lease.
//!
//! Everything of docs/FAILURES.md holds: a key's primary open or Redis failing, a held lease is still
//! spent until its deadline, then the rule's `on_redis_failure` decides.
//!
//! Calls always send the rule's own parameters: a run-time override (`OVERRIDE`) is
//! applied by the script that reads it, which then grants nothing and says so. Such a
//! key is decided per request (as a cold key) until a reply without the override, and
//! its replies state the override's limit ([`super::tiers::Tiers::resolve`]).
//!
//! ```text
//! CHECK ─ lease holds cost? ──► lease (ALLOW)
//!        ├ saturated, paced ──► lease (DENY, wait until the next call)
//!        ├ primary open ──────► on_redis_failure
//!        └ call (hot: one at a time, others wait for it and are paid from its lease)
//!              ├► redis (the request decided by the script; a lease kept for the next)
//!              └► failed: on_redis_failure
//! ```

use super::{ActiveRule, Check, Decided, Limiter};
use crate::admission::Peer;
use crate::clock::boottime_us;
use crate::clock::local_clock_us;
use crate::config::{OnRedisFailure, Rule};
use crate::decision::{Decision, Source};
use crate::fallback::decide_without_redis;
use crate::lease::{LeasedKey, Local, Reported, Request};
use crate::store::{Store, StoreError};
use std::sync::Arc;
use std::time::Instant;

/// What the book keeps per key to reach Redis for it.
pub(super) struct Home<S: Store> {
    pub(super) key: S::Key,
    pub(super) rule: Arc<Rule>,
}

impl<S: Store> Limiter<S> {
    /// Decides `cost` units of `key` (`tag` hashed) under `base`'s leased rule (the
    /// rule, or its static per-key override), at `now_us` (the local clock, µs: what the
    /// hot keys count by). `entry` is the one in force as last seen (a run-time
    /// override's, else `base`): what Redis is not there to decide is decided under it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_leased(
        self: &Arc<Self>,
        entry: &Arc<ActiveRule>,
        base: &Arc<ActiveRule>,
        redis: &Arc<S>,
        tag: &str,
        key: u64,
        cost: u32,
        peer: &Peer,
        now_us: f64,
    ) -> Check {
        let rule = &base.rule;
        // The client's key: the tag is "<rule>:<key>".
        let key_bytes = tag
            .as_bytes()
            .get(rule.name.len() + 1..)
            .unwrap_or_default();
        self.start_sweeper();
        let home = || Home {
            key: redis.key(tag, &rule.params),
            rule: Arc::clone(rule),
        };
        // The book is full: decided by the lease script, without a lease.
        let slot = self.leases.slot(key, home);
        let hot = match &slot {
            None => false,
            Some(slot) => match slot.spend(u64::from(cost), boottime_us(), true) {
                Local::Call { hot } => hot,
                local => return self.decided_locally(base, key, key_bytes, local, now_us),
            },
        };
        let redis_key = slot
            .as_ref()
            .map_or_else(|| home().key, |s| s.home.key.clone());
        let Some(route) = redis.route(&redis_key) else {
            return self.fallback(entry, key, key_bytes, cost, now_us);
        };
        let (this, redis, entry) = (Arc::clone(self), Arc::clone(redis), Arc::clone(entry));
        let base = Arc::clone(base);
        match slot {
            Some(slot) if hot => {
                entry.sent(key, key_bytes, now_us);
                let deadline = tokio::time::Instant::now() + redis.timeout();
                let peer = peer.clone();
                Check::Redis(Box::pin(async move {
                    let rules = Rules {
                        base: &base,
                        seen: &entry.rule,
                    };
                    let d = this
                        .hot_call(rules, &redis, route, slot, key, cost, &peer, deadline)
                        .await;
                    this.record(&entry, key, d)
                }))
            }
            slot => {
                let Some(in_flight) = peer.call_permit() else {
                    return self.no_redis_slot(&entry, key, cost, peer);
                };
                entry.sent(key, key_bytes, now_us);
                Check::Redis(Box::pin(async move {
                    let rules = Rules {
                        base: &base,
                        seen: &entry.rule,
                    };
                    let d = this
                        .per_request_call(
                            rules, &redis, route, slot, redis_key, key, cost, in_flight,
                        )
                        .await;
                    this.record(&entry, key, d)
                }))
            }
        }
    }

    /// A request of a key on the per-request path (cold, or the book full): one lease
    /// script call that takes no lease, the key counted in flight while it runs so that
    /// it stays in the book, and the decision from its answer.
    #[allow(clippy::too_many_arguments)]
    async fn per_request_call(
        self: &Arc<Self>,
        rules: Rules<'_>,
        redis: &Arc<S>,
        route: S::Route,
        slot: Option<Arc<LeasedKey<Home<S>>>>,
        redis_key: S::Key,
        key: u64,
        cost: u32,
        in_flight: crate::admission::CallPermit,
    ) -> Decision {
        let rule = Arc::clone(&rules.base.rule);
        let sent_us = boottime_us();
        let (request, _flight) = match &slot {
            Some(s) => {
                let (r, f) = s.begin(0, 0, false, sent_us, &self.leases.holder);
                (r, Some(f))
            }
            None => (Request::cold(&self.leases.holder), None),
        };
        let at = redis_key.clone();
        let call = redis.lease(route, at, rule.params, cost, request.clone(), in_flight);
        let answer = call.await;
        if let (Some(s), Ok((o, g))) = (&slot, &answer) {
            s.granted(sent_us, boottime_us(), &request, *g, reported(o));
            self.leases.kept(key, s);
        }
        self.answered(rules, key, cost, &redis_key, answer.map(|(o, _)| o))
    }

    /// A hot key's request that its lease cannot settle: waits for the key's call in
    /// flight (one at a time per key) and is paid from its lease, or makes the next call.
    /// The call runs in a task of its own, holding the key's turn and a Redis in-flight
    /// permit (taken only once the turn is ours), so a client that stops reading its
    /// replies holds up no other client's request; and the request is answered by
    /// `deadline` (`redis.timeout_ms` after it arrived) whatever the call does, per
    /// `on_redis_failure` when the answer is late (the call goes on and keeps its lease).
    #[allow(clippy::too_many_arguments)]
    async fn hot_call(
        self: &Arc<Self>,
        rules: Rules<'_>,
        redis: &Arc<S>,
        route: S::Route,
        slot: Arc<LeasedKey<Home<S>>>,
        key: u64,
        cost: u32,
        peer: &Peer,
        deadline: tokio::time::Instant,
    ) -> Decision {
        let (rule, seen) = (&rules.base.rule, rules.seen);
        // Never queued on the lock itself: a queued waiter is handed the lock in turn even
        // if its connection's task stopped polling it. Woken instead when a call ends,
        // each waiter looks at the lease again and tries to take the turn.
        let turn = loop {
            let ended = slot.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if let Ok(turn) = Arc::clone(&slot.call).try_lock_owned() {
                break turn;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return decide_here(self, seen, key, cost);
            }
            // The call before ours may have brought a lease that pays for this one.
            let now = boottime_us();
            if let Some(d) = lease_decision(rule, slot.spend(u64::from(cost), now, false)) {
                return d;
            }
        };
        if let Some(d) = lease_decision(rule, slot.spend(u64::from(cost), boottime_us(), false)) {
            return d;
        }
        let Some(in_flight) = peer.call_permit() else {
            return decide_here(self, seen, key, cost);
        };
        let sent_us = boottime_us();
        let (request, flight) = slot.begin(
            u64::from(cost),
            rule.limit(),
            true,
            sent_us,
            &self.leases.holder,
        );
        let (this, redis, rule_c) = (Arc::clone(self), Arc::clone(redis), Arc::clone(rule));
        let redis_key = slot.home.key.clone();
        let call = tokio::spawn(async move {
            let _turn = TurnEnds {
                turn: Some(turn),
                key: Arc::clone(&slot),
            };
            let _flight = flight;
            let asked = Instant::now();
            let at = slot.home.key.clone();
            let answer = redis
                .lease(route, at, rule_c.params, cost, request.clone(), in_flight)
                .await;
            this.redis_calls.took(asked.elapsed());
            if let Ok((o, granted)) = &answer {
                slot.granted(sent_us, boottime_us(), &request, *granted, reported(o));
                this.leases.kept(key, &slot);
            }
            answer.map(|(o, _)| o)
        });
        match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(answer)) => self.answered(rules, key, cost, &redis_key, answer),
            _ => decide_here(self, seen, key, cost),
        }
    }

    /// The decision of a lease call's answer, under the rule Redis decided it with (a
    /// run-time override's, remembered, or `rules.base`'s); `Err`: decided here under
    /// `rules.seen`, per `on_redis_failure` (the grant the call named is still
    /// remembered and named again).
    fn answered(
        &self,
        rules: Rules<'_>,
        key: u64,
        cost: u32,
        redis_key: &S::Key,
        answer: Result<crate::algorithm::Outcome, StoreError>,
    ) -> Decision {
        match answer {
            Ok(o) => {
                let entry = self.tiers.resolve(rules.base, key, o.tier);
                let rule = &entry.rule;
                if rule.on_redis_failure == OnRedisFailure::Local {
                    self.local.observe(key, rule, &o, local_clock_us());
                }
                super::query::redis_decision(rule, &o)
            }
            Err(e) => {
                match &e {
                    StoreError::Unavailable { kind, .. } => self.redis_calls.failed(kind),
                    _ => {
                        self.redis_calls.failed("key");
                        self.log_key_error(&rules.seen.name, S::key_text(redis_key), &e);
                    }
                }
                decide_here(self, rules.seen, key, cost)
            }
        }
    }

    /// A decision from the lease state (never a [`Local::Call`]).
    fn decided_locally(
        &self,
        entry: &ActiveRule,
        key: u64,
        key_bytes: &[u8],
        local: Local,
        now_us: f64,
    ) -> Check {
        let d = lease_decision(&entry.rule, local).unwrap_or_else(|| unreachable_call(&entry.rule));
        Check::Ready(Ok(entry.decided_now(key, key_bytes, d, now_us)))
    }

    /// Decided without Redis, per the rule's `on_redis_failure`.
    fn fallback(
        &self,
        entry: &ActiveRule,
        key: u64,
        key_bytes: &[u8],
        cost: u32,
        now_us: f64,
    ) -> Check {
        let d = decide_without_redis(&self.local, &entry.rule, key, cost, local_clock_us());
        Check::Ready(Ok(entry.decided_now(key, key_bytes, d, now_us)))
    }

    /// A decision [`ActiveRule::sent`] and now known, counted.
    fn record(&self, entry: &ActiveRule, key: u64, decision: Decision) -> Decided {
        entry.came_back(key, decision)
    }
}

/// The rules a leased key's request is decided with: `base`, the rule's own (or its
/// static per-key override), whose parameters every call sends and whose limit a lease
/// decision states; `seen`, the one in force as last seen from Redis (a run-time
/// override's, else `base`'s), for what is decided without Redis.
#[derive(Clone, Copy)]
struct Rules<'a> {
    base: &'a Arc<ActiveRule>,
    seen: &'a Arc<Rule>,
}

/// A key's turn to call Redis, held by the task running the call: given up when that
/// task ends (answered, failed or abandoned), then every request waiting for it is woken.
pub(super) struct TurnEnds<S: Store> {
    pub(super) turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    pub(super) key: Arc<LeasedKey<Home<S>>>,
}

impl<S: Store> Drop for TurnEnds<S> {
    fn drop(&mut self) {
        drop(self.turn.take());
        self.key.ended.notify_waiters();
    }
}

/// What a lease call's decision reported, for the lease state.
pub(super) fn reported(o: &crate::algorithm::Outcome) -> Reported {
    Reported {
        remaining: o.remaining,
        reset_ms: o.reset_ms,
        wait_ms: if o.allowed { 0 } else { o.wait_ms },
        overridden: o.tier.is_some(),
    }
}

/// The decision a lease state gives (`None`: ask Redis).
fn lease_decision(rule: &Rule, local: Local) -> Option<Decision> {
    let (allowed, remaining, reset_ms, wait_ms) = match local {
        Local::Taken {
            remaining,
            reset_ms,
        } => (true, remaining, reset_ms, 0),
        Local::Paced { wait_ms, reset_ms } => (false, 0, reset_ms, wait_ms),
        Local::Call { .. } => return None,
    };
    Some(Decision {
        allowed,
        limit: rule.limit(),
        remaining: remaining.min(rule.limit()),
        reset_ms,
        wait_ms,
        source: Source::Lease,
    })
}

/// A DENY for the case the callers of [`Limiter::decided_locally`] exclude.
fn unreachable_call(rule: &Rule) -> Decision {
    Decision {
        allowed: false,
        limit: rule.limit(),
        remaining: 0,
        reset_ms: 0,
        wait_ms: 1,
        source: Source::Lease,
    }
}

/// A decision without Redis for a request whose call failed or waited too long.
fn decide_here<S: Store>(this: &Limiter<S>, rule: &Rule, key: u64, cost: u32) -> Decision {
    decide_without_redis(&this.local, rule, key, cost, local_clock_us())
}
