//! The daemon-wide settings: `[server]`, `[redis]`, `[cache]`, `[fallback]`, `[metrics]`.
//!
//! One struct per table, each field with its unit, default and range; single-value checks
//! run inside deserialization ([`super::de`]), so `toml` reports the value's line. A new
//! setting is a field here (with its `de_*` check) and, if a reload cannot apply it, a
//! line in [`super::diff`].

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
    /// Connections served at once (1..=1000000); one more gets `ERR BUSY` and is closed.
    #[serde(deserialize_with = "de_max_connections")]
    pub max_connections: usize,
    /// A connection with nothing to answer that sends nothing for this long, or whose
    /// reader takes no reply bytes for this long, is closed, ms (0 = never; max 1 day).
    #[serde(deserialize_with = "de_idle_timeout")]
    pub idle_timeout_ms: u64,
    /// Threads of the tokio runtime serving requests (0..=256); 0 (default) = half the
    /// CPUs the process may use, at least 1: a sidecar leaves CPU to the applications
    /// calling it, and on small hosts one thread beats two contending with the callers
    /// (docs/PERFORMANCE.md measures it).
    #[serde(deserialize_with = "de_worker_threads")]
    pub worker_threads: usize,
}

impl ServerConfig {
    /// The runtime's worker threads: `worker_threads`, or the default for `0`.
    pub fn worker_threads(&self) -> usize {
        if self.worker_threads > 0 {
            return self.worker_threads;
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cpus / 2).max(1)
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
            max_connections: 1000,
            idle_timeout_ms: 300_000,
            worker_threads: 0,
        }
    }
}

/// Which Redis deployment holds the shared state.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// Redis Cluster; `nodes` are seed nodes, the rest is discovered.
    Cluster,
    /// One Redis server (`nodes` has exactly one entry).
    Standalone,
    /// No Redis: every decision is made by local buckets with the full limits.
    None,
}

/// `[redis]`: where and how decisions are shared.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `cluster`, `standalone` or `none` (default `none`).
    pub mode: RedisMode,
    /// `host:port` of the seed nodes.
    pub nodes: Spanned<Vec<String>>,
    /// A decision waits at most this long for Redis, ms (1..=60000).
    #[serde(deserialize_with = "de_timeout")]
    pub timeout_ms: u64,
    /// First part of every Redis key: `<prefix>:{<rule>:<key>}`.
    #[serde(deserialize_with = "de_prefix")]
    pub prefix: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            mode: RedisMode::None,
            nodes: Spanned::new(0..0, Vec::new()),
            timeout_ms: 25,
            prefix: "rl".into(),
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
    /// Most (rule, key) entries remembered (least useful evicted first).
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

/// `[fallback]`: local buckets used when Redis is unreachable.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FallbackConfig {
    /// Hosts sharing each limit; with Redis down each host enforces `limit ÷ hosts`.
    #[serde(deserialize_with = "de_hosts")]
    pub hosts: u32,
    /// Most keys with a local bucket (least useful evicted first; an evicted key starts
    /// again full, so keep this above the number of active keys).
    #[serde(deserialize_with = "de_max_keys")]
    pub max_keys: u64,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        FallbackConfig {
            hosts: 1,
            max_keys: 1_000_000,
        }
    }
}

/// `[metrics]`: the opt-in Prometheus endpoint.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `ip:port` of the HTTP listener serving the metrics (e.g. `"127.0.0.1:9090"`);
    /// absent: no metrics. Unauthenticated: keep it on loopback.
    pub listen: Option<std::net::SocketAddr>,
}

impl RedisConfig {
    /// Checks what single values cannot: `nodes` against `mode`. `table` is the span of
    /// the `[redis]` table (where an absent `nodes` is reported).
    pub(super) fn validate(
        &self,
        table: std::ops::Range<usize>,
        at: &Locator,
    ) -> Result<(), ConfigError> {
        let nodes = &self.nodes;
        // An absent `nodes` has an empty span: point at the [redis] table instead.
        let span = if nodes.span().is_empty() {
            table
        } else {
            nodes.span()
        };
        let invalid = |message: &str| at.invalid(span.clone(), "redis.nodes", message);
        match self.mode {
            RedisMode::None => {}
            RedisMode::Cluster | RedisMode::Standalone if nodes.get_ref().is_empty() => {
                return Err(invalid(
                    "list at least one \"host:port\" when redis.mode is cluster or standalone",
                ))
            }
            RedisMode::Standalone if nodes.get_ref().len() > 1 => {
                return Err(invalid("standalone mode takes exactly one \"host:port\""))
            }
            _ => {}
        }
        for node in nodes.get_ref() {
            if parse_node(node).is_none() {
                return Err(invalid(&format!("'{node}' is not \"host:port\"")));
            }
        }
        Ok(())
    }

    /// The per-decision Redis timeout.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms)
    }
}

/// Splits a `redis.nodes` entry `"host:port"` into host and port (a port of 0 is
/// refused). Used by validation and by the Redis client, so both read it alike.
pub fn parse_node(node: &str) -> Option<(&str, u16)> {
    let (host, port) = node.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|&p| p > 0)?;
    (!host.is_empty()).then_some((host, port))
}
