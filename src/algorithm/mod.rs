//! Rate-limit algorithms as pure functions of `(state, now, params, cost)` (CONTRACT §2).
//!
//! Each algorithm has a Lua twin in `lua/` that Redis runs with EVALSHA; the two are
//! written operation for operation alike (IEEE doubles, the same order of operations),
//! so for the same inputs they return the same fields. The Rust side serves
//! `redis.mode = "none"` and the local fallback. `tests/twins.rs` drives random traces
//! through both twins and through an independent reference model (`tests/reference`).
//!
//! Conventions shared by every algorithm and its twin:
//! * time is in **µs** (Redis `TIME`, or the host's wall clock locally), as integer-valued
//!   doubles; windows are aligned to the Unix epoch; a clock that runs backwards is
//!   treated as standing still;
//! * `remaining` is a floor, `reset_ms` and `wait_ms` are the smallest whole numbers of
//!   ms after which the stored state is fully unused / the same request is allowed
//!   ([`settle`] makes the closed-form answer exact against floating-point rounding);
//! * a request that can never pass (its cost above a fallback share of the limit) is a
//!   DENY with `wait_ms = max(reset_ms, 1)`.

pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

use std::time::{SystemTime, UNIX_EPOCH};

/// Micro-units per unit: bucket levels are counted in µ-units so that state values stay
/// integers (exact in doubles) while rates are fractional.
pub const MICRO: f64 = 1_000_000.0;

/// The result of one decision, before it is labelled with a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The request may proceed (its cost was taken).
    pub allowed: bool,
    /// Whole units the key could still take now (floor).
    pub remaining: u64,
    /// ms until the key is back to fully unused (ceil).
    pub reset_ms: u64,
    /// On DENY, ms until the same request could be allowed (ceil). On ALLOW, the ms the
    /// caller should wait before doing the work: non-zero only for the leaky bucket.
    pub wait_ms: u64,
}

/// One host's share of a bucket: `capacity` units in µ-units and `rate` units/s, each
/// divided by `hosts` (capacity floored to whole µ-units: never above the share).
pub fn bucket_share(capacity: u64, rate: f64, hosts: u32) -> (f64, f64) {
    let hosts = f64::from(hosts.max(1));
    ((capacity as f64 * MICRO / hosts).floor(), rate / hosts)
}

/// `limit` and `window` of the three window algorithms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowParams {
    /// Units allowed per window: the rule's `limit`, or `limit ÷ hosts` for a local
    /// fallback (then possibly fractional: `10 ÷ 4 = 2.5` admits 2).
    pub limit: f64,
    /// Window length in µs (a whole number of ms, ≥ 1 ms).
    pub window: f64,
}

impl WindowParams {
    /// `limit` units per `window_ms`, shared by `hosts` hosts (each gets `limit ÷ hosts`;
    /// the window stays the same).
    pub fn shared(limit: u64, window_ms: u64, hosts: u32) -> Self {
        WindowParams {
            limit: limit as f64 / f64::from(hosts.max(1)),
            window: window_ms as f64 * 1000.0,
        }
    }
}

/// The parameters of one rule's algorithm, ready for a decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Params {
    /// [`token_bucket`].
    TokenBucket(token_bucket::Params),
    /// [`leaky_bucket`].
    LeakyBucket(leaky_bucket::Params),
    /// [`fixed_window`].
    FixedWindow(WindowParams),
    /// [`sliding_window_log`].
    SlidingWindowLog(WindowParams),
    /// [`sliding_window_counter`].
    SlidingWindowCounter(WindowParams),
}

/// What one key remembers between decisions, per algorithm.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// [`token_bucket::State`].
    TokenBucket(token_bucket::State),
    /// [`leaky_bucket::State`].
    LeakyBucket(leaky_bucket::State),
    /// [`fixed_window::State`].
    FixedWindow(fixed_window::State),
    /// [`sliding_window_log::Log`].
    SlidingWindowLog(sliding_window_log::Log),
    /// [`sliding_window_counter::State`].
    SlidingWindowCounter(sliding_window_counter::State),
}

impl Params {
    /// True if a request of `cost` units can ever be allowed under these parameters
    /// (false when `cost` exceeds a host's fallback share of the limit).
    pub fn can_ever_pass(&self, cost: u64) -> bool {
        let cost = cost as f64;
        match self {
            Params::TokenBucket(p) => cost * MICRO <= p.capacity,
            Params::LeakyBucket(p) => cost * MICRO <= p.capacity,
            Params::FixedWindow(w)
            | Params::SlidingWindowLog(w)
            | Params::SlidingWindowCounter(w) => cost <= w.limit,
        }
    }

