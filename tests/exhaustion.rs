//! Nothing one client can exhaust: a uid flooding a slow Redis with pipelined CHECKs
//! gets `ERR BUSY` beyond its share and cannot slow another uid's decisions; idle
//! connections on the metrics port take no descriptor from the socket's clients; a
//! client that never reads its replies cannot grow the daemon's memory. Real binary,
//! loopback only; the flood runs `socat` as nobody (65534) and needs root.

mod common;

use common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;

/// The tests of this file measure time and memory: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_root() -> bool {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() == 0 }
}

/// A Redis made slow: a TCP proxy that passes what the daemon sends at `bytes_per_s`,
/// like a slow link or a saturated server: commands queue in front of Redis, and a
/// command waits for every byte sent before it. Replies come back at once.
fn slow_proxy(upstream: String, bytes_per_s: f64) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (mut up_rd, mut up_wr) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut down_rd, mut down_wr) = (server, client);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 16 * 1024];
                let mut free_at = Instant::now();
                while let Ok(n @ 1..) = up_rd.read(&mut buf) {
                    let now = Instant::now();
                    free_at = free_at.max(now) + Duration::from_secs_f64(n as f64 / bytes_per_s);
                    std::thread::sleep(free_at.saturating_duration_since(now));
                    if up_wr.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = up_wr.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut down_rd, &mut down_wr);
                let _ = down_wr.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    port
}

/// p-th percentile (0..=100) of `v`, ms.
fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p / 100.0).round() as usize]
}

/// One CHECK per call on `c`: (latency ms, reply).
fn timed(c: &mut Client, line: &str) -> (f64, String) {
    let t = Instant::now();
    let reply = c.request(line);
    (t.elapsed().as_secs_f64() * 1e3, reply)
}

const TIMEOUT_MS: u64 = 25;
/// Flooding connections (as nobody) × lines each: 100,000 CHECKs.
const FLOODERS: usize = 2;
const FLOOD_LINES: usize = 50_000;
/// Bound on the victim's p99: `timeout_ms` + 5 ms, plus 70 ms for a debug build on a
/// shared 2-core machine with a load average near 14, where the daemon itself waits for
/// a CPU (measured there: p99 28–29 ms, max 42–57 ms; each run prints its figures).
const P99_BOUND_MS: f64 = TIMEOUT_MS as f64 + 5.0 + 70.0;

fn flood_config(redis: &str, total: usize, per_uid: usize) -> String {
    format!(
        r#"
[server]
socket_mode = "0666"
redis_max_in_flight = {total}
redis_max_in_flight_per_uid = {per_uid}

[redis]
mode = "standalone"
nodes = ["{redis}"]
timeout_ms = {TIMEOUT_MS}

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 1000000000
refill_rate = 1000000000.0
"#
    )
}

