//! Reloads of a leased sliding window counter while window slices are out
//! (docs/DESIGN.md "Leases", "Reloads and leases"): what a slice may spend stays
//! counted until it ends, whatever the rule in force now says about its window.
//!
//! * Leases turned off on two daemons of three (a fleet reloaded one daemon at a time
//!   stays like that until the last reload): the per-request script decides beside the
//!   third daemon's slices, which it cannot read one by one.
//! * The window shortened (2 s → 1 s) on two daemons 0.4 s into a 2 s window, on the
//!   third 1.9 s into it, after it spent its slice of the old window past the new
//!   window's end. A run where that daemon held no slice (its calls with the old window
//!   then roll the key's counts to the old windows, as a per-request daemon of the old
//!   rule's would: two rules at once, which nothing bounds) is run again.
//!
//! The bound is the rule's own, from the ALLOWs the load threads saw: for windows n − 1
//! and n of the rule in force, at the end of every 50 ms of window n, `ALLOWs(n − 1) ×
//! (1 − elapsed ÷ window) + ALLOWs(n so far) ≤ limit` (the estimate one client deciding
//! every request in Redis keeps at or under the limit at each admission, the weight then
//! being at least that). Counts are of the pipelined batches sent and read inside one
//! 50 ms bucket (by the host's clock, Redis's on loopback): at most what was admitted,
//! so the bound never fails on a batch's timing. Each whole window once the old leases
//! have ended must admit at least 90 % of the limit (batches sent and read inside it).

use super::common::*;
use super::harness::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const LIMIT: u64 = 600;
/// The buckets ALLOWs are counted in, ms.
const BUCKET_MS: u64 = 50;

fn rule(window: &str, lease: &str) -> String {
    format!(
        "[[rule]]\nname = \"swc\"\nalgorithm = \"sliding_window_counter\"\nlimit = {LIMIT}\nwindow = \"{window}\"\nlease = \"{lease}\"\n"
    )
}

/// The windows of the rule in force after the reloads, ms.
const WINDOW_MS: u64 = 1000;

/// ALLOWs per epoch-aligned bucket of [`BUCKET_MS`] and per window of [`WINDOW_MS`] of
/// the batches sent and read in it, and every ALLOW.
#[derive(Debug, Default)]
struct Buckets {
    inside: HashMap<u64, u64>,
    windows: HashMap<u64, u64>,
    all: u64,
    /// ALLOWs by source.
    sources: HashMap<String, u64>,
}

fn record(b: &mut Buckets, replies: &[String], (sent, read): (u64, u64)) {
    let (sent, read) = (sent / 1000, read / 1000);
    let mut allowed = 0;
    for r in replies
        .iter()
        .map(|r| parse_reply(r))
        .filter(|r| r.allowed())
    {
        allowed += 1;
        *b.sources.entry(r.source).or_default() += 1;
    }
    b.all += allowed;
    if sent / BUCKET_MS == read / BUCKET_MS {
        *b.inside.entry(sent / BUCKET_MS).or_default() += allowed;
    }
    if sent / WINDOW_MS == read / WINDOW_MS {
        *b.windows.entry(sent / WINDOW_MS).or_default() += allowed;
    }
}

/// Two clients per daemon, a batch of five each every ms, until `stop`.
fn start_load(s: &Setup, stop: &Arc<AtomicBool>) -> Vec<Vec<thread::JoinHandle<Buckets>>> {
    s.daemons
        .iter()
        .map(|d| {
            let every = Duration::from_millis(1);
            load_with(&d.socket, "CHECK swc hot", 2, 5, every, stop, record)
        })
        .collect()
}

/// Stops the load; each daemon's buckets summed over its threads.
fn stop_load(stop: &AtomicBool, handles: Vec<Vec<thread::JoinHandle<Buckets>>>) -> Vec<Buckets> {
    stop.store(true, Ordering::Relaxed);
    handles
        .into_iter()
        .map(|threads| {
            let mut host = Buckets::default();
            for h in threads {
                let b = h.join().expect("load thread");
                host.all += b.all;
                for (k, a) in b.sources {
                    *host.sources.entry(k).or_default() += a;
                }
                for (k, a) in b.inside {
                    *host.inside.entry(k).or_default() += a;
                }
                for (k, a) in b.windows {
                    *host.windows.entry(k).or_default() += a;
                }
            }
            host
        })
        .collect()
}

/// The bound of the module's doc on windows `from..to` (window n − 1 of the first one
/// is weighed as its previous), and at least 90 % of the limit in each window from
/// `floor_from` on (counted by the batches sent and read inside it). Returns the
/// failures.
fn check(hosts: &[Buckets], from: u64, to: u64, floor_from: u64) -> Vec<String> {
    check_in(hosts, WINDOW_MS, from, to, floor_from)
}

