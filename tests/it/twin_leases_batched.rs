//! Lease calls in the batch script (`lua/batch.lua`, each lease script there as a
//! function: src/store/batch_script.rs) against the lease script alone, on twin keys.
//! Random holders call on several keys at once: a cold key's call, a call asking for a
//! lease (paced or not), a give-back of the grant they hold with some of it spent, each
//! deciding a cost. Each step's calls go in one EVAL of the batch script, with a plain
//! decision on another key among them, and the same calls one EVAL each of the lease
//! script (and of the plain script) on the twins. Every reply must be the lone one,
//! field for field, and every key's hash (its state, leases, asks, shares, expiry) the
//! twin's after each step. On Redis Cluster the keys lie in several slots of one
//! primary, and a call on another primary's key in the batch is refused (`ALONE`),
//! nothing written for it.

use crate::cluster_batch::{keys_on, owners, shared};
use crate::common;
use crate::twins::lua_call;

use common::*;
use proptest::prelude::*;
use ratelimitd::algorithm::{token_bucket, Kind, Params, WindowParams};
use ratelimitd::lease::Request;
use ratelimitd::store::batch_script::lease_index;
use ratelimitd::store::scripts::{
    batch_lua, cluster_batch_lua, lease_args, lease_lua, lease_reply,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Lease keys per step (each with its twin), besides the plain decision's.
const KEYS: usize = 3;

/// One holder's view of a key, as a daemon keeps it (enough to name its grant back).
#[derive(Debug, Default, Clone, Copy)]
struct Holder {
    grant: i64,
    /// µ-units granted.
    units: u64,
    sent: u64,
    /// The key's last grant read, and when.
    seen: i64,
    seen_at: u64,
}

/// What a holder does at a step: (holder, what, cost, want in units, % of its lease
/// left unspent). `what`: 0–2 a cold call, 3–5 an ask, 6–7 a paced ask, 8–9 a
/// give-back alone (the sweep's).
type Act = (usize, u8, u64, u64, u64);

/// The call `act` makes at `now` as holder `h`'s [`Request`] and its arguments (as the
/// daemon sends them, with `now` explicit).
fn call(params: &Params, holders: &[Holder], act: Act, now: u64) -> (Request, Vec<String>) {
    let (h, what, cost, want, left) = act;
    let mine = holders[h];
    let unit = match params.kind() {
        Kind::TokenBucket => 1,
        _ => 1_000_000,
    };
    let mut req = Request::cold(&Arc::from(format!("h{h}")));
    req.mono_us = now;
    (req.seen, req.seen_at) = (mine.seen, mine.seen_at);
    if what >= 3 && mine.grant != 0 {
        req.given_back = mine.grant;
        req.unspent = mine.units * left / 100 / unit * unit;
        (req.grant_sent_us, req.grant_got_us) = (mine.sent, mine.sent);
    }
    if (3..8).contains(&what) {
        req.want = want * 1_000_000;
    }
    if (6..8).contains(&what) {
        (req.pace_us, req.lifetime_us) = (200_000, 2_000_000);
    }
    let mut args: Vec<String> = lease_args(params, cost as u32, &req)
        .into_iter()
        .map(|v| v.as_string().unwrap_or_default())
        .collect();
    args[3] = now.to_string();
    (req, args)
}

/// What holder `h` keeps of reply `r` to its call `req` sent at `now`.
fn keep(params: &Params, holders: &mut [Holder], h: usize, req: &Request, r: &[i64], now: u64) {
    let (_, granted) = lease_reply(params, r).expect("a lease reply");
    let mine = &mut holders[h];
    if granted.last_grant > mine.seen {
        (mine.seen, mine.seen_at) = (granted.last_grant, now);
    }
    if req.given_back != 0 || req.want > 0 {
        (mine.grant, mine.units, mine.sent) = (granted.grant, granted.units, now);
    }
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

/// EVAL of `script` on `key` with `args`: its integers, or its error's text.
fn eval(addr: &str, script: &str, key: &str, args: &[String]) -> Result<Vec<i64>, String> {
    let mut cmd = vec!["EVAL", script, "1", key];
    cmd.extend(args.iter().map(String::as_str));
    crate::cluster_batch_all::ints(redis_command(addr, &cmd).expect("EVAL"))
}

/// EVAL of the batch script on `addr` (the cluster's, keys in `ARGV`, when `cluster`)
/// with `calls` of (key, function index, arguments).
fn eval_batch(
    addr: &str,
    cluster: bool,
    calls: &[(String, usize, Vec<String>)],
) -> Vec<Result<Vec<i64>, String>> {
    let script = if cluster {
        cluster_batch_lua()
    } else {
        batch_lua()
    };
    let count = calls.len().to_string();
    let mut cmd: Vec<&str> = match cluster {
        true => vec!["EVAL", &script, "1", &calls[0].0, &count],
        false => vec!["EVAL", &script, &count],
    };
    cmd.extend(calls.iter().map(|c| c.0.as_str()));
    let heads: Vec<[String; 2]> = calls
        .iter()
        .map(|c| [c.1.to_string(), c.2.len().to_string()])
        .collect();
    for (c, head) in calls.iter().zip(&heads) {
        cmd.extend(head.iter().map(String::as_str));
        cmd.extend(c.2.iter().map(String::as_str));
    }
    match redis_command(addr, &cmd).expect("EVAL batch") {
        Resp::Array(Some(replies)) => replies
            .into_iter()
            .map(crate::cluster_batch_all::ints)
            .collect(),
        other => panic!("expected an array of replies, got {other:?}"),
    }
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// Where a case runs: the node, the batched keys and their twins (the last of each a
/// plain decision's), and (cluster) another primary's key.
struct Place {
    addr: String,
    cluster: bool,
    keys: Vec<String>,
    twins: Vec<String>,
    foreign: Option<String>,
    /// Its primary.
    away: Option<String>,
}

fn place(cluster: bool) -> Place {
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    if !cluster {
        let name = |what: &str, i: usize| format!("twin-batched:{{{case}:{what}{i}}}");
        return Place {
            addr: crate::twin_leases::redis().addr(),
            cluster,
            keys: (0..=KEYS).map(|i| name("b", i)).collect(),
            twins: (0..=KEYS).map(|i| name("a", i)).collect(),
            foreign: None,
            away: None,
        };
    }
    let addrs = shared().primary_addrs();
    let owners = owners(&addrs[0]);
    let (home, away) = (&addrs[case as usize % 3], &addrs[(case as usize + 1) % 3]);
    let keys = keys_on(&owners, home, &format!("lb{case}:"), KEYS + 1, &[]);
    let slots: Vec<usize> = keys.iter().map(|k| crate::cluster_batch::slot(k)).collect();
    Place {
        addr: home.clone(),
        cluster,
        twins: keys_on(&owners, home, &format!("la{case}:"), KEYS + 1, &slots),
        keys,
        foreign: keys_on(&owners, away, &format!("lf{case}:"), 1, &[]).pop(),
        away: Some(away.clone()),
    }
}

/// Runs `steps` (µs since the last, an act per key) on twin keys of `params`' lease
/// script, batched and alone (see the module's doc).
fn agree(params: Params, cluster: bool, steps: &[(u64, Vec<Act>)]) -> Result<(), TestCaseError> {
    let p = place(cluster);
    let kind = params.kind();
    let lone = lease_lua(kind).expect("a lease script");
    let mut holders = vec![[Holder::default(); 3]; KEYS];
    let mut now = 1_790_000_000_000_000u64 + steps.len() as u64 * 7919;
    for (i, (dt, acts)) in steps.iter().enumerate() {
        now += dt;
        let mut calls = Vec::new();
        let mut asked = Vec::new();
        for (k, act) in acts.iter().enumerate().take(KEYS) {
            let (req, args) = call(&params, &holders[k], *act, now);
            calls.push((p.keys[k].clone(), lease_index(kind), args.clone()));
            asked.push((req, args));
            if k == 0 {
                // A plain decision among the lease calls.
                let (_, mut plain) = lua_call(&params, act.2);
                plain.extend([now.to_string(), "0".into()]);
                calls.push((p.keys[KEYS].clone(), kind as usize, plain));
            }
        }
        if let Some(foreign) = &p.foreign {
            calls.insert(2, (foreign.clone(), lease_index(kind), asked[0].1.clone()));
        }
        let mut replies = eval_batch(&p.addr, p.cluster, &calls).into_iter();
        for (k, (req, args)) in asked.iter().enumerate() {
            let alone = eval(&p.addr, lone, &p.twins[k], args);
            let batched = replies.next().expect("a reply per call");
            prop_assert_eq!(&batched, &alone, "step {} key {} call {:?}", i, k, req);
            let r = alone.map_err(|e| TestCaseError::fail(format!("step {i} key {k}: {e}")))?;
            keep(&params, &mut holders[k], acts[k].0, req, &r, now);
            if k > 0 {
                continue;
            }
            let plain = &calls[1].2;
            let alone = eval(&p.addr, kind.spec().lua, &p.twins[KEYS], plain);
            prop_assert_eq!(
                replies.next().expect("the plain reply"),
                alone,
                "step {}",
                i
            );
            if p.foreign.is_some() {
                let refused = replies.next().expect("the foreign reply");
                let text = refused.as_ref().err().cloned().unwrap_or_default();
                prop_assert!(
                    text.starts_with("ALONE "),
                    "another primary's key: {:?}",
                    refused
                );
            }
        }
        for (key, twin) in p.keys.iter().zip(&p.twins) {
            prop_assert_eq!(
                hash(&p.addr, key),
                hash(&p.addr, twin),
                "step {} key {}",
                i,
                key
            );
        }
    }
    if let Some((foreign, away)) = p.foreign.as_ref().zip(p.away.as_ref()) {
        let written = redis_text(away, &["EXISTS", foreign]).ok();
        prop_assert_eq!(written.as_deref(), Some("0"), "the refused key");
    }
    Ok(())
}

/// Steps of (gap µs, an act for each key).
fn steps() -> impl Strategy<Value = Vec<(u64, Vec<Act>)>> {
    let act = (0usize..3, 0u8..10, 0u64..4, 1u64..40, 0u64..=100);
    proptest::collection::vec(
        (
            prop_oneof![Just(0u64), 0..400_000u64, 0..5_000u64],
            proptest::collection::vec(act, KEYS),
        ),
        1..25,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn a_batched_token_bucket_lease_call_is_its_lone_call(
        capacity in 1u64..=60, rate in crate::twins::rate(), cluster in any::<bool>(),
        steps in steps(),
    ) {
        let p = Params::TokenBucket(token_bucket::Params::shared(capacity, rate, 1));
        agree(p, cluster, &steps)?;
    }

    #[test]
    fn a_batched_fixed_window_lease_call_is_its_lone_call(
        limit in 1u64..=60, window in prop::sample::select(vec![100u64, 1000, 7000]),
        cluster in any::<bool>(), steps in steps(),
    ) {
        let p = Params::FixedWindow(WindowParams::shared(limit, window, 1));
        agree(p, cluster, &steps)?;
    }

    #[test]
    fn a_batched_sliding_window_counter_lease_call_is_its_lone_call(
        limit in 1u64..=60, window in prop::sample::select(vec![100u64, 1000, 7000]),
        cluster in any::<bool>(), steps in steps(),
    ) {
        let p = Params::SlidingWindowCounter(WindowParams::shared(limit, window, 1));
        agree(p, cluster, &steps)?;
    }
}
