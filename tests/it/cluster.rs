//! The daemon deciding in a real 6-node Redis Cluster (3 primaries, 3 replicas) on
//! loopback: the token bucket, the deny cache, hash-tagged keys, ordering under
//! pipelining, a budget shared by two daemons, NOSCRIPT recovery, and a full outage with
//! its local fallback and return to Redis. Each test runs twice: on a plain cluster and
//! on one reached over TLS only with the documented least-privilege ACL user
//! (`tests/secure_redis`), which must then have refused the daemon nothing. Slots that
//! move: `tests/it/cluster_slots/`; one standalone Redis: `tests/it/standalone.rs`.

use crate::common;
use crate::secure_redis;

use common::*;
use secure_redis::{connect_in_redis, Flavor, TestCluster};
use std::time::{Duration, Instant};

fn cluster_config(cluster: &TestCluster, extra: &str) -> String {
    format!(
        r#"
[redis]
{}timeout_ms = 25
prefix = "rl"

[cache]
ttl_ms = 500

{extra}
"#,
        cluster.redis_fields()
    )
}

plain_and_tls!(
    burst_wait_cache_and_hash_tag_in_cluster,
    pipelined_mixed_requests_answer_in_order_through_redis,
    two_daemons_on_one_cluster_share_one_budget_exactly,
    script_flush_reloads_the_scripts,
    operator_verbs_run_as_the_daemons_user,
    full_outage_falls_back_locally_without_waiting_then_returns_to_redis,
);

fn burst_wait_cache_and_hash_tag_in_cluster(flavor: Flavor) {
    let cluster = TestCluster::start(flavor);
    let d = Daemon::start(&cluster_config(&cluster, BUCKET_RULES));
    let mut c = connect_in_redis(&d, "rides_request");

    // A burst admits exactly `capacity`, `remaining` counting down. Pipelined, so that
    // the burst reaches Redis within milliseconds however busy the machine (sent one by
    // one, 21 round trips may take long enough on a loaded host to refill a token).
    let burst: Vec<String> = (0..21)
        .map(|_| "CHECK rides_request user:42".to_string())
        .collect();
    let replies: Vec<Reply> = c.pipeline(&burst).iter().map(|l| parse_reply(l)).collect();
    for (i, r) in replies[..20].iter().enumerate() {
        assert_eq!(
            (r.verdict.as_str(), r.limit, r.remaining, r.source.as_str()),
            ("ALLOW", 20, 19 - i as u64, "redis"),
            "request {i}"
        );
        assert_eq!(r.wait_ms, 0);
    }
    let r = &replies[20];
    assert_eq!(
        (r.verdict.as_str(), r.remaining, r.source.as_str()),
        ("DENY", 0, "redis")
    );
    assert!((1..=100).contains(&r.wait_ms), "1 token at 10/s: {r:?}");
    assert!(
        (1900..=2000).contains(&r.reset_ms),
        "20 tokens at 10/s: {r:?}"
    );

    // wait_ms matches the refill rate: 1 token at 2/s is 500 ms, and waiting it is enough.
    let burst: Vec<String> = (0..6).map(|_| "CHECK slow k".to_string()).collect();
    let replies = c.pipeline(&burst);
    assert!(
        replies[..5].iter().all(|r| r.starts_with("ALLOW")),
        "{replies:?}"
    );
    let first = parse_reply(&replies[5]);
    assert_eq!(
        (first.verdict.as_str(), first.source.as_str()),
        ("DENY", "redis")
    );
    assert!((450..=500).contains(&first.wait_ms), "{first:?}");
    // The hot denied key is then answered from the cache, its wait counting down.
    let cached = parse_reply(&c.request("CHECK slow k"));
    assert_eq!(
        (cached.verdict.as_str(), cached.source.as_str()),
        ("DENY", "cache"),
        "{cached:?}"
    );
    assert!(cached.wait_ms <= first.wait_ms && cached.wait_ms >= 1);
    // A different cost is not answered from the cache.
    assert_eq!(parse_reply(&c.request("CHECK slow k 2")).source, "redis");
    std::thread::sleep(Duration::from_millis(first.wait_ms + 5));
    let r = parse_reply(&c.request("CHECK slow k"));
    assert_eq!(
        (r.verdict.as_str(), r.source.as_str()),
        ("ALLOW", "redis"),
        "{r:?}"
    );

    // Keys carry the {rule:key} hash tag, and live in that tag's slot.
    let keys = cluster.all_keys();
    assert!(
        keys.contains(&"rl:{rides_request:user:42}:tb".to_string()),
        "{keys:?}"
    );
    assert!(keys.contains(&"rl:{slow:k}:tb".to_string()), "{keys:?}");
    let addr = &cluster.primary_addrs()[0];
    assert_eq!(
        cluster.cli(
            addr,
            &["CLUSTER", "KEYSLOT", "rl:{rides_request:user:42}:tb"]
        ),
        cluster.cli(addr, &["CLUSTER", "KEYSLOT", "rides_request:user:42"])
    );
    // The bucket expires by itself once it would be full again.
    let ttl: i64 = cluster
        .cli(addr, &["-c", "PTTL", "rl:{slow:k}:tb"])
        .parse()
        .unwrap_or(-3);
    assert!(ttl > 0 && ttl <= 3_600, "PTTL {ttl}");
    cluster.assert_no_acl_denials();
}

