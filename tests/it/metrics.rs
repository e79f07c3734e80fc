//! The Prometheus endpoint (`[metrics] listen`) of a real daemon, scraped over HTTP:
//! decisions by rule × verdict × source, error replies by code, Redis call latency and
//! errors, the circuit gauge and transitions, cache and local sizes, open connections,
//! reloads.

use crate::common;

use common::*;
use std::time::Duration;

/// The value of the series `name` whose labels include all of `labels`, if present.
fn value(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn wait_for(port: u16, name: &str, labels: &[(&str, &str)], ok: impl Fn(f64) -> bool) -> String {
    let mut body = String::new();
    let found = wait_until(Duration::from_secs(5), || {
        body = scrape(port);
        value(&body, name, labels).is_some_and(&ok)
    });
    assert!(found, "{name} {labels:?} not as expected in:\n{body}");
    body
}

const RULES: &str = r#"
[[rule]]
name = "r1"
algorithm = "token_bucket"
capacity = 3
refill_rate = 0.001

[[rule]]
name = "w1"
algorithm = "fixed_window"
limit = 100
window = "1m"
"#;

#[test]
fn decisions_errors_and_sizes_in_local_mode() {
    let port = free_port();
    let d = Daemon::start(&format!(
        "[redis]\nmode = \"none\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n{RULES}"
    ));
    let mut c = d.connect();
    let lines: Vec<String> = (0..5).map(|_| "CHECK r1 k".to_string()).collect();
    c.pipeline(&lines);
    c.request("CHECK nope k");
    c.request("CHECK w1 a");
    c.request("BOGUS");

    let body = scrape(port);
    let dec = |rule, verdict, source| {
        value(
            &body,
            "ratelimitd_decisions_total",
            &[("rule", rule), ("verdict", verdict), ("source", source)],
        )
    };
    assert_eq!(dec("r1", "allow", "local"), Some(3.0), "{body}");
    assert_eq!(dec("r1", "deny", "local"), Some(2.0), "{body}");
    assert_eq!(dec("w1", "allow", "local"), Some(1.0), "{body}");
    assert_eq!(
        value(&body, "ratelimitd_errors_total", &[("code", "RULE")]),
        Some(1.0)
    );
    assert_eq!(
        value(&body, "ratelimitd_errors_total", &[("code", "PROTO")]),
        Some(1.0)
    );
    // Sizes are sampled every second.
    wait_for(port, "ratelimitd_local_keys", &[], |v| v == 2.0);
    wait_for(port, "ratelimitd_connections", &[], |v| v == 1.0);
    drop(c);
    wait_for(port, "ratelimitd_connections", &[], |v| v == 0.0);

    // A reload is counted by result.
    d.signal(libc::SIGHUP);
    wait_for(port, "ratelimitd_reloads_total", &[("result", "ok")], |v| {
        v == 1.0
    });
    d.write_config("this is not toml");
    d.signal(libc::SIGHUP);
    wait_for(
        port,
        "ratelimitd_reloads_total",
        &[("result", "rejected")],
        |v| v == 1.0,
    );
}

#[test]
fn redis_latency_errors_and_circuit() {
    let mut redis = RedisStandalone::start();
    let port = free_port();
    let d = Daemon::start(&format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 25\n[cache]\nttl_ms = 60000\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n{RULES}",
        redis.addr()
    ));
    let mut c = d.connect();
    for i in 0..10 {
        assert_eq!(
            parse_reply(&c.request(&format!("CHECK w1 k{i}"))).source,
            "redis"
        );
    }
    let body = scrape(port);
    assert_eq!(
        value(&body, "ratelimitd_circuit_open", &[]),
        Some(0.0),
        "{body}"
    );
    assert_eq!(
        value(&body, "ratelimitd_redis_call_seconds_count", &[]),
        Some(10.0),
        "{body}"
    );
    assert!(
        body.contains("ratelimitd_redis_call_seconds_bucket{le=\"0.025\"}"),
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            "ratelimitd_decisions_total",
            &[("rule", "w1"), ("verdict", "allow"), ("source", "redis")]
        ),
        Some(10.0)
    );
    // A hot denied key is then answered by the cache.
    for _ in 0..6 {
        c.request("CHECK r1 hot");
    }
    let body = scrape(port);
    assert_eq!(
        value(
            &body,
            "ratelimitd_decisions_total",
            &[("rule", "r1"), ("verdict", "deny"), ("source", "cache")]
        ),
        Some(2.0),
        "{body}"
    );
    wait_for(port, "ratelimitd_cache_entries", &[], |v| v == 1.0);

    // Redis gone: an error by kind, the circuit opens, decisions go local.
    redis.kill();
    let r = c.request("CHECK w1 after");
    assert_eq!(parse_reply(&r).source, "local", "{r}");
    let body = wait_for(port, "ratelimitd_circuit_open", &[], |v| v == 1.0);
    assert_eq!(
        value(
            &body,
            "ratelimitd_circuit_transitions_total",
            &[("to", "open")]
        ),
        Some(1.0)
    );
    let errors: f64 = body
        .lines()
        .filter(|l| l.starts_with("ratelimitd_redis_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(errors >= 1.0, "{body}");
    // And back.
    redis.restart();
    wait_for(port, "ratelimitd_circuit_open", &[], |v| v == 0.0);
}
