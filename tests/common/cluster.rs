//! Redis Cluster: 3 primaries + 3 replicas on free loopback ports, with the faults the
//! tests inject (kill, freeze, failover, restart).

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

use super::*;

/// `cluster-node-timeout` used by [`RedisCluster::start`]. Low so that
/// failover tests are quick, high enough not to flap on a busy 2-core box.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 2000;
/// How long `RedisCluster::start` / `restart_all` wait for a healthy cluster.
pub const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Six redis-server processes forming a cluster of 3 primaries with one
/// replica each. Killed (SIGKILL) and cleaned up on drop.
pub struct RedisCluster {
    // Field order matters: nodes are killed before the directory is removed.
    nodes: Vec<RedisNode>,
    dir: TempDir,
}

impl RedisCluster {
    /// Start 6 nodes, `redis-cli --cluster create … --cluster-replicas 1`,
    /// and wait until the cluster is fully healthy (see [`Self::check`]).
    pub fn start() -> RedisCluster {
        Self::start_with_node_timeout(CLUSTER_NODE_TIMEOUT_MS)
    }

    /// As [`Self::start`] with an explicit `cluster-node-timeout` (ms).
    pub fn start_with_node_timeout(node_timeout_ms: u64) -> RedisCluster {
        let dir = short_tempdir("rld-cluster-");
        let mut cluster = RedisCluster {
            nodes: Vec::with_capacity(6),
            dir,
        };
        for i in 0..6 {
            let node = RedisNode::create(
                cluster.dir.path(),
                &format!("node{i}"),
                Some(node_timeout_ms),
            );
            cluster.nodes.push(node);
        }
        let addrs = cluster.addrs();
        let out = Command::new(redis_cli_bin())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {} --cluster create: {e}", redis_cli_bin()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !stdout.contains("All 16384 slots covered") {
            panic!(
                "redis-cli --cluster create failed ({}):\n{stdout}\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                cluster.logs_tail(20)
            );
        }
        cluster.wait_ready_or_panic("start");
        cluster
    }

    /// "127.0.0.1:PORT" of all 6 nodes, in creation order (fixed for the
    /// life of the cluster, whatever the roles).
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::addr).collect()
    }

    /// The nodes that currently say they are primaries (INFO replication
    /// `role:master`); nodes that are down or not answering are left out.
    /// Right after `start()` these are the first three of `addrs()`.
    pub fn primary_addrs(&self) -> Vec<String> {
        self.addrs_with_role("master")
    }

    /// The nodes that currently say they are replicas.
    pub fn replica_addrs(&self) -> Vec<String> {
        self.addrs_with_role("slave")
    }

    fn addrs_with_role(&self, role: &str) -> Vec<String> {
        let want = format!("role:{role}\r");
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(RedisNode::addr)
            .filter(|a| {
                redis_text(a, &["INFO", "replication"])
                    .map(|i| i.contains(&want))
                    .unwrap_or(false)
            })
            .collect()
    }

    /// Pids of running nodes, in `addrs()` order (None for a stopped node).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.nodes.iter().map(RedisNode::pid).collect()
    }

    /// SIGKILL every node by pid and wait for it to exit.
    pub fn kill_all(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
    }

    /// Restart every node (killing any still running) with its config and
    /// nodes.conf, so the same cluster reforms — with no data and an empty
    /// script cache (no persistence). Waits for full health as `start()`.
    pub fn restart_all(&mut self) {
        self.kill_all();
        for n in &mut self.nodes {
            n.relaunch();
        }
        self.wait_ready_or_panic("restart_all");
    }

    /// SIGKILL one node (by its address) and reap it.
    pub fn kill_node(&mut self, addr: &str) {
        self.node_mut(addr).kill();
    }

    /// Restart one node on its port with its nodes.conf; waits only until it
    /// answers PING (use `wait_healthy` for the cluster).
    pub fn restart_node(&mut self, addr: &str) {
        self.node_mut(addr).relaunch();
    }

    /// Send a signal to one node (e.g. SIGSTOP / SIGCONT to freeze it).
    pub fn signal_node(&self, addr: &str, sig: i32) {
        self.node(addr).signal(sig);
    }

    /// Stops one node (`SIGSTOP`) until the returned guard is dropped (`SIGCONT`), on
    /// every path out of the test, a panic included.
    pub fn freeze(&self, addr: &str) -> FrozenNode<'_> {
        self.signal_node(addr, libc::SIGSTOP);
        FrozenNode {
            cluster: self,
            addr: addr.to_string(),
        }
    }

    /// Run redis-cli against one node; see [`redis_cli`].
    pub fn cli(&self, addr: &str, args: &[&str]) -> String {
        redis_cli(addr, args)
    }

    /// `KEYS *` on every current primary, concatenated and sorted.
    pub fn all_keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        for a in self.primary_addrs() {
            let k = redis_command(&a, &["KEYS", "*"])
                .and_then(Resp::into_strings)
                .unwrap_or_else(|e| panic!("KEYS * on {a}: {e}"));
            keys.extend(k);
        }
        keys.sort();
        keys
    }

    /// Ok if the cluster is fully healthy: every node says cluster_state:ok,
    /// 16384 slots assigned and ok, 6 known nodes; every node's CLUSTER NODES
    /// shows 3 masters and 3 slaves, each slave of a distinct listed master,
    /// none flagged fail/fail?/handshake/noaddr, all links connected; every
    /// replica has master_link_status:up. Err describes the first problem.
    pub fn check(&self) -> Result<(), String> {
        for n in &self.nodes {
            let a = n.addr();
            if n.child.is_none() {
                return Err(format!("{a}: not running"));
            }
            let info = redis_text(&a, &["CLUSTER", "INFO"])
                .map_err(|e| format!("{a}: CLUSTER INFO: {e}"))?;
            for want in [
                "cluster_state:ok",
                "cluster_slots_assigned:16384",
                "cluster_slots_ok:16384",
                "cluster_known_nodes:6",
            ] {
                if !info.lines().any(|l| l.trim() == want) {
                    return Err(format!("{a}: CLUSTER INFO lacks {want}:\n{info}"));
                }
            }
            let nodes = redis_text(&a, &["CLUSTER", "NODES"])
                .map_err(|e| format!("{a}: CLUSTER NODES: {e}"))?;
            let mut masters = HashSet::new();
            let mut slave_of = Vec::new();
            let mut myself_slave = false;
            for line in nodes.lines().filter(|l| !l.trim().is_empty()) {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 8 {
                    return Err(format!("{a}: bad CLUSTER NODES line: {line}"));
                }
                let flags: Vec<&str> = f[2].split(',').collect();
                if flags
                    .iter()
                    .any(|fl| matches!(*fl, "fail" | "fail?" | "handshake" | "noaddr"))
                    || f[7] != "connected"
                {
                    return Err(format!("{a}: unhealthy node: {line}"));
                }
                if flags.contains(&"master") {
                    masters.insert(f[0].to_string());
                } else if flags.contains(&"slave") {
                    slave_of.push(f[3].to_string());
                    myself_slave |= flags.contains(&"myself");
                }
            }
            let distinct: HashSet<&String> = slave_of.iter().collect();
            if masters.len() != 3
                || slave_of.len() != 3
                || distinct.len() != 3
                || !slave_of.iter().all(|m| masters.contains(m))
            {
                return Err(format!(
                    "{a}: want 3 masters each with one replica:\n{nodes}"
                ));
            }
            if myself_slave {
                let repl = redis_text(&a, &["INFO", "replication"])
                    .map_err(|e| format!("{a}: INFO replication: {e}"))?;
                if !repl.contains("master_link_status:up") {
                    return Err(format!("{a}: replica link not up:\n{repl}"));
                }
            }
        }
        Ok(())
    }

    /// Poll [`Self::check`] every 20 ms until it passes (true) or `timeout`.
    pub fn wait_healthy(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.check().is_ok() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_ready_or_panic(&self, what: &str) {
        let t0 = Instant::now();
        if !self.wait_healthy(CLUSTER_READY_TIMEOUT) {
            let why = self.check().err().unwrap_or_default();
            panic!(
                "RedisCluster::{what}: cluster not healthy after {:?}: {why}\n{}",
                t0.elapsed(),
                self.logs_tail(15)
            );
        }
    }

    /// Last `n` lines of every node's log, for failure messages.
    pub fn logs_tail(&self, n: usize) -> String {
        self.nodes
            .iter()
            .map(|node| node.logs_tail(n))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The directory holding `node0/` … `node5/` (config, nodes.conf, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn node(&self, addr: &str) -> &RedisNode {
        self.nodes
            .iter()
            .find(|n| n.addr() == addr)
            .unwrap_or_else(|| panic!("{addr} is not a node of this cluster"))
    }

    fn node_mut(&mut self, addr: &str) -> &mut RedisNode {
        self.nodes
            .iter_mut()
            .find(|n| n.addr() == addr)
            .unwrap_or_else(|| panic!("{addr} is not a node of this cluster"))
    }
}

/// Per slot (16384 of them), the `host:port` of the primary owning it and that primary's
/// node id, read from the text of `CLUSTER NODES`; a slot no primary owns has two empty
/// strings. A migrating or importing marker (`[slot->-id]`) names no owner.
pub fn owners_by_slot(cluster_nodes: &str) -> Vec<(String, String)> {
    let mut owners = vec![(String::new(), String::new()); 16_384];
    for line in cluster_nodes.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 || !f[2].contains("master") {
            continue;
        }
        let addr = f[1].split('@').next().unwrap_or_default().to_string();
        for range in f[8..].iter().filter(|r| !r.starts_with('[')) {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
            for owner in &mut owners[a..=b] {
                *owner = (addr.clone(), f[0].to_string());
            }
        }
    }
    owners
}

/// A node stopped by [`RedisCluster::freeze`]; dropping it resumes the node.
pub struct FrozenNode<'a> {
    cluster: &'a RedisCluster,
    addr: String,
}

impl Drop for FrozenNode<'_> {
    fn drop(&mut self) {
        self.cluster.signal_node(&self.addr, libc::SIGCONT);
    }
}
