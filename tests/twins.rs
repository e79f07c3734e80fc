//! The Rust algorithms and their Lua twins give the same answers: random traces (arrival
//! times, costs, parameters) go through `algorithm::token_bucket::decide` and through
//! `lua/token_bucket.lua` in a real Redis (with the test-only explicit timestamp), and
//! every field of every decision, and the stored state, must be identical.

mod common;

use common::*;
use proptest::prelude::*;
use ratelimitd::algorithm::token_bucket::{self, Params, State};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

const LUA: &str = include_str!("../lua/token_bucket.lua");

/// One Redis for the whole test binary (the harness kills it when the process exits).
fn redis() -> &'static RedisStandalone {
    static REDIS: OnceLock<RedisStandalone> = OnceLock::new();
    REDIS.get_or_init(RedisStandalone::start)
}

fn ints(resp: Resp) -> Vec<i64> {
    match resp {
        Resp::Array(Some(items)) => items
            .into_iter()
            .map(|i| match i {
                Resp::Int(n) => n,
                other => panic!("expected an integer, got {other:?}"),
            })
            .collect(),
        other => panic!("expected an array, got {other:?}"),
    }
}

fn lua_decide(key: &str, p: &Params, cost: u64, now_us: u64) -> Vec<i64> {
    let args = [
        format!("{:.0}", p.capacity),
        p.refill_rate.to_string(),
        format!("{:.0}", cost as f64 * token_bucket::MICRO),
        now_us.to_string(),
    ];
    let mut cmd = vec!["EVAL", LUA, "1", key];
    cmd.extend(args.iter().map(String::as_str));
    ints(redis_command(&redis().addr(), &cmd).expect("EVAL"))
}

fn lua_state(key: &str) -> Option<(String, String)> {
    let fields = redis_command(&redis().addr(), &["HMGET", key, "t", "ts"])
        .and_then(Resp::into_strings)
        .unwrap();
    (!fields[0].is_empty()).then(|| (fields[0].clone(), fields[1].clone()))
}

static CASE: AtomicU64 = AtomicU64::new(0);

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn token_bucket_rust_and_lua_agree(
        capacity in 1u64..=1000,
        rate_milli in 1u64..=2_000_000,
        hosts in 1u32..=5,
        start_s in 1_600_000_000u64..1_900_000_000,
        steps in proptest::collection::vec((0u64..2_000_000, 0u64..=1000), 1..40),
    ) {
        let params = Params::shared(capacity, rate_milli as f64 / 1000.0, hosts);
        let key = format!("twin:{{tb:{}}}", CASE.fetch_add(1, Ordering::Relaxed));
        let mut now = start_s * 1_000_000;
        let mut state: Option<State> = None;
        for (i, (dt, cost)) in steps.into_iter().enumerate() {
            now += dt;
            let cost = cost % (capacity + 1);
            let (o, new_state) = token_bucket::decide(state, now as f64, &params, cost);
            if new_state.is_some() {
                state = new_state;
            }
            let rust = vec![i64::from(o.allowed), o.remaining as i64, o.reset_ms as i64, o.wait_ms as i64];
            let lua = lua_decide(&key, &params, cost, now);
            prop_assert_eq!(&rust, &lua, "step {} cost {} params {:?}", i, cost, params);
            let stored = lua_state(&key);
            let expected = state.map(|s| (format!("{:.0}", s.tokens), format!("{:.0}", s.ts)));
            prop_assert_eq!(stored, expected, "stored state at step {}", i);
        }
    }
}
