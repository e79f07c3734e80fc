//! The daemon deciding in one standalone Redis: a burst and its DENY, a per-key error
//! (someone else's value where a bucket would be) that leaves the other keys in Redis, a
//! `}` in a key, and Redis out of memory opening the circuit once and recovering.

mod common;

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
