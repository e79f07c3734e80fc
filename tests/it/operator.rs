//! The operator verbs (`INSPECT`, `RESET`, `RULES`, `TOP`) on a real daemon's socket:
//! answered for `server.admin_uids` (root by default), refused with `ERR PERM` to any
//! other peer (run as nobody through `socat`, root needed) whose `CHECK`s go on; a key
//! reset on one daemon is fresh on another sharing the Redis Cluster; `TOP` finds the
//! hottest keys among many unique ones, within its stated error.

use crate::common;
use crate::permissions::{skip_unless_root, start, AsUser, NOBODY};

use common::*;
use serde_json::Value;
use std::collections::HashMap;

const RULES: &str = r#"
[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 100
refill_rate = 0.001

[[rule]]
name = "daily"
algorithm = "fixed_window"
limit = 5
window = "1d"
on_redis_failure = "deny"
"#;

/// The `name=value` fields of an `INSPECT` reply.
fn fields(line: &str) -> HashMap<String, String> {
    line.split(' ')
        .filter_map(|f| f.split_once('='))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

fn json(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
}

#[test]
fn each_operator_verb_answers_an_admin_and_refuses_another_uid() {
    if skip_unless_root() {
        return;
    }
    let d = start(&format!(
        "[server]\nsocket_mode = \"0666\"\n[redis]\nmode = \"none\"\n{RULES}"
    ));
    let mut admin = d.connect();
    for _ in 0..3 {
        admin.request("CHECK api k");
    }

    let inspect = admin.request("INSPECT api k");
    let f = fields(&inspect);
    for (name, want) in [
        ("rule", "api"),
        ("key", "k"),
        ("verdict", "ALLOW"),
        ("limit", "100"),
        ("remaining", "97"),
        ("source", "local"),
        ("param.algorithm", "token_bucket"),
        ("param.capacity", "100"),
        ("param.refill_rate", "0.001"),
        ("param.on_redis_failure", "local"),
        ("param.lease", "off"),
        ("lease_units", "0"),
        ("local_bucket", "yes"),
        ("cached_deny", "no"),
        ("slot", "none"),
        ("primary", "none"),
    ] {
        assert_eq!(
            f.get(name).map(String::as_str),
            Some(want),
            "{name} in {inspect}"
        );
    }
    // Cost 0: nothing was taken.
    assert_eq!(fields(&admin.request("INSPECT api k"))["remaining"], "97");

    assert_eq!(admin.request("RESET api k"), "OK");
    let fresh = fields(&admin.request("INSPECT api k"));
    assert_eq!(fresh["remaining"], "100", "{fresh:?}");

    let rules = json(&admin.request("RULES"));
    let rules = rules["rules"].as_array().expect("a list of rules");
    let names: Vec<&str> = rules.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["api", "daily"]);
    assert_eq!(rules[1]["algorithm"], "fixed_window");
    assert_eq!(rules[1]["limit"], 5);
    assert_eq!(rules[1]["window"], "1day");
    assert_eq!(rules[1]["window_ms"], 86_400_000);
    assert_eq!(rules[1]["on_redis_failure"], "deny");
    assert_eq!(rules[0]["refill_rate"], 0.001);

    let top = json(&admin.request("TOP api"));
    assert_eq!(top["rule"], "api");
    assert_eq!(top["keys"][0]["key"], "k");
    // Three CHECKs, then nothing (INSPECT is not a decision).
    assert_eq!(top["keys"][0]["decisions"], 3);
    // A key never decided: a new key's state, and INSPECT does not make it a bucket.
    for _ in 0..2 {
        let never = fields(&admin.request("INSPECT api never"));
        assert_eq!(
            (never["remaining"].as_str(), never["local_bucket"].as_str()),
            ("100", "no")
        );
    }
    assert!(admin.request("TOP nope").starts_with("ERR RULE "));
    assert!(admin.request("INSPECT nope k").starts_with("ERR RULE "));

    // Another uid: ERR PERM for each verb, the connection stays open, its CHECKs are
    // decided as before.
    let mut nobody = AsUser::connect(&d.socket, NOBODY, NOBODY);
    for verb in [
        "INSPECT api k",
        "RESET api k",
        "OVERRIDE api k capacity=5",
        "RULES",
        "TOP api 3",
    ] {
        let reply = nobody.request(verb);
        assert!(
            reply.starts_with("ERR PERM ") && reply.contains("server.admin_uids"),
            "{verb}: {reply}"
        );
    }
    let r = parse_reply(&nobody.request("CHECK api k"));
    assert!(r.allowed() && r.remaining == 99, "{r:?}");
    // The refused RESET changed nothing.
    assert_eq!(fields(&admin.request("INSPECT api k"))["remaining"], "99");
}

#[test]
fn admin_lists_name_who_operates() {
    if skip_unless_root() {
        return;
    }
    // nobody listed, root not: the roles swap.
    let d = start(&format!(
        "[server]\nsocket_mode = \"0666\"\nadmin_uids = [{NOBODY}]\n[redis]\nmode = \"none\"\n{RULES}"
    ));
    let mut nobody = AsUser::connect(&d.socket, NOBODY, NOBODY);
    assert!(nobody.request("RULES").starts_with("{\"rules\":"));
    let mut root = d.connect();
    assert!(root.request("RULES").starts_with("ERR PERM "));
    assert!(root.request("CHECK api k").starts_with("ALLOW "));
}

#[test]
fn a_key_reset_on_one_host_is_fresh_on_another() {
    let cluster = RedisCluster::start();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 100\nprefix = \"rl\"\n[cache]\nttl_ms = 5000\n{RULES}",
        toml_str_array(&cluster.addrs())
    );
    let (a, b) = (Daemon::start(&config), Daemon::start(&config));
    let mut on_a = crate::secure_redis::connect_in_redis(&a, "api");
    let mut on_b = crate::secure_redis::connect_in_redis(&b, "api");
    // Drain the key on host A: 100 ALLOWs, then a DENY that A remembers.
    let burst: Vec<String> = (0..101).map(|_| "CHECK api user:7".to_string()).collect();
    let replies = on_a.pipeline(&burst);
    assert!(replies[..100].iter().all(|r| r.starts_with("ALLOW ")));
    assert!(replies[100].starts_with("DENY "), "{}", replies[100]);
    assert_eq!(
        parse_reply(&on_a.request("CHECK api user:7")).source,
        "cache"
    );

    // A cost of 0 is always allowed: what tells is `remaining`.
    let seen = fields(&on_a.request("INSPECT api user:7"));
    assert_eq!(
        (seen["verdict"].as_str(), seen["remaining"].as_str()),
        ("ALLOW", "0")
    );
    assert_eq!(
        (seen["source"].as_str(), seen["cached_deny"].as_str()),
        ("redis", "yes")
    );
    // The slot and primary INSPECT names are Redis Cluster's own.
    let redis_key = "rl:{api:user:7}:tb";
    let any = &cluster.addrs()[0];
    let slot = cluster.cli(any, &["CLUSTER", "KEYSLOT", redis_key]);
    assert_eq!(seen["slot"], slot.trim(), "{seen:?}");
    let primary = &seen["primary"];
    assert_eq!(cluster.cli(primary, &["EXISTS", redis_key]).trim(), "1");

    assert_eq!(on_a.request("RESET api user:7"), "OK");
    assert_eq!(cluster.cli(primary, &["EXISTS", redis_key]).trim(), "0");
    // On host B: a fresh key, decided in Redis.
    let r = parse_reply(&on_b.request("CHECK api user:7"));
    assert_eq!(
        (r.verdict.as_str(), r.remaining, r.source.as_str()),
        ("ALLOW", 99, "redis")
    );
    // On host A, whose deny cache held the key: fresh too.
    let r = parse_reply(&on_a.request("CHECK api user:7"));
    assert_eq!(
        (r.verdict.as_str(), r.remaining, r.source.as_str()),
        ("ALLOW", 98, "redis")
    );
    assert_eq!(
        fields(&on_a.request("INSPECT api user:7"))["cached_deny"],
        "no"
    );
}

