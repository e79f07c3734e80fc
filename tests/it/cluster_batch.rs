//! Redis Cluster decisions sent per primary in batches: keys of several slots of one
//! primary in one EVALSHA of the cluster batch script (`lua/batch.lua`,
//! `#!lua flags=allow-cross-slot-keys`).
//!
//! * The script decides each key of a batch exactly as the reference model does for
//!   that key alone (twins, `tests/it/twins.rs`), while a key of another primary in the
//!   same batch is refused, not decided.
//! * The script refuses, per key, every key it cannot vouch for as the node's own and
//!   not moved away: another primary's key, a migrating slot's key already moved (absent
//!   on the old owner, which must not read as new), an importing slot's key; it decides
//!   the others, and writes nothing for a refused key.
//!
//! Through the daemon, while slots move: `tests/it/cluster_batch_moves.rs`.

use crate::common;
use crate::reference;
use crate::twins::{lua_call, model_of, rate, start};

use common::*;
use proptest::prelude::*;
use ratelimitd::algorithm::{leaky_bucket, token_bucket};
use ratelimitd::algorithm::{Params, WindowParams};
use reference::Model;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// One cluster for the script-level twins (never resharded).
pub(crate) fn shared() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// Per slot, the `host:port` of the primary owning it and that primary's node id, by
/// `CLUSTER NODES` of `any`.
pub(crate) fn owners(any: &str) -> Vec<(String, String)> {
    owners_by_slot(&redis_text(any, &["CLUSTER", "NODES"]).expect("CLUSTER NODES"))
}

/// The slot of a Redis key.
pub(crate) fn slot(key: &str) -> usize {
    usize::from(fred::util::redis_keyslot(key.as_bytes()))
}

/// `n` keys `rl:{tb:<stem><i>}:tb` (rule `tb`'s key `<stem><i>`) owned by `primary`, each in a slot of its own and
/// none in `avoid`.
pub(crate) fn keys_on(
    owners: &[(String, String)],
    primary: &str,
    stem: &str,
    n: usize,
    avoid: &[usize],
) -> Vec<String> {
    crate::cluster_batch_leases::keys_of("tb", owners, primary, stem, n, avoid)
        .into_iter()
        .map(|name| format!("rl:{{tb:{name}}}:tb"))
        .collect()
}

/// One decision's item of the batch script: algorithm index, argument count, the
/// arguments of its own script with an explicit `now` and the dry-run flag.
fn item(params: &Params, cost: u64, now_us: u64, dry: bool) -> Vec<String> {
    let (_, mut args) = lua_call(params, cost);
    args.extend([now_us.to_string(), if dry { "1" } else { "0" }.to_string()]);
    let mut item = vec![(params.kind() as usize).to_string(), args.len().to_string()];
    item.extend(args);
    item
}

/// EVAL of the cluster batch script on `addr` for `keys` (the first routes it) with
/// `items` (one per key, in order): each key's reply, integers or the error text.
fn cluster_batch(
    addr: &str,
    keys: &[String],
    items: &[Vec<String>],
) -> Vec<Result<Vec<i64>, String>> {
    let script = ratelimitd::store::scripts::cluster_batch_lua();
    let count = keys.len().to_string();
    let mut cmd: Vec<&str> = vec!["EVAL", &script, "1", &keys[0], &count];
    cmd.extend(keys.iter().map(String::as_str));
    cmd.extend(items.iter().flatten().map(String::as_str));
    match redis_command(addr, &cmd).expect("EVAL cluster batch") {
        Resp::Array(Some(replies)) => replies
            .into_iter()
            .map(|r| match r {
                ints @ Resp::Array(Some(_)) => Ok(ints.into_ints()),
                other => Err(other.into_text().unwrap_or_else(|e| e.to_string())),
            })
            .collect(),
        other => panic!("expected an array of replies, got {other:?}"),
    }
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// Runs `steps` (µs since the previous step, one cost per key) for `KEYS` keys of one
/// primary in distinct slots, one batch per step (each key's dry run, then its
/// decision, with a key of another primary between them), against one reference model
/// per key: every field of every key's reply must be the model's for that key alone,
/// and the other primary's key must be refused (`ALONE …`).
fn agree(
    params: Params,
    limit: u64,
    start_us: u64,
    steps: &[(u64, Vec<u64>)],
) -> Result<(), TestCaseError> {
    const KEYS: usize = 4;
    let cluster = shared();
    let addrs = cluster.primary_addrs();
    let owners = owners(&addrs[0]);
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let (home, away) = (
        &addrs[case as usize % addrs.len()],
        &addrs[(case as usize + 1) % addrs.len()],
    );
    let keys = keys_on(&owners, home, &format!("twin{case}:"), KEYS, &[]);
    let foreign = keys_on(&owners, away, &format!("away{case}:"), 1, &[]).remove(0);
    let mut models: Vec<Model> = (0..KEYS).map(|_| Model::new(model_of(&params))).collect();
    let mut now = start_us;
    for (i, (dt, costs)) in steps.iter().enumerate() {
        now += dt;
        let mut batch_keys = Vec::new();
        let mut items = Vec::new();
        for (k, key) in keys.iter().enumerate() {
            let cost = costs[k] % (limit + 1);
            batch_keys.push(key.clone());
            items.push(item(&params, cost, now, true));
            if k == 1 {
                batch_keys.push(foreign.clone());
                items.push(item(&params, 1, now, false));
            }
            batch_keys.push(key.clone());
            items.push(item(&params, cost, now, false));
        }
        let replies = cluster_batch(home, &batch_keys, &items);
        let mut at = 0;
        for (k, model) in models.iter_mut().enumerate() {
            let cost = costs[k] % (limit + 1);
            let expected = Ok(model.decide(now as f64, cost).to_vec());
            prop_assert_eq!(
                &replies[at],
                &expected,
                "key {} dry run, step {} cost {} at {} µs, {:?}",
                k,
                i,
                cost,
                now,
                params
            );
            if k == 1 {
                at += 1;
                let refused = replies[at]
                    .as_ref()
                    .err()
                    .is_some_and(|e| e.starts_with("ALONE ") && e.contains("non local key"));
                prop_assert!(refused, "another primary's key: {:?}", replies[at]);
            }
            prop_assert_eq!(
                &replies[at + 1],
                &expected,
                "key {} decision, step {} cost {} at {} µs, {:?}",
                k,
                i,
                cost,
                now,
                params
            );
            at += 2;
        }
    }
    Ok(())
}

fn window_ms() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=3000, Just(1000u64), Just(60_000u64)]
}

