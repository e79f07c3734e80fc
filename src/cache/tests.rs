//! The deny cache's behaviour: what it answers, for how long, and its refresh claims.

use super::*;
use crate::key::TagKey;

const T0: f64 = 1_700_000_000_000_000.0;

/// The key of `tag`, with one hasher for the whole test module.
fn k(tag: &str) -> KeyHash {
    static KEYS: std::sync::OnceLock<TagKey> = std::sync::OnceLock::new();
    let (rule, key) = tag.split_once(':').unwrap_or(("", tag));
    KEYS.get_or_init(TagKey::default)
        .of(rule.as_bytes(), key.as_bytes())
}

fn deny(wait_ms: u64) -> Decision {
    Decision {
        allowed: false,
        limit: 10,
        remaining: 0,
        reset_ms: 1000,
        wait_ms,
        source: Source::Redis,
    }
}

fn hit(l: Lookup) -> Decision {
    match l {
        Lookup::Hit(d) => d,
        other => panic!("expected a hit, got {other:?}"),
    }
}

/// The cached answer a refresh claim carries.
fn refresh(l: Lookup) -> Decision {
    match l {
        Lookup::Refresh(d) => d,
        other => panic!("expected a refresh claim, got {other:?}"),
    }
}

#[test]
fn remembers_denies_of_the_same_cost_only() {
    let c = DenyCache::new(500, 100, 50);
    c.remember(k("r:k"), 2, &deny(300), T0, 0, false);
    let h = hit(c.lookup(k("r:k"), 2, T0 + 100_000.0));
    assert_eq!(h.source, Source::Cache);
    assert_eq!((h.allowed, h.wait_ms, h.reset_ms), (false, 200, 900));
    assert_eq!(c.lookup(k("r:k"), 1, T0), Lookup::Miss);
    assert_eq!(c.lookup(k("r:other"), 2, T0), Lookup::Miss);
    // A clock stepping back: no time passed.
    assert_eq!(hit(c.lookup(k("r:k"), 2, T0 - 5e6)).wait_ms, 300);
}

#[test]
fn never_caches_allow_and_expires_with_wait() {
    let c = DenyCache::new(500, 100, 50);
    c.remember(
        k("r:a"),
        1,
        &Decision {
            allowed: true,
            ..deny(0)
        },
        T0,
        0,
        false,
    );
    assert_eq!(c.lookup(k("r:a"), 1, T0), Lookup::Miss);
    c.remember(k("r:b"), 1, &deny(20), T0, 0, false);
    hit(c.lookup(k("r:b"), 1, T0 + 19_999.0));
    // Past wait_ms: no refresh grace either (Redis may admit it now).
    assert_eq!(
        c.lookup(k("r:b"), 1, T0 + 20_000.0),
        Lookup::Miss,
        "kept past wait_ms"
    );
}

#[test]
fn one_request_refreshes_an_expired_entry_while_the_others_keep_it() {
    let c = DenyCache::new(500, 100, 50);
    c.remember(k("r:k"), 1, &deny(10_000), T0, 0, false);
    let t = T0 + 500_000.0;
    // The claimant is answered from the entry too, its wait reduced.
    let claimed = refresh(c.lookup(k("r:k"), 1, t));
    assert_eq!(
        (claimed.allowed, claimed.wait_ms, claimed.source),
        (false, 9_500, Source::Cache)
    );
    // The others: the cached DENY, for the grace (50 ms) and no longer.
    hit(c.lookup(k("r:k"), 1, t + 1_000.0));
    hit(c.lookup(k("r:k"), 1, t + 49_999.0));
    assert_eq!(c.lookup(k("r:k"), 1, t + 50_000.0), Lookup::Miss);
    // The refresh came back DENY: fresh again, for ttl_ms from its own asking.
    c.remember(k("r:k"), 1, &deny(9_000), t, 0, true);
    hit(c.lookup(k("r:k"), 1, t + 499_999.0));
    refresh(c.lookup(k("r:k"), 1, t + 500_000.0));
    // ... then ALLOW: the claimed entry goes at once.
    c.remember(
        k("r:k"),
        1,
        &Decision {
            allowed: true,
            ..deny(0)
        },
        t + 500_000.0,
        0,
        true,
    );
    assert_eq!(c.lookup(k("r:k"), 1, t + 500_001.0), Lookup::Miss);
}

