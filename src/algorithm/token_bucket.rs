//! Token bucket: a bucket of `capacity` tokens, refilled continuously at `refill_rate`
//! tokens/s up to `capacity`; a request is allowed if the bucket holds at least `cost`
//! tokens, which it then takes. A new key starts full (docs/ALGORITHMS.md).
//!
//! Units: tokens are counted in **micro-tokens** (1 token = 1,000,000 µtok) and time in
//! **µs**, so `refill_rate` tokens/s is exactly `refill_rate` µtok/µs. State values stay
//! integers below 2^53 (capacity ≤ 10^9 tokens), which doubles represent exactly; the
//! only rounding is the `floor` of each refill, done identically in `lua/token_bucket.lua`.

use super::{ceil_ms, settle, Family, Outcome, Spec};

/// This algorithm's entry in the table (`super::registry`).
pub const SPEC: Spec = Spec {
    lease: super::lease!("token_bucket"),
    ..super::spec!(
        "token_bucket",
        "tb",
        Family::Bucket {
            rate: "refill_rate"
        },
        "bucket_leases"
    )
};

pub use super::MICRO;

/// Parameters of one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Bucket size in µtok (`capacity × 10^6`, or `capacity × 10^6 ÷ hosts` for a local
    /// fallback bucket, floored).
    pub capacity: f64,
    /// Refill rate in tokens/s (= µtok/µs), > 0.
    pub refill_rate: f64,
}

impl Params {
    /// Parameters for `capacity` tokens refilled at `refill_rate` tokens/s, shared by
    /// `hosts` hosts (each gets `capacity ÷ hosts` and `refill_rate ÷ hosts`).
    pub fn shared(capacity: u64, refill_rate: f64, hosts: u32) -> Self {
        let (capacity, refill_rate) = super::bucket_share(capacity, refill_rate, hosts);
        Params {
            capacity,
            refill_rate,
        }
    }
}

/// What a bucket remembers between requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Tokens in the bucket at `ts`, in µtok (an integer-valued double).
    pub tokens: f64,
    /// When `tokens` was measured, µs on the deciding clock.
    pub ts: f64,
}

/// The state of a bucket of which `unused` (0..=1) is left at `now` µs: what Redis last
/// reported for a key (`remaining ÷ capacity`), carried over to a local bucket.
pub fn seed(p: &Params, unused: f64, _reset_us: f64, now: f64) -> State {
    State {
        tokens: (p.capacity * unused.clamp(0.0, 1.0)).floor(),
        ts: now,
    }
}

/// Tokens (µtok) in the bucket stored as `state` at `now` µs.
fn tokens_at(state: Option<State>, now: f64, p: &Params) -> f64 {
    match state {
        None => p.capacity,
        Some(s) => {
            let now = now.max(s.ts);
            p.capacity
                .min(s.tokens + ((now - s.ts) * p.refill_rate).floor())
        }
    }
}

/// Decides a request of `cost` tokens at `now` µs.
///
/// `state` is `None` for a key never seen (or expired: same thing, it is full). Returns
/// the outcome and the state to store, or `None` when nothing changed (a DENY, or a
/// cost of 0), which is what the Lua twin writes too.
pub fn decide(state: Option<State>, now: f64, p: &Params, cost: u64) -> (Outcome, Option<State>) {
    let cap = p.capacity;
    let rate = p.refill_rate;
    let cost = cost as f64 * MICRO;
    let now = state.map_or(now, |s| now.max(s.ts));
    let mut tokens = tokens_at(state, now, p);
    let allowed = tokens >= cost;
    let mut write = None;
    if allowed && cost > 0.0 {
        tokens -= cost;
        write = Some(State { tokens, ts: now });
    }
    let stored = write.or(state);
    let at = |k: f64| tokens_at(stored, now + k * 1000.0, p);
    let reset = settle(ceil_ms((cap - tokens) / rate), 0.0, |k| at(k) >= cap);
    let wait = super::wait(allowed, cost > cap, reset, || {
        settle(ceil_ms((cost - tokens) / rate), 1.0, |k| at(k) >= cost)
    });
    let outcome = Outcome::new(allowed, tokens / MICRO, reset, wait);
    (outcome, write)
}

