//! Concurrency rules (`algorithm = "concurrency"`, `ACQUIRE`/`RELEASE`) on a real Redis
//! Cluster with two daemons: never more than `limit` slots held across hosts under
//! load, and a slot that comes back without a `RELEASE` when its connection closes,
//! its `max_hold` ends, or its daemon is killed; the local share while Redis is down;
//! and the refusals (`ERR TOKEN`, `CHECK` on a concurrency rule).

use crate::common::*;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config(cluster: &RedisCluster, rules: &str) -> String {
    format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 100\nprefix = \"rl\"\n\
         [fallback]\nhosts = 2\n{rules}",
        toml_str_array(&cluster.addrs())
    )
}

fn rule(name: &str, limit: u64, max_hold: &str) -> String {
    format!(
        "[[rule]]\nname = \"{name}\"\nalgorithm = \"concurrency\"\nlimit = {limit}\nmax_hold = \"{max_hold}\"\n"
    )
}

/// A connection whose `ACQUIRE`s are answered from Redis (every primary probed).
fn ready(d: &Daemon, rule: &str) -> Client {
    let mut c = d.connect();
    assert!(
        wait_until(Duration::from_secs(15), || {
            let probes: Vec<String> = (0..30)
                .map(|i| format!("ACQUIRE {rule} __ready{i}"))
                .collect();
            let replies = c.pipeline(&probes);
            replies.iter().all(|r| parse_reply(r).source == "redis")
        }),
        "never decided in Redis:\n{}",
        d.log_tail(20)
    );
    c
}

/// The token of an `ACQUIRE` reply, if it was allowed.
fn token(line: &str) -> Option<String> {
    let r = parse_reply(line);
    r.allowed()
        .then(|| line.split(' ').nth(7).expect("a token").to_owned())
}

#[test]
fn twelve_clients_on_two_hosts_never_hold_more_than_the_limit() {
    let cluster = RedisCluster::start();
    let limit = 4u64;
    let cfg = config(&cluster, &rule("jobs", limit, "30s"));
    let daemons = [Daemon::start(&cfg), Daemon::start(&cfg)];
    for d in &daemons {
        drop(ready(d, "jobs"));
    }
    let held = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let denials = Arc::new(AtomicU64::new(0));
    let run = Duration::from_secs(6);
    let start = Instant::now();
    std::thread::scope(|s| {
        for i in 0..12usize {
            let mut c = daemons[i % 2].connect();
            let (held, most, grants, denials) = (&held, &most, &grants, &denials);
            s.spawn(move || {
                let mut n = 0u64;
                // Bounded in time and in count.
                while start.elapsed() < run && n < 100_000 {
                    n += 1;
                    let line = c.request("ACQUIRE jobs shared");
                    let Some(t) = token(&line) else {
                        assert!(line.starts_with("DENY "), "{line}");
                        denials.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    grants.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1 + (n * 7 + i as u64) % 10));
                    held.fetch_sub(1, Ordering::SeqCst);
                    assert_eq!(c.request(&format!("RELEASE jobs shared {t}")), "OK");
                }
            });
        }
    });
    let (most, grants, denials) = (
        most.load(Ordering::SeqCst),
        grants.load(Ordering::Relaxed),
        denials.load(Ordering::Relaxed),
    );
    println!("12 clients, 2 hosts, limit {limit}, 6 s: {grants} grants, {denials} denials, at most {most} held at once");
    assert!(
        most <= limit as i64,
        "{most} slots held at once, limit {limit}"
    );
    assert_eq!(
        most, limit as i64,
        "the limit was never reached: utilisation"
    );
    assert!(grants > 200, "only {grants} grants");
}

