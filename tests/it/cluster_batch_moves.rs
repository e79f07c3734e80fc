//! Redis Cluster decisions batched per primary, through the daemon, while slots move: a
//! live slot migration under batched load keeps every key within its rule's bound and
//! uses its budget (no key handed a fresh one when it moved); a key in a batch for a
//! primary that just lost its slot is redirected to the new owner, the others decided.
//! The cluster batch script itself: `tests/it/cluster_batch.rs`.

use crate::cluster_batch::{keys_in_slot, keys_on, owners, slot, Migration};
use crate::common;

use common::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A daemon config for `cluster`: a token bucket `tb` of `capacity`, refilling at
/// `rate`/s, the deny cache off (every request asks Redis), one host.
fn daemon_config(cluster: &RedisCluster, capacity: u64, rate: f64) -> String {
    let nodes: Vec<String> = cluster.addrs().iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[redis]\nmode = \"cluster\"\nnodes = [{}]\ntimeout_ms = 200\nprefix = \"rl\"\n\
         [cache]\nttl_ms = 0\n[fallback]\nhosts = 1\n\
         [[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\ncapacity = {capacity}\nrefill_rate = {rate}\n",
        nodes.join(", ")
    )
}

/// A slot migrates (`IMPORTING`/`MIGRATING`, its keys moved a few at a time with
/// `MIGRATE`, then `SETSLOT NODE`) while 4 connections × 16 pipelined requests ask 48
/// keys of a token bucket (capacity 5, refill 2/s, deny cache off): 16 keys in the
/// moving slot, 16 in other slots of its old owner (sharing its batches), 16 on the
/// other primaries. Every reply comes from Redis; per key, the ALLOWs stay within the
/// rule's bound over the run (`5 + ⌈2 T⌉`: no key handed a fresh budget when it moved)
/// and reach what the rule gives a key asked that often (`5 + ⌊2 (span − gap)⌋ − 1`),
/// and the daemon sent fewer EVALSHAs than decisions.
#[test]
fn a_slot_migrating_under_batched_load_keeps_every_key_within_its_bound() {
    const CAPACITY: u64 = 5;
    const RATE: f64 = 2.0;
    let cluster = RedisCluster::start();
    let addrs = cluster.primary_addrs();
    let (src, dst) = (addrs[0].clone(), addrs[1].clone());
    let owners = owners(&src);
    let moving_slot = slot(&keys_on(&owners, &src, "mv", 1, &[])[0]);
    let mut keys: Vec<String> = keys_in_slot(moving_slot, "mv", 16);
    keys.extend(keys_on(&owners, &src, "home", 16, &[moving_slot]));
    keys.extend(keys_on(&owners, &addrs[1], "b", 8, &[]));
    keys.extend(keys_on(&owners, &addrs[2], "c", 8, &[]));
    let tag = |k: &str| {
        k.trim_start_matches("rl:{tb:")
            .trim_end_matches("}:tb")
            .to_string()
    };
    let tags: Vec<String> = keys.iter().map(|k| tag(k)).collect();

    let env = [("RUST_LOG", "info,ratelimitd::store::batch=debug")];
    let d = Daemon::start_with(
        &daemon_bin(),
        &env,
        &daemon_config(&cluster, CAPACITY, RATE),
    );
    let _ready = crate::secure_redis::connect_in_redis(&d, "tb");
    let calls_before: u64 = addrs.iter().map(|a| evalsha_calls(a)).sum();
    let started = Instant::now();
    let asked = load_through_migration(
        &d,
        &tags,
        40_000,
        &cluster,
        (moving_slot, &keys[..16]),
        &dst,
    );
    let elapsed = started.elapsed();
    let calls = addrs.iter().map(|a| evalsha_calls(a)).sum::<u64>() - calls_before;
    let all: Vec<&(usize, Instant, Instant, Reply)> = asked.iter().flatten().collect();
    let not_redis: Vec<_> = all
        .iter()
        .filter(|(_, _, _, r)| r.source != "redis")
        .collect();
    assert!(
        not_redis.is_empty(),
        "{} replies not from Redis, e.g. {:?}\n{}",
        not_redis.len(),
        not_redis.first(),
        d.log_tail(20)
    );

    let upper = CAPACITY + (RATE * elapsed.as_secs_f64()).ceil() as u64;
    let mut per_key: HashMap<usize, Vec<&(usize, Instant, Instant, Reply)>> = HashMap::new();
    for a in &all {
        per_key.entry(a.0).or_default().push(a);
    }
    let mut least_margin = i64::MAX;
    for (k, asks) in &per_key {
        let allowed = asks.iter().filter(|a| a.3.allowed()).count() as u64;
        let first_answer = asks.iter().map(|a| a.2).min().unwrap();
        let last_sent = asks.iter().map(|a| a.1).max().unwrap();
        let mut sends: Vec<Instant> = asks.iter().map(|a| a.1).collect();
        sends.sort();
        let gap = sends
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        let span = last_sent
            .saturating_duration_since(first_answer)
            .saturating_sub(gap);
        let lower = (CAPACITY + (RATE * span.as_secs_f64()).floor() as u64).saturating_sub(1);
        assert!(allowed <= upper, "{}: {allowed} ALLOWs > {upper}", keys[*k]);
        assert!(
            allowed >= lower,
            "{}: {allowed} ALLOWs < {lower} (span {span:?}, gap {gap:?})",
            keys[*k]
        );
        least_margin = least_margin.min(upper as i64 - allowed as i64);
    }
    assert_eq!(per_key.len(), keys.len(), "every key was asked");
    let moved_here = keys[..16]
        .iter()
        .filter(|k| cluster.cli(&dst, &["EXISTS", k]) == "1")
        .count();
    eprintln!(
        "{} decisions in {elapsed:?}, {calls} EVALSHAs; bound {upper} per key, least margin {least_margin}; \
         {moved_here} of 16 moving keys on the new owner; batches refused keys {} times",
        all.len(),
        d.log().matches("a batch refused keys").count()
    );
    assert_eq!(
        moved_here, 16,
        "the moving slot's keys live on the new owner"
    );
    assert!(
        (calls as usize) < all.len(),
        "{calls} EVALSHAs for {} decisions: none shared",
        all.len()
    );
}

