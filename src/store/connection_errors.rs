//! What went wrong connecting to Redis, said once per cause instead of once per retry.
//!
//! fred reconnects every 100 ms while a node refuses the daemon; each failed attempt is
//! an error event. An operator needs one line that names the cause (authentication, a
//! certificate, a refused port) and needs it again only when the cause changes or after
//! a long quiet spell, so the journal carries a diagnosis instead of a retry storm. The
//! last cause is also kept for the start-up message and `STATUS=`.

use crate::throttle::Throttle;
use fred::error::{Error, ErrorKind};
use std::sync::Mutex;
use std::time::Duration;

/// The same cause is logged again at most this often.
const REPEAT_INTERVAL: Duration = Duration::from_secs(60);

/// The last connection failure and its log throttle.
#[derive(Debug)]
pub struct ConnectionErrors {
    last: Mutex<Option<String>>,
    repeat: Throttle,
}

impl Default for ConnectionErrors {
    fn default() -> Self {
        ConnectionErrors {
            last: Mutex::new(None),
            repeat: Throttle::new(REPEAT_INTERVAL),
        }
    }
}

impl ConnectionErrors {
    /// Records a failed connection to `server`; logs it when its cause differs from the
    /// last one or the last line is older than [`REPEAT_INTERVAL`].
    pub fn record(&self, error: &Error, server: &str) {
        let cause = describe(error);
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let changed = last.as_deref() != Some(cause.as_str());
        let due = self.repeat.admit();
        if changed || due.is_some() {
            tracing::warn!(
                server,
                cause = %cause,
                "cannot use Redis: {cause}; deciding per on_redis_failure and retrying in the background (a reload re-reads the password and certificate files)"
            );
        }
        *last = Some(cause);
    }

    /// The last cause recorded, if any.
    pub fn last(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A one-line diagnosis: the kind of failure, in an operator's words, then fred's detail
/// (which never contains a password: Redis answers `WRONGPASS` without echoing it).
pub fn describe(error: &Error) -> String {
    let details = error.details();
    let lower = details.to_ascii_lowercase();
    let what = match error.kind() {
        ErrorKind::Auth => "authentication failed (check redis.username and the password file)",
        ErrorKind::Tls => {
            "TLS failed (check redis.tls_ca_file, the certificates and tls_server_name)"
        }
        _ if details.contains("WRONGPASS") || details.contains("NOAUTH") => {
            "authentication failed (check redis.username and the password file)"
        }
        _ if details.contains("NOPERM") => {
            "the ACL user lacks a permission (see docs/PRODUCTION-REDIS.md for the ACL line)"
        }
        _ if lower.contains("certificate")
            || lower.contains("tls")
            || lower.contains("handshake") =>
        {
            "TLS failed (check redis.tls_ca_file, the certificates and tls_server_name)"
        }
        ErrorKind::IO => "connection failed",
        _ => "Redis refused the connection",
    };
    format!("{what}: {details}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_authentication_and_certificates() {
        let auth = Error::new(ErrorKind::Auth, "WRONGPASS invalid username-password pair");
        assert!(describe(&auth).starts_with("authentication failed"));
        let tls = Error::new(ErrorKind::Tls, "invalid peer certificate: UnknownIssuer");
        assert!(describe(&tls).starts_with("TLS failed"));
        // rustls' verdict as fred reports it: an I/O error.
        let io = Error::new(
            ErrorKind::IO,
            "Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }",
        );
        assert!(describe(&io).starts_with("TLS failed"));
        let noperm = Error::new(ErrorKind::Unknown, "NOPERM this user has no permissions");
        assert!(describe(&noperm).contains("ACL user"));
    }

    #[test]
    fn same_cause_is_recorded_once() {
        let errors = ConnectionErrors::default();
        let e = Error::new(ErrorKind::Auth, "WRONGPASS x");
        errors.record(&e, "127.0.0.1:1");
        errors.record(&e, "127.0.0.1:1");
        assert_eq!(errors.last().as_deref(), Some(describe(&e).as_str()));
    }
}