super::decide_in_place!();

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: f64 = 1_000_000.0;

    #[test]
    fn burst_then_refill() {
        let p = Params::shared(20, 10.0, 1);
        let mut st = None;
        for i in 0..20 {
            let (o, s) = decide(st, 0.0, &p, 1);
            assert!(o.allowed, "request {i}");
            assert_eq!(o.remaining, 19 - i);
            st = s;
        }
        let (o, s) = decide(st, 0.0, &p, 1);
        assert!(!o.allowed);
        assert_eq!(s, None);
        assert_eq!(o.wait_ms, 100); // 1 token at 10/s
        assert_eq!(o.reset_ms, 2000); // 20 tokens at 10/s
        let (o, _) = decide(st, 0.099 * SEC, &p, 1);
        assert!(!o.allowed);
        assert_eq!(o.wait_ms, 1);
        let (o, _) = decide(st, 0.1 * SEC, &p, 1);
        assert!(o.allowed);
    }

    #[test]
    fn cost_zero_reports_without_taking() {
        let p = Params::shared(5, 1.0, 1);
        let (o, s) = decide(None, 0.0, &p, 0);
        assert_eq!((o.allowed, o.remaining, o.reset_ms, s), (true, 5, 0, None));
    }

    #[test]
    fn shared_params_divide_capacity_and_rate() {
        let p = Params::shared(20, 10.0, 4);
        assert_eq!(p.capacity, 5_000_000.0);
        assert_eq!(p.refill_rate, 2.5);
        let p = Params::shared(3, 1.0, 4);
        assert_eq!(p.capacity, 750_000.0); // 0.75 tokens: never a whole request; conservative
        let (o, _) = decide(None, 0.0, &p, 1);
        assert!(!o.allowed && o.wait_ms >= 1);
    }

    #[test]
    fn clock_going_back_does_not_refill() {
        let p = Params::shared(2, 1.0, 1);
        let (_, s) = decide(None, 10.0 * SEC, &p, 2);
        let (o, _) = decide(s, 5.0 * SEC, &p, 1);
        assert!(!o.allowed);
    }

    proptest! {
        /// Over any trace, admitted tokens never exceed capacity + rate × elapsed, and
        /// `wait_ms` on a DENY is exactly when the same request turns into an ALLOW
        /// (allowed at now + wait_ms, denied 1 ms earlier).
        #[test]
        fn never_admits_more_than_capacity_plus_refill(
            cap in 1u64..200, rate in 0.1f64..500.0,
            steps in proptest::collection::vec((0u64..300_000, 0u64..10), 1..200)
        ) {
            let p = Params::shared(cap, rate, 1);
            let (mut st, mut now, mut admitted) = (None, 0.0, 0u64);
            for (dt, cost) in steps {
                now += dt as f64;
                let cost = cost.min(cap);
                let (o, s) = decide(st, now, &p, cost);
                if o.allowed {
                    admitted += cost;
                    if s.is_some() { st = s; }
                } else {
                    prop_assert!(o.wait_ms >= 1);
                    let later = decide(st, now + o.wait_ms as f64 * 1000.0, &p, cost).0;
                    prop_assert!(later.allowed, "not allowed after wait_ms {}", o.wait_ms);
                    let before = decide(st, now + (o.wait_ms - 1) as f64 * 1000.0, &p, cost).0;
                    prop_assert!(o.wait_ms == 1 || !before.allowed);
                }
                prop_assert!(admitted as f64 <= cap as f64 + rate * now / SEC + 1e-9);
            }
        }
    }
}
