//! systemd integration, without systemd as PID 1: the unit files pass
//! `systemd-analyze verify` with no output at all; socket activation through Debian's
//! `systemd-socket-activate`; the `sd_notify` messages (READY, STATUS, WATCHDOG,
//! RELOADING, STOPPING) received on a datagram socket of the test's own set as
//! `NOTIFY_SOCKET`; SIGHUP reload on an open connection. Real binary, real sockets.

use crate::common;

use common::*;
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
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

// ---------------------------------------------------------------------------
// Unit files
// ---------------------------------------------------------------------------

/// `systemd-analyze verify` on both shipped units, failing on any line it prints (it
/// exits 0 on unknown keys and bad values, which it only reports).
///
/// verify also checks that `ExecStart=`/`ExecReload=` binaries exist. Rather than edit
/// the unit, it runs with `--root` on a scratch root holding the unit files exactly as
/// shipped (in /lib/systemd/system, with a copy of the system's own units, which verify
/// needs for sysinit.target and friends), the built daemon as /usr/bin/ratelimitd and
/// /bin/kill — the paths the .deb installs.
#[test]
fn units_pass_systemd_analyze_verify_without_any_warning() {
    let analyze = tool("systemd-analyze");
    let root = short_tempdir("rld-root-");
    let r = root.path();
    let system = r.join("lib/systemd/system");
    fs::create_dir_all(&system).unwrap();
    fs::create_dir_all(r.join("usr/bin")).unwrap();
    fs::create_dir_all(r.join("bin")).unwrap();
    let host_units = ["/lib/systemd/system", "/usr/lib/systemd/system"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("sysinit.target").exists())
        .expect("the system's unit directory (with sysinit.target)");
    for entry in fs::read_dir(host_units).unwrap() {
        let entry = entry.unwrap();
        let ty = entry.file_type().unwrap();
        if ty.is_file() || ty.is_symlink() {
            let target = system.join(entry.file_name());
            if ty.is_symlink() {
                let link = fs::read_link(entry.path()).unwrap();
                std::os::unix::fs::symlink(link, target).unwrap();
            } else {
                fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    for unit in ["ratelimitd.service", "ratelimitd.socket"] {
        fs::copy(units_dir().join(unit), system.join(unit)).unwrap();
    }
    let bin = r.join("usr/bin/ratelimitd");
    fs::hard_link(daemon_bin(), &bin)
        .or_else(|_| fs::copy(daemon_bin(), &bin).map(drop))
        .unwrap();
    fs::copy("/bin/kill", r.join("bin/kill")).unwrap();

    let out = Command::new(&analyze)
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        .args(["ratelimitd.socket", "ratelimitd.service"])
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.trim().is_empty(),
        "systemd-analyze verify: {}\n{text}",
        out.status
    );

    // The check is live: a misspelt key in the same setting is reported.
    let service = fs::read_to_string(system.join("ratelimitd.service")).unwrap();
    fs::write(
        system.join("ratelimitd.service"),
        service.replace("ProtectSystem=strict", "ProtectSystm=strict"),
    )
    .unwrap();
    let out = Command::new(&analyze)
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        .args(["ratelimitd.socket", "ratelimitd.service"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unknown key 'ProtectSystm'"),
        "{out:?}"
    );
}

/// What the unit files promise, checked line by line against what the package documents.
#[test]
fn units_declare_notify_watchdog_reload_and_hardening() {
    let service = fs::read_to_string(units_dir().join("ratelimitd.service")).unwrap();
    let socket = fs::read_to_string(units_dir().join("ratelimitd.socket")).unwrap();
    let lines = |unit: &str| -> Vec<String> {
        unit.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect()
    };
    let service = lines(&service);
    let socket = lines(&socket);
    for want in [
        "Type=notify",
        "ExecReload=/usr/bin/ratelimitd --check --config /etc/ratelimitd/ratelimitd.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "User=ratelimitd",
        // /var/lib/ratelimitd, passed as $STATE_DIRECTORY: where the count of daemons
        // alive (fallback.hosts = "auto") is kept for a start while Redis is down.
        "StateDirectory=ratelimitd",
    ] {
        assert!(service.iter().any(|l| l == want), "service lacks {want}");
    }
    // The socket unit owns /run/ratelimitd: a RuntimeDirectory=ratelimitd in the service
    // would make systemd chown the directory and the socket in it to the service's user
    // on the first activation, locking the clients' group out. The service's own runtime
    // directory is another one (ratelimitd-rls: the Envoy front end's socket).
    let runtime: Vec<&str> = service
        .iter()
        .filter_map(|l| l.strip_prefix("RuntimeDirectory="))
        .flat_map(str::split_whitespace)
        .collect();
    assert!(
        !runtime.contains(&"ratelimitd"),
        "the service must not declare RuntimeDirectory=ratelimitd: {runtime:?}"
    );
    assert_eq!(runtime, ["ratelimitd-rls"], "the Envoy socket's directory");
    assert!(service.iter().any(|l| l.starts_with("WatchdogSec=")));
    for want in [
        "ListenStream=/run/ratelimitd/ratelimitd.sock",
        "SocketMode=0660",
        "SocketGroup=ratelimitd-clients",
    ] {
        assert!(socket.iter().any(|l| l == want), "socket lacks {want}");
    }
    let hardening = [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "LockPersonality=yes",
        "MemoryDenyWriteExecute=yes",
        "SystemCallFilter=@system-service",
        "CapabilityBoundingSet=",
        "UMask=0077",
    ];
    let present: Vec<&&str> = hardening
        .iter()
        .filter(|h| service.iter().any(|l| l == **h))
        .collect();
    assert!(present.len() >= 14, "only {present:?}");
    // The config the package installs serves the socket the socket unit owns.
    let conf =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/ratelimitd.toml"))
            .unwrap();
    assert!(conf.contains("socket = \"/run/ratelimitd/ratelimitd.sock\""));
}

// ---------------------------------------------------------------------------
// Socket activation
// ---------------------------------------------------------------------------

/// `systemd-socket-activate -l <socket> ratelimitd --config …` binds the socket, execs
/// the daemon on the first connection with LISTEN_FDS=1, and the daemon answers CHECKs
/// on that inherited socket (binding it itself would fail: the path is live). On
/// SIGTERM it exits 0 and leaves the socket file, which belongs to systemd.
#[test]
fn socket_activation_serves_the_inherited_socket_and_leaves_it_on_exit() {
    let activate = tool("systemd-socket-activate");
    let mut notify = NotifySocket::bind();
    let notify_env = format!("NOTIFY_SOCKET={}", notify.path());
    let mut d = Daemon::start_wrapped(
        &[
            activate.to_str().unwrap(),
            "-l",
            "{socket}",
            "-E",
            "RUST_LOG=info",
            "-E",
            &notify_env,
        ],
        &daemon_bin(),
        &[],
        LOCAL,
    );
    let mut c = d.connect();
    let r = parse_reply(&c.request("CHECK api user:1"));
    assert_eq!((r.verdict.as_str(), r.limit, r.remaining), ("ALLOW", 10, 9));
    assert_eq!(c.request("PING"), "PONG");
    // A second client on the same socket.
    assert!(d
        .connect()
        .request("CHECK api user:1")
        .starts_with("ALLOW 10 8 "));

    let ready = notify.expect(&d, "READY=1", |m| has_line(m, "READY=1"));
    let status = status_of(&ready).unwrap_or_default().to_owned();
    assert!(status.contains("(socket-activated)"), "{status}");
    assert!(status.starts_with("serving 1 rule on "), "{status}");
    assert!(d.log().contains("socket_activated=true"), "{}", d.log());

    d.signal(libc::SIGTERM);
    let exit = d.wait_exit(Duration::from_secs(15));
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "{}", d.log());
    let meta = fs::symlink_metadata(&d.socket).expect("the socket file is systemd's: it stays");
    assert!(meta.file_type().is_socket());
}

// ---------------------------------------------------------------------------
// sd_notify
// ---------------------------------------------------------------------------

/// READY=1 after Redis answered, with a STATUS naming the rules and Redis state;
/// WATCHDOG=1 at half WATCHDOG_USEC; STATUS follows the circuit when Redis dies and
/// comes back; STOPPING=1 on SIGTERM.
#[test]
fn notify_ready_status_watchdog_and_stopping() {
    let mut redis = RedisStandalone::start();
    let mut notify = NotifySocket::bind();
    let config = format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 50\n{}",
        redis.addr(),
        LOCAL.replace("[redis]\nmode = \"none\"\n", "")
    );
    // 300 ms watchdog: a ping every 150 ms.
    let mut d = Daemon::start_with(
        &daemon_bin(),
        &[
            ("NOTIFY_SOCKET", notify.path()),
            ("WATCHDOG_USEC", "300000"),
        ],
        &config,
    );
    let ready = notify.expect(&d, "READY=1", |m| has_line(m, "READY=1"));
    assert_eq!(
        status_of(&ready),
        Some(
            format!(
                "serving 1 rule on {}; redis standalone: connected",
                d.socket.display()
            )
            .as_str()
        ),
        "{ready}"
    );
    // The daemon answers from Redis once READY=1 is out.
    let mut c = d.connect();
    assert_eq!(parse_reply(&c.request("CHECK api w")).source, "redis");

    // Pings keep coming (one per 150 ms; the interval itself is not timed here).
    for i in 0..5 {
        notify.expect(&d, &format!("WATCHDOG=1 #{i}"), |m| {
            has_line(m, "WATCHDOG=1")
        });
    }

    // Redis dies: the first failed decision opens the circuit, STATUS says so.
    redis.kill();
    let r = parse_reply(&c.request("CHECK api w"));
    assert_eq!(r.source, "local");
    notify.expect(&d, "STATUS … unreachable", |m| {
        status_of(m).is_some_and(|s| {
            s.ends_with("redis standalone: unreachable, deciding locally per on_redis_failure")
        })
    });
    // Redis is back: the prober closes the circuit, STATUS says connected again.
    redis.restart();
    notify.expect(&d, "STATUS … connected", |m| {
        status_of(m).is_some_and(|s| s.ends_with("redis standalone: connected"))
    });
    assert!(wait_until(Duration::from_secs(5), || parse_reply(
        &c.request("CHECK api w")
    )
    .source
        == "redis"));

    d.signal(libc::SIGTERM);
    notify.expect(&d, "STOPPING=1", |m| has_line(m, "STOPPING=1"));
    let exit = d.wait_exit(Duration::from_secs(15));
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "{}", d.log());
    assert!(
        !d.socket.exists(),
        "not activated: the daemon removes its own socket"
    );
}