fn pipelined_mixed_requests_answer_in_order_through_redis(flavor: Flavor) {
    let cluster = TestCluster::start(flavor);
    let d = Daemon::start(&cluster_config(&cluster, BUCKET_RULES));
    let mut c = connect_in_redis(&d, "big");
    let mut lines = Vec::new();
    let mut want = Vec::new();
    for i in 0..600 {
        let (line, w) = match i % 5 {
            0 => (format!("CHECK big k{i}"), "ALLOW 50 49 ".to_string()),
            1 => ("PING".to_string(), "PONG".to_string()),
            2 => (
                format!("CHECK big k{} 10", i - 2),
                "ALLOW 50 39 ".to_string(),
            ),
            3 => (format!("CHECK nope k{i}"), "ERR RULE".to_string()),
            _ => (
                format!("CHECK big k{} 0", i - 4),
                "ALLOW 50 39 ".to_string(),
            ),
        };
        lines.push(line);
        want.push(w);
    }
    let got = c.pipeline(&lines);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.starts_with(w.as_str()),
            "reply {i} to {:?}: {g:?}, want {w:?}",
            lines[i]
        );
        if g.starts_with("ALLOW") {
            assert_eq!(parse_reply(g).source, "redis", "{g}");
        }
    }
    cluster.assert_no_acl_denials();
}

fn two_daemons_on_one_cluster_share_one_budget_exactly(flavor: Flavor) {
    let cluster = TestCluster::start(flavor);
    let config = cluster_config(&cluster, BUCKET_RULES);
    let a = Daemon::start(&config);
    let b = Daemon::start(&config);
    connect_in_redis(&a, "big");
    connect_in_redis(&b, "big");
    let run = |d: &Daemon| {
        let mut c = d.connect();
        let lines: Vec<String> = (0..100).map(|_| "CHECK big shared".to_string()).collect();
        let mut replies = Vec::new();
        for chunk in lines.chunks(10) {
            replies.extend(c.pipeline(chunk));
        }
        replies
    };
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| run(&a));
        let hb = s.spawn(|| run(&b));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    let all: Vec<Reply> = ra.iter().chain(&rb).map(|l| parse_reply(l)).collect();
    let allowed = all.iter().filter(|r| r.allowed()).count();
    assert_eq!(
        allowed, 50,
        "two daemons together admit exactly the capacity"
    );
    assert!(all
        .iter()
        .all(|r| r.source == "redis" || r.source == "cache"));
    assert!(ra.iter().any(|l| l.starts_with("ALLOW")) && rb.iter().any(|l| l.starts_with("ALLOW")));
    cluster.assert_no_acl_denials();
}

/// NOSCRIPT: scripts flushed on every primary are re-loaded, the decision stays in Redis.
/// (`redis.timeout_ms` 250 here: the call that meets NOSCRIPT loads every script, about
/// 13 ms on an idle machine, more on a loaded one, before it is sent again.)
fn script_flush_reloads_the_scripts(flavor: Flavor) {
    let cluster = TestCluster::start(flavor);
    let config =
        cluster_config(&cluster, BUCKET_RULES).replace("timeout_ms = 25\n", "timeout_ms = 250\n");
    assert!(config.contains("timeout_ms = 250"));
    let d = Daemon::start(&config);
    let mut c = connect_in_redis(&d, "big");
    assert_eq!(parse_reply(&c.request("CHECK big f1")).source, "redis");
    for addr in cluster.primary_addrs() {
        assert_eq!(cluster.cli(&addr, &["SCRIPT", "FLUSH"]), "OK");
    }
    for i in 0..20 {
        let r = parse_reply(&c.request(&format!("CHECK big f{i}")));
        assert_eq!(r.source, "redis", "after SCRIPT FLUSH: {r:?}");
    }
    cluster.assert_no_acl_denials();
}

