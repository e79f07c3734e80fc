//! Rate-limit algorithms as pure functions of `(state, now, params, cost)` (docs/ALGORITHMS.md).
//!
//! Each algorithm has a Lua twin in `lua/` that Redis runs with EVALSHA; the two are
//! written operation for operation alike (IEEE doubles, the same order of operations),
//! so for the same inputs they return the same fields. The Rust side serves
//! `redis.mode = "none"` and the local fallback. `tests/it/twins.rs` drives random traces
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
//!
//! Adding an algorithm: its file here (the decision function and its `SPEC`: config
//! name, Redis key suffix, Lua twin, parameter family), its Lua twin in `lua/`, and one
//! line in the table of [`registry`]. The config, the store and the fallback read
//! everything else from that table.

pub mod concurrency;
pub mod fixed_window;
pub mod leaky_bucket;
mod params;
mod registry;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

pub use params::{bucket_share, Algorithm, Arg, Per, Shape, WindowParams};
pub use registry::{Kind, Params, State};

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
    /// The run-time override (`OVERRIDE`) Redis decided the key under, if any; never
    /// set by a local decision.
    pub tier: Option<Tier>,
}

/// A run-time override's parameters as a decision script reports them (`lua/prelude.lua`
/// tiered()): the capacity or limit, and the rate or window as 64 bits (a rate's `f64`
/// bits, a window's ms), which the script returns as two 32-bit integers, exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tier {
    /// The capacity (buckets) or limit (windows).
    pub limit: u64,
    /// [`Per`] as 64 bits: `f64::to_bits` of a rate, or a window in ms.
    pub per_bits: u64,
}

impl Tier {
    /// The tier of `algorithm`'s parameters.
    pub fn of(algorithm: &Algorithm) -> Self {
        let per_bits = match algorithm.per {
            Per::Rate(r) => r.to_bits(),
            Per::WindowMs(ms) => ms,
        };
        Tier {
            limit: algorithm.limit,
            per_bits,
        }
    }

    /// The algorithm `kind` with these parameters, if they are valid for it (a
    /// capacity or limit of 1 to [`MAX_LIMIT`]; a finite positive rate, or a window of
    /// 1 ms to [`MAX_WINDOW_MS`]); `None` for anything else read from Redis.
    pub fn algorithm(&self, kind: Kind) -> Option<Algorithm> {
        if !(1..=MAX_LIMIT).contains(&self.limit) {
            return None;
        }
        let per = match kind.spec().family {
            Family::Bucket { .. } => {
                let r = f64::from_bits(self.per_bits);
                (r.is_finite() && r > 0.0).then_some(Per::Rate(r))?
            }
            Family::Window { .. } | Family::Slots => (1..=MAX_WINDOW_MS)
                .contains(&self.per_bits)
                .then_some(Per::WindowMs(self.per_bits))?,
        };
        Some(Algorithm {
            kind,
            limit: self.limit,
            per,
        })
    }
}

impl Outcome {
    /// An outcome from the algorithms' doubles: `remaining` units (floored, at least 0),
    /// `reset` and `wait` in whole ms.
    pub(crate) fn new(allowed: bool, remaining: f64, reset: f64, wait: f64) -> Self {
        Outcome {
            allowed,
            remaining: remaining.floor().max(0.0) as u64,
            reset_ms: reset as u64,
            wait_ms: wait as u64,
            tier: None,
        }
    }
}

/// `wait_ms` of a decision, by the convention every algorithm shares: 0 when allowed;
/// `max(reset, 1)` for a request that can never pass (`never`: its cost above the
/// limit); otherwise `until()`, the algorithm's own answer.
pub(crate) fn wait(allowed: bool, never: bool, reset: f64, until: impl FnOnce() -> f64) -> f64 {
    if allowed {
        0.0
    } else if never {
        reset.max(1.0)
    } else {
        until()
    }
}

/// A `SPEC` entry: `spec!("name", "suffix", family)`, or `spec!("name", "suffix",
/// family, "part"...)`; the Lua twin is `lua/prelude.lua`, then each `lua/<part>.lua`
/// (helpers only some scripts share: a script defines every function it is sent with
/// on each call), then `lua/<name>.lua`.
macro_rules! spec {
    ($name:literal, $suffix:literal, $family:expr $(, $part:literal)*) => {
        $crate::algorithm::Spec {
            name: $name,
            suffix: $suffix,
            lua: concat!(
                include_str!("../../lua/prelude.lua"),
                $(include_str!(concat!("../../lua/", $part, ".lua")),)*
                include_str!(concat!("../../lua/", $name, ".lua"))
            ),
            parts: &[$(include_str!(concat!("../../lua/", $part, ".lua"))),*],
            body: include_str!(concat!("../../lua/", $name, ".lua")),
            family: $family,
            lease: None,
        }
    };
}
pub(crate) use spec;