/// Runs the flood against a daemon with the given caps; returns (victim latencies
/// during the flood, victim sources, flooders' replies by kind, baseline latencies).
fn flood(total: usize, per_uid: usize) -> (Vec<f64>, Vec<String>, [usize; 3], Vec<f64>) {
    let _one = one_at_a_time();
    let redis = RedisStandalone::start();
    // ~150-byte EVALSHA commands at 1 MB/s: about 7,000 decisions/s, so 32 in flight
    // queue for ~5 ms and 256 (2 connections × 128, uncapped) for ~40 ms.
    let proxy = slow_proxy(redis.addr(), 1.0e6);
    let d = Daemon::start(&flood_config(&format!("127.0.0.1:{proxy}"), total, per_uid));
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut victim = d.connect();
    assert!(wait_until(Duration::from_secs(5), || parse_reply(
        &victim.request("CHECK api warm")
    )
    .source
        == "redis"));
    let baseline: Vec<f64> = (0..300)
        .map(|i| timed(&mut victim, &format!("CHECK api b{i}")).0)
        .collect();

    let mut flooders = Vec::new();
    for f in 0..FLOODERS {
        let input = d.dir().join(format!("flood{f}.txt"));
        let output = d.dir().join(format!("flood{f}.out"));
        let lines: String = (0..FLOOD_LINES)
            .map(|i| format!("CHECK api f{f}-{i}\n"))
            .collect();
        std::fs::write(&input, lines).unwrap();
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("socat");
        cmd.arg("-t30")
            .arg("-")
            .arg(format!("UNIX-CONNECT:{}", d.socket.display()))
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(std::fs::File::open(&input).unwrap())
            .stdout(std::fs::File::create(&output).unwrap())
            .stderr(Stdio::null());
        flooders.push((spawn_owned(cmd).expect("socat"), output));
    }
    let (mut during, mut sources) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    while flooders
        .iter_mut()
        .any(|(c, _)| c.try_wait().unwrap().is_none())
    {
        assert!(
            Instant::now() < deadline,
            "the flood did not end within 60 s"
        );
        let (ms, reply) = timed(&mut victim, &format!("CHECK api v{i}"));
        let r = parse_reply(&reply);
        during.push(ms);
        sources.push(r.source);
        i += 1;
    }
    let mut kinds = [0usize; 3]; // decisions, ERR BUSY, anything else
    for (mut child, output) in flooders {
        assert!(child.wait().unwrap().success());
        let out = std::fs::read_to_string(output).unwrap();
        assert_eq!(
            out.lines().count(),
            FLOOD_LINES,
            "every flooded line answered"
        );
        for l in out.lines() {
            let k = match l {
                _ if try_parse_reply(l).is_some() => 0,
                _ if l.starts_with("ERR BUSY ") => 1,
                _ => 2,
            };
            kinds[k] += 1;
        }
    }
    (during, sources, kinds, baseline)
}

#[test]
fn a_uid_flooding_a_slow_redis_cannot_slow_down_another() {
    if !is_root() {
        eprintln!("skipped: needs root to run the flooding client as uid {NOBODY}");
        return;
    }
    let (mut during, sources, kinds, mut baseline) = flood(256, 32);
    let redis_share =
        sources.iter().filter(|s| *s == "redis").count() as f64 / sources.len() as f64;
    let (p50, p99, max) = (
        percentile(&mut during, 50.0),
        percentile(&mut during, 99.0),
        percentile(&mut during, 100.0),
    );
    let (b50, b99) = (
        percentile(&mut baseline, 50.0),
        percentile(&mut baseline, 99.0),
    );
    eprintln!(
        "flood (share 32 of 256): victim {} CHECKs during the flood: p50 {p50:.2} ms, p99 {p99:.2} ms, \
         max {max:.2} ms, {:.0}% decided in Redis; alone: p50 {b50:.2} ms, p99 {b99:.2} ms; \
         flooders: {} decisions, {} ERR BUSY, {} other",
        during.len(),
        redis_share * 100.0,
        kinds[0],
        kinds[1],
        kinds[2]
    );
    assert_eq!(kinds[2], 0, "the flooders got only decisions and ERR BUSY");
    assert!(
        kinds[1] > 0,
        "the flood went beyond its share: some ERR BUSY"
    );
    assert!(
        during.len() >= 20,
        "the victim was measured during the flood"
    );
    assert!(
        p99 <= P99_BOUND_MS,
        "victim p99 {p99:.2} ms > {P99_BOUND_MS} ms"
    );
    if std::env::var_os("RLD_FLOOD_UNCAPPED").is_some() {
        let (mut during, sources, kinds, _) = flood(1_000_000, 1_000_000);
        let redis = sources.iter().filter(|s| *s == "redis").count();
        eprintln!(
            "flood (uncapped): victim {} CHECKs: p50 {:.2} ms, p99 {:.2} ms, {redis} in Redis; \
             flooders: {} decisions, {} ERR BUSY",
            during.len(),
            percentile(&mut during, 50.0),
            percentile(&mut during, 99.0),
            kinds[0],
            kinds[1]
        );
    }
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
        "[server]\nmax_connections = 100\n[redis]\nmode = \"none\"\n[metrics]\nlisten = {port}\n\
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
