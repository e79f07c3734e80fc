#![allow(dead_code)]
//! The reference model of the five algorithms, written from the sentences of docs/ALGORITHMS.md's
//! definitions and independent of `src/algorithm` and `lua/`:
//!
//! * window algorithms keep the plain list of admitted `(µs, units)` and count what
//!   falls in a window by definition (no rolling counters, no trimming);
//! * buckets keep `(level, µs)` of their last admission, as the contract's "refill
//!   continuously" / "drains at leak_rate" read with micro-unit granularity (a refill
//!   or drain is floored to whole µ-units, the one rounding rule of the twins);
//! * `wait_ms` and `reset_ms` are not solved in closed form: they are *searched* — the
//!   smallest whole number of ms after which the same request would be allowed / the
//!   key would be fully unused, asking the decision rule itself (binary search over a
//!   predicate that is monotone in time).
//!
//! `tests/it/twins.rs` requires the Rust twins and the Lua scripts to agree with it on
//! every field of every decision of random traces.

pub mod slots;

/// Micro-units per unit (the buckets' granularity).
pub const MICRO: f64 = 1_000_000.0;

/// An algorithm with the parameters one decider enforces (a share when `hosts > 1`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Algo {
    /// capacity µtok, refill tokens/s
    TokenBucket { cap: f64, rate: f64 },
    /// capacity µ-units, leak units/s
    LeakyBucket { cap: f64, rate: f64 },
    /// limit units, window µs
    FixedWindow { limit: f64, window: f64 },
    /// limit units, window µs
    SlidingWindowLog { limit: f64, window: f64 },
    /// limit units, window µs
    SlidingWindowCounter { limit: f64, window: f64 },
}

/// One key's history under one algorithm.
#[derive(Debug, Clone)]
pub struct Model {
    pub algo: Algo,
    /// Buckets: (µ-units, µs) as of the last admission.
    bucket: Option<(f64, f64)>,
    /// Windows: every admission, (µs, units).
    admitted: Vec<(f64, f64)>,
}

/// `[allowed 0|1, remaining, reset_ms, wait_ms]`, the shape of the Lua replies.
pub type Fields = [i64; 4];

fn window_start(t: f64, window: f64) -> f64 {
    t - t % window
}

