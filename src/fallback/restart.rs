//! How a local state tells the map what it is worth ([`stamp`]), and how a key the map
//! evicted while its state still mattered comes back ([`restart`]): never fuller than
//! it left, so eviction never hands a key a budget it did not earn.
//!
//! A [`Stamp`] says from when a state equals a new key's (`fresh_at`: now + the
//! decision's `reset_ms`, rounded up to a tick) and how drained it is at most
//! (`drained` ÷ 255 ≥ `(units − remaining) ÷ units`, `units` the share's capacity or
//! limit and `remaining` the decision's floor). What the map hands back for an evicted
//! key bounds both from above (its own record, raised by other keys' in the sketch).
//!
//! **Why the restart is never fuller.** Let `S` be the evicted state at its last
//! decision `t_d`, `R` the restart at `now ≥ t_d` (no decision for the key in
//! between). Each algorithm's check is "what the state counts against the limit at `t`
//! (its *use* `u(t)`), plus the cost, fits". Without admissions, every algorithm's use
//! is non-increasing over time and zero from `S`'s `fresh_at` on; so
//! `u_S(t) ≤ u_S(t_d) ≤ units − remaining ≤ drained ÷ 255 × units` for `t ≥ t_d`, and
//! `u_S(t) = 0` for `t ≥ fresh_at`. Each restart below has `u_R(t) ≥ u_S(t)` for every
//! `t ≥ now` (by the two bounds), and use is additive in admissions for the windows;
//! for the buckets, `R` is `S` with tokens taken away (level added), which a bucket's
//! bound (`capacity + rate × T` over any `T`: admitted = tokens before + refill −
//! tokens after) survives. So every unit the restarted key admits passes the check the
//! evicted state, kept, would have applied to the same admitted history: the key's
//! admissions across the eviction satisfy every bound of its algorithm.
//!
//! Per algorithm (`F` = the bound of `fresh_at`, µs; `q` = drained ÷ 255):
//! - `token_bucket`: tokens `cap − min(cap, ⌈(F − now) × rate⌉ + 1, ⌈q × cap⌉)` (µtok)
//!   at `now`: `S` is full at `F`, so it lacked at most `(F − now) × rate` at `now`
//!   (+1 µtok for the floor of each refill), and at most `q × cap` at `t_d`;
//! - `leaky_bucket`: level `min(cap, ⌈(F − now) × rate⌉ + 1, ⌈q × cap⌉)` at `now`, alike;
//! - `fixed_window`: count `⌈q × limit⌉` in the window holding `now` (a live `S` is
//!   in that window: its `fresh_at` is its window's end);
//! - `sliding_window_log`: one entry of `⌈q × limit⌉` units that leaves the window at
//!   `min(F, now + window)`, by when every entry of `S` has left;
//! - `sliding_window_counter`: `⌈q × limit⌉` as the count of the window holding `now`:
//!   it weighs as much as `S`'s whole estimate in this window (`S`'s estimate only
//!   falls) and at least as much as `S`'s current count in the next.

use crate::algorithm::fixed_window::window_start;
use crate::algorithm::{
    concurrency, fixed_window, leaky_bucket, sliding_window_counter, sliding_window_log,
    token_bucket, Outcome, Params, State, MICRO,
};
use crate::state_map::{ticks_ceil, ticks_to_us, Stamp};

/// The stamp of a state of kind `tag` (its rule's [`crate::config::Rule::sketch_tag`])
/// just decided under `params` at `now_us` with `outcome`.
pub fn stamp(outcome: &Outcome, params: &Params, tag: u8, now_us: f64) -> Stamp {
    if outcome.reset_ms == 0 {
        return Stamp::WORTHLESS;
    }
    let fresh_at = ticks_ceil(now_us, outcome.reset_ms);
    Stamp::new(fresh_at, drained(units(params), outcome.remaining), tag)
}

/// The share's capacity or limit in units ([`Params::units`]).
fn units(params: &Params) -> f64 {
    match params {
        Params::TokenBucket(p) => p.capacity / MICRO,
        Params::LeakyBucket(p) => p.capacity / MICRO,
        Params::FixedWindow(p) => p.limit,
        Params::SlidingWindowLog(p) => p.limit,
        Params::SlidingWindowCounter(p) => p.limit,
        Params::Concurrency(p) => p.limit,
    }
}

/// `⌈255 × (units − remaining) ÷ units⌉`, at most 255: an upper bound, in 1/255ths, of
/// the share used. In integers for a whole `units` (exact); with a margin otherwise.
fn drained(units: f64, remaining: u64) -> u8 {
    if remaining == 0 {
        return 255;
    }
    // `units` ≤ 10⁹ (`MAX_LIMIT`): it fits an i64 (a cheaper conversion than to u64)
    // and the product below a u64 (a u128 division would be a call).
    let whole = (units as i64).max(0) as u64;
    if whole as f64 == units {
        let used = whole.saturating_sub(remaining);
        return used.saturating_mul(255).div_ceil(whole.max(1)).min(255) as u8;
    }
    let used = units - remaining as f64;
    if used <= 0.0 {
        return 0;
    }
    // Rounded up: the truncation of a value ≥ 0, plus one unless already whole.
    let x = 255.0 * used / units + 1e-6;
    let q = x as u64 + u64::from((x as u64) as f64 != x);
    q.min(255) as u8
}

