//! Sliding window log: exact. A request is allowed if the units admitted in the last
//! `window` µs plus its `cost` stay within `limit` (docs/ALGORITHMS.md). Only admitted units are
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
    },
    "side_override"
);

/// Parameters: `limit` per sliding `window`.
pub type Params = WindowParams;

use std::collections::VecDeque;

/// One admission instant: `ts` µs, the `units` admitted then, and `cum`, the running
/// total of units admitted up to and including it (the Lua twin's member
/// `"<µs>:<cum>:<x>:<units>"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogEntry {
    /// When, µs.
    pub ts: f64,
    /// Units admitted at `ts`.
    pub units: f64,
    /// Units admitted up to and including this entry (since the log was last empty).
    pub cum: f64,
}

/// The admissions still inside the window, oldest first, one per instant. The units in
/// the window are the newest entry's running total minus the one before the oldest live
/// entry, so a decision costs O(log n) (binary searches), not O(n).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Log {
    entries: VecDeque<LogEntry>,
}

impl Log {
    /// An empty log.
    pub fn new() -> Self {
        Log::default()
    }

    /// Entries held (at most `limit`).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is logged.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A log of one entry: `units` admitted at `ts` µs.
    pub fn one(ts: f64, units: f64) -> Self {
        let mut log = Log::new();
        if units > 0.0 {
            log.entries.push_back(LogEntry {
                ts,
                units,
                cum: units,
            });
        }
        log
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &LogEntry> {
        self.entries.iter()
    }
}

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
        let entries = &mut log.entries;
        entries.drain(..self.expired.min(entries.len()));
        if let Some((ts, units)) = self.admit {
            match entries.back_mut() {
                Some(last) if last.ts == ts => {
                    last.units += units;
                    last.cum += units;
                }
                Some(last) => {
                    let cum = last.cum + units;
                    entries.push_back(LogEntry { ts, units, cum });
                }
                None => entries.push_back(LogEntry {
                    ts,
                    units,
                    cum: units,
                }),
            }
        }
    }
}

/// Decides `cost` units at `now` µs against `log` (empty for a new key). Returns the
/// outcome and the change to apply.
pub fn decide(log: &Log, now: f64, p: &WindowParams, cost: u64) -> (Outcome, Change) {
    let cost = cost as f64;
    let entries = &log.entries;
    let now = entries.back().map_or(now, |e| now.max(e.ts));
    let cutoff = now - p.window;
    let expired = entries.partition_point(|e| e.ts <= cutoff);
    let live = entries.range(expired..);
    // Units in the window: running totals, newest minus the one before the oldest live.
    let base = entries.get(expired).map_or(0.0, |e| e.cum - e.units);
    let newest = live.clone().next_back().copied();
    let used = newest.map_or(0.0, |e| e.cum - base);
    let allowed = used + cost <= p.limit;
    let admit = (allowed && cost > 0.0).then_some((now, cost));
    let used_after = if admit.is_some() { used + cost } else { used };
    let newest = if admit.is_some() {
        Some(now)
    } else {
        newest.map(|e| e.ts)
    };
    // Each entry leaves the window exactly `window` µs after it was logged.
    let reset = newest.map_or(0.0, |ts| ceil_ms(ts + p.window - now));
    let wait = super::wait(allowed, cost > p.limit, reset, || {
        // The oldest entries leave first: the first whose running total since `base`
        // frees `cost` (the newest always does when cost <= limit).
        let need = used + cost - p.limit;
        // Running totals grow with age order, and expired ones are below `base`.
        let first = entries.partition_point(|e| e.cum - base < need);
        entries
            .get(first)
            .map_or(reset.max(1.0), |e| ceil_ms(e.ts + p.window - now))
    });
    let outcome = Outcome::new(allowed, p.limit - used_after, reset, wait);
    (outcome, Change { expired, admit })
}

/// The log of a key of which `unused` (0..=1) of the limit is left at `now` µs and that
/// is fully unused `reset_us` later: what Redis last reported (`remaining ÷ limit`,
/// `reset_ms`), carried over to a local log as one entry holding every used unit, logged
/// when Redis's newest entry was (so all of them leave the window when that one does:
/// never sooner than in Redis).
pub fn seed(p: &WindowParams, unused: f64, reset_us: f64, now: f64) -> State {
    let units = p.limit * (1.0 - unused.clamp(0.0, 1.0));
    let mut log = Log::new();
    if units > 0.0 {
        let ts = (now + reset_us - p.window).min(now);
        log.entries.push_back(LogEntry {
            ts,
            units,
            cum: units,
        });
    }
    log
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
        let entries: Vec<LogEntry> = log.entries().copied().collect();
        assert_eq!(
            entries,
            [LogEntry {
                ts: 7.0,
                units: 8.0,
                cum: 8.0
            }]
        );
    }
}
