//! The clocks a decision reads, and their units.
//!
//! Local decisions (`redis.mode = "none"`, the fallback, the deny cache's ageing) use
//! [`local_clock_us`]: µs since the Unix epoch as the wall clock read it once, at the
//! first call, advanced by the monotonic clock since. Windows align to the epoch as in
//! Redis (within the wall clock's error at start), and a step of the wall clock (NTP,
//! an operator, a resumed VM) neither hands local buckets a fresh budget (a step
//! forward) nor freezes them (a step back). Durations that only this process measures
//! (timeouts, log throttling) use `std::time::Instant` directly.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Now on the host's wall clock, µs since the Unix epoch (as Redis `TIME` counts).
pub fn wall_clock_us() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| {
            // Seconds and µs separately: exact, and cheaper than a u128 conversion.
            d.as_secs() as f64 * 1e6 + f64::from(d.subsec_micros())
        })
}

/// The clock of local decisions: µs since the epoch, monotonic. The wall clock read at
/// the first call, plus the monotonic time elapsed since (whole µs).
pub fn local_clock_us() -> f64 {
    static ANCHOR: OnceLock<(Instant, f64)> = OnceLock::new();
    let (at, wall) = *ANCHOR.get_or_init(|| (Instant::now(), wall_clock_us()));
    let since = at.elapsed();
    wall + since.as_secs() as f64 * 1e6 + f64::from(since.subsec_micros())
}

/// The local clock read at most once per batch of requests (the lines one `read`
/// brought in are decided at one instant): reading the clock is a measurable share of a
/// local decision.
#[derive(Debug, Default)]
pub struct BatchClock(Option<f64>);

impl BatchClock {
    /// Now, µs since the epoch ([`local_clock_us`]): read at the first call, the same
    /// value afterwards.
    pub fn now_us(&mut self) -> f64 {
        *self.0.get_or_insert_with(local_clock_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_clock_is_near_the_wall_clock_and_never_goes_back() {
        let a = local_clock_us();
        let b = local_clock_us();
        assert!(b >= a);
        assert!((a - wall_clock_us()).abs() < 5e6, "{a}");
    }
}
