//! Chaos scenarios: one primary failing while the others are healthy (frozen, killed
//! with no replica, out of memory). Health is per primary: only the failed primary's
//! keys may be decided without Redis; the rest must stay in Redis.
//!
//! On top of the suite's own checks ([`Scenario::finish`]), each asserts from the
//! clients' timestamps and the owner of every key's slot (asked of the cluster before
//! the fault): healthy-slot replies ≥ 99 % decided by Redis (`redis`, or `cache`: a DENY
//! Redis decided) while the fault lasts; failed-slot replies within `timeout_ms` + 5 ms
//! at p99 and [`MAX_BOUND`] at most (the tolerance for a loaded 2-core machine); no
//! fallback for a request sent more than 1 s after the primary answers again; ≤ 2
//! transitions of the failed primary's breaker and none of the others'.

use super::*;
use std::collections::HashMap;

/// Share of healthy-slot replies that Redis must have decided during the fault.
const HEALTHY_REDIS_SHARE: f64 = 0.99;

/// The primary owning each `(rule, key)` of the load (its key's slot), by address.
pub(crate) fn owners(primaries: &[String]) -> HashMap<(usize, u32), String> {
    let mut map = HashMap::new();
    for (rule, (name, _)) in RULES.iter().enumerate() {
        for key in 0..KEYS {
            let redis_key = format!("rl:{{{name}:k{key}}}:tb");
            for p in primaries {
                match redis_command(p, &["EXISTS", &redis_key]) {
                    Ok(Resp::Int(_)) => {
                        map.insert((rule, key), p.clone());
                        break;
                    }
                    _ => continue, // MOVED: another primary's
                }
            }
        }
    }
    map
}

/// Per-primary breaker transitions in a daemon log: (ms on the load's timeline,
/// `true` = down, primary address).
pub(crate) fn primary_transitions(log: &str, t0: SystemTime) -> Vec<(f64, bool, String)> {
    log.lines()
        .filter_map(|line| {
            let down = line.contains("Redis primary down");
            if !down && !line.contains("Redis primary up") {
                return None;
            }
            let at = log_time_ms(line, t0).unwrap_or(f64::NAN);
            let primary = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("primary="))
                .unwrap_or("?")
                .to_owned();
            Some((at, down, primary))
        })
        .collect()
}

/// What one fault of one primary did, as measured.
pub(crate) struct OnePrimary {
    pub(crate) victim: String,
    pub(crate) fault: Duration,
    /// When the fault was lifted (SIGCONT, restart, memory back).
    pub(crate) lifted: Duration,
    /// When the victim accepted a write again (the test's own check).
    pub(crate) answering: Duration,
}

/// Checks the per-primary rules of the module comment on `samples`; pushes failures
/// on `sc` and returns the figures as JSON.
pub(crate) fn judge_one_primary(
    sc: &mut Scenario,
    samples: &[Sample],
    owners: &HashMap<(usize, u32), String>,
    f: &OnePrimary,
) -> String {
    let on_victim = |s: &Sample| owners.get(&(s.rule, s.key)) == Some(&f.victim);
    let during = |s: &Sample| s.sent >= f.fault && s.sent <= f.answering;
    let healthy: Vec<&Sample> = samples
        .iter()
        .filter(|s| during(s) && !on_victim(s))
        .collect();
    let healthy_redis = healthy.iter().filter(|s| !s.is_fallback()).count();
    let share = healthy_redis as f64 / healthy.len().max(1) as f64;
    if healthy.is_empty() || share < HEALTHY_REDIS_SHARE {
        sc.failures.push(format!(
            "healthy-slot replies decided by Redis during the fault: {healthy_redis}/{} = {:.4} < {HEALTHY_REDIS_SHARE}",
            healthy.len(),
            share
        ));
    }
    let mut victim_lat: Vec<Duration> = samples
        .iter()
        .filter(|s| s.sent >= f.fault && s.sent <= f.lifted && on_victim(s))
        .map(|s| s.latency)
        .collect();
    victim_lat.sort();
    let p99 = percentile(&victim_lat, 0.99);
    let max = victim_lat.last().copied().unwrap_or_default();
    if p99 > P99_BOUND || max > MAX_BOUND {
        sc.failures.push(format!(
            "failed-slot replies during the fault: p99 {:.1} ms (bound {:.0}), max {:.1} ms (bound {:.0})",
            ms(p99),
            ms(P99_BOUND),
            ms(max),
            ms(MAX_BOUND)
        ));
    }
    let victim_fallback = samples
        .iter()
        .filter(|s| during(s) && on_victim(s) && s.is_fallback())
        .count();
    // Back in Redis: the last fallback for the victim's keys, from when it answered.
    let last_fallback = samples
        .iter()
        .filter(|s| on_victim(s) && s.is_fallback() && s.sent >= f.fault)
        .map(|s| s.sent)
        .max();
    let back_ms = last_fallback.map_or(0.0, |t| ms(t.saturating_sub(f.answering)));
    if back_ms > ms(RECOVERY_BOUND) {
        sc.failures.push(format!(
            "failed-slot keys still decided without Redis {back_ms:.0} ms after the primary answered (bound {:.0})",
            ms(RECOVERY_BOUND)
        ));
    }
    let mut transitions = Vec::new();
    for (d, daemon) in sc.daemons.iter().enumerate() {
        let t = primary_transitions(&daemon.log(), sc.load_t0_wall);
        let victim_t = t.iter().filter(|e| e.2 == f.victim).count();
        let others_t = t.iter().filter(|e| e.2 != f.victim).count();
        if victim_t > 2 {
            sc.failures.push(format!(
                "daemon {d}: {victim_t} transitions of {}'s breaker (bound 2)",
                f.victim
            ));
        }
        if others_t > 0 {
            sc.failures.push(format!(
                "daemon {d}: {others_t} transitions of healthy primaries' breakers: {t:?}"
            ));
        }
        transitions.push(format!("[{victim_t}, {others_t}]"));
    }
    format!(
        "{{\"victim\": {}, \"fault_ms\": {:.0}, \"lifted_ms\": {:.0}, \"answering_ms\": {:.0}, \
         \"healthy_replies\": {}, \"healthy_redis_share\": {share:.5}, \
         \"victim_latency_during_fault\": {}, \"victim_fallback_replies\": {victim_fallback}, \
         \"victim_back_after_answering_ms\": {back_ms:.0}, \
         \"transitions_victim_others_per_daemon\": [{}]}}",
        json_str(&f.victim),
        ms(f.fault),
        ms(f.lifted),
        ms(f.answering),
        healthy.len(),
        latency_json(&victim_lat),
        transitions.join(", ")
    )
}

