//! `ACQUIRE` decided in this process, when Redis cannot be asked about the key (or is
//! not configured, `mode = "none"`): per the rule's `on_redis_failure`, a local slot of
//! a host's share (`limit ÷ hosts`), a slot taken fail-open, or a DENY fail-closed. A
//! slot held locally enters the same book as Redis's, and is handed back to Redis when
//! it answers again (`upkeep.rs`).

use super::book::Held;
use super::{concurrency_params, SlotAnswer};
use crate::algorithm::{concurrency, Params};
use crate::clock::local_clock_us;
use crate::config::OnRedisFailure;
use crate::decision::{Decision, Source};
use crate::key::KeyHash;
use crate::limiter::{ActiveRule, Limiter};
use crate::metrics;
use crate::store::Store;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl<S: Store> Limiter<S> {
    /// `ACQUIRE` while Redis cannot be asked about the key: per `on_redis_failure`, a
    /// local slot of `limit ÷ hosts`, a slot fail-open, or a DENY fail-closed.
    pub(super) fn acquire_without_redis(
        &self,
        entry: &Arc<ActiveRule>,
        key: KeyHash,
        store_key: S::Key,
        conn: u64,
    ) -> SlotAnswer {
        let rule = &entry.rule;
        match rule.on_redis_failure {
            OnRedisFailure::Local => {
                let share = self.local.share(rule);
                self.acquire_local(entry, key, Some(store_key), conn, &share)
            }
            OnRedisFailure::Allow => {
                let unlimited = Params::Concurrency(concurrency::Params {
                    limit: f64::MAX,
                    ..concurrency_params(&rule.params)
                });
                let mut answer = self.acquire_local(entry, key, Some(store_key), conn, &unlimited);
                if let SlotAnswer::Acquired(d, _) = &mut answer {
                    d.source = Source::FailOpen;
                    d.remaining = rule.limit();
                }
                answer
            }
            OnRedisFailure::Deny => {
                let d = crate::fallback::decide_without_redis(&self.local, rule, key, 1, 0.0);
                entry.counters.record(&d);
                if !entry.detached {
                    metrics::slot_denied(&rule.name, d.source);
                }
                SlotAnswer::Denied(Decision { remaining: 0, ..d })
            }
        }
    }

    /// A slot held in this process under `params` (the full limit in `mode = "none"`,
    /// a host's share otherwise); handed back to Redis when it answers again
    /// (`store_key` given).
    pub(super) fn acquire_local(
        &self,
        entry: &Arc<ActiveRule>,
        key: KeyHash,
        store_key: Option<S::Key>,
        conn: u64,
        params: &Params,
    ) -> SlotAnswer {
        let rule = &entry.rule;
        let p = concurrency_params(params);
        let (id, holder) = self.slots.next();
        let mut book = self.slots.lock();
        let now = local_clock_us();
        let st = book.local.entry(key).or_default();
        let (o, hold_end) = concurrency::acquire(st, now, &p, id, f64::INFINITY);
        let source = Source::Local;
        let decision = Decision {
            allowed: o.allowed,
            limit: rule.limit(),
            remaining: o.remaining,
            reset_ms: o.reset_ms,
            wait_ms: o.wait_ms,
            source,
        };
        entry.counters.record(&decision);
        if !o.allowed {
            if book.local.get(&key).is_some_and(|s| s.slots.is_empty()) {
                book.local.remove(&key);
            }
            if !entry.detached {
                metrics::slot_denied(&rule.name, source);
            }
            return SlotAnswer::Denied(decision);
        }
        if !entry.detached {
            metrics::slot_acquired(&rule.name, source);
        }
        let token = format!("{hold_end:.0}-{holder}");
        book.insert(
            token.clone(),
            Held {
                conn,
                entry: Arc::clone(entry),
                key,
                store_key: store_key.filter(|_| self.redis.is_some()),
                id,
                local: true,
                until: Instant::now() + Duration::from_micros(p.max_hold as u64),
            },
        );
        SlotAnswer::Acquired(decision, token)
    }
}
