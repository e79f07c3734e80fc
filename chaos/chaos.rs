//! The chaos suite (issue #4): a real 6-node Redis Cluster on loopback, one or more
//! real daemons, sustained load from several client threads over the Unix socket, and
//! one fault injected mid-run per scenario (kill, freeze, fail over, flush, OOM, killed
//! connections, slow Redis, N daemons in an outage).
//!
//! Every scenario asserts, on what the clients saw (client-side timestamps):
//! * every request got exactly one reply, none of them `ERR`, and the daemon never
//!   exited or restarted;
//! * during the fault, reply latency p99 ≤ `redis.timeout_ms` + 5 ms and max ≤ 250 ms;
//! * sources switch to `local` / `fail_open` / `fail_closed` as each rule says, and are
//!   back to `redis` within 1 s of Redis answering again (as the test itself observes:
//!   3 primaries, each with `cluster_state:ok`, each accepting a write);
//! * admitted counts stay within the contract's bounds: per key, what Redis admitted
//!   ≤ capacity + refill × time (one more capacity per data loss), and per daemon what a
//!   local bucket admitted ≤ (capacity + refill × time) ÷ hosts;
//! * the daemon logs each transition (`circuit open`, `circuit closed`) once per fault.
//!
//! Each scenario writes `<name>.json` and a `<name>.row` table line to
//! `$CHAOS_REPORT_DIR` (default `target/chaos`) before asserting; `chaos/run.sh` runs
//! them all (`--ignored`, release build, one at a time) and prints the table. The tests
//! are `#[ignore]`d so that `cargo test --all-targets` does not run them twice.
//! See chaos/README.md.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `redis.timeout_ms` of every daemon.
const TIMEOUT_MS: u64 = 25;
/// Bound on the p99 reply latency during a fault: `timeout_ms` + 5 ms.
const P99_BOUND: Duration = Duration::from_millis(TIMEOUT_MS + 5);
/// Bound on the slowest reply during a fault.
const MAX_BOUND: Duration = Duration::from_millis(250);
/// Decisions must be back on Redis this soon after Redis answers again.
const RECOVERY_BOUND: Duration = Duration::from_secs(1);
/// Latency is judged on replies sent from a fault's start until this long after
/// Redis answers again.
const FAULT_TAIL: Duration = Duration::from_secs(1);
/// Load before the first fault (all decisions must come from Redis).
const WARMUP: Duration = Duration::from_millis(1200);
/// Load after Redis answers again (room to see the return and that it lasts).
const AFTERMATH: Duration = Duration::from_millis(2000);
/// How long the test waits for Redis to answer again after a fault.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);
/// A load thread stops by itself after this long, whatever happens.
const LOAD_HARD_CAP: Duration = Duration::from_secs(60);
/// A reply slower than this counts as missing (the connection is then abandoned).
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// The rules: one per `on_redis_failure`, same bucket. Index = position in `RULES`.
const RULES: [(&str, &str); 3] = [
    ("chaos_local", "local"),
    ("chaos_open", "allow"),
    ("chaos_closed", "deny"),
];
/// Expected fallback source per rule (same index as `RULES`).
const FALLBACK_SOURCE: [&str; 3] = ["local", "fail_open", "fail_closed"];
const CAPACITY: f64 = 20.0;
const REFILL_RATE: f64 = 10.0;
/// Keys per rule (`k0`..): spread over the three primaries' slots.
const KEYS: u32 = 32;

// ---------------------------------------------------------------------------
// Load: client threads over the Unix socket
// ---------------------------------------------------------------------------

/// Index into [`SOURCES`] (`redis`, `cache`, `local`, `fail_open`, `fail_closed`).
const REDIS: usize = 0;
const CACHE: usize = 1;

#[derive(Debug, Clone)]
enum Outcome {
    /// A well-formed CHECK reply.
    Decision { allowed: bool, source: usize },
    /// An `ERR …` reply, or a line that is not a CHECK reply.
    Bad(String),
}

/// One request as a client saw it.
#[derive(Debug, Clone)]
struct Sample {
    daemon: usize,
    rule: usize,
    key: u32,
    /// When the request's batch was written, since the load started.
    sent: Duration,
    /// Until its reply line was read.
    latency: Duration,
    outcome: Outcome,
}

impl Sample {
    fn received(&self) -> Duration {
        self.sent + self.latency
    }
    fn source(&self) -> Option<usize> {
        match self.outcome {
            Outcome::Decision { source, .. } => Some(source),
            Outcome::Bad(_) => None,
        }
    }
    fn is_fallback(&self) -> bool {
        self.source().is_some_and(|s| s > CACHE)
    }
    fn allowed_by(&self, source: usize) -> bool {
        matches!(self.outcome, Outcome::Decision { allowed: true, source: s } if s == source)
    }
}

/// What one client thread did.
#[derive(Default)]
struct ThreadResult {
    samples: Vec<Sample>,
    /// Request lines written.
    requests: u64,
    /// Problems: a missing reply, a failed write, a wrong answer to the final PING.
    problems: Vec<String>,
}

/// Sustained load: `threads` clients per daemon, each writing a batch of 1–4 CHECKs
/// (random rule and key), reading the replies, pausing `pace`, until stopped.
struct Load {
    t0: Instant,
    /// The wall clock at `t0` (to place the daemon's log lines on the timeline).
    t0_wall: SystemTime,
    stop: Arc<AtomicBool>,
    handles: Vec<thread::JoinHandle<ThreadResult>>,
}

