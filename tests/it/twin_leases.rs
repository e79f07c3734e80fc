//! The window algorithms' lease scripts against the reference model: holders take
//! leases and window slices from `lua/lease_sliding_window_counter.lua` and
//! `lua/lease_fixed_window.lua` in a real Redis (explicit timestamps) and spend them as a
//! daemon does (a slice accrues its rate from the reply until the holder's deadline,
//! whole units spent), and every unit admitted, from Redis or from a lease, is decided
//! again by the reference model (`tests/reference`) at its real time, as one client
//! deciding every request: the model must admit each (docs/DESIGN.md "Leases",
//! "Windows": zero over-admission). Saturated runs also check the other side: each whole
//! window is used in equal shares (a fixed window's: `twin_leases_fixed.rs`).

use crate::common;
use crate::reference;

use common::*;
use proptest::prelude::*;
use ratelimitd::algorithm::Kind;
use reference::{Algo, Model};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub(crate) fn redis() -> &'static RedisStandalone {
    static REDIS: OnceLock<RedisStandalone> = OnceLock::new();
    REDIS.get_or_init(RedisStandalone::start)
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// µ-units per unit on the holder.
const UNIT: u64 = 1_000_000;

/// One holder's lease as a daemon keeps it (`src/lease/state.rs`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Holder {
    pub(crate) grant: i64,
    /// µ-units unspent.
    pub(crate) units: u64,
    pub(crate) cap: u64,
    /// µ-units/s.
    pub(crate) rate: u64,
    pub(crate) accrued_at: u64,
    /// Spent only before this (µs).
    pub(crate) deadline: u64,
    /// When the call that took it was sent (and answered: at once here), and how long
    /// before its lifetime it stops being spent (µs), named back with it.
    pub(crate) sent: u64,
    pub(crate) spare: u64,
}

impl Holder {
    pub(crate) fn accrue(&mut self, now: u64) {
        let until = now.min(self.deadline);
        if self.rate > 0 && until > self.accrued_at {
            let add = u128::from(self.rate) * u128::from(until - self.accrued_at) / 1_000_000;
            self.units = (self.units + add as u64).min(self.cap);
            self.accrued_at = until;
        }
    }

    /// Spends `cost` units at `now` if the lease holds them.
    pub(crate) fn spend(&mut self, cost: u64, now: u64) -> bool {
        if self.grant == 0 || now >= self.deadline {
            return false;
        }
        self.accrue(now);
        if self.units >= cost * UNIT {
            self.units -= cost * UNIT;
            return true;
        }
        false
    }
}

/// The key under test: the script, its rule and the holders.
pub(crate) struct Key {
    kind: Kind,
    pub(crate) name: String,
    limit: u64,
    window: u64,
    pub(crate) holders: Vec<Holder>,
    /// How far Redis's clock is ahead of the holders', µs (a forward jump).
    pub(crate) ahead: u64,
    /// Per holder, the key's last grant it read in a reply and when (its clock): a
    /// call names its caller the witness of leases up to it (lua/lease.lua).
    seen: Vec<(i64, u64)>,
}

impl Key {
    /// A key of algorithm `kind`'s lease script.
    pub(crate) fn new(kind: Kind, limit: u64, window: u64, hosts: usize) -> Key {
        Key {
            kind,
            name: format!("twin-lease:{{{}}}", CASE.fetch_add(1, Ordering::Relaxed)),
            limit,
            window,
            holders: vec![Holder::default(); hosts],
            ahead: 0,
            seen: vec![(0, 0); hosts],
        }
    }

    /// Holder `h`'s call at `now`: decides `cost`, gives its lease back (its unspent
    /// whole units), asks for `want` units (`pace`: saturated). Returns the decision.
    pub(crate) fn call(&mut self, h: usize, now: u64, cost: u64, want: u64, pace: u64) -> bool {
        self.reply(h, now, cost, want, pace)[0] == 1
    }

    /// [`Key::call`], returning the whole reply.
    pub(crate) fn reply(
        &mut self,
        h: usize,
        now: u64,
        cost: u64,
        want: u64,
        pace: u64,
    ) -> Vec<i64> {
        self.reply_in(self.window, h, now, cost, want, pace)
    }

    /// [`Key::call`] with a rule of `window` µs; `now` is the holder's clock, Redis's
    /// is [`Key::ahead`] of it.
    pub(crate) fn call_in(
        &mut self,
        window: u64,
        h: usize,
        now: u64,
        cost: u64,
        want: u64,
        pace: u64,
    ) -> bool {
        self.reply_in(window, h, now, cost, want, pace)[0] == 1
    }

