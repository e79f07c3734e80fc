#![allow(dead_code)]
//! Integration-test harness shared by the files in `tests/` (`mod common;`).
//!
//! Blocking std code only. Everything listens on 127.0.0.1 or on Unix sockets
//! in a `TempDir`; ports are picked free at run time. Every process started
//! here is owned by a value whose `Drop` kills it by pid (SIGKILL) and reaps
//! it, so a panicking test leaves nothing behind. On Linux each child also
//! gets `PR_SET_PDEATHSIG = SIGKILL` tied to a harness thread that lives as
//! long as the test process, so even values that are never dropped (a cluster
//! in a `static`) or a test binary killed from outside leave no servers behind.
//!
//! Binaries: `redis-server` and `redis-cli` from `PATH`, overridable with the
//! `REDIS_SERVER` / `REDIS_CLI` environment variables.

use std::collections::HashSet;
use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// `cluster-node-timeout` used by [`RedisCluster::start`]. Low so that
/// failover tests are quick, high enough not to flap on a busy 2-core box.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 2000;
/// How long `RedisCluster::start` / `restart_all` wait for a healthy cluster.
pub const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one redis-server gets to start answering.
const NODE_START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a node start is retried on fresh ports.
const NODE_START_ATTEMPTS: usize = 8;
/// How long `Daemon::start` waits for the socket to accept connections.
pub const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(10);
/// Read/write timeout of a [`Client`].
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

/// Poll `f` every 10 ms until it returns true (-> true) or `timeout` passes
/// (-> false). `f` is always called at least once, and once more at the end.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// A fresh temporary directory. Kept short (Unix socket paths are limited to
/// 108 bytes): `$TMPDIR` if its path is short, else `/tmp`.
pub fn short_tempdir(prefix: &str) -> TempDir {
    let base = std::env::temp_dir();
    let base = if base.as_os_str().len() <= 60 {
        base
    } else {
        PathBuf::from("/tmp")
    };
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&base)
        .unwrap_or_else(|e| panic!("creating a temp dir in {}: {e}", base.display()))
}

/// The last `n` lines of a file (lossy UTF-8), or a note that it is unreadable.
pub fn file_tail(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago: bind port 0, read the
/// port, drop the listener. Never hands out the same port twice in one test
/// process (parallel tests would otherwise race for it); the remaining race
/// with other processes is handled by retrying node starts.
pub fn free_port() -> u16 {
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(|| Mutex::new(HashSet::new()));
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        drop(listener);
        if handed_out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

/// True if nothing accepts TCP connections on 127.0.0.1:`port`.
pub fn port_refuses(port: u16) -> bool {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err()
}

/// True if a process with this pid exists (a zombie counts as existing).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence/permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// `127.0.0.1:PORT` -> PORT (panics on anything else).
fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("not a host:port address: {addr:?}"))
}

// ---------------------------------------------------------------------------
// Spawning children that die with the test process
// ---------------------------------------------------------------------------

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawn `cmd` from a harness thread that lives as long as the process, with
/// `PR_SET_PDEATHSIG = SIGKILL` (Linux): the child is killed when the test
/// process exits, however it exits. (The death signal fires when the spawning
/// *thread* exits, which is why test threads must not spawn directly.)
fn spawn_owned(mut cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("harness-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the harness spawner thread");
        tx
    });
    set_death_signal(&mut cmd);
    let (tx, rx) = mpsc::channel();
    spawner
        .send((cmd, tx))
        .expect("harness spawner thread is gone");
    rx.recv().expect("harness spawner thread is gone")
}

#[cfg(target_os = "linux")]
fn set_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe system calls (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_death_signal(_cmd: &mut Command) {}

/// SIGKILL a child by pid (if it has not been reaped) and reap it.
fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill(); // kill(pid, SIGKILL)
        let _ = child.wait();
    }
}

// ---------------------------------------------------------------------------
// A minimal RESP2 client (faster than spawning redis-cli for polling)
// ---------------------------------------------------------------------------

