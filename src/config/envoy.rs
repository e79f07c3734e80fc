//! `[envoy]`: the optional Envoy Rate Limit Service front end (docs/ENVOY.md): where it
//! listens, where envoyproxy/ratelimit's YAML files are, and which TOML rules decide
//! which descriptors (`[[envoy.descriptor]]`).
//!
//! Only the TOML side is parsed here; the YAML files are read by the Envoy module
//! (`crate::envoy::load::limits_for`) right after the TOML, at start-up and on each
//! reload, so a reload applies TOML and YAML together or neither.

use super::{ConfigError, Locator, Rule};
use serde::{Deserialize, Deserializer};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use toml::Spanned;

/// Where the gRPC server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvoyListen {
    /// A TCP address (`"127.0.0.1:8081"`): the RLS API has no authentication, so any
    /// process that can reach it spends budgets through it (a warning at start).
    Tcp(SocketAddr),
    /// A Unix stream socket (`"unix:/run/ratelimitd/rls.sock"`), created like
    /// `server.socket` with `server.socket_mode`: only peers the file lets in reach it.
    Unix(PathBuf),
}

impl EnvoyListen {
    /// The listener of a front end configured without `listen`: `rls.sock` beside
    /// `server.socket` (`/run/ratelimitd/rls.sock` by default), a Unix socket made with
    /// the same care and mode as the main one.
    pub fn default_beside(socket: &Path) -> EnvoyListen {
        EnvoyListen::Unix(socket.with_file_name(DEFAULT_SOCKET_NAME))
    }
}

/// The file name of the default Unix socket of the front end, beside `server.socket`.
pub const DEFAULT_SOCKET_NAME: &str = "rls.sock";

impl std::fmt::Display for EnvoyListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvoyListen::Tcp(a) => write!(f, "{a}"),
            EnvoyListen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

fn de_envoy_listen<'de, D: Deserializer<'de>>(d: D) -> Result<Option<EnvoyListen>, D::Error> {
    let s = String::deserialize(d)?;
    if let Some(path) = s.strip_prefix("unix:") {
        if !path.starts_with('/') {
            return Err(serde::de::Error::custom(format!(
                "envoy.listen = \"{s}\": a Unix socket needs an absolute path (\"unix:/run/ratelimitd/rls.sock\")"
            )));
        }
        return Ok(Some(EnvoyListen::Unix(PathBuf::from(path))));
    }
    s.parse().map(|a| Some(EnvoyListen::Tcp(a))).map_err(|_| {
        serde::de::Error::custom(format!(
            "envoy.listen = \"{s}\": expected \"ip:port\" (\"127.0.0.1:8081\") or \"unix:/path\""
        ))
    })
}

/// `[[envoy.descriptor]]` as written: a descriptor path decided by a TOML rule, so a
/// descriptor can use any of the five algorithms.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDescriptorRule {
    domain: Spanned<String>,
    entries: Spanned<Vec<String>>,
    rule: Spanned<String>,
    #[serde(default)]
    shadow_mode: bool,
}

/// A validated `[[envoy.descriptor]]`: the descriptor path
/// `entries` (each `key` or `key=value`, a value may hold `*` wildcards, as in the YAML
/// files) in `domain` is decided by `rule`.
#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorRule {
    /// The domain.
    pub domain: String,
    /// `(key, value)` per level; an empty value is the bare key (a counter per value).
    pub entries: Vec<(String, String)>,
    /// The TOML rule deciding it.
    pub rule: Arc<Rule>,
    /// Over-limit answers are turned into OK (counted in the metrics).
    pub shadow_mode: bool,
    /// `envoy.descriptor[i]` and its line, for errors found when merging with the YAML.
    pub origin: String,
}

/// `[envoy]` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawEnvoyConfig {
    #[serde(deserialize_with = "de_envoy_listen")]
    listen: Option<EnvoyListen>,
    config_dir: Option<PathBuf>,
    ietf_headers: bool,
    strict: bool,
    descriptor: Vec<Spanned<RawDescriptorRule>>,
}

