//! `REFUND`: units given back to a key in Redis, per algorithm, never beyond its
//! capacity or limit and never into a window other than the current one; and the undo
//! of a `CHECKALL` reservation, per algorithm, on a real cluster: a denied request
//! leaves the other limits exactly as they were.

use crate::common;
use crate::secure_redis;

use common::*;
use secure_redis::{Flavor, TestCluster};
use std::time::Duration;

/// One rule per algorithm, each with a limit of 5 that does not come back within a
/// test (buckets at 10⁻⁶/s, windows of an hour).
const FIVE: &str = r#"
[[rule]]
name = "tb"
algorithm = "token_bucket"
capacity = 5
refill_rate = 0.000001

[[rule]]
name = "lb"
algorithm = "leaky_bucket"
capacity = 5
leak_rate = 0.000001

[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 5
window = "1h"

[[rule]]
name = "swl"
algorithm = "sliding_window_log"
limit = 5
window = "1h"

[[rule]]
name = "swc"
algorithm = "sliding_window_counter"
limit = 5
window = "1h"

[[rule]]
name = "second"
algorithm = "fixed_window"
limit = 5
window = "1s"

[[rule]]
name = "swl20"
algorithm = "sliding_window_log"
limit = 20
window = "1h"

[[rule]]
name = "gate"
algorithm = "token_bucket"
capacity = 1
refill_rate = 0.000001
"#;

const RULES: [&str; 5] = ["tb", "lb", "fw", "swl", "swc"];

fn standalone_config(redis: &RedisStandalone) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 200\n[cache]\nttl_ms = 0\n{FIVE}",
        redis.addr()
    )
}

#[test]
fn refunds_stay_within_the_limit_for_every_algorithm() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    for rule in RULES {
        // Taken in two admissions (two log entries for the log): 1, then 2.
        assert!(c.request(&format!("CHECK {rule} k 1")).starts_with("ALLOW"));
        assert!(c
            .request(&format!("CHECK {rule} k 2"))
            .starts_with("ALLOW 5 2 "));
        // One unit back: 3 remain (the log's newest entry gives it).
        let r = parse_reply(&c.request(&format!("REFUND {rule} k 1")));
        assert_eq!(
            (r.verdict.as_str(), r.limit, r.remaining, r.source.as_str()),
            ("ALLOW", 5, 3, "redis"),
            "{rule}"
        );
        // More than was taken: capped at the limit.
        let r = parse_reply(&c.request(&format!("REFUND {rule} k 100")));
        assert_eq!(r.remaining, 5, "{rule}: {r:?}");
        // And the limit holds: exactly 5 more, then a DENY.
        assert!(
            c.request(&format!("CHECK {rule} k 5"))
                .starts_with("ALLOW 5 0 "),
            "{rule}"
        );
        assert!(
            c.request(&format!("CHECK {rule} k 1")).starts_with("DENY"),
            "{rule}"
        );
        // A key never used: nothing to give back, nothing created.
        let r = parse_reply(&c.request(&format!("REFUND {rule} fresh 3")));
        assert_eq!(r.remaining, 5, "{rule}");
    }
    assert_eq!(redis.cli(&["EXISTS", "rl:{tb:fresh}:tb"]), "0");
}

#[test]
fn a_refund_never_reaches_into_an_earlier_window() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    // Drain one 1 s window, then refund in the next one: the new window is unused, and
    // the refund must not make it hold more than its limit.
    let drained = wait_until(Duration::from_secs(5), || {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        // Far enough from the window's end for the CHECK to land in it.
        now_ms % 1000 < 500 && c.request("CHECK second w 5").starts_with("ALLOW 5 0 ")
    });
    assert!(drained);
    assert!(c.request("CHECK second w 1").starts_with("DENY"));
    std::thread::sleep(Duration::from_millis(1100));
    let r = parse_reply(&c.request("REFUND second w 5"));
    assert_eq!(r.remaining, 5);
    assert!(c.request("CHECK second w 5").starts_with("ALLOW 5 0 "));
    assert!(c.request("CHECK second w 1").starts_with("DENY"));
}

