//! The configuration's unit tests: a full file parsed, an empty one, and each kind of
//! mistake named with its field and line; every algorithm's parameters.

use super::*;
use crate::algorithm::{self, Kind, Per, WindowParams};

const GOOD: &str = r#"
[server]
socket = "/tmp/x.sock"
socket_mode = "0600"

[redis]
mode = "cluster"
nodes = ["127.0.0.1:7000", "127.0.0.1:7001"]
timeout_ms = 30

[[rule]]
name = "rides_request"
algorithm = "token_bucket"
capacity = 20
refill_rate = 10.0
on_redis_failure = "deny"
fallback_hosts = 2
"#;

fn err(text: &str) -> String {
    Config::parse(text, "t.toml").unwrap_err().to_string()
}

#[test]
fn parses_a_full_config() {
    let c = Config::parse(GOOD, "t.toml").unwrap();
    assert_eq!(c.server.socket_mode, 0o600);
    assert_eq!(c.server.max_line_bytes, 1024);
    assert_eq!(c.redis.mode, RedisMode::Cluster);
    assert_eq!(c.redis.timeout_ms, 30);
    let r = &c.rules["rides_request"];
    assert_eq!(r.limit(), 20);
    assert_eq!(r.on_redis_failure, OnRedisFailure::Deny);
    assert_eq!(r.fallback_hosts, 2);
}

#[test]
fn empty_config_is_local_only() {
    let c = Config::parse("", "t.toml").unwrap();
    assert_eq!(c.redis.mode, RedisMode::None);
    assert!(c.rules.is_empty());
}

#[test]
fn misspelt_field_is_named_with_its_line() {
    let e = err(&GOOD.replace("refill_rate", "refil_rate"));
    assert!(e.contains("refil_rate") && e.contains("line 15"), "{e}");
    let e = err(&GOOD.replace("timeout_ms", "timeout"));
    assert!(e.contains("timeout") && e.contains("line 9"), "{e}");
}

#[test]
fn bad_values_are_named_with_their_line() {
    for (from, to, field, line) in [
        ("capacity = 20", "capacity = 0", "rule[0].capacity", 14),
        (
            "refill_rate = 10.0",
            "refill_rate = 0.0",
            "rule[0].refill_rate",
            15,
        ),
        ("timeout_ms = 30", "timeout_ms = 0", "redis.timeout_ms", 9),
        ("\"0600\"", "\"0999\"", "server.socket_mode", 4),
        (
            "fallback_hosts = 2",
            "fallback_hosts = 0",
            "rule[0].fallback_hosts",
            17,
        ),
        ("\"127.0.0.1:7001\"", "\"nope\"", "redis.nodes", 8),
        (
            "refill_rate = 10.0",
            "window = \"1s\"",
            "rule[0].window",
            15,
        ),
        ("rides_request", "bad name", "rule[0].name", 12),
        ("\"deny\"", "\"maybe\"", "maybe", 16),
    ] {
        let e = err(&GOOD.replace(from, to));
        assert!(e.contains(field), "{field}: {e}");
        assert!(
            e.contains(&format!("line {line}")) || e.contains(&format!(":{line}:")),
            "{field} line {line}: {e}"
        );
    }
}

#[test]
fn missing_parameter_and_duplicate_rule() {
    let e = err(&GOOD.replace("refill_rate = 10.0\n", ""));
    assert!(e.contains("rule[0].refill_rate"), "{e}");
    let twice = format!("{GOOD}\n[[rule]]\nname = \"rides_request\"\nalgorithm = \"token_bucket\"\ncapacity = 1\nrefill_rate = 1.0\n");
    assert!(err(&twice).contains("defined twice"));
    let e = err("\n[redis]\nmode = \"cluster\"\n");
    assert!(e.contains(":2: redis.nodes"), "{e}");
    let none_nodes = GOOD.replace(
        "nodes = [\"127.0.0.1:7000\", \"127.0.0.1:7001\"]",
        "nodes = []",
    );
    assert!(err(&none_nodes).contains("redis.nodes"));
}

const FIVE: &str = r#"
[[rule]]
name = "tb"
algorithm = "token_bucket"
capacity = 20
refill_rate = 10.0

[[rule]]
name = "lb"
algorithm = "leaky_bucket"
capacity = 5000
leak_rate = 3000.0

[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 100
window = "1m"

[[rule]]
name = "swl"
algorithm = "sliding_window_log"
limit = 5
window = "15m"

[[rule]]
name = "swc"
algorithm = "sliding_window_counter"
limit = 600
window = "500ms"
fallback_hosts = 4
"#;

#[test]
fn parses_all_five_algorithms() {
    let c = Config::parse(FIVE, "t.toml").unwrap();
    assert_eq!(
        c.rules["lb"].algorithm,
        Algorithm {
            kind: Kind::LeakyBucket,
            limit: 5000,
            per: Per::Rate(3000.0)
        }
    );
    assert_eq!(
        c.rules["fw"].algorithm,
        Algorithm {
            kind: Kind::FixedWindow,
            limit: 100,
            per: Per::WindowMs(60_000)
        }
    );
    assert_eq!(c.rules["swl"].limit(), 5);
    let swc = &c.rules["swc"];
    assert_eq!(
        swc.fallback_params,
        algorithm::Params::SlidingWindowCounter(WindowParams {
            limit: 150.0,
            window: 500_000.0
        })
    );
}

#[test]
fn window_rules_are_checked_field_by_field() {
    for (from, to, field, says) in [
        (
            "window = \"1m\"",
            "window = \"1x\"",
            "rule[2].window",
            "not a duration",
        ),
        (
            "window = \"1m\"",
            "window = \"1500us\"",
            "rule[2].window",
            "whole number of ms",
        ),
        (
            "window = \"1m\"",
            "window = \"31d\"",
            "rule[2].window",
            "30d",
        ),
        ("window = \"1m\"", "", "rule[2].window", "needs 'window'"),
        ("limit = 5\n", "limit = 20000\n", "rule[3].limit", "10000"),
        (
            "limit = 100",
            "capacity = 100",
            "rule[2].capacity",
            "fixed_window has no 'capacity'",
        ),
        (
            "leak_rate = 3000.0",
            "leak_rate = 0.0",
            "rule[1].leak_rate",
            "units/s",
        ),
        (
            "leak_rate = 3000.0",
            "refill_rate = 1.0",
            "rule[1].refill_rate",
            "has no 'refill_rate'",
        ),
    ] {
        let e = err(&FIVE.replacen(from, to, 1));
        assert!(e.contains(field) && e.contains(says), "{field}: {e}");
    }
}