/// Steps of (gap µs, a cost for each of 4 keys).
fn steps(max_gap_us: u64) -> impl Strategy<Value = Vec<(u64, Vec<u64>)>> {
    proptest::collection::vec(
        (
            prop_oneof![Just(0u64), 0..max_gap_us, 0..max_gap_us / 20 + 1],
            proptest::collection::vec(0u64..=1000, 4),
        ),
        1..20,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_cluster_batch_decides_each_token_bucket_as_alone(
        capacity in 1u64..=100, rate in rate(), hosts in 1u32..=4,
        start in start(), steps in steps(3_000_000),
    ) {
        let p = Params::TokenBucket(token_bucket::Params::shared(capacity, rate, hosts));
        agree(p, capacity, start, &steps)?;
    }

    #[test]
    fn a_cluster_batch_decides_each_leaky_bucket_as_alone(
        capacity in 1u64..=100, rate in rate(), hosts in 1u32..=4,
        start in start(), steps in steps(3_000_000),
    ) {
        let p = Params::LeakyBucket(leaky_bucket::Params::shared(capacity, rate, hosts));
        agree(p, capacity, start, &steps)?;
    }

    #[test]
    fn a_cluster_batch_decides_each_fixed_window_as_alone(
        limit in 1u64..=50, window in window_ms(), hosts in 1u32..=4,
        start in start(), steps in steps(4_000_000),
    ) {
        let p = Params::FixedWindow(WindowParams::shared(limit, window, hosts));
        agree(p, limit, start, &steps)?;
    }

    #[test]
    fn a_cluster_batch_decides_each_sliding_window_counter_as_alone(
        limit in 1u64..=50, window in window_ms(), hosts in 1u32..=4,
        start in start(), steps in steps(4_000_000),
    ) {
        let p = Params::SlidingWindowCounter(WindowParams::shared(limit, window, hosts));
        agree(p, limit, start, &steps)?;
    }
}

/// A slot in the middle of a migration, set up by hand as a reshard does it.
pub(crate) struct Migration {
    pub(crate) slot: usize,
    pub(crate) src: String,
    pub(crate) dst: String,
    pub(crate) dst_id: String,
}

impl Migration {
    /// `IMPORTING` on `dst`, then `MIGRATING` on `src`, for `slot`.
    pub(crate) fn start(cluster: &RedisCluster, slot: usize, dst: &str) -> Migration {
        let owners = owners(dst);
        let (src, src_id) = owners[slot].clone();
        let dst_id = cluster.cli(dst, &["CLUSTER", "MYID"]);
        let s = slot.to_string();
        assert_eq!(
            cluster.cli(dst, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id]),
            "OK"
        );
        assert_eq!(
            cluster.cli(&src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]),
            "OK"
        );
        Migration {
            slot,
            src,
            dst: dst.to_string(),
            dst_id,
        }
    }

    /// Moves `keys` (of the slot) to the new owner.
    pub(crate) fn migrate(&self, cluster: &RedisCluster, keys: &[String]) {
        let port = self.dst.rsplit(':').next().unwrap();
        let mut cmd = vec!["MIGRATE", "127.0.0.1", port, "", "0", "5000", "KEYS"];
        cmd.extend(keys.iter().map(String::as_str));
        let out = cluster.cli(&self.src, &cmd);
        assert!(out == "OK" || out == "NOKEY", "MIGRATE: {out}");
    }

    /// The slot is the new owner's, on every primary (`SETSLOT NODE`, the new owner
    /// first, as a reshard does).
    pub(crate) fn finish(&self, cluster: &RedisCluster) {
        let s = self.slot.to_string();
        let mut nodes = cluster.primary_addrs();
        nodes.sort_by_key(|n| *n != self.dst);
        for node in nodes {
            assert_eq!(
                cluster.cli(&node, &["CLUSTER", "SETSLOT", &s, "NODE", &self.dst_id]),
                "OK"
            );
        }
    }
}

