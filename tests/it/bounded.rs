//! Memory stays bounded whatever the key cardinality: the local buckets hold at most
//! `fallback.max_keys` keys at every moment, and the deny cache (`cache.max_entries`,
//! moka, which counts lazily) at most about its configured number of DENYs, evicting
//! the least recently used pages of them. (The 10-million-key RSS
//! figure is a measurement, in docs/perf-log.md, not a test.)

use ratelimitd::algorithm::{token_bucket, Params};
use ratelimitd::cache::DenyCache;
use ratelimitd::clock::wall_clock_us;
use ratelimitd::decision::{Decision, Source};
use ratelimitd::fallback::LocalBuckets;
use ratelimitd::key::TagKey;
use std::time::{Duration, Instant};

const MAX: u64 = 1000;
const KEYS: u64 = 100_000;

/// moka counts lazily: poll its (approximate) count until housekeeping has caught up.
fn settles_at_most(max: u64, mut len: impl FnMut() -> u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = len();
        if n <= max || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn local_buckets_never_hold_more_than_max_keys() {
    let keys = TagKey::default();
    let local = LocalBuckets::new(MAX);
    let params = Params::TokenBucket(token_bucket::Params::shared(10, 1.0, 1));
    for i in 0..KEYS {
        let d = local.decide(
            keys.of(b"api", format!("k{i}").as_bytes()),
            10,
            &params,
            1,
            1,
            wall_clock_us(),
        );
        assert!(d.allowed, "a new key starts full");
        // Exact at every step: the map evicts on insert, with no housekeeping behind.
        if i % 997 == 0 {
            assert!(
                local.len() <= MAX,
                "{} buckets held for max_keys = {MAX}",
                local.len()
            );
        }
    }
    let n = local.len();
    assert!(n <= MAX, "{n} buckets held for max_keys = {MAX}");
    assert!(
        n >= MAX * 9 / 10,
        "only {n} buckets held for max_keys = {MAX}"
    );
}

#[test]
fn deny_cache_evicts_beyond_max_entries() {
    let keys = TagKey::default();
    let cache = DenyCache::new(60_000, MAX, 50);
    let deny = Decision {
        allowed: false,
        limit: 10,
        remaining: 0,
        reset_ms: 60_000,
        wait_ms: 60_000,
        source: Source::Redis,
    };
    let now = wall_clock_us();
    for i in 0..KEYS {
        cache.remember(
            keys.of(b"api", format!("k{i}").as_bytes()),
            1,
            &deny,
            now,
            0,
            false,
        );
    }
    let n = settles_at_most(MAX + MAX / 10, || {
        cache.remember(keys.of(b"api", b"k0"), 1, &deny, now, 0, false);
        cache.len()
    });
    assert!(
        n <= MAX + MAX / 10,
        "{n} entries held for max_entries = {MAX}"
    );
    // Eviction takes whole pages (a few DENYs each) and only until the count fits.
    assert!(
        n >= MAX * 8 / 10,
        "only {n} entries held for max_entries = {MAX}"
    );
    // The last DENYs remembered are there.
    let last = keys.of(b"api", format!("k{}", KEYS - 1).as_bytes());
    assert!(matches!(
        cache.lookup(last, 1, now),
        ratelimitd::cache::Lookup::Hit(_)
    ));
}
