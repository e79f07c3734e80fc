//! The per-key lease state machine, without Redis: leases taken, spent, named until
//! acknowledged and given back, the book and its sweep, a witness's calls. The slices
//! of a saturated key are tested in `tests_slices.rs`, with the helpers here.

use super::*;

pub(super) fn holder() -> Arc<str> {
    "h".into()
}

pub(super) fn slot() -> Arc<LeasedKey<()>> {
    Book::new(holder(), 100).slot(1, || ()).expect("room")
}

pub(super) fn grant(units: u64, grant: i64) -> Granted {
    Granted {
        units: units * UNIT,
        lifetime_us: LIFETIME_US,
        grant,
        ..Granted::default()
    }
}

/// What Redis reported with a grant: `remaining` units left, full in `reset_ms`.
pub(super) fn rep(remaining: u64, reset_ms: u64) -> Reported {
    Reported {
        remaining,
        reset_ms,
        wait_ms: 0,
        overridden: false,
    }
}

/// Makes `s` hot at `t` and gives it a lease of `units` as grant `g`.
fn leased(s: &Arc<LeasedKey<()>>, t: u64, units: u64, g: i64) {
    for i in 0..HOT_UNITS {
        s.spend(1, t + i, true);
    }
    let (ask, _flight) = s.begin(1, 1000, true, 0, &holder());
    s.granted(t, t, &ask, grant(units, g), rep(50, 100));
}

#[test]
fn a_cold_key_asks_without_a_lease() {
    let s = slot();
    assert_eq!(s.spend(1, 1_000_000, true), Local::Call { hot: false });
    let (ask, _flight) = s.begin(1, 100, false, 0, &holder());
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
    let (ask, flight) = s.begin(1, 1000, true, 0, &holder());
    assert!(ask.want >= UNIT && ask.want <= 1000 * UNIT, "{ask:?}");
    s.granted(t + 10, t + 10, &ask, grant(2, 7), rep(50, 100));
    drop(flight);
    assert!(matches!(s.spend(1, t + 20, true), Local::Taken { .. }));
    // After the deadline (sent + lifetime − margin), nothing is spent from it.
    let late = t + 10 + LIFETIME_US - DRIFT_MARGIN_US;
    assert!(matches!(s.spend(1, late, true), Local::Call { .. }));
    // The next call gives the lease back with its unspent unit.
    let (ask, _flight) = s.begin(1, 1000, true, 0, &holder());
    assert_eq!((ask.given_back, ask.unspent), (7, UNIT));
}

#[test]
fn a_grant_is_named_until_redis_acknowledges_its_end() {
    let s = slot();
    let t = 1_000_000;
    leased(&s, t, 10, 4);
    s.spend(3, t + 1, true);
    // A call that fails: the grant is not spent any more, and named again.
    let (ask, flight) = s.begin(1, 1000, true, 0, &holder());
    assert_eq!((ask.given_back, ask.unspent), (4, 7 * UNIT));
    drop(flight);
    assert!(matches!(s.spend(1, t + 2, true), Local::Call { hot: true }));
    let (again, _flight) = s.begin(1, 1000, true, 0, &holder());
    assert_eq!((again.given_back, again.unspent), (4, 7 * UNIT));
    // Answered: the grant ended in Redis; the new one is spent.
    s.granted(t + 3, t + 3, &again, grant(5, 9), rep(50, 100));
    assert!(matches!(s.spend(1, t + 4, true), Local::Taken { .. }));
    let (next, _flight) = s.begin(1, 1000, true, 0, &holder());
    assert_eq!((next.given_back, next.unspent), (9, 4 * UNIT));
}

