//! What went wrong connecting to Redis, said once per cause instead of once per retry.
//!
//! fred reconnects every 100 ms while a node refuses the daemon; each failed attempt is
//! an error event, from every node that refuses. An operator needs one line that names
//! the cause (authentication, a certificate, a refused port) and needs it again only
//! after a long quiet spell or a reload that changed the secrets' files, so the journal
//! carries one diagnosis per cause instead of a retry storm, however many nodes fail and
//! in whatever order. The last cause is also kept for the start-up message and `STATUS=`.

use fred::error::{Error, ErrorKind};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The same cause is logged again at most this often.
const REPEAT_INTERVAL: Duration = Duration::from_secs(60);

/// Causes remembered at once (a few kinds of failure; the oldest are forgotten first).
const MAX_CAUSES: usize = 16;

/// The causes seen, when each was last logged, and the last one.
#[derive(Debug, Default)]
pub struct ConnectionErrors {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    logged: HashMap<String, Instant>,
    last: Option<String>,
}

impl ConnectionErrors {
    /// Records a failed connection to `server`; logs it when its cause was not logged
    /// within [`REPEAT_INTERVAL`], whichever server it came from: a wrong password on
    /// every node of a cluster, or nodes failing in turns with two causes, is one line
    /// per cause, not one per node and retry.
    pub fn record(&self, error: &Error, server: &str) {
        let cause = describe(error);
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let due = state
            .logged
            .get(&cause)
            .is_none_or(|at| now.duration_since(*at) >= REPEAT_INTERVAL);
        if due {
            tracing::warn!(
                server,
                cause = %cause,
                "cannot use Redis: {cause}; deciding per on_redis_failure and retrying in the background (a reload re-reads the password and certificate files)"
            );
            if state.logged.len() >= MAX_CAUSES {
                if let Some(oldest) = state
                    .logged
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(c, _)| c.clone())
                {
                    state.logged.remove(&oldest);
                }
            }
            state.logged.insert(cause.clone(), now);
        }
        state.last = Some(cause);
    }

    /// Forgets what was logged, so that a cause still there after a reload is said
    /// again (the operator's fix did not work).
    pub fn forget(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.logged.clear();
    }

    /// The last cause recorded, if any.
    pub fn last(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last
            .clone()
    }
}

/// True when the error text `details` is the ACL refusing the daemon's user a command:
/// `NOPERM` for a command it sends, or a command a script calls, which Redis 7 words
/// "ERR The user executing the script can't run this command or subcommand" and
/// Valkey 8 "ERR ACL failure in script: User … has no permissions to run the '…' command".
pub fn is_acl_refusal(details: &str) -> bool {
    ["NOPERM", "can't run this command", "ACL failure in script"]
        .iter()
        .any(|p| details.contains(p))
}

/// True when Redis answered but refuses the daemon: a missing permission
/// ([`is_acl_refusal`]) or authentication (`WRONGPASS`, `NOAUTH`). Such replies come to
/// commands, not to the connection, so the caller records them here to have them said once.
pub fn is_refusal(error: &Error) -> bool {
    let details = error.details();
    is_acl_refusal(details) || details.contains("WRONGPASS") || details.contains("NOAUTH")
}

/// What an authentication failure tells the operator to check.
const AUTH: &str = "authentication failed (check redis.username and the password file)";
/// What a TLS failure tells the operator to check.
const TLS: &str =
    "TLS failed (check redis.tls_ca_file, the certificates, their dates and tls_server_name)";

/// A one-line diagnosis: the kind of failure, in an operator's words, then fred's detail
/// (which never contains a password: Redis answers `WRONGPASS` without echoing it).
pub fn describe(error: &Error) -> String {
    let details = error.details();
    let lower = details.to_ascii_lowercase();
    let what = match error.kind() {
        ErrorKind::Auth => AUTH,
        ErrorKind::Tls => TLS,
        _ if details.contains("WRONGPASS") || details.contains("NOAUTH") => AUTH,
        _ if is_acl_refusal(details) => {
            "the ACL user lacks a permission (see docs/PRODUCTION-REDIS.md for the ACL line)"
        }
        _ if details.contains("CLUSTERDOWN") => {
            "the cluster is down (slots without a primary, until a replica is promoted)"
        }
        // A server that went away mid-connection: over TLS, rustls reports the missing
        // close_notify, which is not a certificate problem.
        _ if lower.contains("unexpectedeof")
            || lower.contains("close_notify")
            || lower.contains("connection reset") =>
        {
            "the server closed the connection"
        }
        // An expired or revoked client certificate: the server's alert.
        _ if lower.contains("alert") && lower.contains("certificate") => {
            "TLS failed: the server refused the client certificate (check redis.tls_cert_file and its dates)"
        }
        _ if lower.contains("expired") => TLS,
        _ if lower.contains("certificate")
            || lower.contains("tls")
            || lower.contains("handshake") =>
        {
            TLS
        }
        _ if lower.contains("connection refused") => "connection refused (is Redis listening there?)",
        ErrorKind::Timeout => "no answer in time (Redis overloaded or unreachable)",
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
        // A TLS node killed: not a certificate problem.
        let eof = Error::new(
            ErrorKind::IO,
            "Custom { kind: UnexpectedEof, error: \"peer closed connection without sending TLS close_notify\" }",
        );
        assert!(describe(&eof).starts_with("the server closed"));
        let down = Error::new(ErrorKind::Cluster, "CLUSTERDOWN The cluster is down");
        assert!(describe(&down).starts_with("the cluster is down"));
        assert!(is_refusal(&noperm) && !is_refusal(&down));
        // A command a script calls, refused by the ACL (Redis 7's words).
        let in_script = Error::new(
            ErrorKind::Unknown,
            "ERR The user executing the script can't run this command or subcommand script: 2b06, on @user_script:124.",
        );
        assert!(is_refusal(&in_script) && describe(&in_script).contains("ACL user"));
        // The same refusal in Valkey 8's words.
        let valkey = Error::new(
            ErrorKind::Unknown,
            "ERR ACL failure in script: User ratelimitd has no permissions to run the 'pexpire' command script: 2b06, on @user_script:124.",
        );
        assert!(is_refusal(&valkey) && describe(&valkey).contains("ACL user"));
    }

    #[test]
    fn each_cause_is_logged_once_whichever_server() {
        let errors = ConnectionErrors::default();
        let auth = Error::new(ErrorKind::Auth, "WRONGPASS x");
        let down = Error::new(ErrorKind::Cluster, "CLUSTERDOWN The cluster is down");
        for server in ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"] {
            errors.record(&auth, server);
            errors.record(&down, server);
        }
        assert_eq!(errors.state.lock().unwrap().logged.len(), 2);
        assert_eq!(errors.last().as_deref(), Some(describe(&down).as_str()));
        errors.forget();
        assert!(errors.state.lock().unwrap().logged.is_empty());
    }
}
