//! Batched lease calls and give-backs on Redis Cluster while slots move, through the
//! daemon: a key whose primary just lost its slot is refused in its batch and
//! redirected, the others decided; a slot migrating under batched leased load keeps
//! every key within its rule's bound. Their batches while no slot moves:
//! `tests/it/cluster_batch_leases.rs`.

use crate::cluster_batch::{owners, slot, Migration};
use crate::cluster_batch_leases::{cluster_config, keys_of};
use crate::cluster_batch_moves::load_through_migration;
use crate::common;

use common::*;
use std::collections::HashMap;
use std::time::Instant;

/// The Redis key of `rule`'s key `name` (every rule here is a token bucket).
fn redis_key(rule: &str, name: &str) -> String {
    format!("rl:{{{rule}:{name}}}:tb")
}

/// The debug lines of the batches' refusals, and the daemon's log level for them.
const REFUSED_CALLS: &str = "a batch refused keys";
const REFUSED_GROUPS: &str = "a batch refused groups";
const LOG: &str = "info,ratelimitd::store::batch=debug,ratelimitd::store::batch_all=debug";

/// Two slots move from their owner to another primary (the migration done and every
/// node told), and at once a pipeline asks 15 leased keys of the old owner's other slots
/// and one moved with the first slot (each a cold key's lease call), then a pipeline
/// refunds 15 keys there and one moved with the second slot. The daemon's map still sends the moved keys to the old
/// owner in a batch with the others; the old owner refuses them there, they go on
/// their own, meet `MOVED` and are decided on the new owner from the state that moved;
/// the others are decided on the old owner. Repeated on fresh slots until the daemon's
/// log shows both refusals (its slot map refresh, every second, may win the race), at
/// most 6 times.
#[test]
fn a_leased_key_whose_primary_just_lost_its_slot_is_redirected_and_the_others_decided() {
    let cluster = RedisCluster::start();
    let addrs = cluster.primary_addrs();
    let (src, dst) = (addrs[0].clone(), addrs[1].clone());
    let d = Daemon::start_with(
        &daemon_bin(),
        &[("RUST_LOG", LOG)],
        &cluster_config(&cluster, 10, 0.001),
    );
    let mut c = crate::secure_redis::connect_in_redis(&d, "rf");
    let (mut calls_refused, mut groups_refused) = (false, false);
    for attempt in 0..6 {
        let owners = owners(&src);
        let mover = keys_of("tb", &owners, &src, &format!("lost{attempt}:"), 1, &[]).remove(0);
        let moving = slot(&redis_key("tb", &mover));
        // In a slot of its own: the lease call refused first puts its slot in doubt, and
        // a key of a slot in doubt skips the batches.
        let refunded = keys_of(
            "rf",
            &owners,
            &src,
            &format!("gone{attempt}:"),
            1,
            &[moving],
        )
        .remove(0);
        let moving_too = slot(&redis_key("rf", &refunded));
        let both = [moving, moving_too];
        let others = keys_of("tb", &owners, &src, &format!("kept{attempt}:"), 15, &both);
        let rf = keys_of("rf", &owners, &src, &format!("rkept{attempt}:"), 15, &both);
        for i in 0..3 {
            let r = parse_reply(&c.request(&format!("CHECK tb {mover}")));
            assert_eq!((r.remaining, r.source.as_str()), (9 - i, "redis"), "{r:?}");
        }
        let takes: Vec<String> = rf
            .iter()
            .chain([&refunded])
            .map(|k| format!("CHECK rf {k} 5"))
            .collect();
        assert!(c
            .pipeline(&takes)
            .iter()
            .all(|l| parse_reply(l).remaining == 5));
        for (slot, key) in [
            (moving, redis_key("tb", &mover)),
            (moving_too, redis_key("rf", &refunded)),
        ] {
            let m = Migration::start(&cluster, slot, &dst);
            m.migrate(&cluster, &[key]);
            m.finish(&cluster);
        }
        let log = d.log();
        let before = (
            log.matches(REFUSED_CALLS).count(),
            log.matches(REFUSED_GROUPS).count(),
        );
        let mut lines: Vec<String> = others.iter().map(|k| format!("CHECK tb {k}")).collect();
        lines.insert(10, format!("CHECK tb {mover}"));
        for (i, l) in c.pipeline(&lines).iter().enumerate() {
            let r = parse_reply(l);
            let remaining = if i == 10 { 6 } else { 9 };
            assert_eq!(
                (r.verdict.as_str(), r.remaining, r.source.as_str()),
                ("ALLOW", remaining, "redis"),
                "attempt {attempt}, lease call {i}: {r:?}\n{}",
                d.log_tail(20)
            );
        }
        let mut lines: Vec<String> = rf.iter().map(|k| format!("REFUND rf {k} 2")).collect();
        lines.insert(10, format!("REFUND rf {refunded} 2"));
        for (i, l) in c.pipeline(&lines).iter().enumerate() {
            let r = parse_reply(l);
            assert_eq!(
                (r.remaining, r.source.as_str()),
                (7, "redis"),
                "attempt {attempt}, refund {i}: {r:?}\n{}",
                d.log_tail(20)
            );
        }
        let tokens = |rule: &str, name: &str| -> f64 {
            let t = cluster.cli(&dst, &["HGET", &redis_key(rule, name), "t"]);
            (t.parse::<f64>().unwrap_or(0.0) / 1e6).floor()
        };
        assert_eq!(tokens("tb", &mover), 6.0, "decided on the new owner");
        assert_eq!(tokens("rf", &refunded), 7.0, "given back on the new owner");
        let log = d.log();
        calls_refused |= log.matches(REFUSED_CALLS).count() > before.0;
        groups_refused |= log.matches(REFUSED_GROUPS).count() > before.1;
        eprintln!(
            "attempt {attempt}: slots {both:?} {src} -> {dst}; refused in a batch so far: lease calls {calls_refused}, refunds {groups_refused}"
        );
        if calls_refused && groups_refused {
            return;
        }
    }
    panic!(
        "in 6 attempts the moved keys never met their old owner in a batch (lease call {calls_refused}, refund {groups_refused}):\n{}",
        d.log_tail(30)
    );
}