/// A slot moves from its owner to another primary (the migration done and every node
/// told), and at once a pipeline asks 15 keys of the old owner's other slots and the
/// moved key: the daemon's map still sends the moved key to the old owner in a batch
/// with the others; the old owner refuses it there, it goes on its own, meets `MOVED`
/// and is decided on its new owner from the state that moved; the 15 are decided on
/// the old owner. Repeated on fresh slots until the daemon's log shows the refusal (its
/// slot map refresh, every second, may win the race), at most 5 times.
#[test]
fn a_key_whose_primary_just_lost_its_slot_is_redirected_and_the_others_decided() {
    let cluster = RedisCluster::start();
    let addrs = cluster.primary_addrs();
    let (src, dst) = (addrs[0].clone(), addrs[1].clone());
    let config = daemon_config(&cluster, 10, 0.001);
    let env = [("RUST_LOG", "info,ratelimitd::store::batch=debug")];
    let d = Daemon::start_with(&daemon_bin(), &env, &config);
    let mut c = crate::secure_redis::connect_in_redis(&d, "tb");
    let tag = |k: &str| {
        k.trim_start_matches("rl:{tb:")
            .trim_end_matches("}:tb")
            .to_string()
    };
    for attempt in 0..5 {
        let owners = owners(&src);
        let mover = keys_on(&owners, &src, &format!("lost{attempt}:"), 1, &[]).remove(0);
        let others = keys_on(
            &owners,
            &src,
            &format!("kept{attempt}:"),
            15,
            &[slot(&mover)],
        );
        // 3 tokens of the mover taken in Redis, on its old owner.
        for i in 0..3 {
            let r = parse_reply(&c.request(&format!("CHECK tb {}", tag(&mover))));
            assert_eq!((r.remaining, r.source.as_str()), (9 - i, "redis"), "{r:?}");
        }
        let m = Migration::start(&cluster, slot(&mover), &dst);
        m.migrate(&cluster, std::slice::from_ref(&mover));
        m.finish(&cluster);
        let refusals_before = d.log().matches("a batch refused keys").count();
        let mut lines: Vec<String> = others
            .iter()
            .map(|k| format!("CHECK tb {}", tag(k)))
            .collect();
        lines.insert(10, format!("CHECK tb {}", tag(&mover)));
        let replies: Vec<Reply> = c.pipeline(&lines).iter().map(|l| parse_reply(l)).collect();
        for (i, r) in replies.iter().enumerate() {
            let remaining = if i == 10 { 6 } else { 9 };
            assert_eq!(
                (r.verdict.as_str(), r.remaining, r.source.as_str()),
                ("ALLOW", remaining, "redis"),
                "attempt {attempt}, request {i}: {r:?}\n{}",
                d.log_tail(20)
            );
        }
        let tokens: f64 = cluster
            .cli(&dst, &["HGET", &mover, "t"])
            .parse()
            .unwrap_or(0.0);
        assert_eq!((tokens / 1e6).floor(), 6.0, "decided on the new owner");
        let refused = d.log().matches("a batch refused keys").count() > refusals_before;
        eprintln!(
            "attempt {attempt}: slot {} {src} -> {dst}; refused in a batch: {refused}",
            m.slot
        );
        if refused {
            return;
        }
    }
    panic!(
        "in 5 attempts the moved key never met its old owner in a batch:\n{}",
        d.log_tail(30)
    );
}

/// Per connection: (key index, sent, answered, reply).
pub(crate) type Asked = Vec<(usize, Instant, Instant, Reply)>;

/// Loads `d` from four connections, each pipelining 16 `CHECK tb <name>` of `names` at a
/// time (a stride of its own), at most `cap` replies each, while the slot of `moving`
/// (its Redis keys, moved two at a time) migrates to `dst`, 700 ms in; stops 1.2 s after
/// the migration. Returns each connection's replies.
pub(crate) fn load_through_migration(
    d: &Daemon,
    names: &[String],
    cap: usize,
    cluster: &RedisCluster,
    (slot, moving): (usize, &[String]),
    dst: &str,
) -> Vec<Asked> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let stop = &stop;
                s.spawn(move || {
                    let mut c = d.connect();
                    let mut out = Vec::new();
                    let mut i = w * 12;
                    // Bounded in time and in count.
                    while !stop.load(Ordering::Relaxed) && out.len() < cap {
                        let picked: Vec<usize> =
                            (0..16).map(|j| (i + j * 3) % names.len()).collect();
                        i += 7;
                        let lines: Vec<String> = picked
                            .iter()
                            .map(|&k| format!("CHECK tb {}", names[k]))
                            .collect();
                        let sent = Instant::now();
                        let replies = c.pipeline(&lines);
                        let answered = Instant::now();
                        out.extend(
                            picked
                                .into_iter()
                                .zip(replies)
                                .map(|(k, l)| (k, sent, answered, parse_reply(&l))),
                        );
                    }
                    out
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        let m = Migration::start(cluster, slot, dst);
        for chunk in moving.chunks(2) {
            m.migrate(cluster, chunk);
            std::thread::sleep(Duration::from_millis(60));
        }
        m.finish(cluster);
        std::thread::sleep(Duration::from_millis(1200));
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    })
}
