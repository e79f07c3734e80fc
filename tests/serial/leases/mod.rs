//! Token leases (`lease = "auto"`, docs/DESIGN.md "Leases") on a real 3-primary Redis
//! Cluster with 3 daemons: hosts share one exact budget with far fewer script calls than
//! decisions. Every bound is computed from the rule and the measured interval:
//! * a token bucket admits at most `capacity + refill_rate × T` over any interval T
//!   (zero over-admission), a window at most `limit` per window;
//! * script calls are counted by Redis itself (`INFO commandstats`, EVALSHA on every
//!   primary; the daemons' heartbeats and probes are counted too, which only makes the
//!   ratio look worse).
//!
//! The sixth promise (cold keys keep their latency) is a benchmark: `benches/leases.sh`.
//! The harness (daemons, load threads, tallies) is in `harness.rs`.

use crate::common;
mod clock_jump;
mod failover;
mod fairness;
mod faults;
mod harness;
mod migration;
mod outage;
mod overrides;
mod reload;
mod shapes;
mod stalled;
mod window_jump;
mod windows;

use common::*;
use harness::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const DRAIN: &str = r#"
[[rule]]
name = "drain"
algorithm = "token_bucket"
capacity = 20000
refill_rate = 1.0
lease = "auto"
"#;

/// Promise 1: 3 daemons × 3 pipelining clients drain a bucket of 20,000: no more than
/// capacity + refill over the run is admitted, with at most one script call per ten
/// decisions.
#[test]
fn drain_admits_no_more_than_the_bucket_with_a_tenth_of_the_calls() {
    let s = Setup::start(DRAIN);
    let calls_before = s.script_calls();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = s
        .daemons
        .iter()
        .map(|d| {
            let phase = Phase::default();
            load(
                &d.socket,
                "CHECK drain hot",
                3,
                50,
                Duration::ZERO,
                &stop,
                &phase,
            )
        })
        .collect();
    thread::sleep(Duration::from_secs(6));
    let (_, all) = stop_and_join(&stop, handles);
    let elapsed = started.elapsed().as_secs_f64();
    let calls = s.script_calls() - calls_before;
    let bound = 20_000.0 + 1.0 * elapsed;
    println!(
        "drain: {} ALLOW of {} decisions in {elapsed:.2} s (bound {bound:.0}); {calls} script calls; by source {:?}",
        all.allowed(),
        all.total(),
        all.0
    );
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
    assert!(
        all.allowed() >= 19_000,
        "the bucket was not drained: {all:?}"
    );
    assert!(
        calls * 10 <= all.total(),
        "{calls} script calls for {} decisions",
        all.total()
    );
}

/// A bucket far below its demand: 3 daemons × 3 clients ask 20× the refill rate.
const SATURATED: &str = r#"
[[rule]]
name = "sat"
algorithm = "token_bucket"
capacity = 300
refill_rate = 200.0
lease = "auto"
"#;
/// 1.5 s of refill: a host paced late by a loaded machine still finds its share there.
const SAT_CAPACITY: f64 = 300.0;
const SAT_RATE: f64 = 200.0;
/// One client's rounds: 9 CHECKs every 20 ms, 450/s; 9 clients ask 4,050/s ≈ 20× 200/s.
const SAT_BATCH: usize = 9;
const SAT_EVERY: Duration = Duration::from_millis(20);

/// Saturated load from `clients` clients per daemon of `daemons`.
fn saturate(
    daemons: &[&Daemon],
    stop: &Arc<AtomicBool>,
    phase: &Phase,
) -> Vec<Vec<thread::JoinHandle<Tally>>> {
    daemons
        .iter()
        .map(|d| {
            load(
                &d.socket,
                "CHECK sat hot",
                3,
                SAT_BATCH,
                SAT_EVERY,
                stop,
                phase,
            )
        })
        .collect()
}

