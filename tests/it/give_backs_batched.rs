//! Give-backs (`REFUND`, the undo of a reservation) in the all-or-nothing batch script
//! (`lua/all_batch.lua` with `lua/give_back_keys.lua`) against the give-back script
//! alone, on twin keys.
//!
//! * Random give-backs (a refund, or an undo pinned to the reservation's instant) to
//!   groups of keys of one slot, of four algorithms, go in one EVAL of the batch with an
//!   all-or-nothing group among them, and each one EVAL of the give-back script on the
//!   twins: every reply must be the lone one and every key's hash the twin's. The keys'
//!   states lie an hour ahead of Redis's clock, which the give-backs (at Redis's `TIME`)
//!   are clamped to, so that both sides give back at the same instant. Standalone and
//!   Redis Cluster (groups in several slots of one primary, and another primary's group
//!   refused: `ALONE`, nothing written).
//! * In a migrating slot, a give-back to a key still on the old owner and one already
//!   moved is refused whole (`ALONE`): the key still there is given nothing back, as
//!   the give-back script alone is refused there (`TRYAGAIN`); a give-back to the key
//!   still there alone, and one of a stable slot, are given back.

use crate::cluster_batch::{keys_in_slot, keys_on, owners, shared, slot, Migration};
use crate::cluster_batch_all::{ints, item};
use crate::common;
use crate::twins::lua_call;

use common::*;
use proptest::prelude::*;
use ratelimitd::algorithm::{leaky_bucket, token_bucket, Params, WindowParams};
use ratelimitd::store::multi::{all_batch_lua, give_back_args, give_back_lua};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The suffixes of a group's keys (one slot: the hash tag is the same), one per
/// algorithm of [`shapes`].
const SUFFIXES: [&str; 4] = [":tb", ":lb", ":fw", ":swc"];

/// A token bucket, a leaky bucket, a fixed window and a sliding window counter, each
/// of `limit` per second.
fn shapes(limit: u64) -> [Params; 4] {
    [
        Params::TokenBucket(token_bucket::Params::shared(limit, limit as f64, 1)),
        Params::LeakyBucket(leaky_bucket::Params::shared(limit, limit as f64, 1)),
        Params::FixedWindow(WindowParams::shared(limit, 1000, 1)),
        Params::SlidingWindowCounter(WindowParams::shared(limit, 1000, 1)),
    ]
}

/// One group of an all-or-nothing batch: its header (a group's count of keys, or minus
/// a give-back's), its keys and their items.
type Group = (i64, Vec<String>, Vec<Vec<String>>);

/// EVAL of the all-or-nothing batch script on `addr` (the cluster's when `cluster`).
fn batch(addr: &str, groups: &[Group], cluster: bool) -> Vec<Result<Vec<i64>, String>> {
    let script = all_batch_lua(cluster);
    let keys: Vec<&str> = groups
        .iter()
        .flat_map(|g| g.1.iter().map(String::as_str))
        .collect();
    let count = keys.len().to_string();
    let mut cmd: Vec<&str> = match cluster {
        true => vec!["EVAL", &script, "1", keys[0], &count],
        false => vec!["EVAL", &script, &count],
    };
    cmd.extend(keys.iter().copied());
    let heads: Vec<String> = groups.iter().map(|g| g.0.to_string()).collect();
    for (g, head) in groups.iter().zip(&heads) {
        cmd.push(head);
        cmd.extend(g.2.iter().flatten().map(String::as_str));
    }
    match redis_command(addr, &cmd).expect("EVAL all-or-nothing batch") {
        Resp::Array(Some(replies)) => replies.into_iter().map(ints).collect(),
        other => panic!("expected an array of replies, got {other:?}"),
    }
}

/// EVAL of the give-back script on `addr` for `keys` (one slot) and their `items`.
fn give_back_alone(addr: &str, keys: &[String], items: &[Vec<String>]) -> Result<Vec<i64>, String> {
    let script = give_back_lua();
    let n = keys.len().to_string();
    let mut cmd: Vec<&str> = vec!["EVAL", &script, &n];
    cmd.extend(keys.iter().map(String::as_str));
    cmd.extend(items.iter().flatten().map(String::as_str));
    ints(redis_command(addr, &cmd).expect("EVAL give-back"))
}

