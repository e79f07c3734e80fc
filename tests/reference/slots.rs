//! The reference model of `concurrency`, from docs/ALGORITHMS.md "concurrency" and
//! independent of `src/algorithm/concurrency.rs` and `lua/concurrency.lua`: a plain list
//! of the slots taken, `(token, hold_end, lapse)`; a slot counts while `now < lapse`;
//! `wait_ms` and `reset_ms` are *searched* (the first whole ms at which one slot's /
//! every slot's `max_hold` has ended), not computed.

/// One key's slots under one rule.
#[derive(Debug, Clone)]
pub struct SlotsModel {
    /// Slots at most (a share may be fractional: floored).
    pub limit: f64,
    /// µs.
    pub max_hold: f64,
    /// µs a slot lives unless renewed.
    pub lease: f64,
    taken: Vec<(u64, f64, f64)>,
}

/// `[allowed, remaining, reset_ms, wait_ms]` of an `ACQUIRE` (`reset_ms` 0 on an
/// ALLOW, as the reply states it).
pub type Fields = [i64; 4];

impl SlotsModel {
    pub fn new(limit: f64, max_hold: f64, lease: f64) -> Self {
        SlotsModel {
            limit,
            max_hold,
            lease,
            taken: Vec::new(),
        }
    }

    fn live(&self, now: f64) -> Vec<(u64, f64, f64)> {
        self.taken.iter().copied().filter(|s| now < s.2).collect()
    }

    /// The smallest whole ms k ≥ 1 with `pred(now + k ms)`.
    fn search(now: f64, pred: impl Fn(f64) -> bool) -> i64 {
        let mut k = 1i64;
        while !pred(now + k as f64 * 1000.0) {
            k *= 2;
        }
        let (mut lo, mut hi) = (k / 2 + 1, k);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if pred(now + mid as f64 * 1000.0) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        hi.max(1)
    }

    fn report(&self, allowed: bool, now: f64) -> Fields {
        let live = self.live(now);
        let free = (self.limit.floor() - live.len() as f64).max(0.0) as i64;
        if live.is_empty() {
            return if allowed {
                [1, free, 0, 0]
            } else {
                [0, free, 1, 1]
            };
        }
        let reset = Self::search(now, |t| live.iter().all(|s| s.1 <= t));
        if allowed {
            return [1, free, reset, 0];
        }
        let wait = Self::search(now, |t| live.iter().any(|s| s.1 <= t));
        [0, free, reset, wait]
    }

    /// `ACQUIRE` of a slot named `token` at `now`; its hold end when allowed.
    pub fn acquire(&mut self, now: f64, token: u64) -> (Fields, Option<f64>) {
        if (self.live(now).len() as f64) + 1.0 <= self.limit.floor() {
            let end = now + self.max_hold;
            self.taken.push((token, end, end.min(now + self.lease)));
            let mut fields = self.report(true, now);
            fields[2] = 0;
            (fields, Some(end))
        } else {
            (self.report(false, now), None)
        }
    }

    /// `RELEASE` at `now`: whether the key held `token`.
    pub fn release(&mut self, now: f64, token: u64) -> bool {
        let held = self.live(now).iter().any(|s| s.0 == token);
        if held {
            self.taken.retain(|s| s.0 != token);
        }
        held
    }

    /// A renewal at `now`: per token, whether the key held it.
    pub fn renew(&mut self, now: f64, tokens: &[u64]) -> Vec<bool> {
        let live: Vec<u64> = self.live(now).iter().map(|s| s.0).collect();
        for s in self.taken.iter_mut().filter(|s| live.contains(&s.0)) {
            if tokens.contains(&s.0) {
                s.2 = s.1.min(now + self.lease);
            }
        }
        tokens.iter().map(|t| live.contains(t)).collect()
    }
}
