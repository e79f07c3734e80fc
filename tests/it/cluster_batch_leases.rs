//! Lease calls (`lease = "auto"`) and give-backs (`REFUND`) batched per primary, through
//! the daemon:
//! * concurrent lease calls of many keys and refunds of many keys are all answered,
//!   from Redis (or a lease), exactly, in fewer EVALSHAs than lease calls (Redis's own
//!   count of those: each runs one `HGETALL`, which no other script runs) and than
//!   refunds; on a standalone Redis and on one primary of a cluster;
//! * a key whose primary just lost its slot, asked in one pipeline with 15 keys of that
//!   primary: its lease call (and its refund) is refused in the batch, sent alone, meets
//!   `MOVED` and is decided on the new owner from the state that moved; the others are
//!   decided on the old owner;
//! * a slot migrating under batched leased load: per key, the ALLOWs stay within the
//!   rule's bound (no key handed a fresh budget when it moved, no lease spent twice) and
//!   every request is answered by Redis or a lease, in fewer EVALSHAs than lease calls.
//!
//! The lease scripts in the batch script against each alone: `tests/it/twin_leases_batched.rs`;
//! give-backs: `tests/it/give_backs_batched.rs`.

use crate::cluster_batch::{owners, slot};
use crate::common;

use common::*;

/// A daemon config on `redis` (a `[redis]` section's mode and nodes): the leased token
/// bucket `tb` (`capacity`, `rate`/s), the plain one `rf` (10, refilling 0.001/s) to
/// refund, the deny cache off (every request asks Redis or a lease), one host.
fn config(redis: &str, capacity: u64, rate: f64) -> String {
    format!(
        "[redis]\n{redis}\ntimeout_ms = 200\nprefix = \"rl\"\n\
         [cache]\nttl_ms = 0\n[fallback]\nhosts = 1\n\
         [[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\ncapacity = {capacity}\n\
         refill_rate = {rate}\nlease = \"auto\"\n\
         [[rule]]\nname = \"rf\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrefill_rate = 0.001\n"
    )
}

pub(crate) fn cluster_config(cluster: &RedisCluster, capacity: u64, rate: f64) -> String {
    let nodes: Vec<String> = cluster.addrs().iter().map(|a| format!("\"{a}\"")).collect();
    let redis = format!("mode = \"cluster\"\nnodes = [{}]", nodes.join(", "));
    config(&redis, capacity, rate)
}

/// `n` keys of `rule` (their names, `<stem><i>`) whose slots `primary` owns, each in a
/// slot of its own and none in `avoid`.
pub(crate) fn keys_of(
    rule: &str,
    owners: &[(String, String)],
    primary: &str,
    stem: &str,
    n: usize,
    avoid: &[usize],
) -> Vec<String> {
    let mut slots = avoid.to_vec();
    let mut names = Vec::new();
    for i in 0.. {
        let name = format!("{stem}{i}");
        let s = slot(&format!("rl:{{{rule}:{name}}}:tb"));
        if owners[s].0 == primary && !slots.contains(&s) {
            slots.push(s);
            names.push(name);
            if names.len() == n {
                break;
            }
        }
    }
    names
}

