//! The Envoy Rate Limit Service over gRPC: a tonic client (the generated client of the
//! same `envoy-types` crate) against the real daemon and a real Redis, on loopback.
//!
//! Checks: a limit's worth of OK then OVER_LIMIT with `current_limit`, `limit_remaining`
//! and `duration_until_reset` filled, decided in Redis (its key is there); a frozen Redis
//! still gets answers, never a gRPC error, within `redis.timeout_ms` plus a margin; back
//! to Redis once it answers; SIGHUP reloads the YAML atomically (a bad file keeps the
//! old limits and names file and line); a Unix socket listener; malformed requests; on
//! a Redis Cluster, one frozen primary sends only its keys to local decisions.
//!
//! The frozen Redis, the in-flight cap and the frozen primary are in `frozen.rs`.

mod frozen;

use crate::common;

use common::*;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

// The tests of this module run one at a time, and beside no other test of this binary:
// one of them measures latency, which the others' daemons and Redis servers starting
// beside it would distort.
use crate::ONE_AT_A_TIME as SERIAL;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const LIMITS: &str = "domain: rides
descriptors:
  - key: user_id
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: generic_key
    value: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
";

/// A daemon with `[envoy] listen` on a free loopback port, the YAML `limits` in its
/// config dir, `redis` (a `[redis]` table body, or "" for none) and metrics on a free
/// port. Returns the daemon, the gRPC port, the metrics port and the config dir.
fn daemon(redis: &str, limits: &str) -> (Daemon, u16, u16, tempfile::TempDir) {
    let (grpc, metrics) = (free_port(), free_port());
    let tmp = short_tempdir("rld-envoy-");
    let dir = tmp.path();
    std::fs::write(dir.join("rides.yaml"), limits).unwrap();
    let d = Daemon::start(&format!(
        "{redis}\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\n[envoy]\nlisten = \"127.0.0.1:{grpc}\"\nconfig_dir = \"{}\"\n",
        dir.display()
    ));
    (d, grpc, metrics, tmp)
}

/// A client of the RLS on `port`, retrying while the daemon binds it.
async fn client(port: u16) -> RateLimitServiceClient<Channel> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ep = Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap();
        match ep.connect().await {
            Ok(ch) => return RateLimitServiceClient::new(ch),
            Err(e) if Instant::now() > deadline => panic!("RLS on {port}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

fn request(domain: &str, entries: &[(&str, &str)], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![rls_descriptor(entries)],
        hits_addend: hits,
    }
}

async fn ask(c: &mut RateLimitServiceClient<Channel>, req: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(req)
        .await
        .expect("an answer, never a gRPC error")
        .into_inner()
}

/// The sum of the series `name` whose labels include all of `labels` (0 if none).
fn metric(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn redis_config(redis: &RedisStandalone, timeout_ms: u64) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = {timeout_ms}\n",
        redis.addr()
    )
}