impl Load {
    fn start(sockets: &[PathBuf], threads: usize, pace: Duration) -> Load {
        let t0 = Instant::now();
        let t0_wall = SystemTime::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for (d, socket) in sockets.iter().enumerate() {
            for t in 0..threads {
                let socket = socket.clone();
                let stop = Arc::clone(&stop);
                let seed = 0x9E37_79B9_7F4A_7C15_u64 ^ (((d as u64) << 32) | (t as u64 + 1));
                handles.push(
                    thread::Builder::new()
                        .name(format!("load-d{d}-t{t}"))
                        .spawn(move || client_thread(&socket, d, seed, pace, t0, &stop))
                        .expect("spawning a load thread"),
                );
            }
        }
        Load {
            t0,
            t0_wall,
            stop,
            handles,
        }
    }

    /// Time since the load started.
    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    fn finish(self) -> (Vec<Sample>, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut samples = Vec::new();
        let mut requests = 0;
        let mut problems = Vec::new();
        for h in self.handles {
            match h.join() {
                Ok(r) => {
                    samples.extend(r.samples);
                    requests += r.requests;
                    problems.extend(r.problems);
                }
                Err(_) => problems.push("a load thread panicked".into()),
            }
        }
        samples.sort_by_key(|s| s.sent);
        (samples, requests, problems)
    }
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn client_thread(
    socket: &Path,
    daemon: usize,
    mut rng: u64,
    pace: Duration,
    t0: Instant,
    stop: &AtomicBool,
) -> ThreadResult {
    let mut out = ThreadResult::default();
    let stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) => {
            out.problems
                .push(format!("connecting to {}: {e}", socket.display()));
            return out;
        }
    };
    stream
        .set_read_timeout(Some(REPLY_TIMEOUT))
        .expect("timeout");
    stream
        .set_write_timeout(Some(REPLY_TIMEOUT))
        .expect("timeout");
    let mut writer = stream.try_clone().expect("cloning a UnixStream");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut batch = Vec::with_capacity(4);
    let mut buf = String::with_capacity(256);
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < LOAD_HARD_CAP {
        let n = 1 + (xorshift(&mut rng) % 4) as usize;
        batch.clear();
        buf.clear();
        for _ in 0..n {
            let r = xorshift(&mut rng);
            let (rule, key) = ((r % 3) as usize, ((r >> 8) % u64::from(KEYS)) as u32);
            let _ = writeln!(buf, "CHECK {} k{key}", RULES[rule].0);
            batch.push((rule, key));
        }
        let sent = Instant::now();
        if let Err(e) = writer.write_all(buf.as_bytes()) {
            out.problems.push(format!("writing a request: {e}"));
            return out;
        }
        out.requests += n as u64;
        for &(rule, key) in &batch {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => {
                    out.problems
                        .push("the daemon closed the connection (missing reply)".into());
                    return out;
                }
                Ok(_) => {}
                Err(e) => {
                    out.problems
                        .push(format!("no reply within {REPLY_TIMEOUT:?}: {e}"));
                    return out;
                }
            }
            let latency = sent.elapsed();
            let text = line.trim_end_matches('\n');
            let outcome = match try_parse_reply(text) {
                Some(r) if r.limit == CAPACITY as u64 => Outcome::Decision {
                    allowed: r.allowed(),
                    source: SOURCES.iter().position(|s| *s == r.source).unwrap_or(0),
                },
                _ => Outcome::Bad(text.to_string()),
            };
            out.samples.push(Sample {
                daemon,
                rule,
                key,
                sent: sent - t0,
                latency,
                outcome,
            });
        }
        thread::sleep(pace);
    }
    // Exactly one reply per request: nothing extra is waiting before this PONG.
    line.clear();
    let pong = writer
        .write_all(b"PING\n")
        .and_then(|()| reader.read_line(&mut line));
    if pong.is_err() || line != "PONG\n" {
        out.problems.push(format!(
            "final PING: expected PONG, got {line:?} ({pong:?})"
        ));
    }
    out
}

// ---------------------------------------------------------------------------
// Redis as the test sees it
// ---------------------------------------------------------------------------

/// True when Redis answers again as a whole: exactly three nodes say they are
/// primaries, each reports `cluster_state:ok` and accepts a write to a key of its own.
fn redis_answering(addrs: &[String]) -> bool {
    let masters: Vec<&String> = addrs
        .iter()
        .filter(|a| {
            redis_text(a, &["INFO", "replication"])
                .map(|i| i.contains("role:master\r"))
                .unwrap_or(false)
        })
        .collect();
    masters.len() == 3
        && masters.iter().all(|a| {
            redis_text(a, &["CLUSTER", "INFO"])
                .map(|i| i.contains("cluster_state:ok\r"))
                .unwrap_or(false)
                && accepts_write(a)
        })
}

/// True if the primary at `addr` accepts `SET chaos:{wN} 1` for some `N` whose slot
/// it owns (others answer MOVED); false on any other error (OOM, CLUSTERDOWN, …).
fn accepts_write(addr: &str) -> bool {
    for i in 0..128 {
        match redis_command(addr, &["SET", &format!("chaos:{{w{i}}}"), "1"]) {
            Ok(Resp::Simple(s)) if s == "OK" => return true,
            Ok(Resp::Error(e)) if e.starts_with("MOVED") => continue,
            _ => return false,
        }
    }
    false
}

// ---------------------------------------------------------------------------
// A scenario: cluster, daemons, load, fault episodes, checks, report
// ---------------------------------------------------------------------------

