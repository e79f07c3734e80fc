//! A forward jump of Redis's clock across a window's end, against the reference model
//! (docs/DESIGN.md "Leases", "Deadlines on the holder"): saturated holders take window
//! leases from the lease scripts in a real Redis (explicit timestamps), spend them on
//! their own clock as a daemon does, and Redis's clock jumps ahead of theirs while the
//! leases are out. Every unit admitted must pass the model of one client deciding every
//! request at Redis's time of it: a lease spent past its window's end on Redis's clock is
//! counted in the window it was spent in. A holder that dies at the jump leaves its lease
//! to a witness (the other holders' calls name their clock and the grants they read).

use crate::reference::{Algo, Model};
use crate::twin_leases::Key;
use ratelimitd::algorithm::Kind;

/// A run: `fixed` or a sliding window counter, limit 600 per 1 s, three holders spending
/// a unit every `every[h]` µs while their lease holds one; Redis's clock jumps `jump` µs
/// ahead `at` µs into the fourth window; holder 2 stops at the jump when `dies`; holder 0
/// names its lease back `late` µs after its deadline (a daemon slow to call).
struct Jump {
    fixed: bool,
    jump: u64,
    at: u64,
    every: [u64; 3],
    dies: bool,
    late: u64,
}

/// Runs `j`; every unit passes the model at Redis's time. Returns the units admitted in
/// each window of Redis's clock from the third after the jump on.
fn run(j: &Jump) -> Vec<u64> {
    let (limit, window) = (600u64, 1_000_000u64);
    let kind = if j.fixed {
        Kind::FixedWindow
    } else {
        Kind::SlidingWindowCounter
    };
    let mut key = Key::new(kind, limit, window, 3);
    let mut m = Model::new(if j.fixed {
        Algo::FixedWindow {
            limit: limit as f64,
            window: window as f64,
        }
    } else {
        Algo::SlidingWindowCounter {
            limit: limit as f64,
            window: window as f64,
        }
    });
    let t0 = 1_790_000_000_000_000u64 / window * window;
    let jump_at = t0 + 3 * window + j.at;
    let counted_from = (jump_at + j.jump) / window + 3;
    let end = (counted_from + 3) * window - j.jump;
    let mut next_call = [t0; 3];
    let mut next_spend = [t0, t0 + 97, t0 + 194];
    let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
    let mut now = t0;
    while now < end {
        if now >= jump_at {
            key.ahead = j.jump;
        }
        for h in 0..3 {
            if now < next_spend[h] || (j.dies && h == 2 && now >= jump_at) {
                continue;
            }
            next_spend[h] = now + j.every[h];
            let admitted = key.holders[h].spend(1, now) || {
                let lease = &key.holders[h];
                let held = lease.grant != 0 && now < lease.deadline && lease.rate > 0;
                // Holder 0, slow: no call for `late` after its lease's deadline.
                let stalled = h == 0 && lease.grant != 0 && now >= lease.deadline;
                let stalled = stalled && now < lease.deadline + j.late;
                if !held && !stalled && now >= next_call[h] {
                    let ok = key.call(h, now, 1, 120, 200_000);
                    if key.holders[h].rate == 0 {
                        next_call[h] = now + 200_000;
                    }
                    ok
                } else {
                    false
                }
            };
            if admitted {
                let redis_now = now + key.ahead;
                assert_eq!(
                    m.decide(redis_now as f64, 1)[0],
                    1,
                    "holder {h} at {} µs of Redis's window {} ({} µs after the jump)",
                    redis_now % window,
                    redis_now / window,
                    now.saturating_sub(jump_at)
                );
                if redis_now / window >= counted_from {
                    *per_window.entry(redis_now / window).or_default() += 1;
                }
            }
        }
        now += 500;
    }
    per_window.into_values().collect()
}

/// Jumps of 0.95 s and 5 s, 0.1 s and 0.5 s into a window, with holders that spend a
/// fixed window's share over most of the window, one that dies at the jump, one that
/// names its lease back 80 ms late (and no jump): the model admits every unit, and each
/// window from the third after the jump is used (at least 90 % of the limit; two
/// holders left: at least 60 %).
#[test]
fn a_forward_jump_across_a_window_end_admits_no_unit_the_model_refuses() {
    let (fast, slow) = ([500, 500, 500], [4_000, 4_000, 4_000]);
    let cases = [
        (false, 950_000, 100_000, fast, false, 0),
        (false, 5_000_000, 500_000, fast, false, 0),
        (false, 950_000, 100_000, fast, true, 0),
        (false, 0, 0, fast, false, 80_000),
        (false, 950_000, 100_000, fast, false, 80_000),
        (true, 950_000, 100_000, slow, false, 0),
        (true, 5_000_000, 500_000, slow, false, 0),
        (true, 950_000, 100_000, slow, true, 0),
        (true, 0, 0, slow, false, 80_000),
    ];
    for (fixed, jump, at, every, dies, late) in cases {
        let used = run(&Jump {
            fixed,
            jump,
            at,
            every,
            dies,
            late,
        });
        println!("fixed {fixed}, jump {jump} µs at {at} µs, dies {dies}, late {late} µs: {used:?}");
        let floor = if dies { 360 } else { 540 };
        assert!(used.iter().all(|u| *u >= floor), "{used:?} under {floor}");
    }
}