/// `⌈q × units ÷ 255⌉` for a window's count: at least `units − remaining` of the
/// evicted state (exact integers for a whole `units`, else with a margin), at most
/// `units`.
fn window_count(q: u8, units: f64) -> f64 {
    if units.fract() == 0.0 && units < 1e15 {
        ((u64::from(q) * units as u64).div_ceil(255) as f64).min(units)
    } else {
        (f64::from(q) * units / 255.0 * (1.0 + 1e-12)).min(units)
    }
}

/// `⌈q × cap ÷ 255⌉` for a bucket's capacity `cap` in whole µ-units (exact).
fn bucket_deficit(q: u8, cap: f64) -> f64 {
    (u128::from(q) * cap as u128).div_ceil(255) as f64
}

/// The state a key evicted while it mattered restarts from at `now` µs, from what the
/// map recorded of it (`rec`, an upper bound of its stamp), under `params`: never
/// fuller than the evicted state (module doc).
pub fn restart(params: &Params, rec: Stamp, now: f64) -> State {
    let until = ticks_to_us(rec.fresh_at());
    let q = rec.drained();
    let ahead = (until - now).max(0.0);
    match params {
        Params::TokenBucket(p) => {
            let by_time = (ahead * p.refill_rate).ceil() + 1.0;
            let deficit = p.capacity.min(by_time).min(bucket_deficit(q, p.capacity));
            State::TokenBucket(token_bucket::State {
                tokens: p.capacity - deficit,
                ts: now,
            })
        }
        Params::LeakyBucket(p) => {
            let by_time = (ahead * p.leak_rate).ceil() + 1.0;
            State::LeakyBucket(leaky_bucket::State {
                level: p.capacity.min(by_time).min(bucket_deficit(q, p.capacity)),
                ts: now,
            })
        }
        Params::FixedWindow(p) => State::FixedWindow(fixed_window::State {
            start: window_start(now, p.window),
            count: window_count(q, p.limit),
        }),
        Params::SlidingWindowLog(p) => {
            let leaves = until.min(now + p.window);
            State::SlidingWindowLog(sliding_window_log::Log::one(
                leaves - p.window,
                window_count(q, p.limit),
            ))
        }
        Params::SlidingWindowCounter(p) => {
            State::SlidingWindowCounter(sliding_window_counter::State {
                start: window_start(now, p.window),
                current: window_count(q, p.limit),
                previous: 0.0,
            })
        }
        // Slots held until the evicted state's last one could have ended.
        Params::Concurrency(p) => State::Concurrency(concurrency::seed(
            p,
            1.0 - window_count(q, p.limit) / p.limit.max(1.0),
            ahead,
            now,
        )),
    }
}

#[cfg(test)]
#[path = "restart_tests.rs"]
mod tests;

#[cfg(test)]
mod sim {
    /// The worst case for the sketch: a same-rule flood of distinct keys, one request
    /// each (capacity 5, 0.01 token/s, 1.5 M keys/s, `max_keys` 10,000; `SIM_N` keys,
    /// default 10⁷). The bound holds (the key drained before the flood is still denied
    /// after it) and the figures of docs/DESIGN.md ("Eviction that never over-admits")
    /// are printed: how full the flood's keys start, per tenth of the flood. Minutes in
    /// a debug build: `cargo test --release --lib -- --ignored ratchet --nocapture`.
    #[test]
    #[ignore]
    fn ratchet_figures_and_the_bound_through_a_same_rule_flood() {
        use crate::algorithm::{Kind, Params, Per};
        use crate::fallback::LocalBuckets;
        use std::hash::BuildHasher;
        let n: u64 = std::env::var("SIM_N").map_or(10_000_000, |v| v.parse().unwrap());
        const TAG: u8 = 7;
        let p = Params::new(Kind::TokenBucket, 5, Per::Rate(0.01), 1);
        let local = LocalBuckets::new(10_000);
        let t0 = 1.7e15;
        let drained = u64::MAX;
        assert_eq!(
            (0..6)
                .filter(|_| local.decide(drained, 5, &p, TAG, 1, t0).allowed)
                .count(),
            5
        );
        // hist[r]: ALLOWs leaving r; hist[5]: DENYs.
        let mut hist = [0u64; 6];
        let mut now = t0;
        for i in 0..n {
            let k = foldhash::fast::FixedState::with_seed(9).hash_one(i);
            now = t0 + (i as f64 / 1.5).floor();
            let d = local.decide(k, 5, &p, TAG, 1, now);
            assert!(d.remaining <= 4, "a new key never starts above full");
            hist[if d.allowed { d.remaining as usize } else { 5 }] += 1;
            if (i + 1) % (n / 10).max(1) == 0 {
                println!(
                    "{} keys: ALLOW leaving 4, 3, 2, 1, 0: {:?}; DENY: {}",
                    i + 1,
                    [hist[4], hist[3], hist[2], hist[1], hist[0]],
                    hist[5]
                );
                hist = [0; 6];
            }
        }
        let d = local.decide(drained, 5, &p, TAG, 1, now);
        assert_eq!((d.allowed, d.remaining), (false, 0));
    }
}