/// One fault: when it was injected and when Redis answered again (since load start).
#[derive(Debug, Clone)]
struct Episode {
    start: Duration,
    answering: Option<Duration>,
}

/// Whether fallback decisions must, may or must not appear.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fallback {
    /// Redis cannot decide: every rule's fallback source must show up in each fault.
    Required,
    /// Redis stays up (flushed scripts, killed connections): fallback may show up
    /// briefly, and must be over within 1 s.
    Allowed,
}

/// How many `circuit open` / `circuit closed` lines each daemon must log within each
/// fault's window (from its injection to 1 s after Redis answers again); none may be
/// logged outside the faults' windows.
#[derive(Debug, Clone, Copy)]
enum Transitions {
    /// Exactly one open and one close per fault.
    One,
    /// At most this many per fault window (a fault made of several drops), each open
    /// closed again within the window.
    AtMost(usize),
}

struct Scenario {
    name: &'static str,
    title: &'static str,
    cluster: RedisCluster,
    addrs: Vec<String>,
    daemons: Vec<Daemon>,
    hosts: u32,
    threads: usize,
    load: Option<Load>,
    episodes: Vec<Episode>,
    failures: Vec<String>,
    started: Instant,
    load_t0_wall: SystemTime,
}

fn daemon_config(addrs: &[String], hosts: u32) -> String {
    let mut c = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = {TIMEOUT_MS}\nprefix = \"rl\"\n\n\
         [cache]\nttl_ms = 500\n\n[fallback]\nhosts = {hosts}\n",
        toml_str_array(addrs)
    );
    for (name, on) in RULES {
        let _ = write!(
            c,
            "\n[[rule]]\nname = \"{name}\"\nalgorithm = \"token_bucket\"\n\
             capacity = {CAPACITY}\nrefill_rate = {REFILL_RATE:.1}\non_redis_failure = \"{on}\"\n"
        );
    }
    c
}

impl Scenario {
    /// A fresh cluster, `daemons` daemons (`fallback.hosts = hosts`) and `threads`
    /// load threads per daemon, already loading for [`WARMUP`].
    fn start(name: &'static str, title: &'static str, daemons: usize, hosts: u32) -> Scenario {
        let started = Instant::now();
        let cluster = RedisCluster::start();
        let addrs = cluster.addrs();
        let config = daemon_config(&addrs, hosts);
        // fred's warnings (reconnections, unresponsive connections) help read a failure.
        let log_filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info,fred=warn".into());
        let daemons: Vec<Daemon> = (0..daemons)
            .map(|_| Daemon::start_with(&daemon_bin(), &[("RUST_LOG", &log_filter)], &config))
            .collect();
        let threads = if daemons.len() == 1 { 4 } else { 2 };
        let sockets: Vec<PathBuf> = daemons.iter().map(|d| d.socket.clone()).collect();
        let load = Load::start(&sockets, threads, Duration::from_millis(3));
        let load_t0_wall = load.t0_wall;
        thread::sleep(WARMUP);
        Scenario {
            name,
            title,
            cluster,
            addrs,
            daemons,
            hosts,
            threads,
            load: Some(load),
            episodes: Vec::new(),
            failures: Vec::new(),
            started,
            load_t0_wall,
        }
    }

    fn now(&self) -> Duration {
        self.load.as_ref().expect("load running").now()
    }

    /// Marks the start of a fault (call right before injecting it).
    fn fault_begins(&mut self) {
        let start = self.now();
        self.episodes.push(Episode {
            start,
            answering: None,
        });
    }

    /// Polls until Redis answers again (see [`redis_answering`]) and marks the time
    /// on the current fault: when the successful check began (conservative for the
    /// recovery time).
    fn wait_redis_answers(&mut self) {
        let addrs = self.addrs.clone();
        let load_t0 = self.load.as_ref().expect("load running").t0;
        let mut began = Duration::ZERO;
        if wait_until(ANSWER_TIMEOUT, || {
            began = load_t0.elapsed();
            redis_answering(&addrs)
        }) {
            self.episodes.last_mut().expect("a fault").answering = Some(began);
        } else {
            self.failures.push(format!(
                "Redis did not answer again within {ANSWER_TIMEOUT:?} of the fault"
            ));
        }
    }

