//! Tests of the integration-test harness itself (tests/common); no daemon.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

fn assert_pids_gone(pids: &[u32]) {
    for &pid in pids {
        assert!(
            wait_until(Duration::from_secs(2), || !pid_alive(pid)),
            "pid {pid} still alive"
        );
    }
}

#[test]
fn cluster_start_kill_restart() {
    let t0 = Instant::now();
    let mut cluster = RedisCluster::start();
    let start_time = t0.elapsed();
    eprintln!("RedisCluster::start() took {start_time:?}");

    let addrs = cluster.addrs();
    assert_eq!(addrs.len(), 6);
    assert_eq!(cluster.primary_addrs().len(), 3);
    assert_eq!(cluster.replica_addrs().len(), 3);
    for a in &addrs {
        let info = cluster.cli(a, &["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{a}: {info}");
    }

    // A hash-tagged key through redis-cli -c, written via one node and read
    // via every node (redirects followed).
    assert_eq!(
        cluster.cli(&addrs[0], &["-c", "SET", "{harness}:k", "v1"]),
        "OK"
    );
    for a in &addrs {
        assert_eq!(
            cluster.cli(a, &["-c", "GET", "{harness}:k"]),
            "v1",
            "via {a}"
        );
    }
    assert_eq!(cluster.all_keys(), vec!["{harness}:k".to_string()]);
    // Keys spread over slots of different primaries all show up.
    for i in 0..20 {
        let k = format!("{{t{i}}}:x");
        assert_eq!(cluster.cli(&addrs[1], &["-c", "SET", &k, "1"]), "OK");
    }
    assert_eq!(cluster.all_keys().len(), 21);
    let per_primary: Vec<String> = cluster
        .primary_addrs()
        .iter()
        .map(|p| cluster.cli(p, &["DBSIZE"]))
        .collect();
    assert!(
        per_primary.iter().filter(|n| *n != "0").count() >= 2,
        "keys should land on several primaries: {per_primary:?}"
    );

    // kill_all: every pid gone, every port refuses.
    let pids: Vec<u32> = cluster.pids().into_iter().map(Option::unwrap).collect();
    let t0 = Instant::now();
    cluster.kill_all();
    eprintln!("kill_all() took {:?}", t0.elapsed());
    assert_pids_gone(&pids);
    assert!(cluster.pids().iter().all(Option::is_none));
    for a in &addrs {
        let port: u16 = a.rsplit(':').next().unwrap().parse().unwrap();
        assert!(port_refuses(port), "{a} still accepts connections");
    }

    // restart_all: same addresses, healthy again, no data.
    let t0 = Instant::now();
    cluster.restart_all();
    eprintln!("restart_all() took {:?}", t0.elapsed());
    assert_eq!(cluster.addrs(), addrs);
    for a in &addrs {
        let info = cluster.cli(a, &["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{a}: {info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{a}: {info}");
    }
    assert_eq!(cluster.primary_addrs().len(), 3);
    assert!(cluster.all_keys().is_empty(), "{:?}", cluster.all_keys());
    assert_eq!(cluster.cli(&addrs[3], &["-c", "GET", "{harness}:k"]), "");
    assert_eq!(
        cluster.cli(&addrs[4], &["-c", "SET", "{harness}:k", "v2"]),
        "OK"
    );
    assert_eq!(cluster.all_keys(), vec!["{harness}:k".to_string()]);

    // Drop kills everything.
    let pids: Vec<u32> = cluster.pids().into_iter().map(Option::unwrap).collect();
    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    assert_pids_gone(&pids);
    assert!(!dir.exists(), "temp dir {} not removed", dir.display());
}

#[test]
fn standalone_ping_kill_restart() {
    let t0 = Instant::now();
    let mut redis = RedisStandalone::start();
    eprintln!("RedisStandalone::start() took {:?}", t0.elapsed());
    assert_eq!(redis.cli(&["PING"]), "PONG");
    assert_eq!(
        redis_text(&redis.addr(), &["PING"]).unwrap(),
        "PONG",
        "RESP helper"
    );
    assert_eq!(redis.cli(&["SET", "a", "1"]), "OK");
    assert_eq!(redis.cli(&["GET", "a"]), "1");

    let pid = redis.pid().unwrap();
    redis.kill();
    assert_pids_gone(&[pid]);
    assert!(port_refuses(redis.port()));
    assert_eq!(redis.cli(&["PING"]), "", "redis-cli output when down");

    redis.restart();
    assert_eq!(redis.cli(&["PING"]), "PONG");
    assert_eq!(redis.cli(&["GET", "a"]), "", "no persistence");
    let pid = redis.pid().unwrap();
    drop(redis);
    assert_pids_gone(&[pid]);
}

#[test]
fn panicking_test_leaves_no_process() {
    let (tx, rx) = std::sync::mpsc::channel();
    let res = std::thread::spawn(move || {
        let redis = RedisStandalone::start();
        tx.send(redis.pid().unwrap()).unwrap();
        panic!("deliberate panic with a server running");
    })
    .join();
    assert!(res.is_err());
    let pid = rx.recv().unwrap();
    assert_pids_gone(&[pid]);
}

#[test]
fn config_socket_insertion() {
    let sock = Path::new("/tmp/x y/rl.sock");
    let with = "# c\n[server]\nmax_line_bytes = 64\n\n[redis]\nmode = \"none\"\n";
    assert_eq!(
        config_with_socket(with, sock),
        "# c\n[server]\nsocket = \"/tmp/x y/rl.sock\"\nmax_line_bytes = 64\n\n[redis]\nmode = \"none\"\n"
    );
    let header_with_comment =
        "[redis]\nmode = \"none\"\n[ server ] # the server\nsocket_mode = \"0600\"";
    assert_eq!(
        config_with_socket(header_with_comment, sock),
        "[redis]\nmode = \"none\"\n[ server ] # the server\nsocket = \"/tmp/x y/rl.sock\"\nsocket_mode = \"0600\""
    );
    let without = "[redis]\nmode = \"none\"\n\n[[rule]]\nname = \"r\"\n";
    assert_eq!(
        config_with_socket(without, sock),
        format!("[server]\nsocket = \"/tmp/x y/rl.sock\"\n\n{without}")
    );
    assert_eq!(
        toml_str_array(&["127.0.0.1:1".to_string(), "a\"b".to_string()]),
        r#"["127.0.0.1:1", "a\"b"]"#
    );
    // [[server]] or [server.x] are not the [server] header.
    let tricky = "[server.tls]\na = 1\n";
    assert!(config_with_socket(tricky, sock).starts_with("[server]\nsocket ="));
}

#[test]
#[should_panic(expected = "must not set server.socket")]
fn config_with_socket_rejects_socket_key() {
    config_with_socket("[server]\nsocket = \"/a\"\n", Path::new("/b"));
}

#[test]
fn reply_parsing() {
    assert_eq!(
        parse_reply("ALLOW 20 19 100 0 redis"),
        Reply {
            verdict: "ALLOW".into(),
            limit: 20,
            remaining: 19,
            reset_ms: 100,
            wait_ms: 0,
            source: "redis".into()
        }
    );
    let r = parse_reply("DENY 20 0 1900 100 cache future fields");
    assert_eq!(
        (r.verdict.as_str(), r.wait_ms, r.source.as_str()),
        ("DENY", 100, "cache")
    );
    assert!(!r.allowed());
    for bad in [
        "",
        "PONG",
        "ERR PROTO empty line",
        "ALLOW 20 19 100 0",
        "ALLOW 20 -1 100 0 redis",
        "ALLOW 20 19 100 0 somewhere",
        "allow 20 19 100 0 redis",
        "ALLOW  20 19 100 0 redis",
        "ALLOW 20 19 1.5 0 redis",
    ] {
        assert!(try_parse_reply(bad).is_none(), "{bad:?}");
    }
    let caught = std::panic::catch_unwind(|| parse_reply("ERR RULE nope"));
    assert!(caught.is_err());
}

/// A fake line server on a Unix socket: one "ALLOW …" reply per line read.
fn fake_line_server(path: &Path) -> std::thread::JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut w = stream.try_clone().unwrap();
        let mut out = std::io::BufWriter::new(&mut w);
        for (i, line) in BufReader::new(stream).lines().enumerate() {
            let line = line.unwrap();
            if line == "QUIT" {
                writeln!(out, "BYE").unwrap();
                break;
            }
            writeln!(out, "ALLOW 100 {i} 0 0 redis {line}").unwrap();
            out.flush().unwrap();
        }
    })
}

