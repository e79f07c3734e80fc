//! The five algorithms of docs/ALGORITHMS.md over the socket, decided in `mode = "none"` (the
//! Rust twins), in a real 6-node Redis Cluster and in a standalone Redis (the Lua
//! twins): bursts admit exactly the limit, `remaining` counts down, the leaky bucket
//! spaces its admissions at the leak rate, a DENY's `wait_ms` is enough and not far too
//! much, keys are hash-tagged and expire, a sliding log holds no more than its limit,
//! and windows fall back to `limit ÷ hosts` when Redis is gone. The cluster test runs on
//! a plain cluster and on one reached over TLS only with the documented least-privilege
//! ACL user (`tests/secure_redis`). Also measures Redis memory per key (`MEMORY USAGE`)
//! for docs/ALGORITHMS.md.

use crate::common;
use crate::secure_redis;

use common::*;
use secure_redis::{connect_in_redis, Flavor, TestCluster};
use std::thread::sleep;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One rule per algorithm, each admitting 5 now; refills slow enough that a burst on a
/// busy machine cannot be refilled in the middle.
const FIVE: &str = r#"
[fallback]
hosts = 4

[[rule]]
name = "tb"
algorithm = "token_bucket"
capacity = 5
refill_rate = 1.0

[[rule]]
name = "lb"
algorithm = "leaky_bucket"
capacity = 5
leak_rate = 2.0

[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 5
window = "1s"

[[rule]]
name = "swl"
algorithm = "sliding_window_log"
limit = 5
window = "1s"

[[rule]]
name = "swc"
algorithm = "sliding_window_counter"
limit = 5
window = "1s"

[[rule]]
name = "swl_big"
algorithm = "sliding_window_log"
limit = 1000
window = "1m"
"#;

const ALGORITHMS: [&str; 5] = ["tb", "lb", "fw", "swl", "swc"];

/// Most a first DENY may ask to wait, per rule (ms): one token at 1/s, one unit of
/// queue at 2/s, the rest of a 1 s window, the oldest log entry's 1 s, and for the
/// counter 1.2 s (its 5 become the previous window, weighted down to 4 at 20 %).
fn max_wait(rule: &str) -> u64 {
    match rule {
        "tb" => 1000,
        "lb" => 500,
        "swc" => 1200,
        _ => 1000,
    }
}

/// Sleeps until the wall clock is in the first 300 ms of a second, so a burst on a 1 s
/// epoch-aligned window does not straddle two windows.
fn early_in_a_second() {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    if ms > 300 {
        sleep(Duration::from_millis(u64::from(1000 - ms) + 5));
    }
}

/// Runs every algorithm on a fresh key through `d` and checks the decisions, each from
/// `source`.
fn exercise(d: &Daemon, source: &str, tag: &str) {
    let mut c = d.connect();
    for rule in ALGORITHMS {
        let key = format!("{tag}:user:1");
        early_in_a_second();
        let lines: Vec<String> = (0..6).map(|_| format!("CHECK {rule} {key}")).collect();
        let replies: Vec<Reply> = c.pipeline(&lines).iter().map(|l| parse_reply(l)).collect();
        for (i, r) in replies[..5].iter().enumerate() {
            assert_eq!(
                (r.verdict.as_str(), r.limit, r.remaining, r.source.as_str()),
                ("ALLOW", 5, 4 - i as u64, source),
                "{rule}: request {i}: {replies:?}"
            );
            if rule == "lb" {
                // Shaping: the i-th admission waits for i units to drain at 2/s.
                let want = 500 * i as u64;
                assert!(
                    r.wait_ms <= want && r.wait_ms + 50 >= want,
                    "{rule}: request {i} wait_ms {} (want ≈ {want})",
                    r.wait_ms
                );
            } else {
                assert_eq!(r.wait_ms, 0, "{rule}: {r:?}");
            }
            assert!(r.reset_ms >= 1, "{rule}: {r:?}");
        }
        let deny = &replies[5];
        assert_eq!(
            (deny.verdict.as_str(), deny.remaining, deny.source.as_str()),
            ("DENY", 0, source),
            "{rule}: {replies:?}"
        );
        assert!(
            (1..=max_wait(rule)).contains(&deny.wait_ms),
            "{rule}: wait_ms {}",
            deny.wait_ms
        );
        // Waiting `wait_ms` is enough.
        sleep(Duration::from_millis(deny.wait_ms + 10));
        let r = parse_reply(&c.request(&format!("CHECK {rule} {key}")));
        assert_eq!(
            (r.verdict.as_str(), r.source.as_str()),
            ("ALLOW", source),
            "{rule}: after waiting {} ms: {r:?}",
            deny.wait_ms
        );
        // Cost 0 reports without taking; a cost above the limit can never pass.
        let r = parse_reply(&c.request(&format!("CHECK {rule} {key} 0")));
        assert_eq!(r.verdict, "ALLOW", "{rule}: {r:?}");
        let e = c.request(&format!("CHECK {rule} {key} 6"));
        assert!(e.starts_with("ERR COST"), "{rule}: {e}");
    }
}

/// No fault is injected here: a generous `redis.timeout_ms`, so that a call slowed by a
/// loaded machine is still answered by Redis (each decision is asserted `redis`).
fn cluster_config(cluster: &TestCluster) -> String {
    format!(
        "[redis]\n{}timeout_ms = 250\nprefix = \"rl\"\n{FIVE}",
        cluster.redis_fields()
    )
}

fn standalone_config(redis: &RedisStandalone) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 250\nprefix = \"rl\"\n{FIVE}",
        redis.addr()
    )
}

