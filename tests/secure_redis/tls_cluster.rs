//! A Redis Cluster reachable over TLS only: plain port 0, `tls-cluster yes`,
//! `tls-replication yes`, client certificates required, users from an ACL file with the
//! daemon's documented least-privilege user. Three primaries, optionally each with a
//! replica, and the faults the cluster tests inject (kill, restart, failover).

use super::{cli, start_server, write_acl, Pki, Proc, ADMIN_PASSWORD, ADMIN_USER};
use crate::common::{free_port, port_of, wait_until};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tempfile::TempDir;

/// One node: its TLS port, directory (config, nodes.conf, log) and process.
struct Node {
    port: u16,
    dir: PathBuf,
    conf: String,
    proc_: Option<Proc>,
}

/// Three primaries (and optionally three replicas), TLS only.
pub struct TlsCluster {
    // Field order matters: nodes are killed before the directory is removed.
    nodes: Vec<Node>,
    dir: TempDir,
    conn: Vec<String>,
}

impl TlsCluster {
    /// Three primaries; waits until `cluster_state:ok`.
    pub fn start(pki: &Pki) -> TlsCluster {
        Self::start_nodes(pki, 0)
    }

    /// Three primaries with one replica each; waits until every replica is in sync.
    pub fn start_with_replicas(pki: &Pki) -> TlsCluster {
        Self::start_nodes(pki, 1)
    }

    fn start_nodes(pki: &Pki, replicas: usize) -> TlsCluster {
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
        let mut c = TlsCluster {
            nodes: Vec::new(),
            dir,
            conn,
        };
        for i in 0..3 * (1 + replicas) {
            let node_dir = c.dir.path().join(format!("node{i}"));
            c.add_node(pki, &acl, node_dir);
        }
        let mut create: Vec<String> = vec!["--cluster".into(), "create".into()];
        create.extend(c.addrs());
        create.extend([
            "--cluster-replicas".into(),
            replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        let create: Vec<&str> = create.iter().map(String::as_str).collect();
        let out = cli(&c.conn, &create);
        assert!(
            out.contains("All 16384 slots covered"),
            "cluster create: {out}"
        );
        c.wait_ready_or_panic("start");
        c.assert_setuser_form_is_the_file_form();
        c
    }

    /// The documented line run as `ACL SETUSER` (under another name) gives the same user
    /// as its ACL-file form: the tests, which use the file, run what the page says.
    fn assert_setuser_form_is_the_file_form(&self) {
        let file_form = super::daemon_acl(super::DAEMON_PASSWORD);
        let mut args: Vec<&str> = file_form.split_whitespace().collect();
        assert_eq!(args[..2], ["user", "ratelimitd"]);
        args[0] = "SETUSER";
        args[1] = "ratelimitd-setuser";
        let mut cmd = vec!["ACL"];
        cmd.extend(&args);
        let a = &self.addrs()[0];
        assert_eq!(self.cli(a, &cmd), "OK", "ACL {args:?}");
        let list = self.cli(a, &["ACL", "LIST"]);
        let rules = |name: &str| {
            list.lines()
                .find_map(|l| l.strip_prefix(&format!("user {name} ")))
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("{name} not in ACL LIST:\n{list}"))
        };
        assert_eq!(rules("ratelimitd-setuser"), rules("ratelimitd"));
        assert_eq!(self.cli(a, &["ACL", "DELUSER", "ratelimitd-setuser"]), "1");
    }

    /// Starts a node in `node_dir` on a free port; on another port if it does not come
    /// up (another program may take a port between picking and binding it).
    fn add_node(&mut self, pki: &Pki, acl: &Path, node_dir: PathBuf) {
        let mut failures = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            // The servers' certificate doubles as their client certificate on the
            // cluster bus and for replication; replicas authenticate as the admin.
            let conf = format!(
                "port 0\ntls-port {port}\nbind 127.0.0.1\n\
                 tls-cert-file {srv}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
                 tls-auth-clients yes\ntls-cluster yes\ntls-replication yes\n\
                 cluster-enabled yes\ncluster-config-file {d}/nodes.conf\n\
                 cluster-node-timeout 2000\naclfile {acl}\ndir {d}\nlogfile {d}/redis.log\n\
                 masteruser {ADMIN_USER}\nmasterauth {ADMIN_PASSWORD}\n\
                 repl-diskless-sync yes\nrepl-diskless-sync-delay 0\n\
                 save \"\"\nappendonly no\n",
                srv = pki.path("server.crt").display(),
                key = pki.path("server.key").display(),
                ca = pki.path("ca.crt").display(),
                d = node_dir.display(),
                acl = acl.display(),
            );
            let proc_ = Some(start_server(&node_dir, &conf, false));
            let addr = format!("127.0.0.1:{port}");
            if wait_until(Duration::from_secs(10), || {
                self.cli(&addr, &["PING"]) == "PONG"
            }) {
                self.nodes.push(Node {
                    port,
                    dir: node_dir,
                    conf,
                    proc_,
                });
                return;
            }
            drop(proc_);
            let log = crate::common::file_tail(&node_dir.join("redis.log"), 10);
            failures.push(format!("port {port}:\n{log}"));
            let _ = std::fs::remove_file(node_dir.join("nodes.conf"));
        }
        panic!("a TLS node did not start:\n{}", failures.join("\n"));
    }

    fn wait_answering(&self, addr: &str) {
        assert!(
            wait_until(Duration::from_secs(10), || self
                .cli(addr, &["PING"])
                .contains("PONG")),
            "TLS node {addr} did not answer"
        );
    }

