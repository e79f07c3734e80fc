//! Chaos scenarios: a daemon that is itself late (paused with `SIGSTOP` while three
//! daemons share one hot key), and a long outage of every primary (memory, recovery).

use super::*;

/// Daemons sharing the hot key, and pipelining clients per daemon.
const PAUSE_DAEMONS: usize = 3;
const CLIENTS_PER_DAEMON: usize = 3;
/// CHECKs a client writes before reading their replies.
const PIPELINE: usize = 4;

/// One hot-key request: which daemon, when written and read (since t0), the verdict.
struct Hot {
    daemon: usize,
    sent: Duration,
    received: Duration,
    allowed: bool,
    source: String,
}

/// A client pipelining `CHECK chaos_local hot` to `socket` until `stop`.
fn hot_client(
    socket: &Path,
    daemon: usize,
    t0: Instant,
    stop: &AtomicBool,
) -> (Vec<Hot>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let Ok(stream) = UnixStream::connect(socket) else {
        return (out, vec![format!("connecting to {}", socket.display())]);
    };
    stream
        .set_read_timeout(Some(REPLY_TIMEOUT))
        .expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let batch = "CHECK chaos_local hot\n".repeat(PIPELINE);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < LOAD_HARD_CAP {
        let sent = t0.elapsed();
        if let Err(e) = writer.write_all(batch.as_bytes()) {
            problems.push(format!("write: {e}"));
            break;
        }
        for _ in 0..PIPELINE {
            line.clear();
            if reader.read_line(&mut line).map_or(true, |n| n == 0) {
                problems.push("missing reply".into());
                return (out, problems);
            }
            match try_parse_reply(line.trim_end()) {
                Some(r) => out.push(Hot {
                    daemon,
                    sent,
                    received: t0.elapsed(),
                    allowed: r.allowed(),
                    source: r.source.clone(),
                }),
                None => problems.push(format!("bad reply {line:?}")),
            }
        }
        thread::sleep(Duration::from_millis(1));
    }
    (out, problems)
}

/// Scenario 12: three daemons (`fallback.hosts = 3`), one token-bucket key, 9 pipelining
/// clients; daemon 0 is paused (`SIGSTOP`) for 60 ms, then for 500 ms. All ALLOWs
/// together ≤ capacity + refill × T + one local share (capacity ÷ 3) per daemon that
/// decided the key locally, T = first request sent to last reply read; and the paused
/// daemon opens no breaker (its lateness is not Redis's).
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s12_paused_daemon() {
    let name = "s12_paused_daemon";
    let cluster = RedisCluster::start();
    let config = daemon_config(&cluster.addrs(), PAUSE_DAEMONS as u32);
    let log_filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info,fred=warn".into());
    let daemons: Vec<Daemon> = (0..PAUSE_DAEMONS)
        .map(|_| Daemon::start_with(&daemon_bin(), &[("RUST_LOG", &log_filter)], &config))
        .collect();
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..PAUSE_DAEMONS * CLIENTS_PER_DAEMON)
        .map(|c| {
            let d = c % PAUSE_DAEMONS;
            let socket = daemons[d].socket.clone();
            let stop = Arc::clone(&stop);
            thread::spawn(move || hot_client(&socket, d, t0, &stop))
        })
        .collect();
    let mut pauses = Vec::new();
    for pause in [Duration::from_millis(60), Duration::from_millis(500)] {
        thread::sleep(Duration::from_millis(1000));
        let at = t0.elapsed();
        daemons[0].signal(libc::SIGSTOP);
        thread::sleep(pause);
        daemons[0].signal(libc::SIGCONT);
        pauses.push(format!("[{:.1}, {:.0}]", ms(at), ms(pause)));
    }
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let mut hot = Vec::new();
    let mut failures = Vec::new();
    for h in handles {
        let (samples, problems) = h.join().expect("hot client");
        hot.extend(samples);
        failures.extend(problems.into_iter().map(|p| format!("client: {p}")));
    }
    let first = hot.iter().map(|h| h.sent).min().unwrap_or_default();
    let last = hot.iter().map(|h| h.received).max().unwrap_or_default();
    let t = (last - first).as_secs_f64();
    let allowed = hot.iter().filter(|h| h.allowed).count();
    let by_source = |s: &str| hot.iter().filter(|h| h.allowed && h.source == s).count();
    let local_hosts = (0..PAUSE_DAEMONS)
        .filter(|&d| hot.iter().any(|h| h.daemon == d && h.source == "local"))
        .count();
    let share = CAPACITY / PAUSE_DAEMONS as f64;
    let bound = (CAPACITY + REFILL_RATE * t + local_hosts as f64 * share).floor() as usize;
    if allowed > bound {
        failures.push(format!(
            "{allowed} ALLOWs in {t:.3} s > bound {bound} (capacity {CAPACITY} + {REFILL_RATE}/s x T + {local_hosts} local shares of {share:.2})"
        ));
    }
    let log0 = daemons[0].log();
    let trips = log0.matches("Redis primary down").count();
    if trips > 0 {
        failures.push(format!("the paused daemon opened {trips} primary breakers"));
    }
    let alive: Vec<bool> = daemons.iter().map(|d| pid_alive(d.pid())).collect();
    if alive.iter().any(|a| !a) {
        failures.push(format!("a daemon exited: {alive:?}"));
    }
    let json = format!(
        "{{\"name\": {}, \"passed\": {}, \"requests\": {}, \"t_s\": {t:.3}, \"allowed\": {allowed}, \
         \"allowed_redis\": {}, \"allowed_local\": {}, \"local_hosts\": {local_hosts}, \"bound\": {bound}, \
         \"pauses_at_ms_for_ms\": [{}], \"paused_daemon_breaker_trips\": {trips}, \"failures\": [{}]}}\n",
        json_str(name),
        failures.is_empty(),
        hot.len(),
        by_source("redis"),
        by_source("local"),
        pauses.join(", "),
        failures.iter().map(|f| json_str(f)).collect::<Vec<_>>().join(", ")
    );
    let row = format!(
        "{name:<23} {:<4} {:>8} ALLOWs {allowed} <= bound {bound} (T {t:.2} s, local hosts {local_hosts}, redis {}, local {}), paused daemon trips {trips}",
        if failures.is_empty() { "ok" } else { "FAIL" },
        hot.len(),
        by_source("redis"),
        by_source("local"),
    );
    write_report(
        name,
        &Report {
            json,
            row: row.clone(),
        },
    );
    eprintln!("{row}");
    assert!(
        failures.is_empty(),
        "chaos scenario {name} failed:\n  - {}",
        failures.join("\n  - ")
    );
}

