//! How often the sliding window counter (Cloudflare's weighted estimate) decides
//! differently from the exact sliding window log, on a generated trace of many sources.
//!
//! ```text
//! cargo run --release -p ratelimitd-tools --bin window_error -- --requests 10000000
//!     [--sources 2000] [--limit 100] [--window-ms 60000] [--seed 1] [--mix wide|near|mostly-under]
//! ```
//!
//! Each source sends a Poisson stream at its own rate, relative to the limit's rate
//! (`limit / window`): `wide` draws it log-uniform in 0.1×–10× (half the sources over
//! their limit), `near` in 0.5×–2×, `mostly-under` puts 99 % of sources in 0.01×–0.5×
//! and 1 % in 1×–20× (abusers), closer to a real API's traffic. Both algorithms are the daemon's own Rust twins
//! (`ratelimitd::algorithm`), on the same arrival times, two ways:
//!
//! * **judged**: the counter decides; each of its decisions is judged against the exact
//!   rule applied to what the counter actually admitted in the last `window`: a
//!   *false allow* admits past the limit, a *false deny* refuses what fitted. This is
//!   Cloudflare's measure ("wrongly allowed or rate limited");
//! * **side by side**: counter and log each keep their own state (two deployments) and
//!   we count requests where their verdicts differ.
//!
//! Prints one JSON object. Run bare (and under `cargo test`), it runs a small trace and checks the figures are sane.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use ratelimitd::algorithm::{sliding_window_counter, sliding_window_log, WindowParams};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

