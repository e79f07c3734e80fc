//! A promoted replica that missed the last grant (asynchronous replication): simulated
//! exactly by putting back, atomically, the key's hash as it was just before a grant,
//! as a replica lagging by that grant would hold it. The holder of the lost grant spends
//! it while the key no longer counts it: over-admitted at most that lease (its cap and
//! its refill over its lifetime), N = 1 per holder per key (docs/DESIGN.md "Leases"),
//! plus what Redis itself decided in the lag, as on the per-request path.

use super::common::*;
use super::harness::*;
use super::migration::owner_of;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const RULE: &str = r#"
[[rule]]
name = "lag"
algorithm = "token_bucket"
capacity = 300
refill_rate = 200.0
lease = "auto"
"#;
const CAPACITY: f64 = 300.0;
const RATE: f64 = 200.0;
const KEY: &str = "rl:{lag:hot}:tb";
/// A slice's lifetime, s (`lease::SLICE_LIFETIME_US`).
const SLICE_S: f64 = 2.0;

/// The key's hash on `addr`, as field/value pairs.
fn hash(addr: &str) -> Vec<String> {
    redis_command(addr, &["HGETALL", KEY])
        .and_then(Resp::into_strings)
        .expect("HGETALL")
}

/// Grants stored in `pairs` (`l:<holder>` fields): (grant number, tokens it may admit
/// in its lifetime: its cap, or its units, plus a slice's refill over `SLICE_S`).
fn grants(pairs: &[String]) -> Vec<(u64, f64)> {
    pairs
        .chunks(2)
        .filter(|p| p[0].starts_with("l:"))
        .map(|p| {
            let f: Vec<f64> = p[1].split(' ').filter_map(|v| v.parse().ok()).collect();
            let (cap, rate) = match f.as_slice() {
                [_, _, _, cap, rate] => (*cap, *rate),
                [units, _, _] => (*units, 0.0),
                _ => panic!("a lease field {p:?}"),
            };
            (f[2] as u64, cap / 1e6 + rate / 1e6 * SLICE_S)
        })
        .collect()
}

/// Three daemons saturate a leased bucket; 3 s in, the key's hash is read, and as soon
/// as a grant has been made after that read, the read state is put back (the grant
/// lost, as a replica promoted before it replicated would lose it). Over the run: at most
/// `capacity + refill_rate × T` plus what the lost grants can admit plus the refill over
/// the lag; at least 90 % of the rule.
#[test]
fn a_promoted_replica_that_missed_the_last_grant_over_admits_at_most_that_lease() {
    let s = Setup::start(RULE);
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Phase::default();
    let started = Instant::now();
    let handles: Vec<_> = s
        .daemons
        .iter()
        .map(|d| {
            let every = Duration::from_millis(20);
            load(&d.socket, "CHECK lag hot", 3, 9, every, &stop, &phase)
        })
        .collect();
    thread::sleep(Duration::from_secs(3));
    let slot: u16 = s
        .cluster
        .cli(&s.cluster.primary_addrs()[0], &["CLUSTER", "KEYSLOT", KEY])
        .parse()
        .expect("slot");
    let (primary, _) = owner_of(&s.cluster, slot);
    // The state before the next grant, then the grant(s) the "replica" misses.
    let before = hash(&primary);
    let n = |pairs: &[String]| -> u64 {
        pairs
            .chunks(2)
            .find(|p| p[0] == "n")
            .and_then(|p| p[1].parse().ok())
            .unwrap_or(0)
    };
    let snapshot_at = Instant::now();
    let mut after = before.clone();
    while n(&after) == n(&before) && snapshot_at.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(2));
        after = hash(&primary);
    }
    let mut restore = vec![
        "EVAL",
        "redis.call('DEL', KEYS[1]) redis.call('HSET', KEYS[1], unpack(ARGV)) redis.call('PEXPIRE', KEYS[1], 60000) return 1",
        "1",
        KEY,
    ];
    restore.extend(before.iter().map(String::as_str));
    let restored = s.cluster.cli(&primary, &restore);
    let lag = snapshot_at.elapsed().as_secs_f64();
    // Every grant made in the lag, at most what it can admit.
    let missed: Vec<(u64, f64)> = grants(&after)
        .into_iter()
        .filter(|(g, _)| *g > n(&before))
        .collect();
    let allowance: f64 = missed.iter().map(|(_, u)| u).sum::<f64>() + RATE * lag;
    thread::sleep(Duration::from_secs(4));
    let (_, all) = stop_and_join(&stop, handles);
    let t = started.elapsed().as_secs_f64();
    let rule = CAPACITY + RATE * t;
    println!(
        "replica missing the last grant: restored ({restored}) the state of {lag:.3} s before, missing grants {missed:?}; {} ALLOW in {t:.2} s (rule {rule:.0}, + at most {allowance:.0} for the missed grants and the lag)",
        all.allowed()
    );
    assert_eq!(restored, "1", "restore");
    assert!(!missed.is_empty(), "no grant in the lag");
    assert!(
        missed.len() <= 3,
        "more than one grant per holder missed: {missed:?}"
    );
    assert!(
        all.allowed() as f64 <= rule + allowance,
        "over-admitted beyond the missed lease: {all:?}"
    );
    assert!(all.allowed() as f64 >= 0.9 * rule, "under-used: {all:?}");
}
