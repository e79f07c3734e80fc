//! The deny cache's refreshes, gathered. A refresh is a dry run that no client waits
//! for: the expired entry keeps answering while it is in flight (the cache's grace). Sent
//! one by one, refreshes are Redis calls at random moments, each a wake-up of the
//! daemon's Redis connection and of Redis: 10³ denied keys at `cache.ttl_ms = 500` are
//! 2,000 a second, and on a busy core each delays the request queued behind it.
//! Refreshes claimed within [`GATHER`] of each other leave together when it ends: one
//! wake-up for all of them, and on a standalone Redis one EVALSHA (the store sends the
//! calls made together as one batch).
//!
//! The wait comes out of the grace: it is at most a quarter of it (half of
//! `redis.timeout_ms`; none when that is under 1 ms), so the dry run keeps the rest. A
//! refresh that still comes back after the grace only lets its entry lapse: the next
//! request asks Redis for real.

use super::query::Query;
use super::Limiter;
use crate::admission::CallPermit;
use crate::store::Store;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long the first refresh of a gathering waits for others: 5 ms, or a quarter of
/// the grace when that is shorter. At 2,000 refreshes a second, batches of about 10.
pub const GATHER: Duration = Duration::from_millis(5);

/// A wait shorter than this is no wait: Tokio's timer counts whole milliseconds, so it
/// would take 1 ms, more than a quarter of a grace this short. Such a refresh starts at
/// once, alone.
const SHORTEST_WAIT: Duration = Duration::from_millis(1);

/// Refreshes claimed and not sent yet, with the slot each holds of the daemon's cap of
/// calls in flight to Redis (so the cap counts them while they wait).
pub(super) struct Refreshes<S: Store> {
    waiting: Mutex<Vec<(Query<S>, CallPermit)>>,
    gather: Duration,
}

impl<S: Store> Refreshes<S> {
    /// Gathering for [`GATHER`] or `grace / 4`, whichever is shorter.
    pub fn new(grace: Duration) -> Self {
        Refreshes {
            waiting: Mutex::new(Vec::new()),
            gather: GATHER.min(grace / 4),
        }
    }

    /// Queues the refresh `query` (its `limiter` holds this queue). The first refresh of
    /// a gathering starts its timer; when it fires, every refresh waiting starts at once
    /// ([`Query::refresh`]). Outside a Tokio runtime nothing starts, as for
    /// [`Query::refresh`]: the entry lapses at the end of its grace.
    pub fn push(&self, query: Query<S>, slot: CallPermit) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.gather < SHORTEST_WAIT {
            query.refresh(slot);
            return;
        }
        let first = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            let first = waiting.is_empty().then(|| Arc::clone(&query.limiter));
            waiting.push((query, slot));
            first
        };
        if let Some(limiter) = first {
            // Drained however the wait ends (its timer, a panic, the task dropped with
            // its runtime, polled or not): a queue left full would arm no timer again.
            let due = Due(limiter);
            let gather = self.gather;
            runtime.spawn(async move {
                tokio::time::sleep(gather).await;
                drop(due);
            });
        }
    }
}

/// The end of a gathering: on drop, every refresh waiting starts ([`Query::refresh`];
/// nothing starts when the runtime is gone, and their slots are given back).
struct Due<S: Store>(Arc<Limiter<S>>);

impl<S: Store> Drop for Due<S> {
    fn drop(&mut self) {
        let due = std::mem::take(
            &mut *self
                .0
                .refreshes
                .waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for (query, slot) in due {
            query.refresh(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_at_most_a_quarter_of_the_grace() {
        assert_eq!(
            Refreshes::<crate::store::RedisStore>::new(Duration::from_millis(200)).gather,
            GATHER
        );
        assert_eq!(
            Refreshes::<crate::store::RedisStore>::new(Duration::from_millis(8)).gather,
            Duration::from_millis(2)
        );
        assert_eq!(
            Refreshes::<crate::store::RedisStore>::new(Duration::ZERO).gather,
            Duration::ZERO
        );
        // redis.timeout_ms = 1: no wait at all (Tokio's timer would take 1 ms).
        assert!(
            Refreshes::<crate::store::RedisStore>::new(Duration::from_millis(2)).gather
                < SHORTEST_WAIT
        );
    }
}
