//! Redis as production runs it: a TLS-only Redis Cluster with client certificates and a
//! least-privilege ACL user, a wrong password or CA fixed by a reload, and Sentinel
//! failing over under load. Real servers on loopback; the CA is made at run time.

mod common;
mod secure_redis;

use common::{parse_reply, toml_str_array, toml_string, Client, Daemon};
use secure_redis::{Pki, SentinelSet, TlsCluster, DAEMON_PASSWORD, SENTINEL_PASSWORD};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// One rule per algorithm, `limit` 5, slow to refill: the sixth request in a burst is
/// denied, whoever decides.
const RULES: &str = r#"
[[rule]]
name = "tb"
algorithm = "token_bucket"
capacity = 5
refill_rate = 0.01

[[rule]]
name = "lb"
algorithm = "leaky_bucket"
capacity = 5
leak_rate = 0.01

[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 5
window = "1h"

[[rule]]
name = "swl"
algorithm = "sliding_window_log"
limit = 5
window = "1h"

[[rule]]
name = "swc"
algorithm = "sliding_window_counter"
limit = 5
window = "1h"
"#;

/// Writes `password` to `<dir>/redis.password`, mode 0600, and returns the path.
fn password_file(dir: &Path, password: &str) -> std::path::PathBuf {
    let path = dir.join("redis.password");
    fs::write(&path, format!("{password}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// The `[redis]` table for the TLS cluster with the daemon's ACL user.
fn tls_config(cluster: &TlsCluster, pki: &Pki, password_file: &Path, ca: &str) -> String {
    format!(
        "[redis]\nmode = \"cluster\"\nnodes = {nodes}\ntimeout_ms = 200\n\
         username = \"ratelimitd\"\npassword_file = {pw}\n\
         tls = true\ntls_ca_file = {ca}\ntls_cert_file = {cert}\ntls_key_file = {key}\n\
         [cache]\nttl_ms = 0\n{RULES}",
        nodes = toml_str_array(&cluster.addrs()),
        pw = toml_string(&password_file.display().to_string()),
        ca = toml_string(&pki.path(ca).display().to_string()),
        cert = toml_string(&pki.path("client.crt").display().to_string()),
        key = toml_string(&pki.path("client.key").display().to_string()),
    )
}

/// Waits until `CHECK <rule> <key>` is answered from `source`; the time it took.
fn wait_for_source(c: &mut Client, rule: &str, source: &str, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < within {
        n += 1;
        let line = c.request(&format!("CHECK {rule} probe{n} 0"));
        if parse_reply(&line).source == source {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn tls_cluster_with_acl_user_decides_every_algorithm_in_redis() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let pw = password_file(cluster.dir(), DAEMON_PASSWORD);
    let d = Daemon::start(&tls_config(&cluster, &pki, &pw, "ca.crt"));
    let mut c = d.connect();
    assert!(
        wait_for_source(&mut c, "tb", "redis", Duration::from_secs(10)).is_some(),
        "never decided in Redis over TLS:\n{}",
        d.log_tail(30)
    );
    for rule in ["tb", "lb", "fw", "swl", "swc"] {
        // Keys spread over the three primaries' slots.
        for k in 0..6 {
            let key = format!("user:{k}");
            let replies: Vec<_> = (0..6)
                .map(|_| parse_reply(&c.request(&format!("CHECK {rule} {key}"))))
                .collect();
            for r in &replies {
                assert_eq!(r.source, "redis", "{rule} {key}: {r:?}\n{}", d.log_tail(20));
            }
            let allowed = replies.iter().filter(|r| r.allowed()).count();
            assert_eq!(allowed, 5, "{rule} {key}: a burst of 6 admits the limit, 5");
        }
    }
    let denials = cluster.acl_denials();
    assert!(
        denials.trim().is_empty(),
        "the documented ACL line refused something:\n{denials}"
    );
    let log = d.log();
    assert!(
        !log.contains(DAEMON_PASSWORD),
        "the password reached the log"
    );
    println!("TLS + ACL cluster: 5 algorithms x 6 keys decided in Redis, ACL LOG empty");
}

/// A daemon Redis refuses (`cause`: the words its log line must use) answers every
/// request locally and logs the cause once or twice, not per retry; `fix` repairs the
/// file, and after SIGHUP decisions are back in Redis within 1.5 s. `what` names the
/// case in the printed figures.
fn refused_then_fixed_by_reload(d: &Daemon, what: &str, cause: &str, fix: impl FnOnce()) {
    let mut c = d.connect();
    // Every request is answered, locally, while Redis refuses the daemon.
    for i in 0..20 {
        let r = parse_reply(&c.request(&format!("CHECK tb k{i}")));
        assert_eq!(r.source, "local", "{r:?}");
    }
    std::thread::sleep(Duration::from_secs(2));
    let log = d.log();
    let lines = log.lines().filter(|l| l.contains(cause)).count();
    assert!(
        lines >= 1,
        "no log line says {cause:?}:\n{}",
        d.log_tail(20)
    );
    // fred retries every 100 ms: ~20 failures in 2 s must not give 20 lines.
    assert!(lines <= 2, "{lines} lines saying {cause:?}: a retry storm");
    fix();
    d.signal(libc::SIGHUP);
    let took = wait_for_source(&mut c, "tb", "redis", Duration::from_secs(5));
    let took =
        took.unwrap_or_else(|| panic!("not back in Redis after the fix:\n{}", d.log_tail(30)));
    println!("{what}: {lines} log line(s); back in Redis {took:?} after SIGHUP");
    assert!(took <= Duration::from_millis(1500), "took {took:?}");
}

#[test]
fn wrong_password_serves_locally_names_authentication_and_a_reload_fixes_it() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let pw = password_file(cluster.dir(), "not-the-password");
    let d = Daemon::start(&tls_config(&cluster, &pki, &pw, "ca.crt"));
    refused_then_fixed_by_reload(&d, "wrong password", "authentication failed", || {
        fs::write(&pw, format!("{DAEMON_PASSWORD}\n")).unwrap()
    });
    assert!(
        !d.log().contains("not-the-password"),
        "the password reached the log"
    );
}

#[test]
fn wrong_ca_serves_locally_names_the_certificate_and_a_reload_fixes_it() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let pw = password_file(cluster.dir(), DAEMON_PASSWORD);
    // The configured CA file holds a CA that did not sign the servers' certificates.
    let ca = cluster.dir().join("trusted-ca.crt");
    fs::copy(pki.path("other-ca.crt"), &ca).unwrap();
    let config = tls_config(&cluster, &pki, &pw, "ca.crt").replace(
        &toml_string(&pki.path("ca.crt").display().to_string()),
        &toml_string(&ca.display().to_string()),
    );
    let d = Daemon::start(&config);
    refused_then_fixed_by_reload(&d, "wrong CA", "TLS failed", || {
        assert!(
            d.log().contains("certificate"),
            "the log does not name the certificate"
        );
        fs::copy(pki.path("ca.crt"), &ca).unwrap();
    });
}

#[test]
fn a_password_in_the_config_file_is_refused_without_echoing_it() {
    let config = "[redis]\nmode = \"standalone\"\nnodes = [\"127.0.0.1:1\"]\n\
                  password = \"hunter2-in-toml\"\n";
    let (status, log) = Daemon::run_to_exit(config, Duration::from_secs(10));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("redis.password"), "{log}");
    assert!(log.contains("password_file"), "{log}");
    assert!(
        !log.contains("hunter2-in-toml"),
        "the password was echoed: {log}"
    );
}

#[test]
fn sentinel_failover_under_load_answers_everything_and_returns_to_redis() {
    let mut set = SentinelSet::start();
    let dir = common::short_tempdir("rld-sentpw-");
    let pw = password_file(dir.path(), DAEMON_PASSWORD);
    let spw = dir.path().join("sentinel.password");
    fs::write(&spw, format!("{SENTINEL_PASSWORD}\n")).unwrap();
    fs::set_permissions(&spw, fs::Permissions::from_mode(0o600)).unwrap();
    let config = format!(
        "[redis]\nmode = \"sentinel\"\nsentinels = {s}\nservice_name = \"mymaster\"\n\
         timeout_ms = 100\nusername = \"ratelimitd\"\npassword_file = {pw}\n\
         sentinel_password_file = {spw}\n[cache]\nttl_ms = 0\n{RULES}",
        s = toml_str_array(&set.sentinel_addrs()),
        pw = toml_string(&pw.display().to_string()),
        spw = toml_string(&spw.display().to_string()),
    );
    let d = Daemon::start(&config);
    let mut c = d.connect();
    assert!(
        wait_for_source(&mut c, "tb", "redis", Duration::from_secs(10)).is_some(),
        "never decided in Redis through Sentinel:\n{}",
        d.log_tail(30)
    );
    let old = set.primary_port().expect("sentinels name a primary");
    // Load: pipelined batches; every request must get a reply, whoever decides.
    let (mut sent, mut answered, mut redis_after) = (0usize, 0usize, 0usize);
    let (mut killed_at, mut promoted_at, mut back_at) = (None, None, None);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(25) {
        if killed_at.is_none() && start.elapsed() > Duration::from_millis(500) {
            set.kill_data(old);
            killed_at = Some(Instant::now());
        }
        let lines: Vec<String> = (0..20).map(|i| format!("CHECK fw u{}", sent + i)).collect();
        sent += lines.len();
        let replies = c.pipeline(&lines);
        answered += replies.iter().filter(|r| parse_reply(r).limit == 5).count();
        let promoted = set.primary_port().is_some_and(|p| p != old);
        if promoted {
            promoted_at.get_or_insert_with(Instant::now);
            let in_redis = replies
                .iter()
                .filter(|r| parse_reply(r).source == "redis")
                .count();
            if in_redis > 0 {
                back_at.get_or_insert_with(Instant::now);
            }
            redis_after += in_redis;
            if redis_after >= 200 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(answered, sent, "every request gets a reply");
    let new = set.primary_port();
    assert!(new.is_some_and(|p| p != old), "no promotion: {new:?}");
    assert!(
        redis_after >= 200,
        "back in Redis after the promotion: {redis_after} redis replies\n{}",
        d.log_tail(30)
    );
    let (killed_at, promoted_at, back_at) = (
        killed_at.expect("killed"),
        promoted_at.expect("promoted"),
        back_at.expect("back in Redis"),
    );
    // The sentinels need down-after-milliseconds (1 s) plus an election to promote;
    // from then on, the daemon is back in Redis within its probe interval and the
    // client's reconnect (the contract's 1 s), measured from when this test saw the
    // promotion (it polls the sentinels between batches, so that is an upper bound).
    let recovery = back_at.saturating_duration_since(promoted_at);
    println!(
        "sentinel: {sent} requests, all answered; primary {old} -> {new:?}; promoted {:?} after the kill, decisions back in Redis {recovery:?} after the promotion",
        promoted_at - killed_at
    );
    assert!(
        recovery <= Duration::from_millis(1500),
        "back in Redis {recovery:?} after the promotion\n{}",
        d.log_tail(30)
    );
}