    /// Ok when every running node says `cluster_state:ok` with all slots served and
    /// knows every node, none flagged failing, and every replica's link is up.
    pub fn check(&self) -> Result<(), String> {
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        for a in self.addrs() {
            let info = self.cli(&a, &["CLUSTER", "INFO"]);
            for want in ["cluster_state:ok", "cluster_slots_ok:16384", &known] {
                if !info.lines().any(|l| l.trim() == want) {
                    return Err(format!("{a}: CLUSTER INFO lacks {want}:\n{info}"));
                }
            }
            let nodes = self.cli(&a, &["CLUSTER", "NODES"]);
            if nodes.contains("fail") || nodes.contains("handshake") {
                return Err(format!("{a}: a node is failing:\n{nodes}"));
            }
            let repl = self.cli(&a, &["INFO", "replication"]);
            if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                return Err(format!("{a}: replica link not up:\n{repl}"));
            }
        }
        Ok(())
    }

    /// Polls [`Self::check`] until it passes (true) or `timeout`.
    pub fn wait_healthy(&self, timeout: Duration) -> bool {
        wait_until(timeout, || self.check().is_ok())
    }

    fn wait_ready_or_panic(&self, what: &str) {
        if !self.wait_healthy(Duration::from_secs(30)) {
            panic!(
                "TlsCluster::{what}: not healthy: {}",
                self.check().err().unwrap_or_default()
            );
        }
    }

    /// `127.0.0.1:PORT` of every node (their TLS ports), in creation order (right after
    /// start the first three are the primaries).
    pub fn addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect()
    }

    /// The running nodes whose `INFO replication` says `role:<role>`.
    fn with_role(&self, role: &str) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.proc_.is_some())
            .map(|n| format!("127.0.0.1:{}", n.port))
            .filter(|a| self.cli(a, &["INFO", "replication"]).contains(role))
            .collect()
    }

    /// The nodes that currently say they are primaries.
    pub fn primary_addrs(&self) -> Vec<String> {
        self.with_role("role:master")
    }

    /// The nodes that currently say they are replicas.
    pub fn replica_addrs(&self) -> Vec<String> {
        self.with_role("role:slave")
    }

    /// `redis-cli` as the admin, over TLS, at `port`: stdout and stderr.
    pub fn cli_at(&self, port: &str, args: &[&str]) -> String {
        let mut conn = self.conn.clone();
        conn.extend(["-h".into(), "127.0.0.1".into(), "-p".into(), port.into()]);
        cli(&conn, args)
    }

    /// `redis-cli` as the admin, over TLS, at `addr`: its output, trimmed. Pass `-c`
    /// first to follow redirects.
    pub fn cli(&self, addr: &str, args: &[&str]) -> String {
        self.cli_at(&port_of(addr).to_string(), args)
            .trim()
            .to_string()
    }

    /// `KEYS *` on every current primary, sorted.
    pub fn all_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .primary_addrs()
            .iter()
            .flat_map(|a| {
                self.cli(a, &["KEYS", "*"])
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .filter(|k| !k.is_empty())
            .collect();
        keys.sort();
        keys
    }

    /// SIGKILLs one node (by address).
    pub fn kill_node(&mut self, addr: &str) {
        let port = port_of(addr);
        for n in &mut self.nodes {
            if n.port == port {
                n.proc_.take();
            }
        }
    }

    /// SIGKILLs every node.
    pub fn kill_all(&mut self) {
        for n in &mut self.nodes {
            n.proc_.take();
        }
    }

    /// Restarts every node on its port with its nodes.conf: the same cluster reforms,
    /// with no data and empty script caches. Waits for full health.
    pub fn restart_all(&mut self) {
        self.kill_all();
        for n in &mut self.nodes {
            n.proc_ = Some(start_server(&n.dir, &n.conf, false));
        }
        for a in self.addrs() {
            self.wait_answering(&a);
        }
        self.wait_ready_or_panic("restart_all");
    }

    /// `ACL LOG` entries of every running node (empty when no command was refused).
    pub fn acl_denials(&self) -> String {
        let mut all = String::new();
        for n in self.nodes.iter().filter(|n| n.proc_.is_some()) {
            let log = self.cli_at(&n.port.to_string(), &["ACL", "LOG"]);
            if !log.trim().is_empty() {
                all.push_str(&format!("node {}:\n{log}\n", n.port));
            }
        }
        all
    }

    /// The directory holding the nodes' files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl TlsCluster {
    /// Makes every node present `cert` (same key) from now on (`CONFIG SET
    /// tls-cert-file`; established connections keep theirs). Asked with `--insecure`:
    /// the certificate in force may be expired.
    pub fn set_server_certificate(&self, cert: &Path) {
        for n in &self.nodes {
            let mut conn = self.conn.clone();
            conn.extend(["--insecure".into(), "-p".into(), n.port.to_string()]);
            let out = cli(
                &conn,
                &[
                    "CONFIG",
                    "SET",
                    "tls-cert-file",
                    &cert.display().to_string(),
                ],
            );
            assert_eq!(out.trim(), "OK", "CONFIG SET tls-cert-file on {}", n.port);
        }
    }

    /// `ACL SETUSER args…` on every node.
    pub fn acl_setuser_everywhere(&self, args: &[&str]) {
        for a in self.addrs() {
            let mut cmd = vec!["ACL", "SETUSER"];
            cmd.extend(args);
            assert_eq!(self.cli(&a, &cmd), "OK", "ACL SETUSER {args:?} on {a}");
        }
    }
}
