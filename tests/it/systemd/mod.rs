//! systemd integration, without systemd as PID 1: the unit files pass
//! `systemd-analyze verify` with no output at all; socket activation through Debian's
//! `systemd-socket-activate`; the `sd_notify` messages (READY, STATUS, WATCHDOG,
//! RELOADING, STOPPING) received on a datagram socket of the test's own set as
//! `NOTIFY_SOCKET`; SIGHUP reload on an open connection. Real binary, real sockets.
//!
//! Here: a `NOTIFY_SOCKET` of the test's own; the tests of the unit files are in
//! `units.rs`, socket activation in `activation.rs`, the `sd_notify` messages and the
//! reload in `notify.rs`.

mod activation;
mod notify;
mod units;

use crate::common;

use common::*;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

const LOCAL: &str = r#"
[redis]
mode = "none"

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 10
refill_rate = 0.001
"#;

/// The directory holding the unit files shipped by the package.
fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd")
}

/// A tool the tests need; tests/run.sh installs Debian's `systemd` package if missing.
fn tool(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/bin", "/usr/sbin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} not found: install Debian's systemd package (tests/run.sh does)");
}

// ---------------------------------------------------------------------------
// A NOTIFY_SOCKET of the test's own
// ---------------------------------------------------------------------------

/// A bound `AF_UNIX` datagram socket collecting `sd_notify` messages from a reader
/// thread, which stops when this is dropped.
struct NotifySocket {
    path: PathBuf,
    rx: mpsc::Receiver<String>,
    /// Every message received so far, in order.
    seen: Vec<String>,
    stop: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = short_tempdir("rld-notify-");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("binding the notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while !stopped.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if tx.send(msg).is_err() {
                        return;
                    }
                }
            }
        });
        NotifySocket {
            path,
            rx,
            seen: Vec::new(),
            stop,
            _dir: dir,
        }
    }

    fn path(&self) -> &str {
        self.path.to_str().expect("utf-8 temp path")
    }

    /// The next message (after those already returned) for which `pred` holds, within
    /// `timeout`; messages skipped on the way stay in `seen`.
    fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.rx.recv_timeout(left) {
                Ok(msg) => {
                    self.seen.push(msg.clone());
                    if pred(&msg) {
                        return Some(msg);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// As [`Self::wait_for`], panicking with every message seen and the daemon's log.
    fn expect(&mut self, d: &Daemon, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.wait_for(Duration::from_secs(10), pred)
            .unwrap_or_else(|| {
                panic!(
                    "no sd_notify message {what}; received: {:#?}\n--- daemon.log:\n{}",
                    self.seen,
                    d.log_tail(40)
                )
            })
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The `KEY=value` lines of a notification.
fn has_line(msg: &str, line: &str) -> bool {
    msg.lines().any(|l| l == line)
}

fn status_of(msg: &str) -> Option<&str> {
    msg.lines().find_map(|l| l.strip_prefix("STATUS="))
}
