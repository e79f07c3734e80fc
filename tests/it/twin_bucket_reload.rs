//! Token bucket leases through reloads, against the reference model (docs/DESIGN.md
//! "Leases", "Reloads and leases"): holders take leases and slices from
//! `lua/lease_token_bucket.lua` in a real Redis (explicit timestamps) and spend them as a
//! daemon does, other holders decide by the per-request script (`lease = "off"`), and
//! every unit admitted must pass the model of one client deciding every request at its
//! real time.
//!
//! * Leases off on two holders of three, the third still taking slices (a fleet
//!   reloaded one daemon at a time): the per-request script must leave the capacity and
//!   the refill the slices hold.
//! * The refill rate lowered, or leases turned off, on every holder at once (a reload
//!   stops each holder spending its lease): the leases taken at the old rate are never
//!   spent again, and the bucket refills at the new rate from the reload on.

use crate::reference::{Algo, Model};
use crate::twin_leases::redis;
use common::*;
use ratelimitd::algorithm::Kind;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::common;
/// A holder's lease as a daemon keeps it: µ-tokens, a slice's cap and refill.
use crate::twin_leases::Holder as Lease;

static CASE: AtomicU64 = AtomicU64::new(0);

/// µ-tokens per token.
const MICRO: u64 = 1_000_000;

/// A bucket key of `cap` tokens.
struct Bucket {
    name: String,
    cap: u64,
}

impl Bucket {
    fn new(cap: u64) -> Bucket {
        let n = CASE.fetch_add(1, Ordering::Relaxed);
        Bucket {
            name: format!("twin-bucket:{{{n}}}"),
            cap,
        }
    }

    /// Holder `h`'s lease call at `now` (refill `rate` tokens/s): decides one token,
    /// gives `lease` back, asks for a slice (`want` tokens, `want` 0: nothing).
    fn lease(&self, h: usize, lease: &mut Lease, rate: f64, now: u64, want: u64) -> bool {
        let script = ratelimitd::store::scripts::lease_lua(Kind::TokenBucket).expect("script");
        lease.accrue(now);
        let unspent = lease.units;
        let args = [
            (self.cap * MICRO).to_string(),
            rate.to_string(),
            (if want > 0 { MICRO } else { 0 }).to_string(),
            now.to_string(),
            format!("h{h}"),
            lease.grant.to_string(),
            unspent.to_string(),
            (want * MICRO).to_string(),
            "2000000".into(),
            (if want > 0 { "200000" } else { "0" }).into(),
            String::new(),
            "0".into(),
            String::new(),
        ];
        let mut cmd = vec!["EVAL", script, "1", &self.name];
        cmd.extend(args.iter().map(String::as_str));
        let r = redis_command(&redis().addr(), &cmd)
            .expect("EVAL")
            .into_ints();
        *lease = Lease::default();
        if r[6] > 0 {
            let life = r[5] as u64;
            *lease = Lease {
                grant: r[6],
                units: r[4] as u64,
                cap: (r[8] as u64).max(r[4] as u64),
                rate: r[9] as u64,
                accrued_at: now,
                deadline: (now + life).saturating_sub(1000 + life / 1000),
                ..Lease::default()
            };
        }
        r[0] == 1
    }

    /// One token decided at `now` by the per-request script (refill `rate` tokens/s).
    fn plain(&self, rate: f64, now: u64) -> bool {
        let args = [
            (self.cap * MICRO).to_string(),
            rate.to_string(),
            MICRO.to_string(),
            now.to_string(),
        ];
        let mut cmd = vec!["EVAL", Kind::TokenBucket.spec().lua, "1", &self.name];
        cmd.extend(args.iter().map(String::as_str));
        let r = redis_command(&redis().addr(), &cmd)
            .expect("EVAL")
            .into_ints();
        r[0] == 1
    }
}

fn model(cap: u64, rate: f64) -> Algo {
    Algo::TokenBucket {
        cap: (cap * MICRO) as f64,
        rate,
    }
}

/// Three holders draining a bucket of `cap` tokens refilled at `rate` per second, one
/// try each every 0.5 ms for `run` µs; holder h decides by the per-request script when
/// `plain(h, now)`, else from its lease, calling for a slice when it holds none.
/// `reload` at µs `at`: the rate becomes `then`, every lease stops being spent. Every
/// unit admitted passes the model; returns the units admitted, and those after `at`.
fn drain(
    cap: u64,
    rate: f64,
    run: u64,
    reload: Option<(u64, f64)>,
    plain: impl Fn(usize, bool) -> bool,
) -> (u64, u64) {
    let bucket = Bucket::new(cap);
    let mut m = Model::new(model(cap, rate));
    let t0 = 1_790_000_000_000_000u64;
    let mut leases = [Lease::default(); 3];
    let mut next_call = [t0; 3];
    let (mut rate, mut all, mut after, mut reloaded) = (rate, 0, 0, false);
    let mut now = t0;
    while now < t0 + run {
        if let Some((_, then)) = reload.filter(|&(at, _)| !reloaded && now >= t0 + at) {
            (rate, reloaded) = (then, true);
            m.algo = model(cap, then);
            leases.iter_mut().for_each(|l| l.deadline = 0);
        }
        for h in 0..3 {
            let at = now + h as u64 * 97;
            let admitted = if plain(h, reloaded) {
                if leases[h].grant != 0 {
                    bucket.lease(h, &mut leases[h], rate, at, 0);
                }
                bucket.plain(rate, at)
            } else if leases[h].spend(1, at) {
                true
            } else if at >= next_call[h] && (leases[h].grant == 0 || at >= leases[h].deadline) {
                let ok = bucket.lease(h, &mut leases[h], rate, at, 100);
                if leases[h].grant == 0 {
                    next_call[h] = at + 200_000;
                }
                ok
            } else {
                false
            };
            if admitted {
                assert_eq!(m.decide(at as f64, 1)[0], 1, "holder {h} at {}", at - t0);
                all += 1;
                after += u64::from(reloaded);
            }
        }
        now += 500;
    }
    (all, after)
}

/// Leases off on two holders, the third taking slices all along: every unit passes
/// the model, and the bucket is used (at least 90 % of `capacity + rate × T`).
#[test]
fn plain_holders_beside_a_leased_one_stay_within_the_bucket() {
    let (all, _) = drain(200, 1000.0, 3_000_000, None, |h, _| h > 0);
    println!("{all} admitted over 3 s (bound {})", 200 + 3000);
    assert!(all * 10 >= 3200 * 9, "{all}");
}

/// The rate lowered from 2,000/s to 100/s 1.5 s into a drain with slices out, every
/// holder reloading at once (leases still on, or off): every unit passes the model of
/// the rule in force, and the bucket is used after the reload (at least 90 % of the
/// new refill over the 2.5 s; the leases out at the reload lapse unspent).
#[test]
fn a_lowered_rate_stays_within_the_new_bucket() {
    for off in [false, true] {
        let reload = Some((1_500_000, 100.0));
        let (_, after) = drain(200, 2000.0, 4_000_000, reload, |_, reloaded| {
            off && reloaded
        });
        println!("off {off}: {after} admitted in the 2.5 s after the reload (refill 250)");
        assert!(after * 10 >= 250 * 9, "{after}");
    }
}
