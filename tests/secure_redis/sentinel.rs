//! One Redis primary, one replica (both with the ACL file) and three sentinels that
//! require a password of their own: the Sentinel deployment of the failover tests.

use super::{cli, start_server, write_acl, Proc, ADMIN_PASSWORD, ADMIN_USER};
use crate::common::{free_port, wait_until};
use std::time::Duration;
use tempfile::TempDir;

/// One primary, one replica (both with the ACL file) and three sentinels that require
/// a password of their own. The service is called `mymaster`.
pub struct SentinelSet {
    data: Vec<(u16, Option<Proc>)>,
    sentinels: Vec<(u16, Proc)>,
    dir: TempDir,
}

/// The sentinels' own password.
pub const SENTINEL_PASSWORD: &str = "sentinel-secret";

impl SentinelSet {
    /// Starts primary, replica and sentinels, and waits until the sentinels know the
    /// replica and each other.
    pub fn start() -> SentinelSet {
        let dir = crate::common::short_tempdir("rld-sent-");
        let acl = dir.path().join("users.acl");
        write_acl(&acl);
        let mut data = Vec::new();
        let primary_port = free_port();
        for i in 0..2 {
            let port = if i == 0 { primary_port } else { free_port() };
            let d = dir.path().join(format!("data{i}"));
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\naclfile {acl}\ndir {d}\nlogfile {d}/redis.log\n\
                 save \"\"\nappendonly no\nmasteruser {ADMIN_USER}\nmasterauth {ADMIN_PASSWORD}\n\
                 repl-diskless-sync yes\nrepl-diskless-sync-delay 0\n",
                acl = acl.display(),
                d = d.display()
            );
            if i == 1 {
                conf.push_str(&format!("replicaof 127.0.0.1 {primary_port}\n"));
            }
            data.push((port, Some(start_server(&d, &conf, false))));
        }
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let d = dir.path().join(format!("sentinel{i}"));
            let conf = format!(
                "port {port}\nbind 127.0.0.1\ndir {d}\nlogfile {d}/sentinel.log\n\
                 requirepass {SENTINEL_PASSWORD}\nsentinel sentinel-pass {SENTINEL_PASSWORD}\n\
                 sentinel monitor mymaster 127.0.0.1 {primary_port} 2\n\
                 sentinel auth-user mymaster {ADMIN_USER}\nsentinel auth-pass mymaster {ADMIN_PASSWORD}\n\
                 sentinel down-after-milliseconds mymaster 1000\n\
                 sentinel failover-timeout mymaster 5000\n",
                d = d.display()
            );
            sentinels.push((port, start_server(&d, &conf, true)));
        }
        let s = SentinelSet {
            data,
            sentinels,
            dir,
        };
        assert!(
            wait_until(Duration::from_secs(20), || s.sentinels.iter().all(
                |(p, _)| {
                    let info = s.sentinel_cli(*p, &["SENTINEL", "REPLICAS", "mymaster"]);
                    info.contains("slave") || info.contains("replica")
                }
            )),
            "the sentinels never saw the replica"
        );
        s
    }

    /// `127.0.0.1:PORT` of the sentinels.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// `redis-cli` to sentinel `port` with its password.
    pub fn sentinel_cli(&self, port: u16, args: &[&str]) -> String {
        let conn = vec![
            "-p".into(),
            port.to_string(),
            "-a".into(),
            SENTINEL_PASSWORD.into(),
            "--no-auth-warning".into(),
        ];
        cli(&conn, args)
    }

    /// The port the sentinels currently name as the primary.
    pub fn primary_port(&self) -> Option<u16> {
        let out = self.sentinel_cli(
            self.sentinels[0].0,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"],
        );
        out.lines().nth(1).and_then(|l| l.trim().parse().ok())
    }

    /// Kills (SIGKILL) the data node listening on `port`.
    pub fn kill_data(&mut self, port: u16) {
        for (p, proc_) in &mut self.data {
            if *p == port {
                proc_.take();
            }
        }
    }
}