    /// [`Key::call_in`], returning the whole reply.
    pub(crate) fn reply_in(
        &mut self,
        window: u64,
        h: usize,
        now: u64,
        cost: u64,
        want: u64,
        pace: u64,
    ) -> Vec<i64> {
        let script = ratelimitd::store::scripts::lease_lua(self.kind).expect("a lease script");
        let mine = &mut self.holders[h];
        mine.accrue(now);
        let (given, unspent) = (mine.grant, mine.units / UNIT);
        let lifetime = if pace > 0 { 2_000_000 } else { 1_000_000 };
        let (seen, seen_at) = self.seen[h];
        let (sent, spare) = if given != 0 {
            (mine.sent.to_string(), mine.spare.to_string())
        } else {
            (String::new(), "0".into())
        };
        let args: Vec<String> = vec![
            self.limit.to_string(),
            window.to_string(),
            cost.to_string(),
            (now + self.ahead).to_string(),
            format!("h{h}"),
            given.to_string(),
            unspent.to_string(),
            want.to_string(),
            lifetime.to_string(),
            pace.to_string(),
            now.to_string(),
            seen.to_string(),
            seen_at.to_string(),
            sent.clone(),
            sent,
            spare,
        ];
        let mut cmd = vec!["EVAL", script, "1", &self.name];
        cmd.extend(args.iter().map(String::as_str));
        let r = redis_command(&redis().addr(), &cmd)
            .expect("EVAL")
            .into_ints();
        assert_eq!(r.len(), 12, "{r:?}");
        if r[10] > seen {
            self.seen[h] = (r[10], now);
        }
        let mine = &mut self.holders[h];
        *mine = Holder::default();
        if want > 0 && r[6] > 0 {
            let life = r[5] as u64;
            // A lease cut at its window's end is spent a little less (WINDOW_SPARE_US).
            let spare = if life < lifetime {
                (life / 2).min(25_000)
            } else {
                0
            };
            *mine = Holder {
                grant: r[6],
                units: r[4] as u64 * UNIT,
                cap: (r[8] as u64 * UNIT).max(r[4] as u64 * UNIT),
                rate: r[9] as u64,
                accrued_at: now,
                deadline: (now + life).saturating_sub(1000 + life / 1000 + spare),
                sent: now,
                spare,
            };
        }
        r
    }

    /// A decision of `cost` at `now` by the per-request script, the rule's window being
    /// `window` µs (a daemon with `lease = "off"`).
    pub(crate) fn plain(&self, window: u64, now: u64, cost: u64) -> bool {
        let args = [
            self.limit.to_string(),
            window.to_string(),
            cost.to_string(),
            (now + self.ahead).to_string(),
        ];
        let mut cmd = vec!["EVAL", self.kind.spec().lua, "1", &self.name];
        cmd.extend(args.iter().map(String::as_str));
        let r = redis_command(&redis().addr(), &cmd)
            .expect("EVAL")
            .into_ints();
        r[0] == 1
    }
}

pub(crate) fn model(kind: Kind, limit: u64, window: u64) -> Model {
    let (limit, window) = (limit as f64, window as f64);
    Model::new(match kind {
        Kind::FixedWindow => Algo::FixedWindow { limit, window },
        _ => Algo::SlidingWindowCounter { limit, window },
    })
}

