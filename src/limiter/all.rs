//! Several (rule, key, cost) triples decided as one request (`CHECKALL`): allowed only
//! if every triple is, and then each is taken; on a DENY none is consumed.
//!
//! Every triple is decided through the store, never from a lease or the deny cache
//! (both answer one key at a time). Triples whose keys share a shard (Redis Cluster: a
//! hash slot) are decided by one all-or-nothing script, atomically; different shards
//! are decided in parallel, each shard's units taken at once (a *reservation*), and
//! when another shard or a local decision denies, the shards that took their units get
//! them back (the give-back script, bounded by `redis.timeout_ms`) before the reply.
//! A reservation only ever takes: while it stands, other requests see less, never
//! more, so nothing is over-admitted (docs/ALGORITHMS.md, "Several limits at once").
//!
//! A shard the store cannot ask (its primary bypassed, or the call failed) is decided
//! per its rules' `on_redis_failure`: first every such triple is asked with a cost of 0
//! (what it could take), then, if all could, each is taken.

use super::query::redis_decision;
use super::{ActiveRule, CheckError, Decided, Detached, Limiter};
use crate::admission::{CallPermit, Peer};
use crate::algorithm::Params;
use crate::clock::{local_clock_us, BatchClock};
use crate::config::OnRedisFailure;
use crate::decision::Decision;
use crate::fallback::decide_without_redis;
use crate::key::{fits, tag_in, KeyHash, TAG_MAX};
use crate::store::{Store, StoreError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The answer to a `CHECKALL`: the binding triple's decision and its rule's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// The binding triple's decision (its verdict is the request's) and policy window.
    pub decided: Decided,
    /// The binding triple's rule.
    pub rule: String,
    /// Each triple's own decision (composite rules expanded into their members), in
    /// request order: whether it alone would have been allowed, and its state; `None`
    /// if it was never decided. Nothing was taken from any of them unless the
    /// request's verdict is ALLOW.
    pub each: Vec<Option<Decision>>,
}

impl Bound {
    /// `each` as decided per merged item, put back in request order (`item_of`: the
    /// item of each triple; empty: already in request order).
    fn with_each(mut self, item_of: &[usize]) -> Bound {
        if !item_of.is_empty() {
            let per_item = std::mem::take(&mut self.each);
            self.each = item_of
                .iter()
                .map(|&i| per_item.get(i).copied().flatten())
                .collect();
        }
        self
    }
}

/// A triple resolved: its position in the request, its rule, key and cost.
pub(super) type Triple<'a> = (usize, Arc<ActiveRule>, &'a [u8], u32);

/// A triple refused before anything was decided: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Its position in the request (0-based).
    pub index: usize,
    /// Why.
    pub error: CheckError,
}

/// The answer to a `CHECKALL` on its way.
pub enum CheckAll {
    /// Decided (or refused) without I/O.
    Ready(Result<Bound, Refused>),
    /// Store calls in flight (each bounded by the Redis timeout; always a decision).
    Redis(Pin<Box<dyn Future<Output = Bound> + Send>>),
}

/// One triple as resolved: repeated (rule, key) pairs are merged, their costs summed
/// (taking `a` then `b` from one key is allowed exactly when `a + b` fits).
struct Item<S: Store> {
    entry: Arc<ActiveRule>,
    key: KeyHash,
    /// The key as sent (counted among the rule's hot keys).
    key_bytes: Vec<u8>,
    cost: u32,
    store_key: Option<S::Key>,
    decision: Option<Decision>,
    /// Taken in the store at this instant (µs, the store's clock): undone on a DENY.
    taken_at: Option<i64>,
}

/// Triples of one shard, asked together.
struct Group<S: Store> {
    route: S::Route,
    members: Vec<usize>,
}

