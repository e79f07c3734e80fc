//! The lease scripts (`lua/lease_*.lua`) under a run-time override (`OVERRIDE`), in a
//! real Redis with explicit timestamps, against the reference model (`tests/reference`):
//! * a key with an override in its hash (field `ov`) and no lease out is decided by the
//!   lease script exactly as the plain script and the model decide it under the
//!   override's parameters, whatever the call asks: nothing is granted, and the reply
//!   carries the override (fields 13 to 15);
//! * with holders spending leases taken under the rule when the override is written,
//!   every unit admitted once the last of those leases has ended (its holder's deadline)
//!   passes a model of the override's parameters started then (zero over-admission of
//!   the overridden limit within one lease lifetime), and once the override is cleared,
//!   leases are granted again and every unit passes a model of the rule started then;
//! * a bucket whose capacity is lowered below the capacity out on lease refills nothing
//!   until enough of it has ended, and never beyond the new capacity less what is out.

use crate::common;
use crate::reference;
use crate::twin_leases::Holder;
use crate::twins::{lua_call, model_of};

use common::*;
use proptest::prelude::*;
use ratelimitd::algorithm::{token_bucket, Params, WindowParams};
use reference::Model;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

fn redis() -> &'static RedisStandalone {
    static REDIS: OnceLock<RedisStandalone> = OnceLock::new();
    REDIS.get_or_init(RedisStandalone::start)
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// µ-units per unit on the holder.
const UNIT: u64 = 1_000_000;

fn eval(script: &str, key: &str, args: &[String]) -> Vec<i64> {
    let mut cmd = vec!["EVAL", script, "1", key];
    cmd.extend(args.iter().map(String::as_str));
    redis_command(&redis().addr(), &cmd)
        .expect("EVAL")
        .into_ints()
}

/// The `ov` field of an override with `params` (no end), as `OVERRIDE` writes it
/// (`src/store/redis/tier.rs`), and the three fields a reply under it ends with.
fn ov_of(params: &Params) -> (String, [i64; 3]) {
    let (_, args) = lua_call(params, 0);
    let (limit, per_bits) = match params {
        Params::TokenBucket(p) => ((p.capacity / 1e6) as u64, p.refill_rate.to_bits()),
        Params::FixedWindow(w) | Params::SlidingWindowCounter(w) => {
            (w.limit as u64, (w.window / 1000.0) as u64)
        }
        other => unreachable!("no leases: {other:?}"),
    };
    let (h, o) = (per_bits >> 32, per_bits & 0xffff_ffff);
    let ov = format!("{} {} {limit} {h} {o} -", args[0], args[1]);
    (ov, [limit as i64, h as i64, o as i64])
}

fn set_override(key: &str, params: Option<&Params>) {
    let addr = redis().addr();
    match params {
        Some(p) => redis_command(&addr, &["HSET", key, "ov", &ov_of(p).0]).expect("HSET"),
        None => redis_command(&addr, &["HDEL", key, "ov"]).expect("HDEL"),
    };
}

/// A key of a leased rule and its holders.
struct Key {
    name: String,
    rule: Params,
    holders: Vec<Holder>,
}

impl Key {
    fn new(rule: Params, hosts: usize) -> Key {
        let suffix = CASE.fetch_add(1, Ordering::Relaxed);
        Key {
            name: format!("twin-lease-ov:{{{suffix}}}"),
            rule,
            holders: vec![Holder::default(); hosts],
        }
    }

    /// Holder µ-units per unit of the script's (µ-tokens for buckets, whole units for
    /// windows).
    fn per(&self) -> u64 {
        match self.rule {
            Params::TokenBucket(_) => 1,
            _ => UNIT,
        }
    }

