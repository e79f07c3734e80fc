//! Socket security and limits: `allow_uids` / `allow_gids` (SO_PEERCRED),
//! `socket_mode`, the unsafe-directory refusal and the `[server]` fields' validation
//! here; `max_connections`, `idle_timeout_ms` and a stalled client that must not delay
//! others in [`limits`]. Real binary, real Unix socket, `redis.mode = "none"`.

use crate::common;

use common::*;
use ratelimitd::config::Config;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod limits;

const RULES: &str = r#"
[redis]
mode = "none"

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 1000000
refill_rate = 1000000.0
"#;

fn config(server: &str) -> String {
    format!("[server]\n{server}\n{RULES}")
}

fn my_uid() -> u32 {
    // SAFETY: getuid/getgid cannot fail.
    unsafe { libc::getuid() }
}

fn my_gid() -> u32 {
    // SAFETY: as above.
    unsafe { libc::getgid() }
}

/// A uid/gid that is not ours (and not root's).
fn other_id(mine: u32) -> u32 {
    if mine == 54321 {
        54322
    } else {
        54321
    }
}

/// Connects and reads everything the daemon sends until it closes (bounded by 5 s).
fn refused_with(socket: &std::path::Path) -> String {
    let mut s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // The daemon closed with our (unsent) request unread: a reset after its line.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!(
                "reading the refusal: {e} (got {:?})",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn peer_uid_not_allowed_gets_err_perm_and_is_logged() {
    let other = other_id(my_uid());
    let d = Daemon::start(&config(&format!("allow_uids = [{other}]")));
    let reply = refused_with(&d.socket);
    assert!(reply.starts_with("ERR PERM "), "{reply:?}");
    assert_eq!(
        reply.matches('\n').count(),
        1,
        "one line, then close: {reply:?}"
    );
    assert!(reply.contains(&format!("uid {}", my_uid())), "{reply:?}");
    assert!(
        wait_until(Duration::from_secs(5), || d
            .log()
            .contains("refused a connection")),
        "refusal logged:\n{}",
        d.log()
    );
    let log = d.log();
    assert!(
        log.contains(&format!("pid {}", std::process::id()))
            && log.contains(&format!("uid {}", my_uid()))
            && log.contains(&format!("gid {}", my_gid())),
        "log names pid, uid and gid:\n{log}"
    );
    // Many refusals in a row: the log stays short (at most one line per second).
    for _ in 0..50 {
        assert!(refused_with(&d.socket).starts_with("ERR PERM "));
    }
    let lines = d.log().matches("refused a connection").count();
    assert!(lines <= 5, "refusal logging is rate-limited: {lines} lines");
}

#[test]
fn own_uid_allowed_is_served() {
    let other = other_id(my_uid());
    let d = Daemon::start(&config(&format!("allow_uids = [{other}, {}]", my_uid())));
    let mut c = d.connect();
    assert_eq!(c.request("PING"), "PONG");
    assert!(c.request("CHECK api k").starts_with("ALLOW "));
}

#[test]
fn gid_lists_allow_or_refuse() {
    let (uid, gid) = (my_uid(), my_gid());
    // Our uid is not listed but our gid is: served.
    let d = Daemon::start(&config(&format!(
        "allow_uids = [{}]\nallow_gids = [{gid}]",
        other_id(uid)
    )));
    assert_eq!(d.connect().request("PING"), "PONG");
    drop(d);
    // Only another gid listed: refused.
    let d = Daemon::start(&config(&format!("allow_gids = [{}]", other_id(gid))));
    let reply = refused_with(&d.socket);
    assert!(reply.starts_with("ERR PERM "), "{reply:?}");
}

/// A peer with another uid (nobody, 65534) is let in by `allow_uids`, while root, not
/// listed, is refused. Needs root to run the client as another user.
#[test]
fn another_users_uid_is_checked_too() {
    if my_uid() != 0 {
        eprintln!("skipped: needs root to run a client as uid 65534");
        return;
    }
    let d = Daemon::start(&config("allow_uids = [65534]\nsocket_mode = \"0666\""));
    // The harness's temp dir is 0700: let nobody reach the socket.
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(refused_with(&d.socket).starts_with("ERR PERM "));
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new("socat")
            .arg("-t2")
            .arg("-")
            .arg(format!("UNIX-CONNECT:{}", d.socket.display()))
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("socat")
    };
    child.stdin.take().unwrap().write_all(b"PING\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("socat as uid 65534 did not finish");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "PONG\n",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn socket_mode_is_exact() {
    for mode in [0o640u32, 0o666, 0o600] {
        let d = Daemon::start(&config(&format!("socket_mode = \"{mode:04o}\"")));
        let got = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o7777;
        assert_eq!(got, mode, "socket_mode {mode:04o}, file has {got:04o}");
    }
}

/// Runs the daemon on `config_text` (which names its own socket) and expects it to exit
/// on its own; returns (exit code, output).
fn run_expecting_exit(dir: &std::path::Path, config_text: &str) -> (Option<i32>, String) {
    let cfg = dir.join("rl.toml");
    std::fs::write(&cfg, config_text).unwrap();
    let log = dir.join("out.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(daemon_bin())
        .arg("--config")
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.is_some(), "daemon did not exit:\n{out}");
    (status.unwrap().code(), out)
}

#[test]
fn world_writable_directory_without_sticky_bit_is_refused() {
    let tmp = short_tempdir("rl-dir-");
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = open.join("rl.sock");
    let text = format!(
        "[server]\nsocket = {}\n{RULES}",
        toml_string(&socket.to_string_lossy())
    );
    let (code, out) = run_expecting_exit(tmp.path(), &text);
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("world-writable without the sticky bit"),
        "explains why:\n{out}"
    );
    assert!(!socket.exists(), "no socket created");

    // The same directory with the sticky bit (as /tmp) is fine.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let sticky_cfg = tmp.path().join("sticky.toml");
    std::fs::write(&sticky_cfg, &text).unwrap();
    let mut child = Command::new(daemon_bin())
        .arg("--config")
        .arg(&sticky_cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(10), || {
        UnixStream::connect(&socket).is_ok()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(up, "daemon serves from a sticky world-writable directory");
}

#[test]
fn server_fields_are_validated_naming_field_and_line() {
    for (field, value) in [
        ("allow_uids", "[-1]"),
        ("allow_uids", "[4294967295]"),
        ("allow_gids", "[\"wheel\"]"),
        ("max_connections", "0"),
        ("idle_timeout_ms", "-5"),
        ("idle_timeout_ms", "86400001"),
    ] {
        let text = format!("\n[server]\n{field} = {value}\n");
        let e = Config::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(e.contains(field), "{field} = {value}: {e}");
        assert!(e.contains("line 3"), "{field} = {value}: {e}");
    }
    let c = Config::parse(
        "[server]\nallow_uids = [0, 1000]\nallow_gids = []\nmax_connections = 5\nidle_timeout_ms = 0\n",
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.server.allow_uids, vec![0, 1000]);
    assert!(c.server.allow_gids.is_empty());
    assert_eq!(c.server.max_connections, 5);
    assert_eq!(c.server.idle_timeout_ms, 0);
    let d = Config::parse("", "t.toml").unwrap();
    assert_eq!(d.server.max_connections, 1000);
    assert_eq!(d.server.idle_timeout_ms, 300_000);
}
