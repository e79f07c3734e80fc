//! A test certificate authority made at run time with the `openssl` command: a server
//! certificate for the Redis nodes, a client certificate for the daemon, a second,
//! unrelated CA (for "wrong CA" tests), and on request expired copies of the server and
//! client certificates. ECDSA P-256 keys: quick to make on a busy machine.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tempfile::TempDir;

/// The CA, certificates and keys, files in a temp dir.
pub struct Pki {
    dir: TempDir,
}

/// Runs `openssl args…` in `dir`; panics with its stderr if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("running openssl (install the openssl package)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];

impl Pki {
    /// Makes `ca.crt`, `server.crt` (SAN `IP:127.0.0.1`, `DNS:redis.test`) and
    /// `client.crt` (extended key usage client auth), each with its key, and
    /// `other-ca.crt`. Panics if openssl fails.
    pub fn new() -> Pki {
        let pki = Pki {
            dir: crate::common::short_tempdir("rld-pki-"),
        };
        let d = pki.dir.path();
        for ca in ["ca", "other-ca"] {
            let subj = format!("/CN=ratelimitd test {ca}");
            let (key, crt) = (format!("{ca}.key"), format!("{ca}.crt"));
            let mut args = vec!["req", "-x509"];
            args.extend(KEY);
            args.extend(["-nodes", "-days", "2", "-subj", &subj]);
            args.extend(["-keyout", &key, "-out", &crt]);
            openssl(d, &args);
        }
        fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:redis.test\n",
        )
        .unwrap();
        fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for (name, cn) in [("server", "redis.test"), ("client", "ratelimitd")] {
            let subj = format!("/CN={cn}");
            let (key, csr) = (format!("{name}.key"), format!("{name}.csr"));
            let mut args = vec!["req"];
            args.extend(KEY);
            args.extend(["-nodes", "-subj", &subj, "-keyout", &key, "-out", &csr]);
            openssl(d, &args);
            pki.sign(name, "2", &format!("{name}.crt"));
        }
        pki
    }

    /// Signs `<name>.csr` with the CA for `days` (negative: expired already) into `out`.
    fn sign(&self, name: &str, days: &str, out: &str) {
        let (csr, ext) = (format!("{name}.csr"), format!("{name}.ext"));
        openssl(
            self.dir.path(),
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                days,
                "-extfile",
                &ext,
                "-out",
                out,
            ],
        );
    }

    /// `<name>-expired.crt`: `name`'s certificate (`server` or `client`, same key and
    /// names, signed by the same CA) whose validity ended a day before it was made.
    pub fn expired(&self, name: &str) -> PathBuf {
        let out = format!("{name}-expired.crt");
        self.sign(name, "-1", &out);
        self.path(&out)
    }

    /// The path of `name` (`ca.crt`, `server.key`, `client.crt`, `other-ca.crt`, …).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
