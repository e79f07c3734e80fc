//! Chaos scenarios: a Redis that answers badly: frozen primaries, out of memory, slow scripts.

use super::*;

/// Scenario 3: `SIGSTOP` every primary for 3 s (Redis hangs: timeouts, not refusals), `SIGCONT`.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s3_freeze_primaries() {
    let mut sc = Scenario::start(
        "s3_freeze_primaries",
        "SIGSTOP every primary for 3 s, then SIGCONT",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    sc.fault_begins();
    for p in &primaries {
        sc.cluster.signal_node(p, libc::SIGSTOP);
    }
    thread::sleep(Duration::from_secs(3));
    for p in &primaries {
        sc.cluster.signal_node(p, libc::SIGCONT);
    }
    sc.wait_redis_answers();
    sc.finish(Fallback::Required, Transitions::One, 0);
}

/// Scenario 5: Out of memory: `maxmemory` 1 byte with `noeviction` on every primary, so writes
/// and the scripts' writes fail with OOM, for 2 s; then memory back.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s5_out_of_memory() {
    let mut sc = Scenario::start(
        "s5_out_of_memory",
        "maxmemory 1 + noeviction on every primary for 2 s",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    sc.fault_begins();
    for p in &primaries {
        for (k, v) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
            if redis_text(p, &["CONFIG", "SET", k, v]).ok().as_deref() != Some("OK") {
                sc.failures
                    .push(format!("CONFIG SET {k} {v} on {p} failed"));
            }
        }
    }
    thread::sleep(Duration::from_secs(2));
    for p in &primaries {
        if redis_text(p, &["CONFIG", "SET", "maxmemory", "0"])
            .ok()
            .as_deref()
            != Some("OK")
        {
            sc.failures
                .push(format!("CONFIG SET maxmemory 0 on {p} failed"));
        }
    }
    sc.wait_redis_answers();
    sc.finish(Fallback::Required, Transitions::One, 0);
}

/// Scenario 7: A slow Redis: three bursts of `DEBUG SLEEP 0.4` on every primary (16 × the
/// decision timeout), 1.5 s apart.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s7_slow_redis() {
    let mut sc = Scenario::start(
        "s7_slow_redis",
        "DEBUG SLEEP 0.4 on every primary, 3 bursts",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    for burst in 0..3 {
        if burst > 0 {
            thread::sleep(Duration::from_millis(1500));
        }
        sc.fault_begins();
        let results: Vec<std::io::Result<String>> = thread::scope(|s| {
            let sleepers: Vec<_> = primaries
                .iter()
                .map(|p| s.spawn(move || redis_text(p, &["DEBUG", "SLEEP", "0.4"])))
                .collect();
            sleepers
                .into_iter()
                .map(|h| h.join().expect("sleeper"))
                .collect()
        });
        for r in results {
            if r.as_deref().ok() != Some("OK") {
                sc.failures.push(format!("DEBUG SLEEP: {r:?}"));
            }
        }
        sc.wait_redis_answers();
    }
    sc.finish(Fallback::Required, Transitions::One, 0);
}
