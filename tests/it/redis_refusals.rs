//! Redis refusing the daemon, as an operator meets it in production: a wrong password, a
//! CA that did not sign the servers' certificates, an expired client or server
//! certificate, an ACL user missing a command (`NOPERM`, or inside a script). Each time the daemon keeps
//! answering every request per `on_redis_failure`, says the cause in one log line (not
//! one per retry: fred retries every 100 ms), and is back in Redis within a second of
//! the fix and a reload (SIGHUP), without a restart. A TLS-only Redis Cluster with
//! client certificates and the documented ACL user (`tests/secure_redis`), on loopback.

use crate::common;
use crate::secure_redis;

use common::{parse_reply, server_family, toml_str_array, toml_string, Client, Daemon};
use secure_redis::{Pki, TlsCluster, DAEMON_PASSWORD};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One token bucket, slow to refill; deny cache off.
const RULES: &str = "[cache]\nttl_ms = 0\n[[rule]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\n\
                     capacity = 5\nrefill_rate = 0.01\n";

/// How long the log is watched for repeats of the cause while fred keeps retrying.
const WATCH: Duration = Duration::from_secs(3);

/// The daemon's files, copied into a directory of their own so a test can break and
/// fix them: `redis.password`, `ca.crt`, `client.crt`, `client.key`.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new(pki: &Pki) -> Files {
        let dir = common::short_tempdir("rld-files-");
        let files = Files { dir };
        files.put("redis.password", &format!("{DAEMON_PASSWORD}\n"));
        for f in ["ca.crt", "client.crt", "client.key"] {
            fs::copy(pki.path(f), files.path(f)).unwrap();
        }
        files
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `text` to `name`, mode 0600.
    fn put(&self, name: &str, text: &str) {
        fs::write(self.path(name), text).unwrap();
        fs::set_permissions(self.path(name), fs::Permissions::from_mode(0o600)).unwrap();
    }

    /// Copies `from` over `name`.
    fn replace(&self, name: &str, from: &Path) {
        fs::copy(from, self.path(name)).unwrap();
    }

    /// The daemon's config for `cluster` with these files.
    fn config(&self, cluster: &TlsCluster) -> String {
        let p = |f: &str| toml_string(&self.path(f).display().to_string());
        format!(
            "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = 200\n\
             username = \"ratelimitd\"\npassword_file = {}\n\
             tls = true\ntls_ca_file = {}\ntls_cert_file = {}\ntls_key_file = {}\n{RULES}",
            toml_str_array(&cluster.addrs()),
            p("redis.password"),
            p("ca.crt"),
            p("client.crt"),
            p("client.key"),
        )
    }
}

