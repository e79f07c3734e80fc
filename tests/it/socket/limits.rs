//! How many connections the daemon serves and for how long: `max_connections` refuses
//! the excess with `ERR BUSY` and stays healthy, `idle_timeout_ms` closes idle and
//! stalled connections, and a client that never reads its replies delays nobody else.
//! The configuration and the reader of refusals are the socket tests' (`socket/mod.rs`).

use super::{config, refused_with};
use crate::common::*;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

#[test]
fn max_connections_refuses_the_excess_with_busy_and_stays_healthy() {
    // One uid (this test) may take them all: the daemon-wide limit is what is tested.
    let d = Daemon::start(&config("max_connections = 3\nmax_connections_per_uid = 3"));
    // The harness's readiness probe may still hold a slot for a moment.
    let mut held: Vec<Client> = Vec::new();
    assert!(
        wait_until(Duration::from_secs(5), || {
            held.clear();
            (0..3).all(|_| {
                let mut s = UnixStream::connect(&d.socket).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(b"PING\n").unwrap();
                let mut b = [0u8; 5];
                let ok = s.read_exact(&mut b).is_ok() && &b == b"PONG\n";
                drop(s);
                ok
            })
        }),
        "three connections served one after the other"
    );
    for _ in 0..3 {
        let mut c = d.connect();
        assert_eq!(c.request("PING"), "PONG");
        held.push(c);
    }
    // The fourth, and many more: ERR BUSY, closed.
    for _ in 0..20 {
        let reply = refused_with(&d.socket);
        assert!(reply.starts_with("ERR BUSY "), "{reply:?}");
        assert!(reply.contains("server.max_connections = 3"), "{reply:?}");
    }
    // The three keep working.
    for c in &mut held {
        assert_eq!(c.request("PING"), "PONG");
    }
    // Closing one frees its slot.
    held.pop();
    let mut again = None;
    assert!(wait_until(Duration::from_secs(5), || {
        let mut c = d.connect();
        let r = c.request("PING");
        if r == "PONG" {
            again = Some(c);
            true
        } else {
            false
        }
    }));
    assert!(again.unwrap().request("CHECK api k").starts_with("ALLOW "));
}

#[test]
fn idle_connections_are_closed_and_busy_ones_are_not() {
    let d = Daemon::start(&config("idle_timeout_ms = 300"));
    let mut idle = d.connect();
    let mut busy = d.connect();
    assert_eq!(idle.request("PING"), "PONG");
    let start = Instant::now();
    // The busy one talks every 50 ms for well over the timeout.
    while start.elapsed() < Duration::from_millis(1200) {
        assert_eq!(busy.request("PING"), "PONG");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The idle one was closed (EOF), well before the 5 s read timeout.
    assert_eq!(idle.try_read_line().expect("EOF, not a timeout"), "");
    assert!(busy.request("CHECK api k").starts_with("ALLOW "));
}

/// Fills the socket of a client that writes requests and never reads its replies.
/// The `bool` is true if the daemon closed the connection meanwhile (idle timeout).
fn stall(socket: &std::path::Path) -> (UnixStream, bool) {
    let s = UnixStream::connect(socket).unwrap();
    s.set_write_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let chunk = "CHECK api stalled\n".repeat(1000);
    let mut w = &s;
    let mut written = 0usize;
    // Bounded: stop when the kernel buffers in both directions are full (a write times
    // out) or after 64 MB.
    while written < 64 << 20 {
        match w.write(chunk.as_bytes()) {
            Ok(n) => written += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return (s, true)
            }
            Err(e) => panic!("stalling client write: {e}"),
        }
    }
    assert!(written > 0);
    (s, false)
}

#[test]
fn a_stalled_client_does_not_delay_others() {
    let d = Daemon::start(&config("idle_timeout_ms = 0"));
    let stalled: Vec<(UnixStream, bool)> = (0..3).map(|_| stall(&d.socket)).collect();
    assert!(
        stalled.iter().all(|(_, closed)| !closed),
        "idle timeout is off"
    );
    // Others are served, in full (each read has a 5 s timeout; 2000 round trips).
    let mut c = d.connect();
    for i in 0..1000 {
        assert!(
            c.request(&format!("CHECK api other{i}"))
                .starts_with("ALLOW "),
            "request {i}"
        );
    }
    let lines: Vec<String> = (0..1000).map(|i| format!("CHECK api p{i}")).collect();
    assert!(c.pipeline(&lines).iter().all(|r| r.starts_with("ALLOW ")));
    // A new connection too.
    assert_eq!(d.connect().request("PING"), "PONG");
    drop(stalled);
}

#[test]
fn a_stalled_client_is_disconnected_after_the_idle_timeout() {
    let d = Daemon::start(&config("idle_timeout_ms = 400"));
    let (mut s, closed_while_writing) = stall(&d.socket);
    let mut c = d.connect();
    assert_eq!(c.request("PING"), "PONG");
    if closed_while_writing {
        // The daemon already gave up on it while it was being filled.
        return;
    }
    // The stalled one is dropped: its replies end (EOF or reset) within a few seconds.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(20);
    // Wait first so the daemon hits the timeout while the client is not reading.
    std::thread::sleep(Duration::from_millis(1000));
    let closed = loop {
        assert!(Instant::now() < deadline, "stalled connection still open");
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break true,
            Err(e) => panic!("reading the stalled connection: {e}"),
        }
    };
    assert!(closed);
    // (`c` has been idle longer than the timeout meanwhile: a new connection.)
    assert_eq!(d.connect().request("PING"), "PONG");
}
