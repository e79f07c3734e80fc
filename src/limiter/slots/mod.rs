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
mod detached;
mod local;
mod release;
mod upkeep;

use book::Held;
pub(super) use book::Holdings;
pub use book::{Cause, NO_CONNECTION};

use super::{ActiveRule, Limiter};
use crate::admission::Peer;
use crate::algorithm::{concurrency, Kind, Params};
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
        self.acquire_entry(entry, t.key, key, peer, conn)
    }

    /// `ACQUIRE` of `key` (hashed `key_hash`) under `entry`, its rule resolved.
    pub(super) fn acquire_entry(
        self: &Arc<Self>,
        entry: Arc<ActiveRule>,
        key_hash: KeyHash,
        key: &[u8],
        peer: &Peer,
        conn: u64,
    ) -> Slots {
        let Some(redis) = &self.redis else {
            return Slots::Ready(self.acquire_local(
                &entry,
                key_hash,
                None,
                conn,
                &entry.rule.params,
            ));
        };
        let mut buf = [0u8; TAG_MAX];
        let Some(tag) = tag_in(&mut buf, &entry.rule.name, key) else {
            return Slots::Ready(SlotAnswer::Refused(SlotError::KeyTooLong));
        };
        let store_key = redis.key(tag, &entry.rule.params);
        let Some(route) = redis.route(&store_key) else {
            return Slots::Ready(self.acquire_without_redis(&entry, key_hash, store_key, conn));
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
                    limiter.acquired_in_redis(&entry, key_hash, store_key, slot, o, conn, asked)
                }
                _ => limiter.acquire_without_redis(&entry, key_hash, store_key, conn),
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
            if !entry.detached {
                metrics::slot_denied(&rule.name, Source::Redis);
            }
            return SlotAnswer::Denied(decision);
        }
        if !entry.detached {
            metrics::slot_acquired(&rule.name, Source::Redis);
        }
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