/// The operator verbs that write or read a key's state in Redis (`OVERRIDE`, `INSPECT`,
/// `RESET`, `OVERRIDE … clear`) through the daemon's own Redis user: with the documented
/// least-privilege ACL line, Redis refuses none of their commands.
fn operator_verbs_run_as_the_daemons_user(flavor: Flavor) {
    let cluster = TestCluster::start(flavor);
    let d = Daemon::start(&cluster_config(&cluster, BUCKET_RULES));
    let mut c = connect_in_redis(&d, "big");
    assert_eq!(parse_reply(&c.request("CHECK big op")).limit, 50);
    assert_eq!(c.request("OVERRIDE big op capacity=3 ttl=1h"), "OK");
    let under: Vec<Reply> = (0..4)
        .map(|_| parse_reply(&c.request("CHECK big op")))
        .collect();
    // The key's state (49 tokens) is capped at the override's capacity: 3 allowed.
    let allowed = under.iter().filter(|r| r.allowed()).count();
    assert_eq!(allowed, 3, "{under:?}");
    assert!(
        under.iter().all(|r| r.limit == 3 && r.source != "local"),
        "{under:?}"
    );
    let inspect = c.request("INSPECT big op");
    assert!(inspect.contains("override=capacity=3"), "{inspect}");
    assert_eq!(c.request("RESET big op"), "OK");
    let after_reset = parse_reply(&c.request("CHECK big op"));
    assert_eq!(
        (after_reset.limit, after_reset.remaining),
        (3, 2),
        "{after_reset:?}"
    );
    assert_eq!(c.request("OVERRIDE big op clear"), "OK");
    assert_eq!(c.request("RESET big op"), "OK");
    let cleared = parse_reply(&c.request("CHECK big op"));
    assert_eq!(
        (cleared.limit, cleared.remaining, cleared.source.as_str()),
        (50, 49, "redis"),
        "{cleared:?}"
    );
    cluster.assert_no_acl_denials();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn full_outage_falls_back_locally_without_waiting_then_returns_to_redis(flavor: Flavor) {
    let mut cluster = TestCluster::start(flavor);
    let rules = r#"
[fallback]
hosts = 4

[[rule]]
name = "local"
algorithm = "token_bucket"
capacity = 20
refill_rate = 0.001

[[rule]]
name = "open"
algorithm = "token_bucket"
capacity = 20
refill_rate = 0.001
on_redis_failure = "allow"

[[rule]]
name = "closed"
algorithm = "token_bucket"
capacity = 20
refill_rate = 0.001
on_redis_failure = "deny"
"#;
    let d = Daemon::start(&cluster_config(&cluster, rules));
    let mut c = connect_in_redis(&d, "local");
    for rule in ["local", "open", "closed"] {
        assert_eq!(
            parse_reply(&c.request(&format!("CHECK {rule} warm"))).source,
            "redis"
        );
    }

    cluster.kill_all();
    let timeout = Duration::from_millis(25);
    let mut latencies = Vec::new();
    let mut timed = |c: &mut Client, line: &str| {
        let t = Instant::now();
        let r = parse_reply(&c.request(line));
        latencies.push(t.elapsed());
        r
    };
    let local: Vec<Reply> = (0..40)
        .map(|_| timed(&mut c, "CHECK local outage"))
        .collect();
    let open: Vec<Reply> = (0..20)
        .map(|_| timed(&mut c, "CHECK open outage"))
        .collect();
    let closed: Vec<Reply> = (0..20)
        .map(|_| timed(&mut c, "CHECK closed outage"))
        .collect();
    assert!(local.iter().all(|r| r.source == "local"), "{local:?}");
    assert_eq!(
        local.iter().filter(|r| r.allowed()).count(),
        5,
        "20 ÷ 4 hosts: {local:?}"
    );
    assert_eq!(local[0].limit, 20, "limit is the rule's capacity");
    assert!(
        open.iter().all(|r| r.allowed() && r.source == "fail_open"),
        "{open:?}"
    );
    assert!(
        closed
            .iter()
            .all(|r| !r.allowed() && r.source == "fail_closed"),
        "{closed:?}"
    );
    latencies.sort();
    let (p99, max) = (percentile(&latencies, 0.99), *latencies.last().unwrap());
    eprintln!(
        "{flavor:?}: outage latency: p50 {:?} p99 {p99:?} max {max:?}",
        percentile(&latencies, 0.5)
    );
    // Only the request that discovers the outage waits, and at most the Redis timeout.
    assert!(max <= timeout + Duration::from_millis(40), "max {max:?}");
    assert!(
        percentile(&latencies, 0.9) <= Duration::from_millis(5),
        "{latencies:?}"
    );

    // Restarted with empty data and empty script caches: back to Redis within 1 s.
    cluster.restart_all();
    let answering = Instant::now();
    let mut back = None;
    while answering.elapsed() < Duration::from_secs(3) {
        let r = parse_reply(&c.request("CHECK local after"));
        if r.source == "redis" {
            back = Some(answering.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let back = back.expect("decisions return to Redis");
    eprintln!("{flavor:?}: back to redis {back:?} after the cluster answered");
    assert!(back <= Duration::from_secs(1), "{back:?}");

    // Each transition logged once, not per request. The circuit closes when the last
    // primary answers its probe, which may come a probe interval after this key's
    // primary did.
    assert!(
        wait_until(Duration::from_secs(2), || d
            .log()
            .contains("circuit closed")),
        "{}",
        d.log_tail(20)
    );
    let log = d.log();
    assert_eq!(log.matches("circuit open").count(), 1, "{log}");
    assert_eq!(log.matches("circuit closed").count(), 1, "{log}");
    cluster.assert_no_acl_denials();
}