    /// Stops the load, checks everything, writes the report, and panics (naming the
    /// scenario) if a check failed.
    fn finish(mut self, fallback: Fallback, transitions: Transitions, data_losses: u32) {
        thread::sleep(AFTERMATH);
        let (samples, requests, problems) = self.load.take().expect("load").finish();
        // A circuit opened by a slow call near the end closes on the next probe: let it
        // be logged before reading the logs (the transition checks judge it).
        wait_until(Duration::from_millis(1500), || {
            self.daemons.iter().all(|d| {
                let log = d.log();
                log.matches("circuit open").count() == log.matches("circuit closed").count()
            })
        });
        let report = analyze(
            &mut self,
            &samples,
            requests,
            problems,
            fallback,
            transitions,
            data_losses,
        );
        write_report(self.name, &report);
        eprintln!("{}", report.row);
        if !self.failures.is_empty() {
            panic!(
                "chaos scenario {} failed:\n  - {}\n(report: {})",
                self.name,
                self.failures.join("\n  - "),
                report_dir().join(format!("{}.json", self.name)).display()
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Checks and report
// ---------------------------------------------------------------------------

struct Report {
    json: String,
    row: String,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn latency_json(sorted: &[Duration]) -> String {
    format!(
        "{{\"n\": {}, \"p50_ms\": {:.2}, \"p99_ms\": {:.2}, \"max_ms\": {:.2}}}",
        sorted.len(),
        ms(percentile(sorted, 0.5)),
        ms(percentile(sorted, 0.99)),
        ms(sorted.last().copied().unwrap_or_default())
    )
}

fn source_counts(samples: &[&Sample]) -> [u64; 5] {
    let mut counts = [0u64; 5];
    for s in samples {
        if let Some(i) = s.source() {
            counts[i] += 1;
        }
    }
    counts
}

fn counts_json(counts: &[u64; 5]) -> String {
    let fields: Vec<String> = SOURCES
        .iter()
        .zip(counts)
        .map(|(s, n)| format!("\"{s}\": {n}"))
        .collect();
    format!("{{{}}}", fields.join(", "))
}

/// What Redis admitted (all daemons, per key) and what local buckets admitted (per
/// daemon, per key), each against its bound; the global local total per key against
/// the global limit.
struct Admitted {
    redis: u64,
    redis_bound: u64,
    local: u64,
    local_bound: u64,
    global_local_max_ratio: f64,
}

fn check_admitted(sc: &mut Scenario, samples: &[Sample], data_losses: u32) -> Admitted {
    let mut a = Admitted {
        redis: 0,
        redis_bound: 0,
        local: 0,
        local_bound: 0,
        global_local_max_ratio: 0.0,
    };
    let hosts = f64::from(sc.hosts);
    let span = |it: &mut dyn Iterator<Item = &Sample>| -> Option<(Duration, Duration)> {
        it.fold(None, |acc, s| match acc {
            None => Some((s.sent, s.received())),
            Some((first, last)) => Some((first.min(s.sent), last.max(s.received()))),
        })
    };
    for rule in 0..RULES.len() {
        for key in 0..KEYS {
            let of_key: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.rule == rule && s.key == key)
                .collect();
            // Redis: one budget shared by every daemon. The bucket starts full; each
            // data loss (restart, failover) can hand out a fresh capacity.
            let redis_admitted = of_key.iter().filter(|s| s.allowed_by(REDIS)).count() as u64;
            let redis_span =
                span(&mut of_key.iter().filter(|s| s.source() == Some(REDIS)).copied());
            if let Some((first, last)) = redis_span {
                let t = (last - first).as_secs_f64();
                let bound =
                    (CAPACITY * f64::from(1 + data_losses) + REFILL_RATE * t + 1e-9).floor() as u64;
                a.redis += redis_admitted;
                a.redis_bound += bound;
                if redis_admitted > bound {
                    sc.failures.push(format!(
                        "{} k{key}: Redis admitted {redis_admitted} > bound {bound} over {t:.3} s",
                        RULES[rule].0
                    ));
                }
            }
            // Local buckets (rule `local` only): per daemon, capacity and refill ÷ hosts.
            if FALLBACK_SOURCE[rule] != "local" {
                continue;
            }
            let local = 2; // index of "local" in SOURCES
            let mut global = 0u64;
            let mut global_span: Option<(Duration, Duration)> = None;
            for d in 0..sc.daemons.len() {
                let mine: Vec<&Sample> = of_key
                    .iter()
                    .filter(|s| s.daemon == d && s.source() == Some(local))
                    .copied()
                    .collect();
                let Some((first, last)) = span(&mut mine.iter().copied()) else {
                    continue;
                };
                let t = (last - first).as_secs_f64();
                let admitted = mine.iter().filter(|s| s.allowed_by(local)).count() as u64;
                let bound = ((CAPACITY + REFILL_RATE * t) / hosts + 1e-9).floor() as u64;
                a.local += admitted;
                a.local_bound += bound;
                global += admitted;
                global_span = Some(match global_span {
                    None => (first, last),
                    Some((f, l)) => (f.min(first), l.max(last)),
                });
                if admitted > bound {
                    sc.failures.push(format!(
                        "daemon {d}, {} k{key}: local bucket admitted {admitted} > bound {bound} \
                         ((capacity + refill × {t:.3} s) ÷ {hosts} hosts)",
                        RULES[rule].0
                    ));
                }
            }
            if let Some((first, last)) = global_span {
                // All daemons together within the global limit over the outage.
                let t = (last - first).as_secs_f64();
                let bound = (CAPACITY + REFILL_RATE * t + 1e-9).floor() as u64;
                a.global_local_max_ratio =
                    a.global_local_max_ratio.max(global as f64 / bound as f64);
                if global > bound {
                    sc.failures.push(format!(
                        "{} k{key}: {} daemons' local buckets admitted {global} together > global \
                         bound {bound} over {t:.3} s",
                        RULES[rule].0,
                        sc.daemons.len()
                    ));
                }
            }
        }
    }
    a
}

#[allow(clippy::too_many_arguments)]
fn analyze(
    sc: &mut Scenario,
    samples: &[Sample],
    requests: u64,
    problems: Vec<String>,
    fallback: Fallback,
    transitions: Transitions,
    data_losses: u32,
) -> Report {
    let end = samples.last().map(|s| s.sent).unwrap_or_default();
    let replies = samples.len() as u64;
    let bad: Vec<&Sample> = samples
        .iter()
        .filter(|s| matches!(s.outcome, Outcome::Bad(_)))
        .collect();

    // 1. Exactly one reply per request, no ERR, no crash or restart.
    for p in &problems {
        sc.failures.push(format!("client: {p}"));
    }
    if replies != requests {
        sc.failures
            .push(format!("{requests} requests but {replies} replies"));
    }
    if let Some(Outcome::Bad(line)) = bad.first().map(|s| &s.outcome) {
        sc.failures.push(format!(
            "{} replies are ERR or malformed, first: {line:?}",
            bad.len()
        ));
    }
    let mut alive = true;
    let mut logs = Vec::new();
    for (i, d) in sc.daemons.iter_mut().enumerate() {
        if let Some(status) = d.wait_exit(Duration::ZERO) {
            alive = false;
            sc.failures.push(format!("daemon {i} exited: {status}"));
        }
        logs.push(d.log());
    }
    for (i, log) in logs.iter().enumerate() {
        let starts = log.matches("ratelimitd serving").count();
        if starts != 1 || log.contains("panicked") {
            alive = false;
            sc.failures
                .push(format!("daemon {i}: {starts} starts / panic in its log"));
        }
    }

    // 2. Latency during the faults.
    let in_fault = |s: &Sample| {
        sc.episodes.iter().any(|e| {
            let until = e.answering.unwrap_or(end) + FAULT_TAIL;
            // In flight at any moment of the fault window.
            s.received() >= e.start && s.sent <= until
        })
    };
    let mut fault_lat: Vec<Duration> = samples
        .iter()
        .filter(|s| in_fault(s))
        .map(|s| s.latency)
        .collect();
    fault_lat.sort();
    let mut all_lat: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    all_lat.sort();
    let (p99, max) = (
        percentile(&fault_lat, 0.99),
        fault_lat.last().copied().unwrap_or_default(),
    );
    if fault_lat.is_empty() {
        sc.failures.push("no replies during the fault".into());
    }
    if p99 > P99_BOUND {
        sc.failures.push(format!(
            "p99 latency during the fault {:.1} ms > {} ms",
            ms(p99),
            ms(P99_BOUND)
        ));
    }
    if max > MAX_BOUND {
        sc.failures.push(format!(
            "max latency during the fault {:.1} ms > {} ms",
            ms(max),
            ms(MAX_BOUND)
        ));
    }

    // 3. Sources: as configured per rule, present during each fault if required.
    let first_fault = sc.episodes.first().map(|e| e.start).unwrap_or(end);
    // Decided while Redis was healthy (fallback decisions there can only come from a
    // slow call opening the circuit: see the transition checks).
    let before: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.received() < first_fault)
        .collect();
    if !before.iter().any(|s| s.source() == Some(REDIS)) {
        sc.failures
            .push("no Redis decision before the fault".into());
    }
    for s in samples {
        let Some(src) = s.source() else { continue };
        let allowed = src == REDIS || src == CACHE || SOURCES[src] == FALLBACK_SOURCE[s.rule];
        let verdict_ok = match SOURCES[src] {
            "fail_open" => matches!(s.outcome, Outcome::Decision { allowed: true, .. }),
            "fail_closed" | "cache" => {
                matches!(s.outcome, Outcome::Decision { allowed: false, .. })
            }
            _ => true,
        };
        if !allowed || !verdict_ok {
            sc.failures.push(format!(
                "{} answered {:?} with source {}",
                RULES[s.rule].0, s.outcome, SOURCES[src]
            ));
            break;
        }
    }
    let mut episodes_json = Vec::new();
    let mut recovery_max: Option<f64> = None;
    let mut fault_sources = [0u64; 5];
    for (i, e) in sc.episodes.clone().iter().enumerate() {
        let next = sc
            .episodes
            .get(i + 1)
            .map(|n| n.start)
            .unwrap_or(end + Duration::from_secs(1));
        let window: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.sent >= e.start && s.sent < next)
            .collect();
        let counts = source_counts(&window);
        for (t, c) in fault_sources.iter_mut().zip(counts) {
            *t += c;
        }
        if fallback == Fallback::Required {
            for (rule, (name, _)) in RULES.iter().enumerate() {
                let want = FALLBACK_SOURCE[rule];
                if !window
                    .iter()
                    .any(|s| s.rule == rule && s.source().map(|x| SOURCES[x]) == Some(want))
                {
                    sc.failures
                        .push(format!("fault {i}: no `{want}` decision for {name}"));
                }
            }
        }
        // Recovery: from Redis answering again to the first decision by Redis (while
        // the circuit is open no decision goes to Redis).
        let mut recovery = None;
        if let Some(answering) = e.answering {
            if next < answering + RECOVERY_BOUND + Duration::from_millis(200) {
                sc.failures
                    .push(format!("fault {i}: too little load after Redis answered"));
            }
            if window.iter().any(|s| s.is_fallback()) {
                match window
                    .iter()
                    .find(|s| s.sent >= answering && s.source() == Some(REDIS))
                {
                    Some(back) => {
                        let r = ms(back.sent) - ms(answering);
                        recovery = Some(r);
                        recovery_max = Some(recovery_max.map_or(r, |m: f64| m.max(r)));
                        if r > ms(RECOVERY_BOUND) {
                            sc.failures.push(format!(
                                "fault {i}: back to redis {r:.0} ms after Redis answered again (> {} ms)",
                                ms(RECOVERY_BOUND)
                            ));
                        }
                    }
                    None => sc
                        .failures
                        .push(format!("fault {i}: decisions never came back to redis")),
                }
            }
        }
        episodes_json.push(format!(
            "{{\"fault_start_ms\": {:.1}, \"redis_answering_ms\": {}, \"recovery_ms\": {}, \"sources\": {}}}",
            ms(e.start),
            e.answering.map_or("null".into(), |a| format!("{:.1}", ms(a))),
            recovery.map_or("null".into(), |r| format!("{r:.1}")),
            counts_json(&counts)
        ));
    }

    // 4. Admitted counts within the contract's bounds.
    let admitted = check_admitted(sc, samples, data_losses);

    // 5. Transitions: logged once each (open, close, open, close, ...; never twice in a
    // row, the last one a close); `One`: exactly one open from a fault's injection until
    // Redis answers again; `AtMost(n)`: at most n until 1 s after. A circuit opening
    // outside every fault must be a slow call (`no answer within redis.timeout_ms`, as a
    // busy machine produces) closed again within 1 s: counted as `unprovoked_trips`.
    let t0_wall = sc.load_t0_wall;
    let windows: Vec<(f64, f64, f64)> = sc
        .episodes
        .iter()
        .map(|e| {
            let answering = e.answering.unwrap_or(end);
            (ms(e.start), ms(answering), ms(answering + RECOVERY_BOUND))
        })
        .collect();
    let mut opens = 0;
    let mut closes = 0;
    let mut unprovoked = 0;
    let mut circuit_lines = Vec::new();
    for (d, log) in logs.iter().enumerate() {
        let mut events = Vec::new(); // (ms since load start, is_open, line)
        for line in log.lines().filter(|l| l.contains("circuit")) {
            let at = log_time_ms(line, t0_wall);
            let at_text = at.map_or("?".into(), |t| format!("{t:.0}"));
            circuit_lines.push(json_str(&format!("daemon {d} at {at_text} ms: {line}")));
            let open = line.contains("circuit open");
            if open || line.contains("circuit closed") {
                events.push((at.unwrap_or(f64::NAN), open, line));
            }
        }
        opens += events.iter().filter(|e| e.1).count();
        closes += events.iter().filter(|e| !e.1).count();
        let alternates = events.iter().enumerate().all(|(k, e)| e.1 == (k % 2 == 0));
        if !alternates || events.len() % 2 != 0 {
            sc.failures.push(format!(
                "daemon {d}: circuit transitions not logged once each, or left open \
                 (see log_circuit_lines): {:?}",
                events
                    .iter()
                    .map(|e| (e.0.round(), e.1))
                    .collect::<Vec<_>>()
            ));
        }
        for (w, &(start, answering, tail)) in windows.iter().enumerate() {
            let count = |until: f64| {
                events
                    .iter()
                    .filter(|e| e.1 && e.0 >= start && e.0 <= until)
                    .count()
            };
            // Already open when the fault began (a slow call just before it): the
            // fault then needs no open of its own.
            let open_at_start = events.iter().rfind(|e| e.0 < start).is_some_and(|e| e.1);
            let (n, ok) = match transitions {
                Transitions::One => {
                    let n = count(answering);
                    (n, n + usize::from(open_at_start) == 1)
                }
                Transitions::AtMost(max) => (count(tail), count(tail) <= max),
            };
            if !ok {
                sc.failures.push(format!(
                    "daemon {d}, fault {w}: {n} `circuit open` lines, expected {transitions:?} \
                     (see log_circuit_lines)"
                ));
            }
        }
        for (k, &(at, open, line)) in events.iter().enumerate() {
            let provoked = windows
                .iter()
                .any(|&(start, _, tail)| at >= start && at <= tail);
            if !open || provoked {
                continue;
            }
            unprovoked += 1;
            // Closed within 1 s, or by the recovery from a fault that began meanwhile.
            let closed_at = events.get(k + 1).map(|c| c.0);
            let closed_after = closed_at.map(|c| c - at);
            let closed_in_time = closed_at.is_some_and(|c| {
                c - at <= ms(RECOVERY_BOUND)
                    || windows
                        .iter()
                        .any(|&(start, _, tail)| start > at && c >= start && c <= tail)
            });
            if !line.contains("no answer within redis.timeout_ms") || !closed_in_time {
                sc.failures.push(format!(
                    "daemon {d}: circuit opened outside any fault, at {at:.0} ms \
                     (faults: {windows:.0?}), closed {closed_after:?} ms later: {line}"
                ));
            }
        }
        let _ = std::fs::create_dir_all(report_dir());
        let _ = std::fs::write(report_dir().join(format!("{}.daemon{d}.log", sc.name)), log);
    }

    let seen: Vec<&str> = SOURCES
        .iter()
        .zip(fault_sources)
        .filter(|(_, n)| *n > 0)
        .map(|(s, _)| *s)
        .collect();
    let passed = sc.failures.is_empty();
    let row = format!(
        "{:<23} {:<4} {:>8} {:>8} {:>4} {:>7.1} {:>7.1} {:>12} {:<39} {:>11} {:>12} {:>12}",
        sc.name,
        if passed { "ok" } else { "FAIL" },
        requests,
        replies,
        bad.len(),
        ms(p99),
        ms(max),
        format!("{opens}/{closes}/{unprovoked}"),
        seen.join(","),
        recovery_max.map_or("-".into(), |r| format!("{r:.0}")),
        format!("{}/{}", admitted.redis, admitted.redis_bound),
        format!("{}/{}", admitted.local, admitted.local_bound),
    );
    let json = format!(
        "{{\n  \"scenario\": {},\n  \"title\": {},\n  \"passed\": {passed},\n  \"failures\": [{}],\n  \
         \"daemons\": {},\n  \"threads_per_daemon\": {},\n  \"fallback_hosts\": {},\n  \
         \"redis_timeout_ms\": {TIMEOUT_MS},\n  \"wall_time_s\": {:.1},\n  \"load_time_s\": {:.1},\n  \
         \"requests\": {requests},\n  \"replies\": {replies},\n  \"err_replies\": {},\n  \
         \"daemons_alive\": {alive},\n  \
         \"latency_during_fault\": {},\n  \"latency_all\": {},\n  \
         \"sources_all\": {},\n  \"sources_from_fault\": {},\n  \"episodes\": [{}],\n  \
         \"recovery_ms_max\": {},\n  \
         \"admitted\": {{\"redis\": {}, \"redis_bound\": {}, \"local\": {}, \"local_bound\": {}, \
         \"global_local_max_ratio\": {:.3}, \"data_losses\": {data_losses}}},\n  \
         \"log_transitions\": {{\"circuit_open\": {opens}, \"circuit_closed\": {closes}, \
         \"unprovoked_trips\": {unprovoked}, \"expected\": {}}},\n  \
         \"log_circuit_lines\": [{}]\n}}\n",
        json_str(sc.name),
        json_str(sc.title),
        sc.failures.iter().map(|f| json_str(f)).collect::<Vec<_>>().join(", "),
        sc.daemons.len(),
        sc.threads,
        sc.hosts,
        sc.started.elapsed().as_secs_f64(),
        end.as_secs_f64(),
        bad.len(),
        latency_json(&fault_lat),
        latency_json(&all_lat),
        counts_json(&source_counts(&samples.iter().collect::<Vec<_>>())),
        counts_json(&fault_sources),
        episodes_json.join(", "),
        recovery_max.map_or("null".into(), |r| format!("{r:.1}")),
        admitted.redis,
        admitted.redis_bound,
        admitted.local,
        admitted.local_bound,
        admitted.global_local_max_ratio,
        json_str(&format!("{transitions:?} per fault and daemon, none outside faults")),
        circuit_lines.join(", "),
    );
    Report { json, row }
}

/// The table header matching [`Report::row`].
fn header() -> String {
    format!(
        "{:<23} {:<4} {:>8} {:>8} {:>4} {:>7} {:>7} {:>12} {:<39} {:>11} {:>12} {:>12}",
        "scenario",
        "res",
        "requests",
        "replies",
        "ERR",
        "p99 ms",
        "max ms",
        "open/cls/unp",
        "sources from the fault on",
        "recovery ms",
        "redis adm/bd",
        "local adm/bd"
    )
}

/// When a daemon log line (`2026-01-02T10:39:38.950805Z …`, UTC) was written, in ms
/// since `t0` (the wall clock at the load's start); None if it has no timestamp.
fn log_time_ms(line: &str, t0: SystemTime) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let time = stamp.split_once('T')?.1.strip_suffix('Z')?;
    let mut hms = time.split(':');
    let h: f64 = hms.next()?.parse().ok()?;
    let m: f64 = hms.next()?.parse().ok()?;
    let sec: f64 = hms.next()?.parse().ok()?;
    let of_day = h * 3600.0 + m * 60.0 + sec;
    let t0_of_day = t0.duration_since(UNIX_EPOCH).ok()?.as_secs_f64() % 86_400.0;
    // Across midnight: the nearest difference.
    let diff = (of_day - t0_of_day + 43_200.0).rem_euclid(86_400.0) - 43_200.0;
    Some(diff * 1000.0)
}

fn report_dir() -> PathBuf {
    std::env::var_os("CHAOS_REPORT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chaos"))
}

