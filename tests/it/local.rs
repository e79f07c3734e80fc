//! The daemon without Redis (`redis.mode = "none"`, or Redis unreachable): the
//! protocol's every error, exact local limits, ordering, the socket's life cycle and
//! config errors. Real binary, real Unix socket.

use crate::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

const LOCAL: &str = r#"
[server]
max_line_bytes = 512
socket_mode = "0600"

[redis]
mode = "none"

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 10
refill_rate = 0.001

[[rule]]
name = "fast"
algorithm = "token_bucket"
capacity = 5
refill_rate = 2.0
"#;

#[test]
fn every_error_code_keeps_the_connection_open() {
    let d = Daemon::start(LOCAL);
    let mut c = d.connect();
    let cases: &[(&str, &str)] = &[
        ("FETCH api k", "ERR PROTO "),
        ("", "ERR PROTO "),
        (" \t ", "ERR PROTO "),
        ("CHECK api", "ERR PROTO "),
        ("CHECK api k 1 2", "ERR PROTO "),
        ("PING extra", "ERR PROTO "),
        ("CHECK nope k", "ERR RULE "),
        ("CHECK api caf\u{e9}", "ERR KEY "),
        ("CHECK api k -1", "ERR COST "),
        ("CHECK api k 1.5", "ERR COST "),
        ("CHECK api k 1000001", "ERR COST "),
        ("CHECK api k 11", "ERR COST "),
        ("ping", "PONG"),
        ("check api k 0", "ALLOW 10 10 0 0 local"),
    ];
    for (line, want) in cases {
        let got = c.request(line);
        assert!(got.starts_with(want), "{line:?} -> {got:?}, want {want:?}");
    }
    // A key with a control byte, and one of 257 bytes.
    c.send_raw(b"CHECK api k\x01y\n");
    assert!(c.read_line().starts_with("ERR KEY "));
    let long_key = "k".repeat(257);
    assert!(c
        .request(&format!("CHECK api {long_key}"))
        .starts_with("ERR KEY "));
    // An over-long line, sent in pieces, then a working request on the same connection.
    c.send_raw(&[b'x'; 300]);
    c.send_raw(&[b'y'; 300]);
    c.send_raw(b"\r\nCHECK api k\r\n");
    assert!(c.read_line().starts_with("ERR TOO_LONG "));
    assert_eq!(c.read_line(), "ALLOW 10 9 1000000 0 local 10000000");
    // QUIT says BYE and closes.
    assert_eq!(c.request("QUIT"), "BYE");
    assert_eq!(c.read_line(), "", "connection must be closed after BYE");
}

#[test]
fn mode_none_enforces_exact_limits() {
    let d = Daemon::start(LOCAL);
    let mut c = d.connect();
    for i in 0..10 {
        let r = parse_reply(&c.request("CHECK api user:1"));
        assert_eq!(
            (r.verdict.as_str(), r.limit, r.remaining),
            ("ALLOW", 10, 9 - i)
        );
        assert_eq!(r.source, "local");
    }
    for _ in 0..5 {
        let r = parse_reply(&c.request("CHECK api user:1"));
        assert_eq!((r.verdict.as_str(), r.remaining), ("DENY", 0));
        // 1 token at 0.001 tokens/s.
        assert!((999_000..=1_000_000).contains(&r.wait_ms), "{r:?}");
    }
    // Other keys have their own bucket; cost counts units.
    let r = parse_reply(&c.request("CHECK api user:2 7"));
    assert_eq!((r.verdict.as_str(), r.remaining), ("ALLOW", 3));
    let r = parse_reply(&c.request("CHECK api user:2 4"));
    assert_eq!((r.verdict.as_str(), r.remaining), ("DENY", 3));

    // wait_ms is the refill rate: 1 token at 2/s is 500 ms; after waiting it, allowed.
    for _ in 0..5 {
        assert!(c.request("CHECK fast k").starts_with("ALLOW"));
    }
    let r = parse_reply(&c.request("CHECK fast k"));
    assert_eq!(r.verdict, "DENY");
    assert!((450..=500).contains(&r.wait_ms), "{r:?}");
    std::thread::sleep(Duration::from_millis(r.wait_ms));
    assert!(c.request("CHECK fast k").starts_with("ALLOW"));
}

