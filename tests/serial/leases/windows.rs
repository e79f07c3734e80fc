//! Windows under leases, window by window: three daemons saturating one key of a
//! `fixed_window` or a `sliding_window_counter` rule admit, in each whole window of the
//! run, at most `limit` and at least 90 % of it, the daemons in shares within ±10 % of
//! their mean, with at most one script call per ten ALLOWs (Redis's count). A sliding
//! window counter's room comes back a little at a time as the previous window's weight
//! falls; each saturated daemon accrues its share of it on a window slice
//! (docs/DESIGN.md "Leases", "Windows").
//!
//! Each load thread counts its ALLOWs per epoch-aligned window (the Redis clock is this
//! host's, on loopback) by the instants its pipelined batch was sent and read: a batch
//! sent and read inside window n was decided in it; one that straddles a boundary was
//! decided in one of the two and is counted apart. So window n admitted at least its
//! `inside` count (the floor is asserted on it) and at most that plus the batches that
//! straddle its two boundaries; the ceiling is asserted on `inside`, and the whole
//! run's ALLOWs against `limit` per window touched.
//!
//! The floor and the shares are judged only in the windows where every daemon was
//! asking throughout and was answered by Redis or its lease: a host whose load threads
//! had no batch in flight for over [`IDLE_MS`] (starved of CPU) was not asking, and a
//! request that waited over `redis.timeout_ms` behind a slow call is decided per
//! `on_redis_failure` (`deny` here, so that no such decision admits anything). Those
//! windows are reported apart, the ceiling still asserted on them; the run fails if
//! fewer than [`JUDGED`] windows are left to judge.

