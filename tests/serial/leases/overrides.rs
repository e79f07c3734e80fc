//! Run-time overrides (`OVERRIDE`) of a leased hot key, under load, on a real 3-primary
//! Redis Cluster with 2 daemons (docs/DESIGN.md "Leases", "Run-time overrides on a
//! leased rule"). Both daemons hammer one key, saturated, with leases out; an override
//! raising the rule, a clear, one lowering it (below the capacity or limit the leases
//! out hold) and a clear follow, each set through one daemon while the load runs.
//!
//! Each phase is measured from one lease lifetime ([`SLICE_LIFETIME_US`]) after the
//! reply to its `OVERRIDE` was read: every lease out before the override was taken by
//! a call sent before then, and is spent for at most its lifetime less the slice's
//! spare from that call, so from then on nothing is spent from one. Counted are the
//! pipelined batches sent from then on and read before the next `OVERRIDE` was sent,
//! all decided within `J` = [first sent, last read]; the bound is the parameters in
//! force over `J`: a token bucket `capacity + refill_rate × |J|`, a fixed window `limit`
//! in each window inside `J` (batches sent and read within it; docs in
//! `windows.rs`). Asserted, per phase: never above the bound; at least 80 % of what
//! the parameters admit a saturated key over `J` (`refill_rate × |J|`; `limit` per whole
//! window); every reply of both daemons states the parameters' limit; under an
//! override no decision comes from a lease, after a clear some do again. The time each
//! daemon took to state the new limit in every reply is printed and at most a lifetime.

use super::common::*;
use super::harness::*;
use ratelimitd::lease::{SLICE_LIFETIME_US, SLICE_SPARE_US};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const RULES: &str = r#"
[[rule]]
name = "tb"
algorithm = "token_bucket"
capacity = 200
refill_rate = 400.0
lease = "auto"

[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 300
window = "1s"
lease = "auto"
"#;

/// One lease lifetime, ms: the phases are measured from this long after the override.
const LIFE_MS: u64 = SLICE_LIFETIME_US / 1000;
/// How long a phase's measure runs after that, ms.
const MEASURE_MS: u64 = 3500;

/// One pipelined batch of CHECKs: when it was sent and read (epoch ms), its ALLOWs,
/// its decisions from a lease and without Redis, and the lowest and highest `limit`
/// its replies stated.
#[derive(Debug, Clone, Copy)]
struct Batch {
    sent: u64,
    read: u64,
    allowed: u64,
    leased: u64,
    /// Decisions made without Redis (its answer late: `on_redis_failure`).
    fallback: u64,
    limits: (u64, u64),
}

fn record(batches: &mut Vec<Batch>, replies: &[String], (sent, read): (u64, u64)) {
    let (sent, read) = (sent / 1000, read / 1000);
    let replies: Vec<Reply> = replies.iter().map(|r| parse_reply(r)).collect();
    let limit = |f: fn(u64, u64) -> u64, start| replies.iter().map(|r| r.limit).fold(start, f);
    batches.push(Batch {
        sent,
        read,
        allowed: replies.iter().filter(|r| r.allowed()).count() as u64,
        leased: replies.iter().filter(|r| r.source == "lease").count() as u64,
        fallback: replies
            .iter()
            .filter(|r| r.source != "lease" && r.source != "redis")
            .count() as u64,
        limits: (limit(u64::min, u64::MAX), limit(u64::max, 0)),
    });
}

/// The parameters in force in a phase.
#[derive(Debug, Clone, Copy)]
enum Params {
    Bucket { capacity: u64, rate: f64 },
    Window { limit: u64, window_ms: u64 },
}

impl Params {
    fn limit(&self) -> u64 {
        match *self {
            Params::Bucket { capacity, .. } => capacity,
            Params::Window { limit, .. } => limit,
        }
    }
}

/// One phase: the `OVERRIDE` arguments after the key (`clear` for none), the
/// parameters then in force, and whether they are the rule's (leased again).
struct Phase {
    args: &'static str,
    params: Params,
    rule: bool,
}

/// A phase as measured: `set` = its `OVERRIDE` reply read, `end` = the next one sent
/// (epoch ms).
struct Measured<'a> {
    phase: &'a Phase,
    /// The parameters in force before it.
    before: Params,
    set: u64,
    end: u64,
}

