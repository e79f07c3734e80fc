//! `ratelimitd ctl`: the operator verbs from a shell, against a real daemon: readable
//! text by default, JSON with `--json`, the socket found from `--socket` or from
//! `--config`; a refusal (`ERR …`) goes to stderr with exit status 1, a bad argument
//! exits 2.

use crate::common;
use crate::permissions::{skip_unless_root, start, NOBODY};

use common::*;
use serde_json::Value;
use std::process::{Command, Output};

const CONFIG: &str = r#"
[server]
socket_mode = "0666"

[redis]
mode = "none"

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 10
refill_rate = 0.001

[[rule]]
name = "daily"
algorithm = "fixed_window"
limit = 5
window = "1d"
"#;

/// `ratelimitd ctl ARGS...`: its exit code, stdout and stderr.
fn ctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(daemon_bin())
        .arg("ctl")
        .args(args)
        .output()
        .expect("ratelimitd ctl");
    decode(out)
}

fn decode(out: Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ctl_speaks_each_verb_as_text_and_json() {
    let d = Daemon::start(CONFIG);
    let socket = d.socket.display().to_string();
    let mut c = d.connect();
    for _ in 0..4 {
        c.request("CHECK api user:1");
    }
    c.request("CHECK api user:2");

    // inspect, found through --config's server.socket.
    let config = d.config_path().display().to_string();
    let (code, out, err) = ctl(&["--config", &config, "inspect", "api", "user:1"]);
    assert_eq!(code, 0, "{err}");
    let line = |name: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in:\n{out}"))
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string()
    };
    assert_eq!(
        (line("remaining"), line("source")),
        ("6".into(), "local".into())
    );
    assert_eq!(line("param.capacity"), "10");
    let (code, out, _) = ctl(&["inspect", "api", "user:1", "--socket", &socket, "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(
        (v["remaining"].as_u64(), v["verdict"].as_str()),
        (Some(6), Some("ALLOW"))
    );

    // top: text and JSON.
    let (code, out, _) = ctl(&["--socket", &socket, "top", "api", "5"]);
    assert_eq!(code, 0);
    let rows: Vec<&str> = out.lines().skip(2).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(
        rows[0].split_whitespace().collect::<Vec<_>>(),
        ["4", "0", "user:1"]
    );
    let (_, out, _) = ctl(&["--socket", &socket, "--json", "top", "api"]);
    let v: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(v["keys"][1]["key"], "user:2");

    // rules: one line per rule; JSON as the daemon sends it.
    let (code, out, _) = ctl(&["--socket", &socket, "rules"]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("api ") && lines[0].contains("capacity=10"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("daily ") && lines[1].contains("window=1day"),
        "{out}"
    );
    let (_, out, _) = ctl(&["--socket", &socket, "rules", "--json"]);
    let v: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(v["rules"][1]["limit"], 5);

    // reset, then the key is fresh.
    let (code, out, _) = ctl(&["--socket", &socket, "reset", "api", "user:1"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("reset: user:1 under api"), "{out}");
    let r = parse_reply(&c.request("CHECK api user:1"));
    assert_eq!(r.remaining, 9);

    // override: sent as the verb (this daemon keeps no Redis, so it refuses it).
    let (code, _, err) = ctl(&[
        "--socket",
        &socket,
        "override",
        "api",
        "user:1",
        "capacity=3",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("ERR PARAM ") && err.contains("redis.mode"),
        "{err}"
    );

    // Refusals and bad arguments.
    let (code, _, err) = ctl(&["--socket", &socket, "top", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("ERR RULE "), "{err}");
    let (code, _, err) = ctl(&["--socket", &socket, "inspect", "api", "two words"]);
    assert_eq!(code, 2);
    assert!(err.contains("printable ASCII"), "{err}");
    let (code, _, err) = ctl(&["--socket", "/nonexistent/rl.sock", "rules"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/rl.sock"), "{err}");
}

#[test]
fn ctl_as_a_uid_not_in_admin_uids_is_refused() {
    if skip_unless_root() {
        return;
    }
    use std::os::unix::process::CommandExt;
    let d = start(CONFIG);
    let out = Command::new(daemon_bin())
        .args(["ctl", "--socket"])
        .arg(&d.socket)
        .arg("rules")
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("ratelimitd ctl as nobody");
    let (code, _, err) = decode(out);
    assert_eq!(code, 1);
    assert!(
        err.contains("ERR PERM ") && err.contains("server.admin_uids"),
        "{err}"
    );
}