use super::common::*;
use super::harness::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const LIMIT: u64 = 600;
const WINDOW_MS: u64 = 1000;
const RULES: &str = r#"
[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 600
window = "1s"
lease = "auto"
on_redis_failure = "deny"

[[rule]]
name = "swc"
algorithm = "sliding_window_counter"
limit = 600
window = "1s"
lease = "auto"
on_redis_failure = "deny"
"#;

/// A host none of whose load threads had a batch in flight for longer than this inside
/// a window (the threads were not scheduled) did not ask throughout it, ms.
const IDLE_MS: u64 = 100;
/// At least this many whole windows must find every host asking throughout.
const JUDGED: usize = 3;

/// One daemon's ALLOWs per window: decided inside window n (`inside[n]`), or in a batch
/// sent in window n and read in a later one (`straddle[n]`); and every batch's instants
/// (sent, read; epoch ms).
#[derive(Debug, Default)]
struct Counts {
    inside: HashMap<u64, u64>,
    straddle: HashMap<u64, u64>,
    rounds: Vec<(u64, u64)>,
    /// Decisions neither from Redis nor from a lease (`on_redis_failure`: a request
    /// that waited over `redis.timeout_ms`), per window sent in.
    without_redis: HashMap<u64, u64>,
}

/// The longest time inside window `n` during which none of `rounds` (sorted) was in
/// flight: the host was not asking, ms.
fn idle_in(rounds: &[(u64, u64)], n: u64) -> u64 {
    let (from, to) = (n * WINDOW_MS, (n + 1) * WINDOW_MS);
    let (mut covered, mut longest) = (from, 0);
    for &(sent, read) in rounds {
        if sent >= to {
            break;
        }
        if read < covered {
            continue;
        }
        longest = longest.max(sent.saturating_sub(covered));
        covered = read;
    }
    longest.max(to.saturating_sub(covered))
}

fn record(c: &mut Counts, replies: &[String], (sent, read): (u64, u64)) {
    let (sent, read) = (sent / 1000, read / 1000);
    c.rounds.push((sent, read));
    let replies: Vec<Reply> = replies.iter().map(|r| parse_reply(r)).collect();
    let allowed = replies.iter().filter(|r| r.allowed()).count() as u64;
    let without = replies
        .iter()
        .filter(|r| !["redis", "lease", "cache"].contains(&r.source.as_str()))
        .count() as u64;
    *c.without_redis.entry(sent / WINDOW_MS).or_default() += without;
    let (from, to) = (sent / WINDOW_MS, read / WINDOW_MS);
    let into = if from == to {
        &mut c.inside
    } else {
        &mut c.straddle
    };
    *into.entry(from).or_default() += allowed;
}

#[test]
fn window_leases_use_each_window_fairly_and_never_above_its_limit() {
    let s = Setup::start(RULES);
    let mut failures = Vec::new();
    for rule in ["fw", "swc"] {
        let stop = Arc::new(AtomicBool::new(false));
        let calls_before = s.script_calls();
        let first = epoch_ms();
        let line = format!("CHECK {rule} hot");
        let handles: Vec<Vec<_>> = s
            .daemons
            .iter()
            .map(|d| {
                load_with(
                    &d.socket,
                    &line,
                    2,
                    5,
                    Duration::from_millis(1),
                    &stop,
                    record,
                )
            })
            .collect();
        thread::sleep(Duration::from_millis(5500));
        stop.store(true, Ordering::Relaxed);
        let hosts: Vec<Counts> = handles
            .into_iter()
            .map(|threads| {
                let mut host = Counts::default();
                for h in threads {
                    let c = h.join().expect("load thread");
                    for (n, a) in c.inside {
                        *host.inside.entry(n).or_default() += a;
                    }
                    for (n, a) in c.straddle {
                        *host.straddle.entry(n).or_default() += a;
                    }
                    for (n, a) in c.without_redis {
                        *host.without_redis.entry(n).or_default() += a;
                    }
                    host.rounds.extend(c.rounds);
                }
                host.rounds.sort_unstable();
                host
            })
            .collect();
        let last = epoch_ms();
        let calls = s.script_calls() - calls_before;
        let (w0, w1) = (first / WINDOW_MS, last / WINDOW_MS);
        let of = |m: &HashMap<u64, u64>, n: u64| m.get(&n).copied().unwrap_or(0);
        let mut shares = vec![0u64; hosts.len()];
        let mut judged = 0;
        // The whole windows: not the first nor the last the run touched.
        for n in w0 + 1..w1 {
            let per: Vec<u64> = hosts.iter().map(|h| of(&h.inside, n)).collect();
            let inside: u64 = per.iter().sum();
            let straddling: u64 = hosts
                .iter()
                .map(|h| of(&h.straddle, n - 1) + of(&h.straddle, n))
                .sum();
            let idle: Vec<u64> = hosts.iter().map(|h| idle_in(&h.rounds, n)).collect();
            let without: Vec<u64> = hosts.iter().map(|h| of(&h.without_redis, n)).collect();
            println!(
                "{rule} window {n}: {inside} ALLOW inside (+ ≤ {straddling} straddling), per host {per:?}; hosts idle up to {idle:?} ms, decided without Redis {without:?}"
            );
            if inside > LIMIT {
                failures.push(format!("{rule}: window {n} admitted {inside} > {LIMIT}"));
            }
            // A host whose load threads were starved of CPU did not ask throughout the
            // window, and one whose requests timed out was not answered by the leases:
            // its share, and the window's use, say nothing of them.
            if idle.iter().any(|i| *i > IDLE_MS) || without.iter().any(|w| *w > 0) {
                println!("{rule} window {n}: not judged (a host idle over {IDLE_MS} ms, or decided without Redis)");
                continue;
            }
            judged += 1;
            per.iter().zip(shares.iter_mut()).for_each(|(p, s)| *s += p);
            if (inside as f64) < 0.9 * LIMIT as f64 {
                failures.push(format!(
                    "{rule}: window {n} admitted {inside} < 90 % of {LIMIT}"
                ));
            }
        }
        let allowed: u64 = hosts
            .iter()
            .map(|h| h.inside.values().sum::<u64>() + h.straddle.values().sum::<u64>())
            .sum();
        let bound = LIMIT * (w1 - w0 + 1);
        if allowed > bound {
            failures.push(format!("{rule}: over-admitted {allowed} > {bound}"));
        }
        if judged < JUDGED {
            failures.push(format!(
                "{rule}: only {judged} whole windows with every host asking throughout and \
                 answered by Redis or a lease (load threads or daemons starved of CPU: \
                 not a verdict on the leases)"
            ));
        }
        let mean = shares.iter().sum::<u64>() as f64 / shares.len() as f64;
        println!("{rule}: {allowed} ALLOW over the run (bound {bound}); judged windows per host {shares:?}, mean {mean:.0}; {calls} script calls");
        if calls * 10 > allowed {
            failures.push(format!("{rule}: {calls} script calls for {allowed} ALLOW"));
        }
        for (i, share) in shares.iter().enumerate() {
            if (*share as f64 - mean).abs() > 0.1 * mean {
                failures.push(format!(
                    "{rule}: host {i} admitted {share}, mean {mean:.0} (±10 %)"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