/// Runs `phases` on key `hot` of `rule` under load on both daemons, each override set
/// through the daemons in turn; returns the failures.
fn run(s: &Setup, rule: &str, phases: &[Phase]) -> Vec<String> {
    let stop = Arc::new(AtomicBool::new(false));
    let line = format!("CHECK {rule} hot");
    let handles: Vec<Vec<_>> = s
        .daemons
        .iter()
        .map(|d| {
            load_with(
                &d.socket,
                &line,
                2,
                5,
                Duration::from_millis(1),
                &stop,
                record,
            )
        })
        .collect();
    // Saturated, with leases out under the rule.
    thread::sleep(Duration::from_millis(2500));
    let mut admins: Vec<Client> = s.daemons.iter().map(Daemon::connect).collect();
    let mut measured: Vec<Measured> = Vec::new();
    for (i, phase) in phases.iter().enumerate() {
        let sent = epoch_ms();
        if let Some(m) = measured.last_mut() {
            m.end = sent;
        }
        let n = admins.len();
        let admin = &mut admins[i % n];
        let reply = admin.request(&format!("OVERRIDE {rule} hot {}", phase.args));
        assert_eq!(reply, "OK", "OVERRIDE {rule} hot {}", phase.args);
        let before = i
            .checked_sub(1)
            .map_or_else(|| rule_params(phases), |j| phases[j].params);
        measured.push(Measured {
            phase,
            before,
            set: epoch_ms(),
            end: u64::MAX,
        });
        thread::sleep(Duration::from_millis(LIFE_MS + MEASURE_MS));
    }
    if let Some(m) = measured.last_mut() {
        m.end = epoch_ms();
    }
    stop.store(true, Ordering::Relaxed);
    let hosts: Vec<Vec<Batch>> = handles
        .into_iter()
        .map(|threads| {
            let mut all: Vec<Batch> = threads
                .into_iter()
                .flat_map(|h| h.join().expect("load thread"))
                .collect();
            all.sort_by_key(|b| b.sent);
            all
        })
        .collect();
    let mut failures = Vec::new();
    for m in &measured {
        failures.extend(check(rule, m, &hosts));
    }
    failures
}

/// The rule's own parameters: those of the phases that clear.
fn rule_params(phases: &[Phase]) -> Params {
    phases.iter().find(|p| p.rule).expect("a clear").params
}

/// The assertions of one phase (the module's `//!`).
fn check(rule: &str, m: &Measured, hosts: &[Vec<Batch>]) -> Vec<String> {
    let (phase, limit) = (m.phase, m.phase.params.limit());
    let name = format!("{rule} {}", phase.args);
    let mut failures = check_switch(&name, m, hosts);
    // When each host last stated another limit, or answered from a lease under an
    // override: it honours the phase's parameters from then on.
    for (h, batches) in hosts.iter().enumerate() {
        let off = |b: &&Batch| b.limits != (limit, limit) || (!phase.rule && b.leased > 0);
        let last = batches
            .iter()
            .filter(|b| b.sent >= m.set && b.read <= m.end)
            .filter(off)
            .map(|b| b.read)
            .max();
        let switched = last.map_or(0, |r| r.saturating_sub(m.set));
        println!(
            "{name}: host {h} states limit {limit} in every reply {switched} ms after the OVERRIDE"
        );
        if switched > LIFE_MS {
            failures.push(format!("{name}: host {h} took {switched} ms"));
        }
    }
    let from = m.set + LIFE_MS;
    let counted: Vec<&Batch> = hosts
        .iter()
        .flatten()
        .filter(|b| b.sent >= from && b.read <= m.end)
        .collect();
    let first = counted.iter().map(|b| b.sent).min().unwrap_or(from);
    let last = counted.iter().map(|b| b.read).max().unwrap_or(from);
    // Nothing counted was spent from a lease taken before the override.
    assert!(first >= m.set + (SLICE_LIFETIME_US - SLICE_SPARE_US) / 1000);
    let allowed: u64 = counted.iter().map(|b| b.allowed).sum();
    let leased: u64 = counted.iter().map(|b| b.leased).sum();
    let fallback: u64 = counted.iter().map(|b| b.fallback).sum();
    let decisions = counted.len() as u64 * 5;
    let j = (last - first) as f64 / 1000.0;
    match phase.params {
        Params::Bucket { capacity, rate } => {
            let bound = capacity as f64 + rate * j;
            let floor = 0.8 * rate * j;
            println!(
                "{name}: {allowed} ALLOW of {decisions} ({leased} from leases, {fallback} without Redis) in {j:.2} s: bound {bound:.0}, {:.1} % of refill_rate × T",
                100.0 * allowed as f64 / (rate * j)
            );
            if allowed as f64 > bound {
                failures.push(format!("{name}: over-admitted {allowed} > {bound:.0}"));
            }
            if (allowed as f64) < floor {
                failures.push(format!("{name}: under-used {allowed} < {floor:.0}"));
            }
        }
        Params::Window { limit, window_ms } => {
            let mut inside: HashMap<u64, u64> = HashMap::new();
            for b in &counted {
                if b.sent / window_ms == b.read / window_ms {
                    *inside.entry(b.sent / window_ms).or_default() += b.allowed;
                }
            }
            // The windows wholly inside J, and the ALLOWs of the batches sent and read
            // within them (those straddling two of them included): the windows admitted
            // at least that many, and admit at most `limit` each.
            let whole: Vec<u64> = (first.div_ceil(window_ms)..last / window_ms).collect();
            let per: Vec<u64> = whole
                .iter()
                .map(|w| inside.get(w).copied().unwrap_or(0))
                .collect();
            let (from_ms, to_ms) = (
                first.div_ceil(window_ms) * window_ms,
                last / window_ms * window_ms,
            );
            let used: u64 = counted
                .iter()
                .filter(|b| b.sent >= from_ms && b.read < to_ms)
                .map(|b| b.allowed)
                .sum();
            let most = limit * whole.len() as u64;
            println!(
                "{name}: {allowed} ALLOW of {decisions} ({leased} from leases, {fallback} without Redis) in {j:.2} s; {used} in {} whole windows ({:.1} % of {most}), inside each {per:?}",
                whole.len(),
                100.0 * used as f64 / most.max(1) as f64
            );
            for (w, a) in &inside {
                if *a > limit {
                    failures.push(format!("{name}: window {w} admitted {a} > {limit}"));
                }
            }
            if whole.is_empty() || (used as f64) < 0.8 * most as f64 {
                failures.push(format!("{name}: under-used: {used} of {most}"));
            }
        }
    }
    if phase.rule && leased == 0 {
        failures.push(format!("{name}: not leased again"));
    }
    failures
}