/// The smallest `k` in `lo..=hi` with `pred(k)`, for `pred` false then true.
fn first_true(lo: i64, hi: i64, pred: impl Fn(i64) -> bool) -> Option<i64> {
    if !pred(hi) {
        return None;
    }
    let (mut lo, mut hi) = (lo, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

impl Model {
    pub fn new(algo: Algo) -> Self {
        Model {
            algo,
            bucket: None,
            admitted: Vec::new(),
        }
    }

    /// Tokens (token bucket) or level (leaky bucket) at `t`, µ-units.
    fn bucket_at(&self, t: f64) -> f64 {
        match (self.algo, self.bucket) {
            (Algo::TokenBucket { cap, .. }, None) => cap,
            (Algo::TokenBucket { cap, rate }, Some((tokens, ts))) => {
                cap.min(tokens + ((t - ts) * rate).floor())
            }
            (Algo::LeakyBucket { .. }, None) => 0.0,
            (Algo::LeakyBucket { rate, .. }, Some((level, ts))) => {
                (level - ((t - ts) * rate).floor()).max(0.0)
            }
            _ => unreachable!("not a bucket"),
        }
    }

    /// Units admitted with `t` in `[from, to)`.
    fn units_in(&self, from: f64, to: f64) -> f64 {
        self.admitted
            .iter()
            .filter(|&&(t, _)| from <= t && t < to)
            .map(|&(_, u)| u)
            .sum()
    }

    /// How much of the limit is in use at `t` (units; for buckets, µ-units taken).
    fn usage_at(&self, t: f64) -> f64 {
        match self.algo {
            Algo::TokenBucket { cap, .. } => cap - self.bucket_at(t),
            Algo::LeakyBucket { .. } => self.bucket_at(t),
            Algo::FixedWindow { window, .. } => {
                let ws = window_start(t, window);
                self.units_in(ws, ws + window)
            }
            Algo::SlidingWindowLog { window, .. } => {
                // Admitted in (t - window, t].
                self.admitted
                    .iter()
                    .filter(|&&(at, _)| at > t - window && at <= t)
                    .map(|&(_, u)| u)
                    .sum()
            }
            Algo::SlidingWindowCounter { window, .. } => {
                let ws = window_start(t, window);
                let current = self.units_in(ws, ws + window);
                let previous = self.units_in(ws - window, ws);
                previous * ((window - (t - ws)) / window) + current
            }
        }
    }

    /// The whole capacity/limit, in the unit of [`Model::usage_at`].
    fn room(&self) -> f64 {
        match self.algo {
            Algo::TokenBucket { cap, .. } | Algo::LeakyBucket { cap, .. } => cap,
            Algo::FixedWindow { limit, .. }
            | Algo::SlidingWindowLog { limit, .. }
            | Algo::SlidingWindowCounter { limit, .. } => limit,
        }
    }

    fn is_bucket(&self) -> bool {
        matches!(
            self.algo,
            Algo::TokenBucket { .. } | Algo::LeakyBucket { .. }
        )
    }

    /// Would `cost` units be allowed at `t` (cost in units)?
    fn allows(&self, t: f64, cost: u64) -> bool {
        let cost = if self.is_bucket() {
            cost as f64 * MICRO
        } else {
            cost as f64
        };
        match self.algo {
            Algo::TokenBucket { .. } => self.bucket_at(t) >= cost,
            _ => self.usage_at(t) + cost <= self.room(),
        }
    }

    /// A bound (ms) after which every state is fully unused.
    fn horizon_ms(&self) -> i64 {
        let ms = match self.algo {
            Algo::TokenBucket { cap, rate } | Algo::LeakyBucket { cap, rate } => {
                cap / rate / 1000.0
            }
            Algo::FixedWindow { window, .. }
            | Algo::SlidingWindowLog { window, .. }
            | Algo::SlidingWindowCounter { window, .. } => 2.0 * window / 1000.0,
        };
        ms.ceil() as i64 + 2
    }

    /// Whether `cost` units at `now` µs pass the rule; recorded as admitted either way
    /// (windows only: a unit another rule admitted still counts under this one).
    pub fn admit(&mut self, now: f64, cost: u64) -> bool {
        let allowed = self.allows(now, cost);
        self.admitted.push((now, cost as f64));
        allowed
    }

    /// Decides `cost` units at `now` µs (times never go backwards in the traces).
    pub fn decide(&mut self, now: f64, cost: u64) -> Fields {
        let allowed = self.allows(now, cost);
        let mut wait_allowed = 0;
        if allowed {
            if let Algo::LeakyBucket { rate, .. } = self.algo {
                // docs/ALGORITHMS.md "Definitions": wait_ms = level before this request ÷ leak_rate.
                wait_allowed = (self.bucket_at(now) / rate / 1000.0).ceil() as i64;
            }
            if cost > 0 {
                if self.is_bucket() {
                    let c = cost as f64 * MICRO;
                    let level = match self.algo {
                        Algo::TokenBucket { .. } => self.bucket_at(now) - c,
                        _ => self.bucket_at(now) + c,
                    };
                    self.bucket = Some((level, now));
                } else {
                    self.admitted.push((now, cost as f64));
                }
            }
        }
        let scale = if self.is_bucket() { MICRO } else { 1.0 };
        let remaining = ((self.room() - self.usage_at(now)) / scale)
            .floor()
            .max(0.0) as i64;
        let at = |k: i64| now + k as f64 * 1000.0;
        let hi = self.horizon_ms();
        let reset =
            first_true(0, hi, |k| self.usage_at(at(k)) <= 0.0).expect("resets within the horizon");
        let wait = if allowed {
            wait_allowed
        } else {
            first_true(1, hi, |k| self.allows(at(k), cost)).unwrap_or(reset.max(1))
        };
        [i64::from(allowed), remaining, reset, wait]
    }
}
