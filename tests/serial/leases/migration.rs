//! A slot migrated under a leased hot key: the key's hash (its budget and every lease
//! stored in it) moves with the slot; holders keep naming their grants, follow `ASK`
//! while the slot moves and `MOVED` after, and nothing is admitted above the rule.

use super::common::*;
use super::harness::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const RULE: &str = r#"
[[rule]]
name = "mig"
algorithm = "token_bucket"
capacity = 300
refill_rate = 200.0
lease = "auto"
"#;
const CAPACITY: f64 = 300.0;
const RATE: f64 = 200.0;
const KEY: &str = "rl:{mig:hot}:tb";

/// The primary owning `slot` (`host:port`) and its node id.
pub(super) fn owner_of(cluster: &RedisCluster, slot: u16) -> (String, String) {
    let any = &cluster.primary_addrs()[0];
    for line in cluster.cli(any, &["CLUSTER", "NODES"]).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 || !f[2].contains("master") {
            continue;
        }
        let owns = f[8..].iter().any(|r| match r.split_once('-') {
            Some((a, b)) => {
                a.parse().is_ok_and(|a: u16| a <= slot) && b.parse().is_ok_and(|b: u16| slot <= b)
            }
            None => r.parse() == Ok(slot),
        });
        if owns {
            let addr = f[1].split('@').next().expect("address").to_string();
            return (addr, f[0].to_string());
        }
    }
    panic!("no primary owns slot {slot}");
}

/// Three daemons saturate a leased bucket (demand 20× its refill); 3 s in, the key's slot
/// is moved to another primary as a reshard does (`IMPORTING`, `MIGRATING`, `MIGRATE` of
/// the key with its leases, `SETSLOT NODE` everywhere), with slices out. Over the run:
/// at most `capacity + refill_rate × T`, and at least 90 % of it.
#[test]
fn a_slot_migrated_under_a_leased_hot_key_admits_no_more_than_the_bucket() {
    let s = Setup::start(RULE);
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Phase::default();
    let started = Instant::now();
    let handles: Vec<_> = s
        .daemons
        .iter()
        .map(|d| {
            let every = Duration::from_millis(20);
            load(&d.socket, "CHECK mig hot", 3, 9, every, &stop, &phase)
        })
        .collect();
    thread::sleep(Duration::from_secs(3));
    let out = leases_out(&s.cluster, "mig:hot");
    let slot: u16 = s
        .cluster
        .cli(&s.cluster.primary_addrs()[0], &["CLUSTER", "KEYSLOT", KEY])
        .parse()
        .expect("slot");
    let (src, src_id) = owner_of(&s.cluster, slot);
    let dst = s
        .cluster
        .primary_addrs()
        .into_iter()
        .find(|a| *a != src)
        .expect("another primary");
    let dst_id = s.cluster.cli(&dst, &["CLUSTER", "MYID"]);
    let port = dst.rsplit(':').next().expect("port").to_string();
    let slot_s = slot.to_string();
    phase.store(1, Ordering::Relaxed);
    s.cluster
        .cli(&dst, &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &src_id]);
    s.cluster
        .cli(&src, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &dst_id]);
    let migrated = s.cluster.cli(
        &src,
        &["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", KEY],
    );
    for node in s.cluster.primary_addrs() {
        s.cluster
            .cli(&node, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id]);
    }
    phase.store(2, Ordering::Relaxed);
    thread::sleep(Duration::from_secs(5));
    let (_, all) = stop_and_join(&stop, handles);
    let t = started.elapsed().as_secs_f64();
    let bound = CAPACITY + RATE * t;
    println!(
        "slot migration: {out} leases out when it started, MIGRATE {migrated}; {} ALLOW before, {} during, {} after ({} from leases); {} in {t:.2} s (bound {bound:.0}, {:.1} %)",
        all.allowed_in(0),
        all.allowed_in(1),
        all.allowed_in(2),
        all.from(2, "lease", true),
        all.allowed(),
        100.0 * all.allowed() as f64 / bound
    );
    assert!(out > 0, "no lease out when the slot moved: {all:?}");
    assert_eq!(migrated, "OK", "MIGRATE");
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
    assert!(all.allowed() as f64 >= 0.9 * bound, "under-used: {all:?}");
}
