//! Memory stays bounded whatever the key cardinality: the local buckets
//! (`fallback.max_keys`) and the deny cache (`cache.max_entries`) hold at most about
//! their configured number of entries, evicting the rest. (The 10-million-key RSS
//! figure is a measurement, in docs/PERFORMANCE.md, not a test.)

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
fn local_buckets_evict_beyond_max_keys() {
    let keys = TagKey::default();
    let local = LocalBuckets::new(MAX);
    let params = Params::TokenBucket(token_bucket::Params::shared(10, 1.0, 1));
    for i in 0..KEYS {
        let d = local.decide(
            keys.of(&format!("api:k{i}")),
            10,
            &params,
            1,
            wall_clock_us(),
        );
        assert!(d.allowed, "a new key starts full");
    }
    // A read-only touch keeps housekeeping going, as traffic would.
    let n = settles_at_most(MAX + MAX / 10, || {
        local.decide(keys.of("api:k0"), 10, &params, 0, wall_clock_us());
        local.len()
    });
    assert!(n <= MAX + MAX / 10, "{n} buckets held for max_keys = {MAX}");
    assert!(n > 0);
}

#[test]
fn deny_cache_evicts_beyond_max_entries() {
    let keys = TagKey::default();
    let cache = DenyCache::new(60_000, MAX);
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
        cache.remember(keys.of(&format!("api:k{i}")), 1, &deny, now);
    }
    let n = settles_at_most(MAX + MAX / 10, || {
        cache.remember(keys.of("api:k0"), 1, &deny, now);
        cache.len()
    });
    assert!(
        n <= MAX + MAX / 10,
        "{n} entries held for max_entries = {MAX}"
    );
    assert!(n > 0);
}
