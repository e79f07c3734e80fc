//! Where the Envoy front end listens when `[envoy]` gives limits but no `listen`: a
//! Unix socket beside `server.socket` (`rls.sock`), with `server.socket_mode`, so only
//! the peers its file lets in can spend budgets through it; and the warning a TCP
//! `listen` gets at start (any local process can reach it). Real daemon, real gRPC
//! client (the `envoy-types` crate's), `redis.mode = "none"`.

use crate::common;

use common::*;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

/// A descriptor decided by a TOML rule: 3 requests, then over the limit (no refill to
/// speak of during the test).
const DESCRIPTOR: &str = r#"
[redis]
mode = "none"

[[rule]]
name = "checkout"
algorithm = "token_bucket"
capacity = 3
refill_rate = 0.001

[[envoy.descriptor]]
domain = "rides"
entries = ["user_id"]
rule = "checkout"
"#;

const TCP_WARNING: &str = ": any local process can spend budgets through it; prefer unix:/path";

/// `n` calls of `ShouldRateLimit` for `user_id=u1` over the Unix socket `path`: each
/// call's overall code.
fn ask_unix(path: PathBuf, n: usize) -> Vec<i32> {
    let rt = grpc_runtime();
    rt.block_on(async move {
        let mut c = unix_rls_client(path).await;
        let mut codes = Vec::new();
        for _ in 0..n {
            let req = RateLimitRequest {
                domain: "rides".into(),
                descriptors: vec![rls_descriptor(&[("user_id", "u1")])],
                hits_addend: 0,
            };
            let r = c.should_rate_limit(req).await.expect("an answer");
            codes.push(r.into_inner().overall_code);
        }
        codes
    })
}

#[test]
fn limits_without_listen_are_served_on_a_unix_socket_beside_the_main_one() {
    let d = Daemon::start(DESCRIPTOR);
    let sock = d.dir().join("rls.sock");
    assert!(
        wait_until(Duration::from_secs(5), || sock.exists()),
        "no {}: {}",
        sock.display(),
        d.log_tail(10)
    );
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "server.socket_mode's default");
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(ask_unix(sock.clone(), 5), [ok, ok, ok, over, over]);
    let log = d.log();
    assert!(
        log.contains("serving the Envoy Rate Limit Service") && !log.contains(TCP_WARNING),
        "{}",
        d.log_tail(10)
    );
}

#[test]
fn an_empty_envoy_table_starts_no_front_end() {
    let d = Daemon::start("[redis]\nmode = \"none\"\n[envoy]\n");
    let mut c = d.connect();
    assert_eq!(c.request("PING"), "PONG");
    assert!(!d.dir().join("rls.sock").exists());
    assert!(!d.log().contains("Envoy Rate Limit Service"), "{}", d.log());
}

#[test]
fn a_tcp_listen_is_warned_about_at_start() {
    let d = Daemon::start(&format!(
        "{DESCRIPTOR}\n[envoy]\nlisten = \"127.0.0.1:0\"\n"
    ));
    let warned = |log: &str| {
        log.lines().any(|l| {
            l.contains("WARN")
                && l.contains("the Envoy front end listens on TCP 127.0.0.1:")
                && l.contains(TCP_WARNING)
        })
    };
    assert!(
        wait_until(Duration::from_secs(5), || warned(&d.log())),
        "{}",
        d.log_tail(10)
    );
    assert!(!d.dir().join("rls.sock").exists());
}
