//! The flow of `ACQUIRE` and `RELEASE` on a `concurrency` rule (docs/ALGORITHMS.md
//! "concurrency", docs/PROTOCOL.md): slots taken and given back in Redis, exact across
//! hosts, or locally (`limit ÷ hosts`) while Redis cannot be asked; and the three ways
//! a slot comes back without a `RELEASE`:
//!
//! * the connection that took it closes ([`Holder`]'s drop: one call per key);
//! * its `max_hold` ends (Redis scores each slot no later than that end);
//! * this daemon dies: it renews its clients' slots every [`RENEW_EVERY`], each for the
//!   holder lease ([`concurrency::HOLDER_LEASE_US`]), and a dead daemon renews nothing.
//!
//! Neither the deny cache nor leases serve these rules: a DENY turns into an ALLOW with
//! any `RELEASE` on any host, and a slot is not a unit of a budget that could be paid
//! ahead, so every `ACQUIRE` asks Redis.

mod book;

pub(super) use book::Holdings;
use book::{by_key, Held};
pub use book::{Cause, NO_CONNECTION};

use super::{ActiveRule, Limiter};
use crate::admission::Peer;
use crate::algorithm::{concurrency, Kind, Params};
use crate::clock::local_clock_us;
use crate::config::OnRedisFailure;
use crate::decision::{Decision, Source};
use crate::key::{fits, tag_in, KeyHash, TAG_MAX};
use crate::metrics;
use crate::store::{SlotOp, SlotReply, Store};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often this daemon renews the slots its clients hold (a third of the holder
/// lease: two renewals may fail before a slot lapses).
pub const RENEW_EVERY: Duration = Duration::from_millis(3_000);

/// An `ACQUIRE` or `RELEASE` refused before anything was decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// No rule has this name.
    #[error("unknown rule")]
    UnknownRule,
    /// The rule is not a `concurrency` rule.
    #[error("rule '{rule}' is a {algorithm} rule; ACQUIRE and RELEASE are for concurrency rules")]
    NotConcurrency {
        /// The rule.
        rule: String,
        /// Its algorithm.
        algorithm: &'static str,
    },
    /// The rule's `allow_uids` / `allow_gids` do not list the peer.
    #[error("peer uid {uid} gid {gid} is not in rule '{rule}' allow_uids / allow_gids")]
    Forbidden {
        /// The rule.
        rule: String,
        /// The peer's uid.
        uid: u32,
        /// The peer's gid.
        gid: u32,
    },
    /// `"<rule>:<key>"` does not fit.
    #[error("key too long")]
    KeyTooLong,
    /// `RELEASE` of a token this key does not hold.
    #[error("rule '{rule}' key holds no slot with this token (never handed out, already given back, or lapsed)")]
    Token {
        /// The rule.
        rule: String,
    },
    /// The peer holds its share of the calls in flight to Redis, or Redis cannot be
    /// asked about a token this daemon does not know: retry.
    #[error("{0}; retry")]
    Busy(String),
}

/// The answer to an `ACQUIRE` or a `RELEASE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotAnswer {
    /// A slot taken: the decision and its token.
    Acquired(Decision, String),
    /// No slot free (the decision, `wait_ms` until the oldest slot's `max_hold` ends).
    Denied(Decision),
    /// The slot was given back.
    Released,
    /// Refused.
    Refused(SlotError),
}

/// An answer on its way: ready now, or waiting on Redis (bounded by its timeout).
pub enum Slots {
    /// Decided without I/O.
    Ready(SlotAnswer),
    /// A Redis call in flight.
    Pending(Pin<Box<dyn Future<Output = SlotAnswer> + Send>>),
}

/// A connection's hold on the slots it takes: when it is dropped (the connection
/// closed, however), every slot the connection still holds is given back.
pub struct Holder<S: Store> {
    conn: u64,
    limiter: Weak<Limiter<S>>,
}

impl<S: Store> Holder<S> {
    /// This connection's number in the book.
    pub fn conn(&self) -> u64 {
        self.conn
    }
}

impl<S: Store> Drop for Holder<S> {
    fn drop(&mut self) {
        if let Some(limiter) = self.limiter.upgrade() {
            limiter.connection_closed(self.conn);
        }
    }
}

/// A rule resolved for a slot request, with the key's names.
struct Target<'r> {
    entry: &'r Arc<ActiveRule>,
    key: KeyHash,
}

impl<S: Store> Limiter<S> {
    /// A [`Holder`] for a new connection.
    pub fn holder(self: &Arc<Self>) -> Holder<S> {
        Holder {
            conn: self.slots.open(),
            limiter: Arc::downgrade(self),
        }
    }