#[test]
fn a_reload_stops_spending_and_still_names_the_grant() {
    let book: Book<()> = Book::new(holder(), 10);
    let s = book.slot(1, || ()).expect("room");
    let t = 1_000_000;
    leased(&s, t, 10, 3);
    s.spend(2, t + 1, true);
    // A call in flight across the reload: its lease is named, never spent.
    let (ask, flight) = s.begin(1, 1000, true, 0, &holder());
    book.retire();
    s.granted(t + 2, t + 2, &ask, grant(6, 4), rep(50, 100));
    drop(flight);
    assert!(matches!(s.spend(1, t + 3, true), Local::Call { hot: true }));
    let (next, _flight) = s.begin(1, 1000, true, 0, &holder());
    assert_eq!((next.given_back, next.unspent), (4, 6 * UNIT));
    // A lease held at a reload: not spent, named with all it had.
    s.granted(t + 4, t + 4, &next, grant(5, 5), rep(50, 100));
    book.kept(1, &s);
    book.retire();
    assert!(matches!(s.spend(1, t + 5, true), Local::Call { hot: true }));
    let (ask, _flight) = s.give_back(t + 6, &holder()).expect("retired");
    assert_eq!((ask.given_back, ask.unspent, ask.want), (5, 5 * UNIT, 0));
}

#[test]
fn a_saturated_key_asks_for_a_slice_and_is_paced_without_one() {
    let s = slot();
    let t = 1_000_000;
    s.spend(100, t, true);
    let (ask, _flight) = s.begin(1, 1000, true, t, &holder());
    s.granted(t, t, &ask, grant(1, 1), rep(0, 100));
    assert!(matches!(s.spend(1, t + 1, true), Local::Taken { .. }));
    // Saturated: the next call, at once, asks for a slice.
    assert!(matches!(s.spend(1, t + 2, true), Local::Call { hot: true }));
    let (ask, _flight) = s.begin(1, 1000, true, t + 2, &holder());
    assert_eq!((ask.pace_us, ask.lifetime_us), (PACE_US, SLICE_LIFETIME_US));
    // None to be had (other holders have the capacity): paced as Redis's wait_ms says.
    let none = Reported {
        remaining: 0,
        reset_ms: 100,
        wait_ms: 700,
        overridden: false,
    };
    s.granted(t + 2, t + 2, &ask, Granted::default(), none);
    match s.spend(1, t + 3, true) {
        Local::Paced { wait_ms, .. } => assert_eq!(wait_ms, 700),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.spend(1, t + 2 + 700_000, true),
        Local::Call { .. }
    ));
    // Redis's wait counts from when it ran the call, before the reply (here 30 ms after
    // the send): the next call comes no sooner than the reply plus the wait.
    let (ask, _flight) = s.begin(1, 1000, true, t + 800_000, &holder());
    s.granted(t + 800_000, t + 830_000, &ask, Granted::default(), none);
    assert!(matches!(
        s.spend(1, t + 1_529_999, true),
        Local::Paced { .. }
    ));
    assert!(matches!(
        s.spend(1, t + 1_530_000, true),
        Local::Call { .. }
    ));
}

#[test]
fn an_idle_or_dead_lease_is_given_back_until_acknowledged() {
    let s = slot();
    let t = 1_000_000;
    s.spend(1, t, true);
    let (ask, flight) = s.begin(1, 1000, true, 0, &holder());
    s.granted(t, t, &ask, grant(5, 3), rep(100, 100));
    drop(flight);
    assert!(s.give_back(t + 1, &holder()).is_none());
    let (back, flight) = s.give_back(t + IDLE_RETURN_US, &holder()).expect("idle");
    assert_eq!((back.given_back, back.unspent, back.want), (3, 5 * UNIT, 0));
    drop(flight);
    // The give-back failed: named again, even past the deadline.
    let (back, flight) = s.give_back(t + 2 * LIFETIME_US, &holder()).expect("named");
    assert_eq!((back.given_back, back.unspent), (3, 5 * UNIT));
    s.granted(t, t, &back, Granted::default(), rep(100, 100));
    drop(flight);
    assert!(s.give_back(t + 2 * LIFETIME_US, &holder()).is_none());
}

#[test]
fn a_call_dropped_mid_flight_is_no_longer_counted() {
    let book: Book<()> = Book::new(holder(), 10);
    let s = book.slot(1, || ()).expect("room");
    let (_ask, flight) = s.begin(1, 1000, true, 0, &holder());
    assert_eq!(book.sizes().in_flight, 1);
    drop(flight);
    assert_eq!(book.sizes().in_flight, 0);
    assert!(s.forgettable(FORGET_US + 1));
}

