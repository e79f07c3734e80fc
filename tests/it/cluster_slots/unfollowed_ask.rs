//! A migrating slot's `ASK` that the daemon cannot follow: the new owner refuses the
//! `ASKING` (a user without `+asking`) or does not answer (frozen). The key is decided
//! locally, with a warning naming why; the old owner's other keys stay in Redis, its
//! breaker untouched; once the migration ends the key is decided in Redis again from the
//! state that moved.

use super::{config, owner_of, slot_of, take_in_redis, until_source, Migration};
use crate::common::*;
use crate::secure_redis::{connect_in_redis, Flavor, TestCluster};
use std::time::{Duration, Instant};

/// Without `+asking` in the daemon's ACL (docs/PRODUCTION-REDIS.md, "The ACL user"), a
/// key whose slot is migrating and which the old owner answers with `ASK` cannot be
/// decided on its new owner: the `ASKING` is refused. The page says such a key is then
/// decided locally, with a warning naming the refusal. This checks that fallback on
/// the TLS cluster with the restricted user (the plain cluster has no ACL): every
/// request for that key is answered from the local bucket, never an error nor a hang;
/// the warning names the `NOPERM` for `asking`; keys of other slots, on the old owner
/// and on the new one, are still decided in Redis (no breaker opens for a refusal that
/// is one key's); and once the migration ends the key is decided in Redis again from
/// the state that moved, untouched by the local decisions.
#[test]
fn an_ask_refused_for_want_of_asking_is_decided_locally() {
    let flavor = Flavor::TlsAcl;
    let cluster = TestCluster::start(flavor);
    let d = Daemon::start(&config(&cluster));
    let mut c = connect_in_redis(&d, "tb");
    let key = "rl:{tb:mover}:tb";
    let taken_in_redis = 3;
    take_in_redis(&mut c, "mover", taken_in_redis);

    // The daemon's user loses ASKING on every node, then the slot moves as in
    // `a_migrated_slot_is_followed_with_its_state`.
    for node in cluster.addrs() {
        let out = cluster.cli(&node, &["ACL", "SETUSER", "ratelimitd", "-asking"]);
        assert_eq!(out, "OK", "ACL SETUSER ratelimitd -asking on {node}");
    }
    let m = Migration::start(&cluster, flavor, key);
    // A key in another slot of the old owner, and one of the new owner.
    let other_of = |owner: &str| {
        (0..200)
            .map(|i| format!("other{i}"))
            .find(|k| {
                let s = slot_of(&cluster, &format!("tb:{k}"));
                s != m.slot && owner_of(&cluster, s).0 == owner
            })
            .unwrap()
    };
    let others = [other_of(&m.src), other_of(&m.dst)];

    // The old owner answers ASK, the new owner refuses the ASKING: decided locally,
    // each request answered within a few redis.timeout_ms.
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let asked = Instant::now();
        let line = c.request("CHECK tb mover");
        slowest = slowest.max(asked.elapsed());
        let r = parse_reply(&line);
        assert_eq!(r.source, "local", "{r:?}\n{}", d.log_tail(20));
    }
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    // Redis 7 says "NOPERM this user has no permissions…", Valkey 8 "NOPERM User
    // ratelimitd has no permissions…".
    let refusal = "has no permissions to run the 'asking' command";
    let warning = || {
        d.log()
            .lines()
            .find(|l| {
                l.contains("Redis could not decide a key")
                    && l.contains("NOPERM")
                    && l.contains(refusal)
            })
            .map(str::to_string)
    };
    assert!(
        wait_until(Duration::from_secs(5), || warning().is_some()),
        "no warning naming the refused ASKING:\n{}",
        d.log_tail(20)
    );
    let warning = warning().unwrap();
    for other in &others {
        let r = parse_reply(&c.request(&format!("CHECK tb {other} 0")));
        assert_eq!(r.source, "redis", "{other}: {r:?}\n{}", d.log_tail(20));
    }
    assert!(
        !d.log().contains("circuit open"),
        "a refused ASKING opens no breaker:\n{}",
        d.log()
    );
    assert!(
        cluster.acl_denials().contains("asking"),
        "the new owner logs the refused ASKING:\n{}",
        cluster.acl_denials()
    );

    // The migration ends: MOVED, and the key is decided on its new owner, from the
    // tokens taken in Redis before the move (the local decisions took none there).
    m.finish(&cluster);
    let (took, r) = until_source(&mut c, "mover", "redis", Duration::from_secs(5));
    assert_eq!(r.remaining, 10 - taken_in_redis, "{r:?}");
    let r = parse_reply(&c.request("CHECK tb mover"));
    assert_eq!(
        (r.remaining, r.source.as_str()),
        (9 - taken_in_redis, "redis"),
        "{r:?}"
    );
    assert_eq!(
        cluster.cli(&m.dst, &["EXISTS", key]),
        "1",
        "decided on the new owner"
    );
    eprintln!(
        "slot {} {} -> {} without +asking: 5 requests local (slowest {slowest:?}), back in Redis {took:?} after the MOVED; warning: {warning}",
        m.slot, m.src, m.dst
    );
}

