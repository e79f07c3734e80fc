//! The restart's unit tests: per algorithm, a returning key is never fuller than it
//! left, and through the local buckets a drained key stays drained (a changed share, a
//! flood of used keys), keys worth nothing evict no used key, and fractional shares
//! round towards drained.

use super::*;
use crate::algorithm::{Kind, Per};
use crate::state_map::ticks_floor;

const T0: f64 = 1_700_000_000_000_000.0;
/// The sketch tag of the rule these tests decide under.
const TAG: u8 = 7;

fn params(kind: Kind, limit: u64) -> Params {
    let per = match kind {
        Kind::TokenBucket | Kind::LeakyBucket => Per::Rate(2.0),
        _ => Per::WindowMs(10_000),
    };
    Params::new(kind, limit, per, 1)
}

/// Units admitted one at a time at `now`, until the first DENY (at most 100).
fn admits(p: &Params, state: &mut Option<State>, now: f64) -> u64 {
    (0..100)
        .take_while(|_| p.decide(state, now, 1).allowed)
        .count() as u64
}

#[test]
fn every_algorithm_restarts_no_fuller_than_it_left() {
    for &kind in Kind::ALL {
        for used in 0..=10u64 {
            let p = params(kind, 10);
            let mut s: Option<State> = None;
            let mut last = None;
            for i in 0..used {
                last = Some(p.decide(&mut s, T0 + i as f64, 1));
            }
            let t_d = T0 + used as f64;
            let o = p.decide(&mut s, t_d, 0);
            let st = stamp(&o, &p, TAG, t_d);
            assert_eq!(st == Stamp::WORTHLESS, used == 0, "{kind:?} used {used}");
            if used == 0 {
                continue;
            }
            assert!(last.is_some_and(|o| o.allowed));
            // Coming back at several later instants while the record matters: the
            // restart admits no more than the evicted state would have.
            for later_ms in [0.0, 1.0, 499.0, 1500.0, 4999.0, 9999.0] {
                let now = t_d + later_ms * 1000.0;
                if !st.matters(ticks_floor(now)) {
                    continue;
                }
                let mut kept = s.clone();
                let mut back = Some(restart(&p, st, now));
                let (mut a_kept, mut a_back) =
                    (admits(&p, &mut kept, now), admits(&p, &mut back, now));
                assert!(
                    a_back <= a_kept,
                    "{kind:?} used {used} +{later_ms} ms: {a_back} > {a_kept}"
                );
                // And later on too: in total, since the restart, never more.
                for more_ms in [300.0, 2600.0, 10_001.0, 20_002.0] {
                    let t = now + more_ms * 1000.0;
                    a_kept += admits(&p, &mut kept, t);
                    a_back += admits(&p, &mut back, t);
                    assert!(
                        a_back <= a_kept,
                        "{kind:?} used {used} +{later_ms}+{more_ms} ms"
                    );
                }
            }
        }
    }
}

#[test]
fn a_drained_token_bucket_restarts_drained_and_refills_as_it_would() {
    let p = Params::new(Kind::TokenBucket, 5, Per::Rate(0.01), 1);
    let mut s = None;
    assert_eq!(admits(&p, &mut s, T0), 5);
    let o = p.decide(&mut s, T0, 0);
    let st = stamp(&o, &p, TAG, T0);
    assert_eq!(st.drained(), 255);
    let now = T0 + 10e6; // 10 s later: 0.1 token refilled
    let mut back = Some(restart(&p, st, now));
    let d = p.decide(&mut back, now, 1);
    assert_eq!((d.allowed, d.remaining), (false, 0));
    // One token used of 5: comes back with 4 (not fewer: the record is exact).
    let mut s = None;
    p.decide(&mut s, T0, 1);
    let st = stamp(&p.decide(&mut s, T0, 0), &p, TAG, T0);
    assert_eq!(st.drained(), 51);
    let mut back = Some(restart(&p, st, T0 + 1000.0));
    assert_eq!(p.decide(&mut back, T0 + 1000.0, 1).remaining, 3);
}

/// Keys as the daemon makes them.
fn key(i: u64) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(5).hash_one(i)
}