    /// Slots held by this daemon's clients now.
    pub fn slots_held(&self) -> usize {
        self.slots.lock().held.len()
    }

    /// Resolves `rule` for a slot request by `peer` on `key`.
    fn slot_target<'r>(
        &self,
        rules: &'r super::Active,
        rule: &[u8],
        key: &[u8],
        peer: &Peer,
    ) -> Result<Target<'r>, SlotError> {
        let entry = std::str::from_utf8(rule)
            .ok()
            .and_then(|name| rules.get(name))
            .ok_or(SlotError::UnknownRule)?;
        let r = &entry.rule;
        if r.params.kind() != Kind::Concurrency {
            return Err(SlotError::NotConcurrency {
                rule: r.name.clone(),
                algorithm: r.params.kind().as_str(),
            });
        }
        if !peer.may(&r.access) {
            return Err(SlotError::Forbidden {
                rule: r.name.clone(),
                uid: peer.uid,
                gid: peer.gid,
            });
        }
        if !fits(r.name.as_bytes(), key) {
            return Err(SlotError::KeyTooLong);
        }
        Ok(Target {
            entry,
            key: self.keys.of(r.name.as_bytes(), key),
        })
    }

    /// `ACQUIRE rule key` for `peer` on connection `conn` ([`Holder::conn`]).
    pub fn acquire(self: &Arc<Self>, rule: &[u8], key: &[u8], peer: &Peer, conn: u64) -> Slots {
        let rules = self.rules.load();
        let t = match self.slot_target(&rules, rule, key, peer) {
            Ok(t) => t,
            Err(e) => return Slots::Ready(SlotAnswer::Refused(e)),
        };
        let entry = Arc::clone(t.entry);
        let Some(redis) = &self.redis else {
            return Slots::Ready(self.acquire_local(&entry, t.key, None, conn, &entry.rule.params));
        };
        let mut buf = [0u8; TAG_MAX];
        let Some(tag) = tag_in(&mut buf, &entry.rule.name, key) else {
            return Slots::Ready(SlotAnswer::Refused(SlotError::KeyTooLong));
        };
        let store_key = redis.key(tag, &entry.rule.params);
        let Some(route) = redis.route(&store_key) else {
            return Slots::Ready(self.acquire_without_redis(&entry, t.key, store_key, conn));
        };
        let Some(permit) = peer.call_permit() else {
            let limits = peer.in_flight_limits();
            return Slots::Ready(SlotAnswer::Refused(SlotError::Busy(format!(
                "too many requests in flight to Redis from uid {} (server.redis_max_in_flight_per_uid = {}, server.redis_max_in_flight = {})",
                peer.uid, limits.per_uid, limits.total
            ))));
        };
        self.start_renewer();
        let limiter = Arc::clone(self);
        let redis = Arc::clone(redis);
        // On a task of its own: a slot Redis gave is in the book even if the client
        // went away meanwhile (and is then given back at once).
        let call = tokio::spawn(async move {
            let (id, holder) = limiter.slots.next();
            let op = SlotOp::Acquire {
                holder: holder.clone(),
            };
            let asked = Instant::now();
            let answer = redis
                .slots(route, store_key.clone(), entry.rule.params, op, permit)
                .await;
            match answer {
                Ok(SlotReply::Acquired(o, hold_end)) => {
                    let slot = (id, holder, hold_end);
                    limiter.acquired_in_redis(&entry, t.key, store_key, slot, o, conn, asked)
                }
                _ => limiter.acquire_without_redis(&entry, t.key, store_key, conn),
            }
        });
        Slots::Pending(Box::pin(async move {
            call.await.unwrap_or_else(|e| {
                SlotAnswer::Refused(SlotError::Busy(format!("internal error: {e}")))
            })
        }))
    }

    /// Redis answered an `ACQUIRE` of slot `id` (token holder part `holder`, its
    /// `max_hold` ending at `hold_end` µs on the Redis clock): on ALLOW the slot enters the book (or
    /// goes back at once if its connection closed meanwhile).
    #[allow(clippy::too_many_arguments)]
    fn acquired_in_redis(
        self: &Arc<Self>,
        entry: &Arc<ActiveRule>,
        key: KeyHash,
        store_key: S::Key,
        (id, holder, hold_end): (u64, String, u64),
        o: crate::algorithm::Outcome,
        conn: u64,
        asked: Instant,
    ) -> SlotAnswer {
        let rule = &entry.rule;
        let decision = Decision {
            allowed: o.allowed,
            limit: rule.limit(),
            remaining: o.remaining,
            reset_ms: o.reset_ms,
            wait_ms: o.wait_ms,
            source: Source::Redis,
        };
        entry.counters.record(&decision);
        if !o.allowed {
            metrics::slot_denied(&rule.name, Source::Redis);
            return SlotAnswer::Denied(decision);
        }
        metrics::slot_acquired(&rule.name, Source::Redis);
        let token = format!("{hold_end}-{holder}");
        let max_hold = Duration::from_micros(max_hold_us(&rule.params));
        let mut book = self.slots.lock();
        let open = book.is_open(conn);
        book.insert(
            token.clone(),
            Held {
                conn,
                entry: Arc::clone(entry),
                key,
                store_key: Some(store_key),
                id,
                local: false,
                until: asked + max_hold,
            },
        );
        if !open {
            let gone = book.close_one(&token);
            drop(book);
            self.give_back(gone);
        }
        SlotAnswer::Acquired(decision, token)
    }

    /// `ACQUIRE` while Redis cannot be asked about the key: per `on_redis_failure`, a
    /// local slot of `limit ÷ hosts`, a slot fail-open, or a DENY fail-closed.
    fn acquire_without_redis(
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
                metrics::slot_denied(&rule.name, d.source);
                SlotAnswer::Denied(Decision { remaining: 0, ..d })
            }
        }
    }

    /// A slot held in this process under `params` (the full limit in `mode = "none"`,
    /// a host's share otherwise); handed back to Redis when it answers again
    /// (`store_key` given).
    fn acquire_local(
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
            metrics::slot_denied(&rule.name, source);
            return SlotAnswer::Denied(decision);
        }
        metrics::slot_acquired(&rule.name, source);
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

    /// `RELEASE rule key token` for `peer`.
    pub fn release(self: &Arc<Self>, rule: &[u8], key: &[u8], token: &[u8], peer: &Peer) -> Slots {
        let rules = self.rules.load();
        let t = match self.slot_target(&rules, rule, key, peer) {
            Ok(t) => t,
            Err(e) => return Slots::Ready(SlotAnswer::Refused(e)),
        };
        let entry = Arc::clone(t.entry);
        let not_held = || {
            SlotAnswer::Refused(SlotError::Token {
                rule: entry.rule.name.clone(),
            })
        };
        let Ok(token) = std::str::from_utf8(token) else {
            return Slots::Ready(not_held());
        };
        let mut book = self.slots.lock();
        let known = match book.held.get(token) {
            Some(h) if h.key != t.key => return Slots::Ready(not_held()),
            // Past its max_hold: it lapsed (or is about to) in Redis.
            Some(h) if h.until <= Instant::now() => book.remove(token, Cause::MaxHold),
            Some(_) => book.remove(token, Cause::Release),
            None => None,
        };
        drop(book);
        match known {
            // Held in this process only: given back here.
            Some(h) if h.local => Slots::Ready(SlotAnswer::Released),
            Some(h) => {
                let Some(store_key) = h.store_key else {
                    return Slots::Ready(SlotAnswer::Released);
                };
                self.release_in_redis(entry, store_key, token.to_owned(), true)
            }
            None => {
                let Some(redis) = &self.redis else {
                    return Slots::Ready(not_held());
                };
                let mut buf = [0u8; TAG_MAX];
                let Some(tag) = tag_in(&mut buf, &entry.rule.name, key) else {
                    return Slots::Ready(not_held());
                };
                let store_key = redis.key(tag, &entry.rule.params);
                self.release_in_redis(entry, store_key, token.to_owned(), false)
            }
        }
    }

    /// Gives `token`'s slot back in Redis. `ours`: this daemon held it (it left the
    /// book already, so if Redis cannot be asked it lapses within the holder lease:
    /// answered `OK`); otherwise a token of another host, or one already given back.
    fn release_in_redis(
        self: &Arc<Self>,
        entry: Arc<ActiveRule>,
        store_key: S::Key,
        token: String,
        ours: bool,
    ) -> Slots {
        let Some(redis) = self.redis.clone() else {
            return Slots::Ready(SlotAnswer::Released);
        };
        let unreachable = move || {
            if ours {
                SlotAnswer::Released
            } else {
                SlotAnswer::Refused(SlotError::Busy(
                    "Redis cannot be asked about this token now".into(),
                ))
            }
        };
        let Some(route) = redis.route(&store_key) else {
            return Slots::Ready(unreachable());
        };
        Slots::Pending(Box::pin(async move {
            let op = SlotOp::Release(vec![token]);
            let params = entry.rule.params;
            match redis.slots(route, store_key, params, op, ()).await {
                Ok(SlotReply::Held(h)) if h.first() == Some(&true) => {
                    if !ours {
                        metrics::slot_released(&entry.rule.name, Cause::Release.as_str());
                    }
                    SlotAnswer::Released
                }
                Ok(_) => SlotAnswer::Refused(SlotError::Token {
                    rule: entry.rule.name.clone(),
                }),
                Err(_) => unreachable(),
            }
        }))
    }

    /// Connection `conn` closed: its slots leave the book and go back to Redis, one
    /// call per key, on a task of their own.
    pub(super) fn connection_closed(self: &Arc<Self>, conn: u64) {
        let gone = self.slots.lock().close(conn);
        self.give_back(gone);
    }

    /// Gives back in Redis the slots `gone` (out of the book already), one call per
    /// key. Without a runtime, or with Redis unreachable, they lapse within the holder
    /// lease (nobody renews them).
    fn give_back(self: &Arc<Self>, gone: Vec<(String, Held<S::Key>)>) {
        let (Some(redis), false) = (self.redis.clone(), gone.is_empty()) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let groups = by_key(
            gone.into_iter()
                .map(|(t, h)| (t, h.key, h.entry, h.store_key)),
        );
        runtime.spawn(async move {
            let calls = groups.into_iter().filter_map(|(entry, store_key, tokens)| {
                let route = redis.route(&store_key)?;
                let op = SlotOp::Release(tokens);
                Some(redis.slots(route, store_key, entry.rule.params, op, ()))
            });
            futures::future::join_all(calls).await;
        });
    }

    /// Starts the renewal of this daemon's slots, once.
    fn start_renewer(self: &Arc<Self>) {
        if self.renewer.set(()).is_err() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(RENEW_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(limiter) = weak.upgrade() else {
                    return;
                };
                limiter.renew_slots().await;
            }
        });
    }

    /// One round of upkeep: the slots past their `max_hold` leave the book; those held
    /// in Redis are renewed (one call per key; a token Redis no longer holds leaves the
    /// book as `holder_lost`); those held locally are handed back to Redis where it
    /// answers again.
    pub(super) async fn renew_slots(self: &Arc<Self>) {
        let Some(redis) = self.redis.clone() else {
            self.slots.lock().lapse(Instant::now());
            return;
        };
        let (in_redis, local) = {
            let mut book = self.slots.lock();
            book.lapse(Instant::now());
            let pick = |local: bool| {
                by_key(
                    book.held
                        .iter()
                        .filter(|(_, h)| h.local == local)
                        .map(|(t, h)| {
                            (t.clone(), h.key, Arc::clone(&h.entry), h.store_key.clone())
                        }),
                )
            };
            (pick(false), pick(true))
        };
        let renewals = in_redis
            .into_iter()
            .filter_map(|(entry, store_key, tokens)| {
                let route = redis.route(&store_key)?;
                let redis = Arc::clone(&redis);
                Some(async move {
                    let op = SlotOp::Renew(tokens.clone());
                    let found = redis
                        .slots(route, store_key, entry.rule.params, op, ())
                        .await;
                    (tokens, found)
                })
            });
        let hand_backs = local.into_iter().filter_map(|(entry, store_key, tokens)| {
            let route = redis.route(&store_key)?;
            let redis = Arc::clone(&redis);
            Some(async move {
                let op = SlotOp::HandBack(tokens.clone());
                let added = redis
                    .slots(route, store_key, entry.rule.params, op, ())
                    .await;
                (tokens, added)
            })
        });
        let (renewed, handed) = futures::future::join(
            futures::future::join_all(renewals),
            futures::future::join_all(hand_backs),
        )
        .await;
        let mut book = self.slots.lock();
        for (tokens, found) in renewed {
            if let Ok(SlotReply::Held(found)) = found {
                for (token, held) in tokens.iter().zip(found) {
                    if !held {
                        book.remove(token, Cause::HolderLost);
                    }
                }
            }
        }
        for (tokens, added) in handed {
            if let Ok(SlotReply::HandedBack(_)) = added {
                // Redis counts them now: they leave the local slots, stay in the book.
                for token in &tokens {
                    if let Some(h) = book.held.get_mut(token) {
                        h.local = false;
                        let (key, id) = (h.key, h.id);
                        book.release_local(key, id);
                    }
                }
            }
        }
    }
}

/// The concurrency parameters of `params` (another algorithm's never reach here: the
/// rule was checked).
fn concurrency_params(params: &Params) -> concurrency::Params {
    match params {
        Params::Concurrency(p) => *p,
        _ => concurrency::Params {
            limit: 0.0,
            max_hold: 0.0,
        },
    }
}

/// `max_hold` of `params`, µs.
fn max_hold_us(params: &Params) -> u64 {
    concurrency_params(params).max_hold as u64
}
