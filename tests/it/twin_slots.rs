//! The three implementations of `concurrency` agree: random traces of `ACQUIRE`s,
//! `RELEASE`s (of held, given-back and never-issued tokens), renewals and time passing
//! go through the reference model (`tests/reference/slots.rs`), the Rust twin
//! (`ratelimitd::algorithm::concurrency`, as the local fallback and `mode = "none"`
//! run it) and the Lua script (`lua/concurrency.lua`) in a real Redis with the
//! test-only explicit timestamp; every field of every answer must be identical, the
//! slot's `max_hold` end included.

use crate::common::*;
use crate::reference::slots::SlotsModel;
use proptest::prelude::*;
use ratelimitd::algorithm::concurrency::{self, State};
use ratelimitd::algorithm::{Per, Shape};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

fn redis() -> &'static RedisStandalone {
    static REDIS: OnceLock<RedisStandalone> = OnceLock::new();
    REDIS.get_or_init(RedisStandalone::start)
}

/// One call of the script: operation `op` with `args` at `now` µs.
fn lua(
    key: &str,
    p: &concurrency::Params,
    lease: f64,
    op: &str,
    now: u64,
    args: &[String],
) -> Vec<i64> {
    let (limit, hold, now, lease) = (
        p.limit.to_string(),
        format!("{:.0}", p.max_hold),
        now.to_string(),
        format!("{lease:.0}"),
    );
    let mut cmd = vec![
        "EVAL",
        concurrency::SPEC.lua,
        "1",
        key,
        &limit,
        &hold,
        "0",
        &now,
        "",
        op,
        &lease,
    ];
    cmd.extend(args.iter().map(String::as_str));
    redis_command(&redis().addr(), &cmd)
        .expect("EVAL")
        .into_ints()
}

static CASE: AtomicU64 = AtomicU64::new(0);

fn agree(
    p: concurrency::Params,
    lease: f64,
    start: u64,
    steps: &[(u64, u8, u64)],
) -> Result<(), TestCaseError> {
    let key = format!("twin:{{slots{}}}", CASE.fetch_add(1, Ordering::Relaxed));
    let mut model = SlotsModel::new(p.limit, p.max_hold, lease);
    let mut st = State::default();
    // Issued tokens: (id, the script's token).
    let mut issued: Vec<(u64, String)> = Vec::new();
    let mut now = start;
    for (i, &(dt, op, pick)) in steps.iter().enumerate() {
        now += dt;
        let t = now as f64;
        match op % 4 {
            0 | 1 => {
                let id = i as u64 + 1;
                let (expected, end) = model.acquire(t, id);
                let (o, rust_end) = concurrency::acquire(&mut st, t, &p, id, lease);
                let rust = [
                    i64::from(o.allowed),
                    o.remaining as i64,
                    o.reset_ms as i64,
                    o.wait_ms as i64,
                ];
                let got = lua(&key, &p, lease, "a", now, &[format!("t.{id}")]);
                prop_assert_eq!(&rust, &expected, "Rust acquire, step {} at {}", i, now);
                prop_assert_eq!(
                    &got[..4],
                    &expected[..],
                    "Lua acquire, step {} at {}",
                    i,
                    now
                );
                if let Some(end) = end {
                    prop_assert_eq!(rust_end, end);
                    prop_assert_eq!(got[4] as f64, end);
                    issued.push((id, format!("{}-t.{id}", got[4])));
                }
            }
            2 => {
                // A token issued (held, given back or lapsed), or one never issued.
                let (id, token) = match issued.get(pick as usize % (issued.len() + 1)) {
                    Some((id, token)) => (*id, token.clone()),
                    None => (u64::MAX, format!("{now}-t.never")),
                };
                let expected = model.release(t, id);
                prop_assert_eq!(
                    concurrency::release(&mut st, t, id),
                    expected,
                    "Rust release, step {}",
                    i
                );
                let got = lua(&key, &p, lease, "r", now, &[token]);
                prop_assert_eq!(got, vec![i64::from(expected)], "Lua release, step {}", i);
            }
            _ => {
                let chosen: Vec<&(u64, String)> = issued
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| pick >> (j % 64) & 1 == 1)
                    .map(|(_, x)| x)
                    .collect();
                let ids: Vec<u64> = chosen.iter().map(|x| x.0).collect();
                let expected = model.renew(t, &ids);
                let found = concurrency::renew(&mut st, t, &ids, lease);
                prop_assert_eq!(
                    found,
                    expected.iter().filter(|&&h| h).count(),
                    "Rust renew, step {}",
                    i
                );
                if !ids.is_empty() {
                    let tokens: Vec<String> = chosen.iter().map(|x| x.1.clone()).collect();
                    let got = lua(&key, &p, lease, "n", now, &tokens);
                    let expected: Vec<i64> = expected.iter().map(|&h| i64::from(h)).collect();
                    prop_assert_eq!(got, expected, "Lua renew, step {}", i);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn concurrency(
        limit in 1u64..=8, hosts in 1u32..=3, max_hold_ms in 1u64..=30_000,
        lease_ms in 1u64..=20_000,
        start in 1_600_000_000_000_000u64..1_900_000_000_000_000,
        steps in proptest::collection::vec(
            (prop_oneof![Just(0u64), 0..5_000_000u64, 0..200_000u64], any::<u8>(), any::<u64>()),
            1..40,
        ),
    ) {
        let p = concurrency::Params::shared(limit, Per::WindowMs(max_hold_ms), hosts);
        agree(p, lease_ms as f64 * 1000.0, start, &steps)?;
    }
}
