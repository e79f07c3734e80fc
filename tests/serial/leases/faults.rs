//! Leases through reloads and failed calls: a holder never loses track of a grant before
//! Redis acknowledged its end, and Redis never hands back units a holder may have spent.
//! Bounds from the rule and the measured interval: a token bucket admits at most
//! `capacity + refill_rate × T`; the drain must use at least 90 % of it.

use super::common::*;
use super::harness::*;
use crate::ONE_AT_A_TIME;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const STORM: &str = r#"
[[rule]]
name = "storm"
algorithm = "token_bucket"
capacity = 5000
refill_rate = 0.001
lease = "auto"
"#;
const STORM_CAPACITY: f64 = 5000.0;
const STORM_RATE: f64 = 0.001;

/// Reload storm: 3 daemons × 3 pipelining clients drain a bucket of 5,000 while every
/// daemon gets SIGHUP every 150 ms (each reload stops the leases held being spent; they
/// are given back with their unspent units, never refunded whole): at most capacity +
/// refill × T admitted, at least 90 % of it.
#[test]
fn a_reload_storm_admits_no_more_than_the_bucket() {
    let s = Setup::start(STORM);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = s
        .daemons
        .iter()
        .map(|d| {
            let phase = Phase::default();
            load(
                &d.socket,
                "CHECK storm hot",
                3,
                50,
                Duration::ZERO,
                &stop,
                &phase,
            )
        })
        .collect();
    let mut reloads = 0;
    while started.elapsed() < Duration::from_secs(6) {
        for d in &s.daemons {
            d.signal(libc::SIGHUP);
        }
        reloads += 1;
        thread::sleep(Duration::from_millis(150));
    }
    let (_, all) = stop_and_join(&stop, handles);
    let t = started.elapsed().as_secs_f64();
    let bound = STORM_CAPACITY + STORM_RATE * t;
    println!(
        "reload storm: {} ALLOW of {} decisions in {t:.2} s, {reloads} SIGHUP per daemon (bound {bound:.0}, {:.1} %); by source {:?}",
        all.allowed(),
        all.total(),
        100.0 * all.allowed() as f64 / bound,
        all.0
    );
    for d in &s.daemons {
        assert!(
            d.log().contains("configuration reloaded"),
            "no reload seen: {}",
            d.log_tail(20)
        );
    }
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
    assert!(all.allowed() as f64 >= 0.9 * bound, "under-used: {all:?}");
}

const FROZEN: &str = r#"
[[rule]]
name = "gb"
algorithm = "token_bucket"
capacity = 20000
refill_rate = 0.001
lease = "auto"
on_redis_failure = "deny"
"#;
const FROZEN_CAPACITY: f64 = 20000.0;
const FROZEN_RATE: f64 = 0.001;

/// The primary owning `key` (the one that holds it), among `cluster`'s.
fn owner(cluster: &RedisCluster, key: &str) -> String {
    cluster
        .primary_addrs()
        .into_iter()
        .find(|a| matches!(redis_command(a, &["EXISTS", key]), Ok(Resp::Int(1))))
        .expect("a primary holds the key")
}

/// A give-back that fails: the primary owning a drained key is frozen (SIGSTOP) for
/// 800 ms (past `redis.timeout_ms` = 150 ms, short of the cluster's failover) while the
/// three daemons' lease calls (each gives back the previous lease) are in flight, then
/// thawed; the calls it then runs late are answered to no one. With
/// `on_redis_failure = "deny"` nothing is admitted but from Redis and leases: at most
/// capacity + refill × T, at least 90 % of it.
#[test]
fn a_failed_give_back_admits_no_more_than_the_bucket() {
    let s = Setup::start_with(|| RedisCluster::start_with_node_timeout(15_000), FROZEN);
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Phase::default();
    let started = Instant::now();
    // 3 × 3 clients × 10 CHECKs every 10 ms: about 9,000/s, a bucket of 20,000 lasts
    // past the freeze.
    let handles: Vec<_> = s
        .daemons
        .iter()
        .map(|d| {
            let every = Duration::from_millis(10);
            load(&d.socket, "CHECK gb hot", 3, 10, every, &stop, &phase)
        })
        .collect();
    thread::sleep(Duration::from_millis(700));
    let primary = owner(&s.cluster, "rl:{gb:hot}:tb");
    let out = leases_out(&s.cluster, "gb:hot");
    s.cluster.signal_node(&primary, libc::SIGSTOP);
    phase.store(1, Ordering::Relaxed);
    thread::sleep(Duration::from_millis(800));
    s.cluster.signal_node(&primary, libc::SIGCONT);
    phase.store(2, Ordering::Relaxed);
    thread::sleep(Duration::from_secs(5));
    let (_, all) = stop_and_join(&stop, handles);
    let t = started.elapsed().as_secs_f64();
    let bound = FROZEN_CAPACITY + FROZEN_RATE * t;
    println!(
        "frozen give-back: {out} leases out at the freeze; {} ALLOW before, {} during ({} from leases), {} after; {} of {} decisions in {t:.2} s (bound {bound:.0}, {:.1} %)",
        all.allowed_in(0),
        all.allowed_in(1),
        all.from(1, "lease", true),
        all.allowed_in(2),
        all.allowed(),
        all.total(),
        100.0 * all.allowed() as f64 / bound
    );
    assert!(out > 0, "no lease out at the freeze: {all:?}");
    assert!(all.allowed() as f64 <= bound, "over-admitted: {all:?}");
    assert!(
        all.allowed_in(2) > 0,
        "nothing admitted after the thaw: {all:?}"
    );
    assert!(all.allowed() as f64 >= 0.9 * bound, "under-used: {all:?}");
}

