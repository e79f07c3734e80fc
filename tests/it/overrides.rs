//! Per-key overrides (tiers), static: `[[rule.override]]` with `key` or `key_prefix`
//! gives those keys other parameters, seen by every daemon (they read the same file),
//! decided in Redis with the override's parameters, and the reply's `limit` is the
//! override's; also inside `CHECKALL`, and without Redis.

use crate::common;

use common::*;

const TIERS: &str = r#"
[[rule]]
name = "r"
algorithm = "token_bucket"
capacity = 5
refill_rate = 0.000001

[[rule.override]]
key_prefix = "gold:"
capacity = 20

[[rule.override]]
key = "gold:acme"
capacity = 50
"#;

fn tiers_apply(d: &Daemon, source: &str) {
    let mut c = d.connect();
    for (key, limit) in [("gold:acme", 50), ("gold:other", 20), ("plain", 5)] {
        let burst: Vec<String> = (0..=limit).map(|_| format!("CHECK r {key}")).collect();
        let replies = c.pipeline(&burst);
        let allowed = replies.iter().filter(|r| r.starts_with("ALLOW")).count() as u64;
        assert_eq!(allowed, limit, "{key}: {replies:?}");
        let last = parse_reply(replies.last().unwrap());
        assert_eq!(
            (last.verdict.as_str(), last.limit, last.source.as_str()),
            ("DENY", limit, source),
            "{key}"
        );
    }
    let r = c.request("CHECKALL r gold:new 1");
    assert!(r.starts_with("ALLOW 20 19 ") && r.ends_with(" r"), "{r}");
}

#[test]
fn static_overrides_apply_in_redis() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 200\n{TIERS}",
        redis.addr()
    ));
    let mut c = d.connect();
    assert!(wait_until(std::time::Duration::from_secs(10), || {
        parse_reply(&c.request("CHECK r __ready 0")).source == "redis"
    }));
    tiers_apply(&d, "redis");
}

#[test]
fn static_overrides_apply_without_redis() {
    let d = Daemon::start(&format!("[redis]\nmode = \"none\"\n{TIERS}"));
    tiers_apply(&d, "local");
}
