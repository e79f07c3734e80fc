//! `fallback.hosts = "auto"` across a restart with Redis down: the count of daemons
//! alive heard from the heartbeats is saved in the state directory (`live-hosts`), so
//! a daemon started while Redis is down enforces `limit ÷ that count` from its first
//! request instead of the whole limit; with nothing saved, `fallback.min_hosts`. Real
//! daemons, real Redis; two more daemons are stood in for by heartbeats written to the
//! heartbeat set the way `lua/hosts.lua` writes them.

use crate::common;

use common::*;
use std::time::Duration;

/// 30 tokens, no refill to speak of: a local share of 30 ÷ hosts.
const RULE: &str =
    "[[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\ncapacity = 30\nrefill_rate = 0.001\n";

fn config(redis_addr: &str, fallback: &str) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{redis_addr}\"]\ntimeout_ms = 50\n\
         [fallback]\n{fallback}\n\n{RULE}"
    )
}

/// Two more daemons alive: heartbeats of now (µs on the Redis clock, as the script
/// scores them) in `rl:{hosts}`.
fn fake_heartbeats(redis: &RedisStandalone) {
    let time = redis_command(&redis.addr(), &["TIME"])
        .unwrap()
        .into_strings()
        .unwrap();
    let now_us = format!("{}{:0>6}", time[0], time[1]);
    for id in ["other-a:1:1", "other-b:2:2"] {
        redis_text(&redis.addr(), &["ZADD", "rl:{hosts}", &now_us, id]).unwrap();
    }
}

/// CHECKs of `api k` until the first DENY (at most 40): how many were allowed, each
/// with `source`.
fn allowed_before_deny(d: &Daemon, source: &str) -> u64 {
    let mut c = d.connect();
    for i in 0..40 {
        let r = parse_reply(&c.request("CHECK api k"));
        assert_eq!(r.source, source, "request {i}: {r:?}");
        if !r.allowed() {
            return i;
        }
    }
    panic!("40 requests allowed with a capacity of 30")
}

/// The first daemon hears 3 daemons alive and saves it; Redis goes away; a daemon
/// started meanwhile enforces 30 ÷ 3 = 10 from its first request. The state directory
/// comes from `$STATE_DIRECTORY`, as systemd's `StateDirectory=` passes it.
#[test]
fn a_restart_with_redis_down_enforces_the_share_last_heard() {
    let mut redis = RedisStandalone::start();
    let state = short_tempdir("rld-state-");
    let state_dir = state.path().to_str().unwrap();
    let env = [("STATE_DIRECTORY", state_dir)];
    fake_heartbeats(&redis);
    let mut a = Daemon::start_with(&daemon_bin(), &env, &config(&redis.addr(), ""));
    assert!(
        wait_until(Duration::from_secs(5), || a
            .log()
            .contains("3 daemon(s) alive in Redis")),
        "{}",
        a.log_tail(10)
    );
    let file = state.path().join("live-hosts");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "3\n");

    a.signal(libc::SIGTERM);
    assert!(a.wait_exit(Duration::from_secs(10)).is_some());
    let redis_addr = redis.addr();
    redis.kill();

    let b = Daemon::start_with(&daemon_bin(), &env, &config(&redis_addr, ""));
    assert_eq!(allowed_before_deny(&b, "local"), 10, "{}", b.log_tail(10));
    assert!(
        b.log()
            .contains("enforces limit ÷ 3 (3 daemon(s) alive when last heard"),
        "{}",
        b.log_tail(10)
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "3\n",
        "left as it was"
    );
}

/// Without `$STATE_DIRECTORY`, `fallback.state_dir` holds the count; with no count
/// saved, `fallback.min_hosts` is the share's divisor.
#[test]
fn state_dir_and_min_hosts() {
    let mut redis = RedisStandalone::start();
    let state = short_tempdir("rld-state-");
    let state_dir = toml_string(state.path().to_str().unwrap());
    fake_heartbeats(&redis);
    let a = Daemon::start(&config(&redis.addr(), &format!("state_dir = {state_dir}")));
    let file = state.path().join("live-hosts");
    assert!(
        wait_until(Duration::from_secs(5), || std::fs::read_to_string(&file)
            .is_ok_and(|s| s == "3\n")),
        "{}",
        a.log_tail(10)
    );
    drop(a);
    let redis_addr = redis.addr();
    redis.kill();

    // The count saved beats a lower floor.
    let b = Daemon::start(&config(
        &redis_addr,
        &format!("state_dir = {state_dir}\nmin_hosts = 2"),
    ));
    assert_eq!(allowed_before_deny(&b, "local"), 10, "{}", b.log_tail(10));
    drop(b);
    // Nothing saved: the floor.
    let c = Daemon::start(&config(&redis_addr, "min_hosts = 2"));
    assert_eq!(allowed_before_deny(&c, "local"), 15, "{}", c.log_tail(10));
    // A higher floor beats the count saved.
    let d = Daemon::start(&config(
        &redis_addr,
        &format!("state_dir = {state_dir}\nmin_hosts = 5"),
    ));
    assert_eq!(allowed_before_deny(&d, "local"), 6, "{}", d.log_tail(10));
}
