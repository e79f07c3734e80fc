//! The per-key lease state machine's slices, without Redis: the leases of a saturated
//! key that refill at a rate up to a cap until their deadline (a window's slice until its
//! window ends), what they report when given back, and their early renewal once the
//! demand outgrew them. The helpers are the lease tests' own (`tests.rs`).

use super::tests::{grant, holder, rep, slot};
use super::*;

#[test]
fn a_slice_refills_at_its_rate_up_to_its_cap_until_its_deadline() {
    let s = slot();
    let t = 1_000_000;
    for i in 0..HOT_UNITS {
        s.spend(1, t + i, true);
    }
    let (ask, flight) = s.begin(1, 1000, true, t, &holder());
    let slice = Granted {
        units: 0,
        lifetime_us: LIFETIME_US,
        grant: 3,
        returned: 0,
        cap: 4 * UNIT,
        rate: 1000 * UNIT,
        last_grant: 3,
        witness_due: 0,
    };
    // Answered 100 µs after it was sent: the refill counts from then.
    s.granted(t, t + 100, &ask, slice, rep(0, 10));
    drop(flight);
    match s.spend(1, t + 100, true) {
        Local::Paced { wait_ms, .. } => assert_eq!(wait_ms, 1),
        other => panic!("{other:?}"),
    }
    assert!(matches!(s.spend(1, t + 1100, true), Local::Taken { .. }));
    assert!(matches!(s.spend(1, t + 1100, true), Local::Paced { .. }));
    // Idle a while: it holds at most its cap.
    for _ in 0..4 {
        assert!(matches!(s.spend(1, t + 100_000, true), Local::Taken { .. }));
    }
    assert!(matches!(s.spend(1, t + 100_000, true), Local::Paced { .. }));
    // Near its deadline a request renews it; the refill until the call is reported.
    let deadline = t + LIFETIME_US - DRIFT_MARGIN_US - SLICE_SPARE_US;
    let near = deadline - SLICE_RENEW_US / 2;
    for _ in 0..4 {
        assert!(matches!(s.spend(1, near, true), Local::Taken { .. }));
    }
    assert!(matches!(s.spend(1, near, true), Local::Call { hot: true }));
    let (back, _flight) = s.begin(1, 1000, true, near + 500, &holder());
    assert_eq!((back.given_back, back.unspent), (3, UNIT / 2));
    assert_eq!(back.pace_us, PACE_US, "a slice's next lease is a slice");
}

#[test]
fn a_window_slice_is_spent_until_its_window_ends_and_not_renewed() {
    let s = slot();
    let t = 1_000_000;
    s.spend(1, t, true);
    let (ask, flight) = s.begin(1, 1000, true, t, &holder());
    // Cut short by its window's end: 300 ms of the lifetime asked, 1 unit every 5 ms.
    let life = 300_000;
    let slice = Granted {
        units: UNIT,
        lifetime_us: life,
        grant: 7,
        returned: 0,
        cap: 61 * UNIT,
        rate: 200 * UNIT,
        last_grant: 7,
        witness_due: 0,
    };
    s.granted(t, t, &ask, slice, rep(0, 10));
    drop(flight);
    assert!(matches!(s.spend(1, t, true), Local::Taken { .. }));
    // Spent until WINDOW_SPARE_US before its lifetime (less the drift margin): named
    // back before its window ends in Redis.
    let deadline = t + life - (1000 + life / 1000) - WINDOW_SPARE_US;
    // Short near its deadline: DENY from the slice until it holds the cost, no call.
    let near = deadline - SLICE_RENEW_US / 2;
    while matches!(s.spend(1, near, true), Local::Taken { .. }) {}
    match s.spend(1, near, true) {
        Local::Paced { wait_ms, .. } => assert!((1..=5).contains(&wait_ms), "{wait_ms}"),
        other => panic!("{other:?}"),
    }
    // Its window over, the next request calls, for a slice.
    assert!(matches!(
        s.spend(1, deadline, true),
        Local::Call { hot: true }
    ));
    let (next, _flight) = s.begin(1, 1000, true, deadline, &holder());
    assert_eq!((next.given_back, next.pace_us), (7, PACE_US));
    // Named back with when its call was sent and answered, and the spare.
    assert_eq!(
        (next.grant_sent_us, next.grant_got_us, next.spare_us),
        (t, t, WINDOW_SPARE_US)
    );
}

