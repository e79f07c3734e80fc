//! `ACQUIRE` and `RELEASE` under a rule outside the table of named rules (the rule
//! lab's): the same script, the same book of held slots (so a [`super::Holder`] gives
//! them back when dropped), no access lists and no metrics series. Also what the
//! operator verbs ask of a key's slots (`INSPECT`, `RESET`).

use super::{SlotAnswer, SlotError, Slots};
use crate::admission::Peer;
use crate::algorithm::Kind;
use crate::key::{fits, KeyHash};
use crate::limiter::{ActiveRule, Detached, Limiter};
use crate::store::Store;
use std::sync::Arc;
use std::time::Instant;

impl<S: Store> Limiter<S> {
    /// Slots of `key` this daemon's clients hold now (their `max_hold` not ended).
    pub(in crate::limiter) fn slots_held_of(&self, key: KeyHash) -> u64 {
        self.slots.lock().held_of(key, Instant::now())
    }

    /// `RESET` of a concurrency key: its slots leave this daemon's book (a later
    /// `RELEASE` of one answers `ERR TOKEN`), local ones included.
    pub(in crate::limiter) fn slots_reset(&self, key: KeyHash) {
        self.slots.lock().reset(key);
    }

    /// `ACQUIRE` of `key` under a [`Detached`] concurrency rule (the lab's), as
    /// [`Limiter::acquire`] does for a named one: same script, same book, so the slot is
    /// given back when connection `conn`'s [`Holder`](super::Holder) drops. Access lists are not
    /// checked (a detached rule has none that apply).
    pub fn acquire_detached(
        self: &Arc<Self>,
        rule: &Detached,
        key: &[u8],
        peer: &Peer,
        conn: u64,
    ) -> Slots {
        let entry = Arc::clone(&rule.0);
        let key_hash = match self.detached_target(&entry, key) {
            Ok(k) => k,
            Err(e) => return Slots::Ready(SlotAnswer::Refused(e)),
        };
        self.acquire_entry(entry, key_hash, key, peer, conn)
    }

    /// The key of a slot request under a detached rule, or why it is refused.
    fn detached_target(&self, entry: &ActiveRule, key: &[u8]) -> Result<KeyHash, SlotError> {
        let r = &entry.rule;
        if r.params.kind() != Kind::Concurrency {
            return Err(SlotError::NotConcurrency {
                rule: r.name.clone(),
                algorithm: r.params.kind().as_str(),
            });
        }
        if !fits(r.name.as_bytes(), key) {
            return Err(SlotError::KeyTooLong);
        }
        Ok(self.keys.of(r.name.as_bytes(), key))
    }

    /// `RELEASE` of `token` on `key` under a [`Detached`] concurrency rule (the lab's),
    /// as [`Limiter::release`] does for a named one.
    pub fn release_detached(self: &Arc<Self>, rule: &Detached, key: &[u8], token: &[u8]) -> Slots {
        let entry = Arc::clone(&rule.0);
        match self.detached_target(&entry, key) {
            Ok(key_hash) => self.release_entry(entry, key_hash, key, token),
            Err(e) => Slots::Ready(SlotAnswer::Refused(e)),
        }
    }
}
