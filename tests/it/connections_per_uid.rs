//! `server.max_connections_per_uid`: one application (one peer uid) cannot take every
//! connection of the daemon. A "hog" uid opens its share and 50 more: the extra ones
//! are answered `ERR BUSY` naming the limit and closed, while another uid and root are
//! still served. Real binary, real Unix socket, `redis.mode = "none"`.
//!
//! A peer with another uid is this test binary run again as that uid (root only): the
//! entry [`hold_connections_helper`] does nothing unless `RLD_HOLD_SOCKET` is set.

use crate::common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const HOG: u32 = 65534;
const VICTIM: u32 = 65533;
/// `server.max_connections` of the daemon; its default per-uid share is half of it.
const MAX_CONNECTIONS: usize = 20;
const PER_UID: usize = MAX_CONNECTIONS / 2;

/// Runs only as the helper process: opens `RLD_HOLD_COUNT` connections to
/// `RLD_HOLD_SOCKET` one after the other, each sending `PING` and reading one line
/// (a refused connection's line is its `ERR BUSY`), prints `HOLD <i> <reply>` per
/// connection and `HOLD READY`, then keeps them all open until its stdin closes.
#[test]
fn hold_connections_helper() {
    let Some(socket) = std::env::var_os("RLD_HOLD_SOCKET") else {
        return;
    };
    let count: usize = std::env::var("RLD_HOLD_COUNT").unwrap().parse().unwrap();
    let mut held = Vec::new();
    for i in 0..count {
        let reply = match UnixStream::connect(&socket) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                // A refused connection may be closed before the PING goes out.
                let _ = s.write_all(b"PING\n");
                let mut line = String::new();
                let _ = BufReader::new(&s).read_line(&mut line);
                held.push(s);
                line.trim_end().to_owned()
            }
            Err(e) => format!("connect failed: {e}"),
        };
        println!("HOLD {i} {reply}");
    }
    println!("HOLD READY");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(held);
}

/// The helper running as `uid`, holding `count` connections; killed on drop.
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The reply each connection got, in order.
    replies: Vec<String>,
}

impl Holder {
    fn start(socket: &std::path::Path, uid: u32, count: usize) -> Holder {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "connections_per_uid::hold_connections_helper",
            "--nocapture",
        ])
        .arg("--test-threads=1")
        .env("RLD_HOLD_SOCKET", socket)
        .env("RLD_HOLD_COUNT", count.to_string())
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = spawn_owned(cmd).expect("running the helper as another uid");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut replies = Vec::new();
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("helper as uid {uid}: {e} after {replies:?}"));
            // libtest's "test hold_connections_helper ... " may start the first line.
            let Some((_, rest)) = line.split_once("HOLD ") else {
                continue;
            };
            if rest == "READY" {
                break;
            }
            {
                let (i, reply) = rest.split_once(' ').unwrap_or((rest, ""));
                assert_eq!(i.parse::<usize>().unwrap(), replies.len());
                replies.push(reply.to_owned());
            }
        }
        Holder {
            stdin: child.stdin.take(),
            child,
            replies,
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn one_uid_cannot_take_every_connection() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: needs root to run clients as uids {HOG} and {VICTIM}");
        return;
    }
    let d = Daemon::start(&format!(
        "[server]\nsocket_mode = \"0666\"\nmax_connections = {MAX_CONNECTIONS}\n\
         [redis]\nmode = \"none\"\n"
    ));
    // The harness's temp dir is 0700: let the other uids reach the socket.
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();

    let hog = Holder::start(&d.socket, HOG, PER_UID + 50);
    let want = format!(
        "ERR BUSY too many connections from uid {HOG} (server.max_connections_per_uid = {PER_UID})"
    );
    for (i, reply) in hog.replies.iter().enumerate() {
        if i < PER_UID {
            assert_eq!(reply, "PONG", "hog connection {i}: {:?}", hog.replies);
        } else {
            assert!(
                reply.starts_with(&want),
                "hog connection {i}: {reply:?}, want {want:?}"
            );
        }
    }
    let refused = hog.replies.iter().filter(|r| r.starts_with(&want)).count();
    assert_eq!(refused, 50);

    // With the hog holding its share, another uid and root are served.
    let victim = Holder::start(&d.socket, VICTIM, 3);
    assert_eq!(victim.replies, ["PONG", "PONG", "PONG"]);
    let mut root = d.connect();
    assert_eq!(root.request("PING"), "PONG");
    assert!(
        d.log().contains(&format!(
            "uid {HOG} holds server.max_connections_per_uid = {PER_UID} connections"
        )),
        "{}",
        d.log_tail(10)
    );

    // The hog's connections gone, its share is free again.
    drop(hog);
    assert!(
        wait_until(Duration::from_secs(5), || {
            let again = Holder::start(&d.socket, HOG, PER_UID);
            again.replies.iter().all(|r| r == "PONG")
        }),
        "the hog's share came back when its connections closed"
    );
}
