//! Concurrency: at most `limit` slots held at once per key, each taken by `ACQUIRE` and
//! given back by `RELEASE`, by its holder going away, or when its `max_hold` ends
//! (docs/ALGORITHMS.md "concurrency"). Unlike the rate algorithms nothing refills: a
//! slot comes back only when it is given back or lapses.
//!
//! A slot has two ends: `hold_end`, when its `max_hold` runs out (fixed at
//! acquisition), and `lapse`, when it is gone unless renewed (`min(hold_end, now +
//! lease)`: a daemon renews the slots its clients hold, so those of a daemon that died
//! lapse within the lease). Locally (no Redis, or `mode = "none"`) the holder is this
//! process, so `lapse = hold_end`. The twin is `lua/concurrency.lua` (a sorted set of
//! tokens scored by their lapse, the token naming its `hold_end`); both answer alike
//! for the same operations, which `tests/it/twins.rs` checks against the reference
//! model.

use super::{ceil_ms, Arg, Family, Outcome, Per, Shape, Spec};

/// This algorithm's entry in the table (`super::registry`). It takes no lease
/// (`lease = "auto"`): a slot is not a unit of a budget that could be paid ahead.
pub const SPEC: Spec = super::spec!("concurrency", "cc", Family::Slots);

/// Largest `limit` of a concurrency rule: a DENY reads every slot held to find the
/// oldest one's `max_hold` end.
pub const MAX_SLOTS: u64 = 10_000;

/// Default `max_hold`, ms.
pub const DEFAULT_MAX_HOLD_MS: u64 = 60_000;

/// How long a slot lives in Redis without its daemon renewing it, µs: a daemon that
/// dies gives its slots back within `min(max_hold, this)`.
pub const HOLDER_LEASE_US: f64 = 10_000_000.0;

/// Parameters: `limit` slots, each held at most `max_hold`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Slots per key: the rule's `limit`, or `limit ÷ hosts` locally (floored when a
    /// slot is taken).
    pub limit: f64,
    /// The longest a slot is held, µs.
    pub max_hold: f64,
}

/// One slot held.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slot {
    /// Who holds it: the number of the token this daemon handed out (0: anonymous,
    /// taken by a cost-based decision).
    pub id: u64,
    /// When its `max_hold` ends, µs.
    pub hold_end: f64,
    /// When it is gone unless renewed, µs (≤ `hold_end`).
    pub lapse: f64,
}

/// The slots of one key, in the order taken.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct State {
    /// The slots held, oldest first.
    pub slots: Vec<Slot>,
}

impl Shape for Params {
    fn shared(limit: u64, per: Per, hosts: u32) -> Self {
        Params {
            limit: limit as f64 / f64::from(hosts.max(1)),
            max_hold: per.window_ms() as f64 * 1000.0,
        }
    }

    fn can_ever_pass(&self, cost: u64) -> bool {
        cost as f64 <= self.limit.floor()
    }

    fn units(&self) -> f64 {
        self.limit
    }

    fn script_args(&self, cost: u32) -> [Arg; 3] {
        [
            Arg::Whole(self.limit),
            Arg::Whole(self.max_hold),
            Arg::Int(i64::from(cost)),
        ]
    }
}

impl State {
    /// Drops the slots lapsed at `now` µs.
    fn purge(&mut self, now: f64) {
        self.slots.retain(|s| s.lapse > now);
    }

    /// The answer for the state as it is at `now`: ALLOW with the slots left, or DENY
    /// with `wait_ms` until the oldest slot's `max_hold` ends; `reset_ms` until the
    /// last one's does (an `ACQUIRE` reply states 0 on an ALLOW; the local state's
    /// bookkeeping uses it).
    fn report(&self, allowed: bool, now: f64, p: &Params) -> Outcome {
        let free = p.limit.floor() - self.slots.len() as f64;
        if self.slots.is_empty() {
            // DENY: a share below one slot; retry about when Redis is probed.
            let never = if allowed { 0.0 } else { 1.0 };
            return Outcome::new(allowed, free, never, never);
        }
        let first = self
            .slots
            .iter()
            .map(|s| s.hold_end)
            .fold(f64::MAX, f64::min);
        let last = self.slots.iter().map(|s| s.hold_end).fold(0.0, f64::max);
        let reset = ceil_ms(last - now).max(1.0);
        if allowed {
            return Outcome::new(true, free, reset, 0.0);
        }
        let wait = ceil_ms(first - now).max(1.0);
        Outcome::new(false, free, reset, wait)
    }
}

/// Takes a slot for token `id` at `now` µs if fewer than `limit` are held, lapsing at
/// `min(hold_end, now + lease)` µs (`lease` = `f64::INFINITY` for a slot held in this
/// process). Returns the outcome (on ALLOW `reset_ms` 0, as the reply states it: the
/// twin does not read the slots then) and, when allowed, the slot's `hold_end`.
pub fn acquire(st: &mut State, now: f64, p: &Params, id: u64, lease: f64) -> (Outcome, f64) {
    st.purge(now);
    if (st.slots.len() as f64) < p.limit.floor() {
        let hold_end = now + p.max_hold;
        st.slots.push(Slot {
            id,
            hold_end,
            lapse: hold_end.min(now + lease),
        });
        let mut o = st.report(true, now, p);
        o.reset_ms = 0;
        (o, hold_end)
    } else {
        (st.report(false, now, p), 0.0)
    }
}

