//! The three implementations of each algorithm agree: random traces (arrival times,
//! costs, parameters, host shares) go through
//! * the reference model (`tests/reference`, written from docs/ALGORITHMS.md "Definitions", searching
//!   `wait_ms`/`reset_ms` instead of solving them),
//! * the Rust twin (`ratelimitd::algorithm`, as `mode = "none"` and the fallback run it),
//! * the Lua script (`lua/*.lua`) in a real Redis, with the test-only explicit timestamp,
//! * for the algorithms that take leases, the lease script (`lua/lease_*.lua`) asking for
//!   no lease (the per-request call of a cold key under `lease = "auto"`),
//! * the batch script (`lua/batch.lua`, a standalone Redis's decisions sent together),
//!   running the dry run and the decision one after the other in one call,
//!
//! and every field of every decision must be identical. Each Lua decision is preceded
//! by a dry run of the same request (the deny cache's refresh), which must reply the
//! same and leave the state as it found it.

use crate::common;
use crate::reference;

use common::*;
use proptest::prelude::*;
use ratelimitd::algorithm::{self, leaky_bucket, token_bucket, Params, WindowParams};
use ratelimitd::algorithm::{fixed_window, sliding_window_counter, sliding_window_log};
use reference::{Algo, Model};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// One Redis for the whole test binary (the harness kills it when the process exits).
fn redis() -> &'static RedisStandalone {
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
fn lua_decide(key: &str, params: &Params, cost: u64, now_us: u64, dry: bool) -> Vec<i64> {
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
fn lua_batch_decide(key: &str, params: &Params, cost: u64, now_us: u64) -> Vec<Vec<i64>> {
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
fn state_of(key: &str, params: &Params, now_us: u64) -> String {
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
fn lua_lease_decide(key: &str, params: &Params, cost: u64, now_us: u64) -> Option<Vec<i64>> {
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

/// The reference model's view of `params`.
pub(crate) fn model_of(params: &Params) -> Algo {
    match *params {
        Params::TokenBucket(p) => Algo::TokenBucket {
            cap: p.capacity,
            rate: p.refill_rate,
        },
        Params::LeakyBucket(p) => Algo::LeakyBucket {
            cap: p.capacity,
            rate: p.leak_rate,
        },
        Params::FixedWindow(w) => Algo::FixedWindow {
            limit: w.limit,
            window: w.window,
        },
        Params::SlidingWindowLog(w) => Algo::SlidingWindowLog {
            limit: w.limit,
            window: w.window,
        },
        Params::SlidingWindowCounter(w) => Algo::SlidingWindowCounter {
            limit: w.limit,
            window: w.window,
        },
        // Its slots are taken and given back by name: its own traces, twin_slots.rs.
        Params::Concurrency(_) => unreachable!("concurrency: see tests/it/twin_slots.rs"),
    }
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// Runs one trace through the three implementations; `steps` are (µs since the
/// previous request, cost); costs go up to the rule's whole `limit` (the daemon refuses
/// more), which may exceed a host's share: such requests can never pass.
fn agree(
    params: Params,
    limit: u64,
    start_us: u64,
    steps: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let key = format!("twin:{{{}}}", CASE.fetch_add(1, Ordering::Relaxed));
    let mut model = Model::new(model_of(&params));
    let mut state = None;
    let mut now = start_us;
    for (i, &(dt, cost)) in steps.iter().enumerate() {
        now += dt;
        let cost = cost % (limit + 1);
        let expected = model.decide(now as f64, cost).to_vec();
        let o = params.decide(&mut state, now as f64, cost);
        let rust = vec![
            i64::from(o.allowed),
            o.remaining as i64,
            o.reset_ms as i64,
            o.wait_ms as i64,
        ];
        // A dry run first: it leaves the state as it found it, and the real call after
        // it must still agree with the model.
        let before = state_of(&key, &params, now);
        let peek = lua_decide(&key, &params, cost, now, true);
        prop_assert_eq!(
            &state_of(&key, &params, now),
            &before,
            "the dry run wrote, step {} cost {} at {} µs, {:?}",
            i,
            cost,
            now,
            params
        );
        let lua = lua_decide(&key, &params, cost, now, false);
        if let Some(leased) = lua_lease_decide(&format!("{key}:lease"), &params, cost, now) {
            prop_assert_eq!(
                &leased,
                &expected,
                "lease script (no lease) vs model, step {} cost {} at {} µs, {:?}",
                i,
                cost,
                now,
                params
            );
        }
        let batch = lua_batch_decide(&format!("{key}:batch"), &params, cost, now);
        prop_assert_eq!(
            &batch,
            &vec![expected.clone(), expected.clone()],
            "batch script (dry run, decision) vs model, step {} cost {} at {} µs, {:?}",
            i,
            cost,
            now,
            params
        );
        prop_assert_eq!(
            &rust,
            &expected,
            "Rust twin vs model, step {} cost {} at {} µs, {:?}",
            i,
            cost,
            now,
            params
        );
        prop_assert_eq!(
            &lua,
            &expected,
            "Lua twin vs model, step {} cost {} at {} µs, {:?}",
            i,
            cost,
            now,
            params
        );
        prop_assert_eq!(
            &peek,
            &expected,
            "Lua dry run vs model, step {} cost {} at {} µs, {:?}",
            i,
            cost,
            now,
            params
        );
    }
    Ok(())
}

/// Start instants: realistic epoch µs, anywhere within a second.
pub(crate) fn start() -> impl Strategy<Value = u64> {
    1_600_000_000_000_000u64..1_900_000_000_000_000
}

/// Rates (units/s): mostly 0.001–2000, sometimes down to the slowest the config takes
/// (10⁻⁶/s), where a floored refill is worth seconds.
pub(crate) fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => (1u64..=2_000_000).prop_map(|m| m as f64 / 1000.0),
        1 => (1u64..=1000).prop_map(|u| u as f64 / 1_000_000.0),
    ]
}

/// Window lengths (ms): short random ones, and the usual round ones.
fn window_ms() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..=3000,
        Just(1000u64),
        Just(60_000u64),
        Just(3_600_000u64)
    ]
}

fn steps(max_gap_us: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    proptest::collection::vec(
        (
            prop_oneof![Just(0u64), 0..max_gap_us, 0..max_gap_us / 20 + 1],
            0u64..=1000,
        ),
        1..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn token_bucket(
        capacity in 1u64..=100, rate in rate(), hosts in 1u32..=4,
        start in start(), steps in steps(3_000_000),
    ) {
        let p = Params::TokenBucket(token_bucket::Params::shared(capacity, rate, hosts));
        agree(p, capacity, start, &steps)?;
    }

    #[test]
    fn leaky_bucket(
        capacity in 1u64..=100, rate in rate(), hosts in 1u32..=4,
        start in start(), steps in steps(3_000_000),
    ) {
        let p = Params::LeakyBucket(leaky_bucket::Params::shared(capacity, rate, hosts));
        agree(p, capacity, start, &steps)?;
    }

    #[test]
    fn fixed_window(
        limit in 1u64..=50, window in window_ms(), hosts in 1u32..=4,
        start in start(), steps in steps(4_000_000),
    ) {
        let p = Params::FixedWindow(WindowParams::shared(limit, window, hosts));
        agree(p, limit, start, &steps)?;
    }

    #[test]
    fn sliding_window_log(
        limit in 1u64..=50, window in window_ms(), hosts in 1u32..=4,
        start in start(), steps in steps(4_000_000),
    ) {
        let p = Params::SlidingWindowLog(WindowParams::shared(limit, window, hosts));
        agree(p, limit, start, &steps)?;
    }

    #[test]
    fn sliding_window_counter(
        limit in 1u64..=50, window in window_ms(), hosts in 1u32..=4,
        start in start(), steps in steps(4_000_000),
    ) {
        let p = Params::SlidingWindowCounter(WindowParams::shared(limit, window, hosts));
        agree(p, limit, start, &steps)?;
    }
}

/// A sliding window log of the earlier format (members `"<µs>:<units>"`, no running
/// totals) is rewritten by the first call, a dry run included, and keeps its TTL.
#[test]
fn a_legacy_log_is_rewritten_by_a_dry_run_and_keeps_its_ttl() {
    let addr = redis().addr();
    let key = "twin:{legacy}";
    let now = 1_700_000_000_000_000u64;
    // One member: removed before its rewrite was added, the key would go, TTL and all.
    let a = (now - 2_000).to_string();
    let ma = format!("{a}:2");
    redis_command(&addr, &["ZADD", key, &a, &ma]).expect("ZADD");
    redis_command(&addr, &["PEXPIRE", key, "60000"]).expect("PEXPIRE");
    // 5 per 1 s; 2 units logged in the window: a cost of 1 fits, leaving 2.
    let p = Params::SlidingWindowLog(WindowParams::shared(5, 1000, 1));
    let peek = lua_decide(key, &p, 1, now, true);
    assert_eq!(&peek[..2], &[1, 2], "dry run {peek:?}");
    let members = redis_command(&addr, &["ZRANGE", key, "0", "-1"]).expect("ZRANGE");
    let rewritten = format!("{a}:2:0:2").into_bytes();
    assert_eq!(
        members,
        Resp::Array(Some(vec![Resp::Bulk(Some(rewritten))])),
        "rewritten with its running total, nothing admitted"
    );
    let pttl = redis_text(&addr, &["PTTL", key]).expect("PTTL");
    assert!(pttl.parse::<i64>().unwrap_or(-1) > 0, "PTTL {pttl}");
    assert_eq!(lua_decide(key, &p, 1, now, false), peek, "the real call");
}

/// The prelude's `digits()`, which every stored number goes through: whole numbers take
/// the integer conversion, fractions and numbers past 2^53 keep `%.0f` (rounded half to
/// even, no exponent).
#[test]
fn stored_numbers_keep_every_digit() {
    let script = format!(
        "{}\nreturn {{digits(5), digits(1700000000123456), digits(2.5), digits(3.5), \
         digits(33333333.4), digits(1e17), digits(1e21)}}",
        include_str!("../../lua/prelude.lua")
    );
    let reply = redis_command(&redis().addr(), &["EVAL", &script, "0"]).expect("EVAL");
    let texts: Vec<String> = match reply {
        Resp::Array(Some(items)) => items
            .into_iter()
            .map(|i| i.into_text().expect("text"))
            .collect(),
        other => panic!("expected an array, got {other:?}"),
    };
    assert_eq!(
        texts,
        [
            "5",
            "1700000000123456",
            "2",
            "4",
            "33333333",
            "100000000000000000",
            "1000000000000000000000"
        ]
    );
}
