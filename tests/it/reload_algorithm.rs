//! A reload cannot change a rule's algorithm: its keys in Redis carry the algorithm's
//! suffix, so every key of the rule would start fresh (a drained key with a full
//! budget). SIGHUP with such a file is rejected whole, the log names the rule and both
//! algorithms, and the rule in force keeps deciding: a drained key stays denied. Real
//! daemon, real Redis, deny cache off (every decision is Redis's).

use crate::common;

use common::*;
use std::time::Duration;

fn config(redis: &RedisStandalone, rule: &str) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 200\n\
         [cache]\nttl_ms = 0\n\n[[rule]]\nname = \"x\"\n{rule}\n",
        redis.addr()
    )
}

const BUCKET: &str = "algorithm = \"token_bucket\"\ncapacity = 3\nrefill_rate = 0.0005";
const WINDOW: &str = "algorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1h\"";

#[test]
fn a_reload_changing_a_rules_algorithm_is_rejected_and_the_old_rule_keeps_deciding() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&config(&redis, BUCKET));
    let mut c = d.connect();
    for i in 0..3 {
        let r = parse_reply(&c.request("CHECK x k"));
        assert!(r.allowed() && r.source == "redis", "request {i}: {r:?}");
    }
    let drained = parse_reply(&c.request("CHECK x k"));
    assert!(
        !drained.allowed() && drained.source == "redis",
        "{drained:?}"
    );

    d.write_config(&config(&redis, WINDOW));
    d.signal(libc::SIGHUP);
    let want = "rule 'x': algorithm changed from token_bucket to fixed_window; a reload cannot change a rule's algorithm (its keys in Redis would start fresh): give the rule a new name, or restart";
    assert!(
        wait_until(Duration::from_secs(5), || d.log().contains(want)),
        "{}",
        d.log_tail(10)
    );
    let log = d.log();
    let line = log.lines().find(|l| l.contains(want)).unwrap();
    assert!(
        line.contains("ERROR") && line.contains("the old one stays in force"),
        "{line}"
    );
    assert!(!log.contains("SIGHUP: configuration reloaded"), "{log}");

    // The token bucket still decides: the drained key stays denied, on the bucket's
    // terms (a fresh fixed window would admit 3 more).
    for i in 0..5 {
        let r = parse_reply(&c.request("CHECK x k"));
        assert!(!r.allowed() && r.source == "redis", "request {i}: {r:?}");
        assert_eq!(r.limit, 3);
    }
    // A fresh key is still a bucket of 3: its reset is the bucket's refill (3 tokens
    // at 0.0005/s: 6,000 s), not the end of an hour's window.
    let fresh = parse_reply(&c.request("CHECK x other 3"));
    assert!(fresh.allowed(), "{fresh:?}");
    assert!(fresh.reset_ms > 3_600_000, "{fresh:?}");

    // The same file with the bucket's algorithm reloads as usual.
    d.write_config(&config(
        &redis,
        &BUCKET.replace("capacity = 3", "capacity = 4"),
    ));
    d.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(5), || d
            .log()
            .contains("SIGHUP: configuration reloaded")),
        "{}",
        d.log_tail(10)
    );
    assert_eq!(parse_reply(&c.request("CHECK x k 0")).limit, 4);
}
