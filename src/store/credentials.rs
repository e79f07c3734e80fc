//! Redis credentials: the ACL user named in the config and its password, read from a
//! file or from the systemd credential `redis-password`, never from the config itself.
//!
//! The password is read again at every connection (fred asks this provider before each
//! `AUTH`/`HELLO`), so a rotated password file takes effect at the next reconnect, and a
//! reload (SIGHUP) after a fix forces that reconnect at once. Nothing here is ever
//! formatted into a log line: `Debug` shows where the password comes from, not what it is.
//!
//! Sentinels may have credentials of their own (`sentinel_username`,
//! `sentinel_password_file`); fred asks with the sentinel as `server`, and the
//! sentinel's are returned for the configured sentinel hosts.

use fred::error::{Error, ErrorKind};
use fred::types::config::{CredentialProvider, Server};
use futures::future::BoxFuture;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The systemd credential a unit passes with `LoadCredential=redis-password:<file>`.
pub const SYSTEMD_CREDENTIAL: &str = "redis-password";

/// The largest password file read, bytes (a Redis password is a line of text).
const MAX_PASSWORD_BYTES: u64 = 4096;

/// Who the daemon is to Redis (and to the sentinels): names and password files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The ACL user (`redis.username`); `None`: Redis' `default` user.
    pub username: Option<String>,
    /// Where the password is read from; `None`: no password.
    pub password_file: Option<PathBuf>,
    /// The sentinels' user, if they have their own.
    pub sentinel_username: Option<String>,
    /// The sentinels' password file, if they have their own.
    pub sentinel_password_file: Option<PathBuf>,
    /// `host:port` of the sentinels (to tell a sentinel from a data node).
    pub sentinels: Vec<(String, u16)>,
}

impl Credentials {
    /// Resolves the password's source: `password_file` when set, else the systemd
    /// credential `redis-password` when the unit passed one (`$CREDENTIALS_DIRECTORY`),
    /// else none.
    pub fn resolve_password_file(configured: Option<&Path>) -> Option<PathBuf> {
        if let Some(path) = configured {
            return Some(path.to_owned());
        }
        let dir = std::env::var_os("CREDENTIALS_DIRECTORY")?;
        let path = Path::new(&dir).join(SYSTEMD_CREDENTIAL);
        path.exists().then_some(path)
    }

    /// Reads every password once, at start-up and on reload, so that a missing or
    /// unreadable file is reported with its path before any connection is tried.
    /// Returns warnings to log (a password file that other users can read).
    ///
    /// # Errors
    /// A message naming the file and what is wrong with it.
    pub fn check(&self) -> Result<Vec<String>, String> {
        let mut warnings = Vec::new();
        for (field, path) in [
            ("redis.password_file", &self.password_file),
            ("redis.sentinel_password_file", &self.sentinel_password_file),
        ] {
            let Some(path) = path else { continue };
            read_password(path).map_err(|e| format!("{field}: {e}"))?;
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.permissions().mode() & 0o007 != 0 {
                    warnings.push(format!(
                        "{field}: {} is readable by other users (mode {:04o}); chmod 0640 it",
                        path.display(),
                        meta.permissions().mode() & 0o7777
                    ));
                }
            }
        }
        Ok(warnings)
    }

    /// True when anything is configured to authenticate with.
    pub fn any(&self) -> bool {
        self.username.is_some()
            || self.password_file.is_some()
            || self.sentinel_username.is_some()
            || self.sentinel_password_file.is_some()
    }

    fn is_sentinel(&self, server: &Server) -> bool {
        self.sentinels
            .iter()
            .any(|(host, port)| *port == server.port && host.as_str() == &*server.host)
    }
}

/// The password in `path`: its first line, without the line ending.
///
/// # Errors
/// A message naming the path: missing, unreadable, too large, not UTF-8, or empty.
pub fn read_password(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if meta.len() > MAX_PASSWORD_BYTES {
        return Err(format!(
            "{shown} is {} bytes; a password file holds one line",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let password = text.lines().next().unwrap_or("").trim_end_matches('\r');
    if password.is_empty() {
        return Err(format!("{shown} is empty"));
    }
    Ok(password.to_owned())
}

/// What [`CredentialProvider::fetch`] yields: the user name and the password.
type Fetched = Result<(Option<String>, Option<String>), Error>;

impl Credentials {
    /// The user name and password for `server`: the sentinels' own when `server` is a
    /// configured sentinel and they have any, else the data nodes'. The password file is
    /// read now, so a rotated password is used at the next connection.
    fn fetch_now(&self, server: Option<&Server>) -> Fetched {
        let sentinel = server.is_some_and(|s| self.is_sentinel(s))
            && (self.sentinel_username.is_some() || self.sentinel_password_file.is_some());
        let (username, file) = if sentinel {
            (&self.sentinel_username, &self.sentinel_password_file)
        } else {
            (&self.username, &self.password_file)
        };
        let password = match file {
            Some(path) => Some(read_password(path).map_err(|e| Error::new(ErrorKind::Auth, e))?),
            None => None,
        };
        Ok((username.clone(), password))
    }
}

impl CredentialProvider for Credentials {
    // fred declares `fetch` with `#[async_trait]` (it keeps the provider as
    // `Arc<dyn CredentialProvider>`): this is that macro's signature written out, a boxed
    // future. Reading the file does not wait on anything, so the future is ready at once.
    fn fetch<'s, 'a, 'f>(&'s self, server: Option<&'a Server>) -> BoxFuture<'f, Fetched>
    where
        's: 'f,
        'a: 'f,
        Self: 'f,
    {
        Box::pin(std::future::ready(self.fetch_now(server)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_first_line_and_names_the_file_on_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret\r\nignored\n").unwrap();
        assert_eq!(read_password(&path).unwrap(), "s3cret");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_password(&path).unwrap_err().contains("is empty"));
        let missing = dir.path().join("nope");
        assert!(read_password(&missing).unwrap_err().contains("nope"));
    }

    #[test]
    fn warns_about_a_world_readable_password_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "x\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let creds = Credentials {
            password_file: Some(path.clone()),
            ..Credentials::default()
        };
        assert_eq!(creds.check().unwrap().len(), 1);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(creds.check().unwrap().is_empty());
    }

    #[test]
    fn debug_never_shows_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "hunter2\n").unwrap();
        let creds = Credentials {
            username: Some("rl".into()),
            password_file: Some(path),
            ..Credentials::default()
        };
        assert!(!format!("{creds:?}").contains("hunter2"));
    }
}
