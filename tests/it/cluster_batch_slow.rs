//! Redis Cluster decisions batched per primary while that primary is slow but healthy:
//! it runs in short slices between pauses well under `redis.timeout_ms` (as a Redis
//! starved of CPU on a loaded host does), so every call it gets is answered within the
//! timeout. Batching must not turn that into local answers: a decision queued behind a
//! batch in flight waits for that batch at most an eighth of the timeout, not for its
//! round trip and then for its own; and a batch whose decisions run late is one late call
//! to the primary's breaker, not one per decision.

use crate::cluster_batch::{keys_on, owners};
use crate::common;

use common::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const CAPACITY: u64 = 5;
const RATE: f64 = 2.0;
const TIMEOUT_MS: u64 = 200;
/// Each pause of the slow primary: 57 % of the timeout, so that a decision waiting for a
/// batch's round trip and then for its own (two pauses) outlives it.
const PAUSE: Duration = Duration::from_millis(115);
/// The longest pause-and-slice a run may see for its verdict to count: 75 % of the
/// timeout. Past it the host, not the daemon, made that primary slower than the run
/// intends (this process resumed it late, or it was not scheduled at once).
const LONGEST_CYCLE: Duration = Duration::from_millis(150);

/// A daemon config for `cluster`: a token bucket `tb` (capacity 5, refill 2/s), the
/// deny cache off (every request asks Redis), one host.
fn daemon_config(cluster: &RedisCluster) -> String {
    let nodes: Vec<String> = cluster.addrs().iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[redis]\nmode = \"cluster\"\nnodes = [{}]\ntimeout_ms = {TIMEOUT_MS}\nprefix = \"rl\"\n\
         [cache]\nttl_ms = 0\n[fallback]\nhosts = 1\n\
         [[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\ncapacity = {CAPACITY}\nrefill_rate = {RATE}\n",
        nodes.join(", ")
    )
}

/// One primary paused (`SIGSTOP`) for 115 ms at a time for 2 s (`timeout_ms` = 200),
/// resumed between pauses for one pass of its event loop (a `PING` sent during the
/// pause is answered: everything that arrived meanwhile was answered with it, a few kB
/// at this load; then one more `PING`, to see the pass's replies out), while 4 connections × 16 pipelined requests ask 96 keys of it and 32
/// of the others: every
/// reply comes from Redis (no timeout, no open breaker), and per key the ALLOWs stay
/// within the rule's bound (`5 + ⌈2 T⌉`) and reach its capacity (each key is asked far
/// more often than that). A pause and pass longer than 150 ms (a loaded host resumed
/// it late) makes the run prove nothing: it is repeated, at most 3 times.
#[test]
fn a_slow_primary_answering_within_the_timeout_decides_every_batched_request() {
    let cluster = RedisCluster::start();
    let addrs = cluster.primary_addrs();
    let slow = addrs[0].clone();
    let owners = owners(&slow);
    let mut keys = keys_on(&owners, &slow, "slow", 96, &[]);
    keys.extend(keys_on(&owners, &addrs[1], "b", 16, &[]));
    keys.extend(keys_on(&owners, &addrs[2], "c", 16, &[]));
    let tags: Vec<String> = keys
        .iter()
        .map(|k| {
            k.trim_start_matches("rl:{tb:")
                .trim_end_matches("}:tb")
                .to_string()
        })
        .collect();
    let d = Daemon::start(&daemon_config(&cluster));
    let _ready = crate::secure_redis::connect_in_redis(&d, "tb");
    for attempt in 1..=3 {
        let (asked, elapsed, longest) = slow_run(&cluster, &slow, &d, &tags, attempt);
        if longest > LONGEST_CYCLE {
            eprintln!("attempt {attempt}: a pause and pass took {longest:?}: run again");
            continue;
        }
        check(&asked, &keys, elapsed, &d);
        return;
    }
    panic!(
        "every attempt had a pause longer than {LONGEST_CYCLE:?}: this host is too loaded to tell"
    );
}

/// (key index, reply) per request of one run; the run's length; its longest pause and
/// pass.
type Run = (Vec<(usize, Reply)>, Duration, Duration);

