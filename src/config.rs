//! The TOML configuration of CONTRACT §3, parsed with serde and validated in full.
//!
//! Unknown fields and bad values are errors that name the field and its line:
//! single-value checks run inside deserialization (so `toml` reports the value's
//! position), cross-field checks use [`toml::Spanned`] positions.

use crate::algorithm::{self, leaky_bucket, token_bucket, WindowParams};
use serde::{de, Deserialize, Deserializer};
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toml::Spanned;

/// A configuration that could not be loaded: what is wrong, where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Syntax error, unknown field or a bad single value (the message names the field;
    /// `toml` prints its line and column).
    #[error("{path}: {message}")]
    Parse {
        /// The file (or `<string>`).
        path: String,
        /// `toml`'s message, with line, column and the offending text.
        message: String,
    },
    /// A value that is wrong in relation to others.
    #[error("{path}:{line}: {field}: {message}")]
    Invalid {
        /// The file (or `<string>`).
        path: String,
        /// 1-based line of the field (or of its table).
        line: usize,
        /// Dotted field name, e.g. `rule[2].refill_rate` or `redis.nodes`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

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

/// What a rule does when Redis cannot decide.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnRedisFailure {
    /// A local bucket with `limit ÷ hosts` (source `local`).
    #[default]
    Local,
    /// Allow everything (source `fail_open`).
    Allow,
    /// Deny everything (source `fail_closed`).
    Deny,
}

/// The algorithm names of CONTRACT §2.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmName {
    /// Token bucket: `capacity`, `refill_rate`.
    TokenBucket,
    /// Leaky bucket: `capacity`, `leak_rate`.
    LeakyBucket,
    /// Fixed window: `limit`, `window`.
    FixedWindow,
    /// Sliding window log: `limit`, `window`.
    SlidingWindowLog,
    /// Sliding window counter: `limit`, `window`.
    SlidingWindowCounter,
}

impl AlgorithmName {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            AlgorithmName::TokenBucket => "token_bucket",
            AlgorithmName::LeakyBucket => "leaky_bucket",
            AlgorithmName::FixedWindow => "fixed_window",
            AlgorithmName::SlidingWindowLog => "sliding_window_log",
            AlgorithmName::SlidingWindowCounter => "sliding_window_counter",
        }
    }
}

/// One `[[rule]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Spanned<String>,
    algorithm: Spanned<AlgorithmName>,
    capacity: Option<Spanned<u64>>,
    refill_rate: Option<Spanned<f64>>,
    leak_rate: Option<Spanned<f64>>,
    limit: Option<Spanned<u64>>,
    window: Option<Spanned<String>>,
    #[serde(default)]
    on_redis_failure: OnRedisFailure,
    fallback_hosts: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: ServerConfig,
    redis: Option<Spanned<RedisConfig>>,
    #[serde(default)]
    cache: CacheConfig,
    #[serde(default)]
    fallback: FallbackConfig,
    #[serde(default)]
    metrics: MetricsConfig,
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

/// How a rule decides: CONTRACT §2's algorithms with their parameters as configured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Algorithm {
    /// `token_bucket`.
    TokenBucket {
        /// Tokens when full (≥ 1).
        capacity: u64,
        /// Tokens added per second (> 0).
        refill_rate: f64,
    },
    /// `leaky_bucket`.
    LeakyBucket {
        /// Queue size in units (≥ 1).
        capacity: u64,
        /// Units drained per second (> 0).
        leak_rate: f64,
    },
    /// `fixed_window`.
    FixedWindow {
        /// Units per window (≥ 1).
        limit: u64,
        /// Window length, ms.
        window_ms: u64,
    },
    /// `sliding_window_log`.
    SlidingWindowLog {
        /// Units per sliding window (1..=[`MAX_LOG_LIMIT`]).
        limit: u64,
        /// Window length, ms.
        window_ms: u64,
    },
    /// `sliding_window_counter`.
    SlidingWindowCounter {
        /// Units per (estimated) sliding window (≥ 1).
        limit: u64,
        /// Window length, ms.
        window_ms: u64,
    },
}

