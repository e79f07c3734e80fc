//! The RLS while Redis cannot answer: a frozen Redis (answered within the timeout, then
//! in Redis again once it answers), the in-flight cap reached while it is frozen, one
//! frozen primary of a cluster (only its keys go local). Every call is answered, never
//! with a gRPC error, which would hand the decision to Envoy's `failure_mode_deny`.

use super::{ask, client, daemon, metric, redis_config, request, serial, LIMITS, OK};
use crate::common::*;
use std::time::{Duration, Instant};

/// 1.5 × the cores: above this load average the latency bound is reported, not checked.
fn overloaded() -> Option<String> {
    let load: f64 = std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    (load > 1.5 * cores).then(|| format!("load average {load} > 1.5 x {cores} cores"))
}

#[test]
fn frozen_redis_answered_locally_within_the_timeout_then_redis_again() {
    let _serial = serial();
    let timeout_ms = 25;
    let redis = RedisStandalone::start();
    let (d, grpc, metrics, _dir) = daemon(&redis_config(&redis, timeout_ms), LIMITS);
    let rt = grpc_runtime();
    let mut c = rt.block_on(client(grpc));
    rt.block_on(ask(&mut c, request("rides", &[("user_id", "u0")], 0)));
    redis.signal(libc::SIGSTOP);
    let mut took = Vec::new();
    for i in 0..200 {
        let t = Instant::now();
        let r = rt.block_on(ask(
            &mut c,
            request("rides", &[("user_id", &format!("u{i}"))], 0),
        ));
        took.push(t.elapsed());
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit),
            Some(5)
        );
    }
    took.sort();
    let p99 = took[took.len() * 99 / 100];
    let bound = Duration::from_millis(timeout_ms + 5);
    println!(
        "Redis frozen: 200 RLS calls answered, p99 {p99:?}, max {:?} (bound {bound:?})",
        took[took.len() - 1]
    );
    match overloaded() {
        Some(why) if p99 > bound => println!("SKIP latency bound: p99 {p99:?} > {bound:?}; {why}"),
        _ => assert!(p99 <= bound, "p99 {p99:?} > {bound:?}"),
    }
    let local = |body: &str| {
        metric(
            body,
            "ratelimitd_decisions_total",
            &[("rule", "envoy/rides.user_id"), ("source", "local")],
        )
    };
    assert!(local(&scrape(metrics)) > 0.0);
    redis.signal(libc::SIGCONT);
    // Back in Redis within a few seconds of it answering (the prober's interval).
    let redis_decisions = |body: &str| {
        metric(
            body,
            "ratelimitd_decisions_total",
            &[("rule", "envoy/rides.user_id"), ("source", "redis")],
        )
    };
    let before = redis_decisions(&scrape(metrics));
    let back = wait_until(Duration::from_secs(10), || {
        rt.block_on(ask(&mut c, request("rides", &[("user_id", "again")], 0)));
        redis_decisions(&scrape(metrics)) > before
    });
    assert!(back, "no Redis decision after SIGCONT:\n{}", d.log_tail(20));
}

/// Past `server.redis_max_in_flight` (Redis frozen, every slot held by a call waiting
/// on it), RLS calls are still answered, decided without Redis: never a gRPC error,
/// which would hand the decision to Envoy's `failure_mode_deny`.
#[test]
fn requests_past_the_in_flight_cap_are_decided_locally_not_refused() {
    let _serial = serial();
    let redis = RedisStandalone::start();
    let config = format!(
        "[server]\nredis_max_in_flight = 2\n\n{}",
        redis_config(&redis, 500)
    );
    let (_d, grpc, metrics, _dir) = daemon(&config, LIMITS);
    let rt = grpc_runtime();
    let mut c = rt.block_on(client(grpc));
    let in_redis = wait_until(Duration::from_secs(10), || {
        rt.block_on(ask(&mut c, request("rides", &[("user_id", "warm")], 0)));
        metric(
            &scrape(metrics),
            "ratelimitd_decisions_total",
            &[("rule", "envoy/rides.user_id"), ("source", "redis")],
        ) > 0.0
    });
    assert!(in_redis, "no decision in Redis before the freeze");
    redis.signal(libc::SIGSTOP);
    // 20 calls at once: two take the Redis slots and wait on the frozen Redis (up to
    // the 500 ms timeout, long before its breaker could open); the other 18 find no
    // slot.
    let answers = rt.block_on(async {
        let calls = (0..20).map(|i| {
            let mut c = c.clone();
            async move {
                c.should_rate_limit(request("rides", &[("user_id", &format!("cap{i}"))], 1))
                    .await
            }
        });
        futures::future::join_all(calls).await
    });
    redis.signal(libc::SIGCONT);
    let mut limited = 0;
    for a in answers {
        let r = a.expect("an answer, never a gRPC error").into_inner();
        if r.statuses[0].current_limit.is_some() {
            limited += 1;
        }
    }
    assert_eq!(limited, 20, "every answer carries its limit");
    let local = metric(
        &scrape(metrics),
        "ratelimitd_decisions_total",
        &[("rule", "envoy/rides.user_id"), ("source", "local")],
    );
    println!("in-flight cap 2, Redis frozen: 20 calls answered, {local} decided locally");
    assert!(local >= 18.0, "{local} local decisions");
}
#[test]
fn redis_cluster_frozen_primary_only_its_keys_decided_locally() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let redis = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 50\n",
        toml_str_array(&cluster.addrs())
    );
    let (d, grpc, metrics, _dir) = daemon(&redis, LIMITS);
    let rt = grpc_runtime();
    let mut c = rt.block_on(client(grpc));
    let source = |s: &str| {
        metric(
            &scrape(metrics),
            "ratelimitd_decisions_total",
            &[("rule", "envoy/rides.user_id"), ("source", s)],
        )
    };
    // Every user's counter in Redis, spread over the primaries' slots.
    for i in 0..60 {
        let r = rt.block_on(ask(
            &mut c,
            request("rides", &[("user_id", &format!("c{i}"))], 0),
        ));
        assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 4));
    }
    assert_eq!(source("redis"), 60.0);
    let keys = cluster.all_keys();
    assert_eq!(
        keys.iter()
            .filter(|k| k.contains("{envoy/rides.user_id:"))
            .count(),
        60
    );
    // One primary frozen: its users are decided locally, the others still in Redis,
    // and every call is answered.
    let frozen = cluster.primary_addrs()[0].clone();
    cluster.signal_node(&frozen, libc::SIGSTOP);
    for round in 0..3 {
        for i in 0..60 {
            let r = rt.block_on(ask(
                &mut c,
                request("rides", &[("user_id", &format!("c{i}"))], 0),
            ));
            assert_eq!(r.statuses[0].code, OK, "round {round} user c{i}");
        }
    }
    cluster.signal_node(&frozen, libc::SIGCONT);
    let (redis_n, local_n) = (source("redis"), source("local"));
    println!("one primary of three frozen: {redis_n} decisions in Redis, {local_n} local");
    assert!(local_n > 0.0 && redis_n > 60.0 + 60.0, "{}", d.log_tail(20));
}
