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

mod common;

use common::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Three daemons on one cluster, each with `rules`, `fallback.hosts = "auto"`.
struct Setup {
    daemons: Vec<Daemon>,
    cluster: RedisCluster,
}

impl Setup {
    fn start(rules: &str) -> Setup {
        let cluster = RedisCluster::start();
        let config = format!(
            "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 150\nprefix = \"rl\"\n\n[fallback]\nhosts = \"auto\"\n\n{rules}",
            toml_str_array(&cluster.addrs())
        );
        let daemons: Vec<Daemon> = (0..3).map(|_| Daemon::start(&config)).collect();
        // Every daemon's heartbeat has counted the three (HEARTBEAT_EVERY = 1 s).
        thread::sleep(Duration::from_millis(2500));
        Setup { daemons, cluster }
    }

    /// EVALSHA calls so far, summed over the primaries.
    fn script_calls(&self) -> u64 {
        self.cluster
            .primary_addrs()
            .iter()
            .map(|a| {
                let info = redis_text(a, &["INFO", "commandstats"]).unwrap_or_default();
                info.lines()
                    .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                    .and_then(|r| r.split(',').next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    }
}

/// Decisions one load thread saw: (verdict, source) → count.
#[derive(Debug, Default, Clone)]
struct Tally(HashMap<(bool, String), u64>);

impl Tally {
    fn add(&mut self, other: &Tally) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_default() += v;
        }
    }
    fn allowed(&self) -> u64 {
        self.0.iter().filter(|(k, _)| k.0).map(|(_, v)| v).sum()
    }
    fn total(&self) -> u64 {
        self.0.values().sum()
    }
    fn by_source(&self, allowed: bool, source: &str) -> u64 {
        self.0
            .get(&(allowed, source.to_string()))
            .copied()
            .unwrap_or(0)
    }
}

/// Load on one daemon: `clients` threads, each sending `batch` CHECKs of `line` per
/// round, one round every `every` (zero: back to back), until `stop`. Returns each
/// thread's tally with the instants of its first send and last reply.
fn load(
    socket: &std::path::Path,
    line: &str,
    clients: usize,
    batch: usize,
    every: Duration,
    stop: &Arc<AtomicBool>,
) -> Vec<thread::JoinHandle<Tally>> {
    (0..clients)
        .map(|_| {
            let socket = socket.to_path_buf();
            let lines: Vec<String> = vec![line.to_string(); batch];
            let stop = Arc::clone(stop);
            thread::spawn(move || {
                let mut c = Client::connect(&socket);
                c.set_read_timeout(Duration::from_secs(10));
                let mut tally = Tally::default();
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    for r in c.pipeline(&lines) {
                        let r = parse_reply(&r);
                        *tally.0.entry((r.allowed(), r.source)).or_default() += 1;
                    }
                    if !every.is_zero() {
                        next += every;
                        if let Some(d) = next.checked_duration_since(Instant::now()) {
                            thread::sleep(d);
                        }
                    }
                }
                tally
            })
        })
        .collect()
}

fn join(handles: Vec<thread::JoinHandle<Tally>>) -> Tally {
    let mut t = Tally::default();
    for h in handles {
        t.add(&h.join().expect("load thread"));
    }
    t
}

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
        .map(|d| load(&d.socket, "CHECK drain hot", 3, 50, Duration::ZERO, &stop))
        .collect();
    thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    let per_host: Vec<Tally> = handles.into_iter().map(join).collect();
    let elapsed = started.elapsed().as_secs_f64();
    let calls = s.script_calls() - calls_before;
    let mut all = Tally::default();
    per_host.iter().for_each(|t| all.add(t));
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