#[test]
fn refund_errors() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    for (line, code) in [
        ("REFUND tb k", "ERR PROTO"),
        ("REFUND tb k 1 2", "ERR PROTO"),
        ("REFUND tb k -1", "ERR COST"),
        ("REFUND nope k 1", "ERR RULE"),
    ] {
        let r = c.request(line);
        assert!(r.starts_with(code), "{line}: {r}");
    }
}

plain_and_tls!(a_denied_checkall_leaves_every_algorithm_as_it_was);

/// A denied CHECKALL gives every other triple's reservation back, whatever its
/// algorithm: the `gate` bucket (capacity 1, drained) denies on one slot, each
/// algorithm's key is reserved on another and must end as it was. Also over TLS with
/// the documented least-privilege ACL user, which must refuse the give-back nothing.
fn a_denied_checkall_leaves_every_algorithm_as_it_was(flavor: Flavor) {
    let cluster = TestCluster::start(flavor);
    let config = format!(
        "[redis]\n{}timeout_ms = 200\n[cache]\nttl_ms = 0\n{FIVE}",
        cluster.redis_fields()
    );
    let d = Daemon::start(&config);
    let mut c = d.connect();
    assert!(wait_until(Duration::from_secs(15), || {
        (0..30)
            .all(|i| parse_reply(&c.request(&format!("CHECK gate __ready{i} 0"))).source == "redis")
    }));
    let slot = |k: &str| cluster.cli(&cluster.primary_addrs()[0], &["CLUSTER", "KEYSLOT", k]);
    for rule in RULES {
        assert_ne!(
            slot(&format!("{rule}:k")),
            slot("gate:k"),
            "{rule} shares gate's slot"
        );
    }
    leaves_every_algorithm_as_it_was(&mut c);
    // A log of more entries than the give-back reads at first (8).
    for _ in 0..12 {
        assert!(c.request("CHECK swl20 many 1").starts_with("ALLOW"));
    }
    assert!(c
        .request("REFUND swl20 many 10")
        .starts_with("ALLOW 20 18 "));
    assert!(c.request("CHECK swl20 many 18").starts_with("ALLOW 20 0 "));
    assert!(c.request("CHECK swl20 many 1").starts_with("DENY"));
    cluster.assert_no_acl_denials();
}

/// The same on one standalone Redis: each key and `gate` in one script, each key taken
/// first, then given back inside the script when `gate` denies.
#[test]
fn a_denied_checkall_in_one_script_leaves_every_algorithm_as_it_was() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    assert!(wait_until(Duration::from_secs(10), || {
        parse_reply(&c.request("CHECK gate __ready 0")).source == "redis"
    }));
    leaves_every_algorithm_as_it_was(&mut c);
}

fn leaves_every_algorithm_as_it_was(c: &mut Client) {
    assert!(c.request("CHECK gate k 1").starts_with("ALLOW 1 0 "));
    for rule in RULES {
        // Some units taken for real first, so the give-back meets a used state.
        assert!(c
            .request(&format!("CHECK {rule} k 2"))
            .starts_with("ALLOW 5 3 "));
        for _ in 0..3 {
            let r = c.request(&format!("CHECKALL {rule} k 1 gate k 1"));
            assert!(
                r.starts_with("DENY 1 0 ") && r.ends_with(" gate"),
                "{rule}: {r}"
            );
        }
        let r = parse_reply(&c.request(&format!("CHECK {rule} k 0")));
        assert_eq!(
            (r.remaining, r.source.as_str()),
            (3, "redis"),
            "{rule} kept a reservation"
        );
        // And its other units are still all there: exactly 3 more.
        assert!(
            c.request(&format!("CHECK {rule} k 3"))
                .starts_with("ALLOW 5 0 "),
            "{rule}"
        );
        assert!(
            c.request(&format!("CHECK {rule} k 1")).starts_with("DENY"),
            "{rule}"
        );
    }
}