/// Promise 2: demand 20× the refill for 20 s: at most capacity + rate × T admitted, at
/// least 95 % of it (utilisation), a tenth of the calls, each host within ±10 % of the
/// mean share.
#[test]
fn saturated_key_is_used_fully_and_shared_fairly() {
    let s = Setup::start(SATURATED);
    let calls_before = s.script_calls();
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Phase::default();
    let started = Instant::now();
    let handles = saturate(&s.daemons.iter().collect::<Vec<_>>(), &stop, &phase);
    thread::sleep(Duration::from_secs(20));
    let (per_host, all) = stop_and_join(&stop, handles);
    let t = started.elapsed().as_secs_f64();
    let calls = s.script_calls() - calls_before;
    let bound = SAT_CAPACITY + SAT_RATE * t;
    let shares: Vec<u64> = per_host.iter().map(Tally::allowed).collect();
    let mean = shares.iter().sum::<u64>() as f64 / 3.0;
    println!(
        "saturated: {} ALLOW of {} decisions in {t:.2} s (bound {bound:.0}, {:.1} %); {calls} script calls; per host {shares:?}",
        all.allowed(),
        all.total(),
        100.0 * all.allowed() as f64 / bound
    );
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
    assert!(
        all.allowed() as f64 >= 0.95 * bound,
        "utilisation below 95 %: {all:?}"
    );
    assert!(calls * 10 <= all.total(), "{calls} calls");
    for share in &shares {
        assert!(
            (*share as f64 - mean).abs() <= 0.10 * mean,
            "unfair shares {shares:?}"
        );
    }
}

/// Promise 3: a daemon killed (SIGKILL) while it holds a lease strands at most that
/// lease, until another daemon's clock has timed its lifetime (its witness: the
/// lifetime from when that daemon read the grant, within its 1.5 s renewal, ended at
/// its next call after that, 1.5 s later at most): the others' use of the key recovers
/// within that.
#[test]
fn killed_holder_strands_at_most_its_lease_until_a_witness_ends_it() {
    let mut s = Setup::start(SATURATED);
    let stop_victim = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Phase::default();
    let started = Instant::now();
    let mut victim = saturate(&[&s.daemons[0]], &stop_victim, &phase);
    let others = saturate(&[&s.daemons[1], &s.daemons[2]], &stop, &phase);
    thread::sleep(Duration::from_secs(4));
    stop_victim.store(true, Ordering::Relaxed);
    let victim = join(victim.remove(0));
    let out = leases_out(&s.cluster, "sat:hot");
    let d0 = s.daemons.remove(0);
    d0.signal(libc::SIGKILL);
    let killed = started.elapsed().as_secs_f64();
    drop(d0);
    phase.store(1, Ordering::Relaxed);
    // The slice's lifetime (2 s) from when another daemon read its grant (within
    // 1.5 s of it), then that daemon's next call (1.5 s).
    thread::sleep(Duration::from_millis(5000));
    phase.store(2, Ordering::Relaxed);
    let recovered = started.elapsed().as_secs_f64();
    thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    let mut all = victim.clone();
    others.into_iter().for_each(|h| all.add(&join(h)));
    let t = started.elapsed().as_secs_f64();
    let after = all.allowed_in(2) as f64;
    let expect = SAT_RATE * (t - recovered);
    let bound = SAT_CAPACITY + SAT_RATE * t;
    println!(
        "kill -9: {out} leases out at the kill ({killed:.2} s); after {recovered:.2} s the 2 others admitted {after} (refill over that time {expect:.0}, {:.1} %); total {} ≤ {bound:.0}",
        100.0 * after / expect,
        all.allowed()
    );
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
    assert!(after >= 0.9 * expect, "did not recover: {all:?}");
}

/// Promise 4: a holder stopped (SIGSTOP) past its lease's deadline and continued
/// spends nothing from that lease: the combined bound holds.
#[test]
fn stopped_holder_spends_nothing_after_its_deadline() {
    let s = Setup::start(SATURATED);
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Phase::default();
    let started = Instant::now();
    let handles = saturate(&s.daemons.iter().collect::<Vec<_>>(), &stop, &phase);
    thread::sleep(Duration::from_secs(3));
    let out = leases_out(&s.cluster, "sat:hot");
    s.daemons[0].signal(libc::SIGSTOP);
    phase.store(1, Ordering::Relaxed);
    // Past the lease's lifetime (1 s), within the clients' read timeout.
    thread::sleep(Duration::from_millis(2500));
    s.daemons[0].signal(libc::SIGCONT);
    phase.store(2, Ordering::Relaxed);
    thread::sleep(Duration::from_secs(3));
    let (per_host, all) = stop_and_join(&stop, handles);
    let t = started.elapsed().as_secs_f64();
    let bound = SAT_CAPACITY + SAT_RATE * t;
    println!(
        "SIGSTOP: {out} leases out at the stop; {} ALLOW in {t:.2} s (bound {bound:.0}); stopped host after SIGCONT: {} ALLOW ({} from its leases)",
        all.allowed(),
        per_host[0].allowed_in(2),
        per_host[0].from(2, "lease", true)
    );
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
}

