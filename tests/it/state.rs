//! State that must survive what happens around it: a reload that tightens a rule keeps
//! a drained key drained in Redis (the key's expiry follows the rule in force, not the
//! one that wrote it), and a local bucket starts from what Redis last reported for its
//! key, so a drained key stays drained when Redis goes away.
//!
//! Every bound is computed from the rule and the client's own timestamps.

use crate::common;

use common::*;
use std::thread::sleep;
use std::time::{Duration, Instant};

fn config(redis: &RedisStandalone, rules: &str) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 200\n\n[cache]\nttl_ms = 0\n{rules}",
        redis.addr()
    )
}

/// Sends `CHECK <rule> <key>` every `every` for `span`; returns the replies with the
/// instant each was sent.
fn trickle(c: &mut Client, line: &str, every: Duration, span: Duration) -> Vec<(Instant, Reply)> {
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < span {
        let at = Instant::now();
        out.push((at, parse_reply(&c.request(line))));
        sleep(every);
    }
    out
}

/// Drains the key of `probe` (a `CHECK` line), then reloads `tightened`; returns once
/// the daemon answers with `new_limit`, with the instant the drain started.
fn drain_then_reload(
    d: &Daemon,
    c: &mut Client,
    redis: &RedisStandalone,
    tightened: &str,
    probe: &str,
    new_limit: u64,
) -> Instant {
    let drain_started = Instant::now();
    let burst: Vec<String> = (0..250).map(|_| probe.to_string()).collect();
    let replies = c.pipeline(&burst);
    let last = parse_reply(replies.last().expect("replies"));
    assert_eq!(
        (last.verdict.as_str(), last.source.as_str()),
        ("DENY", "redis"),
        "{replies:?}"
    );
    d.write_config(&config(redis, tightened));
    d.signal(libc::SIGHUP);
    let cost0 = probe.to_string() + " 0";
    assert!(
        wait_until(Duration::from_secs(5), || parse_reply(&c.request(&cost0))
            .limit
            == new_limit),
        "{}",
        d.log()
    );
    drain_started
}

/// token_bucket capacity 100 refilling 100/s (full again 1 s after a drain, so its key
/// expired 2 s after it) tightened to capacity 10 refilling 0.2/s: the stored state
/// (empty at the drain) now refills at 0.2/s, so over the next 3.5 s the key admits at
/// most ⌈0.2/s × (time since the drain started)⌉, never a fresh 10.
#[test]
fn a_reload_tightening_a_token_bucket_keeps_a_drained_key_drained() {
    let redis = RedisStandalone::start();
    let rules = "[[rule]]\nname = \"t\"\nalgorithm = \"token_bucket\"\ncapacity = 100\nrefill_rate = 100.0\n";
    let tightened =
        "[[rule]]\nname = \"t\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrefill_rate = 0.2\n";
    let d = Daemon::start(&config(&redis, rules));
    let mut c = d.connect();
    let drained = drain_then_reload(&d, &mut c, &redis, tightened, "CHECK t k", 10);
    let replies = trickle(
        &mut c,
        "CHECK t k",
        Duration::from_millis(50),
        Duration::from_millis(3500),
    );
    let allowed = replies.iter().filter(|(_, r)| r.allowed()).count() as f64;
    let last_sent = replies.last().expect("replies").0;
    let bound = (0.2 * (last_sent - drained).as_secs_f64()).ceil();
    eprintln!(
        "token bucket tightened: {allowed} admitted in {:.2} s after the drain (bound {bound})",
        (last_sent - drained).as_secs_f64()
    );
    assert!(
        allowed <= bound,
        "{allowed} > {bound}: {:?}",
        replies.iter().map(|(_, r)| r).collect::<Vec<_>>()
    );
    assert!(replies.iter().all(|(_, r)| r.source == "redis"));
}

