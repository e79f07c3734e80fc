//! Slots that move while the daemon decides in a 6-node Redis Cluster (3 primaries, 3
//! replicas): a slot migrated to another primary (`ASK` while it moves, `MOVED` after)
//! and a primary killed and replaced by its replica. Each runs on a plain cluster and on
//! one reached over TLS only with the documented least-privilege ACL user
//! (`tests/secure_redis`): the daemon follows the new owner (learnt from `CLUSTER SLOTS`,
//! which over TLS names the nodes' TLS ports) and keeps the key's state.
//!
//! An `ASK` the daemon cannot follow (its user lacks `+asking`, or the new owner is
//! frozen) is in `unfollowed_ask.rs`.

mod unfollowed_ask;

use crate::common;
use crate::secure_redis;

use common::*;
use secure_redis::{connect_in_redis, Flavor, TestCluster, ADMIN_PASSWORD, ADMIN_USER};
use std::time::{Duration, Instant};

/// Ten tokens that do not refill during a test; deny cache off, so every request asks.
fn config(cluster: &TestCluster) -> String {
    format!(
        "[redis]\n{}timeout_ms = 100\nprefix = \"rl\"\n[cache]\nttl_ms = 0\n\
         [[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrefill_rate = 0.001\n",
        cluster.redis_fields()
    )
}

/// The primary holding `slot` (by `CLUSTER NODES` of `any`) and its node id.
fn owner_of(cluster: &TestCluster, slot: u16) -> (String, String) {
    let any = &cluster.primary_addrs()[0];
    let nodes = cluster.cli(any, &["CLUSTER", "NODES"]);
    let owner = owners_by_slot(&nodes).swap_remove(usize::from(slot));
    assert!(!owner.0.is_empty(), "no primary owns slot {slot}");
    owner
}