#[test]
fn a_slice_reports_its_refill_until_the_call_and_none_after_its_deadline() {
    let s = slot();
    let t = 1_000_000;
    s.spend(1, t, true);
    let (ask, flight) = s.begin(1, 1000, true, t, &holder());
    let slice = Granted {
        units: 0,
        lifetime_us: LIFETIME_US,
        grant: 5,
        returned: 0,
        cap: 1000 * UNIT,
        rate: 1000 * UNIT,
        last_grant: 5,
        witness_due: 0,
    };
    s.granted(t, t, &ask, slice, rep(0, 10));
    drop(flight);
    let deadline = t + LIFETIME_US - DRIFT_MARGIN_US - SLICE_SPARE_US;
    // Past the deadline: what it refilled until the deadline only.
    let (back, _flight) = s.give_back(deadline + 500_000, &holder()).expect("ended");
    assert_eq!(back.given_back, 5);
    assert_eq!(back.unspent, (deadline - t) * 1000 * UNIT / 1_000_000);
}

/// A slice sized by the demand its call reported (its rate at least the rate asked) is
/// renewed, for the demand of now, once the demand has doubled and [`OUTGROWN_US`] has
/// passed since its grant; a slice its share capped (a rate below the one asked) is not,
/// nor is any slice sooner.
#[test]
fn a_slice_the_demand_outgrew_is_renewed_early_and_a_capped_one_is_not() {
    for demand_sized in [true, false] {
        let s = slot();
        let t = 1_000_000;
        for i in 0..HOT_UNITS {
            s.spend(1, t + i, true);
        }
        // Saturated: a lump lease of less than asked, with nothing left in Redis.
        let (ask, flight) = s.begin(1, 1000, true, t, &holder());
        s.granted(t, t + 100, &ask, grant(1, 2), rep(0, 10));
        drop(flight);
        // Its next call, once paced, asks for a slice.
        let t2 = t + PACE_US;
        assert!(matches!(s.spend(1, t2, true), Local::Taken { .. }));
        assert!(matches!(s.spend(1, t2, true), Local::Call { hot: true }));
        let (ask, flight) = s.begin(1, 1000, true, t2, &holder());
        assert_eq!(ask.pace_us, PACE_US);
        let asked = ask.want * 1_000_000 / PACE_US;
        let slice = Granted {
            units: 0,
            lifetime_us: SLICE_LIFETIME_US,
            grant: 3,
            cap: UNIT,
            rate: if demand_sized { asked } else { asked / 2 },
            last_grant: 3,
            ..Granted::default()
        };
        s.granted(t2, t2 + 100, &ask, slice, rep(0, 10));
        drop(flight);
        // The demand is many times the slice's rate from here on.
        let burst = |at: u64| (0..50).map(|_| s.spend(1, at, true)).collect::<Vec<_>>();
        let calls = |r: &[Local]| r.iter().filter(|l| matches!(l, Local::Call { .. })).count();
        assert_eq!(
            calls(&burst(t2 + OUTGROWN_US / 2)),
            0,
            "not before OUTGROWN_US"
        );
        let later = burst(t2 + 100 + OUTGROWN_US);
        assert_eq!(calls(&later) > 0, demand_sized, "{later:?}");
        if demand_sized {
            let (again, _flight) = s.begin(1, 1000, true, t2 + 100 + OUTGROWN_US, &holder());
            assert_eq!(again.given_back, 3, "the slice is given back");
            assert!(
                again.want > ask.want,
                "asked for the demand of now: {again:?}"
            );
        }
    }
}