#[test]
fn a_closed_connection_gives_its_slots_back_to_other_hosts_within_a_second() {
    let cluster = RedisCluster::start();
    let cfg = config(&cluster, &rule("jobs", 2, "60s"));
    let port = free_port();
    let d1 = Daemon::start(&format!("{cfg}[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let d2 = Daemon::start(&cfg);
    let mut a = ready(&d1, "jobs");
    let mut b = ready(&d2, "jobs");
    for _ in 0..2 {
        assert!(token(&a.request("ACQUIRE jobs k")).is_some());
    }
    let deny = parse_reply(&b.request("ACQUIRE jobs k"));
    assert_eq!((deny.verdict.as_str(), deny.remaining), ("DENY", 0));
    // wait_ms: until the oldest slot's max_hold ends, about 60 s away.
    assert!((55_000..=60_000).contains(&deny.wait_ms), "{deny:?}");
    drop(a);
    let closed = Instant::now();
    let mut got = None;
    while closed.elapsed() < Duration::from_secs(3) {
        if token(&b.request("ACQUIRE jobs k")).is_some() {
            got = Some(closed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("slots back on the other host {got:?} after the connection closed");
    assert!(got.is_some_and(|t| t <= Duration::from_secs(1)), "{got:?}");
    // Exactly the two: the second is free too, a third is not.
    assert!(token(&b.request("ACQUIRE jobs k")).is_some());
    assert!(!parse_reply(&b.request("ACQUIRE jobs k")).allowed());
    // The closing host counted them: every slot it took (the probes of `ready`, and 2)
    // given back as its connection closed, none held now.
    let series = |name: &str, label: &str| -> Option<f64> {
        scrape(port)
            .lines()
            .find(|l| l.starts_with(name) && l.contains("rule=\"jobs\"") && l.contains(label))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let taken = series("ratelimitd_slot_acquisitions_total", "source=\"redis\"");
    assert!(taken.is_some_and(|n| n >= 32.0), "{taken:?}");
    let closed = "cause=\"connection_closed\"";
    assert!(wait_until(Duration::from_secs(3), || series(
        "ratelimitd_slot_releases_total",
        closed
    ) == taken));
    assert_eq!(series("ratelimitd_slots_held", ""), Some(0.0));
}

#[test]
fn a_slot_lapses_when_its_max_hold_ends() {
    let cluster = RedisCluster::start();
    let cfg = config(&cluster, &rule("jobs", 1, "1500ms"));
    let (d1, d2) = (Daemon::start(&cfg), Daemon::start(&cfg));
    let mut a = ready(&d1, "jobs");
    let mut b = ready(&d2, "jobs");
    let taken = Instant::now();
    let t = token(&a.request("ACQUIRE jobs k")).expect("a slot");
    let deny = parse_reply(&b.request("ACQUIRE jobs k"));
    assert!(
        !deny.allowed() && deny.wait_ms <= 1500 && deny.wait_ms >= 1000,
        "{deny:?}"
    );
    let mut back = None;
    while taken.elapsed() < Duration::from_secs(4) {
        if token(&b.request("ACQUIRE jobs k")).is_some() {
            back = Some(taken.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("slot back {back:?} after it was taken (max_hold 1.5 s)");
    let back = back.expect("the slot never lapsed");
    assert!(
        back >= Duration::from_millis(1500),
        "{back:?}: before its max_hold"
    );
    assert!(back <= Duration::from_millis(2500), "{back:?}");
    // The holder's token names a slot that is gone.
    assert!(a
        .request(&format!("RELEASE jobs k {t}"))
        .starts_with("ERR TOKEN"));
}

#[test]
fn a_killed_daemons_slots_come_back_within_the_holder_lease() {
    let cluster = RedisCluster::start();
    let cfg = config(&cluster, &rule("jobs", 2, "60s"));
    let (mut d1, d2) = (Daemon::start(&cfg), Daemon::start(&cfg));
    let mut a = ready(&d1, "jobs");
    let mut b = ready(&d2, "jobs");
    for _ in 0..2 {
        assert!(token(&a.request("ACQUIRE jobs k")).is_some());
    }
    // Held past one renewal (every 3 s) before the kill.
    std::thread::sleep(Duration::from_millis(3500));
    assert!(!parse_reply(&b.request("ACQUIRE jobs k")).allowed());
    d1.signal(libc::SIGKILL);
    let killed = Instant::now();
    assert!(d1.wait_exit(Duration::from_secs(5)).is_some());
    let mut back = None;
    while killed.elapsed() < Duration::from_secs(13) {
        if token(&b.request("ACQUIRE jobs k")).is_some() {
            back = Some(killed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("a killed daemon's slot back {back:?} after the kill (lease 10 s, renewed every 3 s)");
    let back = back.expect("never came back");
    // Renewed at most 3 s before the kill for 10 s: back between 7 s and 10 s after.
    assert!(
        back >= Duration::from_secs(6),
        "{back:?}: renewals outlived the daemon?"
    );
    assert!(back <= Duration::from_secs(11), "{back:?}");
    drop(a);
}

#[test]
fn redis_down_each_host_holds_its_share_and_hands_it_back() {
    let mut cluster = RedisCluster::start();
    let cfg = config(&cluster, &rule("jobs", 4, "60s"));
    let d = Daemon::start(&cfg);
    let mut c = ready(&d, "jobs");
    cluster.kill_all();
    let replies: Vec<String> = (0..4).map(|_| c.request("ACQUIRE jobs k")).collect();
    let allowed: Vec<&String> = replies.iter().filter(|l| l.starts_with("ALLOW")).collect();
    assert_eq!(allowed.len(), 2, "4 ÷ 2 hosts: {replies:?}");
    assert!(
        allowed.iter().all(|l| parse_reply(l).source == "local"),
        "{replies:?}"
    );
    // A local slot is given back locally.
    let t = token(allowed[0]).unwrap();
    assert_eq!(c.request(&format!("RELEASE jobs k {t}")), "OK");
    assert!(token(&c.request("ACQUIRE jobs k")).is_some());
    // Redis back: the two local slots are handed back to Redis at the next renewal,
    // so Redis admits only the two others.
    cluster.restart_all();
    assert!(cluster.wait_healthy(Duration::from_secs(30)));
    let d2 = Daemon::start(&cfg);
    let mut other = d2.connect();
    let mut in_redis = 0;
    assert!(
        wait_until(Duration::from_secs(20), || {
            let r = parse_reply(&other.request("ACQUIRE jobs probe"));
            if r.source != "redis" {
                return false;
            }
            std::thread::sleep(Duration::from_millis(3500));
            let grants: Vec<String> = (0..4).map(|_| other.request("ACQUIRE jobs k")).collect();
            in_redis = grants.iter().filter(|l| l.starts_with("ALLOW")).count();
            true
        }),
        "Redis never came back"
    );
    assert_eq!(
        in_redis, 2,
        "the 2 local slots count in Redis after the hand-back"
    );
}

#[test]
fn refusals_name_the_problem() {
    let cluster = RedisCluster::start();
    let rules = format!(
        "{}[[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\ncapacity = 5\nrefill_rate = 1.0\n",
        rule("jobs", 1, "60s")
    );
    let d = Daemon::start(&config(&cluster, &rules));
    let mut c = ready(&d, "jobs");
    let e = c.request("CHECK jobs k");
    assert!(e.starts_with("ERR RULE ") && e.contains("ACQUIRE"), "{e}");
    let e = c.request("ACQUIRE tb k");
    assert!(
        e.starts_with("ERR RULE ") && e.contains("token_bucket"),
        "{e}"
    );
    let e = c.request("RELEASE jobs k 123-nope.1");
    assert!(e.starts_with("ERR TOKEN "), "{e}");
    let t = token(&c.request("ACQUIRE jobs k")).unwrap();
    // Another key's token is not this key's.
    assert!(c
        .request(&format!("RELEASE jobs other {t}"))
        .starts_with("ERR TOKEN"));
    assert_eq!(c.request(&format!("RELEASE jobs k {t}")), "OK");
    assert!(c
        .request(&format!("RELEASE jobs k {t}"))
        .starts_with("ERR TOKEN"));
    assert!(c.request("ACQUIRE nope k").starts_with("ERR RULE "));
    // Slots are given back by RELEASE, not REFUND, and are never part of a CHECKALL.
    let e = c.request("REFUND jobs k 1");
    assert!(e.starts_with("ERR COST ") && e.contains("RELEASE"), "{e}");
    let e = c.request("CHECKALL tb k 1 jobs k 1");
    assert!(e.starts_with("ERR RULE ") && e.contains("ACQUIRE"), "{e}");
    // Neither took anything from the token bucket.
    assert!(c.request("CHECK tb k 0").starts_with("ALLOW 5 5 "));
}

/// The primary of `cluster` holding `key` (it answers `EXISTS` with 1; the others
/// redirect).
fn owner(cluster: &RedisCluster, key: &str) -> Option<String> {
    cluster
        .primary_addrs()
        .into_iter()
        .find(|a| redis_text(a, &["EXISTS", key]).is_ok_and(|r| r.trim() == "1"))
}

#[test]
fn a_frozen_primary_leaves_the_slots_of_the_others_in_redis() {
    // No failover while frozen (the cluster would say CLUSTERDOWN for every key until a
    // replica is promoted): what is tested is the daemon's per-primary view.
    let cluster = RedisCluster::start_with_node_timeout(60_000);
    let cfg = config(&cluster, &rule("jobs", 2, "60s"));
    let d = Daemon::start(&cfg);
    let mut c = ready(&d, "jobs");
    // One key per primary: which one holds it is read from Redis.
    let mut keys: Vec<(String, String)> = Vec::new();
    for i in 0..40 {
        let key = format!("k{i}");
        let t = token(&c.request(&format!("ACQUIRE jobs {key}"))).expect("a slot");
        let at = owner(&cluster, &format!("rl:{{jobs:{key}}}:cc")).expect("an owner");
        assert_eq!(c.request(&format!("RELEASE jobs {key} {t}")), "OK");
        if !keys.iter().any(|(_, a)| *a == at) {
            keys.push((key, at));
        }
    }
    assert_eq!(keys.len(), 3, "{keys:?}");
    let (frozen_key, frozen_at) = keys[0].clone();
    let (healthy_key, _) = keys[1].clone();
    // A slot of the healthy key held across the freeze, longer than the holder lease.
    let held = token(&c.request(&format!("ACQUIRE jobs {healthy_key}"))).unwrap();
    let _frozen = cluster.freeze(&frozen_at);
    let frozen_at_start = Instant::now();
    let mut rounds = 0;
    while frozen_at_start.elapsed() < Duration::from_secs(12) {
        rounds += 1;
        // The healthy key: exactly one more slot, from Redis, and given back there.
        let r = c.request(&format!("ACQUIRE jobs {healthy_key}"));
        let t = token(&r).unwrap_or_else(|| panic!("round {rounds}: {r}"));
        assert_eq!(parse_reply(&r).source, "redis", "{r}");
        let full = parse_reply(&c.request(&format!("ACQUIRE jobs {healthy_key}")));
        assert_eq!(
            (full.verdict.as_str(), full.source.as_str()),
            ("DENY", "redis")
        );
        assert_eq!(c.request(&format!("RELEASE jobs {healthy_key} {t}")), "OK");
        // The frozen primary's key: answered (locally) all the same.
        let f = parse_reply(&c.request(&format!("ACQUIRE jobs {frozen_key}")));
        assert_ne!(f.source, "redis", "{f:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "{rounds} rounds over 12 s with one primary frozen: the others' slots stayed in Redis"
    );
    // Renewed throughout (12 s > the 10 s lease): still held.
    assert_eq!(
        c.request(&format!("RELEASE jobs {healthy_key} {held}")),
        "OK"
    );
}

plain_and_tls!(every_slot_call_runs_under_the_documented_acl);

/// Acquire, deny, renew (held past one renewal), release, and a closed connection's
/// give-back, on a plain cluster and on one reached over TLS as the documented
/// least-privilege ACL user, which must refuse the script nothing.
fn every_slot_call_runs_under_the_documented_acl(flavor: crate::secure_redis::Flavor) {
    let cluster = crate::secure_redis::TestCluster::start(flavor);
    let cfg = format!(
        "[redis]\n{}timeout_ms = 200\nprefix = \"rl\"\n{}\
         [[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\ncapacity = 5\nrefill_rate = 1.0\n",
        cluster.redis_fields(),
        rule("jobs", 1, "60s")
    );
    let d = Daemon::start(&cfg);
    let mut a = crate::secure_redis::connect_in_redis(&d, "tb");
    let t = token(&a.request("ACQUIRE jobs k")).expect("a slot");
    assert_eq!(parse_reply(&a.request("ACQUIRE jobs k")).source, "redis");
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(a.request(&format!("RELEASE jobs k {t}")), "OK");
    let mut b = d.connect();
    assert!(token(&b.request("ACQUIRE jobs k")).is_some());
    drop(b);
    assert!(wait_until(Duration::from_secs(2), || token(
        &a.request("ACQUIRE jobs k")
    )
    .is_some()));
    cluster.assert_no_acl_denials();
}
