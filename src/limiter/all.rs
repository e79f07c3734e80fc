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

use super::{ActiveRule, CheckError, Decided, Detached, Limiter};
use crate::admission::Peer;
use crate::clock::BatchClock;
use crate::decision::Decision;
use crate::key::{fits, tag_in, KeyHash, TAG_MAX};
use crate::store::Store;
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
    pub(super) fn with_each(mut self, item_of: &[usize]) -> Bound {
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
pub(super) struct Item<S: Store> {
    pub(super) entry: Arc<ActiveRule>,
    pub(super) key: KeyHash,
    /// The key as sent (counted among the rule's hot keys).
    pub(super) key_bytes: Vec<u8>,
    pub(super) cost: u32,
    pub(super) store_key: Option<S::Key>,
    pub(super) decision: Option<Decision>,
    /// Taken in the store at this instant (µs, the store's clock): undone on a DENY.
    pub(super) taken_at: Option<i64>,
}

/// Triples of one shard, asked together.
pub(super) struct Group<S: Store> {
    pub(super) route: S::Route,
    pub(super) members: Vec<usize>,
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
        let (mut items, item_of) = match self.items_of(expanded, peer) {
            Ok(v) => v,
            Err(refused) => return CheckAll::Ready(Err(refused)),
        };
        let Some(redis) = &self.redis else {
            let all: Vec<usize> = (0..items.len()).collect();
            self.locally(&mut items, &all, true, clock.now_us());
            return CheckAll::Ready(Ok(self.finish(&items, &item_of)));
        };
        let (groups, local) = match Self::grouped(redis, &mut items) {
            Ok(v) => v,
            Err(refused) => return CheckAll::Ready(Err(refused)),
        };
        if groups.is_empty() {
            self.locally(&mut items, &local, false, clock.now_us());
            return CheckAll::Ready(Ok(self.finish(&items, &item_of)));
        }
        let mut permits = Vec::with_capacity(groups.len());
        for _ in &groups {
            let Some(permit) = peer.call_permit() else {
                return CheckAll::Ready(Err(Refused {
                    index: 0,
                    error: CheckError::busy(peer),
                }));
            };
            permits.push(permit);
        }
        let this = Arc::clone(self);
        let redis = Arc::clone(redis);
        CheckAll::Redis(Box::pin(async move {
            this.together(&redis, items, groups, local, permits)
                .await
                .with_each(&item_of)
        }))
    }

    /// The items of `expanded`, a key repeated under one rule merged (costs summed), and
    /// for each triple its item's index; the first triple `peer` may not send refused.
    fn items_of(
        &self,
        expanded: &[Triple<'_>],
        peer: &Peer,
    ) -> Result<(Vec<Item<S>>, Vec<usize>), Refused> {
        let mut items: Vec<Item<S>> = Vec::with_capacity(expanded.len());
        let mut item_of: Vec<usize> = Vec::with_capacity(expanded.len());
        for (index, entry, key, cost) in expanded {
            let (key, cost) = (*key, *cost);
            let entry = entry.for_key(key);
            let r = &entry.rule;
            if let Some(error) = refusal(entry, key, cost, peer) {
                return Err(Refused {
                    index: *index,
                    error,
                });
            }
            if let Some(i) = items
                .iter()
                .position(|it| it.entry.rule.name == r.name && it.key_bytes == key)
            {
                items[i].cost = items[i].cost.saturating_add(cost);
                item_of.push(i);
                continue;
            }
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
        Ok((items, item_of))
    }

    /// `items` by the shard of their key (each item's store key set), and the items
    /// whose primary is bypassed (decided locally).
    fn grouped(
        redis: &Arc<S>,
        items: &mut [Item<S>],
    ) -> Result<(Vec<Group<S>>, Vec<usize>), Refused> {
        let mut groups: Vec<(u16, Group<S>)> = Vec::new();
        let mut local = Vec::new();
        for (i, item) in items.iter_mut().enumerate() {
            let mut buf = [0u8; TAG_MAX];
            let r = &item.entry.rule;
            let Some(tag) = tag_in(&mut buf, &r.name, &item.key_bytes) else {
                return Err(Refused {
                    index: i,
                    error: CheckError::KeyTooLong,
                });
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
        Ok((groups.into_iter().map(|(_, g)| g).collect(), local))
    }
}

/// Why `peer` may not send `cost` units of `key` under `entry` in a `CHECKALL`, if it
/// may not: a forbidden rule, a cost above the limit, a leased or concurrency rule, a
/// key too long.
fn refusal(entry: &ActiveRule, key: &[u8], cost: u32, peer: &Peer) -> Option<CheckError> {
    let r = &entry.rule;
    if let Some(refused) = super::check::forbidden_or_above(entry, entry, cost, peer) {
        return Some(refused);
    }
    if r.lease {
        return Some(CheckError::Leased {
            rule: r.name.clone(),
        });
    }
    if r.params.kind() == crate::algorithm::Kind::Concurrency {
        return Some(CheckError::Concurrency {
            rule: r.name.clone(),
        });
    }
    if !fits(r.name.as_bytes(), key) {
        return Some(CheckError::KeyTooLong);
    }
    None
}
