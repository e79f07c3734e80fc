//! The file-descriptor budget: the daemon raises its soft `RLIMIT_NOFILE` to the hard
//! limit at start-up, so `server.max_connections` clients, the metrics endpoint's
//! connections and the Redis connections all fit, and warns when they would not.
//!
//! Every client connection holds one descriptor; the metrics endpoint at most
//! `http.max_connections`; Redis one per node (plus one while reconnecting); the rest
//! (listening sockets, the runtime's epoll and eventfd, the log, systemd's notify socket)
//! stays under [`BASE_FDS`].

use rlimit::{getrlimit, setrlimit, Resource};
use std::io;

/// Descriptors the daemon needs besides its clients and metrics scrapers: listeners,
/// the runtime, Redis connections of a large cluster, logs.
pub const BASE_FDS: u64 = 256;

/// `RLIMIT_NOFILE` before and after raising the soft limit to the hard one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoFile {
    /// The soft limit the process started with.
    pub before: u64,
    /// The soft limit now (the hard limit, unless raising it failed).
    pub now: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (a no-op if they are equal).
///
/// # Errors
/// `getrlimit` or `setrlimit` failed.
pub fn raise_nofile() -> io::Result<NoFile> {
    let (before, hard) = getrlimit(Resource::NOFILE)?;
    if before < hard {
        setrlimit(Resource::NOFILE, hard, hard)?;
    }
    Ok(NoFile {
        before,
        now: before.max(hard),
    })
}

/// Descriptors needed for `max_connections` clients and `metrics_connections` scrapers.
pub fn needed(max_connections: usize, metrics_connections: usize) -> u64 {
    max_connections as u64 + metrics_connections as u64 + BASE_FDS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_reaches_the_hard_limit() {
        let n = raise_nofile().unwrap();
        let (soft, hard) = getrlimit(Resource::NOFILE).unwrap();
        assert_eq!(n.now, hard);
        assert_eq!(soft, hard);
        assert!(n.now >= n.before);
    }

    #[test]
    fn the_budget_counts_clients_scrapers_and_the_base() {
        assert_eq!(needed(1000, 4), 1000 + 4 + BASE_FDS);
        assert_eq!(needed(0, 0), BASE_FDS);
    }
}
