//! The daemon deciding in one standalone Redis: a burst and its DENY, a per-key error
//! (someone else's value where a bucket would be) that leaves the other keys in Redis, a
//! `}` in a key, and Redis out of memory opening the circuit once and recovering.

use crate::common;

use common::*;
use std::time::{Duration, Instant};

/// A daemon config for one standalone Redis, with [`BUCKET_RULES`].
fn standalone_config(redis: &RedisStandalone) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 25\n{BUCKET_RULES}",
        redis.addr()
    )
}

#[test]
fn standalone_mode() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    for i in 0..5 {
        let r = parse_reply(&c.request("CHECK slow s"));
        assert_eq!(
            (r.verdict.as_str(), r.remaining, r.source.as_str()),
            ("ALLOW", 4 - i, "redis")
        );
    }
    assert!(c.request("CHECK slow s").starts_with("DENY 5 0 "));
    assert_eq!(redis.cli(&["EXISTS", "rl:{slow:s}:tb"]), "1");
}

#[test]
fn per_key_errors_and_braces_do_not_disturb_other_keys() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    // Someone else's string sits where a bucket would be: WRONGTYPE for that key only.
    assert_eq!(redis.cli(&["SET", "rl:{big:foreign}:tb", "x"]), "OK");
    let r = parse_reply(&c.request("CHECK big foreign"));
    assert_eq!(
        (r.verdict.as_str(), r.source.as_str()),
        ("ALLOW", "local"),
        "{r:?}"
    );
    let r = parse_reply(&c.request("CHECK big other"));
    assert_eq!(r.source, "redis", "the circuit stays closed for other keys");
    assert!(!d.log().contains("circuit open"), "{}", d.log());
    // A `}` in a key must not end the hash tag early.
    assert_eq!(parse_reply(&c.request("CHECK big a}b")).source, "redis");
    assert_eq!(redis.cli(&["EXISTS", "rl:{big:a b}:tb"]), "1");
}