fn check_in(hosts: &[Buckets], window_ms: u64, from: u64, to: u64, floor_from: u64) -> Vec<String> {
    let per_window = window_ms / BUCKET_MS;
    let bucket = |k: u64| -> u64 {
        hosts
            .iter()
            .map(|h| h.inside.get(&k).copied().unwrap_or(0))
            .sum()
    };
    let window = |n: u64| -> u64 { (n * per_window..(n + 1) * per_window).map(bucket).sum() };
    let mut failures = Vec::new();
    for n in from..to {
        let previous = window(n - 1);
        let mut so_far = 0;
        let mut worst = 0.0f64;
        for f in 0..per_window {
            so_far += bucket(n * per_window + f);
            let weight = 1.0 - (f + 1) as f64 / per_window as f64;
            worst = worst.max(previous as f64 * weight + so_far as f64);
        }
        let per_host: Vec<u64> = hosts
            .iter()
            .map(|h| h.windows.get(&n).copied().unwrap_or(0))
            .collect();
        let used: u64 = per_host.iter().sum();
        println!(
            "window {n}: {used} ALLOW (per host {per_host:?}); by 50 ms, {so_far} after {previous}: estimate at least {worst:.0} of {LIMIT}"
        );
        if worst > LIMIT as f64 {
            failures.push(format!(
                "window {n}: estimate {worst:.0} > {LIMIT} ({previous} then {so_far})"
            ));
        }
        if n >= floor_from && used * 10 < LIMIT * 9 {
            failures.push(format!("window {n}: {used} < 90 % of {LIMIT}"));
        }
    }
    failures
}

/// Sleeps until the epoch ms `at`.
fn sleep_until(at: u64) {
    let now = epoch_ms();
    if at > now {
        thread::sleep(Duration::from_millis(at - now));
    }
}

/// Two daemons with `lease = "off"`, one with `lease = "auto"`, on one key: the leased
/// daemon's slices accrue what the per-request script also hands out, unless that
/// script counts them.
#[test]
fn plain_daemons_beside_a_leased_one_stay_within_the_sliding_window() {
    let s = Setup::start(&rule("1s", "auto"));
    s.reload(0, &rule("1s", "off"));
    s.reload(1, &rule("1s", "off"));
    thread::sleep(Duration::from_millis(300));
    let stop = Arc::new(AtomicBool::new(false));
    let first = epoch_ms() / 1000;
    let handles = start_load(&s, &stop);
    thread::sleep(Duration::from_millis(5500));
    // The last window the load ran through to its end is the one before.
    let last = epoch_ms() / 1000;
    let hosts = stop_load(&stop, handles);
    let all: Vec<_> = hosts.iter().map(|h| (h.all, &h.sources)).collect();
    println!("ALLOW per host over the run, by source: {all:?}");
    // Whole windows after a whole one: its previous window is whole too.
    let failures = check(&hosts, first + 2, last, first + 2);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The key's hash (`HGETALL` on the primary that holds it).
fn key_fields(s: &Setup) -> HashMap<String, String> {
    let key = "rl:{swc:hot}:swc";
    let mut fields = HashMap::new();
    for a in s.cluster.primary_addrs() {
        if let Some(all) = redis_command(&a, &["HGETALL", key])
            .ok()
            .and_then(|r| r.into_strings().ok())
        {
            for pair in all.chunks(2) {
                fields.insert(pair[0].clone(), pair[1].clone());
            }
        }
    }
    fields
}

/// The leases stored: (grant, deadline µs).
fn leases(fields: &HashMap<String, String>) -> Vec<(u64, u64)> {
    fields
        .iter()
        .filter(|(f, _)| f.starts_with("l:"))
        .map(|(_, v)| {
            let n: Vec<u64> = v.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
            (n[2], n[1])
        })
        .collect()
}

/// One run of the shortened window: `None` when the late daemon made a call between
/// 0.95 s and 1.85 s into the old window (it had no slice: its calls with the old window
/// then roll the key's counts to the old windows, as a per-request daemon with the old
/// rule does: a fleet of two rules, which nothing here bounds).
fn shortened_once() -> Option<Vec<String>> {
    let s = Setup::start(&rule("2s", "auto"));
    let stop = Arc::new(AtomicBool::new(false));
    let handles = start_load(&s, &stop);
    // A 2 s window after two whole ones under load.
    let start = (epoch_ms() / 2000 + 3) * 2000;
    sleep_until(start + 400);
    s.reload(0, &rule("1s", "auto"));
    s.reload(1, &rule("1s", "auto"));
    sleep_until(start + 950);
    let last_grant: u64 = key_fields(&s)
        .get("n")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    sleep_until(start + 1850);
    // The late daemon's slice, taken before 0.95 s, still stored: no call of its since.
    let held = leases(&key_fields(&s))
        .iter()
        .any(|&(g, d)| g <= last_grant && d >= (start + 1900) * 1000);
    s.reload(2, &rule("1s", "auto"));
    sleep_until(start + 6000);
    let hosts = stop_load(&stop, handles);
    let all: Vec<_> = hosts.iter().map(|h| (h.all, &h.sources)).collect();
    println!("ALLOW per host over the run, by source: {all:?}; the late slice held: {held}");
    let n = start / 1000;
    let failures = check(&hosts, n + 1, n + 6, n + 3);
    held.then_some(failures)
}

/// The window shortened from 2 s to 1 s: two daemons reload 0.4 s into a 2 s window,
/// the third 1.9 s into it, having spent its slice of the old window until then.
#[test]
fn a_window_shortened_under_a_slice_stays_within_the_new_window() {
    for _ in 0..3 {
        if let Some(failures) = shortened_once() {
            assert!(failures.is_empty(), "{failures:#?}");
            return;
        }
    }
    panic!("the late daemon held no slice through three runs");
}
