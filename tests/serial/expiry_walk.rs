//! A reload that makes a rule keep its state longer (here a token bucket of capacity 10
//! refilling 10/s, full again 1 s after a drain, slowed to 0.01/s) must not hand a
//! drained key a fresh budget, even when nobody asks for that key between the reload and
//! the moment the old rule's expiry ran out: one daemon walks the rule's keys in Redis
//! and lengthens their expiry (src/store/expiry_walk/).
//!
//! On a standalone Redis and on a 3-primary cluster (keys on every primary), with two
//! daemons (one walks), and a measurement of the walk over many keys
//! (`WALK_KEYS`, 100,000 by default; docs/PERFORMANCE.md has the 10^6 figure).

use crate::common;
use crate::ONE_AT_A_TIME;

use common::*;
use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

const FAST: &str = "capacity = 10\nrefill_rate = 10.0";
const SLOW: &str = "capacity = 10\nrefill_rate = 0.01";
/// The policy window of SLOW, ms (capacity ÷ rate): the 7th field of a reply.
const SLOW_WINDOW_MS: &str = "1000000";

fn rule(params: &str) -> String {
    format!("\n[[rule]]\nname = \"t\"\nalgorithm = \"token_bucket\"\n{params}\n")
}

fn standalone_config(redis: &RedisStandalone, params: &str) -> String {
    format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 200\n\n[cache]\nttl_ms = 0\n{}",
        redis.addr(),
        rule(params)
    )
}

fn cluster_config(cluster: &RedisCluster, params: &str) -> String {
    format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 200\n\n[cache]\nttl_ms = 0\n{}",
        toml_str_array(&cluster.addrs()),
        rule(params)
    )
}

/// Drains each of `keys` (10 admitted, then a DENY from Redis); returns when the last
/// key was drained.
fn drain(c: &mut Client, keys: &[String]) -> Instant {
    let lines: Vec<String> = keys
        .iter()
        .flat_map(|k| std::iter::repeat_n(format!("CHECK t {k}"), 11))
        .collect();
    let replies = c.pipeline(&lines);
    let drained = Instant::now();
    for (i, chunk) in replies.chunks(11).enumerate() {
        let allowed = chunk.iter().filter(|l| parse_reply(l).allowed()).count();
        let last = parse_reply(&chunk[10]);
        assert_eq!(
            (allowed, last.verdict.as_str(), last.source.as_str()),
            (10, "DENY", "redis"),
            "key {}: {chunk:?}",
            keys[i]
        );
    }
    drained
}

/// Writes `config` and sends SIGHUP to each daemon; returns once each answers under the
/// slow rule (asked about a key nobody uses, with a cost of 0, which writes nothing).
fn reload(daemons: &[&Daemon], config: &str) -> Instant {
    for d in daemons {
        d.write_config(config);
    }
    let sent = Instant::now();
    for d in daemons {
        d.signal(libc::SIGHUP);
    }
    for d in daemons {
        let mut c = d.connect();
        assert!(
            wait_until(Duration::from_secs(5), || {
                c.request("CHECK t nobody 0").split(' ').nth(6) == Some(SLOW_WINDOW_MS)
            }),
            "the reload never applied:\n{}",
            d.log_tail(30)
        );
    }
    sent
}

/// Asks each drained key once, `after` the drain: each must still be drained. Under the
/// slow rule a key refills 0.01 token/s, so within the few seconds since its drain it
/// holds less than one token: DENY, remaining 0 (a fresh key would say ALLOW 10 9).
fn assert_still_drained(c: &mut Client, keys: &[String], drained: Instant, after: Duration) {
    if let Some(left) = after.checked_sub(drained.elapsed()) {
        sleep(left);
    }
    let since = drained.elapsed().as_secs_f64();
    assert!(since < 90.0, "the bound below assumes < 1 token refilled");
    for k in keys {
        let r = parse_reply(&c.request(&format!("CHECK t {k}")));
        assert_eq!(
            (r.verdict.as_str(), r.remaining, r.source.as_str()),
            ("DENY", 0, "redis"),
            "key {k} {since:.1} s after its drain under 0.01 token/s: {r:?}"
        );
    }
    // Utilisation: a key nobody used still gets its whole budget.
    let fresh = parse_reply(&c.request("CHECK t never-used"));
    assert_eq!(
        (fresh.verdict.as_str(), fresh.remaining),
        ("ALLOW", 9),
        "{fresh:?}"
    );
}

