#![allow(dead_code)]
//! Redis as production runs it, for the tests in `tests/production_redis.rs`: a test CA
//! made at run time with `openssl`, a 3-primary Redis Cluster reachable over TLS only
//! (plain port 0, `tls-cluster yes`, `tls-replication yes`, client certificates
//! required) whose users come from an ACL file with the daemon's least-privilege user,
//! and a Sentinel set (one primary, one replica, three sentinels with a password).
//!
//! Every process is started through the harness' owned spawner (killed by pid on drop
//! and when the test process dies); everything listens on 127.0.0.1, ports picked free.

use crate::common::{free_port, spawn_owned, wait_until};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tempfile::TempDir;

/// The daemon's Redis ACL user, exactly as `docs/PRODUCTION-REDIS.md` gives it (with the
/// password appended at run time): the key prefix `rl:` only, no channels, and only the
/// commands the daemon sends (connection set-up, `CLUSTER SLOTS`, `SCRIPT LOAD`,
/// `EVALSHA`) and those its scripts call.
pub const DAEMON_ACL: &str = "user ratelimitd on ~rl:* resetchannels -@all \
    +ping +hello +auth +client|id +client|setname +info +role +cluster|slots +cluster|info \
    +script|load +evalsha +time +hmget +hset +pexpire +zadd +zrange +zrem +zremrangebyscore";

/// The administrator the tests use to build and inspect the servers.
pub const ADMIN_USER: &str = "admin";
/// Its password.
pub const ADMIN_PASSWORD: &str = "admin-secret";
/// The daemon user's password.
pub const DAEMON_PASSWORD: &str = "rl-secret-7f3a";

/// A test certificate authority with a server and a client certificate, and a second,
/// unrelated CA (for "wrong CA" tests). Files in a temp dir.
pub struct Pki {
    dir: TempDir,
}

impl Pki {
    /// Makes the CA, `server.crt` (SAN `IP:127.0.0.1`, `DNS:redis.test`) and
    /// `client.crt`, each with its key, and `other-ca.crt`. Panics if openssl fails.
    pub fn new() -> Pki {
        let dir = crate::common::short_tempdir("rld-pki-");
        let d = dir.path();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .stdin(Stdio::null())
                .output()
                .expect("running openssl (install the openssl package)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        for ca in ["ca", "other-ca"] {
            run(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=ratelimitd test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.crt"),
            ]);
        }
        fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:redis.test\n",
        )
        .unwrap();
        fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for (name, cn) in [("server", "redis.test"), ("client", "ratelimitd")] {
            run(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.crt"),
            ]);
        }
        Pki { dir }
    }

    /// The path of `name` (`ca.crt`, `server.key`, `client.crt`, `other-ca.crt`, …).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Writes the ACL file every server of a test loads: the admin, the daemon's user, and
