//! A saturated key is shared fairly: ten daemons asking equally for a bucket far below
//! their demand each admit within ±10 % of the mean share (each holds a slice: an equal
//! part of the capacity and of the refill rate), and together at most `capacity +
//! refill_rate × T` and at least 90 % of it.

use super::common::*;
use super::harness::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const RULE: &str = r#"
[[rule]]
name = "fair"
algorithm = "token_bucket"
capacity = 300
refill_rate = 200.0
lease = "auto"
"#;
const CAPACITY: f64 = 300.0;
const RATE: f64 = 200.0;
const HOSTS: usize = 10;

/// Ten daemons, each with one client sending 5 CHECKs every 10 ms (500/s; 5,000/s in
/// all, 25× the refill). Shares are compared after a warm-up of 4 s (two slice
/// lifetimes: the first hosts to ask hold larger slices until they renew), over 6 s.
#[test]
fn ten_daemons_asking_equally_get_equal_shares() {
    let s = Setup::start_n(HOSTS, RedisCluster::start, RULE);
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Phase::default();
    let started = Instant::now();
    let handles: Vec<_> = s
        .daemons
        .iter()
        .map(|d| {
            let every = Duration::from_millis(10);
            load(&d.socket, "CHECK fair hot", 1, 5, every, &stop, &phase)
        })
        .collect();
    thread::sleep(Duration::from_secs(4));
    phase.store(1, Ordering::Relaxed);
    let measured = Instant::now();
    thread::sleep(Duration::from_secs(6));
    phase.store(2, Ordering::Relaxed);
    let window = measured.elapsed().as_secs_f64();
    let (per_host, all) = stop_and_join(&stop, handles);
    let t = started.elapsed().as_secs_f64();
    let bound = CAPACITY + RATE * t;
    let shares: Vec<u64> = per_host.iter().map(|h| h.allowed_in(1)).collect();
    let mean = shares.iter().sum::<u64>() as f64 / HOSTS as f64;
    println!(
        "fairness: {} ALLOW in {t:.2} s (bound {bound:.0}, {:.1} %); over {window:.2} s after the warm-up, per host {shares:?} (mean {mean:.1}, refill over it {:.0})",
        all.allowed(),
        100.0 * all.allowed() as f64 / bound,
        RATE * window
    );
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
    assert!(all.allowed() as f64 >= 0.9 * bound, "under-used: {all:?}");
    for share in &shares {
        assert!(
            (*share as f64 - mean).abs() <= 0.10 * mean,
            "unfair shares {shares:?} (mean {mean:.1})"
        );
    }
}