#[test]
fn top_names_the_three_keys_sent_most_often_among_many_unique_ones() {
    let d = Daemon::start(&format!("[redis]\nmode = \"none\"\n{RULES}"));
    let mut c = d.connect();
    // 3,000 requests: 1,500 to unique keys, 1,500 to 13 repeated ones (300, 250, 200,
    // then ten of 75), interleaved in a fixed pseudo-random order.
    let mut hot: Vec<String> = Vec::new();
    let weights: Vec<usize> = [300, 250, 200].into_iter().chain([75; 10]).collect();
    for (i, w) in weights.iter().enumerate() {
        hot.extend(std::iter::repeat_n(format!("hot{i}"), *w));
    }
    assert_eq!(hot.len(), 1500);
    let mut seed = 12345u64;
    for i in (1..hot.len()).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        hot.swap(i, (seed >> 33) as usize % (i + 1));
    }
    let lines: Vec<String> = hot
        .iter()
        .enumerate()
        .flat_map(|(i, k)| [format!("CHECK api {k}"), format!("CHECK api unique{i}")])
        .collect();
    assert_eq!(lines.len(), 3000);
    let replies = c.pipeline(&lines);
    assert_eq!(replies.len(), 3000);

    let top = json(&c.request("TOP api 3"));
    let keys = top["keys"].as_array().unwrap();
    let names: Vec<&str> = keys.iter().map(|k| k["key"].as_str().unwrap()).collect();
    assert_eq!(names, ["hot0", "hot1", "hot2"], "{top}");
    let max_error = top["max_error"].as_u64().unwrap();
    // Space-Saving: within N / 128 counters.
    assert!(max_error <= 3000 / 128, "{top}");
    for (k, &w) in keys.iter().zip(&weights) {
        let decisions = k["decisions"].as_u64().unwrap();
        let denies = k["denies"].as_u64().unwrap();
        // Capacity 100: every request past the 100th is denied.
        let denied = w as u64 - 100;
        assert!(
            (w as u64..=w as u64 + max_error).contains(&decisions),
            "{k} sent {w}"
        );
        assert!(
            (denied.saturating_sub(max_error)..=denied).contains(&denies),
            "{k}: {denied} denied"
        );
    }
    println!("TOP api 3 after 3,000 requests: {top}");
}