#[test]
fn hundreds_of_pipelined_mixed_requests_answer_in_order() {
    let d = Daemon::start(LOCAL);
    let mut c = d.connect();
    let mut lines = Vec::new();
    let mut want = Vec::new();
    for i in 0..600 {
        match i % 6 {
            0 => {
                lines.push(format!("CHECK api k{i}"));
                want.push("ALLOW 10 9 1000000 0 local".to_string());
            }
            1 => {
                lines.push("PING".into());
                want.push("PONG".into());
            }
            2 => {
                lines.push(format!("CHECK missing k{i}"));
                want.push("ERR RULE".into());
            }
            3 => {
                lines.push(format!("CHECK api k{} 3", i - 3));
                want.push("ALLOW 10 6 ".into());
            }
            4 => {
                lines.push("".into());
                want.push("ERR PROTO".into());
            }
            _ => {
                lines.push(format!("CHECK api k{} 0", i - 5));
                want.push("ALLOW 10 6 ".into());
            }
        }
    }
    let got = c.pipeline(&lines);
    assert_eq!(got.len(), lines.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.starts_with(w.as_str()),
            "reply {i} to {:?}: {g:?}, want {w:?}",
            lines[i]
        );
    }
}

#[test]
fn sigterm_answers_what_was_sent_removes_the_socket_and_exits_zero() {
    let mut d = Daemon::start(LOCAL);
    assert_eq!(
        std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777,
        0o600,
        "server.socket_mode"
    );
    let mut c = d.connect();
    let lines: Vec<String> = (0..200).map(|i| format!("CHECK api s{i}")).collect();
    c.send_raw(lines.join("\n").as_bytes());
    c.send_raw(b"\n");
    std::thread::sleep(Duration::from_millis(100));
    d.signal(libc::SIGTERM);
    for i in 0..200 {
        let r = c.read_line();
        assert!(r.starts_with("ALLOW"), "reply {i}: {r:?}");
    }
    assert_eq!(c.read_line(), "", "connection closed after the last reply");
    let status = d
        .wait_exit(Duration::from_secs(10))
        .expect("daemon exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", d.log());
    assert!(!d.socket.exists(), "socket file removed");
}

/// Runs the binary on a config file, returns (exit code, stderr).
fn run_binary(args: &[&str], timeout: Duration) -> (Option<i32>, String) {
    let out_dir = short_tempdir("rl-run");
    let log = out_dir.path().join("out.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(daemon_bin())
        .args(args)
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let code = wait_child(&mut child, timeout).and_then(|s| s.code());
    (code, std::fs::read_to_string(&log).unwrap_or_default())
}

/// Waits up to `timeout` for `child` to exit; kills and reaps it if it does not.
fn wait_child(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn misspelt_field_is_refused_naming_the_field_and_line() {
    let dir = short_tempdir("rl-cfg");
    let path = dir.path().join("bad.toml");
    let bad = LOCAL.replace("refill_rate = 2.0", "refil_rate = 2.0");
    std::fs::write(&path, &bad).unwrap();
    let (code, out) = run_binary(
        &["--config", path.to_str().unwrap()],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("refil_rate") && out.contains("line 19"),
        "{out}"
    );
    let (code, out) = run_binary(
        &["--config", path.to_str().unwrap(), "--check"],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{out}");
    // The shipped example is valid.
    let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/ratelimitd.toml");
    let (code, out) = run_binary(&["--config", conf, "--check"], Duration::from_secs(10));
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn stale_socket_is_replaced_but_a_live_daemon_is_not() {
    let dir = short_tempdir("rl-stale");
    let socket = dir.path().join("rl.sock");
    let path = dir.path().join("rl.toml");
    std::fs::write(&path, config_with_socket(LOCAL, &socket)).unwrap();
    let cfg = path.to_str().unwrap();

    let mut first = Command::new(daemon_bin())
        .args(["--config", cfg])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    }));
    // A second daemon on the same socket refuses to start and leaves the first alone.
    let (code, out) = run_binary(&["--config", cfg], Duration::from_secs(10));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("another daemon"), "{out}");
    assert_eq!(Client::connect(&socket).request("PING"), "PONG");
    // Killed hard, the first leaves a stale socket file behind; the next start replaces it.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(socket.exists());
    let mut second = Command::new(daemon_bin())
        .args(["--config", cfg])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    let reply = up.then(|| Client::connect(&socket).request("PING"));
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(reply.as_deref(), Some("PONG"));
}