/// Gives back the slot of token `id` at `now`; false when the key holds no such slot
/// (never taken, already given back, or lapsed).
pub fn release(st: &mut State, now: f64, id: u64) -> bool {
    st.purge(now);
    let before = st.slots.len();
    st.slots.retain(|s| s.id != id);
    st.slots.len() < before
}

/// Renews the slots of tokens `ids` at `now`: each lapses at `min(hold_end, now +
/// lease)`. Returns how many of them the key still held.
pub fn renew(st: &mut State, now: f64, ids: &[u64], lease: f64) -> usize {
    st.purge(now);
    let mut found = 0;
    for s in st.slots.iter_mut().filter(|s| ids.contains(&s.id)) {
        s.lapse = s.hold_end.min(now + lease);
        found += 1;
    }
    found
}

/// The state of a key of which `unused` (0..=1) of the slots are free at `now`, the
/// last held until `reset_us` later: what Redis last reported, carried over to a local
/// decision (anonymous slots, given back only by lapsing).
pub fn seed(p: &Params, unused: f64, reset_us: f64, now: f64) -> State {
    let held = (p.limit * (1.0 - unused.clamp(0.0, 1.0))).ceil().max(0.0) as usize;
    let end = now + reset_us.min(p.max_hold);
    State {
        slots: vec![
            Slot {
                id: 0,
                hold_end: end,
                lapse: end,
            };
            held
        ],
    }
}

/// The registry's uniform decision: `cost` anonymous slots taken at once (all or
/// none), each held until its `max_hold` ends; a cost of 0 reports the state. `ACQUIRE`
/// and `RELEASE` use [`acquire`] and [`release`]; this serves the operator's and the
/// fallback's cost-0 reads.
pub fn decide_in(state: &mut Option<State>, now: f64, p: &Params, cost: u64) -> Outcome {
    let st = state.get_or_insert_with(State::default);
    st.purge(now);
    let fits = (st.slots.len() as u64 + cost) as f64 <= p.limit.floor();
    if fits {
        for _ in 0..cost {
            st.slots.push(Slot {
                id: 0,
                hold_end: now + p.max_hold,
                lapse: now + p.max_hold,
            });
        }
    }
    let mut out = st.report(fits, now, p);
    if !fits && !p.can_ever_pass(cost) {
        out.wait_ms = out.wait_ms.max(out.reset_ms).max(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(limit: u64, max_hold_ms: u64) -> Params {
        Params::shared(limit, Per::WindowMs(max_hold_ms), 1)
    }

    #[test]
    fn at_most_limit_slots_and_a_release_frees_one() {
        let p = p(2, 1000);
        let mut st = State::default();
        let inf = f64::INFINITY;
        assert!(acquire(&mut st, 0.0, &p, 1, inf).0.allowed);
        let (o, _) = acquire(&mut st, 10.0, &p, 2, inf);
        assert!(o.allowed && o.remaining == 0);
        let (o, _) = acquire(&mut st, 20_000.0, &p, 3, inf);
        assert!(!o.allowed);
        // The oldest slot's max_hold ends at 1 s: 980 ms from now.
        assert_eq!((o.wait_ms, o.reset_ms), (980, 981));
        assert!(release(&mut st, 30_000.0, 1));
        assert!(!release(&mut st, 30_000.0, 1));
        assert!(acquire(&mut st, 40_000.0, &p, 3, inf).0.allowed);
    }

    #[test]
    fn an_unrenewed_slot_lapses_at_its_lease_a_renewed_one_at_max_hold() {
        let p = p(1, 60_000);
        let mut st = State::default();
        acquire(&mut st, 0.0, &p, 1, 10e6);
        assert!(!acquire(&mut st, 9.9e6, &p, 2, 10e6).0.allowed);
        assert_eq!(renew(&mut st, 9.9e6, &[1, 7], 10e6), 1);
        assert!(!acquire(&mut st, 19.8e6, &p, 2, 10e6).0.allowed);
        assert!(acquire(&mut st, 19.9e6 + 1.0, &p, 2, 10e6).0.allowed);
        // Renewed forever, a slot still ends with its max_hold.
        let mut st = State::default();
        acquire(&mut st, 0.0, &p, 1, 10e6);
        for t in 1..=6 {
            renew(&mut st, f64::from(t) * 9e6, &[1], 10e6);
        }
        assert!(acquire(&mut st, 60e6, &p, 2, 10e6).0.allowed);
    }

    #[test]
    fn a_share_below_one_slot_never_passes() {
        let p = Params::shared(3, Per::WindowMs(1000), 4);
        let mut st = State::default();
        assert!(!acquire(&mut st, 0.0, &p, 1, f64::INFINITY).0.allowed);
        assert!(!p.can_ever_pass(1));
    }
}