/// A RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// Simple/bulk string or integer as text; an error reply becomes `Err`;
    /// nil becomes "". Arrays are rejected.
    pub fn into_text(self) -> io::Result<String> {
        match self {
            Resp::Simple(s) => Ok(s),
            Resp::Int(i) => Ok(i.to_string()),
            Resp::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
            Resp::Bulk(None) | Resp::Array(None) => Ok(String::new()),
            Resp::Error(e) => Err(io::Error::other(format!("redis error: {e}"))),
            Resp::Array(Some(_)) => Err(io::Error::other("unexpected array reply")),
        }
    }

    /// An array of strings (e.g. the reply to KEYS).
    pub fn into_strings(self) -> io::Result<Vec<String>> {
        match self {
            Resp::Array(Some(items)) => items.into_iter().map(Resp::into_text).collect(),
            Resp::Array(None) => Ok(Vec::new()),
            Resp::Error(e) => Err(io::Error::other(format!("redis error: {e}"))),
            other => Err(io::Error::other(format!(
                "expected an array, got {other:?}"
            ))),
        }
    }
}

/// Send one command to `addr` ("127.0.0.1:PORT") on a fresh connection and
/// read the reply. Connect timeout 1 s, read/write timeout 3 s.
pub fn redis_command(addr: &str, args: &[&str]) -> io::Result<Resp> {
    let sa: SocketAddr = addr
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
    let stream = TcpStream::connect_timeout(&sa, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    stream.set_write_timeout(Some(Duration::from_secs(3)))?;
    stream.set_nodelay(true)?;
    let mut buf = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        buf.extend_from_slice(a.as_bytes());
        buf.extend_from_slice(b"\r\n");
    }
    (&stream).write_all(&buf)?;
    read_resp(&mut BufReader::new(&stream))
}

/// `redis_command(..)?.into_text()`.
pub fn redis_text(addr: &str, args: &[&str]) -> io::Result<String> {
    redis_command(addr, args)?.into_text()
}

fn read_resp(r: &mut impl BufRead) -> io::Result<Resp> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.len() < 3 || !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "truncated RESP reply",
        ));
    }
    line.truncate(line.len() - 2);
    let rest = String::from_utf8_lossy(&line[1..]).into_owned();
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("bad {what}"));
    match line[0] {
        b'+' => Ok(Resp::Simple(rest)),
        b'-' => Ok(Resp::Error(rest)),
        b':' => rest.parse().map(Resp::Int).map_err(|_| bad("RESP integer")),
        b'$' => {
            let n: i64 = rest.parse().map_err(|_| bad("RESP bulk length"))?;
            if n < 0 {
                return Ok(Resp::Bulk(None));
            }
            let mut data = vec![0u8; n as usize + 2];
            r.read_exact(&mut data)?;
            data.truncate(n as usize);
            Ok(Resp::Bulk(Some(data)))
        }
        b'*' => {
            let n: i64 = rest.parse().map_err(|_| bad("RESP array length"))?;
            if n < 0 {
                return Ok(Resp::Array(None));
            }
            let items = (0..n).map(|_| read_resp(r)).collect::<io::Result<_>>()?;
            Ok(Resp::Array(Some(items)))
        }
        _ => Err(bad("RESP type byte")),
    }
}