/// The share changes while the drained key is away (a reload, or another daemon
/// counted by `fallback.hosts = "auto"`): the record is the rule's, not the
/// share's, so the key comes back as drained a fraction of the new share as it left
/// the old one, not with a full new share.
#[test]
fn a_drained_key_stays_drained_when_the_share_changes_while_evicted() {
    use crate::fallback::LocalBuckets;
    for &kind in Kind::ALL {
        // The rule's limit 10: shared by 2 hosts, then by 1 (capacity and rate, or
        // limit, scale together).
        let per = match kind {
            Kind::TokenBucket | Kind::LeakyBucket => Per::Rate(2.0),
            _ => Per::WindowMs(10_000),
        };
        let (old, new) = (Params::new(kind, 10, per, 2), Params::new(kind, 10, per, 1));
        let local = LocalBuckets::new(1000);
        let drained = key(u64::MAX);
        let admitted = (0..10)
            .filter(|_| local.decide(drained, 5, &old, TAG, 1, T0).allowed)
            .count();
        assert_eq!(admitted, 5, "{kind:?}");
        for i in 0..100_000 {
            let now = T0 + i as f64;
            assert!(
                local.decide(key(i), 10, &new, TAG, 1, now).allowed,
                "{kind:?}"
            );
        }
        let now = T0 + 100_000.0;
        let d = local.decide(drained, 10, &new, TAG, 0, now);
        assert!(local.len() <= 1000);
        // It keeps the fraction of its share it had (none, plus what 0.1 s
        // refills); a full share would be 10.
        assert!(d.remaining <= 1, "{kind:?}: came back with {}", d.remaining);
        // Under another rule's tag the record does not match: a full share.
        let other = local.decide(drained ^ 1, 10, &new, TAG + 1, 0, now);
        assert_eq!(other.remaining, 10, "{kind:?}");
    }
}

#[test]
fn a_drained_key_stays_drained_through_a_flood_of_used_keys() {
    use crate::fallback::LocalBuckets;
    for &kind in Kind::ALL {
        let p = params(kind, 5);
        let local = LocalBuckets::new(1000);
        let drained = key(u64::MAX);
        let admitted = (0..10)
            .filter(|_| local.decide(drained, 5, &p, TAG, 1, T0).allowed)
            .count();
        assert_eq!(admitted, 5, "{kind:?}");
        // 100,000 new keys each take a unit (their state matters for seconds): the
        // drained key is evicted, recorded, and comes back drained.
        for i in 0..100_000 {
            let now = T0 + i as f64;
            assert!(local.decide(key(i), 5, &p, TAG, 1, now).allowed, "{kind:?}");
        }
        let now = T0 + 100_000.0;
        assert!(local.len() <= 1000);
        let d = local.decide(drained, 5, &p, TAG, 1, now);
        assert_eq!((d.allowed, d.remaining), (false, 0), "{kind:?}");
        assert!(
            local.buckets.sketch_bytes() > 0,
            "{kind:?}: nothing recorded"
        );
    }
}

#[test]
fn a_flood_of_keys_worth_nothing_evicts_no_used_key() {
    use crate::fallback::LocalBuckets;
    for &kind in Kind::ALL {
        let p = params(kind, 5);
        let local = LocalBuckets::new(1000);
        let used: Vec<u64> = (0..500).map(|i| key(1 << 40 | i)).collect();
        for &k in &used {
            assert!(local.decide(k, 5, &p, TAG, 1, T0).allowed);
        }
        // Cost-0 requests of new keys: their states equal a new key's.
        for i in 0..100_000 {
            let d = local.decide(key(i), 5, &p, TAG, 0, T0 + 1.0);
            assert_eq!((d.allowed, d.remaining), (true, 5), "{kind:?}");
        }
        assert_eq!(
            local.buckets.sketch_bytes(),
            0,
            "{kind:?}: a used key was evicted"
        );
        for &k in &used {
            let d = local.decide(k, 5, &p, TAG, 0, T0 + 2.0);
            assert_eq!(d.remaining, 4, "{kind:?}");
        }
    }
}

#[test]
fn fractional_shares_round_towards_drained() {
    // 10 shared by 3 hosts: 3.33 units; 1 remaining of it.
    let q = drained(10.0 / 3.0, 1);
    assert!(f64::from(q) / 255.0 >= (10.0 / 3.0 - 1.0) / (10.0 / 3.0));
    assert!(window_count(q, 10.0 / 3.0) >= 10.0 / 3.0 - 1.0);
    assert_eq!((drained(5.0, 4), window_count(51, 5.0)), (51, 1.0));
    assert_eq!((drained(5.0, 5), drained(0.75, 0)), (0, 255));
}
