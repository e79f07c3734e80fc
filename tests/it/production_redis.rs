//! Redis as production runs it: a TLS-only Redis Cluster with client certificates and a
//! least-privilege ACL user, the password from the systemd credential and never shown,
//! and Sentinel failing over under load. Real servers on loopback; the CA is made at run
//! time. (Redis refusing the daemon, and the fix by a reload: `tests/it/redis_refusals.rs`.)

use crate::common;
use crate::secure_redis;

use common::{daemon_bin, parse_reply, toml_str_array, toml_string, Client, Daemon};
use secure_redis::{Pki, SentinelSet, TlsCluster, DAEMON_PASSWORD, SENTINEL_PASSWORD};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// One rule per algorithm, `limit` 5, slow to refill: the sixth request in a burst is
/// denied, whoever decides.
const RULES: &str = r#"
[[rule]]
name = "leased"
algorithm = "token_bucket"
capacity = 20000
refill_rate = 1.0
lease = "auto"

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
/// Without `password_file`, the password comes from the systemd credential.
fn tls_config(cluster: &TlsCluster, pki: &Pki, password_file: Option<&Path>, ca: &str) -> String {
    let pw = password_file.map_or(String::new(), |p| {
        format!(
            "password_file = {}\n",
            toml_string(&p.display().to_string())
        )
    });
    format!(
        "[redis]\nmode = \"cluster\"\nnodes = {nodes}\ntimeout_ms = 200\n\
         username = \"ratelimitd\"\n{pw}\
         tls = true\ntls_ca_file = {ca}\ntls_cert_file = {cert}\ntls_key_file = {key}\n\
         [cache]\nttl_ms = 0\n{RULES}",
        nodes = toml_str_array(&cluster.addrs()),
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

/// The password as systemd hands it over (`LoadCredential=redis-password:…`): a file
/// named `redis-password` in `$CREDENTIALS_DIRECTORY`, no `password_file` in the config.
#[test]
fn tls_cluster_with_acl_user_and_systemd_credential_decides_every_algorithm_in_redis() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let credentials = common::short_tempdir("rld-cred-");
    fs::write(
        credentials.path().join("redis-password"),
        format!("{DAEMON_PASSWORD}\n"),
    )
    .unwrap();
    let env = [(
        "CREDENTIALS_DIRECTORY",
        credentials.path().to_str().unwrap(),
    )];
    let d = Daemon::start_with(
        &daemon_bin(),
        &env,
        &tls_config(&cluster, &pki, None, "ca.crt"),
    );
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
    // A hot key of a rule with leases: its lease script (which reads and trims the
    // holders' fields) runs under the ACL user too.
    let batch: Vec<String> = (0..50).map(|_| "CHECK leased hot".to_string()).collect();
    let mut sources = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..40 {
        for line in c.pipeline(&batch) {
            let r = parse_reply(&line);
            assert!(r.allowed(), "{r:?}\n{}", d.log_tail(20));
            *sources.entry(r.source).or_default() += 1;
        }
    }
    assert!(
        sources.get("lease").is_some_and(|n| *n > 0) && !sources.contains_key("local"),
        "a hot leased key: {sources:?}\n{}",
        d.log_tail(20)
    );
    let denials = cluster.acl_denials();
    assert!(
        denials.trim().is_empty(),
        "the documented ACL line refused something:\n{denials}"
    );
    // The password is nowhere to be seen: not in the log, the command line, the
    // environment, nor what `--check` prints.
    let proc_file = |f: &str| fs::read(format!("/proc/{}/{f}", d.pid())).unwrap_or_default();
    let check = std::process::Command::new(daemon_bin())
        .arg("--config")
        .arg(d.config_path())
        .arg("--check")
        .envs(env)
        .output()
        .unwrap();
    assert!(check.status.success(), "--check: {check:?}");
    let shown = [
        ("the log", d.log().into_bytes()),
        ("/proc/<pid>/cmdline", proc_file("cmdline")),
        ("/proc/<pid>/environ", proc_file("environ")),
        ("--check output", [check.stdout, check.stderr].concat()),
    ];
    for (place, bytes) in &shown {
        assert!(
            !bytes.is_empty() || *place == "--check output",
            "{place} is empty"
        );
        assert!(
            !String::from_utf8_lossy(bytes).contains(DAEMON_PASSWORD),
            "the password reached {place}"
        );
    }
    println!("TLS + ACL cluster, password from $CREDENTIALS_DIRECTORY/redis-password: 5 algorithms x 6 keys decided in Redis, a hot leased key {sources:?}, ACL LOG empty; the password in none of the log, cmdline, environ, --check output");
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
