//! Run-time overrides (`OVERRIDE`) on rules with `lease = "auto"`: the lease scripts
//! decide an overridden key under the override and grant no lease on it, so every
//! daemon decides it per request in Redis (source `redis`, the override's `limit`);
//! once cleared, the key is leased again under the rule. Overrides that lower the rule
//! (capacity, limit, another window) are taken as those that raise it. (Under load,
//! with leases out when the override is set: `tests/serial/leases/overrides.rs`.)

use crate::common;

use common::*;
use std::collections::HashMap;

/// Refills negligible over the test: a burst's admissions are the capacity or limit.
const RULES: &str = r#"
[[rule]]
name = "tb"
algorithm = "token_bucket"
capacity = 100
refill_rate = 0.00001
lease = "auto"

[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 50
window = "1h"
lease = "auto"
"#;

fn fields(line: &str) -> HashMap<String, String> {
    line.split(' ')
        .filter_map(|f| f.split_once('='))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect()
}

/// `n` CHECKs of `key` pipelined: (ALLOWs, the sources seen, the limits stated, a
/// DENY among the replies if any). A hot key's requests may be decided in Redis in
/// another order than sent (a call in flight, and those behind it): the DENYs are not
/// all last.
fn burst(
    c: &mut Client,
    rule: &str,
    key: &str,
    n: usize,
) -> (usize, Vec<String>, Vec<u64>, Option<Reply>) {
    let lines: Vec<String> = (0..n).map(|_| format!("CHECK {rule} {key}")).collect();
    let replies: Vec<Reply> = c.pipeline(&lines).iter().map(|r| parse_reply(r)).collect();
    let allowed = replies.iter().filter(|r| r.allowed()).count();
    let set = |f: fn(&Reply) -> String| {
        let mut v: Vec<String> = replies.iter().map(f).collect();
        v.sort();
        v.dedup();
        v
    };
    let sources = set(|r| r.source.clone());
    let limits = set(|r| r.limit.to_string())
        .iter()
        .map(|l| l.parse().unwrap())
        .collect();
    let denied = replies.iter().find(|r| !r.allowed()).cloned();
    (allowed, sources, limits, denied)
}

#[test]
fn an_override_on_a_leased_rule_is_decided_per_request_on_every_host() {
    let cluster = RedisCluster::start();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 500\nprefix = \"rl\"\n{RULES}",
        toml_str_array(&cluster.addrs())
    );
    let (a, b) = (Daemon::start(&config), Daemon::start(&config));
    let mut on_a = crate::secure_redis::connect_in_redis(&a, "tb");
    let mut on_b = crate::secure_redis::connect_in_redis(&b, "tb");

    // Lowered through A, on keys with no lease out: B's bursts, hot as they are, are
    // decided in Redis under the override at once (leases out when an override is
    // written are spent for at most one lifetime more: tests/serial/leases/overrides.rs).
    assert_eq!(on_a.request("OVERRIDE tb t:3 capacity=20"), "OK");
    let (allowed, sources, limits, _) = burst(&mut on_b, "tb", "t:3", 60);
    assert_eq!(
        (allowed, &sources[..], &limits[..]),
        (20, &["redis".to_string()][..], &[20][..])
    );
    assert_eq!(on_a.request("OVERRIDE fw t:4 limit=40 window=2h"), "OK");
    let (allowed, sources, limits, _) = burst(&mut on_b, "fw", "t:4", 60);
    assert_eq!(
        (allowed, &sources[..], &limits[..]),
        (40, &["redis".to_string()][..], &[40][..])
    );
    let seen = fields(&on_b.request("INSPECT fw t:4"));
    assert_eq!(seen["lease_grants"], "0", "{seen:?}");
    assert!(fields(&on_a.request("INSPECT tb t:1"))["override"] == "none");

    // Raised through A: B's burst, hot as it is, is decided in Redis, 150 of 200.
    assert_eq!(on_a.request("OVERRIDE tb t:1 capacity=150"), "OK");
    let (allowed, sources, limits, denied) = burst(&mut on_b, "tb", "t:1", 200);
    assert_eq!(
        (allowed, &sources[..], &limits[..]),
        (150, &["redis".to_string()][..], &[150][..])
    );
    assert_eq!(denied.map(|d| d.remaining), Some(0));
    let seen = fields(&on_a.request("INSPECT tb t:1"));
    assert_eq!(
        (seen["limit"].as_str(), seen["remaining"].as_str()),
        ("150", "0"),
        "{seen:?}"
    );
    assert_eq!(seen["lease_grants"], "0", "{seen:?}");
    // Cleared through B, the key reset: A leases it again, under the rule's 100.
    assert_eq!(on_b.request("OVERRIDE tb t:1 clear"), "OK");
    assert_eq!(on_b.request("RESET tb t:1"), "OK");
    let (allowed, sources, limits, _) = burst(&mut on_a, "tb", "t:1", 150);
    assert_eq!((allowed, &limits[..]), (100, &[100][..]), "{sources:?}");
    assert!(sources.contains(&"lease".to_string()), "{sources:?}");

    // A window, raised above the rule's 50 through B: A admits the override's 70.
    assert_eq!(on_b.request("OVERRIDE fw t:2 limit=70"), "OK");
    let (allowed, sources, limits, denied) = burst(&mut on_a, "fw", "t:2", 100);
    assert_eq!(
        (allowed, &sources[..], &limits[..]),
        (70, &["redis".to_string()][..], &[70][..])
    );
    assert_eq!(denied.map(|d| d.remaining), Some(0));
    let r = parse_reply(&on_b.request("CHECK fw t:2 0"));
    assert_eq!(
        (r.limit, r.remaining, r.source.as_str()),
        (70, 0, "redis"),
        "{r:?}"
    );
}
