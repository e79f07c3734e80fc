//! Sliding window counter: Cloudflare's weighted estimate of a sliding window from two
//! epoch-aligned fixed windows ("How we built rate limiting capable of scaling to
//! millions of domains", Cloudflare blog, 2017): with `p` units in the previous window,
//! `c` in the current one and `e` µs elapsed in it,
//! `estimate = p × ((window − e) ÷ window) + c`; a request is allowed if
//! `estimate + cost ≤ limit` (docs/ALGORITHMS.md). Two counts per key; `docs/ALGORITHMS.md`
//! measures its error against the exact log. The twin is `lua/sliding_window_counter.lua`.
//!
//! The weight is computed as `(window − e) ÷ window` first, so it is exactly 1 at a
//! window's start and never grows with time: the estimate is non-increasing between
//! admissions, which makes `wait_ms` well defined; it is solved in closed form from the
//! weighting and checked by [`super::settle`].

use super::fixed_window::window_start;
use super::{ceil_ms, settle, Family, Outcome, Spec, WindowParams, MAX_LIMIT};

/// This algorithm's entry in the table (`super::registry`).
pub const SPEC: Spec = Spec {
    lease: super::lease!(
        "sliding_window_counter",
        "lease_window",
        "window_counter",
        "lease_window_slice"
    ),
    ..super::spec!(
        "sliding_window_counter",
        "swc",
        Family::Window {
            max_limit: MAX_LIMIT
        },
        "window_counter",
        "window_leases"
    )
};

/// Parameters: `limit` per (estimated) sliding `window`.
pub type Params = WindowParams;

/// What a key remembers: the counts of its last window and the one before.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Start of the current window, µs since the epoch.
    pub start: f64,
    /// Units admitted in it.
    pub current: f64,
    /// Units admitted in the window before it.
    pub previous: f64,
}

/// `(start, current, previous)` of `state` seen from the window starting at `start`.
fn roll(state: Option<State>, start: f64, window: f64) -> (f64, f64) {
    match state {
        Some(s) if s.start == start => (s.current, s.previous),
        Some(s) if s.start + window == start => (0.0, s.current),
        _ => (0.0, 0.0),
    }
}

/// The weighted estimate `previous × ((window − elapsed) ÷ window) + current`.
fn estimate(current: f64, previous: f64, elapsed: f64, window: f64) -> f64 {
    previous * ((window - elapsed) / window) + current
}

/// The estimate of the key stored as `state` at `now` µs.
fn estimate_at(state: Option<State>, now: f64, window: f64) -> f64 {
    let now = state.map_or(now, |s| now.max(s.start));
    let start = window_start(now, window);
    let (c, p) = roll(state, start, window);
    estimate(c, p, now - start, window)
}

/// The state of a key of which `unused` (0..=1) of the limit is left at `now` µs: what
/// Redis last reported (`remaining ÷ limit`), carried over to a local counter as the
/// current window's count (it then weighs on the next window, as Redis's would).
pub fn seed(p: &WindowParams, unused: f64, _reset_us: f64, now: f64) -> State {
    State {
        start: window_start(now, p.window),
        current: p.limit * (1.0 - unused.clamp(0.0, 1.0)),
        previous: 0.0,
    }
}

/// Decides `cost` units at `now` µs. Returns the outcome and the state to store (`None`
/// when nothing changed), as the Lua twin does.
pub fn decide(
    state: Option<State>,
    now: f64,
    p: &WindowParams,
    cost: u64,
) -> (Outcome, Option<State>) {
    let (limit, window) = (p.limit, p.window);
    let cost = cost as f64;
    let now = state.map_or(now, |s| now.max(s.start));
    let start = window_start(now, window);
    let (mut current, previous) = roll(state, start, window);
    let elapsed = now - start;
    let allowed = estimate(current, previous, elapsed, window) + cost <= limit;
    let mut write = None;
    if allowed && cost > 0.0 {
        current += cost;
        write = Some(State {
            start,
            current,
            previous,
        });
    }
    // Fully unused once the current count has left the weighting (two windows on) or,
    // with only a previous count, once the current window ends.
    let reset = if current > 0.0 {
        ceil_ms(start + 2.0 * window - now)
    } else if previous > 0.0 {
        ceil_ms(start + window - now)
    } else {
        0.0
    };
    let wait = super::wait(allowed, cost > limit, reset, || {
        // Solve estimate(t) + cost = limit for t, in this window if the current count
        // leaves room, else in the next one (where `current` becomes the previous count).
        let when = if current + cost <= limit {
            start + window - window * ((limit - cost - current) / previous)
        } else {
            start + 2.0 * window - window * ((limit - cost) / current)
        };
        let stored = write.or(state);
        settle(ceil_ms(when - now), 1.0, |k| {
            estimate_at(stored, now + k * 1000.0, window) + cost <= limit
        })
    });
    let outcome = Outcome::new(
        allowed,
        limit - estimate(current, previous, elapsed, window),
        reset,
        wait,
    );
    (outcome, write)
}

super::decide_in_place!();

#[cfg(test)]
mod tests {
    use super::*;

    const MS: f64 = 1000.0;

    #[test]
    fn cloudflare_example() {
        // 42 in the previous minute, 18 so far in this one, 15 s in: 42 × 45/60 + 18 = 49.5.
        let p = WindowParams::shared(50, 60_000, 1);
        let s = State {
            start: 60_000.0 * MS,
            current: 18.0,
            previous: 42.0,
        };
        let now = 75_000.0 * MS;
        let (o, _) = decide(Some(s), now, &p, 1);
        assert!(!o.allowed);
        // Allowed once 42 × (60 − e)/60 ≤ 31, i.e. e ≥ 15.714 s: 715 ms from now.
        assert_eq!(o.wait_ms, 715);
        assert!(decide(Some(s), now + 715.0 * MS, &p, 1).0.allowed);
        assert!(!decide(Some(s), now + 714.0 * MS, &p, 1).0.allowed);
        assert_eq!(o.reset_ms, 105_000); // the current 18 leave the weighting at 180 s
        assert_eq!(o.remaining, 0);
    }

    #[test]
    fn a_full_current_window_waits_into_the_next() {
        let p = WindowParams::shared(10, 1000, 1);
        let s = State {
            start: 0.0,
            current: 10.0,
            previous: 0.0,
        };
        let (o, _) = decide(Some(s), 100.0 * MS, &p, 4);
        // Next window: 10 × (1 − e) + 4 ≤ 10 → e ≥ 0.4 s → t = 1.4 s.
        assert_eq!((o.allowed, o.wait_ms, o.reset_ms), (false, 1300, 1900));
    }
}
