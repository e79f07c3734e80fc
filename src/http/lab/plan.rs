//! What one lab run is: the ad-hoc rule (an algorithm and its parameters, validated by
//! the configuration's own loader, so the lab accepts exactly what a `[[rule]]` does),
//! the traffic profile, and the arrival times it makes, all checked against the lab's
//! budget (`http.lab_max_rps`, `lab_max_seconds`, `lab_max_keys`) before anything is
//! sent to Redis.

use crate::config::{Config, HttpConfig, Rule};
use std::sync::Arc;

/// The traffic profiles, each for every simulated client.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Profile {
    /// One request every `1 / rate` s.
    Steady,
    /// Poisson arrivals of mean `rate` per second (exponential gaps).
    Poisson,
    /// A square wave: `peak` per second for the first half of each `period`, `rate`
    /// for the second.
    Bursty,
    /// A surge: the rate climbs linearly from `rate` at the start to `peak` at the end.
    Surge,
}

/// One run, as asked and checked.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The rule decided (its name makes the run's keys fresh).
    pub rule: Arc<Rule>,
    /// The algorithm's name (`token_bucket`, …).
    pub algorithm: String,
    /// The traffic profile.
    pub profile: Profile,
    /// Base rate, requests/s per client.
    pub rate: f64,
    /// Peak rate (bursty, surge), requests/s per client.
    pub peak: f64,
    /// The square wave's period, ms (bursty).
    pub period_ms: u64,
    /// Length of the run, ms.
    pub duration_ms: u64,
    /// Simulated clients, each with a key of its own.
    pub clients: u32,
    /// A `concurrency` run: how long each request holds its slot before `RELEASE`, ms
    /// (0 for the rate algorithms).
    pub hold_ms: u64,
}

/// Why a run was refused (shown on the page as it is).
pub type PlanError = String;

/// Parameters of a rule the page may set, with the kind of value each takes.
const RULE_NUMBERS: [&str; 4] = ["capacity", "refill_rate", "leak_rate", "limit"];

/// The query's `name=value` pairs. Values are numbers, names and durations only, so
/// anything outside `[A-Za-z0-9._]` is refused (nothing else ever needs decoding).
fn pairs(query: &str) -> Result<Vec<(&str, &str)>, PlanError> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let plain = |s: &str| {
                s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_')
            };
            if plain(k) && plain(v) && v.len() <= 32 {
                Ok((k, v))
            } else {
                Err(format!(
                    "query field '{}': only letters, digits, '.' and '_' are accepted",
                    k.chars().take(32).collect::<String>()
                ))
            }
        })
        .collect()
}