impl Algorithm {
    /// The parameters of one of `hosts` hosts sharing the limit (`hosts = 1`: the
    /// whole limit, as Redis and `mode = "none"` enforce it).
    pub fn params(&self, hosts: u32) -> algorithm::Params {
        use algorithm::Params as P;
        match *self {
            Algorithm::TokenBucket {
                capacity,
                refill_rate,
            } => P::TokenBucket(token_bucket::Params::shared(capacity, refill_rate, hosts)),
            Algorithm::LeakyBucket {
                capacity,
                leak_rate,
            } => P::LeakyBucket(leaky_bucket::Params::shared(capacity, leak_rate, hosts)),
            Algorithm::FixedWindow { limit, window_ms } => {
                P::FixedWindow(WindowParams::shared(limit, window_ms, hosts))
            }
            Algorithm::SlidingWindowLog { limit, window_ms } => {
                P::SlidingWindowLog(WindowParams::shared(limit, window_ms, hosts))
            }
            Algorithm::SlidingWindowCounter { limit, window_ms } => {
                P::SlidingWindowCounter(WindowParams::shared(limit, window_ms, hosts))
            }
        }
    }

    /// The policy window, ms: a window's length; for a bucket, the time it takes to go
    /// from empty to full (`capacity ÷ refill_rate`, `capacity ÷ leak_rate`), rounded up.
    /// This is the `w` of an IETF `RateLimit-Policy` header: `limit` units per window.
    pub fn window_ms(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket {
                capacity,
                refill_rate: rate,
            }
            | Algorithm::LeakyBucket {
                capacity,
                leak_rate: rate,
            } => (capacity as f64 * 1000.0 / rate)
                .ceil()
                .min(u64::MAX as f64) as u64,
            Algorithm::FixedWindow { window_ms, .. }
            | Algorithm::SlidingWindowLog { window_ms, .. }
            | Algorithm::SlidingWindowCounter { window_ms, .. } => window_ms,
        }
    }

    /// The capacity (buckets) or limit (windows).
    pub fn limit(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, .. } | Algorithm::LeakyBucket { capacity, .. } => {
                capacity
            }
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingWindowLog { limit, .. }
            | Algorithm::SlidingWindowCounter { limit, .. } => limit,
        }
    }
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The name clients send in `CHECK`.
    pub name: String,
    /// The algorithm and its parameters.
    pub algorithm: Algorithm,
    /// What to do when Redis cannot decide.
    pub on_redis_failure: OnRedisFailure,
    /// Hosts sharing the limit when falling back to local buckets.
    pub fallback_hosts: u32,
    /// Parameters of the shared decision (Redis, or `mode = "none"`): the whole limit.
    pub params: algorithm::Params,
    /// Parameters of a local fallback decision: the share of one of `fallback_hosts`.
    pub fallback_params: algorithm::Params,
    /// The policy window, ms ([`Algorithm::window_ms`]): the seventh field of replies.
    pub window_ms: u64,
}

impl Rule {
    /// A rule, with its parameters derived once (not per request).
    pub fn new(
        name: String,
        algorithm: Algorithm,
        on_redis_failure: OnRedisFailure,
        fallback_hosts: u32,
    ) -> Self {
        Rule {
            name,
            algorithm,
            on_redis_failure,
            fallback_hosts,
            params: algorithm.params(1),
            fallback_params: algorithm.params(fallback_hosts),
            window_ms: algorithm.window_ms(),
        }
    }

    /// The capacity/limit: the `limit` field of replies and the largest possible cost.
    pub fn limit(&self) -> u64 {
        self.algorithm.limit()
    }
}

/// A complete, validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `[server]`.
    pub server: ServerConfig,
    /// `[redis]`.
    pub redis: RedisConfig,
    /// `[cache]`.
    pub cache: CacheConfig,
    /// `[fallback]`.
    pub fallback: FallbackConfig,
    /// `[metrics]`.
    pub metrics: MetricsConfig,
    /// Rules by name.
    pub rules: HashMap<String, Arc<Rule>>,
}

/// Largest capacity/limit accepted: keeps micro-token arithmetic exact in doubles.
pub const MAX_CAPACITY: u64 = 1_000_000_000;

/// Largest `limit` of a `sliding_window_log`: its log holds up to `limit` entries per
/// key and each decision reads them all (use `sliding_window_counter` above this).
pub const MAX_LOG_LIMIT: u64 = 10_000;

