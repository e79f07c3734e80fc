//! A give-back that cannot be sent: the key's primary frozen (SIGSTOP) past
//! `redis.timeout_ms`, its breaker open, while the key is idle and the sweep would give
//! its lease back. Before grants were remembered, the sweep forgot the grant it could
//! not give back, the key's next call after the thaw named none, and Redis returned the
//! stored grant whole, units the holder had spent included. Now the grant is kept and
//! named after the thaw with its unspent units: nothing above the bucket. With that old
//! rule put back (the sweep forgetting the grant it could not send, Redis returning a
//! stored grant named as none whole), this test admitted 20,137 of a bucket of 20,000.

use super::common::*;
use super::harness::*;
use super::migration::owner_of;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const RULES: &str = r#"
[[rule]]
name = "idle"
algorithm = "token_bucket"
capacity = 20000
refill_rate = 0.001
lease = "auto"
on_redis_failure = "deny"

[[rule]]
name = "busy"
algorithm = "token_bucket"
capacity = 1000000
refill_rate = 0.001
lease = "auto"
on_redis_failure = "deny"
"#;
const CAPACITY: f64 = 20000.0;
const RATE: f64 = 0.001;

fn slot(cluster: &RedisCluster, key: &str) -> u16 {
    cluster
        .cli(&cluster.primary_addrs()[0], &["CLUSTER", "KEYSLOT", key])
        .parse()
        .expect("slot")
}

/// Three daemons drain `idle:a`; the drain stops (each daemon keeps its lease, idle: the
/// sweep gives it back 200 ms on) and its primary is frozen, while busy keys of the same
/// primary keep failing on every daemon until its breaker opens (timeout 50 ms), so the
/// give-back is never sent; thawed 250 ms later; 50 ms on the drain resumes, before the
/// leases' deadlines in Redis.
/// With `on_redis_failure = "deny"`, only Redis and leases admit: at most capacity +
/// refill × T, and at least 90 % of it.
#[test]
fn a_give_back_the_outage_prevented_admits_no_more_than_the_bucket() {
    let s = Setup::start_n(3, || RedisCluster::start_with_node_timeout(15_000), RULES);
    // `Setup` has timeout_ms = 150; this test needs its daemons' breakers to open within
    // the idle spell: started again with 50 ms.
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 50\nprefix = \"rl\"\n\n[fallback]\nhosts = \"auto\"\n\n{RULES}",
        toml_str_array(&s.cluster.addrs())
    );
    let daemons: Vec<Daemon> = (0..3).map(|_| Daemon::start(&config)).collect();
    thread::sleep(Duration::from_millis(2500));
    let primary = owner_of(&s.cluster, slot(&s.cluster, "rl:{idle:a}:tb"));
    let busy: Vec<String> = (0..400)
        .map(|i| format!("b{i}"))
        .filter(|k| {
            let key = format!("rl:{{busy:{k}}}:tb");
            owner_of(&s.cluster, slot(&s.cluster, &key)).0 == primary.0
        })
        .take(6)
        .collect();
    assert!(busy.len() >= 3, "no keys of busy on the primary of idle:a");
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Phase::default();
    let drain = |stop: &Arc<AtomicBool>| -> Vec<thread::JoinHandle<Tally>> {
        daemons
            .iter()
            .flat_map(|d| {
                let every = Duration::from_millis(10);
                load(&d.socket, "CHECK idle a", 2, 10, every, stop, &phase)
            })
            .collect()
    };
    let started = Instant::now();
    let first = drain(&stop);
    thread::sleep(Duration::from_millis(700));
    let stop_busy = Arc::new(AtomicBool::new(false));
    let busy_load: Vec<_> = daemons
        .iter()
        .flat_map(|d| {
            busy.iter().flat_map(|k| {
                let line = format!("CHECK busy {k}");
                let every = Duration::from_millis(5);
                load(&d.socket, &line, 1, 5, every, &stop_busy, &phase)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(100));
    // The drain stops: its last calls answered, each daemon holds its lease, idle.
    stop.store(true, Ordering::Relaxed);
    let mut all = join(first);
    thread::sleep(Duration::from_millis(30));
    let out = leases_out(&s.cluster, "idle:a");
    s.cluster.signal_node(&primary.0, libc::SIGSTOP);
    phase.store(1, Ordering::Relaxed);
    thread::sleep(Duration::from_millis(250));
    s.cluster.signal_node(&primary.0, libc::SIGCONT);
    stop_busy.store(true, Ordering::Relaxed);
    join(busy_load);
    // The drain resumes (the breakers close within a probe interval, 200 ms), its first
    // calls before the leases' deadlines in Redis (1 s after their grant).
    thread::sleep(Duration::from_millis(50));
    phase.store(2, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let second = drain(&stop);
    thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    all.add(&join(second));
    let t = started.elapsed().as_secs_f64();
    let bound = CAPACITY + RATE * t;
    let opened = daemons.iter().filter(|d| d.log().contains("open")).count();
    println!(
        "give-back prevented by an outage: {out} leases out at the freeze; {} ALLOW before, {} after the thaw; {} in {t:.2} s (bound {bound:.0}, {:.1} %); {opened} daemon(s) logged a breaker opening",
        all.allowed_in(0),
        all.allowed_in(2),
        all.allowed(),
        100.0 * all.allowed() as f64 / bound
    );
    assert!(out > 0, "no lease out at the freeze: {all:?}");
    assert!(
        opened > 0,
        "no breaker opened: the give-back was not prevented"
    );
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
    assert!(all.allowed() as f64 >= 0.9 * bound, "under-used: {all:?}");
}