/// The lines of the daemon's log saying a walk of rule t finished.
fn walks_finished(d: &Daemon) -> Vec<String> {
    d.log()
        .lines()
        .filter(|l| l.contains("expiry walk finished") && l.contains("rule=\"t\""))
        .map(str::to_owned)
        .collect()
}

/// `name=<value>` from a log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split(' ').next()
}

#[test]
fn a_drained_key_nobody_asks_for_stays_drained_after_a_slowing_reload() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis, FAST));
    let mut c = d.connect();
    let keys = vec!["k".to_string()];
    let drained = drain(&mut c, &keys);
    reload(&[&d], &standalone_config(&redis, SLOW));
    // The old rule's expiry (1 s to full + 1 s margin) has long passed by then.
    assert_still_drained(&mut c, &keys, drained, Duration::from_secs(3));
    // Its TTL now follows the slow rule: 1000 s to full, plus the margin.
    let ttl: i64 = redis.cli(&["PTTL", "rl:{t:k}:tb"]).parse().expect("PTTL");
    assert!((990_000..=1_001_000).contains(&ttl), "PTTL {ttl}");
    assert!(
        wait_until(Duration::from_secs(5), || !walks_finished(&d).is_empty()),
        "{}",
        d.log_tail(30)
    );
    let line = &walks_finished(&d)[0];
    assert_eq!(field(line, "keys"), Some("1"), "{line}");
    assert_eq!(field(line, "in_use"), Some("1"), "{line}");
}

#[test]
fn a_cluster_walk_reaches_the_keys_of_every_primary() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = RedisCluster::start();
    let d = Daemon::start(&cluster_config(&cluster, FAST));
    let mut c = d.connect();
    let keys: Vec<String> = (0..30).map(|i| format!("user{i}")).collect();
    let drained = drain(&mut c, &keys);
    for primary in cluster.primary_addrs() {
        let on = redis_command(&primary, &["KEYS", "rl:{t:*}:tb"])
            .and_then(Resp::into_strings)
            .expect("KEYS");
        assert!(!on.is_empty(), "no drained key on {primary}");
    }
    reload(&[&d], &cluster_config(&cluster, SLOW));
    assert_still_drained(&mut c, &keys, drained, Duration::from_secs(3));
    assert!(
        wait_until(Duration::from_secs(5), || !walks_finished(&d).is_empty()),
        "{}",
        d.log_tail(30)
    );
    let line = &walks_finished(&d)[0];
    assert_eq!(field(line, "in_use"), Some("30"), "{line}");
    assert_eq!(field(line, "complete"), Some("true"), "{line}");
}

#[test]
fn two_daemons_reloaded_together_walk_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let redis = RedisStandalone::start();
    let a = Daemon::start(&standalone_config(&redis, FAST));
    let b = Daemon::start(&standalone_config(&redis, FAST));
    let mut c = a.connect();
    let keys = vec!["k".to_string()];
    let drained = drain(&mut c, &keys);
    reload(&[&a, &b], &standalone_config(&redis, SLOW));
    assert_still_drained(&mut c, &keys, drained, Duration::from_secs(3));
    let covered = |d: &Daemon| {
        d.log()
            .contains("another daemon's walk covered this reload")
    };
    assert!(
        wait_until(Duration::from_secs(10), || {
            let walked = walks_finished(&a).len() + walks_finished(&b).len();
            walked == 1 && (covered(&a) || covered(&b))
        }),
        "expected one walk and one daemon covered by it:\n--- a\n{}\n--- b\n{}",
        a.log_tail(20),
        b.log_tail(20)
    );
    // And no second walk afterwards.
    sleep(Duration::from_secs(3));
    assert_eq!(walks_finished(&a).len() + walks_finished(&b).len(), 1);
}