/// Longest `window`: 30 days.
pub const MAX_WINDOW_MS: u64 = 30 * 24 * 3600 * 1000;

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses and validates `text`; `origin` names it in errors (a path).
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let invalid = |span: Range<usize>, field: String, message: String| ConfigError::Invalid {
            path: origin.to_owned(),
            line: line_of(text, span.start),
            field,
            message,
        };

        let redis_span = raw.redis.as_ref().map_or(0..0, |r| r.span());
        let redis = raw.redis.map(Spanned::into_inner).unwrap_or_default();
        let nodes = &redis.nodes;
        // An absent `nodes` has an empty span: point at the [redis] table instead.
        let nodes_span = if nodes.span().is_empty() {
            redis_span
        } else {
            nodes.span()
        };
        match redis.mode {
            RedisMode::None => {}
            RedisMode::Cluster | RedisMode::Standalone if nodes.get_ref().is_empty() => {
                return Err(invalid(
                    nodes_span.clone(),
                    "redis.nodes".into(),
                    "list at least one \"host:port\" when redis.mode is cluster or standalone"
                        .into(),
                ))
            }
            RedisMode::Standalone if nodes.get_ref().len() > 1 => {
                return Err(invalid(
                    nodes_span.clone(),
                    "redis.nodes".into(),
                    "standalone mode takes exactly one \"host:port\"".into(),
                ))
            }
            _ => {}
        }
        for node in nodes.get_ref() {
            if parse_node(node).is_none() {
                return Err(invalid(
                    nodes_span.clone(),
                    "redis.nodes".into(),
                    format!("'{node}' is not \"host:port\""),
                ));
            }
        }

        let mut rules = HashMap::new();
        for (i, spanned) in raw.rule.iter().enumerate() {
            let r = spanned.get_ref();
            let field = |name: &str| format!("rule[{i}].{name}");
            let name = r.name.get_ref();
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
            {
                return Err(invalid(
                    r.name.span(),
                    field("name"),
                    format!("'{name}' must be 1 to 64 characters of A-Z a-z 0-9 _ - ."),
                ));
            }
            if rules.contains_key(name) {
                return Err(invalid(
                    r.name.span(),
                    field("name"),
                    format!("rule '{name}' is defined twice"),
                ));
            }
            let algorithm = rule_algorithm(r, spanned.span(), &field, &invalid)?;
            let fallback_hosts = match &r.fallback_hosts {
                Some(h) if !(1..=10_000).contains(h.get_ref()) => {
                    return Err(invalid(
                        h.span(),
                        field("fallback_hosts"),
                        "must be an integer from 1 to 10000".into(),
                    ))
                }
                Some(h) => *h.get_ref(),
                None => raw.fallback.hosts,
            };
            rules.insert(
                name.clone(),
                Arc::new(Rule::new(
                    name.clone(),
                    algorithm,
                    r.on_redis_failure,
                    fallback_hosts,
                )),
            );
        }
        Ok(Config {
            server: raw.server,
            redis,
            cache: raw.cache,
            fallback: raw.fallback,
            metrics: raw.metrics,
            rules,
        })
    }

    /// The per-decision Redis timeout.
    pub fn redis_timeout(&self) -> Duration {
        Duration::from_millis(self.redis.timeout_ms)
    }
}

