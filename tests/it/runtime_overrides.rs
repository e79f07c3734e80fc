//! Run-time overrides (`OVERRIDE`): written through one daemon into Redis beside the
//! key's state, applied by the key's decision script on every daemon (the reply's
//! `limit` and the admissions follow it), cleared, expired by `ttl=`, winning over a
//! static `[[rule.override]]`; bad input answered with `ERR`.

use crate::common;

use common::*;
use std::collections::HashMap;
use std::time::Duration;

const RULES: &str = r#"
[[rule]]
name = "r"
algorithm = "token_bucket"
capacity = 5
refill_rate = 0.000001

[[rule.override]]
key = "gold:acme"
capacity = 50

[[rule]]
name = "w"
algorithm = "fixed_window"
limit = 3
window = "1h"

[[rule]]
name = "both"
all_of = ["r", "w"]

[[rule]]
name = "slots"
algorithm = "concurrency"
limit = 2
"#;

fn fields(line: &str) -> HashMap<String, String> {
    line.split(' ')
        .filter_map(|f| f.split_once('='))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect()
}

/// `limit + 1` CHECKs of cost 1 on `key`: exactly `limit` allowed (the rule's refill is
/// negligible over the test), and the last reply, a DENY, states `limit`.
fn admits(c: &mut Client, rule: &str, key: &str, limit: u64) {
    let burst: Vec<String> = (0..=limit).map(|_| format!("CHECK {rule} {key}")).collect();
    let replies = c.pipeline(&burst);
    let allowed = replies.iter().filter(|r| r.starts_with("ALLOW")).count() as u64;
    assert_eq!(allowed, limit, "{key}: {replies:?}");
    let last = parse_reply(replies.last().unwrap());
    assert_eq!(
        (last.verdict.as_str(), last.limit, last.source.as_str()),
        ("DENY", limit, "redis"),
        "{key}: {replies:?}"
    );
}

#[test]
fn an_override_set_on_one_host_applies_on_another_until_cleared() {
    let cluster = RedisCluster::start();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 200\nprefix = \"rl\"\n[cache]\nttl_ms = 200\n{RULES}",
        toml_str_array(&cluster.addrs())
    );
    let (a, b) = (Daemon::start(&config), Daemon::start(&config));
    let mut on_a = crate::secure_redis::connect_in_redis(&a, "r");
    let mut on_b = crate::secure_redis::connect_in_redis(&b, "r");

    // Set through A; B's next decision (no config push) admits the override's 20.
    assert_eq!(on_a.request("OVERRIDE r t:1 capacity=20"), "OK");
    admits(&mut on_b, "r", "t:1", 20);
    // A reports the overridden parameters and the key drained by B.
    let seen = fields(&on_a.request("INSPECT r t:1"));
    assert_eq!(seen["limit"], "20", "{seen:?}");
    assert_eq!(seen["remaining"], "0", "{seen:?}");
    assert_eq!(seen["param.capacity"], "20", "{seen:?}");
    assert!(
        seen["override"].starts_with("capacity=20,refill_rate="),
        "{seen:?}"
    );
    assert_eq!(seen["override_ttl_ms"], "none", "{seen:?}");
    // RESET deletes the state, not the override.
    assert_eq!(on_a.request("RESET r t:1"), "OK");
    admits(&mut on_a, "r", "t:1", 20);
    // Cleared through B: both hosts are back to the rule's 5 after a reset.
    assert_eq!(on_b.request("OVERRIDE r t:1 clear"), "OK");
    assert_eq!(on_b.request("RESET r t:1"), "OK");
    // A's cached DENY of the key lapses (cache.ttl_ms, then its refresh's grace).
    std::thread::sleep(Duration::from_millis(1000));
    admits(&mut on_a, "r", "t:1", 5);
    assert_eq!(fields(&on_b.request("INSPECT r t:1"))["override"], "none");

    // Run-time beats static: gold:acme's static 50 becomes 7.
    assert_eq!(on_b.request("OVERRIDE r gold:acme capacity=7"), "OK");
    admits(&mut on_a, "r", "gold:acme", 7);

    // A window rule: limit and window, checked as [[rule.override]] checks them.
    assert_eq!(on_a.request("OVERRIDE w t:2 limit=6 window=2h"), "OK");
    admits(&mut on_b, "w", "t:2", 6);
    // The seventh field, the policy window, is the override's.
    let line = on_b.request("CHECK w t:2 0");
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!((f[1], f[6]), ("6", "7200000"), "{line}");
    // A cost above the rule's own limit is refused (ERR COST) by a host that has not
    // decided the key under its override yet, then decided under it.
    assert_eq!(on_a.request("OVERRIDE w t:3 limit=10"), "OK");
    assert!(on_b.request("CHECK w t:3 8").starts_with("ERR COST "));
    assert_eq!(parse_reply(&on_b.request("CHECK w t:3 0")).limit, 10);
    let r = parse_reply(&on_b.request("CHECK w t:3 8"));
    assert_eq!(
        (r.verdict.as_str(), r.limit, r.remaining),
        ("ALLOW", 10, 2),
        "{r:?}"
    );
}