/// The token of an `ACQUIRE` ALLOW (`ALLOW <limit> <remaining> 0 0 <source> 0 <token>`).
fn token(reply: &str) -> String {
    assert!(reply.starts_with("ALLOW "), "{reply}");
    reply.split(' ').nth(7).expect("a token").to_string()
}

#[test]
fn inspect_of_a_concurrency_key_counts_its_slots_and_reset_deletes_them() {
    let rules = format!(
        "{RULES}\n[[rule]]\nname = \"jobs\"\nalgorithm = \"concurrency\"\nlimit = 4\nmax_hold = \"30s\"\n"
    );
    // Without Redis: this daemon's slots are all the slots.
    let d = Daemon::start(&format!("[redis]\nmode = \"none\"\n{rules}"));
    let mut c = d.connect();
    let held: Vec<String> = (0..2)
        .map(|_| token(&c.request("ACQUIRE jobs user:1")))
        .collect();
    let f = fields(&c.request("INSPECT jobs user:1"));
    for (name, want) in [
        ("param.algorithm", "concurrency"),
        ("param.limit", "4"),
        ("limit", "4"),
        ("remaining", "2"),
        ("slots_held", "2"),
        ("slots_held_here", "2"),
        ("max_hold_ms", "30000"),
    ] {
        assert_eq!(
            f.get(name).map(String::as_str),
            Some(want),
            "{name} in {f:?}"
        );
    }
    assert_eq!(c.request("RESET jobs user:1"), "OK");
    let f = fields(&c.request("INSPECT jobs user:1"));
    assert_eq!(
        (f["slots_held"].as_str(), f["remaining"].as_str()),
        ("0", "4")
    );
    assert!(
        c.request(&format!("RELEASE jobs user:1 {}", held[0]))
            .starts_with("ERR TOKEN "),
        "a slot reset is no longer held"
    );
    drop(d);

    // Over Redis, two hosts: A holds 3 of the key's slots, B 1.
    let cluster = RedisCluster::start();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\nprefix = \"rl\"\n{rules}",
        toml_str_array(&cluster.addrs())
    );
    let (a, b) = (Daemon::start(&config), Daemon::start(&config));
    let mut on_a = crate::secure_redis::connect_in_redis(&a, "api");
    let mut on_b = crate::secure_redis::connect_in_redis(&b, "api");
    let on_a_tokens: Vec<String> = (0..3)
        .map(|_| token(&on_a.request("ACQUIRE jobs user:2")))
        .collect();
    let on_b_token = token(&on_b.request("ACQUIRE jobs user:2"));
    assert!(on_b.request("ACQUIRE jobs user:2").starts_with("DENY "));
    for (client, here) in [(&mut on_a, "3"), (&mut on_b, "1")] {
        let f = fields(&client.request("INSPECT jobs user:2"));
        for (name, want) in [
            ("source", "redis"),
            ("remaining", "0"),
            ("slots_held", "4"),
            ("slots_held_here", here),
            ("max_hold_ms", "30000"),
        ] {
            assert_eq!(
                f.get(name).map(String::as_str),
                Some(want),
                "{name} in {f:?}"
            );
        }
    }
    // RESET deletes the key's slots in Redis (every host's) and A's own; B's holder
    // learns it at its next RELEASE (or renewal).
    assert_eq!(on_a.request("RESET jobs user:2"), "OK");
    let keys: Vec<String> = cluster
        .all_keys()
        .into_iter()
        .filter(|k| k.ends_with(":cc"))
        .collect();
    assert_eq!(keys, Vec::<String>::new());
    let f = fields(&on_a.request("INSPECT jobs user:2"));
    assert_eq!(
        (
            f["slots_held"].as_str(),
            f["slots_held_here"].as_str(),
            f["remaining"].as_str()
        ),
        ("0", "0", "4"),
        "{f:?}"
    );
    let release = |c: &mut Client, t: &str| c.request(&format!("RELEASE jobs user:2 {t}"));
    assert!(release(&mut on_a, &on_a_tokens[0]).starts_with("ERR TOKEN "));
    assert!(release(&mut on_b, &on_b_token).starts_with("ERR TOKEN "));
    // The key starts fresh: the whole limit again, and no more.
    let replies: Vec<String> = (0..5)
        .map(|_| on_b.request("ACQUIRE jobs user:2"))
        .collect();
    assert!(
        replies[..4].iter().all(|r| r.starts_with("ALLOW ")),
        "{replies:?}"
    );
    assert!(replies[4].starts_with("DENY "), "{replies:?}");
}
