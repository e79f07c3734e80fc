//! One Redis Cluster type for the cluster tests, either plain (`tests/common/cluster.rs`:
//! three primaries and three replicas, no auth) or as production runs it (TLS only,
//! client certificates, the documented least-privilege ACL user with its password from
//! a file), so that each test that exercises slots, redirects, failover or an algorithm
//! runs on both: see [`crate::plain_and_tls`].

use super::{Pki, TlsCluster, DAEMON_PASSWORD};
use crate::common::{
    parse_reply, toml_str_array, toml_string, wait_until, Client, Daemon, RedisCluster,
};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

/// How a test's cluster is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Plain TCP, no auth.
    Plain,
    /// TLS only, client certificate, the daemon's ACL user and password file.
    TlsAcl,
}

/// A cluster of three primaries with one replica each, of either [`Flavor`].
pub enum TestCluster {
    /// Plain TCP.
    Plain(RedisCluster),
    /// TLS and ACL; the PKI and the daemon's password file live as long as the cluster.
    TlsAcl {
        /// The nodes.
        cluster: TlsCluster,
        /// The CA and certificates.
        pki: Pki,
        /// The daemon's password file (mode 0600).
        password_file: PathBuf,
    },
}

impl TestCluster {
    /// Starts a healthy cluster of `flavor`.
    pub fn start(flavor: Flavor) -> TestCluster {
        match flavor {
            Flavor::Plain => TestCluster::Plain(RedisCluster::start()),
            Flavor::TlsAcl => {
                let pki = Pki::new();
                let cluster = TlsCluster::start_with_replicas(&pki);
                let password_file = cluster.dir().join("redis.password");
                fs::write(&password_file, format!("{DAEMON_PASSWORD}\n")).unwrap();
                fs::set_permissions(&password_file, fs::Permissions::from_mode(0o600)).unwrap();
                TestCluster::TlsAcl {
                    cluster,
                    pki,
                    password_file,
                }
            }
        }
    }

    /// The `[redis]` fields that say how to reach this cluster (`mode`, `nodes`, and for
    /// TLS the user, password file and TLS files), one per line; a test adds its own
    /// (`timeout_ms`, `prefix`) after them.
    pub fn redis_fields(&self) -> String {
        let mut s = format!(
            "mode = \"cluster\"\nnodes = {}\n",
            toml_str_array(&self.addrs())
        );
        if let TestCluster::TlsAcl {
            pki, password_file, ..
        } = self
        {
            let path = |p: PathBuf| toml_string(&p.display().to_string());
            s.push_str(&format!(
                "username = \"ratelimitd\"\npassword_file = {}\ntls = true\n\
                 tls_ca_file = {}\ntls_cert_file = {}\ntls_key_file = {}\n",
                path(password_file.clone()),
                path(pki.path("ca.crt")),
                path(pki.path("client.crt")),
                path(pki.path("client.key")),
            ));
        }
        s
    }

    /// `127.0.0.1:PORT` of all six nodes, in creation order (the first three are the
    /// primaries right after start).
    pub fn addrs(&self) -> Vec<String> {
        match self {
            TestCluster::Plain(c) => c.addrs(),
            TestCluster::TlsAcl { cluster, .. } => cluster.addrs(),
        }
    }

    /// The nodes that currently say they are primaries.
    pub fn primary_addrs(&self) -> Vec<String> {
        match self {
            TestCluster::Plain(c) => c.primary_addrs(),
            TestCluster::TlsAcl { cluster, .. } => cluster.primary_addrs(),
        }
    }

    /// The nodes that currently say they are replicas.
    pub fn replica_addrs(&self) -> Vec<String> {
        match self {
            TestCluster::Plain(c) => c.replica_addrs(),
            TestCluster::TlsAcl { cluster, .. } => cluster.replica_addrs(),
        }
    }

    /// `redis-cli` (as the admin, over TLS, for `TlsAcl`) at `addr`: stdout, trimmed.
    pub fn cli(&self, addr: &str, args: &[&str]) -> String {
        match self {
            TestCluster::Plain(c) => c.cli(addr, args),
            TestCluster::TlsAcl { cluster, .. } => cluster.cli(addr, args),
        }
    }

    /// `KEYS *` on every current primary, sorted.
    pub fn all_keys(&self) -> Vec<String> {
        match self {
            TestCluster::Plain(c) => c.all_keys(),
            TestCluster::TlsAcl { cluster, .. } => cluster.all_keys(),
        }
    }

    /// SIGKILLs one node.
    pub fn kill_node(&mut self, addr: &str) {
        match self {
            TestCluster::Plain(c) => c.kill_node(addr),
            TestCluster::TlsAcl { cluster, .. } => cluster.kill_node(addr),
        }
    }

    /// SIGKILLs every node.
    pub fn kill_all(&mut self) {
        match self {
            TestCluster::Plain(c) => c.kill_all(),
            TestCluster::TlsAcl { cluster, .. } => cluster.kill_all(),
        }
    }

    /// Restarts every node (same ports, no data, empty script caches); waits for health.
    pub fn restart_all(&mut self) {
        match self {
            TestCluster::Plain(c) => c.restart_all(),
            TestCluster::TlsAcl { cluster, .. } => cluster.restart_all(),
        }
    }

    /// Polls until every primary's slots are served again and every node agrees (after
    /// a failover, a killed node is left out), or `timeout`.
    pub fn wait_slots_ok(&self, timeout: Duration) -> bool {
        wait_until(timeout, || {
            self.primary_addrs().iter().all(|a| {
                self.cli(a, &["CLUSTER", "INFO"])
                    .lines()
                    .any(|l| l.trim() == "cluster_state:ok")
            })
        })
    }

    /// Commands the ACL refused the daemon's user (`ACL LOG` of every node); always
    /// empty for a plain cluster.
    pub fn acl_denials(&self) -> String {
        match self {
            TestCluster::Plain(_) => String::new(),
            TestCluster::TlsAcl { cluster, .. } => cluster.acl_denials(),
        }
    }

    /// Panics if the ACL refused the daemon anything: the documented line must be
    /// enough for what the test just did.
    pub fn assert_no_acl_denials(&self) {
        let denials = self.acl_denials();
        assert!(
            denials.trim().is_empty(),
            "the documented ACL line refused the daemon something:\n{denials}"
        );
    }
}

/// A client of `d` once `rule` is decided in Redis on every primary (30 keys, spread
/// over the slots, all answered from Redis): on a loaded machine the daemon may start
/// serving (locally) before its connections to every primary are up.
pub fn connect_in_redis(d: &Daemon, rule: &str) -> Client {
    let mut c = d.connect();
    let probes: Vec<String> = (0..30)
        .map(|i| format!("CHECK {rule} __ready{i} 0"))
        .collect();
    assert!(
        wait_until(Duration::from_secs(15), || c
            .pipeline(&probes)
            .iter()
            .all(|r| parse_reply(r).source == "redis")),
        "never decided in Redis on every primary:\n{}",
        d.log_tail(20)
    );
    c
}

/// Runs `fn NAME(flavor: Flavor)` as two tests, `NAME::plain` and `NAME::tls_acl`.
#[macro_export]
macro_rules! plain_and_tls {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn plain() {
                super::$name($crate::secure_redis::Flavor::Plain)
            }
            #[test]
            fn tls_acl() {
                super::$name($crate::secure_redis::Flavor::TlsAcl)
            }
        }
    )*};
}
