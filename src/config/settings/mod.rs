//! The daemon-wide settings: `[server]`, `[redis]`, `[cache]`, `[fallback]`, `[metrics]`.
//!
//! One struct per table, each field with its unit, default and range; single-value checks
//! run inside deserialization ([`super::de`]), so `toml` reports the value's line. A new
//! setting is a field here (with its `de_*` check) and, if a reload cannot apply it, a
//! line in [`super::diff`].
//!
//! `[redis]`, whose fields depend on each other (the mode, its nodes or sentinels, TLS
//! and the names), is [`redis`].

mod redis;
#[cfg(test)]
mod tests;

pub use redis::{parse_node, RedisConfig, RedisMode};

use super::de::*;
use super::{ConfigError, Locator};
use serde::Deserialize;
use std::path::PathBuf;
use toml::Spanned;

/// `[server]`: the Unix socket the daemon serves.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Path of the Unix stream socket (its directory is created if missing).
    pub socket: PathBuf,
    /// Permission bits of the socket file, an octal string such as `"0660"`.
    #[serde(deserialize_with = "de_mode")]
    pub socket_mode: u32,
    /// Longest request line in bytes, `\n` excluded (512..=1048576; the longest valid
    /// `CHECK` is 335 bytes). Longer → `ERR TOO_LONG`.
    #[serde(deserialize_with = "de_max_line")]
    pub max_line_bytes: usize,
    /// Requests of one connection decided concurrently at most (1..=65536); more wait
    /// unread in the socket (backpressure).
    #[serde(deserialize_with = "de_in_flight")]
    pub max_in_flight: usize,
    /// Peer uids allowed to connect (checked with `SO_PEERCRED`). When this or
    /// `allow_gids` is non-empty, a peer whose uid is not in `allow_uids` and whose gid
    /// is not in `allow_gids` gets `ERR PERM` and is disconnected. Both empty (default):
    /// no credential check beyond the socket file's `socket_mode`.
    #[serde(deserialize_with = "de_uids")]
    pub allow_uids: Vec<u32>,
    /// Peer gids allowed to connect: the peer's effective (primary) gid as `SO_PEERCRED`
    /// reports it; supplementary groups do not count (see docs/DESIGN.md).
    #[serde(deserialize_with = "de_gids")]
    pub allow_gids: Vec<u32>,
    /// Peer uids that may use the operator verbs (`INSPECT`, `RESET`, `RULES`, `TOP`:
    /// docs/PROTOCOL.md); default `[0]` (root only). A peer whose uid is not here and
    /// whose gid is not in `admin_gids` gets `ERR PERM` for them; its `CHECK`s are
    /// unaffected. Empty lists mean no operator at all (not everyone). An operator must
    /// still be let in by `allow_uids` / `allow_gids`.
    #[serde(deserialize_with = "de_admin_uids")]
    pub admin_uids: Vec<u32>,
    /// Peer (primary) gids that may use the operator verbs, as for `admin_uids`;
    /// default empty.
    #[serde(deserialize_with = "de_admin_gids")]
    pub admin_gids: Vec<u32>,
    /// Connections served at once (1..=1000000); one more gets `ERR BUSY` and is closed.
    #[serde(deserialize_with = "de_max_connections")]
    pub max_connections: usize,
    /// Connections one peer uid may hold at once (1..=`max_connections`); absent: half
    /// of `max_connections`, at least 1 ([`ServerConfig::max_connections_per_uid`]). One
    /// more from that uid gets `ERR BUSY` naming this limit and is closed, so one
    /// application cannot take every connection.
    #[serde(deserialize_with = "de_max_connections_per_uid")]
    pub max_connections_per_uid: Option<Spanned<usize>>,
    /// A connection with nothing to answer that sends nothing for this long, or whose
    /// reader takes no reply bytes for this long, is closed, ms (0 = never; max 1 day).
    #[serde(deserialize_with = "de_idle_timeout")]
    pub idle_timeout_ms: u64,
    /// Threads of the tokio runtime serving requests (0..=256); 0 (default) = half the
    /// CPUs the process may use, at least 1: a sidecar leaves CPU to the applications
    /// calling it, and on small hosts one thread beats two contending with the callers
    /// (docs/perf-log.md measures it).
    #[serde(deserialize_with = "de_worker_threads")]
    pub worker_threads: usize,
    /// Requests in flight to Redis for the whole daemon at most (1..=1000000); one more
    /// is answered `ERR BUSY` without asking Redis. A request counts until Redis has
    /// answered it, even after its reply went out on `redis.timeout_ms`.
    #[serde(deserialize_with = "de_redis_in_flight")]
    pub redis_max_in_flight: usize,
    /// Requests in flight to Redis from the connections of one peer uid at most
    /// (1..=1000000): one application cannot take every slot (`ERR BUSY` beyond).
    #[serde(deserialize_with = "de_redis_in_flight_per_uid")]
    pub redis_max_in_flight_per_uid: usize,
}

