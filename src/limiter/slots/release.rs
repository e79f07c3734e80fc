//! `RELEASE` of a concurrency slot: given back here when this daemon holds it locally,
//! in Redis otherwise (also a token another host handed out), `ERR TOKEN` when the key
//! holds no such slot.

use super::book::Cause;
use super::{SlotAnswer, SlotError, Slots};
use crate::admission::Peer;
use crate::key::{tag_in, TAG_MAX};
use crate::limiter::{ActiveRule, Limiter};
use crate::metrics;
use crate::store::{SlotOp, SlotReply, Store};
use std::sync::Arc;
use std::time::Instant;

impl<S: Store> Limiter<S> {
    /// `RELEASE rule key token` for `peer`.
    pub fn release(self: &Arc<Self>, rule: &[u8], key: &[u8], token: &[u8], peer: &Peer) -> Slots {
        let rules = self.rules.load();
        let t = match self.slot_target(&rules, rule, key, peer) {
            Ok(t) => t,
            Err(e) => return Slots::Ready(SlotAnswer::Refused(e)),
        };
        let entry = Arc::clone(t.entry);
        self.release_entry(entry, t.key, key, token)
    }

    /// `RELEASE` of `token` on `key` (hashed `key_hash`) under `entry`.
    pub(super) fn release_entry(
        self: &Arc<Self>,
        entry: Arc<ActiveRule>,
        key_hash: crate::key::KeyHash,
        key: &[u8],
        token: &[u8],
    ) -> Slots {
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
            Some(h) if h.key != key_hash => return Slots::Ready(not_held()),
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
                    if !ours && !entry.detached {
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
}