#[test]
fn an_override_with_a_ttl_lapses() {
    let cluster = RedisCluster::start();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 200\nprefix = \"rl\"\n[cache]\nttl_ms = 100\n{RULES}",
        toml_str_array(&cluster.addrs())
    );
    let d = Daemon::start(&config);
    let mut c = crate::secure_redis::connect_in_redis(&d, "r");
    assert_eq!(c.request("OVERRIDE w t:ttl limit=2 ttl=1500ms"), "OK");
    let seen = fields(&c.request("INSPECT w t:ttl"));
    let ttl: u64 = seen["override_ttl_ms"].parse().unwrap();
    assert!((1..=1500).contains(&ttl), "{seen:?}");
    admits(&mut c, "w", "t:ttl", 2);
    std::thread::sleep(Duration::from_millis(1700));
    // Lapsed: the rule's limit again, 2 of its 3 taken under the override.
    let r = parse_reply(&c.request("CHECK w t:ttl 0"));
    assert_eq!((r.limit, r.remaining), (3, 1), "{r:?}");
    assert_eq!(fields(&c.request("INSPECT w t:ttl"))["override"], "none");
}

#[test]
fn bad_overrides_are_refused_with_their_reason() {
    let redis = RedisStandalone::start();
    let d = standalone(&redis);
    let mut c = d.connect();
    for (line, start, names) in [
        ("OVERRIDE r k limit=5", "ERR PARAM ", "limit"),
        ("OVERRIDE r k capacity=abc", "ERR PARAM ", "capacity"),
        ("OVERRIDE r k capacity=0", "ERR PARAM ", "capacity"),
        ("OVERRIDE r k refill_rate=-1", "ERR PARAM ", "refill_rate"),
        ("OVERRIDE r k colour=blue", "ERR PARAM ", "colour"),
        ("OVERRIDE w k window=soon", "ERR PARAM ", "window"),
        ("OVERRIDE r k capacity=5 ttl=never", "ERR PARAM ", "ttl"),
        ("OVERRIDE r k capacity", "ERR PARAM ", "capacity"),
        ("OVERRIDE nope k capacity=5", "ERR RULE ", "nope"),
        ("OVERRIDE both k limit=1", "ERR PARAM ", "composite"),
        ("OVERRIDE slots k limit=1", "ERR PARAM ", "concurrency"),
        ("OVERRIDE r k", "ERR PROTO ", "OVERRIDE"),
    ] {
        let reply = c.request(line);
        assert!(
            reply.starts_with(start) && reply.contains(names),
            "{line}: {reply}"
        );
    }
    // The connection still answers, and nothing changed the rule.
    let r = parse_reply(&c.request("CHECK r k 0"));
    assert_eq!(r.limit, 5, "{r:?}");
}