    /// Holder `h`'s call at `now`, with the rule's own parameters as the daemon sends
    /// them: decides `cost`, gives its lease back, asks for `want` units (`pace`:
    /// saturated). Returns the reply.
    fn call(&mut self, h: usize, now: u64, cost: u64, want: u64, pace: u64) -> Vec<i64> {
        let script = ratelimitd::store::scripts::lease_lua(self.rule.kind()).expect("leases");
        let per = self.per();
        let (_, mut args) = lua_call(&self.rule, cost);
        let mine = &mut self.holders[h];
        mine.accrue(now);
        let lifetime: u64 = if pace > 0 { 2_000_000 } else { 1_000_000 };
        args.extend([
            now.to_string(),
            format!("h{h}"),
            mine.grant.to_string(),
            (mine.units / per).to_string(),
            (want * UNIT / per).to_string(),
            lifetime.to_string(),
            pace.to_string(),
            String::new(),
            "0".into(),
            String::new(),
        ]);
        let r = eval(script, &self.name, &args);
        assert!(r.len() == 12 || r.len() == 15, "{r:?}");
        *mine = Holder::default();
        if r[6] > 0 {
            let life = r[5] as u64;
            let units = r[4] as u64 * per;
            *mine = Holder {
                grant: r[6],
                units,
                cap: (r[8] as u64 * per).max(units),
                rate: r[9] as u64,
                accrued_at: now,
                deadline: (now + life).saturating_sub(1000 + life / 1000),
                ..Holder::default()
            };
        }
        r
    }
}

fn bucket(capacity: u64, rate: f64) -> Params {
    Params::TokenBucket(token_bucket::Params::shared(capacity, rate, 1))
}

/// A rule of algorithm `which` (0 token bucket, 1 fixed window, 2 sliding window
/// counter) from `limit` and `per` (a bucket's rate ×10 per s, or a window in ms).
fn rule(which: u8, limit: u64, per: u64) -> Params {
    match which {
        0 => bucket(limit, per as f64 / 10.0),
        1 => Params::FixedWindow(WindowParams::shared(limit, per, 1)),
        _ => Params::SlidingWindowCounter(WindowParams::shared(limit, per, 1)),
    }
}

fn pers() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![100u64, 1000, 7000])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// No lease out: the lease script decides an overridden key as the plain script and
    /// the model do under the override, grants nothing whatever is asked, and says so.
    #[test]
    fn an_overridden_key_is_decided_as_the_plain_script_decides_it(
        which in 0u8..3,
        (limit, per) in (1u64..300, pers()),
        (ov_limit, ov_per) in (1u64..300, pers()),
        steps in prop::collection::vec((0u64..30_000, 0u64..400, 0u64..300, any::<bool>()), 1..150),
    ) {
        let mut key = Key::new(rule(which, limit, per), 1);
        let plain = format!("{}:plain", key.name);
        let over = rule(which, ov_limit, ov_per);
        let (_, tier) = ov_of(&over);
        set_override(&key.name, Some(&over));
        set_override(&plain, Some(&over));
        let mut model = Model::new(model_of(&over));
        let mut now = 1_790_000_000_000_000u64 + 4_999;
        for (i, &(dt, cost, want, paced)) in steps.iter().enumerate() {
            now += dt;
            let cost = cost % (ov_limit + 1);
            let expected = model.decide(now as f64, cost).to_vec();
            let pace = if paced { 200_000 } else { 0 };
            let r = key.call(0, now, cost, want, pace);
            prop_assert_eq!(&r[..4], &expected[..], "lease script, step {} at {}", i, now);
            prop_assert_eq!((r[4], r[6], r[8], r[9]), (0, 0, 0, 0), "granted: {:?}", r);
            prop_assert_eq!(&r[12..], &tier[..], "the override in the reply");
            let (script, mut args) = lua_call(&key.rule, cost);
            args.push(now.to_string());
            let p = eval(script, &plain, &args);
            prop_assert_eq!(&p[..4], &expected[..], "plain script, step {} at {}", i, now);
        }
    }

    /// Holders spend leases taken under the rule; the override is written, then cleared.
    /// Units admitted once every lease taken before the override has ended pass a model
    /// of the override started then; units admitted after the clear, a model of the
    /// rule started then. Nothing is granted in between.
    #[test]
    fn leases_out_at_an_override_end_within_their_lifetime_and_nothing_more_passes(
        which in 0u8..3,
        (limit, per) in (1u64..60, pers()),
        (ov_limit, ov_per) in (1u64..60, pers()),
        hosts in 2usize..4,
        steps in prop::collection::vec((0u64..20_000, 0usize..3, 0u8..10, 1u64..4, 1u64..300), 3..300),
    ) {
        let mut key = Key::new(rule(which, limit, per), hosts);
        let over = rule(which, ov_limit, ov_per);
        let (_, tier) = ov_of(&over);
        let (set_at, clear_at) = (steps.len() / 3, 2 * steps.len() / 3);
        // The model in force, and the one that comes into force at an instant: the
        // rule's from the start; the override's once every lease out when it was set
        // has ended; the rule's again once it is cleared (and those leases ended).
        let mut model = Some(Model::new(model_of(&key.rule)));
        let mut next: Option<(u64, Params)> = None;
        let mut honoured_from = 0;
        let mut now = 1_790_000_000_000_000u64 + 137_000;
        for (i, &(dt, h, what, cost, want)) in steps.iter().enumerate() {
            now += dt;
            if i == set_at {
                set_override(&key.name, Some(&over));
                // The holders' leases out now are spent until their deadlines at most.
                honoured_from = key.holders.iter().map(|l| l.deadline).max().unwrap_or(0).max(now);
                (model, next) = (None, Some((honoured_from, over)));
            }
            if i == clear_at {
                set_override(&key.name, None);
                (model, next) = (None, Some((honoured_from.max(now), key.rule)));
            }
            if let Some((from, params)) = next {
                if now >= from {
                    (model, next) = (Some(Model::new(model_of(&params))), None);
                }
            }
            let under_override = (set_at..clear_at).contains(&i);
            let h = h % hosts;
            let cost = cost.min(if under_override { ov_limit } else { limit });
            let admitted = if what < 4 {
                let mut spent = 0;
                while key.holders[h].spend(cost, now) {
                    spent += 1;
                }
                prop_assert!(spent == 0 || !under_override || now < honoured_from,
                    "step {}: a lease spent at {} after {}", i, now, honoured_from);
                spent
            } else {
                let pace = if what < 7 { 200_000 } else { 0 };
                let want = if what == 9 { 0 } else { want };
                let r = key.call(h, now, cost, want, pace);
                if under_override {
                    prop_assert_eq!((r[4], r[6]), (0, 0), "granted under the override: {:?}", r);
                    prop_assert_eq!(&r[12..], &tier[..]);
                } else {
                    prop_assert_eq!(r.len(), 12, "{:?}", r);
                }
                u64::from(r[0] == 1)
            };
            if let Some(m) = model.as_mut() {
                for _ in 0..admitted {
                    prop_assert_eq!(m.decide(now as f64, cost)[0], 1,
                        "step {}: {} admitted at {} that the model in force refuses ({:?})",
                        i, cost, now, m.algo);
                }
            }
        }
    }
}

