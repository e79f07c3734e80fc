//! Run-time overrides kept in the key's own state hash (`lua/prelude.lua` override(),
//! `src/store/redis/tier.rs`), against a real Redis: the key lives as long as its
//! override (no TTL without `ttl=`, at least its remaining life with one), an override
//! past its end is ignored, `RESET` keeps it, `clear` gives the key its state's TTL
//! back, and a hash holding only the override decides as a new key.

use crate::common;

use common::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A bucket full again 1 s after it is drained (its key's TTL is then at most 2 s), a
/// window of 200 ms (its key's TTL at most 1.2 s), and a log (a sorted set: its override
/// stays in the hash beside it).
const RULES: &str = r#"
[[rule]]
name = "quick"
algorithm = "token_bucket"
capacity = 5
refill_rate = 5.0

[[rule]]
name = "win"
algorithm = "fixed_window"
limit = 3
window = "200ms"

[[rule]]
name = "log"
algorithm = "sliding_window_log"
limit = 3
window = "1h"
"#;

/// The override's fields in the state hash (`lua/prelude.lua` override()): what the
/// decision applies with its end ("-": none), and its text.
const FIELDS: [&str; 2] = ["ov", "op"];

fn start() -> (RedisStandalone, Daemon, Client) {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 500\n[cache]\nttl_ms = 0\n{RULES}",
        redis.addr()
    ));
    let mut c = d.connect();
    assert!(wait_until(Duration::from_secs(10), || {
        parse_reply(&c.request("CHECK quick __ready 0")).source == "redis"
    }));
    (redis, d, c)
}

/// The hash of `key` as field → value.
fn hash(redis: &RedisStandalone, key: &str) -> HashMap<String, String> {
    let flat = redis_command(&redis.addr(), &["HGETALL", key])
        .unwrap()
        .into_strings()
        .unwrap();
    flat.chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect()
}

fn pttl(redis: &RedisStandalone, key: &str) -> i64 {
    redis.cli(&["PTTL", key]).parse().unwrap()
}

/// The key's TTL (ms) and the µs its override has left (its end in `ov` − Redis's clock), read in
/// one script: one instant for both.
fn ttl_and_override_life(redis: &RedisStandalone, key: &str) -> (i64, i64) {
    let script = "local t = redis.call('TIME') \
        local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
        local e = string.match(redis.call('HGET', KEYS[1], 'ov'), '(%d+)$') \
        return {redis.call('PTTL', KEYS[1]), tonumber(e) - now}";
    let v = redis_command(&redis.addr(), &["EVAL", script, "1", key])
        .unwrap()
        .into_ints();
    (v[0], v[1])
}

fn check(c: &mut Client, rule: &str, key: &str, cost: u32) -> Reply {
    parse_reply(&c.request(&format!("CHECK {rule} {key} {cost}")))
}

#[test]
fn a_permanent_override_outlives_the_states_own_ttl() {
    let (redis, _d, mut c) = start();
    let key = "rl:{quick:t:p}:tb";
    assert_eq!(
        c.request("OVERRIDE quick t:p capacity=3 refill_rate=5"),
        "OK"
    );
    // A key without override decided at the same time: gone with its state's TTL.
    let plain = check(&mut c, "quick", "t:plain", 5);
    assert_eq!((plain.verdict.as_str(), plain.remaining), ("ALLOW", 0));
    // Drained under the override (3 of it), written without giving the key a TTL.
    let r = check(&mut c, "quick", "t:p", 3);
    assert_eq!(
        (r.verdict.as_str(), r.limit, r.remaining),
        ("ALLOW", 3, 0),
        "{r:?}"
    );
    let fields = hash(&redis, key);
    assert!(
        fields.contains_key("t") && fields.contains_key("x"),
        "{fields:?}"
    );
    assert!(FIELDS.iter().all(|f| fields.contains_key(*f)), "{fields:?}");
    assert!(fields["ov"].ends_with(" -"), "{fields:?}");
    assert_eq!(pttl(&redis, key), -1);
    // Past the state's own life (full after 1 s, its TTL at most 2 s after the write).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(redis.cli(&["EXISTS", "rl:{quick:t:plain}:tb"]), "0");
    assert_eq!(pttl(&redis, key), -1);
    // Still under the override: a full bucket of its 3, not the rule's 5.
    let r = check(&mut c, "quick", "t:p", 0);
    assert_eq!((r.limit, r.remaining), (3, 3), "{r:?}");
    let r = check(&mut c, "quick", "t:p", 1);
    assert_eq!((r.verdict.as_str(), r.remaining), ("ALLOW", 2), "{r:?}");
    assert_eq!(pttl(&redis, key), -1);
    // Cleared: the key has its state's TTL again (full 0.2 s after, plus the 1 s margin).
    assert_eq!(c.request("OVERRIDE quick t:p clear"), "OK");
    let ttl = pttl(&redis, key);
    assert!((1..=1200).contains(&ttl), "{ttl}");
    assert!(FIELDS.iter().all(|f| !hash(&redis, key).contains_key(*f)));
    let r = check(&mut c, "quick", "t:p", 0);
    assert_eq!(r.limit, 5, "{r:?}");
    assert_eq!(
        fields_of(&c.request("INSPECT quick t:p"))["override"],
        "none"
    );
}

