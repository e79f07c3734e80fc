//! Compatibility with envoyproxy/ratelimit's configuration: the example files of their
//! README (tests/data/envoy/) load unchanged, and a table of requests gets the decisions
//! their README documents. Decided by local buckets (`redis.mode = "none"`, the full
//! limits), through the same service code the gRPC server calls; tests/serial/envoy/ runs
//! the same service over gRPC against Redis.
//!
//! Also: what their loader rejects, ours rejects, and each error names file and line
//! (`loading.rs`); and what ratelimitd adds to their configuration, TOML rules for
//! descriptors and the IETF headers (`extensions.rs`).

mod extensions;
mod loading;

use crate::common::rls_descriptor as descriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use ratelimitd::admission::Peer;
use ratelimitd::config::Config;
use ratelimitd::envoy::service::Rls;
use ratelimitd::limiter::Limiter;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

fn data_dir() -> String {
    format!("{}/tests/data/envoy", env!("CARGO_MANIFEST_DIR"))
}

/// The config `toml` loaded from a file in a temporary directory, with the Envoy limits
/// it names (as the daemon loads them: the TOML, then the YAML).
fn load(toml: &str) -> Result<Config, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratelimitd.toml");
    std::fs::write(&path, toml).unwrap();
    let config = Config::load(&path).map_err(|e| e.to_string())?;
    ratelimitd::envoy::load::limits_for(&config).map_err(|e| e.to_string())?;
    Ok(config)
}

fn service(config_dir: &str) -> Rls {
    let config = load(&format!(
        "[envoy]\nlisten = \"127.0.0.1:0\"\nconfig_dir = \"{config_dir}\"\n"
    ))
    .unwrap();
    let limiter = Arc::new(Limiter::local(&config));
    let limits = ratelimitd::envoy::load::limits_for(&config)
        .unwrap()
        .unwrap();
    Rls::new(limiter, limits, Peer::unbounded(0, 0))
}

fn ask(rls: &Rls, domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitResponse {
    let req = RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: hits,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(rls.should_rate_limit(&req)).unwrap()
}

/// `(requests_per_unit, unit)` of a status's `current_limit`, `None` without one.
fn limit_of(s: &DescriptorStatus) -> Option<(u32, i32)> {
    s.current_limit
        .as_ref()
        .map(|l| (l.requests_per_unit, l.unit))
}

/// Waits until the current second has at least 700 ms left, so that a short sequence
/// of per-second decisions falls in one window.
fn fresh_second() {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1000;
    if ms > 300 {
        std::thread::sleep(Duration::from_millis((1000 - ms + 5) as u64));
    }
}

const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;
const DAY: i32 = 4;

/// A config dir holding one file `name` with `yaml`.
fn dir_with(name: &str, yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(name), yaml).unwrap();
    dir
}

