//! The slots whose owner is in doubt lately (Redis Cluster): a slot whose key a batch
//! refused as not the node's own, or that answered `ASK` or `MOVED`, is probably
//! migrating, or has moved and the slot map has not caught up. Its keys are sent on
//! their own for a while ([`UNSETTLED_FOR`]), where `ASK` and `MOVED` are handled, rather
//! than in a batch that would refuse them again (a second round trip each).
//!
//! Only an optimisation: exactness does not rest on it. A batch on a primary decides a
//! key only if Redis, checking the script's command on it, holds it as the node's own
//! and not moved away (`lua/batch.lua`); anything else is refused and resent alone.

use crate::clock::mono_us;
use crate::store::topology::SLOTS;
use std::sync::atomic::{AtomicU64, Ordering};

/// How long a slot stays in doubt after the last sign of a move, µs. A migration moves
/// a slot's keys in rounds of `MIGRATE` a few ms apart; each key it moves that is asked
/// for renews the doubt.
pub const UNSETTLED_FOR: u64 = 2_000_000;

/// Per slot, until when (µs of [`mono_us`]) its keys go alone; 0: settled.
pub struct Unsettled(Box<[AtomicU64]>);

impl Unsettled {
    /// Every slot settled.
    pub fn new() -> Self {
        Unsettled((0..SLOTS).map(|_| AtomicU64::new(0)).collect())
    }

    /// `key`'s slot is in doubt from now on, for [`UNSETTLED_FOR`].
    pub fn mark(&self, key: &[u8]) {
        let slot = usize::from(fred::util::redis_keyslot(key));
        if let Some(until) = self.0.get(slot) {
            until.store(mono_us() + UNSETTLED_FOR, Ordering::Relaxed);
        }
    }

    /// True while `key`'s slot is in doubt.
    pub fn holds(&self, key: &[u8]) -> bool {
        let slot = usize::from(fred::util::redis_keyslot(key));
        self.0
            .get(slot)
            .is_some_and(|until| until.load(Ordering::Relaxed) > mono_us())
    }
}

impl Default for Unsettled {
    fn default() -> Self {
        Unsettled::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_slot_is_in_doubt_and_others_are_not() {
        let u = Unsettled::new();
        assert!(!u.holds(b"rl:{a:b}:tb"));
        u.mark(b"rl:{a:b}:tb");
        // The same slot, another key (the hash tag decides the slot).
        assert!(u.holds(b"rl:{a:b}:fw"));
        assert!(!u.holds(b"rl:{a:c}:tb"));
    }
}