impl<S: Store> Limiter<S> {
    /// Decides `CHECK rule key cost` for `peer` when `rule` is composite (`all_of`):
    /// the `CHECKALL` of its members with this key and cost. `None` when `rule` is not
    /// a composite rule ([`Limiter::check`] said [`CheckError::Composite`]).
    pub fn check_composite(
        self: &Arc<Self>,
        rule: &[u8],
        key: &[u8],
        cost: u32,
        clock: &mut BatchClock,
        peer: &Peer,
    ) -> Option<CheckAll> {
        let rules = self.rules.load();
        let entry = std::str::from_utf8(rule)
            .ok()
            .and_then(|name| rules.get(name))?;
        let r = &entry.rule;
        if r.all_of.is_empty() {
            return None;
        }
        if !peer.may(&r.access) {
            return Some(CheckAll::Ready(Err(Refused {
                index: 0,
                error: CheckError::Forbidden {
                    rule: r.name.clone(),
                    uid: peer.uid,
                    gid: peer.gid,
                },
            })));
        }
        let triples: Vec<(&[u8], &[u8], u32)> =
            r.all_of.iter().map(|m| (m.as_bytes(), key, cost)).collect();
        Some(self.check_all(&triples, clock, peer))
    }

    /// Decides `triples` (rule, key, cost; keys and costs valid per the protocol) for
    /// `peer`, all or nothing.
    pub fn check_all(
        self: &Arc<Self>,
        triples: &[(&[u8], &[u8], u32)],
        clock: &mut BatchClock,
        peer: &Peer,
    ) -> CheckAll {
        let rules = self.rules.load();
        // A composite rule among the triples stands for its members.
        let mut expanded: Vec<Triple<'_>> = Vec::with_capacity(triples.len());
        for (index, &(rule, key, cost)) in triples.iter().enumerate() {
            let refuse = |error| CheckAll::Ready(Err(Refused { index, error }));
            let Some(entry) = std::str::from_utf8(rule).ok().and_then(|n| rules.get(n)) else {
                return refuse(CheckError::UnknownRule);
            };
            if entry.rule.all_of.is_empty() {
                expanded.push((index, Arc::clone(entry), key, cost));
                continue;
            }
            if !peer.may(&entry.rule.access) {
                return refuse(CheckError::Forbidden {
                    rule: entry.rule.name.clone(),
                    uid: peer.uid,
                    gid: peer.gid,
                });
            }
            for m in &entry.rule.all_of {
                let Some(member) = rules.get(m.as_str()) else {
                    return refuse(CheckError::UnknownRule);
                };
                expanded.push((index, Arc::clone(member), key, cost));
            }
        }
        self.check_entries(&expanded, clock, peer)
    }

    /// Decides `triples` of [`Detached`] rules (the Envoy front end's strict mode), all
    /// or nothing, as [`Limiter::check_all`] does for named rules; their access lists
    /// are not checked.
    pub fn check_all_detached(
        self: &Arc<Self>,
        triples: &[(&Detached, &[u8], u32)],
        clock: &mut BatchClock,
        peer: &Peer,
    ) -> CheckAll {
        let expanded: Vec<Triple<'_>> = triples
            .iter()
            .enumerate()
            .map(|(i, &(rule, key, cost))| (i, Arc::clone(&rule.0), key, cost))
            .collect();
        self.check_entries(&expanded, clock, peer)
    }