/// Promise 5: every primary frozen (SIGSTOP) with leases out: answers continue, from the
/// leases and then from local rules; the combined bound of docs/FAILURES.md holds (the rule's, plus
/// one local share per host that decided locally).
#[test]
fn frozen_primaries_leave_leases_then_local_rules() {
    // Replicas must not take over during the freeze.
    let s = Setup::start_with(|| RedisCluster::start_with_node_timeout(15_000), SATURATED);
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Phase::default();
    let started = Instant::now();
    let handles = saturate(&s.daemons.iter().collect::<Vec<_>>(), &stop, &phase);
    thread::sleep(Duration::from_secs(3));
    let out = leases_out(&s.cluster, "sat:hot");
    let primaries = s.cluster.primary_addrs();
    for p in &primaries {
        s.cluster.signal_node(p, libc::SIGSTOP);
    }
    phase.store(1, Ordering::Relaxed);
    thread::sleep(Duration::from_secs(3));
    for p in &primaries {
        s.cluster.signal_node(p, libc::SIGCONT);
    }
    phase.store(2, Ordering::Relaxed);
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let mut all = Tally::default();
    handles.into_iter().for_each(|h| all.add(&join(h)));
    let t = started.elapsed().as_secs_f64();
    let rule = SAT_CAPACITY + SAT_RATE * t;
    // One local share per host: capacity ÷ 3 and refill ÷ 3, over the run.
    let bound = rule + 3.0 * (SAT_CAPACITY / 3.0 + SAT_RATE / 3.0 * t);
    println!(
        "freeze: {out} leases out at the freeze; during it {} decisions ({} lease, {} local ALLOW); total {} ALLOW in {t:.2} s (bound {bound:.0})",
        all.0.iter().filter(|(k, _)| k.0 == 1).map(|(_, v)| v).sum::<u64>(),
        all.from(1, "lease", false),
        all.from(1, "local", true),
        all.allowed()
    );
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
    assert!(all.from(1, "local", true) > 0, "no local answers: {all:?}");
    assert!(all.allowed_in(2) > 0, "no answers after the thaw: {all:?}");
}

const WINDOWS: &str = r#"
[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 1000
window = "1s"
lease = "auto"

[[rule]]
name = "swc"
algorithm = "sliding_window_counter"
limit = 1000
window = "1s"
lease = "auto"
"#;

/// Windows: a lease's units count in the window that granted them and are spent within
/// it, so no window admits above its limit. Each window's ALLOWs from batches sent and
/// answered inside it are at most `limit` (the batches that straddle a boundary are
/// counted apart: decided in one of the two windows); over the windows a run touches, at
/// most `limit` each in all; and busy windows are used (≥ 90 % over the run's whole
/// windows).
#[test]
fn window_leases_admit_at_most_the_limit_per_window() {
    let s = Setup::start(WINDOWS);
    for rule in ["fw", "swc"] {
        let calls_before = s.script_calls();
        let stop = Arc::new(AtomicBool::new(false));
        let first = epoch_ms();
        let handles: Vec<_> = s
            .daemons
            .iter()
            .flat_map(|d| {
                let line = format!("CHECK {rule} hot");
                load_with(
                    &d.socket,
                    &line,
                    3,
                    20,
                    Duration::ZERO,
                    &stop,
                    PerWindow::recorder(1000),
                )
            })
            .collect();
        thread::sleep(Duration::from_millis(4500));
        stop.store(true, Ordering::Relaxed);
        let mut all = PerWindow::default();
        for h in handles {
            let w = h.join().expect("load thread");
            for (window, n) in w.inside {
                *all.inside.entry(window).or_default() += n;
            }
            all.straddling += w.straddling;
            all.decisions += w.decisions;
        }
        let last = epoch_ms();
        let calls = s.script_calls() - calls_before;
        // Windows are aligned to the epoch on the Redis clock (this host's, on loopback).
        let touched = last / 1000 - first / 1000 + 1;
        let whole = (touched - 2) as f64;
        let allowed = all.inside.values().sum::<u64>() + all.straddling;
        let mut windows: Vec<_> = all.inside.iter().collect();
        windows.sort();
        println!(
            "{rule}: {allowed} ALLOW of {} decisions over {touched} windows (bound {}); per window {windows:?}, {} straddling; {calls} script calls",
            all.decisions,
            1000 * touched,
            all.straddling
        );
        for (window, n) in &windows {
            assert!(**n <= 1000, "{rule}: window {window} admitted {n} > 1000");
        }
        assert!(allowed <= 1000 * touched, "{rule} over-admitted: {all:?}");
        assert!(
            allowed as f64 >= 0.9 * 1000.0 * whole,
            "{rule} under-used: {all:?}"
        );
        assert!(calls * 10 <= all.decisions, "{rule}: {calls} calls");
    }
}
