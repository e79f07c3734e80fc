//! Decisions sent to a standalone Redis in batches (several to one EVALSHA of the batch
//! script): under concurrent load each key still gets exactly its rule's count, a key
//! whose Redis value is foreign is decided locally while the decisions sharing its
//! batch stay in Redis, a flushed script cache is reloaded for a batch, and a frozen
//! Redis under batched load is answered locally within `timeout_ms`.

use crate::common;

use common::*;
use std::collections::HashMap;

/// A daemon config for one standalone Redis, with [`BUCKET_RULES`].
fn standalone_config(redis: &RedisStandalone) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 500\n\
         [fallback]\nhosts = 1\n{BUCKET_RULES}",
        redis.addr()
    )
}

/// 8 connections × 16 requests in flight over 200 keys of the `slow` rule (capacity 5,
/// refill 2/s), each key asked 8 times, within a second: each key's ALLOWs number
/// its capacity plus what refilled during the run, all decided in Redis, and the
/// decisions took fewer EVALSHAs than there were decisions.
#[test]
fn concurrent_decisions_share_calls_and_each_key_keeps_its_count() {
    const KEYS: usize = 200;
    const ASKS: usize = 8;
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    assert_eq!(
        parse_reply(&d.connect().request("CHECK slow warm")).source,
        "redis"
    );
    let calls_before = redis.script_calls();
    let started = std::time::Instant::now();
    // Connection w asks keys w, w + 8, … in turn, ASKS times each, 16 lines at a time.
    let replies: Vec<(usize, Reply)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|w| {
                let d = &d;
                s.spawn(move || {
                    let mut c = d.connect();
                    let keys: Vec<usize> = (w..KEYS).step_by(8).collect();
                    let lines: Vec<(usize, String)> = (0..ASKS)
                        .flat_map(|_| keys.iter().map(|&k| (k, format!("CHECK slow k{k}"))))
                        .collect();
                    let mut out = Vec::new();
                    for chunk in lines.chunks(16) {
                        let sent: Vec<String> = chunk.iter().map(|(_, l)| l.clone()).collect();
                        for ((k, _), line) in chunk.iter().zip(c.pipeline(&sent)) {
                            out.push((*k, parse_reply(&line)));
                        }
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    let elapsed = started.elapsed();
    let calls = redis.script_calls() - calls_before;
    // Capacity 5, refilled at 2/s: at most 5 + 2 × the run's length (rounded up).
    let bound = 5 + (2.0 * elapsed.as_secs_f64()).ceil() as usize;
    let mut allowed: HashMap<usize, usize> = HashMap::new();
    for (k, r) in &replies {
        assert!(
            r.source == "redis" || (r.source == "cache" && !r.allowed()),
            "key {k}: {r:?}"
        );
        *allowed.entry(*k).or_default() += usize::from(r.allowed());
    }
    eprintln!(
        "{} decisions in {elapsed:?}: {calls} EVALSHAs; ALLOWs per key {:?}..{:?} (bound {bound})",
        replies.len(),
        allowed.values().min(),
        allowed.values().max()
    );
    assert_eq!(replies.len(), KEYS * ASKS);
    for k in 0..KEYS {
        let n = allowed.get(&k).copied().unwrap_or(0);
        assert!(
            (5..=bound).contains(&n),
            "key {k}: {n} ALLOWs, expected 5..={bound}"
        );
    }
    assert!(
        (calls as usize) < replies.len(),
        "{calls} EVALSHAs for {} decisions: none shared",
        replies.len()
    );
}

/// One pipeline of 16 keys, one of them someone else's string: that key gets
/// `WRONGTYPE` and is decided locally, the 15 others sharing its batches are decided in
/// Redis, and the circuit stays closed.
#[test]
fn a_foreign_key_in_a_batch_is_decided_locally_and_the_rest_in_redis() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    assert_eq!(parse_reply(&c.request("CHECK big warm")).source, "redis");
    assert_eq!(redis.cli(&["SET", "rl:{big:k7}:tb", "x"]), "OK");
    let lines: Vec<String> = (0..16).map(|k| format!("CHECK big k{k}")).collect();
    let calls_before = redis.script_calls();
    let replies: Vec<Reply> = c.pipeline(&lines).iter().map(|l| parse_reply(l)).collect();
    let calls = redis.script_calls() - calls_before;
    eprintln!("16 decisions in {calls} EVALSHAs");
    assert!(
        calls < 16,
        "16 decisions in {calls} EVALSHAs: none shared a batch"
    );
    for (k, r) in replies.iter().enumerate() {
        let source = if k == 7 { "local" } else { "redis" };
        assert_eq!(
            (r.verdict.as_str(), r.source.as_str()),
            ("ALLOW", source),
            "k{k}: {r:?}"
        );
    }
    assert!(!d.log().contains("circuit open"), "{}", d.log());
    assert!(
        d.log().contains("WRONGTYPE"),
        "the key's error is logged: {}",
        d.log()
    );
}

/// `SCRIPT FLUSH` (as after a restart or a failover): the next pipeline's batch gets
/// `NOSCRIPT`, the scripts are loaded again and every decision is made in Redis.
#[test]
fn a_flushed_script_cache_is_reloaded_for_a_batch() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis));
    let mut c = d.connect();
    assert_eq!(parse_reply(&c.request("CHECK big warm")).source, "redis");
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]), "OK");
    let lines: Vec<String> = (0..32).map(|k| format!("CHECK big f{k}")).collect();
    for (k, line) in c.pipeline(&lines).iter().enumerate() {
        let r = parse_reply(line);
        assert_eq!(
            (r.verdict.as_str(), r.remaining, r.source.as_str()),
            ("ALLOW", 49, "redis"),
            "f{k}: {r:?}"
        );
    }
    assert!(!d.log().contains("circuit open"), "{}", d.log());
}