/// The algorithm of rule `r` with its parameters, each checked and named in errors.
fn rule_algorithm(
    r: &RawRule,
    rule_span: Range<usize>,
    field: &dyn Fn(&str) -> String,
    invalid: &dyn Fn(Range<usize>, String, String) -> ConfigError,
) -> Result<Algorithm, ConfigError> {
    let name = *r.algorithm.get_ref();
    let takes: [&str; 2] = match name {
        AlgorithmName::TokenBucket => ["capacity", "refill_rate"],
        AlgorithmName::LeakyBucket => ["capacity", "leak_rate"],
        _ => ["limit", "window"],
    };
    let algo = name.as_str();
    let given = [
        ("capacity", r.capacity.as_ref().map(|s| s.span())),
        ("refill_rate", r.refill_rate.as_ref().map(|s| s.span())),
        ("leak_rate", r.leak_rate.as_ref().map(|s| s.span())),
        ("limit", r.limit.as_ref().map(|s| s.span())),
        ("window", r.window.as_ref().map(|s| s.span())),
    ];
    for (extra, span) in given {
        if let (Some(span), false) = (span, takes.contains(&extra)) {
            return Err(invalid(
                span,
                field(extra),
                format!(
                    "{algo} has no '{extra}' (it takes {} and {})",
                    takes[0], takes[1]
                ),
            ));
        }
    }
    let missing = |what: &str, hint: &str| {
        invalid(
            rule_span.clone(),
            field(what),
            format!("{algo} needs '{what}' ({hint})"),
        )
    };
    let count = |v: &Option<Spanned<u64>>, what: &str, max: u64| {
        let v = v.as_ref().ok_or_else(|| missing(what, "an integer ≥ 1"))?;
        if !(1..=max).contains(v.get_ref()) {
            return Err(invalid(
                v.span(),
                field(what),
                format!("must be an integer from 1 to {max}"),
            ));
        }
        Ok(*v.get_ref())
    };
    let rate = |v: &Option<Spanned<f64>>, what: &str| {
        let v = v.as_ref().ok_or_else(|| missing(what, "units/s, > 0"))?;
        if !(v.get_ref().is_finite() && (1e-6..=1e9).contains(v.get_ref())) {
            return Err(invalid(
                v.span(),
                field(what),
                "must be a number of units/s from 0.000001 to 1e9".into(),
            ));
        }
        Ok(*v.get_ref())
    };
    let window = || {
        let w = r.window.as_ref().ok_or_else(|| {
            missing(
                "window",
                "a duration such as \"500ms\", \"1s\", \"1m\", \"3h\", \"1d\"",
            )
        })?;
        let bad = |why: String| invalid(w.span(), field("window"), why);
        let d = humantime::parse_duration(w.get_ref()).map_err(|e| {
            bad(format!(
                "'{}' is not a duration such as \"500ms\", \"1m\" or \"1d\": {e}",
                w.get_ref()
            ))
        })?;
        let ms = d.as_millis();
        if d.subsec_nanos() % 1_000_000 != 0 || ms < 1 || ms > u128::from(MAX_WINDOW_MS) {
            return Err(bad(format!(
                "must be a whole number of ms from 1ms to 30d (got '{}')",
                w.get_ref()
            )));
        }
        Ok(ms as u64)
    };
    Ok(match name {
        AlgorithmName::TokenBucket => Algorithm::TokenBucket {
            capacity: count(&r.capacity, "capacity", MAX_CAPACITY)?,
            refill_rate: rate(&r.refill_rate, "refill_rate")?,
        },
        AlgorithmName::LeakyBucket => Algorithm::LeakyBucket {
            capacity: count(&r.capacity, "capacity", MAX_CAPACITY)?,
            leak_rate: rate(&r.leak_rate, "leak_rate")?,
        },
        AlgorithmName::FixedWindow => Algorithm::FixedWindow {
            limit: count(&r.limit, "limit", MAX_CAPACITY)?,
            window_ms: window()?,
        },
        AlgorithmName::SlidingWindowLog => Algorithm::SlidingWindowLog {
            limit: count(&r.limit, "limit", MAX_LOG_LIMIT)?,
            window_ms: window()?,
        },
        AlgorithmName::SlidingWindowCounter => Algorithm::SlidingWindowCounter {
            limit: count(&r.limit, "limit", MAX_CAPACITY)?,
            window_ms: window()?,
        },
    })
}

/// Splits a `redis.nodes` entry `"host:port"` into host and port (a port of 0 is
/// refused). Used by validation and by the Redis client, so both read it alike.
pub fn parse_node(node: &str) -> Option<(&str, u16)> {
    let (host, port) = node.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|&p| p > 0)?;
    (!host.is_empty()).then_some((host, port))
}

/// 1-based line number of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn ranged<'de, D: Deserializer<'de>>(
    d: D,
    field: &str,
    min: u64,
    max: u64,
) -> Result<u64, D::Error> {
    let v = i64::deserialize(d)?;
    if v < 0 || (v as u64) < min || (v as u64) > max {
        return Err(de::Error::custom(format!(
            "{field} must be an integer from {min} to {max} (got {v})"
        )));
    }
    Ok(v as u64)
}

fn de_max_line<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "server.max_line_bytes", 512, 1 << 20).map(|v| v as usize)
}

fn de_worker_threads<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "server.worker_threads", 0, 256).map(|v| v as usize)
}

fn de_in_flight<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "server.max_in_flight", 1, 65536).map(|v| v as usize)
}