/// Run `redis-cli -h 127.0.0.1 -p PORT args...` and return its stdout, trimmed.
/// (Errors from redis-cli itself, e.g. "connection refused", go to stderr and
/// are not returned.) Pass `-c` as the first arg to follow cluster redirects.
pub fn redis_cli(addr: &str, args: &[&str]) -> String {
    let port = port_of(addr).to_string();
    let out = Command::new(redis_cli_bin())
        .args(["-h", "127.0.0.1", "-p", &port])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {} (is it installed?): {e}", redis_cli_bin()));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

// ---------------------------------------------------------------------------
// One redis-server process
// ---------------------------------------------------------------------------

struct RedisNode {
    port: u16,
    /// `Some` for a cluster node.
    cluster_port: Option<u16>,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisNode {
    /// Create `<base>/<name>/`, write its config on fresh free ports and start
    /// it; retried on new ports (up to NODE_START_ATTEMPTS) if it cannot start,
    /// e.g. because a port was taken between picking and binding.
    fn create(base: &Path, name: &str, cluster: Option<u64>) -> RedisNode {
        let dir = base.join(name);
        let mut errors = Vec::new();
        for _ in 0..NODE_START_ATTEMPTS {
            if dir.exists() {
                fs::remove_dir_all(&dir).expect("removing a failed node dir");
            }
            fs::create_dir_all(&dir).expect("creating a node dir");
            let mut node = RedisNode {
                port: free_port(),
                cluster_port: cluster.map(|_| free_port()),
                dir: dir.clone(),
                child: None,
            };
            fs::write(node.conf_path(), node.config_text(cluster)).expect("writing redis.conf");
            match node.launch() {
                Ok(()) => return node,
                Err(e) => errors.push(e),
            }
        }
        panic!(
            "could not start redis-server {name} after {NODE_START_ATTEMPTS} attempts:\n{}",
            errors.join("\n---\n")
        );
    }

    fn config_text(&self, cluster_node_timeout_ms: Option<u64>) -> String {
        let dir = self.dir.display();
        let mut c = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             protected-mode no\n\
             daemonize no\n\
             dir {dir}\n\
             logfile {dir}/redis.log\n\
             appendonly no\n\
             save \"\"\n\
             repl-diskless-sync yes\n\
             repl-diskless-sync-delay 0\n\
             enable-debug-command yes\n",
            port = self.port,
        );
        if let (Some(cport), Some(timeout)) = (self.cluster_port, cluster_node_timeout_ms) {
            c.push_str(&format!(
                "cluster-enabled yes\n\
                 cluster-port {cport}\n\
                 cluster-config-file {dir}/nodes.conf\n\
                 cluster-node-timeout {timeout}\n"
            ));
        }
        c
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
    fn conf_path(&self) -> PathBuf {
        self.dir.join("redis.conf")
    }
    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }
    fn stdio_path(&self) -> PathBuf {
        self.dir.join("stdio.log")
    }
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn logs_tail(&self, n: usize) -> String {
        format!(
            "== {} ({}) redis.log:\n{}\n== stdout/stderr:\n{}",
            self.addr(),
            self.dir.display(),
            file_tail(&self.log_path(), n),
            file_tail(&self.stdio_path(), n)
        )
    }

    /// Start redis-server with the existing config file and wait until it
    /// answers on its port *as this process* (INFO's process_id matches).
    fn launch(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "node {} already running", self.addr());
        let stdio = fs::File::create(self.stdio_path()).expect("creating stdio.log");
        let mut cmd = Command::new(redis_server_bin());
        cmd.arg(self.conf_path())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdio.try_clone().expect("dup stdio.log"))
            .stderr(stdio);
        let child = spawn_owned(cmd)
            .unwrap_or_else(|e| panic!("spawning {} (is it installed?): {e}", redis_server_bin()));
        let pid = child.id();
        self.child = Some(child);
        let want = format!("process_id:{pid}\r");
        let deadline = Instant::now() + NODE_START_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("child");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(format!(
                    "redis-server on port {} exited with {status}\n{}",
                    self.port,
                    self.logs_tail(20)
                ));
            }
            if let Ok(info) = redis_text(&self.addr(), &["INFO", "server"]) {
                if info.contains(&want) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "redis-server on port {} did not answer within {NODE_START_TIMEOUT:?}\n{}",
                    self.port,
                    self.logs_tail(20)
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Restart on the same ports (other nodes and the daemon know them);
    /// retried for a few seconds in case the port is briefly unavailable.
    fn relaunch(&mut self) {
        self.kill();
        let deadline = Instant::now() + NODE_START_TIMEOUT;
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => {
                    panic!("could not restart redis-server {}:\n{e}", self.addr())
                }
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: plain kill(2) on our own, not yet reaped, child.
            unsafe {
                libc::kill(pid as libc::pid_t, sig);
            }
        }
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------
// Redis Cluster: 3 primaries + 3 replicas
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Standalone Redis
// ---------------------------------------------------------------------------

/// One plain (non-cluster) redis-server. Killed and cleaned up on drop.
pub struct RedisStandalone {
    node: RedisNode,
    dir: TempDir,
}

impl RedisStandalone {
    pub fn start() -> Self {
        let dir = short_tempdir("rld-redis-");
        let node = RedisNode::create(dir.path(), "standalone", None);
        RedisStandalone { node, dir }
    }

    /// "127.0.0.1:PORT".
    pub fn addr(&self) -> String {
        self.node.addr()
    }

    pub fn port(&self) -> u16 {
        self.node.port
    }

    /// Pid while running.
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// Run redis-cli against it; returns trimmed stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(&self.addr(), args)
    }

    /// SIGKILL by pid and reap.
    pub fn kill(&mut self) {
        self.node.kill();
    }

    /// Restart on the same port (killing it first if running); empty data.
    pub fn restart(&mut self) {
        self.node.relaunch();
    }

    /// Send a signal (e.g. SIGSTOP / SIGCONT).
    pub fn signal(&self, sig: i32) {
        self.node.signal(sig);
    }

    pub fn logs_tail(&self, n: usize) -> String {
        self.node.logs_tail(n)
    }
}

