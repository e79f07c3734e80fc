//! A forward jump of Redis's clock across a window's end while window leases are out
//! (docs/DESIGN.md "Leases", "Deadlines on the holder"): the next window starts in Redis
//! while each holder may still spend the last window's lease on its own clock. Redis
//! counts a lease in every window it may be spent in until its holder gave it back or a
//! witness's clock counted its lifetime, so the units spent after the jump are counted
//! in the window Redis's clock put them in.
//!
//! Redis runs with the clock shim of `clock_jump.rs`; three daemons saturate one key of
//! a `fixed_window` (asking 750 per second: each spends its share over most of the
//! window) and one of a `sliding_window_counter` rule (as fast as they can), limit 600
//! per 1 s, and Redis's clock jumps 0.95 s ahead 0.1 s into a window (0.05 s into the
//! next). ALLOWs are counted by Redis's clock: a batch read before the offset was
//! written by the host's, one sent after it by the host's plus the jump (a batch across
//! the write is left out: the counts are at most what was admitted), in 50 ms buckets.
//! The bound is the rule's own: a fixed window at most its limit; a sliding window
//! counter, at the end of every 50 ms of window n, `ALLOWs(n − 1) × (1 − elapsed ÷
//! window) + ALLOWs(n so far) ≤ limit`. And the windows from the third after the one the
//! jump left admit at least 90 % of the limit.

use super::common::clock_shim::{build_clock_shim, OFFSET_FROM_FILE};
use super::common::*;
use super::harness::*;
use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::Duration;

const LIMIT: u64 = 600;
const BUCKET_MS: u64 = 50;
const JUMP_MS: u64 = 950;

/// The batches a load thread saw: (sent, read) epoch ms of the host, ALLOWs.
type Batches = Vec<(u64, u64, u64)>;

fn record(b: &mut Batches, replies: &[String], (sent, read): (u64, u64)) {
    let (sent, read) = (sent / 1000, read / 1000);
    let allowed = replies.iter().filter(|r| parse_reply(r).allowed()).count() as u64;
    b.push((sent, read, allowed));
}

/// ALLOWs per 50 ms bucket of Redis's clock, `base` ms ahead of the host's until the
/// offset was written between `jump.0` and `jump.1` (host ms), [`JUMP_MS`] more then.
fn by_redis_clock(batches: &[Batches], base: u64, jump: (u64, u64)) -> HashMap<u64, u64> {
    let mut buckets = HashMap::new();
    for &(sent, read, allowed) in batches.iter().flatten() {
        let shift = if read < jump.0 {
            base
        } else if sent > jump.1 {
            base + JUMP_MS
        } else {
            continue;
        };
        let (from, to) = ((sent + shift) / BUCKET_MS, (read + shift) / BUCKET_MS);
        if from == to {
            *buckets.entry(from).or_default() += allowed;
        }
    }
    buckets
}

/// The bound of the module's doc on the windows (1 s) `from..to`, and 90 % of the limit
/// from `floor_from` on. Returns the failures.
fn check(rule: &str, b: &HashMap<u64, u64>, from: u64, to: u64, floor_from: u64) -> Vec<String> {
    let per = 1000 / BUCKET_MS;
    let at = |k: u64| b.get(&k).copied().unwrap_or(0);
    let window = |n: u64| -> u64 { (n * per..(n + 1) * per).map(at).sum() };
    let mut failures = Vec::new();
    for n in from..to {
        let previous = if rule == "fw" { 0 } else { window(n - 1) };
        let (mut so_far, mut worst) = (0, 0.0f64);
        for f in 0..per {
            so_far += at(n * per + f);
            let weight = 1.0 - (f + 1) as f64 / per as f64;
            worst = worst.max(previous as f64 * weight + so_far as f64);
        }
        println!("{rule} window {n}: {so_far} ALLOW, after {previous}: at least {worst:.0}");
        if worst > LIMIT as f64 {
            failures.push(format!("{rule} window {n}: {worst:.0} > {LIMIT}"));
        }
        if n >= floor_from && so_far * 10 < LIMIT * 9 {
            failures.push(format!("{rule} window {n}: {so_far} < 90 % of {LIMIT}"));
        }
    }
    failures
}

#[test]
fn a_forward_jump_across_a_window_end_admits_within_the_windows() {
    let _one = crate::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let dir = short_tempdir("rld-wjump-");
    let lib = build_clock_shim(dir.path(), "clockjump", OFFSET_FROM_FILE);
    let offset_path = dir.path().join("offset");
    let f = Mutex::new(std::fs::File::create(&offset_path).expect("offset file"));
    f.lock()
        .unwrap()
        .write_all(&0i64.to_le_bytes())
        .expect("offset");
    let env = [
        ("LD_PRELOAD".to_string(), lib.display().to_string()),
        (
            "RLD_CLOCK_OFFSET_FILE".to_string(),
            offset_path.display().to_string(),
        ),
    ];
    let redis = RedisStandalone::start_with_env(&env);
    let mut config = format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 150\nprefix = \"rl\"\n",
        redis.addr()
    );
    for (name, algorithm) in [("fw", "fixed_window"), ("swc", "sliding_window_counter")] {
        config += &format!(
            "\n[[rule]]\nname = \"{name}\"\nalgorithm = \"{algorithm}\"\nlimit = {LIMIT}\nwindow = \"1s\"\nlease = \"auto\"\n"
        );
    }
    let daemons: Vec<Daemon> = (0..3).map(|_| Daemon::start(&config)).collect();
    sleep(Duration::from_millis(2500));
    let mut failures = Vec::new();
    let mut base = 0;
    for rule in ["fw", "swc"] {
        let stop = Arc::new(AtomicBool::new(false));
        let line = format!("CHECK {rule} hot");
        // A fixed window's share is spent over most of the window (750/s asked for 600
        // per second), so that leases hold units at the jump; a sliding window counter's
        // slices accrue until the window's end whatever the demand.
        let (batch, every) = if rule == "fw" { (1, 8) } else { (5, 1) };
        let every = Duration::from_millis(every);
        let handles: Vec<_> = daemons
            .iter()
            .map(|d| load_with(&d.socket, &line, 2, batch, every, &stop, record))
            .collect();
        // 0.1 s into a window (Redis's clock) after two whole ones under load.
        let start = ((epoch_ms() + base) / 1000 + 3) * 1000;
        let now = epoch_ms() + base;
        sleep(Duration::from_millis(start + 100 - now));
        let before = epoch_ms();
        f.lock()
            .unwrap()
            .write_all_at(&(((base + JUMP_MS) * 1000) as i64).to_le_bytes(), 0)
            .expect("writing the offset");
        let after = epoch_ms();
        sleep(Duration::from_millis(4500));
        stop.store(true, Ordering::Relaxed);
        let batches: Vec<Batches> = handles
            .into_iter()
            .flatten()
            .map(|h| h.join().expect("load thread"))
            .collect();
        let buckets = by_redis_clock(&batches, base, (before, after));
        base += JUMP_MS;
        // Redis's windows: the one the jump left (start / 1000), the one it entered,
        // and the next three.
        let n = start / 1000;
        failures.extend(check(rule, &buckets, n, n + 5, n + 3));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