fn de_ids<'de, D: Deserializer<'de>>(d: D, field: &str) -> Result<Vec<u32>, D::Error> {
    let ids = Vec::<i64>::deserialize(d)?;
    // u32::MAX is (uid_t)-1, "no id"; never a real peer.
    match ids
        .iter()
        .find(|&&v| !(0..i64::from(u32::MAX)).contains(&v))
    {
        Some(v) => Err(de::Error::custom(format!(
            "{field} entries must be integers from 0 to {} (got {v})",
            u32::MAX - 1
        ))),
        None => Ok(ids.into_iter().map(|v| v as u32).collect()),
    }
}

fn de_uids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    de_ids(d, "server.allow_uids")
}

fn de_gids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    de_ids(d, "server.allow_gids")
}

fn de_max_connections<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "server.max_connections", 1, 1_000_000).map(|v| v as usize)
}

fn de_idle_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ranged(d, "server.idle_timeout_ms", 0, 86_400_000)
}

fn de_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ranged(d, "redis.timeout_ms", 1, 60_000)
}

fn de_ttl<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ranged(d, "cache.ttl_ms", 0, 3_600_000)
}

fn de_hosts<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "fallback.hosts", 1, 10_000).map(|v| v as u32)
}

fn de_max_keys<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ranged(d, "fallback.max_keys", 1, 1 << 40)
}

fn de_mode<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    struct ModeVisitor;
    impl de::Visitor<'_> for ModeVisitor {
        type Value = u32;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("server.socket_mode as an octal string such as \"0660\"")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<u32, E> {
            match u32::from_str_radix(s, 8) {
                Ok(m) if !s.is_empty() && m <= 0o777 => Ok(m),
                _ => Err(E::custom(format!(
                    "server.socket_mode must be an octal string from \"0000\" to \"0777\" (got \"{s}\")"
                ))),
            }
        }
    }
    d.deserialize_str(ModeVisitor)
}