#[test]
fn an_override_with_a_ttl_keeps_the_key_that_long_then_lapses() {
    let (redis, _d, mut c) = start();
    let key = "rl:{quick:t:ttl}:tb";
    let set_at = Instant::now();
    assert_eq!(
        c.request("OVERRIDE quick t:ttl capacity=3 refill_rate=5 ttl=3s"),
        "OK"
    );
    let r = check(&mut c, "quick", "t:ttl", 3);
    assert_eq!((r.verdict.as_str(), r.limit), ("ALLOW", 3), "{r:?}");
    // The key outlives the override: its TTL covers the override's remaining life.
    let (ttl, life_us) = ttl_and_override_life(&redis, key);
    assert!(life_us > 0 && life_us <= 3_000_000, "{life_us}");
    assert!(ttl * 1000 >= life_us && ttl <= 3001, "{ttl} {life_us}");
    let seen = fields_of(&c.request("INSPECT quick t:ttl"));
    let left: i64 = seen["override_ttl_ms"].parse().unwrap();
    assert!((1..=3000).contains(&left), "{seen:?}");
    // Past the state's own life (at most 1.6 s), within the override's 3 s.
    std::thread::sleep(Duration::from_millis(2000).saturating_sub(set_at.elapsed()));
    if set_at.elapsed() < Duration::from_millis(2800) {
        let r = check(&mut c, "quick", "t:ttl", 0);
        assert_eq!((r.limit, r.remaining), (3, 3), "{r:?}");
    }
    // Lapsed: the rule's own parameters, and the key goes with its TTL.
    std::thread::sleep(Duration::from_millis(3300).saturating_sub(set_at.elapsed()));
    let r = check(&mut c, "quick", "t:ttl", 0);
    assert_eq!((r.limit, r.remaining), (5, 5), "{r:?}");
    assert_eq!(
        fields_of(&c.request("INSPECT quick t:ttl"))["override"],
        "none"
    );
    std::thread::sleep(Duration::from_millis(3200));
    assert_eq!(redis.cli(&["EXISTS", key]), "0");
}

