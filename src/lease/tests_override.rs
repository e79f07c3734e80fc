//! The per-key lease state under a run-time override (`OVERRIDE`), without Redis: a key
//! Redis decided under one is decided per request, its lease given back, never paced,
//! until a reply without the override.

use super::*;

fn holder() -> Arc<str> {
    "h".into()
}

/// What Redis reported: `remaining` units left, `wait_ms` on a DENY, and whether it
/// decided under a run-time override.
fn said(remaining: u64, wait_ms: u64, overridden: bool) -> Reported {
    Reported {
        remaining,
        reset_ms: 100,
        wait_ms,
        overridden,
    }
}

/// A hot key of a book holding a lease of `units` as grant `g`, granted at `t`.
fn leased(book: &Book<()>, t: u64, units: u64, g: i64) -> Arc<LeasedKey<()>> {
    let s = book.slot(1, || ()).expect("room");
    for i in 0..HOT_UNITS {
        s.spend(1, t + i, true);
    }
    let (ask, _flight) = s.begin(1, 1000, true, t, &holder());
    let lease = Granted {
        units: units * UNIT,
        lifetime_us: LIFETIME_US,
        grant: g,
        ..Granted::default()
    };
    s.granted(t, t, &ask, lease, said(50, 0, false));
    book.kept(1, &s);
    s
}

/// A request's per-request call (a cold key's: nothing given back, nothing asked) sent
/// at `sent`, answered with `reported`.
fn per_request(s: &Arc<LeasedKey<()>>, sent: u64, reported: Reported) {
    let (ask, _flight) = s.begin(0, 0, false, sent, &holder());
    assert_eq!((ask.want, ask.given_back), (0, 0));
    s.granted(sent, sent + 1, &ask, Granted::default(), reported);
}

#[test]
fn an_overridden_key_is_decided_per_request_and_gives_its_lease_back() {
    let book = Book::new(holder(), 10);
    let t = 1_000_000;
    let s = leased(&book, t, 10, 4);
    assert!(matches!(s.spend(3, t + 10, true), Local::Taken { .. }));
    // A hot call finds the override: Redis granted nothing, and said so.
    let (ask, flight) = s.begin(1, 1000, true, t + 20, &holder());
    assert_eq!((ask.given_back, ask.unspent), (4, 7 * UNIT));
    let back = Granted {
        returned: 7 * UNIT,
        ..Granted::default()
    };
    s.granted(t + 20, t + 21, &ask, back, said(5, 0, true));
    drop(flight);
    // Hot as it is, every request now asks Redis, one call each, at once.
    for i in 0..20 {
        assert_eq!(
            s.spend(1, t + 30 + i, true),
            Local::Call { hot: false },
            "{i}"
        );
    }
    assert_eq!(s.held(), (0, 0));
    // Still overridden: a hot call (a request that waited for one) asks for nothing.
    let (ask, _flight) = s.begin(1, 1000, true, t + 60, &holder());
    assert_eq!((ask.want, ask.pace_us, ask.given_back), (0, 0, 0));
}

#[test]
fn a_lease_held_when_the_override_is_seen_is_not_spent_and_is_given_back() {
    let book = Book::new(holder(), 10);
    let t = 1_000_000;
    let s = leased(&book, t, 10, 6);
    s.spend(2, t + 10, true);
    // A per-request reply (another request's) says the key is overridden.
    per_request(&s, t + 20, said(3, 0, true));
    assert_eq!(s.spend(1, t + 30, true), Local::Call { hot: false });
    // The sweep names the grant at once, with all it had left: nothing more was spent.
    let swept = book.sweep(t + 40);
    assert_eq!(swept.len(), 1);
    let (ask, _flight) = swept[0].give_back(t + 40, &holder()).expect("given back");
    assert_eq!((ask.given_back, ask.unspent, ask.want), (6, 8 * UNIT, 0));
    s.granted(t + 40, t + 41, &ask, Granted::default(), said(3, 0, true));
    assert_eq!(s.held(), (0, 0));
}

#[test]
fn an_overridden_key_is_never_paced() {
    let book = Book::new(holder(), 10);
    let t = 1_000_000;
    let s = book.slot(1, || ()).expect("room");
    s.spend(100, t, true);
    // Saturated (less granted than asked, less left), then paced without a slice.
    let (ask, _flight) = s.begin(1, 1000, true, t, &holder());
    let one = Granted {
        units: UNIT,
        lifetime_us: LIFETIME_US,
        grant: 1,
        ..Granted::default()
    };
    s.granted(t, t, &ask, one, said(0, 0, false));
    assert!(matches!(s.spend(1, t + 1, true), Local::Taken { .. }));
    let (ask, _flight) = s.begin(1, 1000, true, t + 2, &holder());
    assert_eq!(ask.pace_us, PACE_US);
    s.granted(t + 2, t + 2, &ask, Granted::default(), said(0, 700, false));
    assert!(matches!(s.spend(1, t + 3, true), Local::Paced { .. }));
    // A paced key that learns of an override asks Redis for every request.
    per_request(&s, t + 4, said(0, 700, true));
    assert_eq!(s.spend(1, t + 5, true), Local::Call { hot: false });
    // Also when a saturated call of its own is told.
    let (ask, _flight) = s.begin(1, 1000, true, t + 6, &holder());
    assert_eq!((ask.want, ask.pace_us), (0, 0));
    s.granted(t + 6, t + 7, &ask, Granted::default(), said(0, 700, true));
    assert_eq!(s.spend(1, t + 8, true), Local::Call { hot: false });
}

#[test]
fn a_reply_without_the_override_makes_the_key_leasable_again() {
    let book = Book::new(holder(), 10);
    let t = 1_000_000;
    let s = leased(&book, t, 10, 2);
    per_request(&s, t + 100, said(3, 0, true));
    assert_eq!(s.spend(1, t + 110, true), Local::Call { hot: false });
    // An answer to a call sent before the one that told of the override does not
    // undo it.
    per_request(&s, t + 50, said(3, 0, false));
    assert_eq!(s.spend(1, t + 120, true), Local::Call { hot: false });
    // One sent after it, without the override (cleared, or lapsed): hot again.
    per_request(&s, t + 130, said(3, 0, false));
    assert_eq!(s.spend(1, t + 140, true), Local::Call { hot: true });
}

#[test]
fn the_daemon_that_sets_an_override_stops_spending_at_once() {
    let book = Book::new(holder(), 10);
    let t = 1_000_000;
    let s = leased(&book, t, 10, 9);
    book.told(1, true, t + 10);
    assert_eq!(s.spend(1, t + 11, true), Local::Call { hot: false });
    assert_eq!(s.held(), (1, 10));
    // A reply to a call sent before it was set does not undo it; a clear does.
    per_request(&s, t + 5, said(3, 0, false));
    assert_eq!(s.spend(1, t + 12, true), Local::Call { hot: false });
    book.told(1, false, t + 20);
    assert_eq!(s.spend(1, t + 21, true), Local::Call { hot: true });
    // A key not in the book: nothing to tell.
    book.told(2, true, t + 30);
}
