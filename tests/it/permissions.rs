//! Who may use what: a rule's `allow_uids` / `allow_gids` (`ERR PERM`, the connection
//! stays open, a reload applies to connections already open), their validation, and
//! the socket path refusals (a non-socket or a symlink at the path is never removed or
//! followed). Real binary, real Unix socket, `redis.mode = "none"`; the tests that need
//! a peer with another uid run `socat` as nobody (65534) and need root.

use crate::common;

use common::*;
use ratelimitd::config::Config;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub(crate) const NOBODY: u32 = 65534;

fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Rules: `open` (no lists), `nobody` (`allow_uids = [65534]`), `me` (our uid only),
/// `nobody_group` (`allow_gids = [65534]`).
fn config(nobody_uids: &str) -> String {
    let me = my_uid();
    format!(
        r#"
[server]
socket_mode = "0666"

[redis]
mode = "none"

[[rule]]
name = "open"
algorithm = "token_bucket"
capacity = 100
refill_rate = 100.0

[[rule]]
name = "nobody"
algorithm = "fixed_window"
limit = 100
window = "1m"
allow_uids = {nobody_uids}

[[rule]]
name = "me"
algorithm = "token_bucket"
capacity = 100
refill_rate = 100.0
allow_uids = [{me}]

[[rule]]
name = "nobody_group"
algorithm = "sliding_window_counter"
limit = 100
window = "1m"
allow_gids = [{NOBODY}]
"#
    )
}

/// A line-protocol client running as another user: `socat` as `uid`/`gid`, fed through
/// its stdin, replies read from its stdout by a thread. Killed on drop.
pub(crate) struct AsUser {
    child: Child,
    stdin: Option<ChildStdin>,
    replies: mpsc::Receiver<String>,
}

impl AsUser {
    pub(crate) fn connect(socket: &std::path::Path, uid: u32, gid: u32) -> AsUser {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("socat");
        cmd.arg("-t5")
            .arg("-")
            .arg(format!("UNIX-CONNECT:{}", socket.display()))
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = spawn_owned(cmd).expect("socat");
        let stdout = child.stdout.take().unwrap();
        let (tx, replies) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        AsUser {
            stdin: child.stdin.take(),
            child,
            replies,
        }
    }

    pub(crate) fn request(&mut self, line: &str) -> String {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        self.replies
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("no reply to {line:?} as another user: {e}"))
    }
}

impl Drop for AsUser {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn skip_unless_root() -> bool {
    if my_uid() != 0 {
        eprintln!("skipped: needs root to run a client as uid {NOBODY}");
        return true;
    }
    false
}

/// A daemon whose socket nobody can reach (the harness's temp dir is 0700).
pub(crate) fn start(config: &str) -> Daemon {
    let d = Daemon::start(config);
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn a_rule_refuses_peers_it_does_not_list_and_the_connection_stays_open() {
    if skip_unless_root() {
        return;
    }
    let d = start(&config(&format!("[{NOBODY}]")));
    let mut me = d.connect();
    let mut nobody = AsUser::connect(&d.socket, NOBODY, NOBODY);

    assert!(me.request("CHECK me k").starts_with("ALLOW "));
    assert!(me.request("CHECK open k").starts_with("ALLOW "));
    let refused = me.request("CHECK nobody k");
    assert!(
        refused.starts_with("ERR PERM ") && refused.contains(&format!("uid {}", my_uid())),
        "{refused}"
    );
    assert!(me.request("CHECK nobody_group k").starts_with("ERR PERM "));
    assert_eq!(me.request("PING"), "PONG", "the connection stays open");

    assert!(nobody.request("CHECK nobody k").starts_with("ALLOW "));
    assert!(nobody.request("CHECK nobody_group k").starts_with("ALLOW "));
    assert!(nobody.request("CHECK open k").starts_with("ALLOW "));
    let refused = nobody.request("CHECK me k");
    assert!(
        refused.starts_with("ERR PERM ") && refused.contains("uid 65534"),
        "{refused}"
    );
    assert_eq!(nobody.request("PING"), "PONG", "the connection stays open");
    // An unknown rule is still ERR RULE, whoever asks.
    assert!(nobody.request("CHECK nope k").starts_with("ERR RULE "));
}

#[test]
fn a_reload_that_removes_a_uid_applies_to_open_connections() {
    if skip_unless_root() {
        return;
    }
    let d = start(&config(&format!("[{NOBODY}]")));
    let mut nobody = AsUser::connect(&d.socket, NOBODY, NOBODY);
    assert!(nobody.request("CHECK nobody k").starts_with("ALLOW "));

    d.write_config(&config(&format!("[{}]", my_uid())));
    d.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(5), || d
            .log()
            .contains("SIGHUP: configuration reloaded")),
        "{}",
        d.log_tail(20)
    );
    // The same connection, opened before the reload.
    assert!(nobody.request("CHECK nobody k").starts_with("ERR PERM "));
    assert!(nobody.request("CHECK open k").starts_with("ALLOW "));
    let mut me = d.connect();
    assert!(me.request("CHECK nobody k").starts_with("ALLOW "));

