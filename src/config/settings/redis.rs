//! `[redis]`: which Redis deployment holds the shared state and how the daemon reaches
//! it (nodes or sentinels, TLS, the ACL user and its password file), and the checks of
//! those fields against each other, which no single value's check can make.

use crate::config::de::*;
use crate::config::{ConfigError, Locator};
use serde::Deserialize;
use std::path::PathBuf;
use toml::Spanned;

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

impl RedisConfig {
    /// Checks what single values cannot: `nodes` against `mode`. `table` is the span of
    /// the `[redis]` table (where an absent `nodes` is reported).
    pub(in crate::config) fn validate(
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
