//! The unit files as shipped: `systemd-analyze verify` says nothing at all about them,
//! and they declare what the daemon relies on (notify, watchdog, reload, hardening).

use super::{tool, units_dir};
use crate::common::*;
use std::fs;
use std::path::Path;
use std::process::Command;

/// `systemd-analyze verify` on both shipped units, failing on any line it prints (it
/// exits 0 on unknown keys and bad values, which it only reports).
///
/// verify also checks that `ExecStart=`/`ExecReload=` binaries exist. Rather than edit
/// the unit, it runs with `--root` on a scratch root holding the unit files exactly as
/// shipped (in /lib/systemd/system, with a copy of the system's own units, which verify
/// needs for sysinit.target and friends), the built daemon as /usr/bin/ratelimitd and
/// /bin/kill — the paths the .deb installs.
#[test]
fn units_pass_systemd_analyze_verify_without_any_warning() {
    let analyze = tool("systemd-analyze");
    let root = short_tempdir("rld-root-");
    let r = root.path();
    let system = r.join("lib/systemd/system");
    fs::create_dir_all(&system).unwrap();
    fs::create_dir_all(r.join("usr/bin")).unwrap();
    fs::create_dir_all(r.join("bin")).unwrap();
    let host_units = ["/lib/systemd/system", "/usr/lib/systemd/system"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("sysinit.target").exists())
        .expect("the system's unit directory (with sysinit.target)");
    for entry in fs::read_dir(host_units).unwrap() {
        let entry = entry.unwrap();
        let ty = entry.file_type().unwrap();
        if ty.is_file() || ty.is_symlink() {
            let target = system.join(entry.file_name());
            if ty.is_symlink() {
                let link = fs::read_link(entry.path()).unwrap();
                std::os::unix::fs::symlink(link, target).unwrap();
            } else {
                fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    for unit in ["ratelimitd.service", "ratelimitd.socket"] {
        fs::copy(units_dir().join(unit), system.join(unit)).unwrap();
    }
    let bin = r.join("usr/bin/ratelimitd");
    fs::hard_link(daemon_bin(), &bin)
        .or_else(|_| fs::copy(daemon_bin(), &bin).map(drop))
        .unwrap();
    fs::copy("/bin/kill", r.join("bin/kill")).unwrap();

    let out = Command::new(&analyze)
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        .args(["ratelimitd.socket", "ratelimitd.service"])
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.trim().is_empty(),
        "systemd-analyze verify: {}\n{text}",
        out.status
    );

    // The check is live: a misspelt key in the same setting is reported.
    let service = fs::read_to_string(system.join("ratelimitd.service")).unwrap();
    fs::write(
        system.join("ratelimitd.service"),
        service.replace("ProtectSystem=strict", "ProtectSystm=strict"),
    )
    .unwrap();
    let out = Command::new(&analyze)
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        .args(["ratelimitd.socket", "ratelimitd.service"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unknown key 'ProtectSystm'"),
        "{out:?}"
    );
}

/// What the unit files promise, checked line by line against what the package documents.
#[test]
fn units_declare_notify_watchdog_reload_and_hardening() {
    let service = fs::read_to_string(units_dir().join("ratelimitd.service")).unwrap();
    let socket = fs::read_to_string(units_dir().join("ratelimitd.socket")).unwrap();
    let lines = |unit: &str| -> Vec<String> {
        unit.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect()
    };
    let service = lines(&service);
    let socket = lines(&socket);
    for want in [
        "Type=notify",
        "ExecReload=/usr/bin/ratelimitd --check --config /etc/ratelimitd/ratelimitd.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "User=ratelimitd",
        // /var/lib/ratelimitd, passed as $STATE_DIRECTORY: where the count of daemons
        // alive (fallback.hosts = "auto") is kept for a start while Redis is down.
        "StateDirectory=ratelimitd",
    ] {
        assert!(service.iter().any(|l| l == want), "service lacks {want}");
    }
    // The socket unit owns /run/ratelimitd: a RuntimeDirectory=ratelimitd in the service
    // would make systemd chown the directory and the socket in it to the service's user
    // on the first activation, locking the clients' group out. The service's own runtime
    // directory is another one (ratelimitd-rls: the Envoy front end's socket).
    let runtime: Vec<&str> = service
        .iter()
        .filter_map(|l| l.strip_prefix("RuntimeDirectory="))
        .flat_map(str::split_whitespace)
        .collect();
    assert!(
        !runtime.contains(&"ratelimitd"),
        "the service must not declare RuntimeDirectory=ratelimitd: {runtime:?}"
    );
    assert_eq!(runtime, ["ratelimitd-rls"], "the Envoy socket's directory");
    assert!(service.iter().any(|l| l.starts_with("WatchdogSec=")));
    for want in [
        "ListenStream=/run/ratelimitd/ratelimitd.sock",
        "SocketMode=0660",
        "SocketGroup=ratelimitd-clients",
    ] {
        assert!(socket.iter().any(|l| l == want), "socket lacks {want}");
    }
    let hardening = [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "LockPersonality=yes",
        "MemoryDenyWriteExecute=yes",
        "SystemCallFilter=@system-service",
        "CapabilityBoundingSet=",
        "UMask=0077",
    ];
    let present: Vec<&&str> = hardening
        .iter()
        .filter(|h| service.iter().any(|l| l == **h))
        .collect();
    assert!(present.len() >= 14, "only {present:?}");
    // The config the package installs serves the socket the socket unit owns.
    let conf =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/ratelimitd.toml"))
            .unwrap();
    assert!(conf.contains("socket = \"/run/ratelimitd/ratelimitd.sock\""));
}