/// SIGHUP: RELOADING=1 (with MONOTONIC_USEC) then READY=1; a changed limit applies on
/// a connection opened before the reload; a setting that needs a restart is named in
/// the log; a broken file keeps the old rules, says so in STATUS, and the daemon lives.
#[test]
fn sighup_reload_notifies_applies_rules_and_survives_a_broken_file() {
    let mut notify = NotifySocket::bind();
    let d = Daemon::start_with(&daemon_bin(), &[("NOTIFY_SOCKET", notify.path())], LOCAL);
    notify.expect(&d, "READY=1", |m| has_line(m, "READY=1"));
    let mut c = d.connect();
    assert!(c.request("CHECK api k1").starts_with("ALLOW 10 9 "));

    // Another client pipelines batches of requests throughout the reloads below; every
    // request must get its reply (no request dropped, no connection closed).
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let mut client = d.connect();
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let batch: Vec<String> = (0..50).map(|i| format!("CHECK api busy{i}")).collect();
            let mut answered = 0usize;
            // Bounded: at most 400 batches (20,000 requests).
            for _ in 0..400 {
                for reply in client.pipeline(&batch) {
                    parse_reply(&reply);
                    answered += 1;
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                thread::sleep(Duration::from_millis(2));
            }
            answered
        })
    };

    // New limit, and a [server] value that cannot change live.
    d.write_config(&format!(
        "[server]\nmax_in_flight = 64\n{}",
        LOCAL.replace("capacity = 10", "capacity = 3")
    ));
    d.signal(libc::SIGHUP);
    let reloading = notify.expect(&d, "RELOADING=1", |m| has_line(m, "RELOADING=1"));
    let usec = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .unwrap_or_else(|| panic!("RELOADING=1 without MONOTONIC_USEC: {reloading:?}"));
    assert!(usec.parse::<u64>().is_ok_and(|u| u > 0), "{usec}");
    let ready = notify.expect(&d, "READY=1 after reload", |m| has_line(m, "READY=1"));
    assert!(!ready.contains("rejected"), "{ready}");
    // Same connection, new rules (READY=1 is sent after the swap).
    assert!(c.request("CHECK api k2").starts_with("ALLOW 3 2 "));
    assert!(
        d.log()
            .contains("server.max_in_flight changed; it needs a restart"),
        "{}",
        d.log()
    );

    // A broken file: the old rules stay, STATUS says why, the daemon still answers.
    d.write_config(&LOCAL.replace("capacity = 10", "capacity = -1"));
    d.signal(libc::SIGHUP);
    notify.expect(&d, "RELOADING=1 (broken file)", |m| {
        has_line(m, "RELOADING=1")
    });
    let ready = notify.expect(&d, "READY=1 after a rejected reload", |m| {
        has_line(m, "READY=1")
    });
    let status = status_of(&ready).unwrap_or_default();
    assert!(
        status.contains("last reload rejected (old rules in force)"),
        "{status}"
    );
    assert!(status.contains("capacity"), "{status}");
    assert!(c.request("CHECK api k2").starts_with("ALLOW 3 1 "));
    assert_eq!(d.connect().request("PING"), "PONG");
    assert!(d.log().contains("old one stays in force"), "{}", d.log());

    stop.store(true, Ordering::Relaxed);
    let answered = busy.join().expect("the pipelining client failed");
    assert!(answered >= 50 && answered % 50 == 0, "{answered}");
    // No WATCHDOG_USEC, no watchdog pings.
    assert!(
        !notify.seen.iter().any(|m| has_line(m, "WATCHDOG=1")),
        "{:?}",
        notify.seen
    );
}

/// With Redis unreachable at start, READY=1 still comes (after the bounded wait), and
/// STATUS says decisions are local.
#[test]
fn notify_ready_with_redis_unreachable_says_local() {
    let mut notify = NotifySocket::bind();
    let config = format!(
        "[redis]\nmode = \"cluster\"\nnodes = [\"127.0.0.1:{}\"]\n{}",
        free_port(),
        LOCAL.replace("[redis]\nmode = \"none\"\n", "")
    );
    let d = Daemon::start_with(&daemon_bin(), &[("NOTIFY_SOCKET", notify.path())], &config);
    let ready = notify.expect(&d, "READY=1", |m| has_line(m, "READY=1"));
    assert!(
        status_of(&ready)
            .is_some_and(|s| s
                .ends_with("redis cluster: unreachable, deciding locally per on_redis_failure")),
        "{ready}"
    );
    // The first message said what it was waiting for.
    assert_eq!(
        notify.seen.first().and_then(|m| status_of(m)),
        Some("starting: connecting to Redis"),
        "{:?}",
        notify.seen
    );
    assert_eq!(
        parse_reply(&d.connect().request("CHECK api k")).source,
        "local"
    );
}
