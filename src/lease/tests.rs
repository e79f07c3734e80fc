//! The per-key lease state machine, without Redis.

use super::*;

fn holder() -> Arc<str> {
    "h".into()
}

fn slot() -> Arc<LeasedKey<()>> {
    Book::new(holder()).slot(1, || ())
}

#[test]
fn a_cold_key_asks_without_a_lease() {
    let s = slot();
    assert_eq!(s.spend(1, 1_000_000, true), Local::Call { hot: false });
    let ask = s.begin(1, 100, false, &holder());
    assert_eq!((ask.want, ask.given_back), (0, 0));
}

#[test]
fn a_busy_key_takes_a_lease_and_spends_it_until_its_deadline() {
    let s = slot();
    let t = 1_000_000;
    for i in 0..HOT_UNITS {
        s.spend(1, t + i, true);
    }
    assert_eq!(s.spend(1, t + 10, true), Local::Call { hot: true });
    let ask = s.begin(1, 1000, true, &holder());
    assert!(ask.want >= 1 && ask.want <= 1000, "{ask:?}");
    let g = Granted {
        units: 2,
        lifetime_us: LIFETIME_US,
        grant: 7,
    };
    s.granted(t + 10, &ask, g, 50, 100);
    assert!(matches!(s.spend(1, t + 20, true), Local::Taken { .. }));
    // After the deadline (sent + lifetime − margin), nothing is spent from it.
    let late = t + 10 + LIFETIME_US - DRIFT_MARGIN_US;
    assert!(matches!(s.spend(1, late, true), Local::Call { .. }));
    // The next call gives the lease back with its unspent unit.
    let ask = s.begin(1, 1000, true, &holder());
    assert_eq!((ask.given_back, ask.unspent), (7, 1));
}

#[test]
fn a_saturated_key_is_paced() {
    let s = slot();
    let t = 1_000_000;
    s.spend(100, t, true);
    let ask = s.begin(1, 1000, true, &holder());
    let g = Granted {
        units: 1,
        lifetime_us: LIFETIME_US,
        grant: 1,
    };
    s.granted(t, &ask, g, 0, 100);
    assert!(matches!(s.spend(1, t + 1, true), Local::Taken { .. }));
    match s.spend(1, t + 2, true) {
        Local::Paced { wait_ms, .. } => assert!((1..=PACE_US / 1000).contains(&wait_ms)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(s.spend(1, t + PACE_US, true), Local::Call { .. }));
    assert_eq!(s.begin(1, 1000, true, &holder()).pace_us, PACE_US);
}

#[test]
fn an_idle_lease_is_given_back_and_a_dead_one_dropped() {
    let s = slot();
    let t = 1_000_000;
    s.spend(1, t, true);
    let ask = s.begin(1, 1000, true, &holder());
    let g = Granted {
        units: 5,
        lifetime_us: LIFETIME_US,
        grant: 3,
    };
    s.granted(t, &ask, g, 100, 100);
    assert_eq!(s.give_back(t + 1, &holder()), None);
    let back = s.give_back(t + IDLE_RETURN_US, &holder()).expect("idle");
    assert_eq!((back.given_back, back.unspent, back.want), (3, 5, 0));
    s.granted(t, &ask, g, 100, 100);
    assert_eq!(s.give_back(t + 2 * LIFETIME_US, &holder()), None);
    assert!(matches!(
        s.spend(1, t + 2 * LIFETIME_US, true),
        Local::Call { .. }
    ));
}

#[test]
fn the_sweep_sees_the_keys_that_kept_a_lease() {
    let book: Book<()> = Book::new(holder());
    let (a, b) = (book.slot(1, || ()), book.slot(2, || ()));
    let t = 1_000_000;
    let ask = a.begin(1, 1000, true, &holder());
    let g = Granted {
        units: 5,
        lifetime_us: LIFETIME_US,
        grant: 9,
    };
    a.granted(t, &ask, g, 100, 100);
    book.kept(1, &a);
    book.kept(2, &b);
    let swept = book.sweep(t);
    assert_eq!(swept.len(), 1);
    assert!(Arc::ptr_eq(&swept[0], &a));
    // Idle keys holding nothing are forgotten.
    assert_eq!(book.len(), 2);
    a.give_back(t + IDLE_RETURN_US, &holder()).expect("idle");
    a.failed();
    book.sweep(t + FORGET_US + FORGET_EVERY_US);
    assert_eq!(book.len(), 0);
}