    /// Decides `cost` units at `now` µs against `state` (`None`: a key never seen) and
    /// updates `state` in place. A state of another algorithm (the rule was changed by a
    /// reload) counts as a new key.
    pub fn decide(&self, state: &mut Option<State>, now: f64, cost: u64) -> Outcome {
        match self {
            Params::TokenBucket(p) => {
                let old = match state {
                    Some(State::TokenBucket(s)) => Some(*s),
                    _ => None,
                };
                let (o, new) = token_bucket::decide(old, now, p, cost);
                if let Some(s) = new {
                    *state = Some(State::TokenBucket(s));
                }
                o
            }
            Params::LeakyBucket(p) => {
                let old = match state {
                    Some(State::LeakyBucket(s)) => Some(*s),
                    _ => None,
                };
                let (o, new) = leaky_bucket::decide(old, now, p, cost);
                if let Some(s) = new {
                    *state = Some(State::LeakyBucket(s));
                }
                o
            }
            Params::FixedWindow(p) => {
                let old = match state {
                    Some(State::FixedWindow(s)) => Some(*s),
                    _ => None,
                };
                let (o, new) = fixed_window::decide(old, now, p, cost);
                if let Some(s) = new {
                    *state = Some(State::FixedWindow(s));
                }
                o
            }
            Params::SlidingWindowLog(p) => {
                if !matches!(state, Some(State::SlidingWindowLog(_))) {
                    *state = Some(State::SlidingWindowLog(sliding_window_log::Log::default()));
                }
                let Some(State::SlidingWindowLog(log)) = state else {
                    unreachable!("set just above")
                };
                let (o, change) = sliding_window_log::decide(log, now, p, cost);
                change.apply(log);
                o
            }
            Params::SlidingWindowCounter(p) => {
                let old = match state {
                    Some(State::SlidingWindowCounter(s)) => Some(*s),
                    _ => None,
                };
                let (o, new) = sliding_window_counter::decide(old, now, p, cost);
                if let Some(s) = new {
                    *state = Some(State::SlidingWindowCounter(s));
                }
                o
            }
        }
    }
}

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

/// `ceil(us / 1000)`: µs to whole ms, rounded up (`math.ceil(us / 1000)` in Lua).
pub fn ceil_ms(us: f64) -> f64 {
    (us / 1000.0).ceil()
}

/// The smallest `k ≥ lo` (whole ms) with `ok(k)`, for a predicate that is false then
/// true as `k` grows, starting from the closed-form guess `guess`. Closed forms divide by
/// rates and round (and bucket refills are floored per decision), so the guess can be a
/// step off, or many at extreme rates; `settle` checks it against the decision rule
/// itself: usually `ok(guess)` and `!ok(guess − 1)`, two calls. Otherwise it gallops
/// (steps 1, 2, 4, …) to a bracket and bisects it: O(log distance) calls. The Lua twins
/// carry the same function, so both answer alike.
pub fn settle(guess: f64, lo: f64, ok: impl Fn(f64) -> bool) -> f64 {
    let k = guess.max(lo);
    let mut good;
    let mut bad;
    let mut step = 1.0;
    if ok(k) {
        good = k;
        loop {
            let below = good - step;
            if below < lo {
                bad = lo - 1.0;
                break;
            }
            if !ok(below) {
                bad = below;
                break;
            }
            good = below;
            step *= 2.0;
        }
    } else {
        bad = k;
        loop {
            let above = bad + step;
            if ok(above) {
                good = above;
                break;
            }
            bad = above;
            step *= 2.0;
            if step > 1e15 {
                // Never true (cannot happen for the algorithms' predicates).
                return above;
            }
        }
    }
    while good - bad > 1.0 {
        let mid = ((bad + good) / 2.0).floor();
        if ok(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_finds_the_first_true_step() {
        assert_eq!(settle(5.0, 1.0, |k| k >= 7.0), 7.0);
        assert_eq!(settle(5.0, 1.0, |k| k >= 3.0), 3.0);
        assert_eq!(settle(0.0, 1.0, |k| k >= 0.0), 1.0);
        assert_eq!(settle(5.0, 0.0, |k| k >= 5.0), 5.0);
        assert_eq!(settle(5.0, 0.0, |k| k >= 1_000_003.0), 1_000_003.0);
        assert_eq!(settle(1_000_000.0, 0.0, |k| k >= 17.0), 17.0);
        assert_eq!(settle(1_000_000.0, 3.0, |_| true), 3.0);
    }

    #[test]
    fn a_reloaded_rule_with_another_algorithm_starts_fresh() {
        let tb = Params::TokenBucket(token_bucket::Params::shared(2, 1.0, 1));
        let fw = Params::FixedWindow(WindowParams::shared(1, 1000, 1));
        let mut st = None;
        assert!(tb.decide(&mut st, 0.0, 2).allowed);
        assert!(fw.decide(&mut st, 1.0, 1).allowed);
        assert!(!fw.decide(&mut st, 2.0, 1).allowed);
    }
}
