//! The clocks a decision reads, and their units.
//!
//! Local decisions (`redis.mode = "none"`, the fallback, the deny cache's ageing) use the
//! host's wall clock in **µs since the Unix epoch**, as Redis `TIME` counts inside the
//! scripts, so windows align to the epoch alike everywhere. Durations that only this
//! process measures (timeouts, log throttling) use `std::time::Instant` directly.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now on the host's wall clock, µs since the Unix epoch (as Redis `TIME` counts), for
/// local decisions: windows must align to the epoch on every host alike.
pub fn wall_clock_us() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| {
            // Seconds and µs separately: exact, and cheaper than a u128 conversion.
            d.as_secs() as f64 * 1e6 + f64::from(d.subsec_micros())
        })
}

/// The wall clock read at most once per batch of requests (the lines one `read` brought
/// in are decided at one instant): reading the clock is a measurable share of a local
/// decision.
#[derive(Debug, Default)]
pub struct BatchClock(Option<f64>);

impl BatchClock {
    /// Now, µs since the epoch: read at the first call, the same value afterwards.
    pub fn now_us(&mut self) -> f64 {
        *self.0.get_or_insert_with(wall_clock_us)
    }
}
