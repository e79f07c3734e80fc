//! Reloads of a leased window rule against the reference model (docs/DESIGN.md
//! "Leases", "Reloads and leases"): holders take leases under a rule of one
//! window, then a reload changes the window, or turns leases off (decisions then made
//! by the per-request script), while leases of the old window are out. Reloaded holders
//! stop spending at once (as a daemon does) and name their grant at their next call;
//! some holders reload late and spend their old lease until its deadline. Every unit
//! the new rule admits (from Redis or a lease), from its first whole window on (a
//! sliding window counter: the one after, whose previous window is whole too), must
//! pass the reference model of the new rule over every unit admitted, by either rule,
//! at its real time: what a unit of an old lease may spend in the new windows stays
//! counted until the lease ends (zero over-admission).

use crate::reference::{Algo, Model};
use crate::twin_leases::Key;
use proptest::prelude::*;
use ratelimitd::algorithm::Kind;

fn model(kind: Kind, limit: u64, window: u64) -> Model {
    let (limit, window) = (limit as f64, window as f64);
    Model::new(match kind {
        Kind::FixedWindow => Algo::FixedWindow { limit, window },
        _ => Algo::SlidingWindowCounter { limit, window },
    })
}

/// From when one client deciding every request in Redis, the rule changed at `reload`,
/// counts what the model counts: every unit admitted in the windows it weighs. A fixed
/// window's count starts at the new rule's first whole window; a sliding window
/// counter's also weighs the window before, whose count Redis keeps from the reload on
/// (from its start when both rules' windows start there, the count rolled over whole).
fn checked_from(fixed: bool, reload: u64, old_window: u64, new_window: u64) -> u64 {
    let first_whole = reload.div_ceil(new_window) * new_window;
    let aligned = reload - reload % old_window == reload - reload % new_window;
    if fixed || aligned {
        first_whole
    } else {
        first_whole + new_window
    }
}

/// One step: µs after the last, holder, what (0–5 spend, 6–9 call), cost, units wanted.
type Step = (u64, usize, u8, u64, u64);

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u64..30_000, 0usize..4, 0u8..10, 1u64..4, 1u64..300),
        1..150,
    )
}

fn windows() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![100_000u64, 1_000_000, 2_000_000, 7_000_000])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Before the reload, the old rule's model decides every unit (as
    /// twin_leases.rs); after it, the new rule's, over every unit admitted by either.
    #[test]
    fn units_of_old_leases_stay_counted_under_the_new_rule(
        fixed in any::<bool>(),
        limit in 1u64..400,
        old_window in windows(),
        new_window in windows(),
        off in any::<bool>(),
        hosts in 2usize..5,
        late in 0usize..3,
        before in steps(),
        after in steps(),
    ) {
        let kind = if fixed { Kind::FixedWindow } else { Kind::SlidingWindowCounter };
        let mut key = Key::new(kind, limit, old_window, hosts);
        let mut old = model(kind, limit, old_window);
        let mut new = model(kind, limit, new_window);
        let mut now = 1_790_000_000_000_000u64 + (before.len() as u64 * 7919) % old_window;
        for &(dt, h, what, cost, want) in &before {
            now += dt;
            let (h, cost) = (h % hosts, cost.min(limit));
            if what < 6 {
                while key.holders[h].spend(cost, now) {
                    prop_assert_eq!(old.decide(now as f64, cost)[0], 1, "spent at {}", now);
                    new.admit(now as f64, cost);
                }
            } else {
                let pace = if what < 8 { 200_000 } else { 0 };
                let want = if what == 9 { 0 } else { want };
                if key.call(h, now, cost, want, pace) {
                    prop_assert_eq!(old.decide(now as f64, cost)[0], 1, "admitted at {}", now);
                    new.admit(now as f64, cost);
                }
            }
        }
        // The reload: holders from `late` on stop spending at once; the others spend
        // their old lease until its deadline, then reload too (no call before).
        now += 1;
        let checked_from = checked_from(fixed, now, old_window, new_window);
        let late_until: Vec<u64> = key.holders.iter().map(|l| l.deadline).collect();
        for (h, lease) in key.holders.iter_mut().enumerate() {
            if h >= late {
                lease.deadline = 0;
            }
        }
        for &(dt, h, what, cost, want) in &after {
            now += dt;
            let (h, cost) = (h % hosts, cost.min(limit));
            let old_rule = h < late && now < late_until[h];
            if what < 6 || old_rule {
                while key.holders[h].spend(cost, now) {
                    let ok = new.admit(now as f64, cost);
                    prop_assert!(ok || old_rule || now < checked_from,
                        "holder {} spent {} at {}, refused by the new rule", h, cost, now);
                }
                continue;
            }
            let admitted = if off {
                // The sweep's give-back (the rule in force's lease script), then the
                // per-request script.
                if key.holders[h].grant != 0 {
                    key.call_in(new_window, h, now, 0, 0, 0);
                }
                key.plain(new_window, now, cost)
            } else {
                let pace = if what < 8 { 200_000 } else { 0 };
                let want = if what == 9 { 0 } else { want };
                key.call_in(new_window, h, now, cost, want, pace)
            };
            if admitted {
                let ok = new.admit(now as f64, cost);
                prop_assert!(ok || now < checked_from,
                    "admitted {} at {} under the new rule, refused by it", cost, now);
            }
        }
    }
}

