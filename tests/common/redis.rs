//! Redis processes other than a cluster: one `redis-server` process, and a standalone
//! server. The client that talks to them is in `redis_client.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

use super::*;

/// How long one redis-server gets to start answering.
const NODE_START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a node start is retried on fresh ports.
const NODE_START_ATTEMPTS: usize = 8;

pub(crate) struct RedisNode {
    pub(crate) port: u16,
    /// `Some` for a cluster node.
    pub(crate) cluster_port: Option<u16>,
    pub(crate) dir: PathBuf,
    pub(crate) child: Option<Child>,
    /// Set in the server's environment (e.g. `LD_PRELOAD`), at every launch.
    pub(crate) env: Vec<(String, String)>,
}

impl RedisNode {
    /// Create `<base>/<name>/`, write its config on fresh free ports and start
    /// it; retried on new ports (up to NODE_START_ATTEMPTS) if it cannot start,
    /// e.g. because a port was taken between picking and binding.
    pub(crate) fn create(base: &Path, name: &str, cluster: Option<u64>) -> RedisNode {
        Self::create_with_env(base, name, cluster, &[])
    }

    /// [`RedisNode::create`] with `env` set in the server's environment.
    pub(crate) fn create_with_env(
        base: &Path,
        name: &str,
        cluster: Option<u64>,
        env: &[(String, String)],
    ) -> RedisNode {
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
                env: env.to_vec(),
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

    pub(crate) fn config_text(&self, cluster_node_timeout_ms: Option<u64>) -> String {
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

    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
    pub(crate) fn conf_path(&self) -> PathBuf {
        self.dir.join("redis.conf")
    }
    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }
    pub(crate) fn stdio_path(&self) -> PathBuf {
        self.dir.join("stdio.log")
    }
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(crate) fn logs_tail(&self, n: usize) -> String {
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
    pub(crate) fn launch(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "node {} already running", self.addr());
        let stdio = fs::File::create(self.stdio_path()).expect("creating stdio.log");
        let mut cmd = Command::new(redis_server_bin());
        cmd.arg(self.conf_path())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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
    pub(crate) fn relaunch(&mut self) {
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

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }

    pub(crate) fn signal(&self, sig: i32) {
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

/// One plain (non-cluster) redis-server. Killed and cleaned up on drop.
pub struct RedisStandalone {
    node: RedisNode,
    dir: TempDir,
}

impl RedisStandalone {
    pub fn start() -> Self {
        Self::start_with_env(&[])
    }

    /// A server with `env` set in its environment (e.g. `LD_PRELOAD` of a clock shim).
    pub fn start_with_env(env: &[(String, String)]) -> Self {
        let dir = short_tempdir("rld-redis-");
        let node = RedisNode::create_with_env(dir.path(), "standalone", None, env);
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

    /// EVALSHA calls it has served so far ([`evalsha_calls`]).
    pub fn script_calls(&self) -> u64 {
        evalsha_calls(&self.addr())
    }

    pub fn logs_tail(&self, n: usize) -> String {
        self.node.logs_tail(n)
    }
}
