//! `REFUND <rule> <key> <units>`: units taken earlier given back to a key's state in
//! the store, never beyond the capacity or limit, never into a window other than the
//! current one (the give-back script, `lua/give_back.lua`). The answer is the key's
//! state for a cost of 0 after it.
//!
//! Only the shared state gets units back. Without the store (its primary bypassed, the
//! call failed, or `redis.mode = "none"`) nothing is given back and the answer is the
//! cost-0 decision there: a refund is a courtesy to the caller, and not giving it can
//! only admit less.

use super::query::redis_decision;
use super::{Check, CheckError, Decided, Limiter};
use crate::admission::Peer;
use crate::clock::{local_clock_us, BatchClock};
use crate::decision::Decision;
use crate::fallback::decide_without_redis;
use crate::key::{fits, tag_in, TAG_MAX};
use crate::store::{Store, StoreError};
use std::sync::Arc;

impl<S: Store> Limiter<S> {
    /// Gives up to `units` back to `key` under `rule` for `peer` (key valid per the
    /// protocol).
    pub fn refund(
        self: &Arc<Self>,
        rule: &[u8],
        key: &[u8],
        units: u32,
        clock: &mut BatchClock,
        peer: &Peer,
    ) -> Check {
        let rules = self.rules.load();
        let Some(entry) = std::str::from_utf8(rule)
            .ok()
            .and_then(|name| rules.get(name))
        else {
            return Check::Ready(Err(CheckError::UnknownRule));
        };
        let entry = Arc::clone(entry.for_key(key));
        let r = &entry.rule;
        if !peer.may(&r.access) {
            return Check::Ready(Err(CheckError::Forbidden {
                rule: r.name.clone(),
                uid: peer.uid,
                gid: peer.gid,
            }));
        }
        if r.lease {
            return Check::Ready(Err(CheckError::Leased {
                rule: r.name.clone(),
            }));
        }
        if r.params.kind() == crate::algorithm::Kind::Concurrency {
            return Check::Ready(Err(CheckError::RefundOfSlots {
                rule: r.name.clone(),
            }));
        }
        if !fits(r.name.as_bytes(), key) {
            return Check::Ready(Err(CheckError::KeyTooLong));
        }
        let hash = self.keys.of(r.name.as_bytes(), key);
        let window_ms = r.window_ms;
        let Some(redis) = &self.redis else {
            let d = self
                .local
                .decide(hash, r.limit(), &r.params, r.sketch_tag, 0, clock.now_us());
            return Check::Ready(Ok(Decided {
                decision: d,
                window_ms,
            }));
        };
        let mut buf = [0u8; TAG_MAX];
        let Some(tag) = tag_in(&mut buf, &r.name, key) else {
            return Check::Ready(Err(CheckError::KeyTooLong));
        };
        let store_key = redis.key(tag, &r.params);
        let without = |now| decide_without_redis(&self.local, &entry.rule, hash, 0, now);
        let Some(route) = redis.route(&store_key) else {
            return Check::Ready(Ok(Decided {
                decision: without(clock.now_us()),
                window_ms,
            }));
        };
        let Some(permit) = peer.call_permit() else {
            let limits = peer.in_flight_limits();
            return Check::Ready(Err(CheckError::Busy {
                uid: peer.uid,
                held: peer.uid_in_flight(),
                per_uid: limits.per_uid,
                total: limits.total,
            }));
        };
        let this = Arc::clone(self);
        let redis = Arc::clone(redis);
        let params = r.params;
        Check::Redis(Box::pin(async move {
            let asked = std::time::Instant::now();
            let answer = redis
                .give_back(route, vec![(store_key, params, units, None)], permit)
                .await;
            this.redis_calls.took(asked.elapsed());
            let mut window_ms = window_ms;
            let rule = &entry.rule;
            let decision: Decision = match answer {
                Ok(outcomes) if outcomes.len() == 1 => {
                    // The limit stated is the key's run-time override's, if it has one.
                    let e = this.tiers.resolve(&entry, hash, outcomes[0].tier);
                    window_ms = e.rule.window_ms;
                    redis_decision(&e.rule, &outcomes[0])
                }
                other => {
                    if let Err(StoreError::Unavailable { kind, .. }) = &other {
                        this.redis_calls.failed(kind);
                    } else {
                        this.redis_calls.failed("key");
                    }
                    decide_without_redis(&this.local, rule, hash, 0, local_clock_us())
                }
            };
            Decided {
                decision,
                window_ms,
            }
        }))
    }
}
