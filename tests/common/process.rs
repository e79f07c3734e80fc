//! Processes, ports and temp dirs: waiting for a condition, free ports, short temp
//! dirs, and spawning children that die with the test process.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

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

/// The server family the tests start, from `RATELIMITD_TEST_SERVER`: `redis` (the
/// default, also when unset or empty) or `valkey`. Anything else panics naming the value.
pub fn server_family() -> &'static str {
    match std::env::var("RATELIMITD_TEST_SERVER").as_deref() {
        Err(_) | Ok("") | Ok("redis") => "redis",
        Ok("valkey") => "valkey",
        Ok(other) => panic!("RATELIMITD_TEST_SERVER={other:?}: expected \"redis\" or \"valkey\""),
    }
}

/// The server binary every test starts (plain, cluster, TLS, sentinel with `--sentinel`):
/// `$REDIS_SERVER` if set, else `redis-server` or `valkey-server` from `PATH` by
/// [`server_family`].
pub(crate) fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| format!("{}-server", server_family()))
}

/// The command-line client the tests use (cluster creation, inspection): `$REDIS_CLI` if
/// set, else `redis-cli` or `valkey-cli` from `PATH` by [`server_family`].
pub(crate) fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| format!("{}-cli", server_family()))
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
pub(crate) fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("not a host:port address: {addr:?}"))
}

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawn `cmd` from a harness thread that lives as long as the process, with
/// `PR_SET_PDEATHSIG = SIGKILL` (Linux): the child is killed when the test
/// process exits, however it exits. (The death signal fires when the spawning
/// *thread* exits, which is why test threads must not spawn directly.)
pub fn spawn_owned(mut cmd: Command) -> io::Result<Child> {
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
pub(crate) fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill(); // kill(pid, SIGKILL)
        let _ = child.wait();
    }
}