#[test]
fn readme_examples_load_and_decide_as_documented() {
    let rls = service(&data_dir());

    // Example 1: two values of one key, 500/s each; another value has no limit.
    fresh_second();
    let r = ask(&rls, "mongo_cps", &[&[("database", "users")]], 500);
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    assert_eq!(limit_of(&r.statuses[0]), Some((500, SECOND)));
    assert_eq!(
        ask(&rls, "mongo_cps", &[&[("database", "users")]], 1).overall_code,
        OVER
    );
    assert_eq!(
        ask(&rls, "mongo_cps", &[&[("database", "default")]], 1).overall_code,
        OK
    );
    let r = ask(&rls, "mongo_cps", &[&[("database", "other")]], 1);
    assert_eq!((r.overall_code, limit_of(&r.statuses[0])), (OK, None));

    // Example 2: nested descriptors, a bare key = a counter per value; two descriptors
    // in one request, over limit if any is.
    let both: [&[(&str, &str)]; 2] = [
        &[("message_type", "marketing"), ("to_number", "2061111111")],
        &[("to_number", "2061111111")],
    ];
    for i in 0..5 {
        let r = ask(&rls, "messaging", &both, 1);
        assert_eq!(r.overall_code, OK, "message {i}");
        assert_eq!(limit_of(&r.statuses[0]), Some((5, DAY)));
        assert_eq!(limit_of(&r.statuses[1]), Some((100, DAY)));
    }
    let r = ask(&rls, "messaging", &both, 1);
    assert_eq!(r.overall_code, OVER);
    assert_eq!((r.statuses[0].code, r.statuses[1].code), (OVER, OK));
    // The descriptor within its limit took its unit (not given back): 100 - 6.
    assert_eq!(r.statuses[1].limit_remaining, 94);
    let other = [("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(ask(&rls, "messaging", &[&other], 1).overall_code, OK);

    // Example 3: the most specific match first; requests_per_unit 0 blocks.
    fresh_second();
    let r = ask(
        &rls,
        "edge_proxy_per_ip",
        &[&[("remote_address", "50.0.0.1")]],
        10,
    );
    assert_eq!(
        (r.overall_code, limit_of(&r.statuses[0])),
        (OK, Some((10, SECOND)))
    );
    let r = ask(
        &rls,
        "edge_proxy_per_ip",
        &[&[("remote_address", "50.0.0.5")]],
        1,
    );
    assert_eq!(
        (r.overall_code, limit_of(&r.statuses[0])),
        (OVER, Some((0, SECOND)))
    );

    // Example 4: a limit applies only at the request's depth.
    let r = ask(
        &rls,
        "example4",
        &[&[("key", "value"), ("subkey", "subvalue")]],
        1,
    );
    assert_eq!(limit_of(&r.statuses[0]), Some((300, SECOND)));
    let r = ask(&rls, "example4", &[&[("key", "value")]], 1);
    assert_eq!(limit_of(&r.statuses[0]), None);

    // Example 5: unlimited is OK with limit_remaining = MaxUint32 and no limit.
    let r = ask(&rls, "internal", &[&[("ldap", "x")]], 1);
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OK, u32::MAX)
    );
    assert_eq!(limit_of(&r.statuses[0]), None);
    let r = ask(&rls, "internal", &[&[("azure", "x")]], 1);
    assert_eq!(limit_of(&r.statuses[0]), Some((100, MINUTE)));

    // Example 6: shadow_mode never limits; user-b does.
    fresh_second();
    let a = [("service", "auth-service"), ("user", "user-a")];
    let b = [("service", "auth-service"), ("user", "user-b")];
    for _ in 0..12 {
        assert_eq!(ask(&rls, "example6", &[&a], 1).overall_code, OK);
    }
    assert_eq!(ask(&rls, "example6", &[&b], 20).overall_code, OK);
    assert_eq!(ask(&rls, "example6", &[&b], 1).overall_code, OVER);

    // Example 7: replaces: with both, only the replacing 10/s limit applies, and the
    // replaced one is not consumed.
    fresh_second();
    let k1 = [("key_1", "value_1"), ("user", "bkthomps")];
    let k2 = [("key_2", "value_2"), ("user", "bkthomps")];
    let r = ask(&rls, "example7", &[&k1, &k2], 6);
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        (limit_of(&r.statuses[0]), limit_of(&r.statuses[1])),
        (None, Some((10, SECOND)))
    );
    let r = ask(&rls, "example7", &[&k1], 5);
    assert_eq!(
        (r.overall_code, limit_of(&r.statuses[0])),
        (OK, Some((5, SECOND)))
    );

    // Example 8: a value's own limit beats the bare key's.
    let r = ask(&rls, "example8", &[&[("key1", "unspecified_value")]], 1);
    assert_eq!(limit_of(&r.statuses[0]), Some((10, MINUTE)));
    let r = ask(&rls, "example8", &[&[("key1", "value1")]], 1);
    assert_eq!(limit_of(&r.statuses[0]), Some((20, MINUTE)));

    // Example 9: trailing, middle and multiple wildcards.
    for (k, v, matched) in [
        ("key1", "value1", true),
        ("key1", "valueXYZ", true),
        ("key1", "valu", false),
        ("path", "/api/123/action", true),
        ("path", "/api/user-id/action", true),
        ("path", "/api/123/other", false),
        ("route", "/api/v1/resource/123/action", true),
        ("route", "/api/v1/resource/123", false),
    ] {
        let r = ask(&rls, "example9", &[&[(k, v)]], 1);
        assert_eq!(limit_of(&r.statuses[0]).is_some(), matched, "{k}={v}");
    }

    // Example 10: value_to_metric changes metrics only.
    let r = ask(
        &rls,
        "example10",
        &[&[
            ("route", "api"),
            ("http_method", "GET"),
            ("subject_id", "123"),
        ]],
        1,
    );
    assert_eq!(limit_of(&r.statuses[0]), Some((60, MINUTE)));
    let r = ask(
        &rls,
        "example10_wildcard",
        &[&[
            ("user", "alice"),
            ("action", "readfile"),
            ("resource", "documents"),
        ]],
        1,
    );
    assert_eq!(limit_of(&r.statuses[0]), Some((100, MINUTE)));

    // Example 11: share_threshold: every files/* value shares one counter of 10/h.
    assert_eq!(
        ask(&rls, "example11", &[&[("files", "files/a.pdf")]], 5).overall_code,
        OK
    );
    assert_eq!(
        ask(&rls, "example11", &[&[("files", "files/b.csv")]], 5).overall_code,
        OK
    );
    let r = ask(&rls, "example11", &[&[("files", "files/c.txt")]], 1);
    assert_eq!(
        (r.overall_code, limit_of(&r.statuses[0])),
        (OVER, Some((10, HOUR)))
    );
    let ns = |f: &'static str| [("files_no_share", f)];
    assert_eq!(
        ask(&rls, "example11", &[&ns("files_no_share/a.pdf")], 10).overall_code,
        OK
    );
    assert_eq!(
        ask(&rls, "example11", &[&ns("files_no_share/b.csv")], 10).overall_code,
        OK
    );
    assert_eq!(
        ask(&rls, "example11", &[&ns("files_no_share/a.pdf")], 1).overall_code,
        OVER
    );

    // An unknown domain: no limit.
    let r = ask(&rls, "nope", &[&[("a", "b")]], 1);
    assert_eq!((r.overall_code, limit_of(&r.statuses[0])), (OK, None));
}