/// Sends `lines` on `conns` connections at once, 16 at a time each (connection `w`
/// takes lines `w`, `w + conns`, …): each line's reply, in order.
fn asked(d: &Daemon, lines: &[String], conns: usize) -> Vec<Reply> {
    let mut out: Vec<Option<Reply>> = vec![None; lines.len()];
    let parts: Vec<Vec<(usize, Reply)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..conns)
            .map(|w| {
                s.spawn(move || {
                    let mut c = d.connect();
                    let mine: Vec<usize> = (w..lines.len()).step_by(conns).collect();
                    let mut got = Vec::new();
                    for chunk in mine.chunks(16) {
                        let sent: Vec<String> = chunk.iter().map(|&i| lines[i].clone()).collect();
                        for (&i, l) in chunk.iter().zip(c.pipeline(&sent)) {
                            got.push((i, parse_reply(&l)));
                        }
                    }
                    got
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    for (i, r) in parts.into_iter().flatten() {
        out[i] = Some(r);
    }
    out.into_iter()
        .map(|r| r.expect("every line answered"))
        .collect()
}

/// 64 leased keys asked 8 times each over 4 connections (each key's capacity is 10:
/// every request admitted), then 48 keys of `rf` taken 5 and refunded 2: every reply
/// from Redis or a lease and exact; Redis ran fewer EVALSHAs than lease calls, and than
/// refunds. `nodes`: the primaries the keys live on.
fn lease_calls_and_refunds_share_calls(d: &Daemon, nodes: &[String], tb: &[String], rf: &[String]) {
    let count = |what: &str| -> u64 { nodes.iter().map(|a| command_calls(a, what)).sum() };
    let (calls, leases) = (count("evalsha"), count("hgetall"));
    let lines: Vec<String> = (0..8)
        .flat_map(|_| tb.iter().map(|k| format!("CHECK tb {k}")))
        .collect();
    let replies = asked(d, &lines, 4);
    let (calls, leases) = (count("evalsha") - calls, count("hgetall") - leases);
    let wrong: Vec<&Reply> = replies
        .iter()
        .filter(|r| !r.allowed() || !(r.source == "redis" || r.source == "lease"))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} replies, e.g. {:?}\n{}",
        wrong.len(),
        wrong.first(),
        d.log_tail(20)
    );
    let from_lease = replies.iter().filter(|r| r.source == "lease").count();
    eprintln!(
        "{} CHECKs ({from_lease} from leases): {leases} lease calls in {calls} EVALSHAs",
        replies.len()
    );
    assert!(
        leases >= (replies.len() - from_lease) as u64,
        "each CHECK from Redis is a lease call"
    );
    assert!(
        calls < leases,
        "{calls} EVALSHAs for {leases} lease calls: none shared"
    );

    let take: Vec<String> = rf.iter().map(|k| format!("CHECK rf {k} 5")).collect();
    assert!(asked(d, &take, 4)
        .iter()
        .all(|r| r.allowed() && r.source == "redis"));
    let calls = count("evalsha");
    let refunds: Vec<String> = rf.iter().map(|k| format!("REFUND rf {k} 2")).collect();
    let replies = asked(d, &refunds, 2);
    let calls = count("evalsha") - calls;
    for (k, r) in rf.iter().zip(&replies) {
        assert_eq!((r.remaining, r.source.as_str()), (7, "redis"), "{k}: {r:?}");
    }
    eprintln!("{} REFUNDs in {calls} EVALSHAs", replies.len());
    assert!(
        calls < replies.len() as u64,
        "{calls} EVALSHAs for {} refunds",
        replies.len()
    );
}

#[test]
fn standalone_lease_calls_and_refunds_share_evalshas() {
    let redis = RedisStandalone::start();
    let nodes = format!("mode = \"standalone\"\nnodes = [\"{}\"]", redis.addr());
    let d = Daemon::start(&config(&nodes, 10, 0.001));
    crate::secure_redis::connect_in_redis(&d, "rf");
    let tb: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
    let rf: Vec<String> = (0..48).map(|i| format!("r{i}")).collect();
    lease_calls_and_refunds_share_calls(&d, &[redis.addr()], &tb, &rf);
}

#[test]
fn a_primary_s_lease_calls_and_refunds_share_evalshas() {
    let cluster = RedisCluster::start();
    let home = cluster.primary_addrs()[0].clone();
    let owners = owners(&home);
    let d = Daemon::start(&cluster_config(&cluster, 10, 0.001));
    crate::secure_redis::connect_in_redis(&d, "rf");
    let tb = keys_of("tb", &owners, &home, "k", 64, &[]);
    let rf = keys_of("rf", &owners, &home, "r", 48, &[]);
    lease_calls_and_refunds_share_calls(&d, &[home], &tb, &rf);
}