fn write_report(name: &str, report: &Report) {
    let dir = report_dir();
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("header.txt"), format!("{}\n", header()));
    if let Err(e) = std::fs::write(dir.join(format!("{name}.json")), &report.json)
        .and_then(|()| std::fs::write(dir.join(format!("{name}.row")), format!("{}\n", report.row)))
    {
        eprintln!("chaos: cannot write the report to {}: {e}", dir.display());
    }
}

// ---------------------------------------------------------------------------
// The scenarios
// ---------------------------------------------------------------------------

/// Scenario 1: `kill -9` one primary: the cluster fails over to its replica, which has no
/// scripts (NOSCRIPT path). Decisions go local until every slot has a primary again.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s1_failover() {
    let mut sc = Scenario::start(
        "s1_failover",
        "kill -9 one primary; its replica takes over",
        1,
        4,
    );
    let victim = sc.cluster.primary_addrs()[0].clone();
    sc.fault_begins();
    sc.cluster.kill_node(&victim);
    sc.wait_redis_answers();
    // The async replica may miss the primary's last writes: one possible data loss.
    sc.finish(Fallback::Required, Transitions::One, 1);
}

/// Scenario 2: `kill -9` every node, then restart them with no data and no scripts.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s2_full_outage() {
    let mut sc = Scenario::start("s2_full_outage", "kill -9 all 6 nodes, restart empty", 1, 4);
    sc.fault_begins();
    sc.cluster.kill_all();
    thread::sleep(Duration::from_secs(2));
    restart_all_and_wait(&mut sc);
    sc.finish(Fallback::Required, Transitions::One, 1);
}