/// Sends `CHECK tb <key>` every 10 ms until a reply comes from `source`, at most
/// `within`; every reply on the way must be a decision. The wait and that reply.
fn until_source(c: &mut Client, key: &str, source: &str, within: Duration) -> (Duration, Reply) {
    let start = Instant::now();
    loop {
        let r = parse_reply(&c.request(&format!("CHECK tb {key} 0")));
        if r.source == source {
            return (start.elapsed(), r);
        }
        assert!(
            start.elapsed() < within,
            "no {source} reply within {within:?}: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Takes `n` tokens of `key` (a fresh key of the `tb` rule, capacity 10) in Redis,
/// checking each reply: remaining 9, 8, … from Redis.
fn take_in_redis(c: &mut Client, key: &str, n: u64) {
    for i in 0..n {
        let r = parse_reply(&c.request(&format!("CHECK tb {key}")));
        assert_eq!((r.remaining, r.source.as_str()), (9 - i, "redis"), "{r:?}");
    }
}

plain_and_tls!(
    a_migrated_slot_is_followed_with_its_state,
    a_failed_primary_is_replaced_by_its_replica
);

/// The hash slot of `key` (by `CLUSTER KEYSLOT`).
fn slot_of(cluster: &TestCluster, key: &str) -> u16 {
    cluster
        .cli(&cluster.addrs()[0], &["CLUSTER", "KEYSLOT", key])
        .parse()
        .unwrap()
}

/// A slot moved by hand from its owner to another primary, as a reshard does it.
pub(crate) struct Migration {
    slot: u16,
    /// The old owner, `host:port`.
    src: String,
    /// The new owner, `host:port`, and its node id.
    pub(crate) dst: String,
    dst_id: String,
}

impl Migration {
    /// Starts moving `key`'s slot to another primary: `IMPORTING` on the new owner,
    /// `MIGRATING` on the old one, then `key` copied over (`MIGRATE`, as the admin over
    /// TLS). From then on the old owner answers `ASK` for `key`.
    pub(crate) fn start(cluster: &TestCluster, flavor: Flavor, key: &str) -> Migration {
        let slot = slot_of(cluster, key);
        let (src, src_id) = owner_of(cluster, slot);
        let dst = cluster
            .primary_addrs()
            .into_iter()
            .find(|a| *a != src)
            .unwrap();
        let dst_id = cluster.cli(&dst, &["CLUSTER", "MYID"]);
        let dst_port = dst.rsplit(':').next().unwrap();
        let setslot = |node: &str, state: &str, id: &str| {
            let out = cluster.cli(node, &["CLUSTER", "SETSLOT", &slot.to_string(), state, id]);
            assert_eq!(out, "OK", "SETSLOT {slot} {state} on {node}");
        };
        setslot(&dst, "IMPORTING", &src_id);
        setslot(&src, "MIGRATING", &dst_id);
        let mut migrate = vec!["MIGRATE", "127.0.0.1", dst_port, "", "0", "5000"];
        if flavor == Flavor::TlsAcl {
            migrate.extend(["AUTH2", ADMIN_USER, ADMIN_PASSWORD]);
        }
        migrate.extend(["KEYS", key]);
        assert_eq!(cluster.cli(&src, &migrate), "OK", "MIGRATE");
        Migration {
            slot,
            src,
            dst,
            dst_id,
        }
    }

    /// Ends it: every primary gives the slot to the new owner (`SETSLOT NODE`), and the
    /// old owner answers `MOVED` for it.
    pub(crate) fn finish(&self, cluster: &TestCluster) {
        for node in cluster.primary_addrs() {
            cluster.cli(
                &node,
                &[
                    "CLUSTER",
                    "SETSLOT",
                    &self.slot.to_string(),
                    "NODE",
                    &self.dst_id,
                ],
            );
        }
    }
}

fn a_migrated_slot_is_followed_with_its_state(flavor: Flavor) {
    let cluster = TestCluster::start(flavor);
    let d = Daemon::start(&config(&cluster));
    let mut c = connect_in_redis(&d, "tb");
    let key = "rl:{tb:mover}:tb";
    take_in_redis(&mut c, "mover", 3);

    // The slot moves: importing, migrating, the key copied over. Meanwhile the old
    // owner answers ASK for it, and the daemon follows it: ASKING, then the script on
    // the new owner, with the state that moved.
    let m = Migration::start(&cluster, flavor, key);
    let during = parse_reply(&c.request("CHECK tb mover 0"));
    assert_eq!(
        (during.source.as_str(), during.remaining),
        ("redis", 7),
        "an ASK is followed to the new owner: {during:?}"
    );
    let during = parse_reply(&c.request("CHECK tb mover"));
    assert_eq!(
        (during.source.as_str(), during.remaining),
        ("redis", 6),
        "and decided there: {during:?}"
    );
    assert!(
        !d.log().contains("Redis could not decide a key"),
        "a followed ASK is not a per-key error: {}",
        d.log()
    );

    // The slot is the new owner's: the old one answers MOVED, the daemon refreshes its
    // map and decides there, from the migrated state.
    m.finish(&cluster);
    let (took, r) = until_source(&mut c, "mover", "redis", Duration::from_secs(5));
    assert_eq!(r.remaining, 6, "the state moved with the slot: {r:?}");
    let r = parse_reply(&c.request("CHECK tb mover"));
    assert_eq!((r.remaining, r.source.as_str()), (5, "redis"), "{r:?}");
    assert_eq!(
        cluster.cli(&m.dst, &["EXISTS", key]),
        "1",
        "decided on the new owner"
    );
    eprintln!(
        "{flavor:?}: slot {} {} -> {}: during the move {}, back in Redis {took:?} after the MOVED",
        m.slot, m.src, m.dst, during.source
    );
    assert!(took <= Duration::from_millis(1500), "{took:?}");
    cluster.assert_no_acl_denials();
}

fn a_failed_primary_is_replaced_by_its_replica(flavor: Flavor) {
    let mut cluster = TestCluster::start(flavor);
    let d = Daemon::start(&config(&cluster));
    let mut c = connect_in_redis(&d, "tb");
    let key = "rl:{tb:victim}:tb";
    take_in_redis(&mut c, "victim", 3);
    let slot = slot_of(&cluster, key);
    let (old, _) = owner_of(&cluster, slot);
    // A key of another primary, to count how it is decided meanwhile.
    let other = (0..100)
        .map(|i| format!("other{i}"))
        .find(|k| {
            let s = slot_of(&cluster, &format!("tb:{k}"));
            owner_of(&cluster, s).0 != old
        })
        .unwrap();
    cluster.kill_node(&old);
    let killed = Instant::now();
    // Every request is answered: the dead primary's keys locally, the others in Redis.
    let (mut answered, mut other_local) = (0, 0);
    let back = loop {
        let r = parse_reply(&c.request("CHECK tb victim 0"));
        answered += 1;
        if r.source == "redis" {
            break (killed.elapsed(), r);
        }
        assert_eq!(r.source, "local", "{r:?}");
        let o = parse_reply(&c.request(&format!("CHECK tb {other} 0")));
        other_local += usize::from(o.source != "redis");
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "no failover within 20 s:\n{}",
            d.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let new = owner_of(&cluster, slot).0;
    eprintln!(
        "{flavor:?}: primary {old} killed; {new} decides slot {slot} {:?} after the kill ({answered} requests answered meanwhile, {other_local} of another primary's key not from Redis); remaining {}",
        back.0, back.1.remaining
    );
    assert_ne!(new, old);
    // (Keys of the other primaries go local too while the cluster says CLUSTERDOWN:
    // between the failure being agreed on and the promotion, Redis answers no key.)
    // Replication is asynchronous: the replica has the 3 tokens taken unless it lagged.
    assert!(back.1.remaining <= 10, "{:?}", back.1);
    cluster.assert_no_acl_denials();
}