/// A saturated reload: `hosts` holders spend a unit every `every[h]` µs while their
/// lease holds one, and call (a slice: pace) when it ends, or 200 ms after a call that
/// brought no slice. The rule's window goes from `old_window` to `new_window` (µs) at
/// `at` µs into an old window (after three whole ones), or its leases off
/// (`off`: decisions then by the per-request script, a holder's give-back by the lease
/// script); holders below `late` spend their old lease until its deadline first, or
/// (`mixed`, the window unchanged) keep taking leases all along.
struct Reload {
    fixed: bool,
    old_window: u64,
    new_window: u64,
    off: bool,
    late: usize,
    at: u64,
    every: [u64; 3],
    mixed: bool,
}

/// Runs `r`: every unit passes the old rule's model before the reload, the new rule's
/// (over every unit admitted) from its first whole window on. Returns the units
/// admitted in the new rule's whole windows checked, per window.
fn saturated(r: &Reload) -> Vec<u64> {
    let (limit, hosts) = (600u64, 3usize);
    let kind = if r.fixed {
        Kind::FixedWindow
    } else {
        Kind::SlidingWindowCounter
    };
    let mut key = Key::new(kind, limit, r.old_window, hosts);
    let mut old = model(kind, limit, r.old_window);
    let mut new = model(kind, limit, r.new_window);
    // Aligned to both windows (14 s: 1 s, 2 s and 7 s divide it).
    let t0 = 1_790_000_000_000_000u64 / 14_000_000 * 14_000_000;
    let reload = t0 + 3 * r.old_window + r.at;
    let checked_from = checked_from(r.fixed, reload, r.old_window, r.new_window);
    let end = checked_from + 4 * r.new_window;
    let mut next_call = [t0; 3];
    let mut next_spend = [t0, t0 + 97, t0 + 194];
    let mut late_until = [0u64; 3];
    let mut reloaded = false;
    let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
    let mut now = t0;
    while now < end {
        if !reloaded && now >= reload {
            reloaded = true;
            for (h, lease) in key.holders.iter_mut().enumerate() {
                late_until[h] = lease.deadline;
                if h >= r.late {
                    lease.deadline = 0;
                }
            }
        }
        for h in 0..hosts {
            if now < next_spend[h] {
                continue;
            }
            next_spend[h] = now + r.every[h];
            let leased = r.mixed && h < r.late;
            let old_rule = !reloaded || (!leased && h < r.late && now < late_until[h]);
            let window = if reloaded { r.new_window } else { r.old_window };
            let admitted = key.holders[h].spend(1, now) || {
                let lease = &key.holders[h];
                let held = lease.grant != 0 && now < lease.deadline && lease.rate > 0;
                if old_rule && reloaded {
                    false
                } else if reloaded && r.off && !leased {
                    if key.holders[h].grant != 0 {
                        key.call_in(window, h, now, 0, 0, 0);
                    }
                    key.plain(window, now, 1)
                } else if !held && now >= next_call[h] {
                    let ok = key.call_in(window, h, now, 1, 120, 200_000);
                    if key.holders[h].rate == 0 {
                        next_call[h] = now + 200_000;
                    }
                    ok
                } else {
                    false
                }
            };
            if !admitted {
                continue;
            }
            if !reloaded {
                assert_eq!(old.decide(now as f64, 1)[0], 1, "holder {h} at {now}");
            }
            let ok = new.admit(now as f64, 1);
            assert!(
                ok || old_rule || now < checked_from,
                "holder {h} admitted at {now} ({} µs into the new rule's window {}), refused by it",
                now % r.new_window,
                now / r.new_window
            );
            if now >= checked_from && !old_rule {
                *per_window.entry(now / r.new_window).or_default() += 1;
            }
        }
        now += 500;
    }
    per_window.into_values().collect()
}

/// Saturated reloads, each a way a window slice or a lease of the old window outlives
/// the windows that counted it: the new rule never admits beyond itself, and still uses
/// its windows once the old leases have ended (a sliding window counter ≥ 90 % of the
/// limit; a fixed window with a slow holder ≥ 60 %).
#[test]
fn saturated_reloads_never_admit_beyond_the_new_rule() {
    let fast = [500, 500, 500];
    let slow = [5_000, 500, 500];
    let (s, m) = (false, true);
    let cases = [
        (false, 2_000_000, 1_000_000, false, 1, 400_000, fast, 540, s),
        (false, 2_000_000, 1_000_000, false, 0, 900_000, fast, 540, s),
        (
            false, 2_000_000, 1_000_000, false, 1, 1_400_000, fast, 540, s,
        ),
        (false, 1_000_000, 2_000_000, false, 1, 500_000, fast, 540, s),
        (false, 1_000_000, 1_000_000, true, 1, 300_000, fast, 540, s),
        (false, 1_000_000, 1_000_000, true, 0, 500_000, fast, 540, s),
        (false, 1_000_000, 1_000_000, true, 1, 300_000, fast, 540, m),
        (true, 2_000_000, 1_000_000, false, 1, 300_000, slow, 360, s),
        (true, 1_000_000, 1_000_000, true, 1, 300_000, slow, 360, s),
        (true, 1_000_000, 1_000_000, true, 1, 300_000, slow, 360, m),
    ];
    for (fixed, old_window, new_window, off, late, at, every, floor, mixed) in cases {
        let r = Reload {
            fixed,
            old_window,
            new_window,
            off,
            late,
            at,
            every,
            mixed,
        };
        let used = saturated(&r);
        println!(
            "fixed {fixed}, {old_window} → {new_window} µs, off {off}, late {late} (mixed {mixed}), at {at}: {used:?}"
        );
        // The old leases have ended, counted whole, before the last two windows.
        assert!(
            used[used.len() - 2..].iter().all(|u| *u >= floor),
            "{used:?} under {floor}"
        );
    }
}