/// `restart_all` while a helper thread notes when Redis first answers as a whole.
fn restart_all_and_wait(sc: &mut Scenario) {
    let addrs = sc.addrs.clone();
    let load_t0 = sc.load.as_ref().expect("load").t0;
    let stop = AtomicBool::new(false);
    let answered = thread::scope(|s| {
        let poller = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let began = load_t0.elapsed();
                if redis_answering(&addrs) {
                    return Some(began);
                }
                thread::sleep(Duration::from_millis(10));
            }
            None
        });
        sc.cluster.restart_all();
        // Healthy now; give the poller a moment to see it if it has not yet.
        thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        poller.join().expect("poller")
    });
    match answered {
        Some(t) => sc.episodes.last_mut().expect("a fault").answering = Some(t),
        None => sc.wait_redis_answers(),
    }
}

/// Scenario 3: `SIGSTOP` every primary for 3 s (Redis hangs: timeouts, not refusals), `SIGCONT`.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s3_freeze_primaries() {
    let mut sc = Scenario::start(
        "s3_freeze_primaries",
        "SIGSTOP every primary for 3 s, then SIGCONT",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    sc.fault_begins();
    for p in &primaries {
        sc.cluster.signal_node(p, libc::SIGSTOP);
    }
    thread::sleep(Duration::from_secs(3));
    for p in &primaries {
        sc.cluster.signal_node(p, libc::SIGCONT);
    }
    sc.wait_redis_answers();
    sc.finish(Fallback::Required, Transitions::One, 0);
}