struct Args {
    requests: u64,
    sources: usize,
    limit: u64,
    window_ms: u64,
    seed: u64,
    mix: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        requests: 10_000_000,
        sources: 2000,
        limit: 100,
        window_ms: 60_000,
        seed: 1,
        mix: "wide".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--bench" {
            continue; // cargo bench passed it, where this tool used to live
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        if flag == "--mix" {
            if !["wide", "near", "mostly-under"].contains(&value.as_str()) {
                return Err(format!(
                    "--mix: '{value}' is not wide, near or mostly-under"
                ));
            }
            a.mix = value;
            continue;
        }
        let n: u64 = value
            .parse()
            .map_err(|_| format!("{flag}: '{value}' is not a number"))?;
        match flag.as_str() {
            "--requests" => a.requests = n,
            "--sources" => a.sources = n as usize,
            "--limit" => a.limit = n,
            "--window-ms" => a.window_ms = n,
            "--seed" => a.seed = n,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    requests: u64,
    counter_allowed: u64,
    false_allow: u64,
    false_deny: u64,
    log_allowed: u64,
    differ: u64,
    /// Most units the counter admitted in any `window` (at its admissions).
    max_in_window: u64,
}

impl Tally {
    fn add(&mut self, d: &Tally) {
        self.requests += d.requests;
        self.counter_allowed += d.counter_allowed;
        self.false_allow += d.false_allow;
        self.false_deny += d.false_deny;
        self.log_allowed += d.log_allowed;
        self.differ += d.differ;
        self.max_in_window = self.max_in_window.max(d.max_in_window);
    }
}

/// Source classes by rate ÷ limit rate: all, under (< 0.8), near (0.8–1.25), over.
const CLASSES: [&str; 4] = ["all", "under", "near", "over"];

/// One source: its rate (requests/µs) and the states of both algorithms.
struct Source {
    rate: f64,
    class: usize,
    counter: Option<sliding_window_counter::State>,
    /// When the counter admitted, µs, within the last window: to judge it exactly.
    counter_admitted: VecDeque<f64>,
    log: sliding_window_log::Log,
}

fn run(a: &Args) -> [Tally; 4] {
    let mut rng = SmallRng::seed_from_u64(a.seed);
    let p = WindowParams::shared(a.limit, a.window_ms, 1);
    let limit_rate = a.limit as f64 / p.window; // requests per µs at the limit
    let mut sources: Vec<Source> = (0..a.sources)
        .map(|_| {
            let x = match a.mix.as_str() {
                "near" => 2f64.powf(rng.gen_range(-1.0..1.0)),
                "mostly-under" if rng.gen_bool(0.01) => 20f64.powf(rng.gen_range(0.0..1.0)),
                "mostly-under" => 10f64.powf(rng.gen_range(-2.0..-std::f64::consts::LOG10_2)),
                _ => 10f64.powf(rng.gen_range(-1.0..1.0)),
            };
            Source {
                rate: limit_rate * x,
                class: if x < 0.8 {
                    1
                } else if x <= 1.25 {
                    2
                } else {
                    3
                },
                counter: None,
                counter_admitted: VecDeque::new(),
                log: sliding_window_log::Log::new(),
            }
        })
        .collect();
    // Next arrival per source, earliest first. Start at a realistic epoch instant.
    let t0 = 1_700_000_000_000_000u64;
    let next =
        |rate: f64, rng: &mut SmallRng| (-rng.gen::<f64>().max(1e-300).ln() / rate).ceil() as u64;
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = sources
        .iter()
        .enumerate()
        .map(|(i, s)| Reverse((t0 + next(s.rate, &mut rng), i)))
        .collect();
    let mut t = [Tally::default(); 4];
    while t[0].requests < a.requests {
        let Reverse((now_us, i)) = heap.pop().expect("sources");
        let s = &mut sources[i];
        let now = now_us as f64;
        let mut d = Tally {
            requests: 1,
            ..Tally::default()
        };
        // The counter, judged against the exact rule over its own admissions.
        let (o, st) = sliding_window_counter::decide(s.counter, now, &p, 1);
        if st.is_some() {
            s.counter = st;
        }
        while s
            .counter_admitted
            .front()
            .is_some_and(|&ts| ts <= now - p.window)
        {
            s.counter_admitted.pop_front();
        }
        let exact_allows = s.counter_admitted.len() as f64 + 1.0 <= p.limit;
        if o.allowed {
            d.counter_allowed = 1;
            s.counter_admitted.push_back(now);
            d.max_in_window = s.counter_admitted.len() as u64;
            d.false_allow = u64::from(!exact_allows);
        } else {
            d.false_deny = u64::from(exact_allows);
        }
        // The log on its own state.
        let (lo, change) = sliding_window_log::decide(&s.log, now, &p, 1);
        change.apply(&mut s.log);
        d.log_allowed = u64::from(lo.allowed);
        d.differ = u64::from(lo.allowed != o.allowed);
        t[0].add(&d);
        t[s.class].add(&d);
        heap.push(Reverse((now_us + next(s.rate, &mut rng), i)));
    }
    t
}

fn pct(n: u64, d: u64) -> f64 {
    100.0 * n as f64 / d.max(1) as f64
}

fn report(a: &Args, tallies: &[Tally; 4]) {
    let classes: Vec<String> = CLASSES
        .iter()
        .zip(tallies)
        .map(|(name, t)| {
            format!(
                "\"{name}\": {{\"requests\": {}, \"counter_allowed_pct\": {:.4}, \
                 \"log_allowed_pct\": {:.4}, \"false_allow_pct\": {:.5}, \
                 \"false_deny_pct\": {:.5}, \"side_by_side_differ_pct\": {:.5}, \
                 \"counter_vs_log_admitted\": {:.5}, \"max_admitted_in_a_window\": {}}}",
                t.requests,
                pct(t.counter_allowed, t.requests),
                pct(t.log_allowed, t.requests),
                pct(t.false_allow, t.requests),
                pct(t.false_deny, t.requests),
                pct(t.differ, t.requests),
                t.counter_allowed as f64 / t.log_allowed.max(1) as f64,
                t.max_in_window,
            )
        })
        .collect();
    println!(
        "{{\"mix\": \"{}\", \"sources\": {}, \"limit\": {}, \"window_ms\": {}, \"seed\": {}, {}}}",
        a.mix,
        a.sources,
        a.limit,
        a.window_ms,
        a.seed,
        classes.join(", ")
    );
}

/// The run with no arguments: a small trace, sanity-checked.
fn self_test() {
    let a = Args {
        requests: 200_000,
        sources: 200,
        limit: 20,
        window_ms: 10_000,
        seed: 7,
        mix: "wide".into(),
    };
    let tallies = run(&a);
    report(&a, &tallies);
    let t = tallies[0];
    assert_eq!(t.requests, a.requests);
    assert!(
        t.counter_allowed > 0 && t.counter_allowed < t.requests,
        "{t:?}"
    );
    // The estimate admits about what the exact log does, never wildly more.
    let ratio = t.counter_allowed as f64 / t.log_allowed as f64;
    assert!((0.95..1.05).contains(&ratio), "{t:?}");
    assert!(t.max_in_window <= 2 * a.limit, "{t:?}");
    println!("window_error self-test ok");
}

fn main() {
    if std::env::args().len() == 1 {
        self_test();
        return;
    }
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("window_error: {e}");
            std::process::exit(2);
        }
    };
    report(&a, &run(&a));
}

#[cfg(test)]
mod tests {
    #[test]
    fn self_test() {
        super::self_test();
    }
}