fn de_prefix<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty()
        || s.len() > 64
        || !s
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}')
    {
        return Err(de::Error::custom(format!(
            "redis.prefix must be 1 to 64 printable characters without spaces or braces (got \"{s}\")"
        )));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[server]
socket = "/tmp/x.sock"
socket_mode = "0600"

[redis]
mode = "cluster"
nodes = ["127.0.0.1:7000", "127.0.0.1:7001"]
timeout_ms = 30

[[rule]]
name = "rides_request"
algorithm = "token_bucket"
capacity = 20
refill_rate = 10.0
on_redis_failure = "deny"
fallback_hosts = 2
"#;

    fn err(text: &str) -> String {
        Config::parse(text, "t.toml").unwrap_err().to_string()
    }

    #[test]
    fn parses_a_full_config() {
        let c = Config::parse(GOOD, "t.toml").unwrap();
        assert_eq!(c.server.socket_mode, 0o600);
        assert_eq!(c.server.max_line_bytes, 1024);
        assert_eq!(c.redis.mode, RedisMode::Cluster);
        assert_eq!(c.redis.timeout_ms, 30);
        let r = &c.rules["rides_request"];
        assert_eq!(r.limit(), 20);
        assert_eq!(r.on_redis_failure, OnRedisFailure::Deny);
        assert_eq!(r.fallback_hosts, 2);
    }

    #[test]
    fn empty_config_is_local_only() {
        let c = Config::parse("", "t.toml").unwrap();
        assert_eq!(c.redis.mode, RedisMode::None);
        assert!(c.rules.is_empty());
    }

    #[test]
    fn misspelt_field_is_named_with_its_line() {
        let e = err(&GOOD.replace("refill_rate", "refil_rate"));
        assert!(e.contains("refil_rate") && e.contains("line 15"), "{e}");
        let e = err(&GOOD.replace("timeout_ms", "timeout"));
        assert!(e.contains("timeout") && e.contains("line 9"), "{e}");
    }

    #[test]
    fn bad_values_are_named_with_their_line() {
        for (from, to, field, line) in [
            ("capacity = 20", "capacity = 0", "rule[0].capacity", 14),
            (
                "refill_rate = 10.0",
                "refill_rate = 0.0",
                "rule[0].refill_rate",
                15,
            ),
            ("timeout_ms = 30", "timeout_ms = 0", "redis.timeout_ms", 9),
            ("\"0600\"", "\"0999\"", "server.socket_mode", 4),
            (
                "fallback_hosts = 2",
                "fallback_hosts = 0",
                "rule[0].fallback_hosts",
                17,
            ),
            ("\"127.0.0.1:7001\"", "\"nope\"", "redis.nodes", 8),
            (
                "refill_rate = 10.0",
                "window = \"1s\"",
                "rule[0].window",
                15,
            ),
            ("rides_request", "bad name", "rule[0].name", 12),
            ("\"deny\"", "\"maybe\"", "maybe", 16),
        ] {
            let e = err(&GOOD.replace(from, to));
            assert!(e.contains(field), "{field}: {e}");
            assert!(
                e.contains(&format!("line {line}")) || e.contains(&format!(":{line}:")),
                "{field} line {line}: {e}"
            );
        }
    }

    #[test]
    fn missing_parameter_and_duplicate_rule() {
        let e = err(&GOOD.replace("refill_rate = 10.0\n", ""));
        assert!(e.contains("rule[0].refill_rate"), "{e}");
        let twice = format!("{GOOD}\n[[rule]]\nname = \"rides_request\"\nalgorithm = \"token_bucket\"\ncapacity = 1\nrefill_rate = 1.0\n");
        assert!(err(&twice).contains("defined twice"));
        let e = err("\n[redis]\nmode = \"cluster\"\n");
        assert!(e.contains(":2: redis.nodes"), "{e}");
        let none_nodes = GOOD.replace(
            "nodes = [\"127.0.0.1:7000\", \"127.0.0.1:7001\"]",
            "nodes = []",
        );
        assert!(err(&none_nodes).contains("redis.nodes"));
    }

    const FIVE: &str = r#"
[[rule]]
name = "tb"
algorithm = "token_bucket"
capacity = 20
refill_rate = 10.0

[[rule]]
name = "lb"
algorithm = "leaky_bucket"
capacity = 5000
leak_rate = 3000.0

[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 100
window = "1m"

[[rule]]
name = "swl"
algorithm = "sliding_window_log"
limit = 5
window = "15m"

[[rule]]
name = "swc"
algorithm = "sliding_window_counter"
limit = 600
window = "500ms"
fallback_hosts = 4
"#;

    #[test]
    fn parses_all_five_algorithms() {
        let c = Config::parse(FIVE, "t.toml").unwrap();
        assert_eq!(
            c.rules["lb"].algorithm,
            Algorithm::LeakyBucket {
                capacity: 5000,
                leak_rate: 3000.0
            }
        );
        assert_eq!(
            c.rules["fw"].algorithm,
            Algorithm::FixedWindow {
                limit: 100,
                window_ms: 60_000
            }
        );
        assert_eq!(c.rules["swl"].limit(), 5);
        let swc = &c.rules["swc"];
        assert_eq!(
            swc.fallback_params,
            algorithm::Params::SlidingWindowCounter(WindowParams {
                limit: 150.0,
                window: 500_000.0
            })
        );
    }

    #[test]
    fn window_rules_are_checked_field_by_field() {
        for (from, to, field, says) in [
            (
                "window = \"1m\"",
                "window = \"1x\"",
                "rule[2].window",
                "not a duration",
            ),
            (
                "window = \"1m\"",
                "window = \"1500us\"",
                "rule[2].window",
                "whole number of ms",
            ),
            (
                "window = \"1m\"",
                "window = \"31d\"",
                "rule[2].window",
                "30d",
            ),
            ("window = \"1m\"", "", "rule[2].window", "needs 'window'"),
            ("limit = 5\n", "limit = 20000\n", "rule[3].limit", "10000"),
            (
                "limit = 100",
                "capacity = 100",
                "rule[2].capacity",
                "fixed_window has no 'capacity'",
            ),
            (
                "leak_rate = 3000.0",
                "leak_rate = 0.0",
                "rule[1].leak_rate",
                "units/s",
            ),
            (
                "leak_rate = 3000.0",
                "refill_rate = 1.0",
                "rule[1].refill_rate",
                "has no 'refill_rate'",
            ),
        ] {
            let e = err(&FIVE.replacen(from, to, 1));
            assert!(e.contains(field) && e.contains(says), "{field}: {e}");
        }
    }
}