#[test]
fn five_algorithms_locally() {
    let d = Daemon::start(&format!("[redis]\nmode = \"none\"\n{FIVE}"));
    exercise(&d, "local", "none");
}

plain_and_tls!(five_algorithms_in_cluster);

fn five_algorithms_in_cluster(flavor: Flavor) {
    let cluster = TestCluster::start(flavor);
    let d = Daemon::start(&cluster_config(&cluster));
    connect_in_redis(&d, "tb");
    exercise(&d, "redis", "cluster");

    // Each algorithm's key carries the {rule:key} hash tag, has the expected type and
    // an expiry (checked right after a decision: fixed-window keys expire 1 s after
    // their window, so the keys of the exercise above may be gone already).
    let addr = &cluster.primary_addrs()[0];
    let mut c = d.connect();
    for rule in ALGORITHMS {
        assert!(c
            .request(&format!("CHECK {rule} tagged"))
            .starts_with("ALLOW"));
        let key = format!("rl:{{{rule}:tagged}}:{rule}");
        let keys = cluster.all_keys();
        assert!(keys.contains(&key), "{key} not in {keys:?}");
        assert_eq!(
            cluster.cli(addr, &["CLUSTER", "KEYSLOT", &key]),
            cluster.cli(addr, &["CLUSTER", "KEYSLOT", &format!("{rule}:tagged")])
        );
        let kind = cluster.cli(addr, &["-c", "TYPE", &key]);
        assert_eq!(kind, if rule == "swl" { "zset" } else { "hash" }, "{key}");
        let ttl: i64 = cluster
            .cli(addr, &["-c", "PTTL", &key])
            .parse()
            .unwrap_or(-3);
        assert!(ttl > 0 && ttl <= 3_500, "{key}: PTTL {ttl}");
    }

    // A sliding log logs admitted units only: 200 denied requests add nothing.
    let lines: Vec<String> = (0..205).map(|_| "CHECK swl flood".to_string()).collect();
    let replies = c.pipeline(&lines);
    let admitted = replies.iter().filter(|r| r.starts_with("ALLOW")).count();
    assert_eq!(admitted, 5, "{replies:?}");
    let members: u64 = cluster
        .cli(addr, &["-c", "ZCARD", "rl:{swl:flood}:swl"])
        .parse()
        .unwrap();
    assert!((1..=5).contains(&members), "ZCARD {members}");
    cluster.assert_no_acl_denials();
}

