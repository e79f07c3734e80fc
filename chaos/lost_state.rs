//! Chaos scenarios: Redis losing what the daemon relies on: its script cache, its connections.

use super::*;

/// Scenario 4: `SCRIPT FLUSH` on every primary, three times: NOSCRIPT reloads keep decisions in
/// Redis (a decision that cannot reload in time is answered per `on_redis_failure`).
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s4_script_flush() {
    let mut sc = Scenario::start(
        "s4_script_flush",
        "SCRIPT FLUSH on every primary, 3 times",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    for _ in 0..3 {
        sc.fault_begins();
        for p in &primaries {
            match redis_text(p, &["SCRIPT", "FLUSH"]) {
                Ok(ok) if ok == "OK" => {}
                other => sc.failures.push(format!("SCRIPT FLUSH on {p}: {other:?}")),
            }
        }
        sc.wait_redis_answers();
        thread::sleep(Duration::from_millis(1300));
    }
    sc.finish(Fallback::Allowed, Transitions::AtMost(1), 0);
}

/// Scenario 6: Redis drops every client connection (`CLIENT KILL TYPE normal` on every
/// primary), 8 times 250 ms apart: the daemon reconnects; requests caught on a dropped
/// connection are answered per `on_redis_failure`.
#[test]
#[ignore = "chaos suite: run by chaos/run.sh"]
fn s6_client_kill() {
    let mut sc = Scenario::start(
        "s6_client_kill",
        "CLIENT KILL TYPE normal on every primary, 8x every 250 ms",
        1,
        4,
    );
    let primaries = sc.cluster.primary_addrs();
    sc.fault_begins();
    for i in 0..8 {
        if i > 0 {
            thread::sleep(Duration::from_millis(250));
        }
        for p in &primaries {
            if let Err(e) = redis_text(p, &["CLIENT", "KILL", "TYPE", "normal"]) {
                sc.failures.push(format!("CLIENT KILL on {p}: {e}"));
            }
        }
    }
    sc.wait_redis_answers();
    sc.finish(Fallback::Allowed, Transitions::AtMost(8), 0);
}
