#![allow(dead_code)]
//! Redis as production runs it, for the tests that need it: a test CA made at run time
//! with `openssl` ([`pki`]), a Redis Cluster reachable over TLS only whose users come from
//! an ACL file with the daemon's least-privilege user ([`tls_cluster`]), a Sentinel set
//! ([`sentinel`]), and one cluster type that is either the plain cluster of
//! `tests/common/cluster.rs` or the TLS one, so a cluster test runs on both
//! ([`any_cluster`]).
//!
//! Every process is started through the harness' owned spawner (killed by pid on drop
//! and when the test process dies); everything listens on 127.0.0.1, ports picked free.

#[macro_use] // plain_and_tls!, for the modules declared after it (tests/it/main.rs)
pub mod any_cluster;
pub mod pki;
pub mod sentinel;
pub mod tls_cluster;

// Each test file uses its own subset of these.
#[allow(unused_imports)]
pub use any_cluster::{connect_in_redis, Flavor, TestCluster};
pub use pki::Pki;
#[allow(unused_imports)]
pub use sentinel::{SentinelSet, SENTINEL_PASSWORD};
pub use tls_cluster::TlsCluster;

use crate::common::{redis_cli_bin, redis_server_bin, spawn_owned};
use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The administrator the tests use to build and inspect the servers.
pub const ADMIN_USER: &str = "admin";
/// Its password.
pub const ADMIN_PASSWORD: &str = "admin-secret";
/// The daemon user's password.
pub const DAEMON_PASSWORD: &str = "rl-secret-7f3a";

/// The daemon's ACL line for an ACL file, exactly as `docs/PRODUCTION-REDIS.md` gives
/// it (the one line there starting `ACL SETUSER ratelimitd`), its placeholder password
/// `CHANGE-ME` replaced by `password`. Read from the document so the tests run what a
/// user copies.
pub fn daemon_acl(password: &str) -> String {
    let doc = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PRODUCTION-REDIS.md");
    let text = fs::read_to_string(doc).expect("reading docs/PRODUCTION-REDIS.md");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER ratelimitd "))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "docs/PRODUCTION-REDIS.md must give exactly one `ACL SETUSER ratelimitd` line"
    );
    let line = lines[0].trim_end();
    assert!(
        line.contains(" >CHANGE-ME "),
        "the documented ACL line sets the password >CHANGE-ME: {line}"
    );
    line.replacen("ACL SETUSER ", "user ", 1)
        .replacen(" >CHANGE-ME ", &format!(" >{password} "), 1)
}

/// Writes the ACL file every server of a test loads: the admin, the daemon's user (the
/// documented line), and the `default` user switched off.
fn write_acl(path: &Path) {
    fs::write(
        path,
        format!(
            "user default off\n\
             user {ADMIN_USER} on >{ADMIN_PASSWORD} ~* &* +@all\n\
             {}\n",
            daemon_acl(DAEMON_PASSWORD)
        ),
    )
    .expect("writing the ACL file");
}

/// One redis-server (or sentinel) process, killed on drop.
struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start_server(dir: &Path, conf: &str, sentinel: bool) -> Proc {
    fs::create_dir_all(dir).unwrap();
    let path = dir.join("redis.conf");
    fs::write(&path, conf).unwrap();
    let mut cmd = Command::new(redis_server_bin());
    cmd.arg(&path);
    if sentinel {
        cmd.arg("--sentinel");
    }
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Proc {
        child: spawn_owned(cmd)
            .unwrap_or_else(|e| panic!("spawning {} (is it installed?): {e}", redis_server_bin())),
    }
}

/// `redis-cli` with the given connection arguments, then `args`; its stdout and stderr.
/// Tried up to three times when it fails with nothing on stdout (it could not connect or
/// finish its TLS handshake: a server slow to answer on a loaded machine); a reply,
/// error replies included, is never asked twice.
fn cli(conn: &[String], args: &[&str]) -> String {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let out = Command::new(redis_cli_bin())
            .args(conn)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {} (is it installed?): {e}", redis_cli_bin()));
        if out.status.success() || !out.stdout.is_empty() || attempt == 3 {
            return String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