/// Scenario 4: `SCRIPT FLUSH` on every primary, three times: NOSCRIPT reloads keep decisions in
/// Redis (a decision that cannot reload in time is answered per `on_redis_failure`).
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s4_script_flush() {
    let mut sc = Scenario::start(
        "s4_script_flush",
        "SCRIPT FLUSH on every primary, 3 times",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    for _ in 0..3 {
        sc.fault_begins();
        for p in &primaries {
            match redis_text(p, &["SCRIPT", "FLUSH"]) {
                Ok(ok) if ok == "OK" => {}
                other => sc.failures.push(format!("SCRIPT FLUSH on {p}: {other:?}")),
            }
        }
        sc.wait_redis_answers();
        thread::sleep(Duration::from_millis(1300));
    }
    sc.finish(Fallback::Allowed, Transitions::AtMost(1), 0);
}

/// Scenario 5: Out of memory: `maxmemory` 1 byte with `noeviction` on every primary, so writes
/// and the scripts' writes fail with OOM, for 2 s; then memory back.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s5_out_of_memory() {
    let mut sc = Scenario::start(
        "s5_out_of_memory",
        "maxmemory 1 + noeviction on every primary for 2 s",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    sc.fault_begins();
    for p in &primaries {
        for (k, v) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
            if redis_text(p, &["CONFIG", "SET", k, v]).ok().as_deref() != Some("OK") {
                sc.failures
                    .push(format!("CONFIG SET {k} {v} on {p} failed"));
            }
        }
    }
    thread::sleep(Duration::from_secs(2));
    for p in &primaries {
        if redis_text(p, &["CONFIG", "SET", "maxmemory", "0"])
            .ok()
            .as_deref()
            != Some("OK")
        {
            sc.failures
                .push(format!("CONFIG SET maxmemory 0 on {p} failed"));
        }
    }
    sc.wait_redis_answers();
    sc.finish(Fallback::Required, Transitions::One, 0);
}

