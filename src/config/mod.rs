//! The TOML configuration (docs/CONFIGURATION.md), parsed with serde and
//! validated in full before anything uses it.
//!
//! Unknown fields and bad values are errors that name the field and its line.
//! * [`settings`]: `[server]`, `[redis]`, `[cache]`, `[fallback]`, `[metrics]`;
//! * [`rules`]: the `[[rule]]` tables;
//! * [`envoy`]: `[envoy]`, the Envoy Rate Limit Service front end;
//! * [`de`]: the serde helpers and range checks;
//! * [`diff`]: what a reload may change and what needs a restart.

mod de;
pub mod diff;
pub mod envoy;
pub mod rules;
pub mod settings;

pub use crate::algorithm::Algorithm;
pub use rules::{OnRedisFailure, Rule};
pub use settings::{
    parse_node, CacheConfig, FallbackConfig, Hosts, MetricsConfig, RedisConfig, RedisMode,
    ServerConfig,
};

use serde::Deserialize;
use std::collections::HashMap;
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

/// Turns a span of the text being parsed into the file and line of a
/// [`ConfigError::Invalid`].
pub(crate) struct Locator<'a> {
    origin: &'a str,
    text: &'a str,
}

impl Locator<'_> {
    /// `field` at `span` is wrong: `message`.
    pub(crate) fn invalid(&self, span: Range<usize>, field: &str, message: &str) -> ConfigError {
        ConfigError::Invalid {
            path: self.origin.to_owned(),
            line: de::line_of(self.text, span.start),
            field: field.to_owned(),
            message: message.to_owned(),
        }
    }
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
    rule: Vec<Spanned<rules::RawRule>>,
    #[serde(default)]
    envoy: envoy::RawEnvoyConfig,
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
    /// `[envoy]`.
    pub envoy: envoy::EnvoyConfig,
}

impl Config {
    /// Reads and validates the file at `path`. A relative `[envoy] config_dir` is made
    /// relative to the file's directory; the Envoy module loads the limits it names
    /// (`crate::envoy::load::limits_for`).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Config::parse(&text, &path.display().to_string())?;
        if let (Some(dir), Some(base)) = (&config.envoy.config_dir, path.parent()) {
            config.envoy.config_dir = Some(base.join(dir));
        }
        Ok(config)
    }

    /// Parses and validates `text`; `origin` names it in errors (a path).
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let at = Locator { origin, text };
        raw.server.validate(&at)?;
        let redis_span = raw.redis.as_ref().map_or(0..0, |r| r.span());
        let redis = raw.redis.map(Spanned::into_inner).unwrap_or_default();
        redis.validate(redis_span, &at)?;
        let mut rules = HashMap::new();
        for (i, spanned) in raw.rule.iter().enumerate() {
            let r = spanned.get_ref();
            let name = r.name();
            if rules.contains_key(name.get_ref()) {
                return Err(at.invalid(
                    name.span(),
                    &format!("rule[{i}].name"),
                    &format!("rule '{}' is defined twice", name.get_ref()),
                ));
            }
            let rule = r.validate(i, spanned.span(), raw.fallback.hosts, &at)?;
            rules.insert(rule.name.clone(), Arc::new(rule));
        }
        let envoy = raw.envoy.validate(&rules, &raw.server.socket, &at)?;
        Ok(Config {
            server: raw.server,
            redis,
            cache: raw.cache,
            fallback: raw.fallback,
            metrics: raw.metrics,
            rules,
            envoy,
        })
    }

    /// The per-decision Redis timeout.
    pub fn redis_timeout(&self) -> Duration {
        self.redis.timeout()
    }
}

/// A uid/gid allow-list (`server.allow_uids` / `allow_gids`, or a rule's): both empty
/// lets every peer through; otherwise a peer needs its uid in `uids` or its (effective,
/// primary) gid in `gids`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerAccess {
    /// Allowed peer uids.
    pub uids: Vec<u32>,
    /// Allowed peer gids (primary gid only: `SO_PEERCRED` carries no supplementary groups).
    pub gids: Vec<u32>,
}

impl PeerAccess {
    /// True if a peer with `uid` and `gid` may be served.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        self.is_open() || self.uids.contains(&uid) || self.gids.contains(&gid)
    }

    /// True if `uid` is in `uids` or `gid` in `gids`: unlike [`PeerAccess::allows`],
    /// empty lists name nobody (the operator lists, `server.admin_uids` / `admin_gids`).
    pub fn lists(&self, uid: u32, gid: u32) -> bool {
        self.uids.contains(&uid) || self.gids.contains(&gid)
    }

    /// True if the lists restrict nothing (both empty).
    pub fn is_open(&self) -> bool {
        self.uids.is_empty() && self.gids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{self, Kind, Per, WindowParams};

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
            Algorithm {
                kind: Kind::LeakyBucket,
                limit: 5000,
                per: Per::Rate(3000.0)
            }
        );
        assert_eq!(
            c.rules["fw"].algorithm,
            Algorithm {
                kind: Kind::FixedWindow,
                limit: 100,
                per: Per::WindowMs(60_000)
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
