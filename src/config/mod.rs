//! The TOML configuration (docs/CONFIGURATION.md), parsed with serde and
//! validated in full before anything uses it.
//!
//! Unknown fields and bad values are errors that name the field and its line.
//! * [`settings`]: `[server]`, `[redis]`, `[cache]`, `[fallback]`, `[metrics]`;
//! * [`rules`]: the `[[rule]]` tables;
//! * [`composite`]: composite rules (`all_of`) over them;
//! * [`overrides`]: per-key overrides (`[[rule.override]]`);
//! * [`envoy`]: `[envoy]`, the Envoy Rate Limit Service front end;
//! * [`de`]: the serde helpers and range checks;
//! * [`diff`]: what a reload may change and what needs a restart.

pub mod composite;
mod de;
pub mod diff;
pub mod envoy;
pub mod http;
pub mod overrides;
pub mod rules;
pub mod settings;

pub use crate::algorithm::Algorithm;
pub use http::HttpConfig;
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
    http: HttpConfig,
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
    /// `[metrics]` as written (its `listen` is the older name of `[http] listen`).
    pub metrics: MetricsConfig,
    /// `[http]` in force, `[metrics] listen` folded in ([`HttpConfig`]).
    pub http: HttpConfig,
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
        // The rules of their own first, then the composites over them.
        let composite = |r: &Spanned<rules::RawRule>| r.get_ref().all_of.is_some();
        let order = (raw.rule.iter().enumerate().filter(|(_, r)| !composite(r)))
            .chain(raw.rule.iter().enumerate().filter(|(_, r)| composite(r)));
        for (i, spanned) in order {
            let r = spanned.get_ref();
            let name = r.name();
            if rules.contains_key(name.get_ref()) {
                return Err(at.invalid(
                    name.span(),
                    &format!("rule[{i}].name"),
                    &format!("rule '{}' is defined twice", name.get_ref()),
                ));
            }
            let rule = if composite(spanned) {
                r.composite(i, spanned.span(), &rules, &at)?
            } else {
                r.validate(i, spanned.span(), raw.fallback.hosts, &at)?
            };
            rules.insert(rule.name.clone(), Arc::new(rule));
        }
        let envoy = raw.envoy.validate(&rules, &raw.server.socket, &at)?;
        let http = raw.http.merged(&raw.metrics, &at, text)?;
        Ok(Config {
            server: raw.server,
            redis,
            cache: raw.cache,
            fallback: raw.fallback,
            metrics: raw.metrics,
            http,
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
mod tests;
