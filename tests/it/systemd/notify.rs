//! The `sd_notify` messages as systemd receives them: READY with a STATUS naming the
//! rules and Redis, WATCHDOG at half the interval, STATUS following Redis, RELOADING
//! then READY around a SIGHUP reload (a broken file keeps the old rules), STOPPING.

use super::{has_line, status_of, NotifySocket, LOCAL};
use crate::common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// READY=1 after Redis answered, with a STATUS naming the rules and Redis state;
/// WATCHDOG=1 at half WATCHDOG_USEC; STATUS follows the circuit when Redis dies and
/// comes back; STOPPING=1 on SIGTERM.
#[test]
fn notify_ready_status_watchdog_and_stopping() {
    let mut redis = RedisStandalone::start();
    let mut notify = NotifySocket::bind();
    let config = format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 50\n{}",
        redis.addr(),
        LOCAL.replace("[redis]\nmode = \"none\"\n", "")
    );
    // 300 ms watchdog: a ping every 150 ms.
    let mut d = Daemon::start_with(
        &daemon_bin(),
        &[
            ("NOTIFY_SOCKET", notify.path()),
            ("WATCHDOG_USEC", "300000"),
        ],
        &config,
    );
    let ready = notify.expect(&d, "READY=1", |m| has_line(m, "READY=1"));
    assert_eq!(
        status_of(&ready),
        Some(
            format!(
                "serving 1 rule on {}; redis standalone: connected",
                d.socket.display()
            )
            .as_str()
        ),
        "{ready}"
    );
    // The daemon answers from Redis once READY=1 is out.
    let mut c = d.connect();
    assert_eq!(parse_reply(&c.request("CHECK api w")).source, "redis");

    // Pings keep coming (one per 150 ms; the interval itself is not timed here).
    for i in 0..5 {
        notify.expect(&d, &format!("WATCHDOG=1 #{i}"), |m| {
            has_line(m, "WATCHDOG=1")
        });
    }

    // Redis dies: the first failed decision opens the circuit, STATUS says so.
    redis.kill();
    let r = parse_reply(&c.request("CHECK api w"));
    assert_eq!(r.source, "local");
    notify.expect(&d, "STATUS … unreachable", |m| {
        status_of(m).is_some_and(|s| {
            s.ends_with("redis standalone: unreachable, deciding locally per on_redis_failure")
        })
    });
    // Redis is back: the prober closes the circuit, STATUS says connected again.
    redis.restart();
    notify.expect(&d, "STATUS … connected", |m| {
        status_of(m).is_some_and(|s| s.ends_with("redis standalone: connected"))
    });
    assert!(wait_until(Duration::from_secs(5), || parse_reply(
        &c.request("CHECK api w")
    )
    .source
        == "redis"));

    d.signal(libc::SIGTERM);
    notify.expect(&d, "STOPPING=1", |m| has_line(m, "STOPPING=1"));
    let exit = d.wait_exit(Duration::from_secs(15));
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "{}", d.log());
    assert!(
        !d.socket.exists(),
        "not activated: the daemon removes its own socket"
    );
}

