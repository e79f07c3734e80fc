//! Socket activation through Debian's `systemd-socket-activate`: the daemon serves the
//! socket it inherits and leaves the socket file, which is systemd's, on exit.

use super::{has_line, status_of, tool, NotifySocket, LOCAL};
use crate::common::*;
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::time::Duration;

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