    // And back: adding the uid again serves it again on the same connection.
    d.write_config(&config(&format!("[{NOBODY}]")));
    d.signal(libc::SIGHUP);
    assert!(wait_until(Duration::from_secs(5), || {
        nobody.request("CHECK nobody k").starts_with("ALLOW ")
    }));
}

#[test]
fn rule_id_lists_are_validated_naming_field_and_line() {
    let rule = |extra: &str| {
        format!(
            "[[rule]]\nname = \"r\"\nalgorithm = \"token_bucket\"\ncapacity = 1\nrefill_rate = 1.0\n{extra}\n"
        )
    };
    for (field, value) in [
        ("allow_uids", "[-1]"),
        ("allow_uids", "[4294967295]"),
        ("allow_gids", "[1, -5]"),
    ] {
        let err = Config::parse(&rule(&format!("{field} = {value}")), "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("rule[0].{field}")) && err.contains("t.toml:6"),
            "{field} = {value}: {err}"
        );
    }
    let err = Config::parse(&rule("allow_gids = \"0\""), "t.toml").unwrap_err();
    assert!(err.to_string().contains("line 6"), "{err}");
    let c = Config::parse(&rule("allow_uids = [0, 1000]\nallow_gids = [7]"), "t").unwrap();
    let r = &c.rules["r"];
    assert_eq!(
        (r.access.uids.clone(), r.access.gids.clone()),
        (vec![0, 1000], vec![7])
    );
    let c = Config::parse(&rule(""), "t").unwrap();
    assert!(c.rules["r"].access.is_open());
}

/// Starts the daemon on `socket` (already prepared) and expects it to refuse.
fn refuses_to_start(dir: &std::path::Path, socket: &std::path::Path) -> String {
    let config = dir.join("t.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nsocket = \"{}\"\n[redis]\nmode = \"none\"\n",
            socket.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(daemon_bin());
    cmd.arg("--config")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spawn_owned(cmd).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || child
            .try_wait()
            .unwrap()
            .is_some()),
        "the daemon did not exit"
    );
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout)
}

#[test]
fn a_file_or_a_symlink_at_the_socket_path_is_refused_and_left_alone() {
    let dir = short_tempdir("rld-path-");
    let socket = dir.path().join("s.sock");
    std::fs::write(&socket, "data").unwrap();
    let log = refuses_to_start(dir.path(), &socket);
    assert!(
        log.contains("s.sock") && log.contains("is not a socket"),
        "{log}"
    );
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "data");

    // A symlink to a file, and one to a live socket elsewhere: neither followed nor removed.
    std::fs::remove_file(&socket).unwrap();
    let target = dir.path().join("target");
    std::fs::write(&target, "keep").unwrap();
    std::os::unix::fs::symlink(&target, &socket).unwrap();
    let log = refuses_to_start(dir.path(), &socket);
    assert!(log.contains("is not a socket"), "{log}");
    assert!(std::fs::symlink_metadata(&socket)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");

    std::fs::remove_file(&socket).unwrap();
    let other = dir.path().join("other.sock");
    let _live = std::os::unix::net::UnixListener::bind(&other).unwrap();
    std::os::unix::fs::symlink(&other, &socket).unwrap();
    let log = refuses_to_start(dir.path(), &socket);
    assert!(log.contains("is not a socket"), "{log}");
    assert!(other.exists());
}

#[test]
fn shutdown_leaves_a_socket_file_that_is_no_longer_ours() {
    let d = Daemon::start("[redis]\nmode = \"none\"\n");
    let mut d = d;
    // Someone replaced the socket file while the daemon served (as root could).
    std::fs::remove_file(&d.socket).unwrap();
    let _other = std::os::unix::net::UnixListener::bind(&d.socket).unwrap();
    d.signal(libc::SIGTERM);
    assert!(d
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    assert!(d.socket.exists(), "the other socket file must stay");
    assert!(
        d.log().contains("replaced or removed while serving"),
        "{}",
        d.log()
    );
}
