//! Leaky bucket, as a meter that shapes traffic: a virtual queue of at most `capacity`
//! units drains continuously at `leak_rate` units/s. A request is allowed if the queue
//! level plus its `cost` fits in `capacity`; it then joins the queue, and its reply's
//! `wait_ms` is the level before it ÷ `leak_rate`: a caller who waits that long before
//! doing the work runs at the constant `leak_rate` (docs/ALGORITHMS.md; the "leaky bucket as a
//! queue" of Tanenbaum, *Computer Networks*, §5.4, driven like GCRA). A full queue is a
//! DENY with `wait_ms` = the time until there is room for `cost`. A new key is empty.
//!
//! Units as in the token bucket: levels in **µ-units** (integer-valued doubles), time in
//! **µs**, so `leak_rate` units/s is exactly `leak_rate` µ-units/µs. The twin is
//! `lua/leaky_bucket.lua`.

use super::{ceil_ms, settle, Family, Outcome, Spec, MICRO};

/// This algorithm's entry in the table (`super::registry`).
pub const SPEC: Spec = super::spec!("leaky_bucket", "lb", Family::Bucket { rate: "leak_rate" });

/// Parameters of one queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Queue size in µ-units (`capacity × 10^6`, or `÷ hosts` for a fallback, floored).
    pub capacity: f64,
    /// Drain rate in units/s (= µ-units/µs), > 0.
    pub leak_rate: f64,
}

impl Params {
    /// A queue of `capacity` units draining at `leak_rate` units/s, shared by `hosts`
    /// hosts (each gets `capacity ÷ hosts` and `leak_rate ÷ hosts`).
    pub fn shared(capacity: u64, leak_rate: f64, hosts: u32) -> Self {
        let (capacity, leak_rate) = super::bucket_share(capacity, leak_rate, hosts);
        Params {
            capacity,
            leak_rate,
        }
    }
}

/// What a queue remembers between requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Queue level at `ts`, µ-units (an integer-valued double).
    pub level: f64,
    /// When `level` was measured, µs on the deciding clock.
    pub ts: f64,
}

/// The state of a queue with room for `unused` (0..=1) of its capacity at `now` µs: what
/// Redis last reported for a key (`remaining ÷ capacity`), carried over to a local queue.
pub fn seed(p: &Params, unused: f64, _reset_us: f64, now: f64) -> State {
    State {
        level: p.capacity - (p.capacity * unused.clamp(0.0, 1.0)).floor(),
        ts: now,
    }
}

/// The level (µ-units) of the queue stored as `state` at `now` µs.
fn level_at(state: Option<State>, now: f64, p: &Params) -> f64 {
    match state {
        None => 0.0,
        Some(s) => {
            let now = now.max(s.ts);
            (s.level - ((now - s.ts) * p.leak_rate).floor()).max(0.0)
        }
    }
}

/// Decides a request of `cost` units at `now` µs. Returns the outcome and the state to
/// store, `None` when nothing changed (a DENY or a cost of 0), as the Lua twin does.
pub fn decide(state: Option<State>, now: f64, p: &Params, cost: u64) -> (Outcome, Option<State>) {
    let cap = p.capacity;
    let rate = p.leak_rate;
    let cost = cost as f64 * MICRO;
    let now = state.map_or(now, |s| now.max(s.ts));
    let mut level = level_at(state, now, p);
    let allowed = level + cost <= cap;
    let mut wait = 0.0;
    let mut write = None;
    if allowed {
        // Shaping: the work waits for the queue ahead of it to drain.
        wait = ceil_ms(level / rate);
        if cost > 0.0 {
            level += cost;
            write = Some(State { level, ts: now });
        }
    }
    let stored = write.or(state);
    let at = |k: f64| level_at(stored, now + k * 1000.0, p);
    let reset = settle(ceil_ms(level / rate), 0.0, |k| at(k) <= 0.0);
    if !allowed {
        wait = if cost > cap {
            reset.max(1.0)
        } else {
            settle(ceil_ms((level + cost - cap) / rate), 1.0, |k| {
                at(k) + cost <= cap
            })
        };
    }
    let outcome = Outcome::new(allowed, (cap - level) / MICRO, reset, wait);
    (outcome, write)
}

super::decide_in_place!();

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: f64 = 1_000_000.0;

    #[test]
    fn admitted_requests_are_spaced_at_the_leak_rate() {
        // The driver-location case: queue 5000, drain 3000/s. Here: queue 5, 10/s.
        let p = Params::shared(5, 10.0, 1);
        let mut st = None;
        let mut waits = Vec::new();
        for _ in 0..5 {
            let (o, s) = decide(st, 0.0, &p, 1);
            assert!(o.allowed);
            waits.push(o.wait_ms);
            st = s;
        }
        assert_eq!(waits, [0, 100, 200, 300, 400]);
        let (o, s) = decide(st, 0.0, &p, 1);
        assert!(!o.allowed && s.is_none());
        assert_eq!((o.remaining, o.wait_ms, o.reset_ms), (0, 100, 500));
        let (o, _) = decide(st, 0.1 * SEC, &p, 1);
        assert!(o.allowed);
        assert_eq!(o.wait_ms, 400);
    }

    #[test]
    fn a_new_key_is_empty_and_cost_zero_reports() {
        let p = Params::shared(3, 1.0, 1);
        let (o, s) = decide(None, 0.0, &p, 0);
        assert_eq!(
            (o.allowed, o.remaining, o.reset_ms, o.wait_ms),
            (true, 3, 0, 0)
        );
        assert!(s.is_none());
        let (o, _) = decide(None, 0.0, &p, 3);
        assert_eq!(
            (o.allowed, o.remaining, o.reset_ms, o.wait_ms),
            (true, 0, 3000, 0)
        );
    }
}