/// A give-back's item: `units` of `params`, an undo of the reservation at `at` or a
/// refund, as the daemon sends it.
fn gift(params: &Params, units: u32, at: Option<i64>) -> Vec<String> {
    give_back_args(&[(*params, units, at)])
        .into_iter()
        .map(|v| v.as_string().unwrap_or_default())
        .collect()
}

/// Takes `cost` of `key` with `params`' own script at `now` (µs, explicit).
fn take(addr: &str, key: &str, params: &Params, cost: u64, now: u64) {
    let (script, mut args) = lua_call(params, cost);
    args.push(now.to_string());
    let mut cmd = vec!["EVAL", script, "1", key];
    cmd.extend(args.iter().map(String::as_str));
    redis_command(addr, &cmd).expect("EVAL take");
}

/// A key's hash, field by field.
fn hash(addr: &str, key: &str) -> BTreeMap<String, String> {
    let flat = redis_command(addr, &["HGETALL", key])
        .and_then(Resp::into_strings)
        .expect("HGETALL");
    flat.chunks(2)
        .map(|kv| (kv[0].clone(), kv[1].clone()))
        .collect()
}

/// An hour ahead of Redis's clock, µs: a state stored then holds the give-backs (at
/// Redis's `TIME`) to its instant.
fn ahead() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock")
        .as_micros() as u64;
    now + 3_600_000_000
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// The keys of a group of `n` keys (the first `n` algorithms) under `tag`.
fn group_keys(tag: &str, n: usize) -> Vec<String> {
    SUFFIXES[..n].iter().map(|s| format!("{tag}{s}")).collect()
}

/// A case: per group, how many keys (1..=4) and per key (cost taken, units given back,
/// an undo or a refund).
type Case = Vec<(usize, Vec<(u64, u32, bool)>)>;

fn agree(limit: u64, cluster: bool, case: &Case) -> Result<(), TestCaseError> {
    let n = CASE.fetch_add(1, Ordering::Relaxed);
    let shapes = shapes(limit);
    let (addr, tags, away) = if cluster {
        let addrs = shared().primary_addrs();
        let owners = owners(&addrs[0]);
        let home = addrs[n as usize % 3].clone();
        let away = &addrs[(n as usize + 1) % 3];
        let tags = keys_on(&owners, &home, &format!("gb{n}:"), 2 * case.len() + 1, &[]);
        let tags: Vec<String> = tags
            .iter()
            .map(|t| t.trim_end_matches(":tb").to_string())
            .collect();
        let foreign = keys_on(&owners, away, &format!("gf{n}:"), 1, &[]).remove(0);
        (home, tags, Some((away.clone(), foreign)))
    } else {
        let tags = (0..2 * case.len() + 1)
            .map(|i| format!("gb:{{{n}:{i}}}"))
            .collect();
        (crate::twin_leases::redis().addr(), tags, None)
    };
    let now = ahead() + n * 7919;
    let mut groups: Vec<Group> = Vec::new();
    // Per give-back: its batched keys, their twins, their items.
    let mut twins: Vec<[Vec<Vec<String>>; 2]> = Vec::new();
    for (g, (size, keys)) in case.iter().enumerate() {
        let (batched, twin) = (
            group_keys(&tags[2 * g], *size),
            group_keys(&tags[2 * g + 1], *size),
        );
        let mut items = Vec::new();
        for (i, &(cost, units, undo)) in keys.iter().enumerate().take(*size) {
            take(&addr, &batched[i], &shapes[i], cost % (limit + 1), now);
            take(&addr, &twin[i], &shapes[i], cost % (limit + 1), now);
            items.push(gift(&shapes[i], units, undo.then_some(now as i64)));
        }
        groups.push((-(*size as i64), batched.clone(), items.clone()));
        twins.push([vec![batched, twin], items]);
    }
    // An all-or-nothing group among the give-backs: one key, taken at once.
    let lone_key = format!("{}:tb", tags[2 * case.len()]);
    groups.insert(
        1,
        (1, vec![lone_key.clone()], vec![item(&shapes[0], 1, now)]),
    );
    if let Some((_, foreign)) = &away {
        let refused = (-1, vec![foreign.clone()], vec![gift(&shapes[0], 1, None)]);
        groups.insert(2, refused);
    }
    let mut replies = batch(&addr, &groups, cluster).into_iter();
    for (g, [keys, items]) in twins.iter().enumerate() {
        let (batched, twin) = (&keys[0], &keys[1]);
        let lone = give_back_alone(&addr, twin, items);
        prop_assert!(lone.is_ok(), "group {}: {:?}", g, lone);
        prop_assert_eq!(
            replies.next().expect("a reply"),
            lone,
            "group {} {:?}",
            g,
            case[g]
        );
        if g == 0 {
            let taken = replies.next().expect("the group's reply");
            prop_assert_eq!(taken.map(|r| r[0]), Ok(1), "the all-or-nothing group");
            if away.is_some() {
                let refused = replies.next().expect("the foreign reply");
                let text = refused.as_ref().err().cloned().unwrap_or_default();
                prop_assert!(
                    text.starts_with("ALONE "),
                    "another primary's key: {:?}",
                    refused
                );
            }
        }
        for (key, twin) in batched.iter().zip(twin) {
            prop_assert_eq!(
                hash(&addr, key),
                hash(&addr, twin),
                "group {} key {}",
                g,
                key
            );
        }
    }
    if let Some((away, foreign)) = &away {
        let written = redis_text(away, &["EXISTS", foreign]).ok();
        prop_assert_eq!(written.as_deref(), Some("0"), "the refused key");
    }
    Ok(())
}

