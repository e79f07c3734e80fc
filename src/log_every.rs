//! The one rate-limited logging helper: "log this at most once per interval, and say
//! how many were left out".
//!
//! A line per event would flood the journal under load (a refused connection storm, a
//! key Redis cannot decide, requested a million times a second), so such events are
//! logged through a [`LogEvery`]. Lock-free: callable from any task through `&self`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Lets one event through per `interval`, counting those held back.
#[derive(Debug)]
pub struct LogEvery {
    epoch: Instant,
    interval_ms: u64,
    /// When an event was last let through: ms since `epoch`, plus 1 (0 = never).
    last: AtomicU64,
    /// Events held back since the last one let through.
    suppressed: AtomicU64,
}

impl LogEvery {
    /// At most one event per `interval` (`Duration::MAX`: only the first ever).
    pub fn new(interval: Duration) -> Self {
        LogEvery {
            epoch: Instant::now(),
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(events held back since the last one let through)` when this event may be
    /// logged now; `None` (and counted) otherwise.
    pub fn admit(&self) -> Option<u64> {
        let now = u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now >= last.saturating_add(self.interval_ms);
        if due
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_interval_and_counts_the_rest() {
        let t = LogEvery::new(Duration::from_millis(30));
        assert_eq!(t.admit(), Some(0));
        assert_eq!(t.admit(), None);
        assert_eq!(t.admit(), None);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(t.admit(), Some(2));
        let once = LogEvery::new(Duration::MAX);
        assert_eq!(once.admit(), Some(0));
        assert_eq!(once.admit(), None);
    }
}