/// Keys `rl:{tb:<stem><i>}:tb` all in `slot`, `n` of them.
pub(crate) fn keys_in_slot(slot: usize, stem: &str, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("rl:{{tb:{stem}{i}}}:tb"))
        .filter(|k| self::slot(k) == slot)
        .take(n)
        .collect()
}

/// In a migrating slot, a key still on the old owner is decided there from its state,
/// a key already moved is refused (absent there is not new), a key of a stable slot that
/// does not exist is decided as new; on the new owner, without `ASKING`, the importing
/// slot's key is refused; nothing is written for a refused key, on either node.
#[test]
fn the_cluster_batch_refuses_each_key_it_cannot_vouch_for() {
    let cluster = RedisCluster::start();
    let addrs = cluster.primary_addrs();
    let (src, dst) = (&addrs[0], &addrs[1]);
    let owners = owners(src);
    let stable = keys_on(&owners, src, "stable", 2, &[]);
    let moving_slot = slot(
        &keys_on(
            &owners,
            src,
            "moving",
            1,
            &[slot(&stable[0]), slot(&stable[1])],
        )[0],
    );
    let moving = keys_in_slot(moving_slot, "moving", 2);
    let theirs = keys_on(&owners, dst, "theirs", 1, &[]);
    let tb = Params::TokenBucket(token_bucket::Params::shared(10, 0.001, 1));
    let now = 1_700_000_000_000_000u64;
    let take = |n: u64| item(&tb, n, now, false);

    // States before the move: 3 tokens taken from each moving key, 1 from stable[0].
    let first = [stable[0].clone(), moving[0].clone(), moving[1].clone()];
    let replies = cluster_batch(src, &first, &[take(1), take(3), take(3)]);
    assert_eq!(
        replies,
        vec![
            Ok(vec![1, 9, 1_000_000, 0]),
            Ok(vec![1, 7, 3_000_000, 0]),
            Ok(vec![1, 7, 3_000_000, 0])
        ]
    );

    let m = Migration::start(&cluster, moving_slot, dst);
    m.migrate(&cluster, &moving[1..]);
    let moved_state = cluster.cli(dst, &["HGET", &moving[1], "t"]);
    // stable[0] (routes), moving[0] (still here), moving[1] (moved), theirs, stable[1] (new).
    let batch = [
        stable[0].clone(),
        moving[0].clone(),
        moving[1].clone(),
        theirs[0].clone(),
        stable[1].clone(),
    ];
    let replies = cluster_batch(src, &batch, &[take(1), take(1), take(1), take(1), take(1)]);
    eprintln!(
        "slot {} migrating {} -> {}: {replies:?}",
        m.slot, m.src, m.dst
    );
    assert_eq!(
        replies[0],
        Ok(vec![1, 8, 2_000_000, 0]),
        "a stable key, from its state"
    );
    assert_eq!(
        replies[1],
        Ok(vec![1, 6, 4_000_000, 0]),
        "a migrating slot's key still here, from its state"
    );
    for (i, what) in [(2, "a moved key"), (3, "another primary's key")] {
        let e = replies[i].as_ref().expect_err(what);
        assert!(
            e.starts_with("ALONE ") && e.contains("non local key"),
            "{what}: {e}"
        );
    }
    assert_eq!(
        replies[4],
        Ok(vec![1, 9, 1_000_000, 0]),
        "a new key of a stable slot"
    );
    // The old owner holds only the key that did not move (it answers ASK for the other).
    assert_eq!(
        cluster.cli(src, &["CLUSTER", "COUNTKEYSINSLOT", &m.slot.to_string()]),
        "1",
        "nothing written for the moved key"
    );
    assert_eq!(
        cluster.cli(dst, &["HGET", &moving[1], "t"]),
        moved_state,
        "nor where it lives"
    );

    // The new owner, asked without ASKING: the importing slot's key is refused, its own
    // key decided.
    let on_dst = [theirs[0].clone(), moving[1].clone()];
    let replies = cluster_batch(dst, &on_dst, &[take(1), take(1)]);
    assert_eq!(replies[0], Ok(vec![1, 9, 1_000_000, 0]));
    let e = replies[1].as_ref().expect_err("an importing slot's key");
    assert!(e.starts_with("ALONE "), "{e}");
    assert_eq!(
        cluster.cli(dst, &["HGET", &moving[1], "t"]),
        moved_state,
        "the importing key untouched"
    );
}