/// Runs one single-primary fault: `inject` at the fault, `lift` after `hold`, then
/// waits for the victim to accept writes and judges. The cluster runs with
/// `cluster-node-timeout = node_timeout_ms`.
#[allow(clippy::too_many_arguments)]
fn one_primary_scenario(
    (name, title): (&'static str, &'static str),
    victim_index: usize,
    hold: Duration,
    node_timeout_ms: u64,
    data_losses: u32,
    prepare: impl FnOnce(&mut Scenario, &str),
    inject: impl FnOnce(&mut Scenario, &str),
    lift: impl FnOnce(&mut Scenario, &str),
) {
    let mut sc = Scenario::start_with_node_timeout(name, title, 1, 4, node_timeout_ms);
    let primaries = sc.cluster.primary_addrs();
    let victim = primaries[victim_index].clone();
    let owners = owners(&primaries);
    prepare(&mut sc, &victim);
    sc.fault_begins();
    let fault = sc.now();
    inject(&mut sc, &victim);
    thread::sleep(hold);
    let lifted = sc.now();
    lift(&mut sc, &victim);
    let mut answering = sc.now();
    let t0 = sc.load.as_ref().expect("load").t0;
    if !wait_until(ANSWER_TIMEOUT, || {
        answering = t0.elapsed();
        accepts_write(&victim)
    }) {
        sc.failures.push(format!(
            "{victim} did not accept a write within {ANSWER_TIMEOUT:?}"
        ));
    }
    sc.episodes.last_mut().expect("a fault").answering = Some(answering);
    let f = OnePrimary {
        victim,
        fault,
        lifted,
        answering,
    };
    sc.finish_with(
        Fallback::Required,
        Transitions::One,
        data_losses,
        |sc, samples| judge_one_primary(sc, samples, &owners, &f),
    );
}

/// Scenario 9: `SIGSTOP` one of the 3 primaries for 3 s under load across all slots.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s9_freeze_one_primary() {
    one_primary_scenario(
        ("s9_freeze_one_primary", "SIGSTOP one primary of 3 for 3 s"),
        1,
        Duration::from_secs(3),
        // Silent for cluster-node-timeout, a primary is marked failed and its replica
        // promoted: with the default 2 s this freeze would become a failover (s1's
        // subject) in some runs. Here the cluster outlasts the freeze.
        6000,
        0,
        |_, _| {},
        |sc, v| sc.cluster.signal_node(v, libc::SIGSTOP),
        |sc, v| sc.cluster.signal_node(v, libc::SIGCONT),
    );
}

/// Scenario 10: `kill -9` one primary whose replica is gone
/// (`cluster-require-full-coverage no`: the others keep serving), restart it 3 s later.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s10_kill_primary_no_replica() {
    one_primary_scenario(
        (
            "s10_kill_primary_no_replica",
            "kill -9 a primary with no replica, restart",
        ),
        0,
        Duration::from_secs(3),
        CLUSTER_NODE_TIMEOUT_MS,
        1, // restarted empty
        |sc, v| {
            for a in sc.addrs.clone() {
                let _ = redis_text(
                    &a,
                    &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
                );
            }
            // Its replica: the node whose INFO says it replicates the victim's port.
            let port = v.rsplit(':').next().unwrap_or_default().to_owned();
            for r in sc.cluster.replica_addrs() {
                let info = redis_text(&r, &["INFO", "replication"]).unwrap_or_default();
                if info.contains(&format!("master_port:{port}\r")) {
                    sc.cluster.kill_node(&r);
                }
            }
        },
        |sc, v| sc.cluster.kill_node(v),
        |sc, v| sc.cluster.restart_node(v),
    );
}

/// Scenario 11: out of memory (`maxmemory 1`, `noeviction`) on one primary for 2 s.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s11_oom_one_primary() {
    one_primary_scenario(
        (
            "s11_oom_one_primary",
            "maxmemory 1 + noeviction on one primary, 2 s",
        ),
        2,
        Duration::from_secs(2),
        CLUSTER_NODE_TIMEOUT_MS,
        0,
        |_, _| {},
        |sc, v| {
            for (k, val) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
                if redis_text(v, &["CONFIG", "SET", k, val]).ok().as_deref() != Some("OK") {
                    sc.failures
                        .push(format!("CONFIG SET {k} {val} on {v} failed"));
                }
            }
        },
        |sc, v| {
            if redis_text(v, &["CONFIG", "SET", "maxmemory", "0"])
                .ok()
                .as_deref()
                != Some("OK")
            {
                sc.failures
                    .push(format!("CONFIG SET maxmemory 0 on {v} failed"));
            }
        },
    );
}
