//! A failover to a replica whose clock is 2 s behind does not let a fixed window admit
//! more than its limit.
//!
//! The scripts decide on the Redis clock and treat a clock behind the stored state as
//! standing still (the decision instant is clamped to the state's). A key's expiry is
//! counted from the node's own clock, never from the clamped instant: counted from the
//! clamped one, a key written right after the failover expired while its window was
//! still open on the new primary's clock, and the window admitted its limit again.
//!
//! The replica runs with its wall clock shifted by −2 s. libfaketime (Debian's
//! `faketime`) cannot be preloaded into Debian's redis-server: both it and jemalloc, which
//! redis-server links, call `clock_gettime` while initialising and libfaketime aborts
//! (libfaketime issue #130). So the test builds a 20-line preload library doing what
//! `FAKETIME="-2s"` does for the realtime clock (`clock_gettime(CLOCK_REALTIME*)`,
//! `gettimeofday`, `time`), with the raw system call underneath. It needs `cc`.
//!
//! Own test binary: the replica is started with `LD_PRELOAD` set in this process's
//! environment for the moment of its spawn, which no other test may share.

mod common;

use common::clock_shim::{build_clock_shim, OFFSET_FROM_ENV};
use common::*;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The clock offset of the replica, µs.
const OFFSET_US: i64 = -2_000_000;
/// The rule: 10 per 2 s window.
const LIMIT: usize = 10;
const WINDOW_S: f64 = 2.0;

fn wall_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// Redis `TIME` of `addr`, seconds.
fn redis_time(addr: &str) -> f64 {
    let t = redis_command(addr, &["TIME"])
        .expect("TIME")
        .into_strings()
        .expect("TIME reply");
    t[0].parse::<f64>().expect("s") + t[1].parse::<f64>().expect("µs") / 1e6
}

/// The primary serving `slot` and its replica, from `CLUSTER NODES` seen by `addr`.
fn owner_and_replica(cluster: &RedisCluster, addr: &str, slot: u16) -> (String, String) {
    let nodes = cluster.cli(addr, &["CLUSTER", "NODES"]);
    let lines: Vec<Vec<&str>> = nodes.lines().map(|l| l.split(' ').collect()).collect();
    let owner = lines
        .iter()
        .find(|f| {
            f[2].contains("master")
                && f[8..].iter().any(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
                })
        })
        .unwrap_or_else(|| panic!("no owner of slot {slot}:\n{nodes}"));
    let replica = lines
        .iter()
        .find(|f| f[2].contains("slave") && f[3] == owner[0])
        .unwrap_or_else(|| panic!("no replica of {}:\n{nodes}", owner[1]));
    let addr_of = |f: &[&str]| f[1].split('@').next().expect("addr").to_string();
    (addr_of(owner), addr_of(replica))
}