/// Redis frozen (`SIGSTOP`) for 600 ms under 4 connections × 16 requests in flight over
/// 200 keys of the `slow` rule (capacity 5, refill 2/s, one host): every pipeline is
/// answered within `timeout_ms` plus a margin, the frozen time locally, Redis again
/// within a second of `SIGCONT`, and no key admits more than Redis's budget plus one
/// local share over the run (`(5 + 2 T)` each).
#[test]
fn a_frozen_redis_under_batched_load_is_answered_locally_within_the_timeout() {
    const TIMEOUT_MS: u64 = 25;
    let redis = RedisStandalone::start();
    let config = standalone_config(&redis).replace("timeout_ms = 500", "timeout_ms = 25");
    let d = Daemon::start(&config);
    assert_eq!(
        parse_reply(&d.connect().request("CHECK slow warm")).source,
        "redis"
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = std::time::Instant::now();
    type Run = (Vec<(usize, Reply)>, std::time::Duration, Vec<String>);
    let runs: Vec<Run> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (d, stop) = (&d, &stop);
                s.spawn(move || {
                    let mut c = d.connect();
                    let (mut out, mut slowest, mut last) =
                        (Vec::new(), Default::default(), Vec::new());
                    let mut i = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let keys: Vec<usize> = (0..16).map(|j| w * 50 + (i + j) % 50).collect();
                        i += 16;
                        let lines: Vec<String> =
                            keys.iter().map(|k| format!("CHECK slow k{k}")).collect();
                        let sent = std::time::Instant::now();
                        let replies = c.pipeline(&lines);
                        slowest = std::cmp::max(slowest, sent.elapsed());
                        last.clone_from(&replies);
                        out.extend(keys.into_iter().zip(replies.iter().map(|l| parse_reply(l))));
                    }
                    (out, slowest, last)
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(300));
        redis.signal(libc::SIGSTOP);
        std::thread::sleep(std::time::Duration::from_millis(600));
        redis.signal(libc::SIGCONT);
        std::thread::sleep(std::time::Duration::from_millis(1200));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let elapsed = started.elapsed();
    let slowest = runs.iter().map(|r| r.1).max().unwrap_or_default();
    let local = runs
        .iter()
        .flat_map(|r| &r.0)
        .filter(|(_, r)| r.source == "local")
        .count();
    let total: usize = runs.iter().map(|r| r.0.len()).sum();
    let bound = 5 + (2.0 * elapsed.as_secs_f64()).ceil() as usize;
    let mut allowed: HashMap<usize, usize> = HashMap::new();
    for (k, r) in runs.iter().flat_map(|r| &r.0) {
        *allowed.entry(*k).or_default() += usize::from(r.allowed());
    }
    let most = allowed.values().copied().max().unwrap_or(0);
    eprintln!(
        "{total} decisions in {elapsed:?}, {local} local; slowest pipeline {slowest:?}; \
         most ALLOWs for a key {most} (bound {})",
        2 * bound
    );
    assert!(
        local > 0,
        "nothing was decided locally while Redis was frozen"
    );
    // timeout_ms plus room for this 2-core machine's scheduling under load.
    let margin = std::time::Duration::from_millis(TIMEOUT_MS + 300);
    assert!(
        slowest <= margin,
        "a pipeline took {slowest:?} > {margin:?}"
    );
    assert!(most <= 2 * bound, "a key admitted {most} > {}", 2 * bound);
    for (_, _, last) in &runs {
        for line in last {
            let r = parse_reply(line);
            assert!(
                r.source == "redis" || r.source == "cache",
                "1.2 s after SIGCONT: {line}"
            );
        }
    }
}

/// The batch script as production calls it, with no "now" of the tests: a decision on a
/// key whose state lies an hour ahead (its script moves `now` up to it) is followed by
/// a new key's decision, which is stored at Redis's `TIME`, not at the first key's
/// moved `now`.
#[test]
fn a_decision_in_a_batch_starts_from_the_batch_s_time() {
    let redis = RedisStandalone::start();
    let addr = redis.addr();
    let time = |addr: &str| -> u64 {
        let t = redis_command(addr, &["TIME"])
            .and_then(Resp::into_strings)
            .expect("TIME");
        t[0].parse::<u64>().expect("s") * 1_000_000 + t[1].parse::<u64>().expect("µs")
    };
    let ahead = (time(&addr) + 3_600_000_000).to_string();
    assert_eq!(
        redis.cli(&["HSET", "rl:{api:ahead}:tb", "t", "1000000", "ts", &ahead]),
        "2"
    );
    let script = ratelimitd::store::scripts::batch_lua();
    // token bucket (index 0): capacity 5, refill 1/s, cost 1 (micro-units)
    let item = ["0", "3", "5000000", "1", "1000000"];
    let mut cmd = vec!["EVAL", &script, "2", "rl:{api:ahead}:tb", "rl:{api:new}:tb"];
    cmd.extend(item);
    cmd.extend(item);
    let reply = redis_command(&addr, &cmd).expect("EVAL batch");
    let before = time(&addr);
    let ts: u64 = redis
        .cli(&["HGET", "rl:{api:new}:tb", "ts"])
        .parse()
        .expect("ts of the new key");
    eprintln!("{reply:?}; new key stored at {ts}, Redis TIME {before}");
    assert!(
        ts <= before && before - ts < 5_000_000,
        "the new key was stored at {ts}, Redis TIME is {before} (the first key's state is at {ahead})"
    );
}
