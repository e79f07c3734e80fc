//! One primary's queue of waiting calls and its sender task, shared by the batches of
//! single decisions and lease calls ([`super::batch`]) and those of all-or-nothing
//! groups and give-backs ([`super::batch_all`]). Nothing waits to fill a batch: what
//! finds fewer than [`MAX_IN_FLIGHT`] batches in flight goes at once; the rest queue and
//! leave together when a batch comes back, as soon as a full batch waits (a batch is
//! bounded by its calls' weight: about what each costs Redis), or once the first of
//! them has waited `queued_at_most` (a slow Redis must not hold a call through two round
//! trips).

use super::redis::RedisStore;
use super::topology::Primary;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

/// At most this many batches of less than a full batch in flight per primary and
/// queue. While they are, new calls queue and leave together when one comes back, or
/// at once when a full batch of them waits: one call keeps Redis busy while the next
/// fills, and a call finding fewer in flight goes at once.
pub const MAX_IN_FLIGHT: usize = 2;

/// A call that waits in a [`Queue`].
pub(super) trait Queued: Send + 'static {
    /// When its caller started waiting.
    fn since(&self) -> Instant;

    /// Its share of a batch's bound: about what it costs Redis, in the cheapest call's
    /// (1).
    fn weight(&self) -> usize {
        1
    }
}

/// The weight of `jobs` ([`Queued::weight`]).
fn weight<J: Queued>(jobs: &[J]) -> usize {
    jobs.iter().map(Queued::weight).sum()
}

/// Takes from the front of `jobs` the next batch: as many as fit in `max` (at least
/// one); the others stay, in order, for the batch after.
fn next_batch<J: Queued>(jobs: &mut Vec<J>, max: usize) -> Vec<J> {
    let mut total = 0;
    let fit = jobs
        .iter()
        .position(|j| {
            total += j.weight();
            total > max
        })
        .unwrap_or(jobs.len())
        .max(1);
    let rest = jobs.split_off(fit.min(jobs.len()));
    std::mem::replace(jobs, rest)
}

/// The queue of one primary's calls of one kind, and its sender task.
pub(super) struct Queue<J> {
    tx: mpsc::UnboundedSender<J>,
    /// Taken by [`Queue::run`].
    rx: Mutex<Option<mpsc::UnboundedReceiver<J>>>,
    started: AtomicBool,
}

impl<J: Queued> Queue<J> {
    /// A queue whose sender task is not running yet.
    pub fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Queue {
            tx,
            rx: Mutex::new(Some(rx)),
            started: AtomicBool::new(false),
        }
    }

    /// True once the sender task runs: calls are sent.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    /// Queues `job`; gives it back if the sender task is gone.
    pub fn submit(&self, job: J) -> Result<(), J> {
        self.tx.send(job).map_err(|e| e.0)
    }

    /// Starts the sender task for `primary` (once; later calls do nothing): batches of
    /// calls weighing at most `max` ([`Queued::weight`]), each handed to `send` in a
    /// task of its own (the next batch
    /// goes out without waiting for this one's answer: fred pipelines them on the
    /// connection). It ends when the store or the primary goes away (the primary holds
    /// this queue).
    pub fn run<F, Fut>(
        &self,
        store: Weak<RedisStore>,
        primary: Weak<Primary>,
        max: usize,
        queued_at_most: Duration,
        send: F,
    ) where
        F: Fn(Arc<RedisStore>, Arc<Primary>, Vec<J>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(mut rx) = self.rx.lock().ok().and_then(|mut rx| rx.take()) else {
            return;
        };
        self.started.store(true, Ordering::Relaxed);
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        tokio::spawn(async move {
            let mut jobs = Vec::with_capacity(max);
            loop {
                if jobs.is_empty() && rx.recv_many(&mut jobs, max).await == 0 {
                    return;
                }
                // A full batch goes at once: the cap on batches in flight only gathers
                // calls, it never holds back more than a batch of them.
                let room = max.saturating_sub(weight(&jobs));
                // Nor does it hold a call long behind a slow Redis.
                let waited_enough = jobs.first().map(|j| j.since() + queued_at_most);
                let permit = match Arc::clone(&in_flight).try_acquire_owned() {
                    Ok(permit) => Some(permit),
                    Err(_) if room == 0 => None,
                    Err(_) => tokio::select! {
                        permit = Arc::clone(&in_flight).acquire_owned() => permit.ok(),
                        more = rx.recv_many(&mut jobs, room) => {
                            if more > 0 {
                                continue;
                            }
                            None
                        }
                        () = tokio::time::sleep_until(waited_enough.unwrap_or_else(Instant::now)) => None,
                    },
                };
                let (Some(store), Some(primary)) = (store.upgrade(), primary.upgrade()) else {
                    return;
                };
                let batch = next_batch(&mut jobs, max);
                let sent = send(store, primary, batch);
                tokio::spawn(async move {
                    sent.await;
                    drop(permit);
                });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Call(usize);

    impl Queued for Call {
        fn since(&self) -> Instant {
            Instant::now()
        }
        fn weight(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn a_batch_takes_what_fits_in_order_and_at_least_one_call() {
        let weights = |jobs: &[Call]| jobs.iter().map(|c| c.0).collect::<Vec<_>>();
        let mut jobs: Vec<Call> = [3, 1, 3, 1, 1].into_iter().map(Call).collect();
        assert_eq!(weights(&next_batch(&mut jobs, 6)), vec![3, 1]);
        assert_eq!(weights(&next_batch(&mut jobs, 6)), vec![3, 1, 1]);
        assert!(jobs.is_empty());
        let mut heavy = vec![Call(9), Call(1)];
        assert_eq!(weights(&next_batch(&mut heavy, 6)), vec![9]);
        assert_eq!(weights(&heavy), vec![1]);
    }
}
