//! The harness of the lease tests: three daemons on one cluster, the load threads and
//! their tallies, Redis's own count of script calls.

use super::common::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Three daemons on one cluster, each with `rules`, `fallback.hosts = "auto"`. One at a
/// time: each test loads the machine (and measures utilisation).
pub struct Setup {
    pub daemons: Vec<Daemon>,
    pub cluster: RedisCluster,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

use crate::ONE_AT_A_TIME;

impl Setup {
    pub fn start(rules: &str) -> Setup {
        Self::start_with(RedisCluster::start, rules)
    }

    pub fn start_with(cluster: impl FnOnce() -> RedisCluster, rules: &str) -> Setup {
        Self::start_n(3, cluster, rules)
    }

    /// `daemons` daemons on the cluster `cluster()` starts, each with `rules`.
    pub fn start_n(daemons: usize, cluster: impl FnOnce() -> RedisCluster, rules: &str) -> Setup {
        let one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let cluster = cluster();
        let config = config_of(&cluster, rules);
        let daemons: Vec<Daemon> = (0..daemons).map(|_| Daemon::start(&config)).collect();
        // Every daemon's heartbeat has counted the others (HEARTBEAT_EVERY = 1 s).
        thread::sleep(Duration::from_millis(2500));
        Setup {
            daemons,
            cluster,
            _one_at_a_time: one_at_a_time,
        }
    }

    /// Daemon `i` reloads (SIGHUP) with `rules` in place of its own.
    pub fn reload(&self, i: usize, rules: &str) {
        self.daemons[i].write_config(&config_of(&self.cluster, rules));
        self.daemons[i].signal(libc::SIGHUP);
    }

    /// EVALSHA calls so far, summed over the primaries.
    pub fn script_calls(&self) -> u64 {
        self.cluster
            .primary_addrs()
            .iter()
            .map(|a| evalsha_calls(a))
            .sum()
    }
}

/// A daemon's config on `cluster` with `rules`.
fn config_of(cluster: &RedisCluster, rules: &str) -> String {
    format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 150\nprefix = \"rl\"\n\n[fallback]\nhosts = \"auto\"\n\n{rules}",
        toml_str_array(&cluster.addrs())
    )
}

/// Decisions load threads saw: (phase, verdict, source) → count. The phase is what the
/// test set in [`Phase`] when the reply was read.
#[derive(Debug, Default, Clone)]
pub struct Tally(pub HashMap<(u8, bool, String), u64>);

/// The test's current phase (before a fault, during it, after it).
pub type Phase = Arc<AtomicU8>;

impl Tally {
    pub fn add(&mut self, other: &Tally) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_default() += v;
        }
    }
    pub fn allowed(&self) -> u64 {
        self.0.iter().filter(|(k, _)| k.1).map(|(_, v)| v).sum()
    }
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
    /// ALLOWs in `phase`.
    pub fn allowed_in(&self, phase: u8) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.0 == phase && k.1)
            .map(|(_, v)| v)
            .sum()
    }
    /// Decisions in `phase` from `source` (`allowed`: ALLOWs only).
    pub fn from(&self, phase: u8, source: &str, allowed: bool) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.0 == phase && k.2 == source && (k.1 || !allowed))
            .map(|(_, v)| v)
            .sum()
    }
}

/// Load on one daemon: `clients` threads, each sending `batch` CHECKs of `line` per
/// round, one round every `every` (zero: back to back), until `stop`. Returns each
/// thread's tally with the instants of its first send and last reply.
pub fn load(
    socket: &std::path::Path,
    line: &str,
    clients: usize,
    batch: usize,
    every: Duration,
    stop: &Arc<AtomicBool>,
    phase: &Phase,
) -> Vec<thread::JoinHandle<Tally>> {
    let phase = Arc::clone(phase);
    load_with(
        socket,
        line,
        clients,
        batch,
        every,
        stop,
        move |tally: &mut Tally, replies, _| {
            for r in replies {
                let r = parse_reply(r);
                let p = phase.load(Ordering::Relaxed);
                *tally.0.entry((p, r.allowed(), r.source)).or_default() += 1;
            }
        },
    )
}

