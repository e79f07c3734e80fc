//! systemd integration: socket activation, `sd_notify` readiness, status, watchdog,
//! reload and stop notifications (`systemd/ratelimitd.service`, `systemd/ratelimitd.socket`).
//!
//! Everything here is a no-op when the daemon does not run under systemd: without
//! `LISTEN_FDS` the daemon binds `server.socket` itself, without `NOTIFY_SOCKET` no
//! notification is sent, without `WATCHDOG_USEC` no watchdog runs.
//!
//! * **Socket activation** ([`activated_listener`]): systemd (or
//!   `systemd-socket-activate`) passes one listening Unix stream socket as fd 3. The
//!   daemon serves it instead of binding `server.socket`, ignores `server.socket_mode`
//!   (the socket unit's `SocketMode=`/`SocketGroup=` apply), and does **not** remove the
//!   socket file on exit: systemd owns it and keeps listening while the service restarts.
//! * **Notifications** ([`notify_ready`], [`notify_reloading`], [`notify_stopping`],
//!   [`notify_status`]): `READY=1` once Redis answered (scripts loaded) or the local
//!   fallback is active and the socket is served; `RELOADING=1` with `MONOTONIC_USEC=`
//!   then `READY=1` around a SIGHUP reload; `STOPPING=1` when shutdown begins; `STATUS=`
//!   lines saying what serves and whether Redis is connected.
//! * **Watchdog** ([`supervise`]): `WATCHDOG=1` every half `WATCHDOG_USEC`, sent by a task
//!   on the serving tokio runtime, so a runtime whose workers are all wedged stops
//!   pinging and systemd restarts it.

use crate::config::RedisMode;
use crate::log_every::LogEvery;
use crate::store::health::Circuit;
use sd_notify::NotifyState;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Why the sockets passed by systemd cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    /// `LISTEN_FDS`/`LISTEN_PID` are malformed.
    #[error("socket activation: {0}")]
    Env(std::io::Error),
    /// More than one socket was passed (the socket unit must have one `ListenStream=`).
    #[error("socket activation: systemd passed {0} sockets; ratelimitd.socket must have exactly one ListenStream= (a Unix socket path)")]
    TooMany(usize),
    /// The passed descriptor is not a listening Unix stream socket.
    #[error("socket activation: fd {fd} is not a listening Unix stream socket ({why}); use ListenStream=/path in the socket unit")]
    NotUnixStream {
        /// The descriptor.
        fd: RawFd,
        /// What is wrong with it.
        why: String,
    },
    /// The descriptor could not be handed to tokio.
    #[error("socket activation: fd {fd}: {source}")]
    Io {
        /// The descriptor.
        fd: RawFd,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// The listening socket passed by systemd (`LISTEN_FDS=1`, `LISTEN_PID` = this process)
/// and its path, or `None` when the daemon was not socket-activated.
///
/// Must run inside the tokio runtime (the listener is registered with it).
///
/// # Errors
/// Malformed activation variables, more than one socket, or a descriptor that is not a
/// listening Unix stream socket: the daemon must not silently bind another socket then.
pub fn activated_listener(
) -> Result<Option<(tokio::net::UnixListener, Option<PathBuf>)>, ActivationError> {
    let fds: Vec<RawFd> = sd_notify::listen_fds()
        .map_err(ActivationError::Env)?
        .collect();
    let fd = match fds.as_slice() {
        [] => return Ok(None),
        [fd] => *fd,
        more => return Err(ActivationError::TooMany(more.len())),
    };
    check_listening_stream(fd)?;
    // SAFETY: systemd passed `fd` to this process (LISTEN_PID matched) for it to own; it
    // is taken exactly once, here.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let std_listener = std::os::unix::net::UnixListener::from(owned);
    let io_err = |source| ActivationError::Io { fd, source };
    let path = std_listener
        .local_addr()
        .map_err(|e| ActivationError::NotUnixStream {
            fd,
            why: e.to_string(),
        })?
        .as_pathname()
        .map(PathBuf::from);
    std_listener.set_nonblocking(true).map_err(io_err)?;
    let listener = tokio::net::UnixListener::from_std(std_listener).map_err(io_err)?;
    Ok(Some((listener, path)))
}

/// Checks with `getsockopt` that `fd` is a Unix stream socket in the listening state.
fn check_listening_stream(fd: RawFd) -> Result<(), ActivationError> {
    let get = |opt: libc::c_int| -> Result<libc::c_int, ActivationError> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `value`; a bad fd is an error.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc == 0 {
            Ok(value)
        } else {
            Err(ActivationError::NotUnixStream {
                fd,
                why: std::io::Error::last_os_error().to_string(),
            })
        }
    };
    let not = |why: &str| ActivationError::NotUnixStream {
        fd,
        why: why.to_owned(),
    };
    if get(libc::SO_DOMAIN)? != libc::AF_UNIX {
        return Err(not("not AF_UNIX"));
    }
    if get(libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err(not("not SOCK_STREAM"));
    }
    if get(libc::SO_ACCEPTCONN)? == 0 {
        return Err(not("not listening"));
    }
    Ok(())
}

