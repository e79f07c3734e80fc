//! The decision half of `CHECKALL` ([`super::all`]): every shard asked at once, the
//! reservations given back on a DENY, the triples without Redis decided locally all or
//! nothing, and the binding triple of the reply.

use super::all::{Bound, Group, Item};
use super::query::redis_decision;
use super::{Decided, Limiter};
use crate::admission::CallPermit;
use crate::algorithm::Params;
use crate::clock::local_clock_us;
use crate::config::OnRedisFailure;
use crate::decision::Decision;
use crate::fallback::decide_without_redis;
use crate::store::multi::Taken;
use crate::store::{Store, StoreError};
use std::sync::Arc;

impl<S: Store> Limiter<S> {
    /// The store's part: every shard asked at once; the shards that failed and the
    /// triples without a route decided locally; reservations undone on a DENY.
    pub(super) async fn together(
        &self,
        redis: &Arc<S>,
        mut items: Vec<Item<S>>,
        groups: Vec<Group<S>>,
        mut local: Vec<usize>,
        permits: Vec<CallPermit>,
    ) -> Bound {
        let calls = groups.iter().zip(permits).map(|(g, permit)| {
            let batch: Vec<(S::Key, Params, u32)> = g
                .members
                .iter()
                .filter_map(|&i| {
                    let it = &items[i];
                    Some((it.store_key.clone()?, it.entry.rule.params, it.cost))
                })
                .collect();
            redis.decide_together(g.route.clone(), batch, permit)
        });
        let asked = std::time::Instant::now();
        let answers = futures::future::join_all(calls).await;
        self.redis_calls.took(asked.elapsed());
        let (taken, denied) = self.record_answers(&mut items, &groups, answers, &mut local);
        let now = local_clock_us();
        if denied {
            // Nothing may be taken locally: what they could take, for the reply.
            for &i in &local {
                let item = &mut items[i];
                item.decision = Some(decide_without_redis(
                    &self.local,
                    &item.entry.rule,
                    item.key,
                    0,
                    now,
                ));
                if let Some(d) = &mut item.decision {
                    d.allowed = d.allowed && d.remaining >= u64::from(item.cost);
                }
            }
        } else {
            self.locally(&mut items, &local, false, now);
        }
        let allowed = items
            .iter()
            .all(|it| it.decision.is_some_and(|d| d.allowed));
        if !allowed {
            self.undo(redis, &items, &groups, &taken).await;
        }
        self.finish(&items, &[])
    }

    /// Records each group's answer in its items: the decisions Redis made (under a
    /// run-time override's parameters, if any), and when each was taken. A group that
    /// failed joins `local`. Returns the groups that took their units and whether any
    /// group denied.
    fn record_answers(
        &self,
        items: &mut [Item<S>],
        groups: &[Group<S>],
        answers: Vec<Result<Vec<Taken>, StoreError>>,
        local: &mut Vec<usize>,
    ) -> (Vec<usize>, bool) {
        let mut denied = false;
        let mut taken = Vec::new();
        for (gi, (g, answer)) in groups.iter().zip(answers).enumerate() {
            match answer {
                Ok(outcomes) if outcomes.len() == g.members.len() => {
                    let all = outcomes.iter().all(|t| t.outcome.allowed);
                    for (&i, t) in g.members.iter().zip(&outcomes) {
                        let item = &mut items[i];
                        // The parameters Redis decided under: a run-time override's.
                        let entry = self.tiers.resolve(&item.entry, item.key, t.outcome.tier);
                        let rule = &entry.rule;
                        if rule.on_redis_failure == OnRedisFailure::Local {
                            self.local
                                .observe(item.key, rule, &t.outcome, local_clock_us());
                        }
                        item.decision = Some(redis_decision(rule, &t.outcome));
                        if all && item.cost > 0 {
                            item.taken_at = Some(t.at_us);
                        }
                    }
                    if all {
                        taken.push(gi);
                    } else {
                        denied = true;
                    }
                }
                Ok(_) => local.extend_from_slice(&g.members),
                Err(e) => {
                    match &e {
                        StoreError::Unavailable { kind, .. } => self.redis_calls.failed(kind),
                        _ => self.redis_calls.failed("key"),
                    }
                    local.extend_from_slice(&g.members);
                }
            }
        }
        (taken, denied)
    }

