//! `[envoy] strict`: a request denied by one descriptor takes nothing from the others;
//! by default each descriptor is taken on its own (envoyproxy/ratelimit's behaviour).
//! Real daemon, real gRPC client over the front end's Unix socket; over a real Redis
//! Cluster (the descriptors' keys in different slots, so a DENY undoes a reservation)
//! and without Redis (`redis.mode = "none"`, the local all-or-nothing path).

use crate::common;

use common::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use std::path::PathBuf;
use std::time::Duration;

const TIGHT: u32 = 2;
const WIDE: u32 = 10;
/// Requests carrying both descriptors, per user: well over `TIGHT`.
const REQUESTS: u32 = 6;
/// Users (each its own pair of keys): the more, the surer some pairs span two slots.
const USERS: usize = 4;

/// `user_id` decided by a bucket of `TIGHT`, `ip` by one of `WIDE` (no refill to
/// speak of during the test).
fn limits(strict: bool) -> String {
    format!(
        r#"
[[rule]]
name = "tight"
algorithm = "token_bucket"
capacity = {TIGHT}
refill_rate = 0.000001

[[rule]]
name = "wide"
algorithm = "token_bucket"
capacity = {WIDE}
refill_rate = 0.000001

[envoy]
strict = {strict}

[[envoy.descriptor]]
domain = "rides"
entries = ["user_id"]
rule = "tight"

[[envoy.descriptor]]
domain = "rides"
entries = ["ip"]
rule = "wide"
"#
    )
}

fn descriptor(key: &str, value: &str, hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..rls_descriptor(&[(key, value)])
    }
}

/// For each user: `REQUESTS` calls with both descriptors (1 unit each), then a read of
/// the `ip` budget (a descriptor `hits_addend` of 0). The calls' answers and the reads.
fn run(sock: PathBuf) -> (Vec<RateLimitResponse>, Vec<RateLimitResponse>) {
    let rt = grpc_runtime();
    rt.block_on(async move {
        let mut c = unix_rls_client(sock).await;
        let (mut calls, mut reads) = (Vec::new(), Vec::new());
        for u in 0..USERS {
            let (user, ip) = (format!("u{u}"), format!("10.0.0.{u}"));
            for _ in 0..REQUESTS {
                let req = RateLimitRequest {
                    domain: "rides".into(),
                    descriptors: vec![
                        descriptor("user_id", &user, None),
                        descriptor("ip", &ip, None),
                    ],
                    hits_addend: 1,
                };
                calls.push(
                    c.should_rate_limit(req)
                        .await
                        .expect("an answer")
                        .into_inner(),
                );
            }
            let read = RateLimitRequest {
                domain: "rides".into(),
                descriptors: vec![descriptor("ip", &ip, Some(0))],
                hits_addend: 1,
            };
            reads.push(
                c.should_rate_limit(read)
                    .await
                    .expect("an answer")
                    .into_inner(),
            );
        }
        (calls, reads)
    })
}

/// Starts a daemon with `redis` (a `[redis]` table) and the limits, runs the calls, and
/// checks per user: exactly `TIGHT` requests admitted (the upper bound and its use),
/// and the `ip` budget left: `WIDE - TIGHT` in strict mode, `WIDE - REQUESTS` without.
fn check(redis: &str, strict: bool) {
    let d = Daemon::start(&format!("{redis}\n{}", limits(strict)));
    let sock = d.dir().join("rls.sock");
    assert!(
        wait_until(Duration::from_secs(5), || sock.exists()),
        "no {}: {}",
        sock.display(),
        d.log_tail(10)
    );
    let (calls, reads) = run(sock);
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    for (u, per_user) in calls.chunks(REQUESTS as usize).enumerate() {
        let admitted = per_user.iter().filter(|r| r.overall_code == ok).count();
        assert_eq!(admitted, TIGHT as usize, "user {u}: {per_user:?}");
        for r in &per_user[TIGHT as usize..] {
            assert_eq!(r.overall_code, over);
            assert_eq!(r.statuses[0].code, over, "user_id is the one over");
            assert_eq!(r.statuses[1].code, ok, "ip alone is within its limit");
        }
    }
    let taken_from_ip = if strict { TIGHT } else { REQUESTS };
    for (u, r) in reads.iter().enumerate() {
        assert_eq!(
            (r.overall_code, r.statuses[0].limit_remaining),
            (ok, WIDE - taken_from_ip),
            "user {u}, strict = {strict}"
        );
    }
}

