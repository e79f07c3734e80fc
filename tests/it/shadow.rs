//! Shadow rules (`shadow = true`): decided and counted as usual, always answered ALLOW
//! with the source that decided; the would-be DENYs counted as
//! `ratelimitd_decisions_total{verdict="shadow_deny"}` and logged at most once a minute
//! per rule, without the key. A reload flips a rule between shadow and enforcing and
//! keeps every key's state. Real daemon, real Redis, deny cache off (every decision is
//! Redis's) unless said otherwise.

use crate::common;

use common::*;
use std::time::Duration;

/// The value of the series `name` with all of `labels` (0 when absent).
fn value(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(body, name, labels).unwrap_or(0.0)
}

fn config(redis: &RedisStandalone, port: u16, shadow: bool, ttl_ms: u64) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 200\n\
         [cache]\nttl_ms = {ttl_ms}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n\
         [[rule]]\nname = \"new_rule\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1h\"\nshadow = {shadow}\n",
        redis.addr()
    )
}

const LOGGED: &str = "shadow rule would have denied a request";

#[test]
fn a_shadow_rule_answers_allow_and_counts_what_it_would_have_denied() {
    let redis = RedisStandalone::start();
    let port = free_port();
    let d = Daemon::start(&config(&redis, port, true, 0));
    let mut c = d.connect();
    assert!(wait_until(Duration::from_secs(10), || {
        parse_reply(&c.request("CHECK new_rule __ready 0")).source == "redis"
    }));
    // 3 admitted, then 5 that an enforcing rule would deny: all ALLOW, from Redis.
    let lines: Vec<String> = (0..8)
        .map(|_| "CHECK new_rule user:1".to_string())
        .collect();
    let replies: Vec<Reply> = c.pipeline(&lines).iter().map(|l| parse_reply(l)).collect();
    for (i, r) in replies.iter().enumerate() {
        assert!(r.allowed() && r.source == "redis", "request {i}: {r:?}");
        assert_eq!(r.remaining, 2u64.saturating_sub(i as u64), "request {i}");
        assert_eq!(r.wait_ms, 0, "request {i}");
    }
    let body = scrape(port);
    let count = |verdict| {
        value(
            &body,
            "ratelimitd_decisions_total",
            &[
                ("rule", "new_rule"),
                ("verdict", verdict),
                ("source", "redis"),
            ],
        )
    };
    // The readiness probe (cost 0) was one more ALLOW.
    assert_eq!(
        (count("allow"), count("shadow_deny"), count("deny")),
        (4.0, 5.0, 0.0),
        "{body}"
    );
    // TOP counts them as decided: 8 decisions, 5 denies.
    let top: serde_json::Value = serde_json::from_str(&c.request("TOP new_rule 1")).unwrap();
    let k = &top["keys"][0];
    assert_eq!(
        (&k["key"], &k["decisions"], &k["denies"]),
        (&"user:1".into(), &8.into(), &5.into()),
        "{top}"
    );
    // Logged once for the five, without the key.
    assert!(wait_until(Duration::from_secs(5), || d
        .log()
        .contains(LOGGED)));
    let log = d.log();
    assert_eq!(log.matches(LOGGED).count(), 1, "{log}");
    assert!(!log.contains("user:1"), "{log}");
}

#[test]
fn a_reload_flips_a_rule_between_shadow_and_enforcing_keeping_its_state() {
    let redis = RedisStandalone::start();
    let port = free_port();
    // With the deny cache on: a cached DENY is shadowed too.
    let d = Daemon::start(&config(&redis, port, false, 5000));
    let mut c = d.connect();
    assert!(wait_until(Duration::from_secs(10), || {
        parse_reply(&c.request("CHECK new_rule __ready 0")).source == "redis"
    }));
    let reload = |shadow: bool, n: usize| {
        d.write_config(&config(&redis, port, shadow, 5000));
        d.signal(libc::SIGHUP);
        assert!(
            wait_until(Duration::from_secs(5), || {
                value(
                    &scrape(port),
                    "ratelimitd_reloads_total",
                    &[("result", "ok")],
                ) >= n as f64
            }),
            "{}",
            d.log_tail(10)
        );
    };
    for _ in 0..3 {
        assert!(parse_reply(&c.request("CHECK new_rule k")).allowed());
    }
    let r = parse_reply(&c.request("CHECK new_rule k"));
    assert!(!r.allowed() && r.source == "redis", "{r:?}");
    let r = parse_reply(&c.request("CHECK new_rule k"));
    assert!(!r.allowed() && r.source == "cache", "{r:?}");

    // To shadow: the drained key stays drained (remaining 0) but is answered ALLOW.
    reload(true, 1);
    let r = parse_reply(&c.request("CHECK new_rule k"));
    assert!(
        r.allowed() && r.remaining == 0 && r.source == "redis",
        "{r:?}"
    );
    let r = parse_reply(&c.request("CHECK new_rule k"));
    assert!(
        r.allowed() && r.remaining == 0 && r.source == "cache",
        "{r:?}"
    );
    let body = scrape(port);
    let shadowed = |source| {
        value(
            &body,
            "ratelimitd_decisions_total",
            &[
                ("rule", "new_rule"),
                ("verdict", "shadow_deny"),
                ("source", source),
            ],
        )
    };
    assert_eq!((shadowed("redis"), shadowed("cache")), (1.0, 1.0), "{body}");

    // Back to enforcing: still drained, denied; no fresh budget came with the flips.
    reload(false, 2);
    let r = parse_reply(&c.request("CHECK new_rule k"));
    assert!(
        !r.allowed() && r.remaining == 0 && r.source == "redis",
        "{r:?}"
    );
    assert!(c
        .request("INSPECT new_rule k")
        .contains("param.shadow=false"));
}