#[test]
fn the_book_is_bounded() {
    let book: Book<()> = Book::new(holder(), 2);
    assert!(book.slot(1, || ()).is_some());
    assert!(book.slot(2, || ()).is_some());
    assert!(book.slot(3, || ()).is_none());
    assert!(book.slot(1, || ()).is_some());
    book.sweep(FORGET_US + FORGET_EVERY_US);
    assert!(book.slot(3, || ()).is_some());
}

#[test]
fn the_sweep_sees_the_keys_that_kept_a_grant() {
    let book: Book<()> = Book::new(holder(), 10);
    let (a, b) = (
        book.slot(1, || ()).expect("room"),
        book.slot(2, || ()).expect("room"),
    );
    let t = 1_000_000;
    let (ask, flight) = a.begin(1, 1000, true, 0, &holder());
    a.granted(t, t, &ask, grant(5, 9), rep(100, 100));
    drop(flight);
    book.kept(1, &a);
    book.kept(2, &b);
    let swept = book.sweep(t);
    assert_eq!(swept.len(), 1);
    assert!(Arc::ptr_eq(&swept[0], &a));
    assert_eq!((book.sizes().held, book.sizes().units), (1, 5));
    // Idle keys holding nothing are forgotten; one whose end Redis acknowledged is.
    assert_eq!(book.len(), 2);
    let (back, flight) = a.give_back(t + IDLE_RETURN_US, &holder()).expect("idle");
    let returned = Granted {
        returned: 5 * UNIT,
        ..Granted::default()
    };
    a.granted(t, t, &back, returned, rep(100, 100));
    drop(flight);
    // Entries a request still holds are kept: these are the test's own.
    drop((a, b, swept));
    book.sweep(t + FORGET_US + FORGET_EVERY_US);
    assert_eq!(book.len(), 0);
    let sizes = book.sizes();
    assert_eq!(
        (sizes.grants, sizes.given_back, sizes.returned_units),
        (1, 1, 5)
    );
}

#[test]
fn an_entry_taken_by_a_request_is_not_forgotten_before_it_spends() {
    let book: Book<()> = Book::new(holder(), 10);
    let taken = book.slot(1, || ()).expect("room");
    // Idle by its clock (never spent), and the walk for idle keys is due.
    let later = FORGET_US + FORGET_EVERY_US;
    book.sweep(later);
    let again = book.slot(1, || ()).expect("room");
    assert!(
        Arc::ptr_eq(&taken, &again),
        "one entry per key while it is held"
    );
    let entry = Arc::downgrade(&taken);
    drop((taken, again));
    book.sweep(2 * later);
    assert!(entry.upgrade().is_none(), "forgotten once nobody holds it");
}

#[test]
fn a_witness_calls_when_due_without_giving_its_own_lease_back() {
    let s = slot();
    let t = 3_000_000;
    leased(&s, t - 100_000, 100, 4);
    // A reply that names this host the witness of another holder's lease, which it
    // could end 1.5 s before t + 2 s (its grace), and shows grant 9 (read at t).
    s.spend(1, t, true);
    let (ask, flight) = s.begin(1, 1000, true, t, &holder());
    let renewed = Granted {
        last_grant: 9,
        witness_due: t + 500_000 - WITNESS_GRACE_US,
        ..grant(100, 9)
    };
    s.granted(t, t, &ask, renewed, rep(50, 100));
    drop(flight);
    // Busy and its lease live: no call before then, then one that gives nothing back
    // and names what it read.
    let due = t + 500_000;
    s.spend(1, due - 1, true);
    assert!(s.give_back(due - 1, &holder()).is_none());
    let (call, flight) = s.give_back(due, &holder()).expect("due");
    assert_eq!((call.given_back, call.want), (0, 0));
    assert_eq!((call.seen, call.seen_at), (9, t));
    assert!(
        matches!(s.spend(1, due + 1, true), Local::Taken { .. }),
        "its own lease is still spent"
    );
    drop(flight);
    // Not due again until a reply says so.
    assert!(s.give_back(due + 100, &holder()).is_none());
}