impl Plan {
    /// Reads a run from the query of `/lab/events` and checks it against `budget`.
    /// `name` names the run's rule (so its keys start fresh).
    ///
    /// # Errors
    /// A missing or bad field (named), a rule the configuration would refuse, or a run
    /// beyond the budget.
    pub fn parse(query: &str, budget: &HttpConfig, name: &str) -> Result<Plan, PlanError> {
        let pairs = pairs(query)?;
        let get = |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let number = |k: &str, default: f64| -> Result<f64, PlanError> {
            match get(k) {
                None | Some("") => Ok(default),
                Some(v) => v
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| format!("{k}: '{v}' is not a number ≥ 0")),
            }
        };
        let algorithm = get("algorithm").unwrap_or("token_bucket").to_owned();
        let mut toml = format!(
            "[redis]\nmode = \"none\"\n[[rule]]\nname = \"{name}\"\nalgorithm = \"{algorithm}\"\n"
        );
        for k in RULE_NUMBERS {
            if let Some(v) = get(k).filter(|v| !v.is_empty()) {
                let x = number(k, 0.0)?;
                // Integers stay integers (the loader refuses 20.0 for a capacity).
                let written = if v.contains('.') {
                    format!("{x:?}")
                } else {
                    format!("{}", x as u64)
                };
                toml.push_str(&format!("{k} = {written}\n"));
            }
        }
        for k in ["window", "max_hold"] {
            if let Some(w) = get(k).filter(|v| !v.is_empty()) {
                toml.push_str(&format!("{k} = \"{w}\"\n"));
            }
        }
        let config = Config::parse(&toml, "lab").map_err(|e| {
            let e = e.to_string();
            // "lab:5: rule[0].capacity: …" → "capacity: …"
            e.split_once("rule[0].")
                .map_or(e.clone(), |(_, rest)| rest.to_owned())
        })?;
        let rule = config.rules.get(name).cloned().ok_or("no rule made")?;
        let slots = rule.algorithm.kind.spec().name == "concurrency";
        let profile = match get("profile").unwrap_or("steady") {
            "steady" => Profile::Steady,
            "poisson" => Profile::Poisson,
            "bursty" => Profile::Bursty,
            "surge" => Profile::Surge,
            other => {
                return Err(format!(
                    "profile: '{other}' is not steady, poisson, bursty or surge"
                ))
            }
        };
        let rate = number("rate", 10.0)?;
        let peak = number("peak", rate)?.max(rate);
        let period_ms = number("period_ms", 2000.0)? as u64;
        let seconds = number("seconds", 10.0)?;
        let clients = number("clients", 1.0)? as u32;
        let duration_ms = (seconds * 1000.0) as u64;
        let plan = Plan {
            rule,
            algorithm,
            profile,
            rate,
            peak,
            period_ms: period_ms.max(100),
            duration_ms,
            clients,
            hold_ms: if slots {
                number("hold_ms", 100.0)? as u64
            } else {
                0
            },
        };
        plan.within(budget)?;
        Ok(plan)
    }

    /// Checks the run against the lab's budget.
    fn within(&self, budget: &HttpConfig) -> Result<(), PlanError> {
        if self.duration_ms == 0 || self.duration_ms > u64::from(budget.lab_max_seconds) * 1000 {
            return Err(format!(
                "seconds: from 0.001 to {} (http.lab_max_seconds)",
                budget.lab_max_seconds
            ));
        }
        if self.clients == 0 || self.clients > budget.lab_max_keys {
            return Err(format!(
                "clients: from 1 to {} (http.lab_max_keys)",
                budget.lab_max_keys
            ));
        }
        if self.is_slots() && (self.hold_ms == 0 || self.hold_ms > self.duration_ms) {
            return Err(format!(
                "hold_ms: from 1 to the run's length, {} ms",
                self.duration_ms
            ));
        }
        // An ACQUIRE and its RELEASE are two requests.
        let per_arrival = if self.is_slots() { 2.0 } else { 1.0 };
        let top = self.peak.max(self.rate) * f64::from(self.clients) * per_arrival;
        if self.rate <= 0.0 || top > f64::from(budget.lab_max_rps) {
            return Err(format!(
                "rate: clients × the highest rate{} is {top} requests/s; the lab allows from more than 0 to {} (http.lab_max_rps)",
                if self.is_slots() { " × 2 (ACQUIRE and RELEASE)" } else { "" },
                budget.lab_max_rps
            ));
        }
        Ok(())
    }

    /// Whether the run takes concurrency slots (`ACQUIRE`, then `RELEASE` after
    /// [`Plan::hold_ms`]) rather than deciding `CHECK`s.
    pub fn is_slots(&self) -> bool {
        self.hold_ms > 0 || self.algorithm == "concurrency"
    }

    /// The arrivals of the whole run, `(ms from the start, client)`, in time order.
    /// `seed` drives the Poisson gaps.
    pub fn arrivals(&self, seed: u64) -> Vec<(f64, u32)> {
        let mut all = Vec::new();
        let mut rng = SplitMix(seed);
        let n = f64::from(self.clients);
        for c in 0..self.clients {
            // Clients are spread evenly over the first gap, so they do not all fire at once.
            let phase = f64::from(c) / n;
            let mut t = 0.0;
            let mut k = 0.0;
            loop {
                t = match self.profile {
                    Profile::Poisson => t + 1000.0 * -(1.0 - rng.next_f64()).ln() / self.rate,
                    _ => self.time_of(k + phase),
                };
                k += 1.0;
                if t.is_nan() || t >= self.duration_ms as f64 {
                    break;
                }
                all.push((t, c));
            }
        }
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        all
    }

    /// The rate at `t` ms, requests/s per client.
    pub fn rate_at(&self, t: f64) -> f64 {
        match self.profile {
            Profile::Steady | Profile::Poisson => self.rate,
            Profile::Bursty => {
                let period = self.period_ms as f64;
                if t % period < period / 2.0 {
                    self.peak
                } else {
                    self.rate
                }
            }
            Profile::Surge => self.rate + (self.peak - self.rate) * t / self.duration_ms as f64,
        }
    }

    /// When the `k`-th request (0-based, fractional for phase) arrives, ms: where the
    /// expected count ∫ rate dt reaches `k`, found by bisection over the run (monotone).
    fn time_of(&self, k: f64) -> f64 {
        let count = |t: f64| self.expected_count(t);
        let (mut lo, mut hi) = (0.0, self.duration_ms as f64);
        if count(hi) <= k {
            return f64::INFINITY;
        }
        for _ in 0..50 {
            let mid = (lo + hi) / 2.0;
            if count(mid) <= k {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        hi
    }

    /// Requests one client makes in `[0, t)` ms on average.
    fn expected_count(&self, t: f64) -> f64 {
        let s = t / 1000.0;
        match self.profile {
            Profile::Steady | Profile::Poisson => self.rate * s,
            Profile::Bursty => {
                let p = self.period_ms as f64 / 1000.0;
                let half = p / 2.0;
                let whole = (s / p).floor();
                let into = s - whole * p;
                whole * (self.peak + self.rate) * half
                    + self.peak * into.min(half)
                    + self.rate * (into - half).max(0.0)
            }
            Profile::Surge => {
                let d = self.duration_ms as f64 / 1000.0;
                self.rate * s + (self.peak - self.rate) * s * s / (2.0 * d)
            }
        }
    }
}

/// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
/// 2014): enough randomness for Poisson gaps, and one line instead of a dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(q: &str) -> Result<Plan, PlanError> {
        Plan::parse(q, &HttpConfig::default(), "r1")
    }

    #[test]
    fn a_steady_run_makes_rate_times_seconds_arrivals_per_client() {
        let p = plan("algorithm=token_bucket&capacity=20&refill_rate=10&profile=steady&rate=8&seconds=5&clients=3").unwrap();
        let a = p.arrivals(1);
        assert_eq!(a.len(), 8 * 5 * 3);
        assert!(a.windows(2).all(|w| w[0].0 <= w[1].0));
        assert!(a.iter().all(|&(t, c)| (0.0..5000.0).contains(&t) && c < 3));
    }

    #[test]
    fn bursty_and_surge_arrivals_follow_their_integrated_rate() {
        let p = plan("algorithm=fixed_window&limit=10&window=1s&profile=bursty&rate=2&peak=20&period_ms=2000&seconds=4").unwrap();
        // Two periods of (20 + 2) × 1 s.
        assert_eq!(p.arrivals(1).len(), 44);
        let p = plan(
            "algorithm=fixed_window&limit=10&window=1s&profile=surge&rate=0.5&peak=20.5&seconds=10",
        )
        .unwrap();
        // ∫ = 0.5 × 10 + 20 × 10 / 2 = 105.
        assert!((p.arrivals(1).len() as i64 - 105).abs() <= 1);
        let p = plan(
            "algorithm=sliding_window_log&limit=10&window=1s&profile=poisson&rate=50&seconds=10",
        )
        .unwrap();
        let n = p.arrivals(7).len() as f64;
        // Mean 500, standard deviation ≈ 22: within 5 σ.
        assert!((n - 500.0).abs() < 112.0, "{n}");
    }

    #[test]
    fn a_concurrency_run_holds_each_slot_for_hold_ms() {
        let p = plan("algorithm=concurrency&limit=4&max_hold=2s&hold_ms=250&rate=20&seconds=2")
            .unwrap();
        assert!(p.is_slots());
        assert_eq!(p.hold_ms, 250);
        assert_eq!(p.rule.limit(), 4);
        assert_eq!(p.rule.window_ms, 2000);
        let p = plan("algorithm=token_bucket&capacity=2&refill_rate=1&hold_ms=250").unwrap();
        assert!(!p.is_slots());
        assert_eq!(p.hold_ms, 0);
    }

    #[test]
    fn bad_fields_and_runs_beyond_the_budget_are_refused_by_name() {
        for (q, field) in [
            (
                "algorithm=token_bucket&capacity=0&refill_rate=1",
                "capacity",
            ),
            ("algorithm=nope", "algorithm"),
            (
                "algorithm=fixed_window&limit=5&window=1s&profile=wave",
                "profile",
            ),
            (
                "algorithm=fixed_window&limit=5&window=1s&rate=100&clients=6",
                "lab_max_rps",
            ),
            (
                "algorithm=fixed_window&limit=5&window=1s&seconds=61",
                "lab_max_seconds",
            ),
            (
                "algorithm=fixed_window&limit=5&window=1s&clients=101&rate=1",
                "lab_max_keys",
            ),
            (
                "algorithm=fixed_window&limit=5&window=1s%0Aname%3D",
                "only letters",
            ),
            (
                "algorithm=concurrency&limit=5&max_hold=1s&rate=100&clients=3",
                "ACQUIRE and RELEASE",
            ),
            (
                "algorithm=concurrency&limit=5&max_hold=1s&hold_ms=0",
                "hold_ms",
            ),
            ("algorithm=concurrency&limit=5&max_hold=0s", "max_hold"),
        ] {
            let e = plan(q).unwrap_err();
            assert!(e.contains(field), "{q}: {e}");
        }
    }
}