/// A bucket of 100 at 10/s with 60 out on a lease when its capacity is overridden to
/// 50: the bucket holds nothing and refills nothing while the 60 are out (not 40 plus
/// its refill), nothing is granted, and the give-back of the lease's unspent units
/// fills it to the new capacity, never beyond.
#[test]
fn a_capacity_lowered_below_what_is_out_refills_nothing_until_it_comes_back() {
    let mut key = Key::new(bucket(100, 10.0), 2);
    let t = 1_790_000_000_000_000u64;
    let r = key.call(0, t, 0, 60, 0);
    assert_eq!((r[1], r[4]), (40, 60_000_000), "{r:?}");
    set_override(&key.name, Some(&bucket(50, 10.0)));
    // Ten seconds later: the other holder's cold call sees nothing, grants nothing.
    let r = key.call(1, t + 10_000_000, 0, 0, 0);
    assert_eq!((r[0], r[1], r[4], r[12]), (1, 0, 0, 50), "{r:?}");
    let r = key.call(1, t + 10_000_001, 1, 20, 200_000);
    assert_eq!((r[0], r[1], r[4], r[8]), (0, 0, 0, 0), "{r:?}");
    // The holder gives its 60 back unspent: 50, the new capacity.
    let r = key.call(0, t + 10_000_002, 0, 0, 0);
    assert_eq!((r[0], r[1], r[4], r[7]), (1, 50, 0, 60_000_000), "{r:?}");
    // Cleared: leases again, under the rule's 100 (the bucket refills from 50).
    set_override(&key.name, None);
    let r = key.call(1, t + 15_000_002, 0, 70, 0);
    assert_eq!((r.len(), r[1], r[4]), (12, 30, 70_000_000), "{r:?}");
}