#[test]
fn starts_and_serves_locally_when_redis_is_unreachable() {
    let port = free_port();
    let config = format!(
        r#"
[redis]
mode = "cluster"
nodes = ["127.0.0.1:{port}"]
timeout_ms = 25

[fallback]
hosts = 2

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 10
refill_rate = 0.001
"#
    );
    let d = Daemon::start(&config);
    let mut c = d.connect();
    let replies: Vec<Reply> = (0..8)
        .map(|_| parse_reply(&c.request("CHECK api u")))
        .collect();
    assert!(replies.iter().all(|r| r.source == "local"), "{replies:?}");
    // limit ÷ hosts = 5 admitted.
    assert_eq!(
        replies.iter().filter(|r| r.allowed()).count(),
        5,
        "{replies:?}"
    );
    assert_eq!(replies[0].limit, 10, "limit is the rule's capacity");
    assert!(
        d.log().contains("Redis unreachable at start"),
        "{}",
        d.log()
    );
}

#[test]
fn sighup_reloads_rules_and_keeps_them_on_a_broken_file() {
    let d = Daemon::start(LOCAL);
    let mut c = d.connect();
    assert!(c.request("CHECK api r1").starts_with("ALLOW 10 9 "));
    // A changed limit applies to new decisions; the connection stays open.
    d.write_config(&LOCAL.replace("capacity = 10", "capacity = 3"));
    d.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(5), || c
            .request("CHECK api r2")
            .starts_with("ALLOW 3 ")),
        "{}",
        d.log()
    );
    // A broken file is logged with its field, and the rules in force stay.
    d.write_config(&LOCAL.replace("capacity = 10", "capacity = -1"));
    d.signal(libc::SIGHUP);
    assert!(wait_until(Duration::from_secs(5), || d
        .log()
        .contains("old one stays")));
    assert!(d.log().contains("capacity"), "{}", d.log());
    assert!(c.request("CHECK api r3").starts_with("ALLOW 3 2 "));
}

#[test]
fn sigterm_during_start_up_exits_zero() {
    let port = free_port();
    let dir = short_tempdir("rl-early");
    let socket = dir.path().join("rl.sock");
    let path = dir.path().join("rl.toml");
    let config = format!("[redis]\nmode = \"cluster\"\nnodes = [\"127.0.0.1:{port}\"]\n");
    std::fs::write(&path, config_with_socket(&config, &socket)).unwrap();
    let mut child = Command::new(daemon_bin())
        .args(["--config", path.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Redis is unreachable, so the daemon is still waiting for it (up to 1.5 s).
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_child(&mut child, Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    assert!(!socket.exists());
}

/// `--check` also reads the files the config names: a missing password file or CA
/// file fails it (exit 2) naming the field and the path, as the daemon's start would.
#[test]
fn check_reads_the_password_and_tls_files() {
    let dir = short_tempdir("rl-check");
    let path = dir.path().join("rl.toml");
    let missing = dir.path().join("no-such-file");
    let run = |redis: &str| {
        std::fs::write(&path, format!("[redis]\nmode = \"standalone\"\nnodes = [\"127.0.0.1:1\"]\n{redis}\n[[rule]]\nname = \"r\"\nalgorithm = \"token_bucket\"\ncapacity = 5\nrefill_rate = 1.0\n")).unwrap();
        run_binary(
            &["--config", path.to_str().unwrap(), "--check"],
            Duration::from_secs(10),
        )
    };
    let shown = missing.display().to_string();
    let (code, out) = run(&format!("password_file = \"{shown}\""));
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("redis.password_file") && out.contains(&shown),
        "{out}"
    );
    let (code, out) = run(&format!("tls = true\ntls_ca_file = \"{shown}\""));
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("tls_ca_file") && out.contains(&shown), "{out}");
    // A readable password file passes (mode 0600: no warning).
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "secret-value\n").unwrap();
    std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (code, out) = run(&format!("password_file = \"{}\"", pw.display()));
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("secret-value"), "{out}");
}