/// SIGHUP: RELOADING=1 (with MONOTONIC_USEC) then READY=1; a changed limit applies on
/// a connection opened before the reload; a setting that needs a restart is named in
/// the log; a broken file keeps the old rules, says so in STATUS, and the daemon lives.
#[test]
fn sighup_reload_notifies_applies_rules_and_survives_a_broken_file() {
    let mut notify = NotifySocket::bind();
    let d = Daemon::start_with(&daemon_bin(), &[("NOTIFY_SOCKET", notify.path())], LOCAL);
    notify.expect(&d, "READY=1", |m| has_line(m, "READY=1"));
    let mut c = d.connect();
    assert!(c.request("CHECK api k1").starts_with("ALLOW 10 9 "));

    // Another client pipelines batches of requests throughout the reloads below; every
    // request must get its reply (no request dropped, no connection closed).
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let mut client = d.connect();
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let batch: Vec<String> = (0..50).map(|i| format!("CHECK api busy{i}")).collect();
            let mut answered = 0usize;
            // Bounded: at most 400 batches (20,000 requests).
            for _ in 0..400 {
                for reply in client.pipeline(&batch) {
                    parse_reply(&reply);
                    answered += 1;
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                thread::sleep(Duration::from_millis(2));
            }
            answered
        })
    };

    // New limit, and a [server] value that cannot change live.
    d.write_config(&format!(
        "[server]\nmax_in_flight = 64\n{}",
        LOCAL.replace("capacity = 10", "capacity = 3")
    ));
    d.signal(libc::SIGHUP);
    let reloading = notify.expect(&d, "RELOADING=1", |m| has_line(m, "RELOADING=1"));
    let usec = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .unwrap_or_else(|| panic!("RELOADING=1 without MONOTONIC_USEC: {reloading:?}"));
    assert!(usec.parse::<u64>().is_ok_and(|u| u > 0), "{usec}");
    let ready = notify.expect(&d, "READY=1 after reload", |m| has_line(m, "READY=1"));
    assert!(!ready.contains("rejected"), "{ready}");
    // Same connection, new rules (READY=1 is sent after the swap).
    assert!(c.request("CHECK api k2").starts_with("ALLOW 3 2 "));
    assert!(
        d.log()
            .contains("server.max_in_flight changed; it needs a restart"),
        "{}",
        d.log()
    );

    // A broken file: the old rules stay, STATUS says why, the daemon still answers.
    d.write_config(&LOCAL.replace("capacity = 10", "capacity = -1"));
    d.signal(libc::SIGHUP);
    notify.expect(&d, "RELOADING=1 (broken file)", |m| {
        has_line(m, "RELOADING=1")
    });
    let ready = notify.expect(&d, "READY=1 after a rejected reload", |m| {
        has_line(m, "READY=1")
    });
    let status = status_of(&ready).unwrap_or_default();
    assert!(
        status.contains("last reload rejected (old rules in force)"),
        "{status}"
    );
    assert!(status.contains("capacity"), "{status}");
    assert!(c.request("CHECK api k2").starts_with("ALLOW 3 1 "));
    assert_eq!(d.connect().request("PING"), "PONG");
    assert!(d.log().contains("old one stays in force"), "{}", d.log());

    stop.store(true, Ordering::Relaxed);
    let answered = busy.join().expect("the pipelining client failed");
    assert!(answered >= 50 && answered % 50 == 0, "{answered}");
    // No WATCHDOG_USEC, no watchdog pings.
    assert!(
        !notify.seen.iter().any(|m| has_line(m, "WATCHDOG=1")),
        "{:?}",
        notify.seen
    );
}

/// With Redis unreachable at start, READY=1 still comes (after the bounded wait), and
/// STATUS says decisions are local.
#[test]
fn notify_ready_with_redis_unreachable_says_local() {
    let mut notify = NotifySocket::bind();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = [\"127.0.0.1:{}\"]\n{}",
        free_port(),
        LOCAL.replace("[redis]\nmode = \"none\"\n", "")
    );
    let d = Daemon::start_with(&daemon_bin(), &[("NOTIFY_SOCKET", notify.path())], &config);
    let ready = notify.expect(&d, "READY=1", |m| has_line(m, "READY=1"));
    assert!(
        status_of(&ready)
            .is_some_and(|s| s
                .ends_with("redis cluster: unreachable, deciding locally per on_redis_failure")),
        "{ready}"
    );
    // The first message said what it was waiting for.
    assert_eq!(
        notify.seen.first().and_then(|m| status_of(m)),
        Some("starting: connecting to Redis"),
        "{:?}",
        notify.seen
    );
    assert_eq!(
        parse_reply(&d.connect().request("CHECK api k")).source,
        "local"
    );
}