#[test]
fn limit_then_over_limit_decided_in_redis() {
    let _serial = serial();
    let redis = RedisStandalone::start();
    let (d, grpc, metrics, _dir) = daemon(&redis_config(&redis, 50), LIMITS);
    grpc_runtime().block_on(async {
        let mut c = client(grpc).await;
        for i in 0..5u32 {
            let r = ask(&mut c, request("rides", &[("user_id", "alice")], 0)).await;
            assert_eq!(r.overall_code, OK, "request {i}");
            let s = &r.statuses[0];
            assert_eq!(s.limit_remaining, 4 - i);
            let limit = s.current_limit.as_ref().expect("current_limit");
            assert_eq!((limit.requests_per_unit, limit.unit), (5, 2));
            let reset = s.duration_until_reset.expect("duration_until_reset");
            assert!((0..=60).contains(&reset.seconds), "{reset:?}");
        }
        let r = ask(&mut c, request("rides", &[("user_id", "alice")], 0)).await;
        assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OVER));
        assert_eq!(r.statuses[0].limit_remaining, 0);
        // Another value of the bare key has its own counter; unknown descriptors and
        // domains have no limit.
        let r = ask(&mut c, request("rides", &[("user_id", "bob")], 0)).await;
        assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 4));
        let r = ask(&mut c, request("rides", &[("path", "/x")], 0)).await;
        assert_eq!(
            (r.overall_code, r.statuses[0].current_limit.is_none()),
            (OK, true)
        );
        let r = ask(&mut c, request("nope", &[("user_id", "alice")], 0)).await;
        assert_eq!(r.overall_code, OK);
        // Shadow mode: over its limit, still OK, counted.
        for _ in 0..4 {
            let r = ask(&mut c, request("rides", &[("generic_key", "shadow")], 0)).await;
            assert_eq!(r.overall_code, OK);
        }
        // Malformed: an empty domain is INVALID_ARGUMENT (as envoyproxy/ratelimit).
        let e = c
            .should_rate_limit(request("", &[("a", "b")], 0))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    });
    // The counter lives in Redis, under the limit's rule name and the descriptor.
    let keys = redis.cli(&["KEYS", "rl:*"]);
    assert!(
        keys.contains("{envoy/rides.user_id:user_id=alice}"),
        "{keys}"
    );
    let body = scrape(metrics);
    let path = [("domain", "rides"), ("descriptor", "rides.user_id")];
    assert_eq!(
        metric(
            &body,
            "ratelimitd_envoy_descriptors_total",
            &[path[0], path[1], ("code", "ok")]
        ),
        6.0,
        "{body}"
    );
    assert_eq!(
        metric(
            &body,
            "ratelimitd_envoy_descriptors_total",
            &[path[0], path[1], ("code", "over_limit")]
        ),
        1.0
    );
    let shadow = [
        ("descriptor", "rides.generic_key_shadow"),
        ("code", "shadow_over_limit"),
    ];
    assert_eq!(
        metric(&body, "ratelimitd_envoy_descriptors_total", &shadow),
        2.0,
        "{body}"
    );
    let redis_decisions = metric(
        &body,
        "ratelimitd_decisions_total",
        &[("rule", "envoy/rides.user_id"), ("source", "redis")],
    );
    assert!(redis_decisions >= 6.0, "{body}");
    // YAML limits share their local limit by the daemons alive (fallback.hosts = "auto",
    // the default): the heartbeat runs.
    assert!(
        d.log().contains("daemon(s) alive in Redis"),
        "{}",
        d.log_tail(20)
    );
    drop(d);
}

#[test]
fn sighup_reloads_the_yaml_atomically() {
    let _serial = serial();
    let (d, grpc, _, dir) = daemon("", LIMITS);
    let file = dir.path().join("rides.yaml");
    let rt = grpc_runtime();
    let mut c = rt.block_on(client(grpc));
    let limit = |c: &mut RateLimitServiceClient<Channel>| {
        let r = rt.block_on(ask(c, request("rides", &[("user_id", "z")], 0)));
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    assert_eq!(limit(&mut c), Some(5));
    let nine = LIMITS.replace("requests_per_unit: 5", "requests_per_unit: 9");
    std::fs::write(&file, &nine).unwrap();
    d.signal(libc::SIGHUP);
    assert!(wait_until(Duration::from_secs(5), || limit(&mut c) == Some(9)));
    // A bad file: the old limits stay, the log names file and line.
    let bad = nine.replace(
        "requests_per_unit: 9",
        "requests_per_unit: 1\n      burst: 2",
    );
    std::fs::write(&file, bad).unwrap();
    d.signal(libc::SIGHUP);
    let want = format!(
        "{}:7: descriptors[0].rate_limit.burst: unknown field",
        file.display()
    );
    assert!(
        wait_until(Duration::from_secs(5), || d.log().contains(&want)),
        "{}",
        d.log_tail(10)
    );
    assert_eq!(limit(&mut c), Some(9));
}

#[test]
fn unix_socket_listener() {
    let _serial = serial();
    let dir = short_tempdir("rld-rls-");
    let sock = dir.path().join("rls.sock");
    let d = Daemon::start(&format!("[envoy]\nlisten = \"unix:{}\"\n", sock.display()));
    let rt = grpc_runtime();
    let path = sock.clone();
    let r = rt.block_on(async move {
        assert!(wait_until(Duration::from_secs(5), || path.exists()));
        let mut c = unix_rls_client(path).await;
        ask(&mut c, request("any", &[("k", "v")], 0)).await
    });
    assert_eq!(r.overall_code, OK);
    assert!(
        d.log().contains("no limit is configured"),
        "{}",
        d.log_tail(10)
    );
    drop(d);
}
