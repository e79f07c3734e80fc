//! Redis Cluster all-or-nothing groups sent per primary in one EVALSHA of the
//! all-or-nothing batch script (`lua/all.lua`, `lua/all_batch.lua`,
//! `#!lua flags=allow-cross-slot-keys`).
//!
//! * The batch decides each group exactly as the all-or-nothing script of that group
//!   alone does (on twin keys), and both exactly as the reference model does: every key
//!   allowed, then every key taken (its instant returned); else nothing taken and every
//!   key's reply the model's for its cost at that instant.
//! * A group one of whose keys is another primary's is refused (`ALONE …`) and takes
//!   nothing, even from its key that was taken before the refused one.

use crate::cluster_batch::{keys_on, owners};
use crate::common;
use crate::reference;
use crate::twins::{lua_call, model_of};

use common::*;
use ratelimitd::algorithm::{token_bucket, Params, WindowParams};
use reference::Model;

/// One decision's item of a group: algorithm index, argument count, the arguments of
/// its own script with an explicit `now`.
pub(crate) fn item(params: &Params, cost: u64, now_us: u64) -> Vec<String> {
    let (_, mut args) = lua_call(params, cost);
    args.push(now_us.to_string());
    let mut item = vec![(params.kind() as usize).to_string(), args.len().to_string()];
    item.extend(args);
    item
}

/// A reply read as integers, or the error text.
pub(crate) fn ints(r: Resp) -> Result<Vec<i64>, String> {
    match r {
        Resp::Array(Some(v)) => Ok(v
            .into_iter()
            .map(|i| match i {
                Resp::Int(n) => n,
                other => panic!("expected an integer, got {other:?}"),
            })
            .collect()),
        other => Err(other.into_text().unwrap_or_else(|e| e.to_string())),
    }
}

/// EVAL of the all-or-nothing batch script on `addr`: `groups` of (keys, items); the
/// cluster's form (one routing key, the keys in ARGV) when `cluster`, else standalone's.
pub(crate) fn batch_eval(
    addr: &str,
    groups: &[(Vec<String>, Vec<Vec<String>>)],
    cluster: bool,
) -> Vec<Result<Vec<i64>, String>> {
    let script = ratelimitd::store::multi::all_batch_lua(cluster);
    let keys: Vec<&str> = groups
        .iter()
        .flat_map(|(k, _)| k.iter().map(String::as_str))
        .collect();
    let count = keys.len().to_string();
    let mut cmd: Vec<&str> = if cluster {
        vec!["EVAL", &script, "1", keys[0], &count]
    } else {
        vec!["EVAL", &script, &count]
    };
    cmd.extend(keys.iter().copied());
    let sizes: Vec<String> = groups.iter().map(|(k, _)| k.len().to_string()).collect();
    for ((_, items), size) in groups.iter().zip(&sizes) {
        cmd.push(size);
        cmd.extend(items.iter().flatten().map(String::as_str));
    }
    match redis_command(addr, &cmd).expect("EVAL all-or-nothing batch") {
        Resp::Array(Some(replies)) => replies.into_iter().map(ints).collect(),
        other => panic!("expected an array of replies, got {other:?}"),
    }
}

/// Asserts that group `g` of a batch at `step` (its `costs`) got `want` both alone
/// (`lone`) and batched (`reply`).
pub(crate) fn assert_group(
    lone: Result<Vec<i64>, String>,
    reply: Result<Vec<i64>, String>,
    want: Vec<i64>,
    (g, step, costs): (usize, usize, &[u64]),
) {
    assert_eq!(
        lone,
        Ok(want.clone()),
        "alone: group {g}, step {step}, costs {costs:?}"
    );
    assert_eq!(
        reply,
        Ok(want),
        "batched: group {g}, step {step}, costs {costs:?}"
    );
}

/// EVAL of the all-or-nothing script of one group on `addr`.
pub(crate) fn alone(
    addr: &str,
    keys: &[String],
    items: &[Vec<String>],
) -> Result<Vec<i64>, String> {
    let script = ratelimitd::store::multi::all_lua();
    let n = keys.len().to_string();
    let mut cmd: Vec<&str> = vec!["EVAL", &script, &n];
    cmd.extend(keys.iter().map(String::as_str));
    cmd.extend(items.iter().flatten().map(String::as_str));
    ints(redis_command(addr, &cmd).expect("EVAL all-or-nothing"))
}

