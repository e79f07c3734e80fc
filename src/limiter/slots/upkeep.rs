//! The upkeep of this daemon's slots: a closed connection's slots given back (one call
//! per key), the renewal every [`RENEW_EVERY`] that keeps a live
//! daemon's slots in Redis and lets a dead one's lapse, the slots past their `max_hold`
//! leaving the book, and the hand-back of slots held locally once Redis answers again.

use super::book::{by_key, Cause, Held};
use super::RENEW_EVERY;
use crate::limiter::Limiter;
use crate::store::{SlotOp, SlotReply, Store};
use std::sync::Arc;
use std::time::Instant;

impl<S: Store> Limiter<S> {
    /// Connection `conn` closed: its slots leave the book and go back to Redis, one
    /// call per key, on a task of their own.
    pub(super) fn connection_closed(self: &Arc<Self>, conn: u64) {
        let gone = self.slots.lock().close(conn);
        self.give_back(gone);
    }

    /// Gives back in Redis the slots `gone` (out of the book already), one call per
    /// key. Without a runtime, or with Redis unreachable, they lapse within the holder
    /// lease (nobody renews them).
    pub(super) fn give_back(self: &Arc<Self>, gone: Vec<(String, Held<S::Key>)>) {
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
    pub(super) fn start_renewer(self: &Arc<Self>) {
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