// ---------------------------------------------------------------------------
// The daemon under test
// ---------------------------------------------------------------------------

/// `config` with `socket = "<socket>"` inserted as the first line under its
/// `[server]` header, or with a `[server]` table prepended if it has none.
pub fn config_with_socket(config: &str, socket: &Path) -> String {
    let has_socket_key = config.lines().any(|l| {
        let l = l.trim_start();
        l.strip_prefix("socket")
            .is_some_and(|rest| rest.trim_start().starts_with('='))
    });
    assert!(
        !has_socket_key,
        "the test config must not set server.socket; the harness chooses it:\n{config}"
    );
    let line = format!("socket = {}", toml_string(&socket.to_string_lossy()));
    let is_server_header = |l: &str| {
        let l = l.split('#').next().unwrap_or("").trim();
        l.starts_with('[')
            && !l.starts_with("[[")
            && l.ends_with(']')
            && l[1..l.len() - 1].trim() == "server"
    };
    let mut out = String::with_capacity(config.len() + line.len() + 16);
    let mut inserted = false;
    for l in config.split_inclusive('\n') {
        out.push_str(l);
        if !inserted && is_server_header(l) {
            if !l.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&line);
            out.push('\n');
            inserted = true;
        }
    }
    if inserted {
        out
    } else {
        format!("[server]\n{line}\n\n{config}")
    }
}

/// A TOML array of strings, e.g. for `nodes = {}` from `cluster.addrs()`:
/// `["127.0.0.1:1", "127.0.0.1:2"]`.
pub fn toml_str_array<S: AsRef<str>>(items: &[S]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| toml_string(s.as_ref())).collect();
    format!("[{}]", quoted.join(", "))
}

/// A TOML basic string.
pub fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The path of the daemon binary built by cargo for these tests.
pub fn daemon_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ratelimitd"))
}

/// A running `ratelimitd --config <tmp>/ratelimitd.toml`, listening on
/// `socket`. Killed (SIGKILL) on drop if still running; if the test is
/// panicking, the daemon's log tail is printed to stderr first.
pub struct Daemon {
    pub socket: PathBuf,
    child: Child,
    status: Option<ExitStatus>,
    print_log_on_panic: bool,
    // Last: removed after the process is gone.
    dir: TempDir,
}

impl Daemon {
    /// Write `config` (without `server.socket`; see [`config_with_socket`]) to
    /// `<tmp>/ratelimitd.toml`, spawn the daemon with `--config <file>`,
    /// RUST_LOG=info unless set, output to `<tmp>/daemon.log`, and wait until
    /// the socket accepts a connection. Panics with the log tail on failure.
    pub fn start(config: &str) -> Daemon {
        Self::start_with(&daemon_bin(), &[], config)
    }

    /// As [`Self::start`] with another program (same `--config <file>`
    /// interface) and extra environment variables.
    pub fn start_with(program: &Path, env: &[(&str, &str)], config: &str) -> Daemon {
        Self::start_wrapped(&[], program, env, config)
    }