#[test]
fn client_request_and_large_pipeline() {
    let dir = short_tempdir("rld-fake-");
    let path = dir.path().join("s.sock");
    let server = fake_line_server(&path);
    let mut c = Client::connect(&path);
    assert_eq!(c.request("hello"), "ALLOW 100 0 0 0 redis hello");
    // Big enough to overflow the socket buffers both ways: must not deadlock.
    let lines: Vec<String> = (0..50_000).map(|i| format!("CHECK r k{i}")).collect();
    let replies = c.pipeline(&lines);
    assert_eq!(replies.len(), lines.len());
    for (i, r) in replies.iter().enumerate() {
        let p = parse_reply(r);
        assert_eq!(p.remaining, i as u64 + 1);
        assert!(r.ends_with(&lines[i]));
    }
    assert_eq!(c.request("QUIT"), "BYE");
    assert_eq!(c.read_line(), "", "EOF after BYE");
    server.join().unwrap();
}

#[test]
fn wait_until_polls() {
    let t0 = Instant::now();
    let mut n = 0;
    assert!(wait_until(Duration::from_secs(5), || {
        n += 1;
        n == 5
    }));
    assert!(t0.elapsed() < Duration::from_secs(1));
    let t0 = Instant::now();
    assert!(!wait_until(Duration::from_millis(50), || false));
    assert!(t0.elapsed() >= Duration::from_millis(50));
}

