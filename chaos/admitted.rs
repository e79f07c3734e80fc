//! The check of admitted counts against the bounds of docs/FAILURES.md: what Redis
//! admitted per key (all daemons together, one more capacity per data loss), what each
//! daemon's local bucket admitted (its share of the rule), and all daemons' local
//! buckets together against the rule's global limit. A scenario's other checks are
//! `checks.rs`'s.

use super::*;

/// What Redis admitted (all daemons, per key) and what local buckets admitted (per
/// daemon, per key), each against its bound; the global local total per key against
/// the global limit.
pub(crate) struct Admitted {
    pub(crate) redis: u64,
    pub(crate) redis_bound: u64,
    pub(crate) local: u64,
    pub(crate) local_bound: u64,
    pub(crate) global_local_max_ratio: f64,
}

pub(crate) fn check_admitted(sc: &mut Scenario, samples: &[Sample], data_losses: u32) -> Admitted {
    let mut a = Admitted {
        redis: 0,
        redis_bound: 0,
        local: 0,
        local_bound: 0,
        global_local_max_ratio: 0.0,
    };
    let hosts = f64::from(sc.hosts);
    let span = |it: &mut dyn Iterator<Item = &Sample>| -> Option<(Duration, Duration)> {
        it.fold(None, |acc, s| match acc {
            None => Some((s.sent, s.received())),
            Some((first, last)) => Some((first.min(s.sent), last.max(s.received()))),
        })
    };
    for rule in 0..RULES.len() {
        for key in 0..KEYS {
            let of_key: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.rule == rule && s.key == key)
                .collect();
            // Redis: one budget shared by every daemon. The bucket starts full; each
            // data loss (restart, failover) can hand out a fresh capacity.
            let redis_admitted = of_key.iter().filter(|s| s.allowed_by(REDIS)).count() as u64;
            let redis_span =
                span(&mut of_key.iter().filter(|s| s.source() == Some(REDIS)).copied());
            if let Some((first, last)) = redis_span {
                let t = (last - first).as_secs_f64();
                let bound =
                    (CAPACITY * f64::from(1 + data_losses) + REFILL_RATE * t + 1e-9).floor() as u64;
                a.redis += redis_admitted;
                a.redis_bound += bound;
                if redis_admitted > bound {
                    sc.failures.push(format!(
                        "{} k{key}: Redis admitted {redis_admitted} > bound {bound} over {t:.3} s",
                        RULES[rule].0
                    ));
                }
            }
            // Local buckets (rule `local` only): per daemon, capacity and refill ÷ hosts.
            if FALLBACK_SOURCE[rule] != "local" {
                continue;
            }
            let local = 2; // index of "local" in SOURCES
            let mut global = 0u64;
            let mut global_span: Option<(Duration, Duration)> = None;
            for d in 0..sc.daemons.len() {
                let mine: Vec<&Sample> = of_key
                    .iter()
                    .filter(|s| s.daemon == d && s.source() == Some(local))
                    .copied()
                    .collect();
                let Some((first, last)) = span(&mut mine.iter().copied()) else {
                    continue;
                };
                let t = (last - first).as_secs_f64();
                let admitted = mine.iter().filter(|s| s.allowed_by(local)).count() as u64;
                let bound = ((CAPACITY + REFILL_RATE * t) / hosts + 1e-9).floor() as u64;
                a.local += admitted;
                a.local_bound += bound;
                global += admitted;
                global_span = Some(match global_span {
                    None => (first, last),
                    Some((f, l)) => (f.min(first), l.max(last)),
                });
                if admitted > bound {
                    sc.failures.push(format!(
                        "daemon {d}, {} k{key}: local bucket admitted {admitted} > bound {bound} \
                         ((capacity + refill × {t:.3} s) ÷ {hosts} hosts)",
                        RULES[rule].0
                    ));
                }
            }
            if let Some((first, last)) = global_span {
                // All daemons together within the global limit over the outage.
                let t = (last - first).as_secs_f64();
                let bound = (CAPACITY + REFILL_RATE * t + 1e-9).floor() as u64;
                a.global_local_max_ratio =
                    a.global_local_max_ratio.max(global as f64 / bound as f64);
                if global > bound {
                    sc.failures.push(format!(
                        "{} k{key}: {} daemons' local buckets admitted {global} together > global \
                         bound {bound} over {t:.3} s",
                        RULES[rule].0,
                        sc.daemons.len()
                    ));
                }
            }
        }
    }
    a
}