/// Random calls and spends of holders (`steps`: µs since the last, holder, what, cost,
/// want) on a key of `kind`: every unit admitted passes the model at its real time.
fn units_pass_the_model(
    kind: Kind,
    limit: u64,
    window: u64,
    hosts: usize,
    steps: &[(u64, usize, u8, u64, u64)],
) -> Result<(), TestCaseError> {
    let mut key = Key::new(kind, limit, window, hosts);
    let mut m = model(kind, limit, window);
    let mut now = 1_790_000_000_000_000u64 + (steps.len() as u64 * 7919) % window;
    for (i, &(dt, h, what, cost, want)) in steps.iter().enumerate() {
        now += dt;
        let h = h % hosts;
        let cost = cost.min(limit);
        if what < 6 {
            // As much as the lease holds now (a saturated holder's demand).
            while key.holders[h].spend(cost, now) {
                prop_assert_eq!(
                    m.decide(now as f64, cost)[0],
                    1,
                    "step {}: holder {} spent {} at {} the model refuses",
                    i,
                    h,
                    cost,
                    now
                );
            }
        } else {
            let pace = if what < 8 { 200_000 } else { 0 };
            let want = if what == 9 { 0 } else { want };
            if key.call(h, now, cost, want, pace) {
                prop_assert_eq!(
                    m.decide(now as f64, cost)[0],
                    1,
                    "step {}: Redis admitted {} at {} the model refuses",
                    i,
                    cost,
                    now
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random calls and spends of two to four holders (each spend takes all its lease
    /// holds then): every unit admitted, from Redis or a lease, passes the reference
    /// model at its real time.
    #[test]
    fn every_unit_a_lease_admits_passes_the_model(
        limit in 1u64..400,
        window_ms in prop::sample::select(vec![100u64, 1000, 7000]),
        hosts in 2usize..5,
        steps in prop::collection::vec((0u64..30_000, 0usize..4, 0u8..10, 1u64..4, 1u64..300), 1..400),
    ) {
        units_pass_the_model(Kind::SlidingWindowCounter, limit, window_ms * 1000, hosts, &steps)?;
    }

    /// The same for a fixed window's leases, each at most the holder's due of the
    /// window (what the others are due kept back).
    #[test]
    fn every_unit_a_fixed_window_lease_admits_passes_the_model(
        limit in 1u64..400,
        window_ms in prop::sample::select(vec![100u64, 1000, 7000]),
        hosts in 2usize..5,
        steps in prop::collection::vec((0u64..30_000, 0usize..4, 0u8..10, 1u64..4, 1u64..300), 1..400),
    ) {
        units_pass_the_model(Kind::FixedWindow, limit, window_ms * 1000, hosts, &steps)?;
    }
}

/// Three saturated holders, as the daemons (`tests/serial/leases/windows.rs`): each
/// spends a unit every 0.5 ms while its lease holds one, and calls (a slice: pace) when
/// its lease ends, or 200 ms after a call that brought no slice when its lease is
/// short. Every unit passes
/// the model; each whole window admits at least 90 % of the limit, the holders within
/// ±10 % of their mean, with at most one call per ten units.
#[test]
fn saturated_holders_use_each_window_in_equal_shares() {
    let (limit, window) = (600u64, 1_000_000u64);
    let mut key = Key::new(Kind::SlidingWindowCounter, limit, window, 3);
    let mut m = model(Kind::SlidingWindowCounter, limit, window);
    let t0 = 1_790_000_000_000_000u64 + 137_000;
    let mut next_call = [t0, t0 + 7_000, t0 + 19_000];
    let mut per_window: std::collections::BTreeMap<u64, [u64; 3]> = Default::default();
    let mut calls = 0u64;
    let end = t0 + 6 * window;
    let mut now = t0;
    while now < end {
        for (h, next) in next_call.iter_mut().enumerate() {
            // Offset the holders' instants a little.
            let at = now + h as u64 * 97;
            let spent = key.holders[h].spend(1, at);
            let admitted = spent || {
                let lease = &key.holders[h];
                let held = lease.grant != 0 && at < lease.deadline && lease.rate > 0;
                if !held && at >= *next {
                    calls += 1;
                    let ok = key.call(h, at, 1, 120, 200_000);
                    if key.holders[h].rate == 0 {
                        *next = at + 200_000;
                    }
                    ok
                } else {
                    false
                }
            };
            if admitted {
                assert_eq!(m.decide(at as f64, 1)[0], 1, "holder {h} at {at}");
                per_window.entry(at / window).or_default()[h] += 1;
            }
        }
        now += 500;
    }
    let (first, last) = (t0 / window, (end - 1) / window);
    let mut totals = [0u64; 3];
    let mut admitted = 0;
    for (w, per) in &per_window {
        admitted += per.iter().sum::<u64>();
        if *w == first || *w == last {
            continue;
        }
        let sum: u64 = per.iter().sum();
        println!("window {w}: {sum} admitted, per holder {per:?}");
        assert!(sum <= limit, "window {w}: {sum}");
        assert!(sum * 10 >= limit * 9, "window {w}: {sum} < 90 % of {limit}");
        totals.iter_mut().zip(per).for_each(|(t, p)| *t += p);
    }
    let mean = totals.iter().sum::<u64>() as f64 / 3.0;
    println!("whole windows per holder {totals:?}; {calls} calls for {admitted} admitted");
    for t in totals {
        assert!((t as f64 - mean).abs() <= 0.1 * mean, "{totals:?}");
    }
    assert!(calls * 10 <= admitted, "{calls} calls for {admitted}");
}

/// A window slice granted at a window's start with no lump (the previous window full:
/// nothing has come back yet) still adds to the window's count as it accrues, and the
/// next window weighs that count: the key outlives the window after this one, though
/// its count and accrual are 0 when the slice is granted.
#[test]
fn a_slice_with_no_lump_keeps_the_key_past_the_next_window() {
    let (limit, window) = (600u64, 2_000_000u64);
    let mut key = Key::new(Kind::SlidingWindowCounter, limit, window, 1);
    // Aligned to the epoch: the previous window starts at t0, this one at t0 + window.
    let t0 = 1_790_000_000_000_000u64 / window * window;
    assert!(
        key.call(0, t0 + 1_000, limit, 0, 0),
        "the previous window filled"
    );
    let at = t0 + window + 1_000;
    assert!(
        !key.call(0, at, 1, 300, 200_000),
        "nothing has come back yet"
    );
    let slice = &key.holders[0];
    assert!(
        slice.grant > 0 && slice.units == 0 && slice.rate > 0,
        "{slice:?}"
    );
    let ttl = match redis_command(&redis().addr(), &["PTTL", &key.name]).expect("PTTL") {
        Resp::Int(ms) => ms,
        other => panic!("PTTL: {other:?}"),
    };
    // The rest of this window, then the next one (which weighs this window's count).
    let needed_ms = ((t0 + 3 * window - at) / 1000) as i64;
    assert!(ttl >= needed_ms, "PTTL {ttl} ms, needs {needed_ms}");
}
