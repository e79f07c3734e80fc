//! Nothing one client can exhaust besides Redis (tests/serial/flood.rs): idle connections on
//! the metrics port take no descriptor from the socket's clients; a client that never
//! reads its replies cannot grow the daemon's memory; the limits' fields are validated.
//! Real binary, loopback only.

use crate::common;

use common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

// The tests of this file measure descriptors and memory: one at a time, beside no other
// test of this binary.
use crate::ONE_AT_A_TIME;

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Open descriptors of `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A TCP connection to `addr` started without waiting for it to complete (it may sit
/// in the listen queue, or wait for a SYN-ACK that never comes).
fn connect_nowait(addr: SocketAddr) -> OwnedFd {
    let SocketAddr::V4(a) = addr else {
        panic!("IPv4 only")
    };
    // SAFETY: plain socket(2)/connect(2) on a sockaddr_in we own; the fd is owned at once.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let owned = OwnedFd::from_raw_fd(fd);
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        libc::connect(
            fd,
            std::ptr::addr_of!(sin).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        owned
    }
}

#[test]
fn idle_metrics_connections_take_nothing_from_socket_clients() {
    let _one = one_at_a_time();
    // This test process holds 1,000 sockets itself.
    ratelimitd::rlimit::raise_nofile().unwrap();
    let port = free_port();
    let d = Daemon::start(&format!(
        "[server]\nmax_connections = 100\nmax_connections_per_uid = 100\n[redis]\nmode = \"none\"\n[metrics]\nlisten = {port}\n\
         [[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\ncapacity = 1000\nrefill_rate = 1000.0\n"
    ));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).unwrap();
    let nofile: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        nofile[3], nofile[4],
        "soft RLIMIT_NOFILE raised to the hard one: {limits}"
    );

    let before = fds(d.pid());
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let idle: Vec<OwnedFd> = (0..1000).map(|_| connect_nowait(addr)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = fds(d.pid());
    eprintln!("daemon descriptors: {before} before, {during} with 1,000 idle metrics connections");
    assert!(during <= before + 4 + 2, "{before} -> {during}");

    // Socket clients: 90 at once, each answered.
    let mut clients: Vec<Client> = (0..90).map(|_| d.connect()).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        let reply = c.request(&format!("CHECK api k{i}"));
        assert!(reply.starts_with("ALLOW "), "{reply}");
    }
    drop(clients);
    // Gone idle connections free the endpoint: a scrape succeeds again.
    drop(idle);
    let scraped = wait_until(Duration::from_secs(15), || {
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(6)));
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.starts_with("HTTP/1.1 200") && out.contains("ratelimitd_decisions_total")
    });
    assert!(scraped, "metrics endpoint did not recover");
}

/// Resident memory of `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Writes `chunk` to `s` until the daemon stops reading (the socket stays full for
/// half a second) or `max` bytes went out; returns the bytes written.
fn write_until_stalled(s: &mut UnixStream, chunk: &[u8], max: usize) -> usize {
    s.set_nonblocking(true).unwrap();
    let (mut sent, mut stalled_since) = (0, None::<Instant>);
    while sent < max {
        match s.write(chunk) {
            Ok(n) => {
                sent += n;
                stalled_since = None;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let since = *stalled_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("writing: {e}"),
        }
    }
    sent
}

#[test]
fn clients_that_never_read_cannot_grow_the_daemons_memory() {
    let _one = one_at_a_time();
    let d = Daemon::start(
        "[redis]\nmode = \"none\"\n[[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\n\
         capacity = 1000\nrefill_rate = 1000.0\n",
    );
    let mut probe = d.connect();
    assert_eq!(probe.request("PING"), "PONG");
    let before = rss_kib(d.pid());
    // Empty lines: 1 byte in, a 24-byte ERR PROTO out, the largest reply per byte read.
    let empty = vec![b'\n'; 64 * 1024];
    let checks: Vec<u8> = (0..4096)
        .flat_map(|i| format!("CHECK api k{i}\n").into_bytes())
        .collect();
    let mut readers_never = Vec::new();
    let mut sent = 0;
    for i in 0..40 {
        let mut s = UnixStream::connect(&d.socket).unwrap();
        sent += write_until_stalled(&mut s, if i % 2 == 0 { &empty } else { &checks }, 64 << 20);
        readers_never.push(s);
    }
    let after = rss_kib(d.pid());
    eprintln!(
        "40 clients that never read sent {} KiB; daemon RSS {before} KiB -> {after} KiB (+{} KiB)",
        sent / 1024,
        after.saturating_sub(before)
    );
    // Per connection: a read buffer, at most 64 KiB of replies waiting, 128 requests.
    assert!(
        after.saturating_sub(before) < 40 * 256 + 16 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert!(probe.request("CHECK api other").starts_with("ALLOW "));
    assert!(d.connect().request("CHECK api new").starts_with("ALLOW "));
}

#[test]
fn limit_fields_are_validated_naming_field_and_line() {
    use ratelimitd::config::Config;
    for (text, field) in [
        (
            "[server]\nredis_max_in_flight = 0\n",
            "server.redis_max_in_flight",
        ),
        (
            "[server]\nredis_max_in_flight_per_uid = 1000001\n",
            "server.redis_max_in_flight_per_uid",
        ),
        (
            "[metrics]\nmax_connections = 0\n",
            "metrics.max_connections",
        ),
        // A listen address is checked as it is read, by one rule for both its tables:
        // the message names the field and both tables, the location names the line.
        (
            "[metrics]\nlisten = \"nowhere\"\n",
            "listen ([http] or [metrics])",
        ),
        (
            "[metrics]\nlisten = 70000\n",
            "listen ([http] or [metrics])",
        ),
        ("[metrics]\nlisten = true\n", "listen ([http] or [metrics])"),
    ] {
        let err = Config::parse(text, "t.toml").unwrap_err().to_string();
        assert!(
            err.contains(field) && err.contains("line 2"),
            "{text}: {err}"
        );
    }
    let c = Config::parse("[metrics]\nlisten = 9090\n", "t").unwrap();
    assert_eq!(c.metrics.listen, Some(([127, 0, 0, 1], 9090).into()));
    let c = Config::parse("[metrics]\nlisten = \"9091\"\n", "t").unwrap();
    assert_eq!(c.metrics.listen, Some(([127, 0, 0, 1], 9091).into()));
    let c = Config::parse("[metrics]\nlisten = \"[::1]:9092\"\n", "t").unwrap();
    assert_eq!(c.metrics.listen.unwrap().port(), 9092);
    let c = Config::parse("", "t").unwrap();
    assert_eq!(
        (
            c.server.redis_max_in_flight,
            c.server.redis_max_in_flight_per_uid,
            c.metrics.max_connections,
            c.metrics.listen
        ),
        (4096, 1024, 4, None)
    );
}
