//! The Lua side of the twin tests (`twins.rs`): each algorithm's script, its lease
//! script and the batch script called on one Redis for the whole test binary with the
//! arguments the daemon gives them (and the test-only explicit timestamp), and the state
//! a key holds, which a dry run must leave as it found it.

use crate::common::*;
use ratelimitd::algorithm::{self, leaky_bucket, token_bucket, Params, WindowParams};
use ratelimitd::algorithm::{fixed_window, sliding_window_counter, sliding_window_log};
use std::sync::OnceLock;

/// One Redis for the whole test binary (the harness kills it when the process exits).
pub(crate) fn redis() -> &'static RedisStandalone {
    static REDIS: OnceLock<RedisStandalone> = OnceLock::new();
    REDIS.get_or_init(RedisStandalone::start)
}

/// The script of `params` and its arguments, as `RedisStore::decide` builds them.
pub(crate) fn lua_call(params: &Params, cost: u64) -> (&'static str, Vec<String>) {
    let micro = format!("{:.0}", cost as f64 * algorithm::MICRO);
    let window = |w: &WindowParams| {
        vec![
            w.limit.to_string(),
            format!("{:.0}", w.window),
            cost.to_string(),
        ]
    };
    match params {
        Params::TokenBucket(p) => (
            token_bucket::SPEC.lua,
            vec![
                format!("{:.0}", p.capacity),
                p.refill_rate.to_string(),
                micro,
            ],
        ),
        Params::LeakyBucket(p) => (
            leaky_bucket::SPEC.lua,
            vec![format!("{:.0}", p.capacity), p.leak_rate.to_string(), micro],
        ),
        Params::FixedWindow(w) => (fixed_window::SPEC.lua, window(w)),
        Params::SlidingWindowLog(w) => (sliding_window_log::SPEC.lua, window(w)),
        Params::SlidingWindowCounter(w) => (sliding_window_counter::SPEC.lua, window(w)),
        Params::Concurrency(p) => (
            algorithm::concurrency::SPEC.lua,
            vec![
                p.limit.to_string(),
                format!("{:.0}", p.max_hold),
                cost.to_string(),
            ],
        ),
    }
}

/// The Lua twin's decision; `dry`: a dry run (ARGV[5] = "1"), which must reply the
/// same and write nothing that changes a later decision.
pub(crate) fn lua_decide(
    key: &str,
    params: &Params,
    cost: u64,
    now_us: u64,
    dry: bool,
) -> Vec<i64> {
    let (script, mut args) = lua_call(params, cost);
    args.push(now_us.to_string());
    if dry {
        args.push("1".to_string());
    }
    let mut cmd = vec!["EVAL", script, "1", key];
    cmd.extend(args.iter().map(String::as_str));
    redis_command(&redis().addr(), &cmd)
        .expect("EVAL")
        .into_ints()
}

/// The batch script's replies to the dry run then the decision of `cost` at `now_us`,
/// both on `key`, in one call, with a decision on another key between them: one unit
/// an hour later (its state then lies ahead of every later `now`, which its script
/// clamps to it), which neither may see.
pub(crate) fn lua_batch_decide(
    key: &str,
    params: &Params,
    cost: u64,
    now_us: u64,
) -> Vec<Vec<i64>> {
    let item = |cost: u64, now: u64, dry: &str| {
        let (_, mut args) = lua_call(params, cost);
        args.extend([now.to_string(), dry.to_string()]);
        let mut item = vec![(params.kind() as usize).to_string(), args.len().to_string()];
        item.extend(args);
        item
    };
    let later = now_us + 3_600_000_000;
    let items = [
        item(cost, now_us, "1"),
        item(1, later, "0"),
        item(cost, now_us, "0"),
    ];
    let script = ratelimitd::store::scripts::batch_lua();
    let other = format!("{key}:other");
    let mut cmd = vec!["EVAL", &script, "3", key, &other, key];
    cmd.extend(items.iter().flatten().map(String::as_str));
    match redis_command(&redis().addr(), &cmd).expect("EVAL batch") {
        Resp::Array(Some(items)) => items
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, r)| r.into_ints())
            .collect(),
        other => panic!("expected an array of replies, got {other:?}"),
    }
}

/// What a dry run at `now_us` must leave as it found it: the key's serialized value and
/// its expiry (for the sliding window log, the entries still in the window and, if
/// any, the expiry: a dry run may trim older ones, as the real call would, which
/// changes no decision).
pub(crate) fn state_of(key: &str, params: &Params, now_us: u64) -> String {
    let addr = redis().addr();
    let live = match params {
        Params::SlidingWindowLog(w) => {
            let after = format!("({:.0}", now_us as f64 - w.window);
            redis_command(&addr, &["ZRANGEBYSCORE", key, &after, "+inf", "WITHSCORES"])
        }
        _ => redis_command(&addr, &["DUMP", key]),
    };
    let live = live.expect("read");
    // A log trimmed of all its entries is gone, expiry and all: the same decisions.
    if live == Resp::Array(Some(vec![])) {
        return format!("{live:?}");
    }
    let expiry = redis_command(&addr, &["PEXPIRETIME", key]).expect("PEXPIRETIME");
    format!("{live:?} {expiry:?}")
}

/// The lease script of `params`' algorithm asked for no lease (a cold key's call): its
/// first four fields, or `None` for an algorithm without leases.
pub(crate) fn lua_lease_decide(
    key: &str,
    params: &Params,
    cost: u64,
    now_us: u64,
) -> Option<Vec<i64>> {
    let script = ratelimitd::store::scripts::lease_lua(params.kind())?;
    let (_, mut args) = lua_call(params, cost);
    let now = now_us.to_string();
    args.extend([now.as_str(), "twin", "0", "0", "0", "1000000", "0"].map(String::from));
    let mut cmd = vec!["EVAL", script, "1", key];
    cmd.extend(args.iter().map(String::as_str));
    let mut reply = redis_command(&redis().addr(), &cmd)
        .expect("EVAL")
        .into_ints();
    reply.truncate(4);
    Some(reply)
}