    /// As [`Self::start_with`], with the daemon run through `wrapper` (a program and
    /// its arguments): `wrapper… <program> --config <file>`, e.g.
    /// `["systemd-socket-activate", "-l", "{socket}"]`. `{socket}` in the wrapper's
    /// arguments is replaced by the socket path; `env` goes to the wrapper.
    pub fn start_wrapped(
        wrapper: &[&str],
        program: &Path,
        env: &[(&str, &str)],
        config: &str,
    ) -> Daemon {
        let mut d = Self::spawn_wrapped(wrapper, program, env, config);
        let deadline = Instant::now() + DAEMON_START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = d.child.try_wait() {
                d.status = Some(status);
                d.print_log_on_panic = false;
                panic!(
                    "daemon exited with {status} before accepting connections on {}\n\
                     config:\n{}\n--- daemon.log (tail):\n{}",
                    d.socket.display(),
                    fs::read_to_string(d.config_path()).unwrap_or_default(),
                    d.log_tail(40)
                );
            }
            if UnixStream::connect(&d.socket).is_ok() {
                return d;
            }
            if Instant::now() >= deadline {
                d.print_log_on_panic = false;
                panic!(
                    "daemon did not accept connections on {} within {DAEMON_START_TIMEOUT:?}\n\
                     --- daemon.log (tail):\n{}",
                    d.socket.display(),
                    d.log_tail(40)
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Run the daemon with `config` and expect it to exit on its own within
    /// `timeout` (e.g. a bad config). Returns the exit status and the log.
    pub fn run_to_exit(config: &str, timeout: Duration) -> (ExitStatus, String) {
        Self::run_to_exit_with(&daemon_bin(), &[], config, timeout)
    }

    /// As [`Self::run_to_exit`] with another program and extra environment.
    pub fn run_to_exit_with(
        program: &Path,
        env: &[(&str, &str)],
        config: &str,
        timeout: Duration,
    ) -> (ExitStatus, String) {
        let mut d = Self::spawn(program, env, config);
        match d.wait_exit(timeout) {
            Some(status) => (status, d.log()),
            None => {
                d.print_log_on_panic = false;
                panic!(
                    "daemon still running after {timeout:?}, expected it to exit\n\
                     --- daemon.log (tail):\n{}",
                    d.log_tail(40)
                )
            }
        }
    }

    fn spawn(program: &Path, env: &[(&str, &str)], config: &str) -> Daemon {
        Self::spawn_wrapped(&[], program, env, config)
    }

    fn spawn_wrapped(
        wrapper: &[&str],
        program: &Path,
        env: &[(&str, &str)],
        config: &str,
    ) -> Daemon {
        let dir = short_tempdir("rld-daemon-");
        let socket = dir.path().join("ratelimitd.sock");
        let config_path = dir.path().join("ratelimitd.toml");
        fs::write(&config_path, config_with_socket(config, &socket)).expect("writing config");
        let log = fs::File::create(dir.path().join("daemon.log")).expect("creating daemon.log");
        let mut cmd = match wrapper.split_first() {
            None => Command::new(program),
            Some((wrapper, args)) => {
                let mut cmd = Command::new(wrapper);
                let socket = socket.to_string_lossy();
                cmd.args(args.iter().map(|a| a.replace("{socket}", &socket)))
                    .arg(program);
                cmd
            }
        };
        cmd.arg("--config")
            .arg(&config_path)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup daemon.log"))
            .stderr(log);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child =
            spawn_owned(cmd).unwrap_or_else(|e| panic!("spawning {}: {e}", program.display()));
        Daemon {
            socket,
            child,
            status: None,
            print_log_on_panic: true,
            dir,
        }
    }

    /// `<tmp>/ratelimitd.toml`.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("ratelimitd.toml")
    }

    /// The daemon's temp directory (config, log, socket).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Replace the config file (socket line inserted as at start), atomically
    /// (write + rename). Follow with `signal(libc::SIGHUP)` to reload.
    pub fn write_config(&self, config: &str) {
        let tmp = self.dir.path().join("ratelimitd.toml.new");
        fs::write(&tmp, config_with_socket(config, &self.socket)).expect("writing config");
        fs::rename(&tmp, self.config_path()).expect("renaming config");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Open a new client connection to the daemon's socket.
    pub fn connect(&self) -> Client {
        Client::connect(&self.socket)
    }

    /// `kill(pid, sig)`; a no-op once the exit has been collected.
    pub fn signal(&self, sig: i32) {
        if self.status.is_none() {
            // SAFETY: plain kill(2) on our own, not yet reaped, child.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, sig);
            }
        }
    }

    /// Wait up to `timeout` for the process to exit; its status, or None.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.status.is_some() {
                return self.status;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                self.status = Some(status);
                return self.status;
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Contents of daemon.log (stdout + stderr).
    pub fn log(&self) -> String {
        fs::read(self.dir.path().join("daemon.log"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `n` lines of daemon.log.
    pub fn log_tail(&self, n: usize) -> String {
        file_tail(&self.dir.path().join("daemon.log"), n)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.status.is_none() {
            kill_and_reap(&mut self.child);
        }
        if self.print_log_on_panic && thread::panicking() {
            eprintln!(
                "--- daemon.log of pid {} (tail) ---\n{}\n--- end of daemon.log ---",
                self.child.id(),
                self.log_tail(60)
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Line-protocol client
// ---------------------------------------------------------------------------

/// A connection to the daemon: std `UnixStream` + `BufReader`, 5 s read and
/// write timeouts. Reading methods panic on timeout or I/O error.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Client {
        let stream = UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", path.display()));
        stream
            .set_read_timeout(Some(CLIENT_TIMEOUT))
            .expect("set_read_timeout");
        stream
            .set_write_timeout(Some(CLIENT_TIMEOUT))
            .expect("set_write_timeout");
        let writer = stream.try_clone().expect("cloning UnixStream");
        Client {
            reader: BufReader::new(stream),
            writer,
        }
    }

    /// Write `line` + "\n", read one reply line (without "\n").
    pub fn request(&mut self, line: &str) -> String {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        self.send_raw(&buf);
        self.read_line()
    }

    /// Write bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("writing {} bytes to the daemon: {e}", bytes.len()));
    }

    /// One reply line without its "\n"; "" on EOF. Panics on timeout.
    pub fn read_line(&mut self) -> String {
        self.try_read_line()
            .unwrap_or_else(|e| panic!("reading a reply line from the daemon: {e}"))
    }

    /// As [`Self::read_line`] but returns the I/O error (e.g. timeout).
    pub fn try_read_line(&mut self) -> io::Result<String> {
        read_reply_line(&mut self.reader)
    }

    /// Write all `lines` (each + "\n") in one write, then read
    /// `lines.len()` replies. The write runs on a helper thread so a large
    /// pipeline cannot deadlock against the daemon's output buffer.
    pub fn pipeline(&mut self, lines: &[String]) -> Vec<String> {
        let mut buf = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for l in lines {
            buf.extend_from_slice(l.as_bytes());
            buf.push(b'\n');
        }
        let writer = &self.writer;
        let reader = &mut self.reader;
        thread::scope(|s| {
            let w = s.spawn(move || {
                let mut w: &UnixStream = writer;
                w.write_all(&buf)
            });
            let replies: Vec<String> = (0..lines.len())
                .map(|i| {
                    read_reply_line(reader).unwrap_or_else(|e| {
                        panic!("reading pipelined reply {i} of {}: {e}", lines.len())
                    })
                })
                .collect();
            w.join()
                .expect("pipeline writer thread panicked")
                .unwrap_or_else(|e| panic!("writing the pipeline: {e}"));
            replies
        })
    }

    /// Change the read timeout (default 5 s).
    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.reader
            .get_ref()
            .set_read_timeout(Some(timeout))
            .expect("set_read_timeout");
    }

    /// Half-close: shut down the writing side (the daemon sees EOF).
    pub fn shutdown_write(&mut self) {
        let _ = self.writer.shutdown(std::net::Shutdown::Write);
    }
}

fn read_reply_line(reader: &mut BufReader<UnixStream>) -> io::Result<String> {
    let mut buf = Vec::new();
    reader.read_until(b'\n', &mut buf)?;
    if buf.last() == Some(&b'\n') {
        buf.pop();
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

// ---------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------

/// A parsed CHECK reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub verdict: String,
    pub limit: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    pub wait_ms: u64,
    pub source: String,
}

impl Reply {
    pub fn allowed(&self) -> bool {
        self.verdict == "ALLOW"
    }
}

/// The sources a CHECK reply may name (CONTRACT §1).
pub const SOURCES: [&str; 5] = ["redis", "cache", "local", "fail_open", "fail_closed"];

/// Parse `ALLOW|DENY <limit> <remaining> <reset_ms> <wait_ms> <source> [extra…]`
/// (single spaces, as the daemon writes them; extra fields ignored).
pub fn try_parse_reply(line: &str) -> Option<Reply> {
    let f: Vec<&str> = line.split(' ').collect();
    if f.len() < 6 || !matches!(f[0], "ALLOW" | "DENY") || !SOURCES.contains(&f[5]) {
        return None;
    }
    let num = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    Some(Reply {
        verdict: f[0].to_string(),
        limit: num(f[1])?,
        remaining: num(f[2])?,
        reset_ms: num(f[3])?,
        wait_ms: num(f[4])?,
        source: f[5].to_string(),
    })
}

/// As [`try_parse_reply`], panicking with the line if it is not a CHECK reply.
pub fn parse_reply(line: &str) -> Reply {
    try_parse_reply(line).unwrap_or_else(|| {
        panic!("not a CHECK reply (`ALLOW|DENY n n n n source [extra...]`): {line:?}")
    })
}