/// A reload that changes the rule again during its walk cancels that walk and walks
/// again under the rule now in force: every key ends with the expiry of the last rule
/// (0.005/s: 2000 s to full), also the keys the first walk never reached.
#[test]
fn a_second_reload_during_a_walk_walks_again_under_the_rule_in_force() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let redis = RedisStandalone::start();
    let d = Daemon::start(&standalone_config(&redis, FAST));
    let n = 20_000;
    let started = Instant::now();
    populate(&vec![redis.addr(); 16384], n);
    reload(&[&d], &standalone_config(&redis, SLOW));
    assert!(
        wait_until(Duration::from_secs(5), || d
            .log()
            .contains("expiry walk started")),
        "{}",
        d.log_tail(20)
    );
    let slower = standalone_config(&redis, "capacity = 10\nrefill_rate = 0.005");
    d.write_config(&slower);
    d.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(60), || !walks_finished(&d).is_empty()),
        "{}",
        d.log_tail(30)
    );
    assert!(
        d.log().contains("expiry walk cancelled"),
        "the first walk was not cancelled (too quick?):\n{}",
        d.log_tail(30)
    );
    let line = &walks_finished(&d)[0];
    assert_eq!(field(line, "keys"), Some(n.to_string().as_str()), "{line}");
    for i in (0..n).step_by(n / 50) {
        let key = format!("rl:{{t:u{i}}}:tb");
        let ttl: i64 = redis.cli(&["PTTL", &key]).parse().expect("PTTL");
        let lowest = 2_001_000 - started.elapsed().as_millis() as i64;
        assert!(
            ttl >= lowest && ttl <= 2_001_000,
            "{key}: PTTL {ttl}, at least {lowest}"
        );
    }
}

/// Slot → primary address, from `CLUSTER SLOTS`.
fn slot_owners(cluster: &RedisCluster) -> Vec<String> {
    let Resp::Array(Some(ranges)) =
        redis_command(&cluster.addrs()[0], &["CLUSTER", "SLOTS"]).expect("CLUSTER SLOTS")
    else {
        panic!("CLUSTER SLOTS")
    };
    let mut owners = vec![String::new(); 16384];
    for range in ranges {
        let Resp::Array(Some(r)) = range else {
            continue;
        };
        let (Resp::Int(first), Resp::Int(last), Resp::Array(Some(node))) = (&r[0], &r[1], &r[2])
        else {
            continue;
        };
        let port = match &node[1] {
            Resp::Int(p) => *p,
            _ => continue,
        };
        for slot in *first..=*last {
            owners[slot as usize] = format!("127.0.0.1:{port}");
        }
    }
    owners
}

/// Writes `n` drained buckets of rule t (the daemon's own format: 0 tokens at Redis's
/// `now`, expiry 2 s later as the fast rule set it) straight into each primary with
/// `redis-cli --pipe`; their TTL is 10 min, so the walk finds every one of them.
/// `owners` gives each slot's primary (`host:port`).
fn populate(owners: &[String], n: usize) {
    let now_us: u64 = match redis_command(&owners[0], &["TIME"]) {
        Ok(Resp::Array(Some(t))) => {
            let s: u64 = t[0].clone().into_text().unwrap().parse().unwrap();
            let us: u64 = t[1].clone().into_text().unwrap().parse().unwrap();
            s * 1_000_000 + us
        }
        other => panic!("TIME: {other:?}"),
    };
    let mut streams: HashMap<String, Vec<u8>> = HashMap::new();
    let resp = |out: &mut Vec<u8>, args: &[&str]| {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
    };
    let (ts, x) = (now_us.to_string(), (now_us + 2_000_000).to_string());
    for i in 0..n {
        let key = format!("rl:{{t:u{i}}}:tb");
        let owner = &owners[usize::from(fred::util::redis_keyslot(key.as_bytes()))];
        let out = streams.entry(owner.clone()).or_default();
        resp(out, &["HSET", &key, "t", "0", "ts", &ts, "x", &x]);
        resp(out, &["PEXPIRE", &key, "600000"]);
    }
    for (addr, stream) in streams {
        let port = addr.rsplit(':').next().unwrap().to_string();
        let mut child = Command::new(redis_cli_bin())
            .args(["-h", "127.0.0.1", "-p", &port, "--pipe"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli --pipe");
        child.stdin.take().unwrap().write_all(&stream).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("errors: 0"), "{addr}: {text}");
    }
}

/// Calls and µs Redis spent in EVALSHA and SCAN on `addr` (INFO commandstats).
fn command_usec(addr: &str) -> (u64, u64) {
    let info = redis_text(addr, &["INFO", "commandstats"]).expect("INFO");
    let (mut calls, mut usec) = (0, 0);
    for line in info.lines() {
        if line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_scan:") {
            for part in line.split(':').nth(1).unwrap_or("").split(',') {
                match part.split_once('=') {
                    Some(("calls", v)) => calls += v.parse::<u64>().unwrap_or(0),
                    Some(("usec", v)) => usec += v.parse::<u64>().unwrap_or(0),
                    _ => {}
                }
            }
        }
    }
    (calls, usec)
}