#[test]
fn a_failover_to_a_replica_2_s_behind_admits_no_window_above_its_limit() {
    let dir = short_tempdir("rld-clock-");
    let lib = build_clock_shim(dir.path(), "clockshift", OFFSET_FROM_ENV);

    let mut cluster = RedisCluster::start();
    let seed = cluster.addrs()[0].clone();
    let slot: u16 = cluster
        .cli(&seed, &["CLUSTER", "KEYSLOT", "fw:k"])
        .parse()
        .expect("slot");
    let (primary, replica) = owner_and_replica(&cluster, &seed, slot);

    // The replica again, its clock 2 s behind.
    std::env::set_var("LD_PRELOAD", &lib);
    std::env::set_var("RLD_CLOCK_OFFSET_US", OFFSET_US.to_string());
    cluster.kill_node(&replica);
    cluster.restart_node(&replica);
    std::env::remove_var("LD_PRELOAD");
    std::env::remove_var("RLD_CLOCK_OFFSET_US");
    let behind = redis_time(&primary) - redis_time(&replica);
    assert!((1.8..2.2).contains(&behind), "replica behind by {behind} s");
    assert!(
        cluster.wait_healthy(Duration::from_secs(30)),
        "{}",
        cluster.logs_tail(20)
    );
    assert!(
        wait_until(Duration::from_secs(20), || redis_text(
            &replica,
            &["INFO", "replication"]
        )
        .is_ok_and(|i| i.contains("master_link_status:up"))),
        "replica never synced"
    );

    let nodes: Vec<String> = cluster.addrs().iter().map(|n| format!("\"{n}\"")).collect();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = [{}]\ntimeout_ms = 100\n\n[cache]\nttl_ms = 0\n\n\
         [[rule]]\nname = \"fw\"\nalgorithm = \"fixed_window\"\nlimit = {LIMIT}\nwindow = \"2s\"\n",
        nodes.join(", ")
    );
    let d = Daemon::start(&config);
    let mut c = d.connect();
    let line = "CHECK fw k".to_string();

    // 50 ms into a window on the primary's clock (the host's), take half the limit.
    let now = wall_s();
    let l0 = (now / WINDOW_S).floor() + 1.0;
    sleep(Duration::from_secs_f64(l0 * WINDOW_S + 0.05 - now));
    let start = l0 * WINDOW_S;
    for i in 0..LIMIT / 2 {
        let r = parse_reply(&c.request(&line));
        assert_eq!(
            (r.verdict.as_str(), r.source.as_str()),
            ("ALLOW", "redis"),
            "request {i}"
        );
    }
    // Promote the replica (a manual failover: no write lost).
    let asked = Instant::now();
    cluster.cli(&replica, &["CLUSTER", "FAILOVER"]);
    assert!(
        wait_until(Duration::from_secs(10), || redis_text(
            &replica,
            &["INFO", "replication"]
        )
        .is_ok_and(|i| i.contains("role:master"))),
        "the replica was not promoted"
    );
    let promoted = wall_s();
    eprintln!(
        "promoted {:.0} ms after asking, {:.2} s into window {l0}",
        asked.elapsed().as_secs_f64() * 1000.0,
        promoted - start
    );
    assert!(
        promoted < start + WINDOW_S - 0.1,
        "failover too slow for this test's timeline"
    );

    // Every 50 ms until 3 windows after `start`, each request stamped when sent.
    let mut sent = Vec::new();
    while wall_s() < start + 3.0 * WINDOW_S {
        let at = wall_s();
        sent.push((at, parse_reply(&c.request(&line))));
        sleep(Duration::from_millis(50));
    }
    // On the new primary's clock (2 s behind) the window that started at `start` lasts
    // until start + 2 s + 2 s on the host's; before, its clock is behind the stored
    // window and stands still in it. A request sent 100 ms before that is decided in it.
    let redis_allow = |from: f64, to: f64| {
        sent.iter()
            .filter(|(t, r)| *t >= from && *t < to && r.allowed() && r.source == "redis")
            .count()
    };
    let first = LIMIT / 2 + redis_allow(start, start + 2.0 * WINDOW_S - 0.1);
    let next = redis_allow(start + 2.0 * WINDOW_S + 0.1, start + 3.0 * WINDOW_S);
    let local = sent
        .iter()
        .filter(|(_, r)| r.allowed() && r.source == "local")
        .count();
    let sources: std::collections::BTreeSet<&str> =
        sent.iter().map(|(_, r)| r.source.as_str()).collect();
    eprintln!(
        "window {l0}: {first} admitted by Redis (limit {LIMIT}); the next window on the new primary's clock: {next}; local: {local}; sources {sources:?}"
    );
    assert!(
        first <= LIMIT,
        "window {l0} admitted {first} > {LIMIT}: {sent:?}"
    );
    assert!(
        next <= LIMIT,
        "the next window admitted {next} > {LIMIT}: {sent:?}"
    );
    assert!(
        next > 0,
        "the new primary never decided: {sent:?}\n{}",
        d.log()
    );
}