/// A slot migrates (`IMPORTING`/`MIGRATING`, its keys moved a few at a time with
/// `MIGRATE`, then `SETSLOT NODE`) while 4 connections × 16 pipelined requests ask 48
/// keys of a leased token bucket (capacity 5, refill 2/s): 16 keys in the moving slot,
/// 16 in other slots of its old owner (sharing its batches), 16 on the other primaries.
/// Every reply comes from Redis or a lease; per key, the ALLOWs stay within the rule's
/// bound over the run (`5 + ⌈2 T⌉`: no key handed a fresh budget when it moved, no
/// lease spent twice) and reach 70 % of what the rule gives a key asked that often;
/// Redis ran fewer EVALSHAs than lease calls.
#[test]
fn a_slot_migrating_under_batched_leased_load_keeps_every_key_within_its_bound() {
    const CAPACITY: u64 = 5;
    const RATE: f64 = 2.0;
    let cluster = RedisCluster::start();
    let addrs = cluster.primary_addrs();
    let (src, dst) = (addrs[0].clone(), addrs[1].clone());
    let owners = owners(&src);
    let moving = slot(&redis_key(
        "tb",
        &keys_of("tb", &owners, &src, "mv", 1, &[])[0],
    ));
    let mut names: Vec<String> = (0..)
        .map(|i| format!("mv{i}"))
        .filter(|n| slot(&redis_key("tb", n)) == moving)
        .take(16)
        .collect();
    names.extend(keys_of("tb", &owners, &src, "home", 16, &[moving]));
    names.extend(keys_of("tb", &owners, &addrs[1], "b", 8, &[]));
    names.extend(keys_of("tb", &owners, &addrs[2], "c", 8, &[]));
    let d = Daemon::start_with(
        &daemon_bin(),
        &[("RUST_LOG", LOG)],
        &cluster_config(&cluster, CAPACITY, RATE),
    );
    let _ready = crate::secure_redis::connect_in_redis(&d, "rf");
    let count = |what: &str| -> u64 { addrs.iter().map(|a| command_calls(a, what)).sum() };
    let (calls_before, leases_before) = (count("evalsha"), count("hgetall"));
    let started = Instant::now();
    let keys: Vec<String> = names[..16].iter().map(|n| redis_key("tb", n)).collect();
    let asked = load_through_migration(&d, &names, 400_000, &cluster, (moving, &keys), &dst);
    let elapsed = started.elapsed();
    let (calls, leases) = (
        count("evalsha") - calls_before,
        count("hgetall") - leases_before,
    );
    let all: Vec<&(usize, Instant, Instant, Reply)> = asked.iter().flatten().collect();
    let elsewhere: Vec<_> = all
        .iter()
        .filter(|a| a.3.source != "redis" && a.3.source != "lease")
        .collect();
    assert!(
        elsewhere.is_empty(),
        "{} replies not from Redis or a lease, e.g. {:?}\n{}",
        elsewhere.len(),
        elsewhere.first(),
        d.log_tail(20)
    );
    let upper = CAPACITY + (RATE * elapsed.as_secs_f64()).ceil() as u64;
    let mut per_key: HashMap<usize, Vec<&(usize, Instant, Instant, Reply)>> = HashMap::new();
    for a in &all {
        per_key.entry(a.0).or_default().push(a);
    }
    let mut least = u64::MAX;
    for (k, asks) in &per_key {
        let allowed = asks.iter().filter(|a| a.3.allowed()).count() as u64;
        least = least.min(allowed);
        let first = asks.iter().map(|a| a.2).min().expect("an answer");
        let last = asks.iter().map(|a| a.1).max().expect("a send");
        let span = last.saturating_duration_since(first);
        let lower = 0.7 * (CAPACITY as f64 + RATE * span.as_secs_f64());
        assert!(
            allowed <= upper,
            "{}: {allowed} ALLOWs > {upper}",
            names[*k]
        );
        assert!(
            allowed as f64 >= lower,
            "{}: {allowed} ALLOWs < {lower} (span {span:?})",
            names[*k]
        );
    }
    assert_eq!(per_key.len(), names.len(), "every key was asked");
    let moved_here = names[..16]
        .iter()
        .filter(|n| cluster.cli(&dst, &["EXISTS", &redis_key("tb", n)]) == "1")
        .count();
    let from_lease = all.iter().filter(|a| a.3.source == "lease").count();
    eprintln!(
        "{} requests in {elapsed:?} ({from_lease} from leases): {leases} lease calls in {calls} EVALSHAs; bound {upper} per key, least {least}; \
         {moved_here} of 16 moving keys on the new owner; batches refused keys {} times",
        all.len(),
        d.log().matches(REFUSED_CALLS).count()
    );
    assert_eq!(
        moved_here, 16,
        "the moving slot's keys live on the new owner"
    );
    assert!(
        calls < leases,
        "{calls} EVALSHAs for {leases} lease calls: none shared"
    );
}