/// sliding_window_log limit 100 per 1 s (its key expired 1 s after the newest entry
/// left the window) tightened to 10 per 10 s: the 100 units logged at the drain are all
/// still inside the new window for the next 3.5 s, so nothing is admitted.
#[test]
fn a_reload_tightening_a_sliding_log_keeps_a_drained_key_drained() {
    let redis = RedisStandalone::start();
    let rules =
        "[[rule]]\nname = \"s\"\nalgorithm = \"sliding_window_log\"\nlimit = 100\nwindow = \"1s\"\n";
    let tightened =
        "[[rule]]\nname = \"s\"\nalgorithm = \"sliding_window_log\"\nlimit = 10\nwindow = \"10s\"\n";
    let d = Daemon::start(&config(&redis, rules));
    let mut c = d.connect();
    let drained = drain_then_reload(&d, &mut c, &redis, tightened, "CHECK s k", 10);
    let replies = trickle(
        &mut c,
        "CHECK s k",
        Duration::from_millis(50),
        Duration::from_millis(3500),
    );
    let allowed = replies.iter().filter(|(_, r)| r.allowed()).count();
    let span = (replies.last().expect("replies").0 - drained).as_secs_f64();
    eprintln!("sliding log tightened: {allowed} admitted in {span:.2} s after the drain (bound 0)");
    assert!(span < 10.0, "the run outlasted the new window");
    assert_eq!(
        allowed,
        0,
        "{replies:?}",
        replies = replies.iter().map(|(_, r)| r).collect::<Vec<_>>()
    );
}

/// A key drained in Redis, then Redis killed: the local bucket (one host, the full
/// limit) starts from Redis's last report (0 left, refilling 1/s), not full, so over the
/// next second it admits at most ⌈1/s × time since the drain⌉ + 1.
#[test]
fn a_local_bucket_starts_from_what_redis_last_reported() {
    let mut redis = RedisStandalone::start();
    let rules =
        "[[rule]]\nname = \"t\"\nalgorithm = \"token_bucket\"\ncapacity = 20\nrefill_rate = 1.0\n";
    let d = Daemon::start(&config(&redis, rules));
    let mut c = d.connect();
    let drained = Instant::now();
    let burst: Vec<String> = (0..40).map(|_| "CHECK t k".to_string()).collect();
    let replies = c.pipeline(&burst);
    let admitted = replies.iter().filter(|r| r.starts_with("ALLOW")).count();
    assert!((20..=21).contains(&admitted), "{replies:?}");
    redis.kill();
    let replies = trickle(
        &mut c,
        "CHECK t k",
        Duration::from_millis(20),
        Duration::from_millis(1000),
    );
    let local: Vec<&Reply> = replies
        .iter()
        .map(|(_, r)| r)
        .filter(|r| r.source == "local")
        .collect();
    assert!(
        !local.is_empty(),
        "{replies:?}",
        replies = replies.iter().map(|(_, r)| r).collect::<Vec<_>>()
    );
    let allowed = local.iter().filter(|r| r.allowed()).count() as f64;
    let span = (replies.last().expect("replies").0 - drained).as_secs_f64();
    let bound = span.ceil() + 1.0;
    eprintln!("local after a drain: {allowed} admitted in {span:.2} s (bound {bound}; a full bucket would admit 20)");
    assert!(allowed <= bound, "{allowed} > {bound}: {local:?}");
}

/// `fallback.hosts = "auto"` (the default): two daemons on one Redis each register a
/// heartbeat, say at start-up which share is in force, learn that they are two, and keep
/// that count through an outage: with Redis gone, a fresh key gets capacity ÷ 2 locally.
#[test]
fn auto_hosts_count_the_daemons_alive_and_keep_the_count_through_an_outage() {
    let mut redis = RedisStandalone::start();
    let rules = "[[rule]]\nname = \"t\"\nalgorithm = \"token_bucket\"\ncapacity = 20\nrefill_rate = 0.001\n";
    let a = Daemon::start(&config(&redis, rules));
    assert!(
        wait_until(Duration::from_secs(5), || a
            .log()
            .contains("1 daemon(s) alive in Redis")),
        "{}",
        a.log()
    );
    let b = Daemon::start(&config(&redis, rules));
    assert!(
        wait_until(Duration::from_secs(5), || b
            .log()
            .contains("2 daemon(s) alive in Redis")),
        "{}",
        b.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || a.log().contains("1 -> 2")),
        "{}",
        a.log()
    );
    redis.kill();
    for d in [&a, &b] {
        let mut c = d.connect();
        let burst: Vec<String> = (0..30).map(|_| "CHECK t fresh".to_string()).collect();
        let replies: Vec<Reply> = c.pipeline(&burst).iter().map(|l| parse_reply(l)).collect();
        assert!(replies.iter().all(|r| r.source == "local"), "{replies:?}");
        let allowed = replies.iter().filter(|r| r.allowed()).count();
        assert_eq!(allowed, 10, "capacity 20 ÷ 2 daemons: {replies:?}");
    }
}