fn standalone(redis: &RedisStandalone) -> Daemon {
    Daemon::start(&format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 200\n[cache]\nttl_ms = 0\n{RULES}",
        redis.addr()
    ))
}

fn in_redis(d: &Daemon) -> Client {
    let mut c = d.connect();
    assert!(wait_until(Duration::from_secs(10), || {
        parse_reply(&c.request("CHECK r __ready 0")).source == "redis"
    }));
    c
}

#[test]
fn checkall_composites_and_refunds_decide_under_the_override() {
    let redis = RedisStandalone::start();
    let d = standalone(&redis);
    let mut c = in_redis(&d);
    // CHECKALL: the override's 2 of the rule's 5.
    assert_eq!(c.request("OVERRIDE r t:all capacity=2"), "OK");
    let replies = c.pipeline(&vec!["CHECKALL r t:all 1".to_string(); 3]);
    let allowed = replies.iter().filter(|r| r.starts_with("ALLOW ")).count();
    assert_eq!(allowed, 2, "{replies:?}");
    assert!(replies[2].starts_with("DENY "), "{replies:?}");
    // The reply states the override's limit, on ALLOW and on DENY.
    for r in &replies {
        assert_eq!(parse_reply(r).limit, 2, "{replies:?}");
    }
    // A composite's member under an override: w's 1 of its 3 binds.
    assert_eq!(c.request("OVERRIDE w t:m limit=1"), "OK");
    let replies = c.pipeline(&vec!["CHECK both t:m".to_string(); 3]);
    let allowed = replies.iter().filter(|r| r.starts_with("ALLOW ")).count();
    assert_eq!(allowed, 1, "{replies:?}");
    // The binding member is w, under its override's limit of 1.
    let denied = parse_reply(&replies[2]);
    assert_eq!(
        (denied.verdict.as_str(), denied.limit),
        ("DENY", 1),
        "{replies:?}"
    );
    // REFUND is capped at the override's capacity (3), not the rule's (5).
    assert_eq!(c.request("OVERRIDE r t:f capacity=3"), "OK");
    admits(&mut c, "r", "t:f", 3);
    let r = parse_reply(&c.request("REFUND r t:f 10"));
    assert_eq!(
        (r.verdict.as_str(), r.limit, r.remaining),
        ("ALLOW", 3, 3),
        "{r:?}"
    );
    // What the key holds shows once the override is cleared: 3 given back, not 5.
    assert_eq!(c.request("OVERRIDE r t:f clear"), "OK");
    let r = parse_reply(&c.request("CHECK r t:f 0"));
    assert_eq!((r.limit, r.remaining), (5, 3), "{r:?}");
}

#[test]
fn the_fallback_honours_an_override_it_has_seen() {
    let mut redis = RedisStandalone::start();
    let d = standalone(&redis);
    let mut c = in_redis(&d);
    assert_eq!(c.request("OVERRIDE r t:fb capacity=12"), "OK");
    let r = parse_reply(&c.request("CHECK r t:fb 0"));
    assert_eq!((r.limit, r.source.as_str()), (12, "redis"), "{r:?}");
    redis.kill();
    // One daemon alive: its share is the whole override, 12 (the rule's own is 5).
    let burst: Vec<String> = (0..13).map(|_| "CHECK r t:fb".to_string()).collect();
    let replies = c.pipeline(&burst);
    let allowed = replies.iter().filter(|r| r.starts_with("ALLOW ")).count();
    assert_eq!(allowed, 12, "{replies:?}");
    let last = parse_reply(replies.last().unwrap());
    assert_eq!(
        (last.verdict.as_str(), last.limit, last.source.as_str()),
        ("DENY", 12, "local")
    );
    // A key without an override: the rule's 5.
    let burst: Vec<String> = (0..6).map(|_| "CHECK r t:plain".to_string()).collect();
    let allowed = c
        .pipeline(&burst)
        .iter()
        .filter(|r| r.starts_with("ALLOW "))
        .count();
    assert_eq!(allowed, 5);
}