/// The value of the unlabelled series `name` in a scrape.
fn series(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in the scrape: {scrape}"))
}

/// A lease call whose client resets its connection mid-call is no longer counted in
/// flight (the call's future is dropped; a guard releases the count), and the lease
/// series report what one daemon did. Every primary is frozen so calls hang until
/// `redis.timeout_ms` (3 s): one client waits for its answer (counted), another resets
/// its connection at once (not counted 1.5 s later, well before that timeout).
#[test]
fn a_call_abandoned_by_its_client_leaves_no_count_and_the_series_report_leases() {
    use std::io::Write;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = RedisCluster::start_with_node_timeout(15_000);
    let port = free_port();
    let daemon = Daemon::start(&format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 3000\nprefix = \"rl\"\n\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n{STORM}",
        toml_str_array(&cluster.addrs())
    ));
    // A hot key takes leases; then it goes idle and the sweep gives them back.
    let mut c = daemon.connect();
    let lines = vec!["CHECK storm warm".to_string(); 200];
    let from_leases: usize = (0..5)
        .map(|_| {
            let replies = c.pipeline(&lines);
            replies.iter().filter(|r| r.contains(" lease")).count()
        })
        .sum();
    thread::sleep(Duration::from_millis(2500));
    let before = scrape(port);
    let primaries = cluster.primary_addrs();
    primaries
        .iter()
        .for_each(|p| cluster.signal_node(p, libc::SIGSTOP));
    let mut reset = std::os::unix::net::UnixStream::connect(&daemon.socket).expect("connect");
    reset.write_all(b"PING\n").expect("write");
    // PONG waits unread in our buffer: closing now resets the connection.
    thread::sleep(Duration::from_millis(100));
    reset.write_all(b"CHECK storm b\n").expect("write");
    drop(reset);
    // Sent after the abandoned call: counted only if calls still go out.
    let socket = daemon.socket.clone();
    let waiting = thread::spawn(move || {
        let mut c = Client::connect(&socket);
        c.set_read_timeout(Duration::from_secs(10));
        c.pipeline(&["CHECK storm a".to_string()])
    });
    thread::sleep(Duration::from_millis(1500));
    let during = scrape(port);
    let reply = waiting.join().expect("waiting client");
    thread::sleep(Duration::from_millis(1500));
    let after = scrape(port);
    primaries
        .iter()
        .for_each(|p| cluster.signal_node(p, libc::SIGCONT));
    let in_flight = |s: &str| series(s, "ratelimitd_lease_calls_in_flight");
    println!(
        "{from_leases} of 1000 CHECKs from leases; in flight: {} while one call waits and one was abandoned, {} after; before the freeze: {} grants of {} units, {} given back ({} units returned, {} lapsed), {} held, {} keys; reply {reply:?}",
        in_flight(&during),
        in_flight(&after),
        series(&before, "ratelimitd_lease_grants_total"),
        series(&before, "ratelimitd_lease_granted_units_total"),
        series(&before, "ratelimitd_lease_give_backs_total"),
        series(&before, "ratelimitd_lease_returned_units_total"),
        series(&before, "ratelimitd_lease_lapsed_units_total"),
        series(&before, "ratelimitd_lease_held"),
        series(&before, "ratelimitd_lease_keys"),
    );
    // Keys warm, b (the abandoned call reached the lease flow) and a.
    assert_eq!(series(&during, "ratelimitd_lease_keys"), 3.0, "{during}");
    assert_eq!(in_flight(&during), 1.0, "{during}");
    assert_eq!(in_flight(&after), 0.0, "{after}");
    assert_idle_leases_given_back(&before, from_leases);
}

/// After a hot key's CHECKs (`from_leases` of them answered from leases) and an idle
/// spell: grants taken, every one given back, nothing held.
fn assert_idle_leases_given_back(before: &str, from_leases: usize) {
    // 1,000 CHECKs from a hot key: grants taken and, idle, all given back.
    assert!(from_leases > 0, "no CHECK answered from a lease");
    assert!(series(before, "ratelimitd_lease_grants_total") >= 1.0);
    let granted = series(before, "ratelimitd_lease_granted_units_total");
    let returned = series(before, "ratelimitd_lease_returned_units_total");
    let lapsed = series(before, "ratelimitd_lease_lapsed_units_total");
    assert!(
        granted >= from_leases as f64,
        "{from_leases} from leases: {before}"
    );
    assert!(returned + lapsed <= granted, "{before}");
    assert_eq!(series(before, "ratelimitd_lease_held"), 0.0, "{before}");
    assert_eq!(
        series(before, "ratelimitd_lease_units_out"),
        0.0,
        "{before}"
    );
    assert_eq!(
        series(before, "ratelimitd_lease_give_backs_total"),
        series(before, "ratelimitd_lease_grants_total"),
        "{before}"
    );
    assert!(series(before, "ratelimitd_lease_keys") >= 1.0);
}
