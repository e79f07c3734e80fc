//! Fixed window: units are counted per window of `window` µs aligned to the Unix epoch
//! (a `1m` window starts on whole minutes); a request is allowed if the window's count
//! plus its `cost` stays within `limit` (docs/ALGORITHMS.md). Cheapest in memory (one count),
//! but up to 2 × `limit` can pass around a window boundary. The twin is
//! `lua/fixed_window.lua`.

use super::{ceil_ms, Family, Outcome, Spec, WindowParams, MAX_LIMIT};

/// This algorithm's entry in the table (`super::registry`).
pub const SPEC: Spec = Spec {
    lease: super::lease!("fixed_window", "lease_window", "lease_window_share"),
    ..super::spec!(
        "fixed_window",
        "fw",
        Family::Window {
            max_limit: MAX_LIMIT
        },
        "window_leases"
    )
};

/// Parameters: `limit` per `window`.
pub type Params = WindowParams;

/// What a key remembers: the count of the window it was last admitted in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Start of that window, µs since the epoch.
    pub start: f64,
    /// Units admitted in it.
    pub count: f64,
}

/// The state of a window of which `unused` (0..=1) of the limit is left at `now` µs:
/// what Redis last reported for a key (`remaining ÷ limit`), carried over to a local
/// window (the count ends with the local window holding `now`).
pub fn seed(p: &WindowParams, unused: f64, _reset_us: f64, now: f64) -> State {
    State {
        start: window_start(now, p.window),
        count: p.limit * (1.0 - unused.clamp(0.0, 1.0)),
    }
}

/// Start of the epoch-aligned window holding `now` (`fmod` is exact in doubles).
pub fn window_start(now: f64, window: f64) -> f64 {
    now - now % window
}

/// Decides `cost` units at `now` µs. Returns the outcome and the state to store (`None`
/// when nothing changed), as the Lua twin does.
pub fn decide(
    state: Option<State>,
    now: f64,
    p: &WindowParams,
    cost: u64,
) -> (Outcome, Option<State>) {
    let cost = cost as f64;
    let now = state.map_or(now, |s| now.max(s.start));
    let start = window_start(now, p.window);
    let mut count = match state {
        Some(s) if s.start == start => s.count,
        _ => 0.0,
    };
    let allowed = count + cost <= p.limit;
    let mut write = None;
    if allowed && cost > 0.0 {
        count += cost;
        write = Some(State { start, count });
    }
    // The window's end empties the count: exact, no rounding to settle.
    let to_end = ceil_ms(start + p.window - now);
    let reset = if count > 0.0 { to_end } else { 0.0 };
    let wait = super::wait(allowed, cost > p.limit, reset, || to_end);
    let outcome = Outcome::new(allowed, p.limit - count, reset, wait);
    (outcome, write)
}

super::decide_in_place!();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_epoch_aligned_window() {
        let p = WindowParams::shared(3, 1000, 1);
        let t0 = 1_700_000_000_250_000.0; // 250 ms into a second
        let (o, s) = decide(None, t0, &p, 2);
        assert_eq!((o.allowed, o.remaining, o.reset_ms), (true, 1, 750));
        let (o, s2) = decide(s, t0 + 1000.0, &p, 2);
        assert!(!o.allowed && s2.is_none());
        assert_eq!(o.wait_ms, 749);
        // The next whole second starts a new window.
        let (o, _) = decide(s, 1_700_000_001_000_000.0, &p, 3);
        assert!(o.allowed);
    }

    #[test]
    fn a_fractional_share_admits_its_floor() {
        let p = WindowParams::shared(10, 1000, 4); // 2.5 per host
        let mut st = None;
        let admitted = (0..10)
            .filter(|_| {
                let (o, s) = decide(st, 5.0, &p, 1);
                st = s.or(st);
                o.allowed
            })
            .count();
        assert_eq!(admitted, 2);
    }
}