#[test]
fn five_algorithms_in_standalone_then_windows_fall_back_to_a_share() {
    let mut redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    exercise(&d, "redis", "standalone");

    // Redis gone: each algorithm falls back to its local twin with limit ÷ 4 hosts,
    // i.e. 1.25 units: one request.
    redis.kill();
    let mut c = d.connect();
    for rule in ALGORITHMS {
        early_in_a_second();
        let lines: Vec<String> = (0..4).map(|_| format!("CHECK {rule} outage")).collect();
        let replies: Vec<Reply> = c.pipeline(&lines).iter().map(|l| parse_reply(l)).collect();
        let admitted = replies.iter().filter(|r| r.verdict == "ALLOW").count();
        assert_eq!(admitted, 1, "{rule}: {replies:?}");
        assert!(
            replies.iter().all(|r| r.source == "local" && r.limit == 5),
            "{rule}: {replies:?}"
        );
    }
}

/// Redis memory per active key (`MEMORY USAGE`, bytes, Redis 7 defaults), printed for
/// docs/ALGORITHMS.md and bounded so a layout change that bloats keys fails here.
#[test]
fn redis_memory_per_key() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    let mut report = Vec::new();
    for rule in ALGORITHMS {
        let key = "user:4242";
        c.request(&format!("CHECK {rule} {key}"));
        let bytes: u64 = redis
            .cli(&["MEMORY", "USAGE", &format!("rl:{{{rule}:{key}}}:{rule}")])
            .parse()
            .unwrap();
        report.push(format!("{rule}: {bytes} B"));
        assert!(bytes <= 160, "{rule}: {bytes} bytes per key");
    }
    // A sliding log grows with admitted requests (one entry per admission instant).
    for n in [10usize, 100, 1000] {
        let key = format!("log{n}");
        let lines: Vec<String> = (0..n).map(|_| format!("CHECK swl_big {key}")).collect();
        for chunk in lines.chunks(100) {
            c.pipeline(chunk);
            sleep(Duration::from_millis(1));
        }
        let full = format!("rl:{{swl_big:{key}}}:swl");
        let members: usize = redis.cli(&["ZCARD", &full]).parse().unwrap();
        let bytes: u64 = redis.cli(&["MEMORY", "USAGE", &full]).parse().unwrap();
        report.push(format!(
            "swl with {members} entries ({n} requests): {bytes} B"
        ));
        assert!(members <= n && bytes <= 160 * n as u64 + 200, "{report:?}");
    }
    eprintln!("MEMORY USAGE per key: {}", report.join("; "));
}

/// A restart that changes a rule's algorithm (a reload refuses it:
/// `reload_algorithm.rs`) starts its keys afresh in Redis (each algorithm has its own
/// key suffix), instead of misreading the old state or failing with `WRONGTYPE` (a
/// sorted set where a hash was).
#[test]
fn changing_a_rules_algorithm_by_restart_starts_afresh_in_redis() {
    let redis = RedisStandalone::start();
    let rule = |body: &str| {
        format!(
            "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 250\n[cache]\nttl_ms = 0\n[[rule]]\nname = \"r\"\n{body}",
            redis.addr()
        )
    };
    let d = Daemon::start(&rule(
        "algorithm = \"token_bucket\"\ncapacity = 2\nrefill_rate = 0.001",
    ));
    let mut c = d.connect();
    for _ in 0..2 {
        assert!(c.request("CHECK r k").starts_with("ALLOW"));
    }
    assert!(c.request("CHECK r k").starts_with("DENY"));
    drop((c, d));
    let d = Daemon::start(&rule(
        "algorithm = \"sliding_window_log\"\nlimit = 3\nwindow = \"1m\"",
    ));
    let mut c = d.connect();
    assert_eq!(parse_reply(&c.request("CHECK r k 0")).limit, 3);
    for i in 0..3 {
        let r = parse_reply(&c.request("CHECK r k"));
        assert_eq!(
            (r.verdict.as_str(), r.source.as_str()),
            ("ALLOW", "redis"),
            "{i}: {r:?}"
        );
    }
    let r = parse_reply(&c.request("CHECK r k"));
    assert_eq!(
        (r.verdict.as_str(), r.source.as_str()),
        ("DENY", "redis"),
        "{r:?}"
    );
    assert_eq!(redis.cli(&["TYPE", "rl:{r:k}:swl"]), "zset");
    assert_eq!(redis.cli(&["TYPE", "rl:{r:k}:tb"]), "hash");
}
