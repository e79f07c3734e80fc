//! Evicting a local bucket never hands its key a fresh budget: a real daemon
//! (`redis.mode = "none"`, `fallback.max_keys = 10000`) over its socket. A drained
//! token bucket (capacity 5, 0.01 token/s: full again in 500 s) is flooded out of the
//! local buckets by distinct keys of another rule, pipelined by one client; its next
//! CHECK is still a DENY with nothing remaining. Keys never used before start full
//! (the eviction sketch's false positives, documented in `src/state_map/sketch.rs`,
//! cannot reach them: the flood's records carry another rule's tag), and the evictions
//! are counted in `ratelimitd_local_evictions_total`.
//!
//! The flood's size: `EVICTION_FLOOD_KEYS` (default 10⁶, about 10 s against the debug
//! build; 10⁷ with `EVICTION_DAEMON=target/release/ratelimitd`, about 10 s too, is the
//! figure docs/PERFORMANCE.md reports). Bounded in time: the whole flood must be answered
//! within `FLOOD_TIMEOUT`.

use crate::common;

use common::*;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const FLOOD_TIMEOUT: Duration = Duration::from_secs(900);

/// The flood's keys, from the environment or 10⁶.
fn flood_keys() -> u64 {
    std::env::var("EVICTION_FLOOD_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// The daemon binary: `EVICTION_DAEMON` (e.g. a release build), else cargo's.
fn daemon_program() -> PathBuf {
    std::env::var_os("EVICTION_DAEMON").map_or_else(daemon_bin, PathBuf::from)
}

fn config(port: u16) -> String {
    format!(
        r#"[redis]
mode = "none"
[fallback]
max_keys = 10000
[metrics]
listen = "127.0.0.1:{port}"

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 5
refill_rate = 0.01

[[rule]]
name = "flood"
algorithm = "token_bucket"
capacity = 5
refill_rate = 2.0
"#
    )
}

/// Sends `CHECK flood f<i>` for `i < n` on one connection, pipelined (a writer
/// thread), and reads every reply; returns (ALLOWs, DENYs).
fn flood(socket: &std::path::Path, n: u64) -> (u64, u64) {
    let stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let mut w = BufWriter::with_capacity(1 << 16, writer);
        for i in 0..n {
            writeln!(w, "CHECK flood f{i}").expect("writing the flood");
        }
        w.flush().expect("writing the flood");
    });
    let deadline = Instant::now() + FLOOD_TIMEOUT;
    let mut reader = BufReader::with_capacity(1 << 16, stream);
    let (mut allowed, mut denied) = (0, 0);
    let mut line = String::new();
    for i in 0..n {
        line.clear();
        let read = reader.read_line(&mut line).expect("reading a flood reply");
        assert!(
            read > 0,
            "the daemon closed the connection after {i} replies"
        );
        if line.starts_with("ALLOW ") {
            allowed += 1;
        } else if line.starts_with("DENY ") {
            denied += 1;
        } else {
            panic!("reply {i}: {line}");
        }
        if i % 65_536 == 0 {
            assert!(
                Instant::now() < deadline,
                "flood not answered in {FLOOD_TIMEOUT:?}"
            );
        }
    }
    sender.join().unwrap();
    (allowed, denied)
}

/// The value of `series` (name and labels as exposed) in a scrape (0 if absent: a
/// counter never incremented).
fn metric(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn a_drained_key_stays_drained_through_a_flood_of_distinct_keys() {
    let port = free_port();
    let d = Daemon::start_with(&daemon_program(), &[("RUST_LOG", "warn")], &config(port));
    let mut c = d.connect();
    for left in (0..5).rev() {
        assert_eq!(
            c.request("CHECK api drained"),
            format!("ALLOW 5 {left} {} 0 local 500000", (5 - left) * 100_000)
        );
    }
    let r = parse_reply(&c.request("CHECK api drained"));
    assert_eq!(
        (r.allowed(), r.remaining),
        (false, 0),
        "drained before the flood"
    );

    let n = flood_keys();
    let t = Instant::now();
    let (allowed, denied) = flood(&d.socket, n);
    let took = t.elapsed();
    eprintln!(
        "flood: {n} keys in {:.1} s ({:.0} req/s): {allowed} ALLOW, {denied} DENY",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );

    // The bound: what the drained key was refilled since (at most 0.01 token/s × the
    // flood's seconds) is all it may have; under 1 token: DENY, nothing remaining.
    assert!(
        took < Duration::from_secs(99),
        "the test's bound assumes < 1 token refilled"
    );
    let r = parse_reply(&c.request("CHECK api drained"));
    assert_eq!(
        (r.allowed(), r.remaining),
        (false, 0),
        "after {n} keys: {r:?}"
    );

    // Utilisation: a key of "api" never used before starts full, every one of them.
    let fresh: Vec<String> = (0..1000).map(|i| format!("CHECK api never{i}")).collect();
    for (i, reply) in c.pipeline(&fresh).iter().enumerate() {
        assert!(reply.starts_with("ALLOW 5 4 "), "never{i}: {reply}");
    }

    // The evictions are counted: the flood's keys (used, their state mattering for
    // 0.5 s) beyond the 10,000 held, and the drained key.
    let s = scrape(port);
    let used = metric(&s, "ratelimitd_local_evictions_total{kind=\"used\"}");
    let fresh = metric(&s, "ratelimitd_local_evictions_total{kind=\"fresh\"}");
    eprintln!("evictions: {used} used, {fresh} fresh");
    assert!(
        used + fresh >= (n - 10_000) as f64,
        "{used} + {fresh} evictions for {n} keys"
    );
    assert!(used > 0.0, "the flood's keys still mattered when evicted");
}