fn case() -> impl Strategy<Value = Case> {
    let key = (0u64..20, 0u32..25, any::<bool>());
    proptest::collection::vec((1usize..=4, proptest::collection::vec(key, 4)), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn a_batched_give_back_is_the_give_back_script_alone(
        limit in 1u64..=20, cluster in any::<bool>(), case in case(),
    ) {
        agree(limit, cluster, &case)?;
    }
}

#[test]
fn a_give_back_with_a_key_the_node_cannot_vouch_for_gives_nothing_back() {
    let cluster = RedisCluster::start();
    let addrs = cluster.primary_addrs();
    let (src, dst) = (&addrs[0], &addrs[1]);
    let owners = owners(src);
    let stable = keys_on(&owners, src, "stay", 1, &[]).remove(0);
    let moving_slot = slot(&keys_on(&owners, src, "mv", 1, &[slot(&stable)])[0]);
    let moving = keys_in_slot(moving_slot, "mv", 2);
    let tb = Params::TokenBucket(token_bucket::Params::shared(10, 0.001, 1));
    let now = ahead();
    for key in [&stable, &moving[0], &moving[1]] {
        take(src, key, &tb, 6, now);
    }
    let tokens = |addr: &str, key: &str| hash(addr, key).get("t").cloned().unwrap_or_default();
    let before = tokens(src, &moving[0]);
    let m = Migration::start(&cluster, moving_slot, dst);
    m.migrate(&cluster, &moving[1..]);
    let both = (
        -2,
        moving.clone(),
        vec![gift(&tb, 3, None), gift(&tb, 3, None)],
    );
    let one = (-1, vec![moving[0].clone()], vec![gift(&tb, 2, None)]);
    let home = (-1, vec![stable.clone()], vec![gift(&tb, 2, None)]);
    let replies = batch(src, &[home, both, one], true);
    eprintln!("slot {moving_slot} migrating {src} -> {dst}: {replies:?}");
    assert_eq!(
        replies[0].as_ref().map(|r| r[1]),
        Ok(6),
        "a stable key: 4 + 2"
    );
    let e = replies[1].as_ref().expect_err("a key already moved");
    assert!(e.starts_with("ALONE "), "{e}");
    assert_eq!(
        replies[2].as_ref().map(|r| r[1]),
        Ok(6),
        "the key still here alone"
    );
    let after: f64 = tokens(src, &moving[0]).parse().expect("tokens");
    let was: f64 = before.parse().expect("tokens");
    assert_eq!(after - was, 2e6, "only the give-back of the key alone");
    // The give-back script alone is refused there too, before it runs.
    let lone = give_back_alone(src, &moving, &[gift(&tb, 3, None), gift(&tb, 3, None)]);
    let e = lone.expect_err("refused alone");
    assert!(e.contains("TRYAGAIN") || e.contains("ASK"), "{e}");
    m.finish(&cluster);
}