#[test]
fn an_override_of_a_leased_hot_key_is_honoured_by_every_host_within_a_lease_lifetime() {
    let s = Setup::start_n(2, RedisCluster::start, RULES);
    let bucket = |capacity, rate| Params::Bucket { capacity, rate };
    let window = |limit| Params::Window {
        limit,
        window_ms: 1000,
    };
    let buckets = [
        ("capacity=400 refill_rate=800", bucket(400, 800.0), false),
        ("clear", bucket(200, 400.0), true),
        ("capacity=100 refill_rate=200", bucket(100, 200.0), false),
        ("clear", bucket(200, 400.0), true),
    ];
    let windows = [
        ("limit=600", window(600), false),
        ("clear", window(300), true),
        ("limit=150", window(150), false),
        ("clear", window(300), true),
    ];
    let phases = |list: &[(&'static str, Params, bool)]| -> Vec<Phase> {
        list.iter()
            .map(|&(args, params, rule)| Phase { args, params, rule })
            .collect()
    };
    let mut failures = run(&s, "tb", &phases(&buckets));
    failures.extend(run(&s, "fw", &phases(&windows)));
    assert!(failures.is_empty(), "{failures:#?}");
}

/// While the leases out when the override was written may still be spent (the lifetime
/// after it), every interval admits at most what the larger of the two parameter sets
/// admits: a bucket `max(capacity) + max(refill_rate) × T` over the batches sent and
/// read in it, a window `max(limit)` in each window it overlaps.
fn check_switch(name: &str, m: &Measured, hosts: &[Vec<Batch>]) -> Vec<String> {
    let until = m.set + LIFE_MS;
    let early: Vec<&Batch> = hosts
        .iter()
        .flatten()
        .filter(|b| b.sent >= m.set && b.read <= until.min(m.end))
        .collect();
    let allowed: u64 = early.iter().map(|b| b.allowed).sum();
    let mut failures = Vec::new();
    match (m.before, m.phase.params) {
        (
            Params::Bucket {
                capacity: c0,
                rate: r0,
            },
            Params::Bucket {
                capacity: c1,
                rate: r1,
            },
        ) => {
            let first = early.iter().map(|b| b.sent).min().unwrap_or(m.set);
            let last = early.iter().map(|b| b.read).max().unwrap_or(m.set);
            let bound = c0.max(c1) as f64 + r0.max(r1) * (last - first) as f64 / 1000.0;
            println!("{name}: {allowed} ALLOW in the lifetime after it, bound {bound:.0}");
            if allowed as f64 > bound {
                failures.push(format!(
                    "{name}: {allowed} > {bound:.0} while leases ran out"
                ));
            }
        }
        (
            Params::Window { limit: l0, .. },
            Params::Window {
                limit: l1,
                window_ms,
            },
        ) => {
            let mut per: HashMap<u64, u64> = HashMap::new();
            for b in hosts.iter().flatten() {
                let w = b.sent / window_ms;
                if w == b.read / window_ms && (w + 1) * window_ms > m.set && w * window_ms < until {
                    *per.entry(w).or_default() += b.allowed;
                }
            }
            println!("{name}: in the windows of the lifetime after it {per:?}");
            if let Some((w, a)) = per.iter().find(|(_, a)| **a > l0.max(l1)) {
                failures.push(format!(
                    "{name}: window {w} admitted {a} while leases ran out"
                ));
            }
        }
        _ => unreachable!("one kind of parameters per rule"),
    }
    failures
}