    /// Gives back what the shards in `taken` reserved, all at once, each bounded by
    /// the store's timeout. A give-back that fails or times out leaves its units taken
    /// (fewer admitted, never more).
    async fn undo(&self, redis: &Arc<S>, items: &[Item<S>], groups: &[Group<S>], taken: &[usize]) {
        let calls = taken.iter().filter_map(|&gi| {
            let g = &groups[gi];
            let batch: Vec<(S::Key, Params, u32, Option<i64>)> = g
                .members
                .iter()
                .filter_map(|&i| {
                    let it = &items[i];
                    Some((
                        it.store_key.clone()?,
                        it.entry.rule.params,
                        it.cost,
                        Some(it.taken_at?),
                    ))
                })
                .collect();
            (!batch.is_empty()).then(|| redis.give_back(g.route.clone(), batch, ()))
        });
        for answer in futures::future::join_all(calls).await {
            if let Err(e) = answer {
                match &e {
                    StoreError::Unavailable { kind, .. } => self.redis_calls.failed(kind),
                    _ => self.redis_calls.failed("key"),
                }
            }
        }
    }

    /// Decides `which` items without the store (`full`: at the rules' whole limits,
    /// `redis.mode = "none"`; otherwise per `on_redis_failure`), all or nothing: each
    /// is first asked with a cost of 0, and taken only if every one could take its
    /// cost. Another request taking units in between can make a take fail after the
    /// others were taken: those stay taken (fewer admitted, never more).
    pub(super) fn locally(&self, items: &mut [Item<S>], which: &[usize], full: bool, now: f64) {
        let one = |item: &Item<S>, cost: u32| {
            let rule = &item.entry.rule;
            if full {
                self.local.decide(
                    item.key,
                    rule.limit(),
                    &rule.params,
                    rule.sketch_tag,
                    cost,
                    now,
                )
            } else {
                decide_without_redis(&self.local, rule, item.key, cost, now)
            }
        };
        let mut all = true;
        for &i in which {
            let peek = one(&items[i], 0);
            let fits = peek.allowed && peek.remaining >= u64::from(items[i].cost);
            items[i].decision = Some(if fits {
                peek
            } else {
                all = false;
                // Denied at this cost: its own answer, with its wait.
                one(&items[i], items[i].cost)
            });
        }
        if all {
            for &i in which {
                items[i].decision = Some(one(&items[i], items[i].cost));
            }
        }
    }

    /// The reply: the binding triple (on DENY the denied one with the longest
    /// `wait_ms`; on ALLOW the one with the fewest `remaining` relative to its limit),
    /// with the request's verdict; each triple's decision counted under its rule.
    pub(super) fn finish(&self, items: &[Item<S>], item_of: &[usize]) -> Bound {
        let allowed = items
            .iter()
            .all(|it| it.decision.is_some_and(|d| d.allowed));
        let now = local_clock_us();
        let mut best: Option<(usize, Decision)> = None;
        let mut each = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            each.push(item.decision);
            let Some(mut d) = item.decision else { continue };
            let denied = !d.allowed;
            d.allowed = allowed;
            item.entry.decided_now(item.key, &item.key_bytes, d, now);
            let better = match &best {
                None => true,
                Some((_, b)) if allowed => {
                    // remaining / limit, compared without division.
                    u128::from(d.remaining) * u128::from(b.limit.max(1))
                        < u128::from(b.remaining) * u128::from(d.limit.max(1))
                }
                Some((j, b)) => {
                    // A denied triple binds before an allowed one, then the longest wait.
                    let best_denied = items[*j].decision.is_some_and(|x| !x.allowed);
                    (denied && !best_denied) || (denied == best_denied && d.wait_ms > b.wait_ms)
                }
            };
            if better {
                best = Some((i, d));
            }
        }
        let (i, decision) = best.unwrap_or((
            0,
            Decision {
                allowed,
                limit: 0,
                remaining: 0,
                reset_ms: 0,
                wait_ms: 0,
                source: crate::decision::Source::Redis,
            },
        ));
        let rule = items.get(i).map(|it| &it.entry.rule);
        Bound {
            decided: Decided {
                decision,
                window_ms: rule.map_or(0, |r| r.window_ms),
            },
            rule: rule.map_or_else(String::new, |r| r.name.clone()),
            each,
        }
        .with_each(item_of)
    }
}