/// The walk over `WALK_KEYS` keys (default 100,000) on a 3-primary cluster: every key's
/// expiry is lengthened; prints the walk's duration and the Redis time it used.
#[test]
fn a_walk_over_many_keys_lengthens_each_and_reports_its_cost() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let n: usize = std::env::var("WALK_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let cluster = RedisCluster::start();
    let d = Daemon::start(&cluster_config(&cluster, FAST));
    let started = Instant::now();
    populate(&slot_owners(&cluster), n);
    eprintln!(
        "populated {n} keys in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let primaries = cluster.primary_addrs();
    let before: Vec<(u64, u64)> = primaries.iter().map(|a| command_usec(a)).collect();
    reload(&[&d], &cluster_config(&cluster, SLOW));
    // At SHARE = 25 % of each primary and ~10-20 µs of round trip per key, 10^6 keys
    // take minutes on this machine: bounded at 2 s per 1,000 keys.
    let bound = Duration::from_secs(30 + (n as u64) / 500);
    assert!(
        wait_until(bound, || !walks_finished(&d).is_empty()),
        "no walk finished within {bound:?}:\n{}",
        d.log_tail(30)
    );
    let line = walks_finished(&d).remove(0);
    let after: Vec<(u64, u64)> = primaries.iter().map(|a| command_usec(a)).collect();
    let (calls, usec) = before
        .iter()
        .zip(&after)
        .fold((0, 0), |(c, u), (b, a)| (c + a.0 - b.0, u + a.1 - b.1));
    eprintln!("{line}");
    eprintln!(
        "walk of {n} keys: {} s, Redis time in EVALSHA+SCAN {:.2} s over {calls} calls ({:.1} µs per key)",
        field(&line, "seconds").unwrap_or("?"),
        usec as f64 / 1e6,
        usec as f64 / n as f64
    );
    assert_eq!(field(&line, "keys"), Some(n.to_string().as_str()), "{line}");
    assert_eq!(
        field(&line, "in_use"),
        Some(n.to_string().as_str()),
        "{line}"
    );
    // Every key's expiry now follows the slow rule: empty when populated, full 1000 s
    // later (+ the 1 s margin), so its TTL is at least 1001 s less the time since it was
    // populated; populated, it was 600 s. A sample, on every primary.
    for i in (0..n).step_by((n / 50).max(1)) {
        let key = format!("rl:{{t:u{i}}}:tb");
        let ttl: i64 = redis_cli(&cluster.addrs()[0], &["-c", "PTTL", &key])
            .parse()
            .expect("PTTL");
        let lowest = 1_001_000 - started.elapsed().as_millis() as i64;
        assert!(
            ttl >= lowest && ttl <= 1_001_000,
            "{key}: PTTL {ttl}, at least {lowest}"
        );
    }
}