#[test]
fn the_grace_ends_at_wait_and_counts_from_the_ttl() {
    let c = DenyCache::new(500, 100, 50);
    c.remember(k("r:k"), 1, &deny(520), T0, 0, false);
    c.remember(k("r:idle"), 1, &deny(10_000), T0, 0, false);
    refresh(c.lookup(k("r:k"), 1, T0 + 500_000.0));
    hit(c.lookup(k("r:k"), 1, T0 + 519_999.0));
    assert_eq!(c.lookup(k("r:k"), 1, T0 + 520_000.0), Lookup::Miss);
    // Not asked again until 5 s later: long past ttl + grace, Redis is asked.
    assert_eq!(c.lookup(k("r:idle"), 1, T0 + 5e6), Lookup::Miss);
}

#[test]
fn a_clear_forgets_entries_and_answers_still_in_flight() {
    let c = DenyCache::new(500, 100, 50);
    let before = c.generation();
    c.remember(k("r:a"), 1, &deny(300), T0, before, false);
    c.clear();
    assert_eq!(c.lookup(k("r:a"), 1, T0), Lookup::Miss);
    // An answer asked for before the clear is not remembered after it.
    c.remember(k("r:b"), 1, &deny(300), T0, before, false);
    assert_eq!(c.lookup(k("r:b"), 1, T0), Lookup::Miss);
    c.remember(k("r:b"), 1, &deny(300), T0, c.generation(), false);
    hit(c.lookup(k("r:b"), 1, T0));
}

#[test]
fn ttl_zero_disables() {
    let c = DenyCache::new(0, 100, 50);
    c.remember(k("r:k"), 1, &deny(300), T0, 0, false);
    assert_eq!(c.lookup(k("r:k"), 1, T0), Lookup::Miss);
}

#[test]
fn keys_sharing_a_page_keep_their_own_entries() {
    // Room for 8 DENYs: one page holds every key.
    let c = DenyCache::new(500, 8, 50);
    let key = |i: u64| k(&format!("r:{i}"));
    for i in 0..8 {
        c.remember(key(i), 1, &deny(300 + i), T0, 0, false);
    }
    assert_eq!(c.len(), 8);
    for i in 0..8 {
        assert_eq!(hit(c.lookup(key(i), 1, T0)).wait_ms, 300 + i);
    }
    // A ninth DENY replaces the oldest in the full page.
    c.remember(key(8), 1, &deny(308), T0 + 1.0, 0, false);
    assert_eq!(c.len(), 8);
    assert_eq!(hit(c.lookup(key(8), 1, T0 + 1.0)).wait_ms, 308);
    // One key's refresh and its ALLOW touch that key alone.
    let t = T0 + 250_000.0;
    c.remember(key(1), 1, &deny(10_000), T0 - 250_000.0, 0, false);
    refresh(c.lookup(key(1), 1, t));
    hit(c.lookup(key(1), 1, t));
    let allow = Decision {
        allowed: true,
        ..deny(0)
    };
    c.remember(key(1), 1, &allow, t, 0, true);
    assert_eq!(c.lookup(key(1), 1, t), Lookup::Miss);
    assert_eq!(hit(c.lookup(key(8), 1, t)).wait_ms, 308 - 249);
    assert_eq!(c.len(), 7);
}

#[test]
fn a_claim_survives_a_write_to_its_page() {
    // Room for 8 DENYs: one page holds both keys.
    let c = DenyCache::new(500, 8, 50);
    c.remember(k("r:a"), 1, &deny(10_000), T0, 0, false);
    c.remember(k("r:b"), 1, &deny(10_000), T0, 0, false);
    let t = T0 + 500_000.0;
    refresh(c.lookup(k("r:a"), 1, t));
    // Another key's DENY copies the page: the claim goes with it.
    c.remember(k("r:b"), 1, &deny(10_000), t, 0, false);
    hit(c.lookup(k("r:a"), 1, t + 1.0));
    hit(c.lookup(k("r:b"), 1, t + 1.0));
}

#[test]
fn racing_requests_claim_a_refresh_once() {
    let c = DenyCache::new(500, 100, 50);
    c.remember(k("r:k"), 1, &deny(10_000), T0, 0, false);
    let t = T0 + 500_000.0;
    let claims: usize = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    (0..1000)
                        .filter(|_| matches!(c.lookup(k("r:k"), 1, t), Lookup::Refresh(_)))
                        .count()
                })
            })
            .collect();
        threads.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    assert_eq!(claims, 1);
}
