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
//! same and leave the state as it found it. The calls of the Lua side are
//! in `twin_lua.rs`.

use crate::common;
use crate::reference;

use crate::twin_lua::{lua_batch_decide, lua_decide, lua_lease_decide, redis, state_of};
use common::*;
use proptest::prelude::*;
use ratelimitd::algorithm::{leaky_bucket, token_bucket, Params, WindowParams};
use reference::{Algo, Model};
use std::sync::atomic::{AtomicU64, Ordering};

// The other twin tests take it from here.
pub(crate) use crate::twin_lua::lua_call;

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
