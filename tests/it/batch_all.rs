//! A standalone Redis's all-or-nothing groups sent together in one EVALSHA of the
//! all-or-nothing batch script (`lua/all.lua`, `lua/all_batch.lua`), as
//! `src/store/batch_all.rs` sends them, against the reference model.
//!
//! * Groups of one, two and three keys of four algorithms, side by side in one call:
//!   each decided exactly as the all-or-nothing script of that group alone decides it
//!   (on twin keys), and both exactly as the reference model does: every key allowed,
//!   then every key taken (its instant returned); else nothing taken (whichever key
//!   denied: the first, the last or one between) and every key's reply the model's for
//!   its cost at that instant.
//! * A group one of whose keys raises an error (a key of another type) fails alone with
//!   that error and takes nothing, even from its key taken before the error; the groups
//!   after it are decided.

use crate::cluster_batch_all::{alone, assert_group, batch_eval, expected, item};
use crate::common;
use crate::reference;
use crate::twins::model_of;

use common::*;
use ratelimitd::algorithm::{leaky_bucket, token_bucket, Params, WindowParams};
use reference::Model;

#[test]
fn groups_of_one_two_and_three_keys_are_decided_as_alone_and_as_the_model() {
    let redis = RedisStandalone::start();
    let addr = redis.addr();
    // Integer rates: a take given back within one instant restores the state exactly,
    // as the model (which never took) holds it.
    let tb = Params::TokenBucket(token_bucket::Params::shared(5, 2.0, 1));
    let fw = Params::FixedWindow(WindowParams::shared(4, 1000, 1));
    let lb = Params::LeakyBucket(leaky_bucket::Params::shared(4, 3.0, 1));
    let swc = Params::SlidingWindowCounter(WindowParams::shared(6, 1000, 1));
    let shapes: Vec<Vec<(Params, u64, &str)>> = vec![
        vec![(tb, 5, "tb")],
        vec![(tb, 5, "tb"), (fw, 4, "fw")],
        vec![(lb, 4, "lb"), (swc, 6, "swc"), (tb, 5, "tb")],
    ];
    // Per group, twin keys: set "a" decided alone, set "b" in the batch.
    let keys_of = |set: &str, g: usize| -> Vec<String> {
        shapes[g]
            .iter()
            .map(|(_, _, s)| format!("rl:{{all:{set}:{g}}}:{s}"))
            .collect()
    };
    let mut models: Vec<Vec<Model>> = shapes
        .iter()
        .map(|s| s.iter().map(|(p, _, _)| Model::new(model_of(p))).collect())
        .collect();
    let mut now: u64 = 1_700_000_000_000_000;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |m: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % m
    };
    // Per group size: allowed groups, and denied ones by the position of a denied key.
    let mut allowed = [0u32; 3];
    let mut denied_at = [[0u32; 3]; 3];
    for step in 0..150 {
        now += next(400_000);
        let costs: Vec<Vec<u64>> = shapes
            .iter()
            .map(|s| {
                s.iter()
                    .map(|&(_, l, _)| next(l + 1).min(next(4)))
                    .collect()
            })
            .collect();
        let items = |g: usize| -> Vec<Vec<String>> {
            shapes[g]
                .iter()
                .zip(&costs[g])
                .map(|(&(p, _, _), &c)| item(&p, c, now))
                .collect()
        };
        let groups: Vec<(Vec<String>, Vec<Vec<String>>)> = (0..shapes.len())
            .map(|g| (keys_of("b", g), items(g)))
            .collect();
        let replies = batch_eval(&addr, &groups, false);
        assert_eq!(replies.len(), shapes.len());
        for (g, reply) in replies.into_iter().enumerate() {
            let want = expected(&mut models[g], &costs[g], now);
            match (0..shapes[g].len()).find(|&k| want[8 * k] != 1) {
                None => allowed[g] += 1,
                Some(k) => denied_at[g][k] += 1,
            }
            let lone = alone(&addr, &keys_of("a", g), &items(g));
            assert_group(lone, reply, want, (g, step, &costs[g]));
        }
    }
    // Both sides, and a DENY at every position of every group, were exercised.
    for g in 0..shapes.len() {
        assert!(allowed[g] >= 10, "group {g}: allowed {allowed:?}");
        for k in 0..shapes[g].len() {
            assert!(
                denied_at[g][k] >= 3,
                "group {g}, key {k}: denied {denied_at:?}"
            );
        }
    }
}

#[test]
fn a_group_whose_key_fails_takes_nothing_and_the_others_are_decided() {
    let redis = RedisStandalone::start();
    let addr = redis.addr();
    let tb = Params::TokenBucket(token_bucket::Params::shared(5, 2.0, 1));
    let now: u64 = 1_700_000_000_000_000;
    redis_command(&addr, &["SET", "rl:{e}:wrong", "a string"]).expect("SET");
    let first = "rl:{e:first}:tb".to_owned();
    let after = "rl:{e:after}:tb".to_owned();
    let groups = vec![
        // Its first key taken, then its second raises WRONGTYPE: the first is given back.
        (
            vec![first.clone(), "rl:{e}:wrong".to_owned()],
            vec![item(&tb, 2, now), item(&tb, 1, now)],
        ),
        (vec![after.clone()], vec![item(&tb, 3, now)]),
    ];
    let replies = batch_eval(&addr, &groups, false);
    assert!(
        replies[0]
            .as_ref()
            .is_err_and(|e| e.starts_with("WRONGTYPE")),
        "the failing group: {:?}",
        replies[0]
    );
    let at = now as i64;
    assert_eq!(
        replies[1],
        Ok(vec![1, 2, 1500, 0, at, 0, 0, 0]),
        "the group after it"
    );
    // The failing group's first key took nothing: its bucket is still full (5).
    let full = alone(&addr, std::slice::from_ref(&first), &[item(&tb, 0, now)]);
    assert_eq!(
        full.map(|r| r[1]),
        Ok(5),
        "the failing group's key was given back"
    );
    // The same group alone raises the error, and takes nothing either.
    let lone = alone(&addr, &groups[0].0, &groups[0].1);
    assert!(
        lone.as_ref().is_err_and(|e| e.contains("WRONGTYPE")),
        "alone: {lone:?}"
    );
    let full = alone(&addr, std::slice::from_ref(&first), &[item(&tb, 0, now)]);
    assert_eq!(full.map(|r| r[1]), Ok(5), "alone: the key was given back");
}