/// the `default` user switched off.
fn write_acl(path: &Path) {
    fs::write(
        path,
        format!(
            "user default off\n\
             user {ADMIN_USER} on >{ADMIN_PASSWORD} ~* &* +@all\n\
             {DAEMON_ACL} >{DAEMON_PASSWORD}\n"
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
    let mut cmd = Command::new("redis-server");
    cmd.arg(&path);
    if sentinel {
        cmd.arg("--sentinel");
    }
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Proc {
        child: spawn_owned(cmd).expect("spawning redis-server"),
    }
}

/// `redis-cli` with the given connection arguments, then `args`; its stdout.
fn cli(conn: &[String], args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(conn)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Three primaries, TLS only, client certificates required, users from the ACL file.
pub struct TlsCluster {
    nodes: Vec<(u16, Proc)>,
    dir: TempDir,
    conn: Vec<String>,
}

impl TlsCluster {
    /// Starts the nodes, creates the cluster and waits until `cluster_state:ok`.
    pub fn start(pki: &Pki) -> TlsCluster {
        let dir = crate::common::short_tempdir("rld-tls-");
        let acl = dir.path().join("users.acl");
        write_acl(&acl);
        let conn = vec![
            "--tls".into(),
            "--cacert".into(),
            pki.path("ca.crt").display().to_string(),
            "--cert".into(),
            pki.path("client.crt").display().to_string(),
            "--key".into(),
            pki.path("client.key").display().to_string(),
            "--user".into(),
            ADMIN_USER.into(),
            "--pass".into(),
            ADMIN_PASSWORD.into(),
            "--no-auth-warning".into(),
        ];
        let mut nodes = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let node_dir = dir.path().join(format!("node{i}"));
            let conf = format!(
                "port 0\ntls-port {port}\nbind 127.0.0.1\n\
                 tls-cert-file {srv}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
                 tls-auth-clients yes\ntls-cluster yes\ntls-replication yes\n\
                 cluster-enabled yes\ncluster-config-file {d}/nodes.conf\n\
                 cluster-node-timeout 2000\naclfile {acl}\ndir {d}\nlogfile {d}/redis.log\n\
                 save \"\"\nappendonly no\n",
                srv = pki.path("server.crt").display(),
                key = pki.path("server.key").display(),
                ca = pki.path("ca.crt").display(),
                d = node_dir.display(),
                acl = acl.display(),
            );
            nodes.push((port, start_server(&node_dir, &conf, false)));
        }
        let c = TlsCluster { nodes, dir, conn };
        for (port, _) in &c.nodes {
            let p = port.to_string();
            assert!(
                wait_until(Duration::from_secs(10), || c
                    .cli_at(&p, &["PING"])
                    .contains("PONG")),
                "TLS node {p} did not answer"
            );
        }
        let mut create: Vec<String> = vec!["--cluster".into(), "create".into()];
        create.extend(c.addrs());
        create.push("--cluster-yes".into());
        let create: Vec<&str> = create.iter().map(String::as_str).collect();
        let out = cli(&c.conn, &create);
        assert!(
            out.contains("All 16384 slots covered"),
            "cluster create: {out}"
        );
        assert!(
            wait_until(Duration::from_secs(20), || c.addrs().iter().all(|a| {
                let port = a.rsplit(':').next().unwrap();
                c.cli_at(port, &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            })),
            "TLS cluster never reached cluster_state:ok"
        );
        c
    }

    /// `127.0.0.1:PORT` of the three nodes (their TLS ports).
    pub fn addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// `redis-cli` as the admin, over TLS, at `port`.
    pub fn cli_at(&self, port: &str, args: &[&str]) -> String {
        let mut conn = self.conn.clone();
        conn.extend(["-h".into(), "127.0.0.1".into(), "-p".into(), port.into()]);
        cli(&conn, args)
    }

    /// `ACL LOG` entries of every node (empty when no command was refused).
    pub fn acl_denials(&self) -> String {
        let mut all = String::new();
        for (port, _) in &self.nodes {
            let log = self.cli_at(&port.to_string(), &["ACL", "LOG"]);
            if !log.trim().is_empty() {
                all.push_str(&format!("node {port}:\n{log}\n"));
            }
        }
        all
    }

    /// The directory holding the nodes' files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// One primary, one replica (both with the ACL file) and three sentinels that require
/// a password of their own. The service is called `mymaster`.
pub struct SentinelSet {
    data: Vec<(u16, Option<Proc>)>,
    sentinels: Vec<(u16, Proc)>,
    dir: TempDir,
}

/// The sentinels' own password.
pub const SENTINEL_PASSWORD: &str = "sentinel-secret";

impl SentinelSet {
    /// Starts primary, replica and sentinels, and waits until the sentinels know the
    /// replica and each other.
    pub fn start() -> SentinelSet {
        let dir = crate::common::short_tempdir("rld-sent-");
        let acl = dir.path().join("users.acl");
        write_acl(&acl);
        let mut data = Vec::new();
        let primary_port = free_port();
        for i in 0..2 {
            let port = if i == 0 { primary_port } else { free_port() };
            let d = dir.path().join(format!("data{i}"));
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\naclfile {acl}\ndir {d}\nlogfile {d}/redis.log\n\
                 save \"\"\nappendonly no\nmasteruser {ADMIN_USER}\nmasterauth {ADMIN_PASSWORD}\n\
                 repl-diskless-sync yes\nrepl-diskless-sync-delay 0\n",
                acl = acl.display(),
                d = d.display()
            );
            if i == 1 {
                conf.push_str(&format!("replicaof 127.0.0.1 {primary_port}\n"));
            }
            data.push((port, Some(start_server(&d, &conf, false))));
        }
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let d = dir.path().join(format!("sentinel{i}"));
            let conf = format!(
                "port {port}\nbind 127.0.0.1\ndir {d}\nlogfile {d}/sentinel.log\n\
                 requirepass {SENTINEL_PASSWORD}\nsentinel sentinel-pass {SENTINEL_PASSWORD}\n\
                 sentinel monitor mymaster 127.0.0.1 {primary_port} 2\n\
                 sentinel auth-user mymaster {ADMIN_USER}\nsentinel auth-pass mymaster {ADMIN_PASSWORD}\n\
                 sentinel down-after-milliseconds mymaster 1000\n\
                 sentinel failover-timeout mymaster 5000\n",
                d = d.display()
            );
            sentinels.push((port, start_server(&d, &conf, true)));
        }
        let s = SentinelSet {
            data,
            sentinels,
            dir,
        };
        assert!(
            wait_until(Duration::from_secs(20), || s.sentinels.iter().all(
                |(p, _)| {
                    let info = s.sentinel_cli(*p, &["SENTINEL", "REPLICAS", "mymaster"]);
                    info.contains("slave") || info.contains("replica")
                }
            )),
            "the sentinels never saw the replica"
        );
        s
    }

    /// `127.0.0.1:PORT` of the sentinels.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// `redis-cli` to sentinel `port` with its password.
    pub fn sentinel_cli(&self, port: u16, args: &[&str]) -> String {
        let conn = vec![
            "-p".into(),
            port.to_string(),
            "-a".into(),
            SENTINEL_PASSWORD.into(),
            "--no-auth-warning".into(),
        ];
        cli(&conn, args)
    }

    /// The port the sentinels currently name as the primary.
    pub fn primary_port(&self) -> Option<u16> {
        let out = self.sentinel_cli(
            self.sentinels[0].0,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"],
        );
        out.lines().nth(1).and_then(|l| l.trim().parse().ok())
    }

    /// Kills (SIGKILL) the data node listening on `port`.
    pub fn kill_data(&mut self, port: u16) {
        for (p, proc_) in &mut self.data {
            if *p == port {
                proc_.take();
            }
        }
    }
}
