//! Tests of the hot-key counters: exact counts for a quiet rule, estimates for a busy one.

use super::*;

const T0: f64 = 1_700_000_000_000_000.0;

/// The hash of `key` (one seed for the whole test binary).
fn hash(key: &str) -> KeyHash {
    static TAGS: std::sync::OnceLock<crate::key::TagKey> = std::sync::OnceLock::new();
    TAGS.get_or_init(Default::default).of(b"r", key.as_bytes())
}

#[test]
fn exact_while_the_counters_suffice() {
    let k = RuleKeys::default();
    for (key, n, denies) in [("a", 5, 2), ("b", 3, 0), ("c", 9, 9)] {
        let h = hash(key);
        for i in 0..n {
            k.record(h, key.as_bytes(), i < denies, T0);
        }
    }
    let top = k.top(2, T0);
    assert_eq!(
        top,
        vec![
            HotKey {
                key: "c".into(),
                decisions: 9,
                denies: 9,
                max_error: 0
            },
            HotKey {
                key: "a".into(),
                decisions: 5,
                denies: 2,
                max_error: 0
            },
        ]
    );
}

#[test]
fn heavy_hitters_survive_a_stream_of_unique_keys_within_the_bound() {
    let k = RuleKeys::default();
    // 3,000 decisions: 1,500 unique keys, the rest on keys hot0..hot9 with weights
    // 300, 250, 200, 150, ...: interleaved.
    let weights = [300u64, 250, 200, 150, 150, 150, 100, 100, 50, 50];
    let mut hot: Vec<String> = Vec::new();
    for (i, &w) in weights.iter().enumerate() {
        hot.extend(std::iter::repeat_n(format!("hot{i}"), w as usize));
    }
    assert_eq!(hot.len(), 1500);
    let mut n = 0u64;
    for (i, key) in hot.iter().enumerate() {
        k.record(hash(key), key.as_bytes(), false, T0);
        let unique = format!("u{i}");
        k.record(hash(&unique), unique.as_bytes(), false, T0);
        n += 2;
    }
    let top = k.top(3, T0);
    let names: Vec<&str> = top.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(names, ["hot0", "hot1", "hot2"], "{top:?}");
    let bound = n / COUNTERS as u64;
    for (h, &w) in top.iter().zip(&weights) {
        assert!(h.max_error <= bound, "{h:?} bound {bound}");
        assert!(h.decisions >= w && h.decisions <= w + h.max_error, "{h:?}");
    }
    println!("max_error {} for N = {n}", top[0].max_error);
}

#[test]
fn a_late_deny_lands_on_its_key_and_old_epochs_fall_out() {
    let k = RuleKeys::default();
    k.record(hash("a"), b"a", false, T0);
    k.denied(hash("a"));
    k.denied(hash("unknown"));
    assert_eq!(k.top(10, T0)[0].denies, 1);
    // Three epochs later "a" is still in the last minute; four later it is not.
    let later = |epochs: u64| T0 + (epochs * EPOCH_MS * 1000) as f64;
    k.record(hash("b"), b"b", false, later(3));
    assert_eq!(k.top(10, later(3)).len(), 2);
    assert_eq!(k.top(10, later(4)).len(), 1);
    // A step back of the clock counts in the newest epoch.
    k.record(hash("b"), b"b", false, T0);
    assert_eq!(k.top(10, later(3))[0].decisions, 2);
    assert!(k.top(10, later(20)).is_empty());
}

#[test]
fn memory_stays_bounded_by_the_counters() {
    let k = RuleKeys::default();
    for i in 0..20_000u64 {
        let key = format!("k{i}");
        k.record(hash(&key), key.as_bytes(), i % 2 == 0, T0);
    }
    let ring = k.ring.lock().unwrap();
    let s = ring.epochs.iter().find(|s| s.id != 0).unwrap();
    assert_eq!(s.counters.len(), COUNTERS);
    assert_eq!(s.index.len(), COUNTERS);
    // Exact for the first EXACT_FIRST, then one in SAMPLE with weight SAMPLE.
    let sum = s.counters.iter().map(|c| c.count).sum::<u64>();
    assert!(sum.abs_diff(20_000) <= 4 * SAMPLE, "{sum}");
}

/// Past the exact start, a key decided a third of the time is still counted within
/// a few percent of the truth, and ranks first; the keys with one decision each
/// are counted about one in SAMPLE.
#[test]
fn a_busy_rule_is_sampled_and_its_hot_key_keeps_its_count() {
    let k = RuleKeys::default();
    let (hot, n) = (hash("hot"), 60_000u64);
    for i in 0..n {
        if i % 3 == 0 {
            k.record(hot, b"hot", i % 6 == 0, T0);
        } else {
            let key = format!("u{i}");
            k.record(hash(&key), key.as_bytes(), false, T0);
        }
    }
    let top = k.top(2, T0);
    assert_eq!(top[0].key, "hot", "{top:?}");
    let truth = n / 3;
    let off = top[0].decisions.abs_diff(truth);
    assert!(off <= truth / 20, "{:?}: off by {off} of {truth}", top[0]);
    let denies = top[0].denies.abs_diff(truth / 2);
    assert!(denies <= truth / 20, "{:?}: denies off by {denies}", top[0]);
    assert!(top[1].decisions < truth / 10, "{top:?}");
}
