//! `CHECKALL`: several limits decided as one request, all or nothing. Eight clients on
//! two daemons over a real Redis Cluster hammer two limits whose keys live on different
//! primaries (so every request takes a reservation on one and may undo it): exactly the
//! tighter limit is admitted and the other keeps the rest; the same with the tighter
//! limit's primary frozen and with one daemon paused; the binding triple's fields and
//! rule name; protocol errors; and the same all-or-nothing decision without Redis.

use crate::common;

use common::*;
use std::time::Duration;

/// Two token buckets that do not refill within a test (10⁻⁶ token/s).
const TWO_LIMITS: &str = r#"
[[rule]]
name = "x"
algorithm = "token_bucket"
capacity = 100
refill_rate = 0.000001

[[rule]]
name = "y"
algorithm = "token_bucket"
capacity = 60
refill_rate = 0.000001
"#;

const X_CAPACITY: u64 = 100;
const Y_CAPACITY: u64 = 60;
/// Clients per daemon, requests per client: 8 × 20 = 160, well over either limit.
const CLIENTS_PER_DAEMON: usize = 4;
const REQUESTS_PER_CLIENT: usize = 20;

fn cluster_config(cluster: &RedisCluster, timeout_ms: u64) -> String {
    format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = {timeout_ms}\nprefix = \"rl\"\n\n[fallback]\nhosts = 2\n{TWO_LIMITS}",
        toml_str_array(&cluster.primary_addrs())
    )
}

/// The primary (`host:port`) owning `key`'s slot, from `CLUSTER NODES`.
fn owner(cluster: &RedisCluster, key: &str) -> String {
    let primaries = cluster.primary_addrs();
    let slot: u16 = cluster
        .cli(&primaries[0], &["CLUSTER", "KEYSLOT", key])
        .trim()
        .parse()
        .expect("CLUSTER KEYSLOT");
    let nodes = cluster.cli(&primaries[0], &["CLUSTER", "NODES"]);
    for line in nodes.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 || !f[2].contains("master") {
            continue;
        }
        let addr = f[1].split('@').next().unwrap_or("").to_string();
        for range in &f[8..] {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>()) {
                if (a..=b).contains(&slot) {
                    return addr;
                }
            }
        }
    }
    panic!("no primary owns slot {slot}:\n{nodes}");
}

/// A key whose `x` and `y` buckets live on different primaries.
fn split_key(cluster: &RedisCluster) -> (String, String, String) {
    for i in 0..200 {
        let k = format!("k{i}");
        let (ox, oy) = (
            owner(cluster, &format!("x:{k}")),
            owner(cluster, &format!("y:{k}")),
        );
        if ox != oy {
            return (k, ox, oy);
        }
    }
    panic!("no key splits x and y over two primaries");
}

/// Eight clients, four per daemon, each sending `REQUESTS_PER_CLIENT` CHECKALLs one at
/// a time; every reply.
fn hammer(daemons: &[&Daemon], key: &str, during: impl FnOnce() + Send) -> Vec<String> {
    let line = format!("CHECKALL x {key} 1 y {key} 1");
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for d in daemons {
            for _ in 0..CLIENTS_PER_DAEMON {
                let line = line.clone();
                let mut c = d.connect();
                handles.push(s.spawn(move || {
                    (0..REQUESTS_PER_CLIENT)
                        .map(|_| c.request(&line))
                        .collect::<Vec<String>>()
                }));
            }
        }
        during();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("client thread"))
            .collect()
    })
}

/// Every reply is a CHECK reply followed by the window and the binding rule's name.
fn admitted(replies: &[String]) -> u64 {
    for r in replies {
        parse_reply(r);
        let f: Vec<&str> = r.split(' ').collect();
        assert_eq!(f.len(), 8, "{r}");
        assert!(f[7] == "x" || f[7] == "y", "{r}");
    }
    replies.iter().filter(|r| r.starts_with("ALLOW")).count() as u64
}

fn remaining(d: &Daemon, rule: &str, key: &str) -> Reply {
    parse_reply(&d.connect().request(&format!("CHECK {rule} {key} 0")))
}

fn warm(d: &Daemon) {
    let mut c = d.connect();
    let probes: Vec<String> = (0..30).map(|i| format!("CHECK x __ready{i} 0")).collect();
    assert!(
        wait_until(Duration::from_secs(15), || c
            .pipeline(&probes)
            .iter()
            .all(|r| parse_reply(r).source == "redis")),
        "never decided in Redis on every primary:\n{}",
        d.log_tail(20)
    );
}

#[test]
fn eight_clients_on_two_daemons_admit_exactly_the_tighter_limit() {
    let cluster = RedisCluster::start();
    let (key, _, _) = split_key(&cluster);
    let config = cluster_config(&cluster, 200);
    let (a, b) = (Daemon::start(&config), Daemon::start(&config));
    warm(&a);
    warm(&b);
    let replies = hammer(&[&a, &b], &key, || {});
    let allowed = admitted(&replies);
    let sources: Vec<String> = replies.iter().map(|r| parse_reply(r).source).collect();
    eprintln!(
        "CHECKALL x/y over two primaries: {allowed} of {} admitted",
        replies.len()
    );
    assert!(sources.iter().all(|s| s == "redis"), "{sources:?}");
    assert_eq!(allowed, Y_CAPACITY, "exactly y's capacity is admitted");
    // Every DENY names y, the binding limit; x kept what y's denials reserved.
    assert!(replies
        .iter()
        .filter(|r| r.starts_with("DENY"))
        .all(|r| r.ends_with(" y")));
    let x = remaining(&a, "x", &key);
    assert_eq!(
        (x.remaining, x.source.as_str()),
        (X_CAPACITY - Y_CAPACITY, "redis")
    );
    assert_eq!(remaining(&b, "y", &key).remaining, 0);
}