/// Scenario 6: Redis drops every client connection (`CLIENT KILL TYPE normal` on every
/// primary), 8 times 250 ms apart: the daemon reconnects; requests caught on a dropped
/// connection are answered per `on_redis_failure`.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s6_client_kill() {
    let mut sc = Scenario::start(
        "s6_client_kill",
        "CLIENT KILL TYPE normal on every primary, 8x every 250 ms",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    sc.fault_begins();
    for i in 0..8 {
        if i > 0 {
            thread::sleep(Duration::from_millis(250));
        }
        for p in &primaries {
            if let Err(e) = redis_text(p, &["CLIENT", "KILL", "TYPE", "normal"]) {
                sc.failures.push(format!("CLIENT KILL on {p}: {e}"));
            }
        }
    }
    sc.wait_redis_answers();
    sc.finish(Fallback::Allowed, Transitions::AtMost(8), 0);
}

/// Scenario 7: A slow Redis: three bursts of `DEBUG SLEEP 0.4` on every primary (16 × the
/// decision timeout), 1.5 s apart.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s7_slow_redis() {
    let mut sc = Scenario::start(
        "s7_slow_redis",
        "DEBUG SLEEP 0.4 on every primary, 3 bursts",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    for burst in 0..3 {
        if burst > 0 {
            thread::sleep(Duration::from_millis(1500));
        }
        sc.fault_begins();
        let results: Vec<std::io::Result<String>> = thread::scope(|s| {
            let sleepers: Vec<_> = primaries
                .iter()
                .map(|p| s.spawn(move || redis_text(p, &["DEBUG", "SLEEP", "0.4"])))
                .collect();
            sleepers
                .into_iter()
                .map(|h| h.join().expect("sleeper"))
                .collect()
        });
        for r in results {
            if r.as_deref().ok() != Some("OK") {
                sc.failures.push(format!("DEBUG SLEEP: {r:?}"));
            }
        }
        sc.wait_redis_answers();
    }
    sc.finish(Fallback::Required, Transitions::One, 0);
}

/// Scenario 8: N = `fallback.hosts` = 3 daemons on one cluster, all loading the same keys, and
/// a full outage: each local bucket admits ≤ limit ÷ 3, all three ≤ the global limit.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s8_three_daemons_outage() {
    let mut sc = Scenario::start(
        "s8_three_daemons_outage",
        "3 daemons (hosts = 3), kill -9 all nodes, restart",
        3,
        3,
    );
    sc.fault_begins();
    sc.cluster.kill_all();
    thread::sleep(Duration::from_secs(2));
    restart_all_and_wait(&mut sc);
    sc.finish(Fallback::Required, Transitions::One, 1);
}
