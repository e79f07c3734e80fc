//! Whether this process itself was late: a ticker that measures event-loop lag.
//!
//! A Redis call that "timed out" because this process did not run (CPU starvation, a
//! paused VM, `SIGSTOP`) says nothing about Redis: its reply may be sitting in the
//! socket, unread. The health of a primary must not count such a timeout
//! (docs/DESIGN.md, "Health per primary"). A task wakes every [`TICK`]; when it wakes
//! late by `stall` or more, the process was stalled for that long, and any Redis call
//! in flight across that moment is excused. A call is also excused when the ticker
//! itself is overdue (the stall is still going on, or has just ended and the ticker has
//! not run yet) or when its own timer fired `stall` late.

use crate::clock::mono_us;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the ticker wakes.
pub const TICK: Duration = Duration::from_millis(5);

/// Event-loop lag as the ticker saw it.
#[derive(Debug)]
pub struct Lateness {
    /// A wake-up this late or later is a stall of the process.
    stall: Duration,
    /// When the ticker last ran ([`mono_us`]).
    last_tick_us: AtomicU64,
    /// When the last stall ended ([`mono_us`]; 0 = none yet).
    last_stall_end_us: AtomicU64,
}

impl Lateness {
    /// A ticker state for calls bounded by `timeout`: a stall of half of it or more
    /// (at least 2 ms) leaves Redis less than half of an honest chance to answer.
    pub fn new(timeout: Duration) -> Self {
        Lateness {
            stall: (timeout / 2).max(Duration::from_millis(2)),
            last_tick_us: AtomicU64::new(mono_us()),
            last_stall_end_us: AtomicU64::new(0),
        }
    }

    /// The stall threshold.
    pub fn stall(&self) -> Duration {
        self.stall
    }

    /// Runs the ticker forever (spawn it on the runtime that serves requests).
    pub async fn run(&self) {
        let tick_us = u64::try_from(TICK.as_micros()).unwrap_or(u64::MAX);
        let stall_us = u64::try_from(self.stall.as_micros()).unwrap_or(u64::MAX);
        loop {
            let before = mono_us();
            tokio::time::sleep(TICK).await;
            let now = mono_us();
            if now.saturating_sub(before) >= tick_us + stall_us {
                self.last_stall_end_us.store(now, Ordering::Relaxed);
            }
            self.last_tick_us.store(now, Ordering::Relaxed);
        }
    }

    /// True when this process was stalled at some point since `since_us` ([`mono_us`]),
    /// or is right now.
    pub fn late_since(&self, since_us: u64) -> bool {
        let now = mono_us();
        let overdue_us = u64::try_from((TICK + self.stall).as_micros()).unwrap_or(u64::MAX);
        self.last_stall_end_us.load(Ordering::Relaxed) >= since_us
            || now.saturating_sub(self.last_tick_us.load(Ordering::Relaxed)) >= overdue_us
    }

    /// True when a call sent at `sent_us` and bounded by `timeout` is overdue because of
    /// this process: it was stalled meanwhile, or the timer itself fired a stall late.
    pub fn excuses(&self, sent_us: u64, timeout: Duration) -> bool {
        let waited = Duration::from_micros(mono_us().saturating_sub(sent_us));
        waited >= timeout + self.stall || self.late_since(sent_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_timer_is_excused() {
        let l = Lateness::new(Duration::from_millis(20));
        let sent = mono_us();
        std::thread::sleep(Duration::from_millis(35));
        // The ticker never ran (no runtime): overdue, so excused.
        assert!(l.excuses(sent, Duration::from_millis(20)));
    }

    #[test]
    fn an_honest_timeout_is_not_excused() {
        let l = Lateness::new(Duration::from_millis(20));
        // A ticker that just ran and saw no stall since `sent`.
        let sent = mono_us();
        l.last_tick_us.store(mono_us(), Ordering::Relaxed);
        assert!(!l.late_since(sent));
    }

    #[tokio::test]
    async fn a_blocked_runtime_is_a_stall() {
        let l = std::sync::Arc::new(Lateness::new(Duration::from_millis(10)));
        let ticker = tokio::spawn({
            let l = std::sync::Arc::clone(&l);
            async move { l.run().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let sent = mono_us();
        // Block the (single-threaded test) runtime for 30 ms.
        std::thread::sleep(Duration::from_millis(30));
        tokio::time::sleep(Duration::from_millis(12)).await;
        assert!(l.late_since(sent));
        ticker.abort();
    }
}