#[test]
fn out_of_memory_opens_the_circuit_once_and_recovers() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    assert_eq!(parse_reply(&c.request("CHECK big m0")).source, "redis");
    // Writes now fail with OOM; reads (and so a DENY) would still work.
    assert_eq!(
        redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]),
        "OK"
    );
    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory", "1"]), "OK");
    let until = Instant::now() + Duration::from_millis(1500);
    let mut n = 0;
    while Instant::now() < until {
        let r = parse_reply(&c.request(&format!("CHECK big m{}", n % 50)));
        if n > 0 {
            assert_eq!(r.source, "local", "request {n} during OOM: {r:?}");
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    let log = d.log();
    assert_eq!(log.matches("circuit open").count(), 1, "{log}");
    assert_eq!(
        log.matches("circuit closed").count(),
        0,
        "no flapping: {log}"
    );
    // Memory back: decisions return to Redis within 1 s.
    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory", "0"]), "OK");
    let t = Instant::now();
    assert!(wait_until(Duration::from_secs(1), || parse_reply(
        &c.request("CHECK big back")
    )
    .source
        == "redis"));
    eprintln!("back to redis {:?} after OOM ended", t.elapsed());
}

/// A hot denied key whose cached DENY keeps expiring: one dry run per expiry re-asks
/// Redis while every request, the one that found it expired included, keeps the cached
/// DENY, and once Redis's state is gone (a flush) the key is admitted again within
/// `ttl_ms` plus the refresh grace (twice `timeout_ms`).
#[test]
fn an_expiring_hot_deny_is_refreshed_by_one_request() {
    const TTL_MS: u64 = 100;
    const GRACE_MS: u64 = 2 * 25;
    let redis = RedisStandalone::start();
    let config = format!(
        "{}\n[cache]\nttl_ms = {TTL_MS}\n[fallback]\nhosts = 1\n",
        standalone_config(&redis)
    );
    let d = Daemon::start(&config);
    let mut c = d.connect();
    // "big": 50 units, refilled at 0.001/s: exhausted, it stays denied for the test.
    for _ in 0..50 {
        assert!(parse_reply(&c.request("CHECK big h")).allowed());
    }
    assert_eq!(parse_reply(&c.request("CHECK big h")).source, "redis");
    let calls_before = redis.script_calls();
    // 8 connections, 16 requests in flight each, for 1.5 s.
    let run = Duration::from_millis(1500);
    let started = Instant::now();
    let counts: Vec<(u64, u64)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let mut c = d.connect();
                    let batch: Vec<String> = (0..16).map(|_| "CHECK big h".to_string()).collect();
                    let (mut total, mut from_redis) = (0, 0);
                    while started.elapsed() < run {
                        for line in c.pipeline(&batch) {
                            let r = parse_reply(&line);
                            assert_eq!(r.verdict, "DENY", "{line}");
                            total += 1;
                            from_redis += u64::from(r.source == "redis");
                        }
                    }
                    (total, from_redis)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let total: u64 = counts.iter().map(|c| c.0).sum();
    let from_redis: u64 = counts.iter().map(|c| c.1).sum();
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let calls = redis.script_calls() - calls_before;
    // Each entry answers TTL_MS from its own asking: at most one refresh per TTL_MS,
    // plus racing claimants (two lookups before the first one's mark lands); twice
    // that is the bound. Without the refresh claim every request in flight (up to 128)
    // went to Redis at each expiry.
    let bound = 2 * (elapsed_ms / TTL_MS + 2);
    eprintln!(
        "{total} DENYs in {elapsed_ms} ms: {calls} Redis calls (bound {bound}), \
         {from_redis} replies from Redis"
    );
    assert!(calls <= bound, "{calls} Redis calls > {bound}");
    assert!(
        from_redis <= bound,
        "{from_redis} replies from Redis > {bound}"
    );
    assert!(total > 10 * calls, "{total} requests, {calls} Redis calls");

    // Redis loses its state: a request decided later than TTL_MS + GRACE_MS after the
    // flush can no longer be answered by an entry asked before it.
    assert_eq!(redis.cli(&["FLUSHALL"]), "OK");
    let flushed = Instant::now();
    let latest = Duration::from_millis(TTL_MS + GRACE_MS);
    loop {
        let sent = Instant::now();
        let r = parse_reply(&c.request("CHECK big h"));
        if r.allowed() {
            eprintln!("admitted {:?} after the flush", sent - flushed);
            break;
        }
        assert!(
            sent - flushed <= latest,
            "still {r:?} from a request sent {:?} after the flush",
            sent - flushed
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The request that finds a cached DENY expired is answered from the cache like the
/// others; the refresh reaches Redis without it, as a dry run that takes nothing. Then,
/// after a flush, the refresh's ALLOW drops the entry, writes nothing, and the next
/// request is decided by Redis on a full bucket.
#[test]
fn the_request_that_claims_a_refresh_is_answered_from_the_cache() {
    // ttl 100 ms; the refresh grace is 2 × timeout_ms = 400 ms: a request 150 ms after
    // the DENY finds the entry expired and within its grace.
    let redis = RedisStandalone::start();
    let config = standalone_config(&redis).replace("timeout_ms = 25", "timeout_ms = 200");
    // One host: no heartbeat EVALSHA to count as a refresh.
    let d = Daemon::start(&format!(
        "{config}\n[cache]\nttl_ms = 100\n[fallback]\nhosts = 1\n"
    ));
    let mut c = d.connect();
    for _ in 0..50 {
        assert!(parse_reply(&c.request("CHECK big k")).allowed());
    }
    let denied = parse_reply(&c.request("CHECK big k"));
    assert_eq!(
        (denied.verdict.as_str(), denied.source.as_str()),
        ("DENY", "redis")
    );
    let bucket = || redis.cli(&["HMGET", "rl:{big:k}:tb", "t", "ts"]);
    let (state, calls) = (bucket(), redis.script_calls());

    for round in 0..2 {
        std::thread::sleep(Duration::from_millis(150));
        let r = parse_reply(&c.request("CHECK big k"));
        assert_eq!(
            (r.verdict.as_str(), r.source.as_str()),
            ("DENY", "cache"),
            "round {round}: the claimant waits for no round trip"
        );
        assert!(
            wait_until(Duration::from_secs(2), || redis.script_calls()
                > calls + round),
            "round {round}: no refresh reached Redis"
        );
        assert_eq!(
            bucket(),
            state,
            "round {round}: the dry run wrote the bucket"
        );
        // The next round's claim shows that the refresh replaced the entry: the
        // claimed one (until 500 ms after the DENY) would answer without a claim.
    }

    // The state is gone: the next refresh comes back ALLOW and writes nothing.
    assert_eq!(redis.cli(&["FLUSHALL"]), "OK");
    let calls = redis.script_calls();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(parse_reply(&c.request("CHECK big k")).source, "cache");
    assert!(wait_until(Duration::from_secs(2), || redis.script_calls() > calls));
    assert_eq!(
        redis.cli(&["EXISTS", "rl:{big:k}:tb"]),
        "0",
        "the dry run wrote"
    );
    // Cache hits until the daemon has read the dry run's ALLOW (they take nothing).
    let mut r = parse_reply(&c.request("CHECK big k"));
    let read_by = Instant::now() + Duration::from_secs(2);
    while r.source == "cache" && Instant::now() < read_by {
        std::thread::sleep(Duration::from_millis(5));
        r = parse_reply(&c.request("CHECK big k"));
    }
    assert_eq!(
        (r.verdict.as_str(), r.remaining, r.source.as_str()),
        ("ALLOW", 49, "redis"),
        "the entry is dropped and the dry run took nothing"
    );
}

/// Refreshes claimed within a few ms of each other reach Redis together: 20 expired
/// cached DENYs, claimed one request after another, cost a handful of EVALSHAs, not 20.
/// Each is still refreshed: Redis lost the state (a flush), so each dry run's ALLOW
/// drops its entry, and each key's next request is decided by Redis on a full bucket,
/// long before its claimed entry would have lapsed at the end of its grace.
#[test]
fn refreshes_claimed_together_reach_redis_together() {
    const KEYS: usize = 20;
    // The gathering lasts 5 ms (a quarter of the grace, 2 × timeout_ms, when shorter).
    const GATHER_MS: u64 = 5;
    let redis = RedisStandalone::start();
    // A grace of 2 s: an entry claimed here would answer until then without its refresh.
    let config = standalone_config(&redis).replace("timeout_ms = 25", "timeout_ms = 1000");
    let d = Daemon::start(&format!(
        "{config}\n[cache]\nttl_ms = 100\n[fallback]\nhosts = 1\n"
    ));
    let mut c = d.connect();
    // "big": 50 units, refilled at 0.001/s.
    for k in 0..KEYS {
        let burst: Vec<String> = (0..51).map(|_| format!("CHECK big r{k}")).collect();
        let last = c.pipeline(&burst).pop().unwrap_or_default();
        assert!(last.starts_with("DENY 50 0 "), "key {k}: {last}");
    }
    assert_eq!(redis.cli(&["FLUSHALL"]), "OK");
    std::thread::sleep(Duration::from_millis(150));

    let calls = redis.script_calls();
    let claimed = Instant::now();
    for k in 0..KEYS {
        let r = parse_reply(&c.request(&format!("CHECK big r{k}")));
        assert_eq!(
            (r.verdict.as_str(), r.source.as_str()),
            ("DENY", "cache"),
            "key {k}: the claimant is answered from its entry"
        );
    }
    let claims_ms = claimed.elapsed().as_millis() as u64;
    // Each gathering spans GATHER_MS from its first claim, and goes out in at most three
    // EVALSHAs: the store sends a call at once, alone, while fewer than two batches are
    // in flight, which on a multi-thread runtime can happen to two of them before the
    // rest arrive together.
    let bound = 3 * (claims_ms / GATHER_MS + 1);
    assert!(
        wait_until(Duration::from_secs(1), || redis.script_calls() > calls),
        "no refresh reached Redis"
    );
    std::thread::sleep(Duration::from_millis(50));
    let sent = redis.script_calls() - calls;
    eprintln!("{KEYS} refreshes claimed in {claims_ms} ms: {sent} EVALSHAs (bound {bound})");
    assert!(
        sent <= bound,
        "{sent} EVALSHAs for {KEYS} refreshes > {bound}"
    );
    for k in 0..KEYS {
        let r = parse_reply(&c.request(&format!("CHECK big r{k}")));
        assert_eq!(
            (r.verdict.as_str(), r.remaining, r.source.as_str()),
            ("ALLOW", 49, "redis"),
            "key {k}: its refresh dropped the entry"
        );
    }
}
