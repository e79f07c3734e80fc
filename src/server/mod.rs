//! The Unix socket server: who may connect, and how each connection is served.
//!
//! * [`socket`]: creating the socket file safely (`server.socket`, `socket_mode`);
//! * [`listener`]: the accept loop, the connection cap, peer credentials, shutdown;
//! * [`connection`]: one connection: read lines, decide concurrently, write in order;
//! * [`dispatch`]: one line into its reply (parse, ask the limiter, encode);
//! * [`operator`]: the operator verbs (`INSPECT`, `RESET`, `RULES`, `TOP`), for
//!   `server.admin_uids` / `admin_gids` only.

pub mod connection;
pub mod dispatch;
pub mod listener;
pub mod operator;
pub mod socket;

pub use crate::config::PeerAccess;
pub use dispatch::Answer;
pub use listener::serve;
pub use socket::{bind, BindError};

use crate::admission::InFlightLimits;
use crate::config::ServerConfig;
use std::time::Duration;

/// Per-connection limits, from `[server]`.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Longest request line, bytes.
    pub max_line_bytes: usize,
    /// Requests decided concurrently per connection.
    pub max_in_flight: usize,
    /// Connections served at once; one more is answered `ERR BUSY` and closed.
    pub max_connections: usize,
    /// Connections one peer uid may hold at once (`server.max_connections_per_uid`); one
    /// more from that uid is answered `ERR BUSY` and closed.
    pub max_connections_per_uid: usize,
    /// Close a connection idle (nothing received, nothing to answer) or not taking its
    /// replies for this long; `None` = never.
    pub idle_timeout: Option<Duration>,
    /// Who may connect (`SO_PEERCRED`).
    pub access: PeerAccess,
    /// Who may use the operator verbs (`server.admin_uids` / `admin_gids`; empty lists:
    /// nobody).
    pub admins: PeerAccess,
    /// Requests in flight to Redis: for the daemon, per peer uid.
    pub redis_in_flight: InFlightLimits,
}

impl From<&ServerConfig> for ConnectionLimits {
    fn from(c: &ServerConfig) -> Self {
        ConnectionLimits {
            max_line_bytes: c.max_line_bytes,
            max_in_flight: c.max_in_flight,
            max_connections: c.max_connections,
            max_connections_per_uid: c.max_connections_per_uid(),
            idle_timeout: (c.idle_timeout_ms > 0).then(|| Duration::from_millis(c.idle_timeout_ms)),
            access: PeerAccess {
                uids: c.allow_uids.clone(),
                gids: c.allow_gids.clone(),
            },
            admins: c.admins(),
            redis_in_flight: InFlightLimits {
                total: c.redis_max_in_flight,
                per_uid: c.redis_max_in_flight_per_uid,
            },
        }
    }
}