/// Sends `states` to the service manager if `NOTIFY_SOCKET` is set. A failure is logged
/// (once as a warning, then at debug level): notifications never stop the daemon.
fn send(states: &[NotifyState]) {
    static WARNED: OnceLock<LogEvery> = OnceLock::new();
    if let Err(e) = sd_notify::notify(states) {
        let once = WARNED.get_or_init(|| LogEvery::new(Duration::MAX));
        if once.admit().is_some() {
            tracing::warn!(error = %e, "cannot notify systemd (NOTIFY_SOCKET)");
        } else {
            tracing::debug!(error = %e, "sd_notify failed");
        }
    }
}

/// True when a service manager listens for notifications (`NOTIFY_SOCKET` is set).
pub fn notify_enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// `STATUS=<status>`: one line shown by `systemctl status`.
pub fn notify_status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// `READY=1` with `STATUS=<status>`: start-up (or a reload) is complete and requests are
/// served.
pub fn notify_ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// `RELOADING=1` with `MONOTONIC_USEC=` (as `sd_notify(3)` asks) and a status line; must
/// be followed by [`notify_ready`] when the reload is over, whatever its outcome.
pub fn notify_reloading() {
    let mut states = vec![
        NotifyState::Reloading,
        NotifyState::Status("reloading the configuration"),
    ];
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    send(&states);
}

/// `STOPPING=1`: shutdown has begun.
pub fn notify_stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: answering in-flight requests"),
    ]);
}

/// The watchdog interval systemd asked for (`WATCHDOG_USEC`, honouring `WATCHDOG_PID`),
/// or `None` when there is no watchdog.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|d| !d.is_zero())
}

/// What the `STATUS=` line reports: how the daemon serves and whether Redis answers.
#[derive(Debug)]
pub struct Status {
    mode: RedisMode,
    socket: String,
    circuit: Arc<Circuit>,
    rules: AtomicUsize,
    /// The last reload failure, shown until the next successful reload.
    reload_error: Mutex<Option<String>>,
}

impl Status {
    /// Status for a daemon in Redis `mode` with `rules` rules, serving `socket` (a path,
    /// marked socket-activated when `activated`), Redis state read from `circuit`.
    pub fn new(
        mode: RedisMode,
        socket: Option<&std::path::Path>,
        activated: bool,
        rules: usize,
        circuit: Arc<Circuit>,
    ) -> Self {
        let mut socket = socket.map_or_else(
            || "(unnamed socket)".to_owned(),
            |p| p.display().to_string(),
        );
        if activated {
            socket.push_str(" (socket-activated)");
        }
        Status {
            mode,
            socket,
            circuit,
            rules: AtomicUsize::new(rules),
            reload_error: Mutex::new(None),
        }
    }

    /// Records the outcome of a reload: the rule count now in force, and the error of a
    /// rejected file (`None` after a successful reload).
    pub fn reloaded(&self, rules: usize, error: Option<String>) {
        self.rules.store(rules, Ordering::Relaxed);
        if let Ok(mut e) = self.reload_error.lock() {
            *e = error;
        }
    }

    /// The status line, e.g. `serving 6 rules on /run/ratelimitd/ratelimitd.sock; redis
    /// cluster: connected`.
    pub fn line(&self) -> String {
        let redis = match self.mode {
            RedisMode::None => "redis none: local buckets only",
            RedisMode::Cluster if self.circuit.is_open() => {
                "redis cluster: unreachable, deciding locally per on_redis_failure"
            }
            RedisMode::Cluster => "redis cluster: connected",
            RedisMode::Standalone if self.circuit.is_open() => {
                "redis standalone: unreachable, deciding locally per on_redis_failure"
            }
            RedisMode::Standalone => "redis standalone: connected",
            RedisMode::Sentinel if self.circuit.is_open() => {
                "redis sentinel: unreachable, deciding locally per on_redis_failure"
            }
            RedisMode::Sentinel => "redis sentinel: connected",
        };
        let rules = self.rules.load(Ordering::Relaxed);
        let plural = if rules == 1 { "" } else { "s" };
        let mut line = format!("serving {rules} rule{plural} on {}; {redis}", self.socket);
        if let Some(e) = self.reload_error.lock().ok().and_then(|e| e.clone()) {
            // One line: systemd shows STATUS= on one line.
            let e = e.split_whitespace().collect::<Vec<_>>().join(" ");
            line.push_str("; last reload rejected (old rules in force): ");
            line.push_str(&e.chars().take(200).collect::<String>());
        }
        line
    }
}

/// How often [`supervise`] re-reads the Redis state for `STATUS=`.
const STATUS_POLL: Duration = Duration::from_millis(250);

/// Runs until aborted: sends `WATCHDOG=1` every `watchdog / 2` (if any) and a new
/// `STATUS=` line whenever it changes (e.g. the Redis circuit opens or closes).
///
/// Spawn it on the runtime that serves the socket: pings stop when that runtime no
/// longer runs tasks, and systemd restarts the daemon after `WatchdogSec=`.
pub async fn supervise(status: Arc<Status>, watchdog: Option<Duration>) {
    let mut last = status.line();
    let mut status_tick = tokio::time::interval(STATUS_POLL);
    status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watchdog_tick = watchdog.map(|w| {
        let mut t = tokio::time::interval((w / 2).max(Duration::from_millis(1)));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        tokio::select! {
            _ = status_tick.tick() => {
                let line = status.line();
                if line != last {
                    notify_status(&line);
                    last = line;
                }
            }
            () = async {
                match watchdog_tick.as_mut() {
                    Some(t) => drop(t.tick().await),
                    None => std::future::pending().await,
                }
            } => send(&[NotifyState::Watchdog]),
        }
    }
}
