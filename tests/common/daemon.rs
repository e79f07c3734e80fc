//! The daemon under test: its config (socket inserted), start, signals, log, stop, and
//! its metrics endpoint.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

use super::*;

/// How long `Daemon::start` waits for the socket to accept connections.
pub const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Three token-bucket rules the Redis tests share: `rides_request` (a burst of 20,
/// 10 tokens/s), `slow` (5, 2 tokens/s) and `big` (50, one token per 1,000 s).
pub const BUCKET_RULES: &str = r#"
[[rule]]
name = "rides_request"
algorithm = "token_bucket"
capacity = 20
refill_rate = 10.0

[[rule]]
name = "slow"
algorithm = "token_bucket"
capacity = 5
refill_rate = 2.0

[[rule]]
name = "big"
algorithm = "token_bucket"
capacity = 50
refill_rate = 0.001
"#;

/// The reply to `GET /metrics` on the daemon's metrics listener at 127.0.0.1:`port`
/// (`[metrics] listen`), headers included; panics unless it is a 200.
pub fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// The value of the first series `name` in `body` (a scrape, headers allowed) whose
/// labels include all of `labels`, if there is one.
pub fn metric_value(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