/// The expected reply of a group: every model allowed at its cost, then each taken (its
/// instant returned); else none, each reported as its dry run.
pub(crate) fn expected(models: &mut [Model], costs: &[u64], now: u64) -> Vec<i64> {
    let mut tried: Vec<Model> = models.to_vec();
    let fields: Vec<[i64; 4]> = tried
        .iter_mut()
        .zip(costs)
        .map(|(m, &c)| m.decide(now as f64, c))
        .collect();
    let all = fields.iter().all(|f| f[0] == 1);
    if all {
        models.clone_from_slice(&tried);
    }
    let at = if all { now as i64 } else { 0 };
    fields
        .iter()
        .flat_map(|f| [f[0], f[1], f[2], f[3], at, 0, 0, 0])
        .collect()
}

#[test]
fn a_batch_of_groups_decides_each_group_as_alone() {
    const GROUPS: usize = 4;
    let cluster = RedisCluster::start();
    let addrs = cluster.primary_addrs();
    let owners = owners(&addrs[0]);
    let (home, away) = (&addrs[0], &addrs[1]);
    // Integer refill rates: a take given back within one instant restores the bucket
    // exactly, as the model (which never took) holds it.
    let shapes = [
        Params::TokenBucket(token_bucket::Params::shared(5, 2.0, 1)),
        Params::FixedWindow(WindowParams::shared(4, 1000, 1)),
    ];
    let limits = [5u64, 4];
    // Per group, twin keys: set A decided alone, set B in the batch; both in one slot.
    let tags = keys_on(&owners, home, "group", 2 * GROUPS, &[]);
    let in_slot = |tag: &str| -> Vec<String> {
        let base = tag.trim_end_matches(":tb");
        vec![format!("{base}:tb"), format!("{base}:fw")]
    };
    let a: Vec<Vec<String>> = tags[..GROUPS].iter().map(|t| in_slot(t)).collect();
    let b: Vec<Vec<String>> = tags[GROUPS..].iter().map(|t| in_slot(t)).collect();
    let foreign = keys_on(&owners, away, "away", 1, &[]).remove(0);
    let lonely = keys_on(&owners, home, "lonely", 1, &[]).remove(0);
    let mut models: Vec<Vec<Model>> = (0..GROUPS)
        .map(|_| shapes.iter().map(|p| Model::new(model_of(p))).collect())
        .collect();
    let mut now: u64 = 1_700_000_000_000_000;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |m: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % m
    };
    let (mut allowed, mut denied) = (0, 0);
    for step in 0..60 {
        now += next(400_000);
        let costs: Vec<Vec<u64>> = (0..GROUPS)
            .map(|_| limits.iter().map(|&l| next(l + 1).min(next(3))).collect())
            .collect();
        let items = |g: usize| -> Vec<Vec<String>> {
            shapes
                .iter()
                .zip(&costs[g])
                .map(|(p, &c)| item(p, c, now))
                .collect()
        };
        let mut groups: Vec<(Vec<String>, Vec<Vec<String>>)> =
            (0..GROUPS).map(|g| (b[g].clone(), items(g))).collect();
        // A group of a key of this primary, then another primary's key.
        groups.insert(
            1,
            (
                vec![lonely.clone(), foreign.clone()],
                vec![item(&shapes[0], 1, now), item(&shapes[0], 1, now)],
            ),
        );
        let replies = batch_eval(home, &groups, true);
        assert_eq!(replies.len(), GROUPS + 1);
        let refused = replies[1]
            .as_ref()
            .err()
            .is_some_and(|e| e.starts_with("ALONE ") && e.contains("non local key"));
        assert!(refused, "another primary's key: {:?}", replies[1]);
        let replies: Vec<_> = replies
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .collect();
        for (g, (_, reply)) in replies.into_iter().enumerate() {
            let want = expected(&mut models[g], &costs[g], now);
            if want[0] == 1 && want[8] == 1 {
                allowed += 1;
            } else {
                denied += 1;
            }
            let lone = alone(home, &a[g], &items(g));
            assert_group(lone, reply, want, (g, step, &costs[g]));
        }
    }
    // Both sides were exercised.
    assert!(
        allowed >= 20 && denied >= 20,
        "allowed {allowed}, denied {denied}"
    );
    // The refused group's own key took nothing: its bucket is still full.
    let full = alone(
        home,
        std::slice::from_ref(&lonely),
        &[item(&shapes[0], 0, now)],
    );
    assert_eq!(
        full.map(|r| r[1]),
        Ok(5),
        "the refused group's key was given back"
    );
}