/// `[envoy]`, validated. Off unless `listen`, `config_dir` or a `[[envoy.descriptor]]`
/// is set; without `listen`, on a Unix socket beside `server.socket`
/// ([`EnvoyListen::default_beside`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvoyConfig {
    /// Where the RLS gRPC server listens; `None`: no server.
    pub listen: Option<EnvoyListen>,
    /// Directory whose `*.yaml` / `*.yml` files are envoyproxy/ratelimit configuration
    /// (made relative to the TOML file's directory by [`super::Config::load`]).
    pub config_dir: Option<PathBuf>,
    /// Add the IETF `RateLimit-Policy` and `RateLimit` headers (draft-ietf-httpapi-
    /// ratelimit-headers) to every response through `response_headers_to_add`, for the
    /// descriptor closest to its limit. Off by default: Envoy's own `x-ratelimit-*`
    /// headers (`enable_x_ratelimit_headers`) need nothing from here.
    pub ietf_headers: bool,
    /// Strict mode: a request's descriptors are decided all or nothing (the limiter's
    /// `check_all`), so a request over one descriptor's limit takes nothing from the
    /// others. Off by default: each descriptor is taken on its own, as
    /// envoyproxy/ratelimit does (docs/ENVOY.md, "Strict mode").
    pub strict: bool,
    /// Descriptors decided by TOML rules.
    pub descriptors: Vec<DescriptorRule>,
}

impl RawEnvoyConfig {
    /// Checks the descriptor rules against `rules` (by name); a front end with limits
    /// but no `listen` listens on `rls.sock` beside `socket` (`server.socket`).
    pub(super) fn validate(
        self,
        rules: &HashMap<String, Arc<Rule>>,
        socket: &Path,
        at: &Locator,
    ) -> Result<EnvoyConfig, ConfigError> {
        let mut descriptors = Vec::with_capacity(self.descriptor.len());
        for (i, d) in self.descriptor.iter().enumerate() {
            let span = d.span();
            let d = d.get_ref();
            let field = |f: &str| format!("envoy.descriptor[{i}].{f}");
            if d.domain.get_ref().is_empty() {
                return Err(at.invalid(d.domain.span(), &field("domain"), "is empty"));
            }
            let Some(rule) = rules.get(d.rule.get_ref()) else {
                return Err(at.invalid(
                    d.rule.span(),
                    &field("rule"),
                    &format!("no [[rule]] is named '{}'", d.rule.get_ref()),
                ));
            };
            if d.entries.get_ref().is_empty() {
                return Err(at.invalid(d.entries.span(), &field("entries"), "is empty"));
            }
            let mut entries = Vec::new();
            for e in d.entries.get_ref() {
                let (key, value) = e.split_once('=').unwrap_or((e.as_str(), ""));
                if key.is_empty() {
                    return Err(at.invalid(
                        d.entries.span(),
                        &field("entries"),
                        &format!("'{e}': expected \"key\" or \"key=value\""),
                    ));
                }
                entries.push((key.to_owned(), value.to_owned()));
            }
            let line = at.invalid(span, "", "");
            let origin = match line {
                ConfigError::Invalid { path, line, .. } => {
                    format!("{path}:{line}: envoy.descriptor[{i}]")
                }
                other => other.to_string(),
            };
            descriptors.push(DescriptorRule {
                domain: d.domain.get_ref().clone(),
                entries,
                rule: Arc::clone(rule),
                shadow_mode: d.shadow_mode,
                origin,
            });
        }
        let configured = self.config_dir.is_some() || !descriptors.is_empty();
        let listen = self
            .listen
            .or_else(|| configured.then(|| EnvoyListen::default_beside(socket)));
        Ok(EnvoyConfig {
            listen,
            config_dir: self.config_dir,
            ietf_headers: self.ietf_headers,
            strict: self.strict,
            descriptors,
        })
    }
}