/// Waits until `CHECK tb <probe> 0` is answered from `source`; the time it took.
fn wait_for_source(c: &mut Client, source: &str, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < within {
        n += 1;
        if parse_reply(&c.request(&format!("CHECK tb probe{n} 0"))).source == source {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// A daemon Redis refuses: every request is answered locally; over [`WATCH`] exactly one
/// log line says `cause` (and names `detail`, Redis' or rustls' own words); `fix`
/// repairs things, and after SIGHUP decisions are back in Redis within 1 s. `what` names
/// the case in the printed figures.
fn refused_then_fixed_by_reload(
    d: &Daemon,
    what: &str,
    cause: &str,
    detail: &str,
    fix: impl FnOnce(),
) {
    let mut c = d.connect();
    let start = Instant::now();
    let mut answered = 0;
    while start.elapsed() < WATCH {
        let r = parse_reply(&c.request(&format!("CHECK tb k{answered}")));
        assert_eq!(r.source, "local", "{r:?}\n{}", d.log_tail(20));
        answered += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = d.log();
    let naming: Vec<&str> = log.lines().filter(|l| l.contains(cause)).collect();
    assert_eq!(
        naming.len(),
        1,
        "want one line saying {cause:?} over {WATCH:?}, got {}:\n{}",
        naming.len(),
        d.log_tail(30)
    );
    assert!(
        naming[0].contains(detail),
        "the line does not name {detail:?}: {}",
        naming[0]
    );
    fix();
    d.signal(libc::SIGHUP);
    let took = wait_for_source(&mut c, "redis", Duration::from_secs(5))
        .unwrap_or_else(|| panic!("not back in Redis after the fix:\n{}", d.log_tail(30)));
    println!(
        "{what}: {answered} requests answered locally over {WATCH:?}, {} log line saying {cause:?}; back in Redis {took:?} after SIGHUP\n  the line: {}",
        naming.len(),
        naming[0].split("; deciding").next().unwrap_or_default()
    );
    assert!(took <= Duration::from_secs(1), "took {took:?}");
    assert!(
        !log.contains(DAEMON_PASSWORD),
        "the password reached the log"
    );
}

#[test]
fn wrong_password() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let files = Files::new(&pki);
    files.put("redis.password", "not-the-password\n");
    let d = Daemon::start(&files.config(&cluster));
    refused_then_fixed_by_reload(
        &d,
        "wrong password",
        "authentication failed",
        "WRONGPASS",
        || files.put("redis.password", &format!("{DAEMON_PASSWORD}\n")),
    );
    assert!(
        !d.log().contains("not-the-password"),
        "the password reached the log"
    );
}

#[test]
fn wrong_ca() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let files = Files::new(&pki);
    // The configured CA file holds a CA that did not sign the servers' certificates.
    files.replace("ca.crt", &pki.path("other-ca.crt"));
    let d = Daemon::start(&files.config(&cluster));
    refused_then_fixed_by_reload(&d, "wrong CA", "TLS failed", "UnknownIssuer", || {
        files.replace("ca.crt", &pki.path("ca.crt"))
    });
}

#[test]
fn expired_client_certificate() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let files = Files::new(&pki);
    files.replace("client.crt", &pki.expired("client"));
    let d = Daemon::start(&files.config(&cluster));
    refused_then_fixed_by_reload(
        &d,
        "expired client certificate",
        "TLS failed",
        "Expired",
        || files.replace("client.crt", &pki.path("client.crt")),
    );
}

#[test]
fn expired_server_certificate() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let files = Files::new(&pki);
    let expired = pki.expired("server");
    cluster.set_server_certificate(&expired);
    let d = Daemon::start(&files.config(&cluster));
    refused_then_fixed_by_reload(
        &d,
        "expired server certificate",
        "TLS failed",
        "Expired",
        || cluster.set_server_certificate(&pki.path("server.crt")),
    );
}

#[test]
fn acl_user_without_evalsha() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let files = Files::new(&pki);
    cluster.acl_setuser_everywhere(&["ratelimitd", "-evalsha"]);
    let d = Daemon::start(&files.config(&cluster));
    refused_then_fixed_by_reload(&d, "ACL without +evalsha", "NOPERM", "evalsha", || {
        cluster.acl_setuser_everywhere(&["ratelimitd", "+evalsha"])
    });
}

/// The user may run EVALSHA but not a command inside the script (Redis 7 refuses it
/// inside the script, "can't run this command"; Valkey 8 "ACL failure in script"): every
/// decision of that script fails alike, so it is the primary's failure, said once, not a
/// per-key error per request.
#[test]
fn acl_user_without_a_command_its_script_runs() {
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki);
    let files = Files::new(&pki);
    cluster.acl_setuser_everywhere(&["ratelimitd", "-pexpire"]);
    let d = Daemon::start(&files.config(&cluster));
    let refusal = match server_family() {
        "valkey" => "ACL failure in script",
        _ => "can't run this command",
    };
    refused_then_fixed_by_reload(
        &d,
        "ACL without +pexpire (inside the script)",
        "lacks a permission",
        refusal,
        || cluster.acl_setuser_everywhere(&["ratelimitd", "+pexpire"]),
    );
    assert!(
        !d.log().contains("Redis could not decide a key"),
        "logged as a per-key error:\n{}",
        d.log_tail(20)
    );
}
