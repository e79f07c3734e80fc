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

/// Which Redis deployment holds the shared state.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// Redis Cluster; `nodes` are seed nodes, the rest is discovered.
    Cluster,
    /// One Redis server (`nodes` has exactly one entry).
    Standalone,
    /// A primary with replicas watched by Redis Sentinel: the primary's address is asked
    /// of `sentinels` under `service_name`, and again after every failover.
    Sentinel,
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
    /// The Redis ACL user; absent: Redis' `default` user.
    pub username: Option<String>,
    /// A file whose first line is the password; absent: the systemd credential
    /// `redis-password` when the unit passes one, else no password. Never the password
    /// itself: see [`RedisConfig::password`].
    pub password_file: Option<PathBuf>,
    /// Present only to refuse it with a clear message: a password never goes in the
    /// configuration file.
    pub password: Option<Spanned<toml::Value>>,
    /// TLS to every node (and to the sentinels).
    pub tls: bool,
    /// PEM bundle of the CAs to trust; absent: the system's trust store.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for a Redis with `tls-auth-clients yes`.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// The name every node's certificate must carry; absent: the address dialled.
    pub tls_server_name: Option<String>,
    /// `host:port` of the sentinels (`mode = "sentinel"`).
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under (`mode = "sentinel"`).
    pub service_name: Option<String>,
    /// The sentinels' ACL user, when it differs from `username`.
    pub sentinel_username: Option<String>,
    /// The sentinels' password file, when they have a password of their own.
    pub sentinel_password_file: Option<PathBuf>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            mode: RedisMode::None,
            nodes: Spanned::new(0..0, Vec::new()),
            timeout_ms: 25,
            prefix: "rl".into(),
            username: None,
            password_file: None,
            password: None,
            tls: false,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_server_name: None,
            sentinels: Vec::new(),
            service_name: None,
            sentinel_username: None,
            sentinel_password_file: None,
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
            table.clone()
        } else {
            nodes.span()
        };
        let invalid = |message: &str| at.invalid(span.clone(), "redis.nodes", message);
        let field = |name: &str, message: &str| at.invalid(table.clone(), name, message);
        if let Some(password) = &self.password {
            return Err(at.invalid(
                password.span(),
                "redis.password",
                "a password never goes in the configuration file: write it to a file \
                 readable by the daemon only and set redis.password_file (or pass the \
                 systemd credential redis-password)",
            ));
        }
        self.validate_tls_and_names(&field)?;
        self.validate_sentinel(&field)?;
        match self.mode {
            RedisMode::None | RedisMode::Sentinel => {}
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

    /// The TLS files only with `tls`, a client certificate with its key, and names
    /// (users, service, server name) without spaces. `field` makes the error.
    fn validate_tls_and_names(
        &self,
        field: &dyn Fn(&str, &str) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if !self.tls {
            for (name, set) in [
                ("redis.tls_ca_file", self.tls_ca_file.is_some()),
                ("redis.tls_cert_file", self.tls_cert_file.is_some()),
                ("redis.tls_key_file", self.tls_key_file.is_some()),
                ("redis.tls_server_name", self.tls_server_name.is_some()),
            ] {
                if set {
                    return Err(field(name, "takes effect only with redis.tls = true"));
                }
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(field(
                "redis.tls_cert_file",
                "set both tls_cert_file and tls_key_file, or neither",
            ));
        }
        for (name, value) in [
            ("redis.username", &self.username),
            ("redis.sentinel_username", &self.sentinel_username),
            ("redis.service_name", &self.service_name),
            ("redis.tls_server_name", &self.tls_server_name),
        ] {
            if value
                .as_deref()
                .is_some_and(|v| v.is_empty() || v.contains(char::is_whitespace))
            {
                return Err(field(name, "must be a non-empty name without spaces"));
            }
        }
        Ok(())
    }

    /// `sentinels` and `service_name` with `mode = "sentinel"`, and only then.
    fn validate_sentinel(
        &self,
        field: &dyn Fn(&str, &str) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if self.mode == RedisMode::Sentinel {
            if self.sentinels.is_empty() {
                return Err(field(
                    "redis.sentinels",
                    "list at least one \"host:port\" when redis.mode is sentinel",
                ));
            }
            if let Some(bad) = self.sentinels.iter().find(|n| parse_node(n).is_none()) {
                return Err(field(
                    "redis.sentinels",
                    &format!("'{bad}' is not \"host:port\""),
                ));
            }
            if self.service_name.is_none() {
                return Err(field(
                    "redis.service_name",
                    "name the monitored primary (sentinel monitor <name> ...) when redis.mode is sentinel",
                ));
            }
        } else if !self.sentinels.is_empty() || self.service_name.is_some() {
            return Err(field(
                "redis.sentinels",
                "sentinels and service_name take effect only with redis.mode = \"sentinel\"",
            ));
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

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn redis(table: &str) -> Result<Config, String> {
        Config::parse(&format!("[redis]\n{table}\n"), "t.toml").map_err(|e| e.to_string())
    }

    #[test]
    fn production_redis_fields_parse() {
        let c = redis(
            "mode = \"cluster\"\nnodes = [\"a:1\"]\nusername = \"rl\"\n\
             password_file = \"/p\"\ntls = true\ntls_ca_file = \"/ca\"\n\
             tls_cert_file = \"/c\"\ntls_key_file = \"/k\"\ntls_server_name = \"redis.internal\"",
        )
        .unwrap();
        assert_eq!(c.redis.username.as_deref(), Some("rl"));
        assert!(c.redis.tls);
        let s = redis(
            "mode = \"sentinel\"\nsentinels = [\"s:26379\"]\nservice_name = \"mymaster\"\n\
             sentinel_password_file = \"/sp\"",
        )
        .unwrap();
        assert_eq!(s.redis.service_name.as_deref(), Some("mymaster"));
    }

    #[test]
    fn connections_per_uid_default_to_half_and_stay_within_the_total() {
        let server = |t: &str| Config::parse(&format!("[server]\n{t}\n"), "t.toml");
        assert_eq!(server("").unwrap().server.max_connections_per_uid(), 500);
        let c = server("max_connections = 7").unwrap();
        assert_eq!(c.server.max_connections_per_uid(), 3);
        assert_eq!(
            server("max_connections = 1")
                .unwrap()
                .server
                .max_connections_per_uid(),
            1
        );
        let c = server("max_connections = 7\nmax_connections_per_uid = 7").unwrap();
        assert_eq!(c.server.max_connections_per_uid(), 7);
        let e = server("max_connections = 7\nmax_connections_per_uid = 8")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "t.toml:3: server.max_connections_per_uid: 8 is above server.max_connections = 7"
            ),
            "{e}"
        );
        let e = server("max_connections_per_uid = 0")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2")
                && e.contains("server.max_connections_per_uid must be an integer from 1"),
            "{e}"
        );
    }

    #[test]
    fn each_mistake_names_its_field() {
        for (table, field, says) in [
            ("password = \"x\"", "redis.password", "password_file"),
            (
                "tls_ca_file = \"/ca\"",
                "redis.tls_ca_file",
                "redis.tls = true",
            ),
            (
                "tls = true\ntls_cert_file = \"/c\"",
                "redis.tls_cert_file",
                "neither",
            ),
            ("mode = \"sentinel\"", "redis.sentinels", "at least one"),
            (
                "mode = \"sentinel\"\nsentinels = [\"nope\"]",
                "redis.sentinels",
                "host:port",
            ),
            (
                "mode = \"sentinel\"\nsentinels = [\"s:1\"]",
                "redis.service_name",
                "name the",
            ),
            ("sentinels = [\"s:1\"]", "redis.sentinels", "only with"),
            ("username = \"a b\"", "redis.username", "without spaces"),
        ] {
            let e = redis(table).unwrap_err();
            assert!(e.contains(field) && e.contains(says), "{table}: {e}");
            assert!(!e.contains("\"x\""), "the password value was echoed: {e}");
        }
    }
}
