//! A run-time override kept in the key's state hash moves with the state in a Redis
//! Cluster slot migration: only the state key is migrated, and the decisions on the
//! new owner, during the migration (`ASK`) and after it (`MOVED`), are made under the
//! override.

use crate::cluster_slots::Migration;
use crate::common;
use crate::secure_redis::{connect_in_redis, Flavor, TestCluster};

use common::*;
use std::time::Duration;

#[test]
fn an_override_moves_with_its_state() {
    let cluster = TestCluster::start(Flavor::Plain);
    let d = Daemon::start(&format!(
        "[redis]\n{}timeout_ms = 200\nprefix = \"rl\"\n[cache]\nttl_ms = 0\n\
         [[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrefill_rate = 0.001\n",
        cluster.redis_fields()
    ));
    let mut c = connect_in_redis(&d, "tb");
    let key = "rl:{tb:ovm}:tb";
    assert_eq!(c.request("OVERRIDE tb ovm capacity=4"), "OK");
    let r = parse_reply(&c.request("CHECK tb ovm"));
    assert_eq!(
        (r.verdict.as_str(), r.limit, r.remaining, r.source.as_str()),
        ("ALLOW", 4, 3, "redis"),
        "{r:?}"
    );
    // Only the state key moves: the override is in it.
    let m = Migration::start(&cluster, Flavor::Plain, key);
    let during = parse_reply(&c.request("CHECK tb ovm"));
    assert_eq!(
        (during.source.as_str(), during.limit, during.remaining),
        ("redis", 4, 2),
        "decided on the new owner under the override: {during:?}"
    );
    m.finish(&cluster);
    let mut after = parse_reply(&c.request("CHECK tb ovm 0"));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while after.source != "redis" && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        after = parse_reply(&c.request("CHECK tb ovm 0"));
    }
    assert_eq!(
        (after.source.as_str(), after.limit, after.remaining),
        ("redis", 4, 2),
        "{after:?}"
    );
    let r = parse_reply(&c.request("CHECK tb ovm 3"));
    assert_eq!(
        (r.verdict.as_str(), r.limit, r.source.as_str()),
        ("DENY", 4, "redis"),
        "{r:?}"
    );
    assert_eq!(cluster.cli(&m.dst, &["EXISTS", key]), "1");
}