/// Resident memory of `pid`, kB (`VmRSS`).
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// EVALSHA calls a node has run (`INFO commandstats`): decisions and probes.
fn evalsha_calls(addr: &str) -> u64 {
    redis_text(addr, &["INFO", "commandstats"])
        .ok()
        .and_then(|i| {
            i.lines()
                .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|v| v.split(',').next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// How long every primary stays frozen in scenario 13: 40 s rather than 2 minutes, to
/// fit the CI budget (the memory trend is linear if anything queues: 40 s shows it).
const LONG_OUTAGE: Duration = Duration::from_secs(40);
/// RSS may grow at most this much over the outage.
const RSS_GROWTH_KB: u64 = 5 * 1024;
/// EVALSHAs a primary may run right at its thaw: the decisions in flight when it froze
/// (the load's clients wait for their replies: ≤ 16 at once) and the ones sent before its
/// breaker opened, and no queue of decisions or probes growing with the outage's length.
const THAW_EVALSHAS: u64 = 200;

/// Scenario 13: every primary frozen for [`LONG_OUTAGE`] under load: RSS flat (≤ +5 MB),
/// no queued burst reaching Redis at the thaw, back to Redis ≤ 1 s after it answers.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s13_long_outage() {
    let mut sc = Scenario::start(
        "s13_long_outage",
        "SIGSTOP every primary for 40 s, load on",
        1,
        4,
    );
    let pid = sc.daemons[0].pid();
    let primaries = sc.cluster.primary_addrs();
    let before: Vec<u64> = primaries.iter().map(|p| evalsha_calls(p)).collect();
    sc.fault_begins();
    let rss_start = rss_kb(pid);
    for p in &primaries {
        sc.cluster.signal_node(p, libc::SIGSTOP);
    }
    let mut rss_max = rss_start;
    let mut rss_samples = Vec::new();
    let until = Instant::now() + LONG_OUTAGE;
    while Instant::now() < until {
        thread::sleep(Duration::from_millis(500));
        let r = rss_kb(pid);
        rss_max = rss_max.max(r);
        rss_samples.push(r);
    }
    for p in &primaries {
        sc.cluster.signal_node(p, libc::SIGCONT);
    }
    // The first INFO after the thaw is served once what was already waiting on the
    // node's connections has run.
    let at_thaw: Vec<u64> = primaries.iter().map(|p| evalsha_calls(p)).collect();
    let thaw: Vec<u64> = at_thaw
        .iter()
        .zip(&before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    sc.wait_redis_answers();
    let rss_end = rss_kb(pid);
    sc.finish_with(Fallback::Required, Transitions::One, 0, |sc, _| {
        let growth = rss_max.saturating_sub(rss_start);
        if growth > RSS_GROWTH_KB {
            sc.failures.push(format!(
                "RSS grew {growth} kB over the outage ({rss_start} -> max {rss_max} kB; bound {RSS_GROWTH_KB})"
            ));
        }
        if let Some(n) = thaw.iter().find(|&&n| n > THAW_EVALSHAS) {
            sc.failures.push(format!(
                "a primary ran {n} EVALSHAs at its thaw (bound {THAW_EVALSHAS}): decisions queued during the outage"
            ));
        }
        let third = rss_samples.len() / 3;
        format!(
            "{{\"outage_s\": {}, \"rss_kb_start\": {rss_start}, \"rss_kb_max\": {rss_max}, \
             \"rss_kb_end\": {rss_end}, \"rss_kb_first_third_max\": {}, \"rss_kb_last_third_max\": {}, \
             \"evalsha_at_thaw_per_primary\": {thaw:?}}}",
            LONG_OUTAGE.as_secs(),
            rss_samples[..third].iter().max().copied().unwrap_or(0),
            rss_samples[2 * third..].iter().max().copied().unwrap_or(0),
        )
    });
}