/// `redis.timeout_ms` of a configuration made by [`config`].
fn timeout_of(config: &str) -> Duration {
    let ms = config
        .lines()
        .find_map(|l| l.strip_prefix("timeout_ms = "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the test config sets redis.timeout_ms");
    Duration::from_millis(ms)
}

/// While a slot migrates, a key already copied to the new owner is sent there by the
/// old owner (`ASK`); when the new owner does not answer (frozen), the follow-up gives
/// up within what is left of `redis.timeout_ms` and the key is decided locally with a
/// warning naming the new owner (docs/PRODUCTION-REDIS.md: "while the new owner is down
/// or slow"). The new owner's silence is not the old owner's failure: its breaker must
/// not be charged, so the old owner's other keys keep being decided in Redis even under
/// a run of follow-ups long enough to open a breaker had they counted. Checks that
/// every such request is answered locally within a bound, never an error nor a hang;
/// that the old owner's other keys stay in Redis and no breaker opens for it; that the
/// warning names the new owner's timeout; and that once the new owner resumes and the
/// migration ends, the key is decided in Redis again from the state that moved.
#[test]
fn a_frozen_new_owner_during_a_move_leaves_the_old_owner_healthy() {
    let flavor = Flavor::Plain;
    let cluster = TestCluster::start(flavor);
    let TestCluster::Plain(nodes) = &cluster else {
        unreachable!("a plain cluster")
    };
    let config = config(&cluster);
    let timeout = timeout_of(&config);
    let d = Daemon::start(&config);
    let mut c = connect_in_redis(&d, "tb");
    let key = "rl:{tb:mover}:tb";
    let taken_in_redis = 3;
    take_in_redis(&mut c, "mover", taken_in_redis);

    // The slot moves as in `a_migrated_slot_is_followed_with_its_state`; the ASK is
    // followed to the new owner while it answers (cost 0: nothing taken).
    let m = Migration::start(&cluster, flavor, key);
    let r = parse_reply(&c.request("CHECK tb mover 0"));
    assert_eq!(
        (r.source.as_str(), r.remaining),
        ("redis", 10 - taken_in_redis),
        "followed to the new owner before the freeze: {r:?}"
    );
    // Keys of three other slots of the old owner, each decided in Redis before.
    let olds: Vec<String> = {
        let mut slots = vec![m.slot];
        let mut keys = Vec::new();
        for i in 0..500 {
            let k = format!("old{i}");
            let s = slot_of(&cluster, &format!("tb:{k}"));
            if !slots.contains(&s) && owner_of(&cluster, s).0 == m.src {
                slots.push(s);
                keys.push(k);
                if keys.len() == 3 {
                    break;
                }
            }
        }
        assert_eq!(keys.len(), 3, "three other slots of {}", m.src);
        keys
    };
    for old in &olds {
        let r = parse_reply(&c.request(&format!("CHECK tb {old}")));
        assert_eq!(r.source, "redis", "{old}: {r:?}");
    }

    // A request may wait one redis.timeout_ms (100 ms here: the old owner's ASK, then the
    // follow-up within what is left of it), and once more when the daemon itself was
    // late (`bounded`), so 2 × timeout_ms; plus 400 ms for a loaded machine: 600 ms.
    let bound = timeout * 2 + Duration::from_millis(400);
    // The old owner's breaker opens on FAILURES_TO_OPEN = 3 failed calls in a row, no
    // success between, spanning at least redis.timeout_ms (src/store/health.rs). Each
    // round sends 3 requests for the mover back to back, each failing on the new owner
    // after about one timeout_ms: the 1st to the 3rd failure span about 2 × timeout_ms
    // (≥ timeout_ms), so had those failures been charged to the old owner, its breaker
    // would open at each round's 3rd, and the old owner's keys asked right after would
    // be decided locally (an open primary is bypassed at once). 2 rounds, 6 follow-ups:
    // fewer than the 7 tokens left, so that what they cost in Redis shows (below).
    //
    // The freeze lasts about 2 × 3 × timeout_ms ≈ 0.6 s: shorter than the cluster's
    // cluster-node-timeout (CLUSTER_NODE_TIMEOUT_MS = 2 s), so no peer marks the new
    // owner PFAIL/FAIL and its replica does not fail over; and shorter than the
    // daemon's client's unresponsive-connection limit (2 s), so the daemon's connection
    // to it stays up and every follow-up meets the frozen node itself. Checked below.
    let (rounds, followups_per_round) = (2, 3);
    let mut followups = Vec::new();
    let frozen = nodes.freeze(&m.dst);
    let frozen_at = Instant::now();
    for round in 0..rounds {
        for _ in 0..followups_per_round {
            let asked = Instant::now();
            let line = c.request("CHECK tb mover");
            let took = asked.elapsed();
            let r = parse_reply(&line);
            assert_eq!(
                r.source,
                "local",
                "round {round}: the frozen new owner's key: {r:?}\n{}",
                d.log_tail(20)
            );
            assert!(
                took <= bound,
                "round {round}: answered in {took:?} (bound {bound:?})"
            );
            followups.push(took);
        }
        for old in &olds {
            let r = parse_reply(&c.request(&format!("CHECK tb {old}")));
            assert_eq!(
                r.source,
                "redis",
                "round {round}: {old}, a key of the old owner {}: {r:?}\n{}",
                m.src,
                d.log_tail(20)
            );
        }
    }
    drop(frozen);
    let frozen_for = frozen_at.elapsed();
    assert!(
        frozen_for < Duration::from_millis(CLUSTER_NODE_TIMEOUT_MS),
        "frozen {frozen_for:?}, not shorter than cluster-node-timeout: the cluster may have \
         reacted, the premise of this test does not hold"
    );

    let log = d.log();
    let breaker_of_old: Vec<&str> = log
        .lines()
        .filter(|l| {
            (l.contains("Redis primary down") || l.contains("circuit open")) && l.contains(&m.src)
        })
        .collect();
    assert!(
        breaker_of_old.is_empty(),
        "the old owner {}'s breaker opened:\n{}",
        m.src,
        breaker_of_old.join("\n")
    );
    let cause = format!("(followed to {}: no answer within redis.timeout_ms)", m.dst);
    let warning = log
        .lines()
        .find(|l| l.contains("Redis could not decide a key") && l.contains(&cause))
        .unwrap_or_else(|| panic!("no warning naming {cause:?}:\n{}", d.log_tail(30)))
        .to_string();

    // The local decisions took nothing in Redis, but each follow-up had written its
    // ASKING and EVALSHA to the frozen node before giving up, and a frozen Redis that
    // resumes still runs them ("Charged twice", docs/DESIGN.md; docs/FAILURES.md): one
    // token each, taken when it resumes, before anything sent after on that connection.
    // The ASK is followed again (cost 0) and sees it.
    let charged = u64::try_from(followups.len()).unwrap();
    let expected = 10 - taken_in_redis - charged;
    let (_, r) = until_source(&mut c, "mover", "redis", Duration::from_secs(5));
    assert_eq!(
        r.remaining, expected,
        "the new owner resumed, each follow-up charged once there: {r:?}"
    );

    // The migration ends: MOVED, and the key is decided on its new owner from the state
    // that moved.
    m.finish(&cluster);
    let (took, r) = until_source(&mut c, "mover", "redis", Duration::from_secs(5));
    assert_eq!(
        r.remaining, expected,
        "the state moved with the slot: {r:?}"
    );
    let r = parse_reply(&c.request("CHECK tb mover"));
    assert_eq!(
        (r.verdict.as_str(), r.remaining, r.source.as_str()),
        ("ALLOW", expected - 1, "redis"),
        "{r:?}"
    );
    assert_eq!(
        cluster.cli(&m.dst, &["EXISTS", key]),
        "1",
        "decided on the new owner"
    );
    let slowest = followups.iter().max().unwrap();
    let fastest = followups.iter().min().unwrap();
    eprintln!(
        "slot {} {} -> {} (frozen {frozen_for:?}): {} requests local ({fastest:?}..{slowest:?}, \
         bound {bound:?}), {} of the old owner's keys in Redis meanwhile; remaining {expected} \
         after the resume ({charged} follow-ups run there), back in Redis {took:?} after the \
         MOVED; warning: {warning}",
        m.slot,
        m.src,
        m.dst,
        followups.len(),
        rounds * olds.len(),
    );
}