#[test]
fn hits_addend_per_descriptor_and_zero_checks_without_consuming() {
    let rls = service(&data_dir());
    let user = [("to_number", "2069999999")];
    let mut d = descriptor(&user);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut req = RateLimitRequest {
        domain: "messaging".into(),
        descriptors: vec![d.clone()],
        hits_addend: 7,
    };
    // 0 on the descriptor overrides the request's 7: nothing taken.
    for _ in 0..3 {
        let r = rt.block_on(rls.should_rate_limit(&req)).unwrap();
        assert_eq!(r.statuses[0].limit_remaining, 100);
    }
    // The request's hits_addend applies where the descriptor has none.
    req.descriptors[0].hits_addend = None;
    let r = rt.block_on(rls.should_rate_limit(&req)).unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 93);
    // More than the limit can never pass, and takes nothing.
    req.hits_addend = 101;
    let r = rt.block_on(rls.should_rate_limit(&req)).unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 0));
    req.hits_addend = 93;
    assert_eq!(
        rt.block_on(rls.should_rate_limit(&req))
            .unwrap()
            .overall_code,
        OK
    );
}

#[test]
fn a_limit_sent_by_envoy_overrides_the_configured_one() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let rls = service(&data_dir());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut d = descriptor(&[("database", "users")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: DAY,
    });
    let mut req = RateLimitRequest {
        domain: "mongo_cps".into(),
        descriptors: vec![d],
        hits_addend: 3,
    };
    let r = rt.block_on(rls.should_rate_limit(&req)).unwrap();
    assert_eq!(
        (r.overall_code, limit_of(&r.statuses[0])),
        (OK, Some((3, DAY)))
    );
    req.hits_addend = 1;
    assert_eq!(
        rt.block_on(rls.should_rate_limit(&req))
            .unwrap()
            .overall_code,
        OVER
    );
    // Only in a configured domain (as envoyproxy/ratelimit); an unknown unit is ignored.
    req.domain = "nope".into();
    assert_eq!(
        limit_of(&rt.block_on(rls.should_rate_limit(&req)).unwrap().statuses[0]),
        None
    );
    req.domain = "mongo_cps".into();
    req.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: 0,
    });
    let r = rt.block_on(rls.should_rate_limit(&req)).unwrap();
    assert_eq!(limit_of(&r.statuses[0]), Some((500, SECOND)));
}
