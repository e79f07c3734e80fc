//! The metrics an operator alerts on: `ratelimitd_primary_up{primary}` flips to 0 for a
//! primary frozen with `SIGSTOP` (only that one: the others stay 1) and back to 1 once
//! it answers again, with `ratelimitd_primary_transitions_total{primary,to}` counting
//! both; `ratelimitd_build_info{version,commit}` is 1. Real daemon, real 6-node Redis
//! Cluster, metrics scraped over HTTP.

use crate::common;

use common::metric_value as value;
use common::*;
use std::time::{Duration, Instant};

#[test]
fn the_per_primary_gauge_flips_for_a_frozen_primary_and_back() {
    let cluster = RedisCluster::start();
    let port = free_port();
    let d = Daemon::start(&format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 100\n[cache]\nttl_ms = 0\n\
         [metrics]\nlisten = \"127.0.0.1:{port}\"\n\
         [[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\ncapacity = 1000000\nrefill_rate = 1000.0\n",
        toml_str_array(&cluster.addrs())
    ));
    let mut c = crate::secure_redis::connect_in_redis(&d, "api");
    let primaries = cluster.primary_addrs();
    assert_eq!(primaries.len(), 3);
    let up = |body: &str, p: &str| value(body, "ratelimitd_primary_up", &[("primary", p)]);
    let body = scrape(port);
    for p in &primaries {
        assert_eq!(up(&body, p), Some(1.0), "{p} in:\n{body}");
    }
    // Build info: the binary's version and commit.
    let version = env!("CARGO_PKG_VERSION");
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        value(
            &body,
            "ratelimitd_build_info",
            &[("version", version), ("commit", &commit)]
        ),
        Some(1.0),
        "{body}"
    );

    // Freeze one primary; requests spread over the slots reach it and time out until
    // its breaker opens (3 failures in a row over at least redis.timeout_ms).
    let frozen = primaries[0].clone();
    let guard = cluster.freeze(&frozen);
    let keys: Vec<String> = (0..30).map(|i| format!("CHECK api k{i}")).collect();
    let began = Instant::now();
    let mut body = String::new();
    let flipped = wait_until(Duration::from_secs(5), || {
        c.pipeline(&keys);
        body = scrape(port);
        up(&body, &frozen) == Some(0.0)
    });
    println!("gauge of {frozen} at 0 after {:?}", began.elapsed());
    assert!(
        flipped,
        "{frozen} never bypassed:\n{body}\n{}",
        d.log_tail(10)
    );
    for p in &primaries[1..] {
        assert_eq!(
            up(&body, p),
            Some(1.0),
            "a healthy primary {p} stays up:\n{body}"
        );
    }
    let transitions = |body: &str, to: &str| {
        value(
            body,
            "ratelimitd_primary_transitions_total",
            &[("primary", &frozen), ("to", to)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(transitions(&body, "down"), 1.0, "{body}");
    assert_eq!(transitions(&body, "up"), 0.0, "{body}");

    // Thawed: the probe closes its breaker, the gauge is back at 1.
    drop(guard);
    let back = wait_until(Duration::from_secs(5), || {
        body = scrape(port);
        up(&body, &frozen) == Some(1.0)
    });
    assert!(back, "{frozen} never back:\n{body}\n{}", d.log_tail(10));
    assert_eq!(transitions(&body, "up"), 1.0, "{body}");
    let r = parse_reply(&c.pipeline(&keys)[0]);
    assert!(r.allowed(), "{r:?}");
}