#[test]
fn strict_mode_takes_nothing_from_a_denied_requests_other_descriptors_without_redis() {
    check("[redis]\nmode = \"none\"\n", true);
    check("[redis]\nmode = \"none\"\n", false);
}

#[test]
fn strict_mode_takes_nothing_from_a_denied_requests_other_descriptors_over_a_cluster() {
    let cluster = RedisCluster::start();
    let redis = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\nprefix = \"rl\"\n",
        toml_str_array(&cluster.primary_addrs())
    );
    check(&redis, true);
    // The reservation path ran: some user's two keys are in different slots.
    let primary = &cluster.primary_addrs()[0];
    let slot = |k: &str| cluster.cli(primary, &["CLUSTER", "KEYSLOT", k]);
    let keys = cluster.all_keys();
    let split = (0..USERS).any(|u| {
        let of = |needle: String| keys.iter().find(|k| k.contains(&needle)).map(|k| slot(k));
        let (a, b) = (
            of(format!("user_id=u{u}}}")),
            of(format!("ip=10.0.0.{u}}}")),
        );
        a.is_some() && b.is_some() && a != b
    });
    assert!(split, "no user's keys span two slots: {keys:?}");
    let prefix = "[redis]\nmode = \"cluster\"\nprefix = \"rl2\"\nnodes = ";
    check(
        &format!("{prefix}{}\n", toml_str_array(&cluster.primary_addrs())),
        false,
    );
}

/// A descriptor asking more than its limit (`hits_addend` above it) can never pass: in
/// strict mode the request's other descriptors are only read; by default they are taken.
#[test]
fn a_descriptor_that_can_never_pass_leaves_the_others_untouched_in_strict_mode() {
    for strict in [true, false] {
        let d = Daemon::start(&format!("[redis]\nmode = \"none\"\n{}", limits(strict)));
        let sock = d.dir().join("rls.sock");
        assert!(
            wait_until(Duration::from_secs(5), || sock.exists()),
            "{}",
            d.log_tail(10)
        );
        let rt = grpc_runtime();
        let (over, read) = rt.block_on(async move {
            let mut c = unix_rls_client(sock).await;
            let too_many = u64::from(TIGHT) + 1;
            let req = RateLimitRequest {
                domain: "rides".into(),
                descriptors: vec![
                    descriptor("user_id", "u", Some(too_many)),
                    descriptor("ip", "10.1.1.1", Some(3)),
                ],
                hits_addend: 1,
            };
            let over = c.should_rate_limit(req).await.unwrap().into_inner();
            let read = RateLimitRequest {
                domain: "rides".into(),
                descriptors: vec![descriptor("ip", "10.1.1.1", Some(0))],
                hits_addend: 1,
            };
            (over, c.should_rate_limit(read).await.unwrap().into_inner())
        });
        let (ok, over_limit) = (Code::Ok as i32, Code::OverLimit as i32);
        assert_eq!(
            (
                over.overall_code,
                over.statuses[0].code,
                over.statuses[1].code
            ),
            (over_limit, over_limit, ok),
            "strict = {strict}"
        );
        let left = if strict { WIDE } else { WIDE - 3 };
        assert_eq!(
            read.statuses[0].limit_remaining, left,
            "strict = {strict}: the ip budget"
        );
    }
}