/// The lease script of algorithm `$name` ([`Spec::lease`]), with the shared parts
/// `$part` (`lua/<part>.lua`) between the lease bookkeeping and its own file.
macro_rules! lease {
    ($name:literal $(, $part:literal)*) => {
        Some(concat!(
            include_str!("../../lua/prelude.lua"),
            include_str!("../../lua/lease.lua"),
            $(include_str!(concat!("../../lua/", $part, ".lua")),)*
            include_str!(concat!("../../lua/lease_", $name, ".lua"))
        ))
    };
}
pub(crate) use lease;

/// Largest capacity/limit accepted: keeps micro-token arithmetic exact in doubles.
pub const MAX_LIMIT: u64 = 1_000_000_000;

/// Largest `limit` of a `sliding_window_log`: its log holds up to `limit` entries per
/// key and each decision reads them all (use `sliding_window_counter` above this).
pub const MAX_LOG_LIMIT: u64 = 10_000;

/// Longest `window`: 30 days, ms.
pub const MAX_WINDOW_MS: u64 = 30 * 24 * 3600 * 1000;

/// What one algorithm is, outside its decision function: the entry of the algorithm
/// table ([`Kind`]). Each algorithm file declares its own `SPEC`.
#[derive(Debug)]
pub struct Spec {
    /// The `algorithm` value in the config.
    pub name: &'static str,
    /// The suffix of its Redis keys (`<prefix>:{<rule>:<key>}:<suffix>`): a rule whose
    /// algorithm a reload changed never reads another algorithm's state.
    pub suffix: &'static str,
    /// The Lua twin Redis runs: `lua/prelude.lua`, the parts it shares with its lease
    /// script if any, then the algorithm's own file.
    pub lua: &'static str,
    /// The shared parts of `lua` between the prelude and the body (`lua/<part>.lua`).
    pub parts: &'static [&'static str],
    /// The algorithm's own file (`lua/<name>.lua`), the end of `lua`: the batch script
    /// (`src/store/scripts.rs`) runs it as a function, once per decision.
    pub body: &'static str,
    /// Which parameters a rule gives it.
    pub family: Family,
    /// Its lease script (`lease = "auto"`): the prelude, the shared lease bookkeeping
    /// (`lua/lease.lua`), the parts only some lease scripts share, then
    /// `lua/lease_<name>.lua`. `None` for an algorithm whose leased budget could not be
    /// kept exact.
    pub lease: Option<&'static str>,
}

/// The parameter families of the algorithms (what a `[[rule]]` gives besides its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `capacity` (int ≥ 1) and a rate in units/s, named `rate` in the config.
    Bucket {
        /// The config name of the rate (`refill_rate`, `leak_rate`).
        rate: &'static str,
    },
    /// `limit` (1..=`max_limit`) and `window` (a duration).
    Window {
        /// Largest `limit` this algorithm accepts.
        max_limit: u64,
    },
    /// `limit` (1..=[`concurrency::MAX_SLOTS`]) slots held at once and `max_hold` (a
    /// duration, default 60 s): `concurrency`.
    Slots,
}

/// Declares `decide_in`, the registry's uniform entry point, for an algorithm whose
/// state is a small value decided functionally by its `decide(old, now, p, cost) ->
/// (outcome, new state or None when unchanged)`.
macro_rules! decide_in_place {
    () => {
        /// [`decide`] in place (the registry's uniform entry point).
        pub fn decide_in(
            state: &mut Option<State>,
            now: f64,
            p: &Params,
            cost: u64,
        ) -> $crate::algorithm::Outcome {
            $crate::algorithm::in_place(state, |old| decide(old, now, p, cost))
        }
    };
}
pub(crate) use decide_in_place;

/// The in-place decision of an algorithm whose state is a small value decided
/// functionally (`decide(old) -> (outcome, new state or None when unchanged)`).
pub(crate) fn in_place<S: Copy>(
    state: &mut Option<S>,
    decide: impl FnOnce(Option<S>) -> (Outcome, Option<S>),
) -> Outcome {
    let (outcome, new) = decide(*state);
    if new.is_some() {
        *state = new;
    }
    outcome
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
}