/// A stand-in daemon (bash + socat) with the same `--config <file>`
/// interface: exercises Daemon's start/connect/signal/wait_exit/drop.
fn fake_daemon(dir: &Path, body: &str) -> std::path::PathBuf {
    let path = dir.join("fake-daemon");
    std::fs::write(&path, format!("#!/usr/bin/env bash\nset -eu\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

const FAKE_SERVE: &str = r#"[ "$1" = --config ] || exit 2
sock=$(sed -n 's/^socket = "\(.*\)"$/\1/p' "$2")
echo "fake daemon: socket=$sock RUST_LOG=$RUST_LOG EXTRA=${EXTRA:-}"
exec socat UNIX-LISTEN:"$sock",fork SYSTEM:'while read -r l; do echo PONG; done'"#;

fn have_socat() -> bool {
    std::process::Command::new("socat")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn daemon_wrapper_with_fake_daemon() {
    assert!(
        have_socat(),
        "socat is needed (bash tests/run.sh installs it)"
    );
    let bin_dir = short_tempdir("rld-fakebin-");
    let prog = fake_daemon(bin_dir.path(), FAKE_SERVE);
    let config = "[redis]\nmode = \"none\"\n";
    let mut d = Daemon::start_with(&prog, &[("EXTRA", "x1")], config);
    let written = std::fs::read_to_string(d.config_path()).unwrap();
    assert!(written.starts_with(&format!("[server]\nsocket = \"{}\"\n", d.socket.display())));
    let mut c = d.connect();
    assert_eq!(c.request("PING"), "PONG");
    let p = c.pipeline(&["PING".to_string(), "PING".to_string()]);
    assert_eq!(p, vec!["PONG", "PONG"]);
    let log = d.log();
    assert!(log.contains("EXTRA=x1"), "{log}");
    if std::env::var_os("RUST_LOG").is_none() {
        assert!(log.contains("RUST_LOG=info"), "{log}");
    }

    d.write_config("[server]\nmax_line_bytes = 10\n");
    let rewritten = std::fs::read_to_string(d.config_path()).unwrap();
    assert!(rewritten.contains("max_line_bytes = 10"));
    assert!(rewritten.contains(&d.socket.display().to_string()));

    let pid = d.pid();
    assert!(d.wait_exit(Duration::from_millis(50)).is_none());
    d.signal(libc::SIGTERM);
    let status = d.wait_exit(Duration::from_secs(5)).expect("exited");
    eprintln!("fake daemon exit status after SIGTERM: {status:?}");
    assert!(!pid_alive(pid));
    d.signal(libc::SIGTERM); // no-op after exit

    // Drop of a running daemon kills it.
    let d = Daemon::start_with(&prog, &[], config);
    let pid = d.pid();
    drop(d);
    assert!(!pid_alive(pid));
}

#[test]
fn daemon_wrapper_reports_early_exit() {
    let bin_dir = short_tempdir("rld-fakebin-");
    let prog = fake_daemon(
        bin_dir.path(),
        "echo 'error: unknown field `bogus` at line 3' >&2\nexit 3",
    );
    let (status, log) =
        Daemon::run_to_exit_with(&prog, &[], "[x]\nbogus = 1\n", Duration::from_secs(5));
    assert_eq!(status.code(), Some(3));
    assert!(log.contains("unknown field `bogus`"), "{log}");

    let caught = std::panic::catch_unwind(|| Daemon::start_with(&prog, &[], "[x]\n"));
    let msg = caught.err().expect("start must panic");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("exited with") && msg.contains("unknown field"),
        "{msg}"
    );
}