#[test]
fn reset_keeps_the_override_and_its_end() {
    let (redis, _d, mut c) = start();
    let key = "rl:{quick:t:r}:tb";
    assert_eq!(
        c.request("OVERRIDE quick t:r capacity=3 refill_rate=5"),
        "OK"
    );
    let r = check(&mut c, "quick", "t:r", 3);
    assert_eq!((r.verdict.as_str(), r.remaining), ("ALLOW", 0), "{r:?}");
    assert_eq!(c.request("RESET quick t:r"), "OK");
    // Only the override is left, still without TTL; the key decides as a new one.
    let fields = hash(&redis, key);
    assert!(
        fields.keys().all(|f| FIELDS.contains(&f.as_str())),
        "{fields:?}"
    );
    assert_eq!(fields.len(), FIELDS.len(), "{fields:?}");
    assert_eq!(pttl(&redis, key), -1);
    let r = check(&mut c, "quick", "t:r", 1);
    assert_eq!(
        (r.verdict.as_str(), r.limit, r.remaining),
        ("ALLOW", 3, 2),
        "{r:?}"
    );
    // One with a ttl keeps its end through RESET.
    let key = "rl:{win:t:r}:fw";
    assert_eq!(c.request("OVERRIDE win t:r limit=2 ttl=60s"), "OK");
    let (_, end_before) = ttl_and_override_life(&redis, key);
    assert_eq!(c.request("RESET win t:r"), "OK");
    let (ttl, life) = ttl_and_override_life(&redis, key);
    assert!(life > 0 && life <= end_before, "{life} {end_before}");
    assert!(ttl * 1000 >= life && ttl <= 60_001, "{ttl} {life}");
    let r = check(&mut c, "win", "t:r", 0);
    assert_eq!(r.limit, 2, "{r:?}");
}

#[test]
fn a_hash_holding_only_an_override_decides_as_a_new_key() {
    let (redis, _d, mut c) = start();
    for (rule, key, redis_key, limit) in [
        ("quick", "t:n", "rl:{quick:t:n}:tb", 4),
        ("win", "t:n", "rl:{win:t:n}:fw", 2),
    ] {
        let param = if rule == "quick" { "capacity" } else { "limit" };
        assert_eq!(
            c.request(&format!("OVERRIDE {rule} {key} {param}={limit}")),
            "OK"
        );
        let fields = hash(&redis, redis_key);
        assert_eq!(fields.len(), FIELDS.len(), "{fields:?}");
        // Full: a burst takes exactly the override's limit (the refill, 5 a second,
        // may add one per 200 ms elapsed; the window may roll over once per 200 ms).
        let started = Instant::now();
        let burst: Vec<String> = (0..=limit).map(|_| format!("CHECK {rule} {key}")).collect();
        let replies = c.pipeline(&burst);
        let extra = (started.elapsed().as_millis() / 200) as usize;
        let allowed = replies.iter().filter(|r| r.starts_with("ALLOW")).count();
        assert!(
            allowed >= limit as usize && allowed <= limit as usize + extra,
            "{rule}: {replies:?}"
        );
        let first = parse_reply(&replies[0]);
        assert_eq!(
            (first.limit, first.remaining),
            (limit, limit - 1),
            "{rule}: {replies:?}"
        );
    }
}

#[test]
fn a_sorted_set_keeps_its_override_beside_it() {
    let (redis, _d, mut c) = start();
    assert_eq!(c.request("OVERRIDE log t:s limit=2"), "OK");
    let side = hash(&redis, "rl:{log:t:s}:swl:ov");
    assert!(side["p"].starts_with("limit=2 "), "{side:?}");
    let replies = c.pipeline(&vec!["CHECK log t:s".to_string(); 3]);
    let allowed = replies.iter().filter(|r| r.starts_with("ALLOW")).count();
    assert_eq!(allowed, 2, "{replies:?}");
    assert_eq!(parse_reply(&replies[2]).limit, 2, "{replies:?}");
    // REFUND is capped at the override's limit, read beside the log.
    let r = parse_reply(&c.request("REFUND log t:s 5"));
    assert_eq!((r.limit, r.remaining), (2, 2), "{r:?}");
    assert_eq!(c.request("RESET log t:s"), "OK");
    assert_eq!(redis.cli(&["EXISTS", "rl:{log:t:s}:swl:ov"]), "1");
    assert_eq!(c.request("OVERRIDE log t:s clear"), "OK");
    assert_eq!(redis.cli(&["EXISTS", "rl:{log:t:s}:swl:ov"]), "0");
    let r = check(&mut c, "log", "t:s", 0);
    assert_eq!((r.limit, r.remaining), (3, 3), "{r:?}");
}

fn fields_of(line: &str) -> HashMap<String, String> {
    line.split(' ')
        .filter_map(|f| f.split_once('='))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect()
}
