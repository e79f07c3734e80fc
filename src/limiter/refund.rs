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
use super::{ActiveRule, Check, CheckError, Decided, Limiter};
use crate::admission::Peer;
use crate::algorithm::Outcome;
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
        let entry = match self.refundable(rule, key, peer) {
            Ok(entry) => entry,
            Err(e) => return Check::Ready(Err(e)),
        };
        let r = &entry.rule;
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
        let Some(route) = redis.route(&store_key) else {
            let decision = decide_without_redis(&self.local, r, hash, 0, clock.now_us());
            return Check::Ready(Ok(Decided {
                decision,
                window_ms,
            }));
        };
        let Some(permit) = peer.call_permit() else {
            return Check::Ready(Err(CheckError::busy(peer)));
        };
        let gift = (store_key, r.params, units, None);
        let this = Arc::clone(self);
        let redis = Arc::clone(redis);
        Check::Redis(Box::pin(async move {
            let asked = std::time::Instant::now();
            let answer = redis.give_back(route, vec![gift], permit).await;
            this.redis_calls.took(asked.elapsed());
            this.refunded(&entry, hash, answer)
        }))
    }

    /// The entry of `rule` for `key` when `peer` may refund it: a known rule the peer
    /// may use, neither leased nor a concurrency rule, whose key fits.
    fn refundable(
        self: &Arc<Self>,
        rule: &[u8],
        key: &[u8],
        peer: &Peer,
    ) -> Result<Arc<ActiveRule>, CheckError> {
        let rules = self.rules.load();
        let entry = std::str::from_utf8(rule)
            .ok()
            .and_then(|name| rules.get(name))
            .ok_or(CheckError::UnknownRule)?;
        let entry = Arc::clone(entry.for_key(key));
        let r = &entry.rule;
        if !peer.may(&r.access) {
            return Err(CheckError::Forbidden {
                rule: r.name.clone(),
                uid: peer.uid,
                gid: peer.gid,
            });
        }
        if r.lease {
            return Err(CheckError::Leased {
                rule: r.name.clone(),
            });
        }
        if r.params.kind() == crate::algorithm::Kind::Concurrency {
            return Err(CheckError::RefundOfSlots {
                rule: r.name.clone(),
            });
        }
        if !fits(r.name.as_bytes(), key) {
            return Err(CheckError::KeyTooLong);
        }
        Ok(entry)
    }

    /// The answer to a refund from the give-back's `answer`: the key's state for a cost
    /// of 0 under the parameters in force (a run-time override's limit, if it has one),
    /// or, the call failed, the cost-0 decision without Redis.
    fn refunded(
        &self,
        entry: &Arc<ActiveRule>,
        hash: u64,
        answer: Result<Vec<Outcome>, StoreError>,
    ) -> Decided {
        match answer {
            Ok(outcomes) if outcomes.len() == 1 => {
                let e = self.tiers.resolve(entry, hash, outcomes[0].tier);
                Decided {
                    decision: redis_decision(&e.rule, &outcomes[0]),
                    window_ms: e.rule.window_ms,
                }
            }
            other => {
                if let Err(StoreError::Unavailable { kind, .. }) = &other {
                    self.redis_calls.failed(kind);
                } else {
                    self.redis_calls.failed("key");
                }
                let decision: Decision =
                    decide_without_redis(&self.local, &entry.rule, hash, 0, local_clock_us());
                Decided {
                    decision,
                    window_ms: entry.rule.window_ms,
                }
            }
        }
    }
}