    /// Decides `expanded` (the request's position, a resolved rule, key, cost), all
    /// or nothing; [`Bound::each`] follows the order of `expanded`.
    pub(super) fn check_entries(
        self: &Arc<Self>,
        expanded: &[Triple<'_>],
        clock: &mut BatchClock,
        peer: &Peer,
    ) -> CheckAll {
        let mut items: Vec<Item<S>> = Vec::with_capacity(expanded.len());
        let mut seen: Vec<(&str, &[u8])> = Vec::with_capacity(expanded.len());
        let mut item_of: Vec<usize> = Vec::with_capacity(expanded.len());
        for (index, entry, key, cost) in expanded {
            let (index, key, cost) = (*index, *key, *cost);
            let refuse = |error| CheckAll::Ready(Err(Refused { index, error }));
            let entry = entry.for_key(key);
            let r = &entry.rule;
            if !entry.detached && !peer.may(&r.access) {
                return refuse(CheckError::Forbidden {
                    rule: r.name.clone(),
                    uid: peer.uid,
                    gid: peer.gid,
                });
            }
            if u64::from(cost) > r.limit() {
                return refuse(CheckError::CostAboveLimit {
                    cost,
                    rule: r.name.clone(),
                    limit: r.limit(),
                });
            }
            if r.lease {
                return refuse(CheckError::Leased {
                    rule: r.name.clone(),
                });
            }
            if !fits(r.name.as_bytes(), key) {
                return refuse(CheckError::KeyTooLong);
            }
            if let Some(i) = seen
                .iter()
                .position(|&(a, b)| a == r.name.as_str() && b == key)
            {
                items[i].cost = items[i].cost.saturating_add(cost);
                item_of.push(i);
                continue;
            }
            seen.push((r.name.as_str(), key));
            item_of.push(items.len());
            items.push(Item {
                entry: Arc::clone(entry),
                key: self.keys.of(r.name.as_bytes(), key),
                key_bytes: key.to_vec(),
                cost,
                store_key: None,
                decision: None,
                taken_at: None,
            });
        }

        let Some(redis) = &self.redis else {
            let all: Vec<usize> = (0..items.len()).collect();
            self.locally(&mut items, &all, true, clock.now_us());
            return CheckAll::Ready(Ok(self.finish(&items, &item_of)));
        };
        let mut groups: Vec<(u16, Group<S>)> = Vec::new();
        let mut local = Vec::new();
        for (i, item) in items.iter_mut().enumerate() {
            let mut buf = [0u8; TAG_MAX];
            let r = &item.entry.rule;
            let Some(tag) = tag_in(&mut buf, &r.name, &item.key_bytes) else {
                return CheckAll::Ready(Err(Refused {
                    index: i,
                    error: CheckError::KeyTooLong,
                }));
            };
            let store_key = redis.key(tag, &r.params);
            match redis.route(&store_key) {
                None => local.push(i),
                Some(route) => {
                    let shard = redis.shard(&store_key);
                    match groups.iter_mut().find(|(s, _)| *s == shard) {
                        Some((_, g)) => g.members.push(i),
                        None => groups.push((
                            shard,
                            Group {
                                route,
                                members: vec![i],
                            },
                        )),
                    }
                }
            }
            item.store_key = Some(store_key);
        }
        if groups.is_empty() {
            self.locally(&mut items, &local, false, clock.now_us());
            return CheckAll::Ready(Ok(self.finish(&items, &item_of)));
        }
        let mut permits = Vec::with_capacity(groups.len());
        for _ in &groups {
            let Some(permit) = peer.call_permit() else {
                let limits = peer.in_flight_limits();
                return CheckAll::Ready(Err(Refused {
                    index: 0,
                    error: CheckError::Busy {
                        uid: peer.uid,
                        held: peer.uid_in_flight(),
                        per_uid: limits.per_uid,
                        total: limits.total,
                    },
                }));
            };
            permits.push(permit);
        }
        let this = Arc::clone(self);
        let redis = Arc::clone(redis);
        let groups: Vec<Group<S>> = groups.into_iter().map(|(_, g)| g).collect();
        CheckAll::Redis(Box::pin(async move {
            this.together(&redis, items, groups, local, permits)
                .await
                .with_each(&item_of)
        }))
    }

    /// The store's part: every shard asked at once; the shards that failed and the
    /// triples without a route decided locally; reservations undone on a DENY.
    async fn together(
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
        let mut denied = false;
        let mut taken = Vec::new();
        for (gi, (g, answer)) in groups.iter().zip(answers).enumerate() {
            match answer {
                Ok(outcomes) if outcomes.len() == g.members.len() => {
                    let all = outcomes.iter().all(|t| t.outcome.allowed);
                    for (&i, t) in g.members.iter().zip(&outcomes) {
                        let item = &mut items[i];
                        let rule = &item.entry.rule;
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
    fn locally(&self, items: &mut [Item<S>], which: &[usize], full: bool, now: f64) {
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
    fn finish(&self, items: &[Item<S>], item_of: &[usize]) -> Bound {
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