/// One run: `slow` paused and resumed in turn while the connections ask `tags` (each
/// attempt its own keys, `<tag>~<attempt>`, so that every run starts from full buckets).
fn slow_run(
    cluster: &RedisCluster,
    slow: &str,
    d: &Daemon,
    tags: &[String],
    attempt: usize,
) -> Run {
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let mut longest = Duration::ZERO;
    let mut ping = std::net::TcpStream::connect(slow).expect("connect to the slow primary");
    let asked: Vec<Vec<(usize, Reply)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let stop = &stop;
                s.spawn(move || {
                    let mut c = d.connect();
                    let mut out = Vec::new();
                    let mut i = w * 21;
                    // Bounded in time and in count.
                    while !stop.load(Ordering::Relaxed) && out.len() < 40_000 {
                        let picked: Vec<usize> =
                            (0..16).map(|j| (i + j * 5) % tags.len()).collect();
                        i += 11;
                        let lines: Vec<String> = picked
                            .iter()
                            .map(|&k| format!("CHECK tb {}~{attempt}", tags[k]))
                            .collect();
                        let replies = c.pipeline(&lines);
                        out.extend(
                            picked
                                .into_iter()
                                .zip(replies.iter().map(|l| parse_reply(l))),
                        );
                    }
                    out
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let until = Instant::now() + Duration::from_millis(2000);
        while Instant::now() < until {
            let paused = Instant::now();
            cluster.signal_node(slow, libc::SIGSTOP);
            std::thread::sleep(PAUSE);
            one_pass(&mut ping);
            cluster.signal_node(slow, libc::SIGCONT);
            one_pass_done(&mut ping);
            // The pass's other replies may go out after the PONG: a second PING is
            // answered once they have.
            one_pass(&mut ping);
            one_pass_done(&mut ping);
            cluster.signal_node(slow, libc::SIGSTOP);
            longest = longest.max(paused.elapsed());
        }
        cluster.signal_node(slow, libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    (asked.concat(), started.elapsed(), longest)
}

/// Sends a `PING` to the paused primary: it is answered in the same pass of its event
/// loop as everything else that arrived during the pause.
fn one_pass(ping: &mut std::net::TcpStream) {
    ping.write_all(b"PING\r\n").expect("PING");
}

/// Waits for the `PONG` of [`one_pass`].
fn one_pass_done(ping: &mut std::net::TcpStream) {
    let mut pong = [0u8; 7];
    ping.read_exact(&mut pong).expect("PONG");
    assert_eq!(&pong, b"+PONG\r\n");
}

/// Every reply from Redis; per key, ALLOWs within `5 + ⌈2 T⌉` and at least its capacity.
fn check(asked: &[(usize, Reply)], keys: &[String], elapsed: Duration, d: &Daemon) {
    let not_redis: Vec<_> = asked.iter().filter(|(_, r)| r.source != "redis").collect();
    eprintln!(
        "{} decisions in {elapsed:?}, {} not from Redis",
        asked.len(),
        not_redis.len()
    );
    assert!(
        not_redis.is_empty(),
        "{} of {} replies not from Redis, e.g. {:?}\n{}",
        not_redis.len(),
        asked.len(),
        not_redis.first(),
        d.log_tail(20)
    );
    assert!(
        !d.log().contains("Redis primary down"),
        "a breaker opened:\n{}",
        d.log_tail(20)
    );
    let upper = CAPACITY + (RATE * elapsed.as_secs_f64()).ceil() as u64;
    let mut allowed: HashMap<usize, (u64, u64)> = HashMap::new();
    for (k, r) in asked {
        let e = allowed.entry(*k).or_default();
        e.0 += u64::from(r.allowed());
        e.1 += 1;
    }
    assert_eq!(allowed.len(), keys.len(), "every key was asked");
    for (k, (yes, asks)) in &allowed {
        assert!(*yes <= upper, "{}: {yes} ALLOWs > {upper}", keys[*k]);
        assert!(
            *yes >= CAPACITY.min(*asks),
            "{}: {yes} ALLOWs of {asks} asks < capacity {CAPACITY}",
            keys[*k]
        );
    }
}