/// The load loop of [`load`]: each thread folds each round's replies, with the epoch µs
/// at which the round was sent and read, into its own `T` with `record`. The threads'
/// rounds are staggered evenly over `every` (thread *i* starts `every × i ÷ clients`
/// late), so that the daemon is asked about every `every ÷ clients`, not `clients`
/// rounds at once every `every`: a bucket that fills in a few `every` then overflows
/// only when several threads are late together.
pub fn load_with<T: Default + Send + 'static>(
    socket: &std::path::Path,
    line: &str,
    clients: usize,
    batch: usize,
    every: Duration,
    stop: &Arc<AtomicBool>,
    record: impl Fn(&mut T, &[String], (u64, u64)) + Clone + Send + 'static,
) -> Vec<thread::JoinHandle<T>> {
    (0..clients)
        .map(|i| {
            let socket = socket.to_path_buf();
            let lines: Vec<String> = vec![line.to_string(); batch];
            let offset = every * i as u32 / clients as u32;
            let stop = Arc::clone(stop);
            let record = record.clone();
            thread::spawn(move || {
                let mut c = Client::connect(&socket);
                c.set_read_timeout(Duration::from_secs(10));
                let mut acc = T::default();
                let mut next = Instant::now() + offset;
                thread::sleep(offset);
                while !stop.load(Ordering::Relaxed) {
                    let sent = epoch_us();
                    let replies = c.pipeline(&lines);
                    record(&mut acc, &replies, (sent, epoch_us()));
                    if !every.is_zero() {
                        next += every;
                        if let Some(d) = next.checked_duration_since(Instant::now()) {
                            thread::sleep(d);
                        }
                    }
                }
                acc
            })
        })
        .collect()
}

pub fn join(handles: Vec<thread::JoinHandle<Tally>>) -> Tally {
    let mut t = Tally::default();
    for h in handles {
        t.add(&h.join().expect("load thread"));
    }
    t
}

/// Stops the load (`stop`), joins every host's threads (`handles`, one list per daemon)
/// and returns each host's tally and their sum.
pub fn stop_and_join(
    stop: &AtomicBool,
    handles: Vec<Vec<thread::JoinHandle<Tally>>>,
) -> (Vec<Tally>, Tally) {
    stop.store(true, Ordering::Relaxed);
    let per_host: Vec<Tally> = handles.into_iter().map(join).collect();
    let mut all = Tally::default();
    per_host.iter().for_each(|h| all.add(h));
    (per_host, all)
}

/// The lease fields (`l:<holder>`) on the key of `tag` under prefix `rl`.
pub fn leases_out(cluster: &RedisCluster, tag: &str) -> usize {
    let key = format!("rl:{{{tag}}}:tb");
    cluster
        .primary_addrs()
        .iter()
        .filter_map(|a| redis_command(a, &["HKEYS", &key]).ok())
        .filter_map(|r| r.into_strings().ok())
        .flatten()
        .filter(|f| f.starts_with("l:"))
        .count()
}

pub fn epoch_ms() -> u64 {
    epoch_us() / 1000
}

pub fn epoch_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

/// ALLOWs per fixed window of `window_ms` (aligned to the epoch), counted only for the
/// pipelined batches sent and read within one window, so they were decided in it; and
/// the ALLOWs of batches that straddled a boundary (decided in one of the two).
#[derive(Debug, Default)]
pub struct PerWindow {
    pub inside: HashMap<u64, u64>,
    pub straddling: u64,
    pub decisions: u64,
}

impl PerWindow {
    /// The `record` of [`load_with`] that tallies ALLOWs per window of `window_ms` by
    /// the wall clock around each pipelined batch.
    pub fn recorder(window_ms: u64) -> impl Fn(&mut PerWindow, &[String], (u64, u64)) + Clone {
        move |w: &mut PerWindow, replies: &[String], (sent, read): (u64, u64)| {
            let (sent, read) = (sent / 1000, read / 1000);
            let allowed = replies.iter().filter(|r| parse_reply(r).allowed()).count() as u64;
            w.decisions += replies.len() as u64;
            if sent / window_ms == read / window_ms {
                *w.inside.entry(sent / window_ms).or_default() += allowed;
            } else {
                w.straddling += allowed;
            }
        }
    }
}
