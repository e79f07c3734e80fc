//! Sliding window log: exact. A request is allowed if the units admitted in the last
//! `window` µs plus its `cost` stay within `limit` (docs/PROTOCOL.md, "Algorithms"). Only admitted units are
//! logged (a denied request costs no memory), one entry per admission instant holding
//! its units, so a log never holds more than `limit` entries. The twin is
//! `lua/sliding_window_log.lua` (a sorted set: score = µs, member = `"<µs>:<units>"`).
//!
//! An entry admitted at `t` counts while `now - window < t`, i.e. for exactly `window`.

use super::{ceil_ms, Family, Outcome, Spec, WindowParams, MAX_LOG_LIMIT};

/// This algorithm's entry in the table (`super::registry`).
pub const SPEC: Spec = super::spec!(
    "sliding_window_log",
    "swl",
    Family::Window {
        max_limit: MAX_LOG_LIMIT
    }
);

/// Parameters: `limit` per sliding `window`.
pub type Params = WindowParams;

use std::collections::VecDeque;

/// The admissions still inside the window: `(µs, units)`, oldest first, one per instant.
pub type Log = VecDeque<(f64, f64)>;

/// How a decision changes a [`Log`]: drop expired entries, then log an admission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    /// Entries at the front that left the window.
    pub expired: usize,
    /// Units admitted at this instant (`(µs, units)`; merged with a last entry of the
    /// same µs).
    pub admit: Option<(f64, f64)>,
}

impl Change {
    /// Applies the change to `log` (what the Lua twin does with ZREMRANGEBYSCORE/ZADD).
    pub fn apply(&self, log: &mut Log) {
        log.drain(..self.expired.min(log.len()));
        if let Some((ts, units)) = self.admit {
            match log.back_mut() {
                Some(last) if last.0 == ts => last.1 += units,
                _ => log.push_back((ts, units)),
            }
        }
    }
}

/// Decides `cost` units at `now` µs against `log` (empty for a new key). Returns the
/// outcome and the change to apply.
pub fn decide(log: &Log, now: f64, p: &WindowParams, cost: u64) -> (Outcome, Change) {
    let cost = cost as f64;
    let now = log.back().map_or(now, |&(ts, _)| now.max(ts));
    let cutoff = now - p.window;
    let expired = log.iter().take_while(|&&(ts, _)| ts <= cutoff).count();
    let live = || log.iter().skip(expired);
    let used: f64 = live().map(|&(_, units)| units).sum();
    let allowed = used + cost <= p.limit;
    let admit = (allowed && cost > 0.0).then_some((now, cost));
    let used_after = if admit.is_some() { used + cost } else { used };
    let newest = if admit.is_some() {
        Some(now)
    } else {
        live().last().map(|&(ts, _)| ts)
    };
    // Each entry leaves the window exactly `window` µs after it was logged.
    let reset = newest.map_or(0.0, |ts| ceil_ms(ts + p.window - now));
    let wait = super::wait(allowed, cost > p.limit, reset, || {
        // The oldest entries leave first: wait for enough of them to free `cost`.
        let need = used + cost - p.limit;
        let mut freed = 0.0;
        let mut wait = reset.max(1.0);
        for &(ts, units) in live() {
            freed += units;
            if freed >= need {
                wait = ceil_ms(ts + p.window - now);
                break;
            }
        }
        wait
    });
    let outcome = Outcome::new(allowed, p.limit - used_after, reset, wait);
    (outcome, Change { expired, admit })
}

/// What a key remembers: its [`Log`].
pub type State = Log;

/// [`decide`] on the key's log, created empty for a new key, changed in place.
pub fn decide_in(state: &mut Option<Log>, now: f64, p: &Params, cost: u64) -> Outcome {
    let log = state.get_or_insert_with(Log::default);
    let (outcome, change) = decide(log, now, p, cost);
    change.apply(log);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: f64 = 1000.0;

    fn run(log: &mut Log, now: f64, p: &WindowParams, cost: u64) -> Outcome {
        let (o, change) = decide(log, now, p, cost);
        change.apply(log);
        o
    }

    #[test]
    fn exact_over_any_window_and_denials_cost_no_memory() {
        let p = WindowParams::shared(3, 1000, 1);
        let mut log = Log::new();
        assert!(run(&mut log, 0.0, &p, 1).allowed);
        assert!(run(&mut log, 400.0 * MS, &p, 2).allowed);
        for _ in 0..100 {
            let o = run(&mut log, 500.0 * MS, &p, 1);
            assert!(!o.allowed);
            assert_eq!(o.wait_ms, 500); // the entry at 0 leaves at 1000 ms
        }
        assert_eq!(log.len(), 2);
        assert!(!run(&mut log, 999.0 * MS, &p, 1).allowed);
        let o = run(&mut log, 1000.0 * MS, &p, 1);
        assert!(o.allowed);
        assert_eq!((o.remaining, o.reset_ms), (0, 1000));
        // Cost 2 needs the entry of 400 ms (2 units) to leave too.
        let o = run(&mut log, 1000.0 * MS, &p, 2);
        assert_eq!((o.allowed, o.wait_ms), (false, 400));
    }

    #[test]
    fn same_instant_admissions_share_one_entry() {
        let p = WindowParams::shared(10, 1000, 1);
        let mut log = Log::new();
        for _ in 0..4 {
            assert!(run(&mut log, 7.0, &p, 2).allowed);
        }
        assert_eq!(log, Log::from([(7.0, 8.0)]));
    }
}
