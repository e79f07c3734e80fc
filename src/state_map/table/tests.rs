//! The table's unit tests: the bucket's layout, the share held and evicted one for one,
//! growth that keeps every key, room to vary once full, and eviction of what is worth
//! nothing first.

use super::*;

#[test]
fn a_bucket_is_one_line_of_keys_then_the_values() {
    assert_eq!(mem::size_of::<Bucket<[u64; 4]>>(), 320);
    assert_eq!(mem::offset_of!(Bucket<[u64; 4]>, values), 64);
}

/// A key as the daemon makes it: the hash of a text tag (sequential integers hashed
/// as integers spread too evenly to show clustering).
fn tag_key(i: u64) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(3).hash_one(format!("api:k{i}"))
}

#[test]
fn a_share_of_distinct_keys_is_held_then_evicts_one_for_one() {
    for share in [1, 2, 7, 100, 4099, 19_661, 62_500] {
        let mut t: Table<u64> = Table::new(share, 64);
        assert!(t.slots() <= INITIAL_BUCKETS * WAYS, "starts small");
        for i in 0..share as u64 {
            *t.entry(tag_key(i), 0.0).value = i;
        }
        // Growth never drops a key; only the largest table, when a key finds no
        // free slot within reach of its home bucket, evicts before the share is
        // full (rarely: at most 1 % here).
        assert!(
            t.len() * 100 >= share * 99,
            "share {share}: {} held",
            t.len()
        );
        // No larger than the table its share fills to LOAD.
        assert!(
            t.slots() * LOAD.0 < share * LOAD.1 + WAYS * LOAD.0,
            "share {share}"
        );
        // Every key held has its own value.
        let held = (0..share as u64)
            .filter(|&i| match t.get_mut(tag_key(i)) {
                Some(v) => {
                    assert_eq!(*v, i, "share {share}");
                    true
                }
                None => false,
            })
            .count();
        assert_eq!(held, t.len(), "share {share}");
        for i in share as u64..3 * share as u64 {
            *t.entry(tag_key(i), 0.0).value = i;
            assert!(t.len() <= share);
        }
        assert_eq!(t.len(), share, "share {share}: full after churn");
    }
}

#[test]
fn growth_keeps_every_key() {
    // Shares whose largest table is barely above a doubling of the initial one
    // (4097 buckets after 4096): the last growth must not rehash into a table
    // barely larger at the load that triggered it. Several key sets.
    for share in [19_661, 19_700, 40_000] {
        for set in 0..8u64 {
            let key = |i: u64| {
                use std::hash::BuildHasher;
                foldhash::fast::FixedState::with_seed(set).hash_one(format!("s{set}:k{i}"))
            };
            let mut t: Table<u64> = Table::new(share, 64);
            let mut slots = t.slots();
            for i in 0..share as u64 {
                let before = t.len();
                *t.entry(key(i), 0.0).value = i;
                if t.slots() != slots {
                    slots = t.slots();
                    assert_eq!(
                        t.len(),
                        before + 1,
                        "share {share}, set {set}: lost in growth"
                    );
                }
            }
        }
    }
}

#[test]
fn buckets_keep_room_to_vary_once_the_share_is_held() {
    // A working set as large as the share but spread over the buckets unlike the
    // keys that filled it: once it has been used a few times, all of it is held but
    // what overflows full home buckets (~9 %: 6 slots, 4.8 keys on average). An
    // eviction that froze each bucket at its count when the share filled held 78 %
    // (the keys of buckets fuller than at the fill evicting each other).
    let share = 20_000;
    let mut t: Table<u64> = Table::new(share, 64);
    for i in 0..share as u64 {
        *t.entry(tag_key(i), 0.0).value = i;
    }
    let working: Vec<u64> = (0..share as u64).map(|i| tag_key(1_000_000 + i)).collect();
    for _ in 0..4 {
        for &k in &working {
            t.entry(k, 0.0);
        }
    }
    let held = working.iter().filter(|&&k| t.get_mut(k).is_some()).count();
    assert!(held * 100 >= share * 90, "{held} of {share} held");
}

#[test]
fn a_worthless_value_is_evicted_before_one_that_matters() {
    // Under the hand (the share is held, the new key's home bucket has room; tables
    // of at most LOOKAHEAD slots, so the slot is within reach) and in a full home
    // bucket alike: whatever the RRIP values, the one slot worth nothing at tick
    // 100 goes, and no record is made.
    for share in [6, 12, 19] {
        for worthless in 0..share as u64 {
            let mut t: Table<u64> = Table::new(share, 64);
            for i in 0..share as u64 {
                let slot = t.entry(tag_key(i), 0.0);
                *slot.value = i;
                // Stamps as a local bucket's: fresh again at tick 50 or at 1000.
                *slot.stamp = Stamp::new(if i == worthless { 50 } else { 1000 }, 9, 1);
            }
            // The worthless key was used last and most often: RRIP alone keeps it.
            for _ in 0..3 {
                t.entry(tag_key(worthless), 0.0);
            }
            let slot = t.entry(tag_key(1_000), 1562500.0);
            assert_eq!(
                (slot.evicted, slot.recorded(1)),
                (Evicted { fresh: 1, used: 0 }, None),
                "share {share}"
            );
            assert!(t.get_mut(tag_key(worthless)).is_none(), "share {share}");
            assert_eq!(t.len(), share);
            assert_eq!(t.sketch_bytes(), 0);
        }
    }
}

#[test]
fn a_value_evicted_while_it_matters_is_handed_back_to_its_key() {
    let mut t: Table<u64> = Table::new(100, 64);
    *t.entry(tag_key(0), 0.0).stamp = Stamp::new(5000, 255, 1);
    let mut used = 0;
    for i in 1..1000 {
        let slot = t.entry(tag_key(i), 156250.0);
        *slot.stamp = Stamp::new(20, 1, 1);
        used += slot.evicted.used;
    }
    assert!(t.get_mut(tag_key(0)).is_none(), "flooded out");
    assert_eq!(used, 900, "key 0 and 899 others");
    let back = t.entry(tag_key(0), 296875.0).recorded(1).expect("recorded");
    assert!(back.fresh_at() >= 5000 && back.drained() == 255);
}

#[test]
fn key_zero_is_a_key_like_any_other() {
    let mut t: Table<u64> = Table::new(10, 64);
    assert_eq!(t.get_mut(0), None);
    *t.entry(0, 0.0).value = 5;
    assert_eq!(t.get_mut(0).copied(), Some(5));
    assert_eq!(t.len(), 1);
}