impl ServerConfig {
    /// Who may use the operator verbs (`admin_uids` / `admin_gids`); check a peer with
    /// [`crate::config::PeerAccess::lists`] (empty lists admit nobody).
    pub fn admins(&self) -> super::PeerAccess {
        super::PeerAccess {
            uids: self.admin_uids.clone(),
            gids: self.admin_gids.clone(),
        }
    }

    /// The runtime's worker threads: `worker_threads`, or the default for `0`.
    pub fn worker_threads(&self) -> usize {
        if self.worker_threads > 0 {
            return self.worker_threads;
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cpus / 2).max(1)
    }

    /// The connections one peer uid may hold: `max_connections_per_uid`, or half of
    /// `max_connections` (at least 1) when absent.
    pub fn max_connections_per_uid(&self) -> usize {
        self.max_connections_per_uid
            .as_ref()
            .map_or((self.max_connections / 2).max(1), |n| *n.get_ref())
    }

    /// Checks what single values cannot: `max_connections_per_uid` against
    /// `max_connections`.
    pub(super) fn validate(&self, at: &Locator) -> Result<(), ConfigError> {
        match &self.max_connections_per_uid {
            Some(n) if *n.get_ref() > self.max_connections => Err(at.invalid(
                n.span(),
                "server.max_connections_per_uid",
                &format!(
                    "{} is above server.max_connections = {}: one uid cannot hold more connections than the daemon serves",
                    n.get_ref(),
                    self.max_connections
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            socket: PathBuf::from("/run/ratelimitd/ratelimitd.sock"),
            socket_mode: 0o660,
            max_line_bytes: 1024,
            max_in_flight: 128,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            admin_uids: vec![0],
            admin_gids: Vec::new(),
            max_connections: 1000,
            max_connections_per_uid: None,
            idle_timeout_ms: 300_000,
            worker_threads: 0,
            redis_max_in_flight: 4096,
            redis_max_in_flight_per_uid: 1024,
        }
    }
}

/// `[cache]`: the deny cache.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// How long a DENY from Redis is remembered, ms, capped by its `wait_ms` (0 = off).
    #[serde(deserialize_with = "de_ttl")]
    pub ttl_ms: u64,
    /// Most DENYs remembered, one per (rule, key) (the least recently used page of them
    /// is evicted first).
    pub max_entries: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            ttl_ms: 500,
            max_entries: 100_000,
        }
    }
}

/// How many hosts share each limit while Redis is unreachable (`fallback.hosts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hosts {
    /// The daemons alive in Redis lately (each registers itself with a heartbeat), as
    /// last seen: remembered through an outage; at least 1 (this daemon), and 1 until the
    /// first heartbeat answers.
    Auto,
    /// A fixed number (1..=10000).
    Fixed(u32),
}

impl Hosts {
    /// The fixed number, or the floor of `auto` (1) until a heartbeat tells more.
    pub fn floor(self) -> u32 {
        match self {
            Hosts::Auto => 1,
            Hosts::Fixed(n) => n,
        }
    }
}

impl std::fmt::Display for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hosts::Auto => f.write_str("\"auto\""),
            Hosts::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// `[fallback]`: local buckets used when Redis is unreachable.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FallbackConfig {
    /// Hosts sharing each limit; with Redis down each host enforces `limit ÷ hosts`.
    /// `"auto"` (default): the daemons alive in Redis lately, as last seen.
    #[serde(deserialize_with = "de_hosts")]
    pub hosts: Hosts,
    /// Most keys with a local bucket (one worth nothing evicted first, else the least
    /// useful; a key evicted while its bucket mattered comes back no fuller, but keys
    /// never seen may then start drained: keep this above the number of active keys).
    #[serde(deserialize_with = "de_max_keys")]
    pub max_keys: u64,
    /// With `hosts = "auto"`, the count in force is never below this (1..=10000, default
    /// 1): the share of a daemon that has no count saved and has heard no heartbeat yet.
    #[serde(deserialize_with = "de_min_hosts")]
    pub min_hosts: u32,
    /// Where the count of daemons alive is saved across restarts
    /// ([`crate::saved_hosts`]) when `$STATE_DIRECTORY` is not set; absent: not saved.
    pub state_dir: Option<PathBuf>,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        FallbackConfig {
            hosts: Hosts::Auto,
            max_keys: 1_000_000,
            min_hosts: 1,
            state_dir: None,
        }
    }
}

/// `[metrics]`: the opt-in Prometheus endpoint.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `ip:port` of the HTTP listener serving the metrics (e.g. `"127.0.0.1:9090"`), or
    /// a port alone (`9090` or `"9090"`) for `127.0.0.1:<port>`; absent: no metrics.
    /// Unauthenticated: keep it on loopback.
    #[serde(deserialize_with = "de_listen")]
    pub listen: Option<std::net::SocketAddr>,
    /// Scrapers served at once (1..=1024); more wait in the kernel's listen queue,
    /// holding no file descriptor of the daemon.
    #[serde(deserialize_with = "de_metrics_connections")]
    pub max_connections: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: None,
            max_connections: 4,
        }
    }
}