#[test]
fn a_frozen_primary_never_over_admits_and_leaves_no_reservation() {
    let cluster = RedisCluster::start();
    let (key, _, y_owner) = split_key(&cluster);
    let config = cluster_config(&cluster, 50);
    let (a, b) = (Daemon::start(&config), Daemon::start(&config));
    warm(&a);
    warm(&b);
    cluster.signal_node(&y_owner, libc::SIGSTOP);
    struct Resume<'a>(&'a RedisCluster, String);
    impl Drop for Resume<'_> {
        fn drop(&mut self) {
            self.0.signal_node(&self.1, libc::SIGCONT);
        }
    }
    let resume = Resume(&cluster, y_owner);
    let replies = hammer(&[&a, &b], &key, || {});
    let allowed = admitted(&replies);
    // y is decided locally: each daemon's share is 60 ÷ 2, from a fresh bucket.
    let share = Y_CAPACITY / 2;
    eprintln!("y's primary frozen: {allowed} admitted (bound {Y_CAPACITY}, one share {share})");
    assert!(allowed <= Y_CAPACITY, "over-admitted: {allowed}");
    assert!(
        allowed >= share,
        "not even one host's share admitted: {allowed}"
    );
    // x, on a healthy primary, was taken exactly for the requests admitted: every
    // reservation of a denied request was given back.
    let x = remaining(&a, "x", &key);
    assert_eq!(x.source, "redis");
    assert_eq!(
        x.remaining,
        X_CAPACITY - allowed,
        "x holds a reservation not undone"
    );
    drop(resume);
}

#[test]
fn a_paused_daemon_changes_nothing() {
    let cluster = RedisCluster::start();
    let (key, _, _) = split_key(&cluster);
    let config = cluster_config(&cluster, 50);
    let (a, b) = (Daemon::start(&config), Daemon::start(&config));
    warm(&a);
    warm(&b);
    let replies = hammer(&[&a, &b], &key, || {
        std::thread::sleep(Duration::from_millis(30));
        a.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(300));
        a.signal(libc::SIGCONT);
    });
    let allowed = admitted(&replies);
    let redis_only = replies.iter().all(|r| parse_reply(r).source == "redis");
    eprintln!("one daemon paused 300 ms: {allowed} admitted, all from Redis: {redis_only}");
    assert!(allowed <= Y_CAPACITY, "over-admitted: {allowed}");
    if redis_only {
        assert_eq!(allowed, Y_CAPACITY);
    }
    let x = remaining(&b, "x", &key);
    assert_eq!(
        x.remaining,
        X_CAPACITY - allowed,
        "x holds a reservation not undone"
    );
}

fn local_config() -> String {
    format!("[redis]\nmode = \"none\"\n{TWO_LIMITS}")
}

#[test]
fn protocol_errors_and_the_binding_triple() {
    let d = Daemon::start(&local_config());
    let mut c = d.connect();
    for (line, code) in [
        ("CHECKALL", "ERR PROTO"),
        ("CHECKALL x k", "ERR PROTO"),
        ("CHECKALL x k 1 y", "ERR PROTO"),
        ("CHECKALL x k 1 y k", "ERR PROTO"),
        ("CHECKALL x k one", "ERR COST"),
        ("CHECKALL x k 1 nope k 1", "ERR RULE"),
        ("CHECKALL x k 101", "ERR COST"),
    ] {
        let r = c.request(line);
        assert!(r.starts_with(code), "{line}: {r}");
    }
    let nine = "CHECKALL".to_string() + &" x k 1".repeat(9);
    assert!(c.request(&nine).starts_with("ERR PROTO"));
    let eight = "CHECKALL".to_string() + &" x k8 1".repeat(8);
    assert!(
        c.request(&eight).starts_with("ALLOW 100 92 "),
        "repeated triples add up"
    );
    // ALLOW: the binding triple has the fewest remaining relative to its limit.
    assert_eq!(
        c.request("CHECKALL x k 1 y k 1").split(' ').nth(7),
        Some("y")
    );
    let r = c.request("CHECKALL x j 10 y j 1");
    assert!(r.starts_with("ALLOW 100 90 ") && r.ends_with(" x"), "{r}");
    // DENY: the denied triple with the longest wait; nothing taken from the others.
    let r = c.request("CHECKALL x k 1 y k 60");
    assert!(r.starts_with("DENY 60 59 ") && r.ends_with(" y"), "{r}");
    assert!(c.request("CHECK x k 0").starts_with("ALLOW 100 99 "));
}

#[test]
fn without_redis_it_is_all_or_nothing_too() {
    let d = Daemon::start(&local_config());
    let replies = hammer(&[&d], "k", || {});
    assert_eq!(admitted(&replies), Y_CAPACITY);
    let x = remaining(&d, "x", "k");
    assert_eq!(x.remaining, X_CAPACITY - 60);
}
