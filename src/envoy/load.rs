//! Builds the [`Limits`] tree from envoyproxy/ratelimit's YAML files, unchanged, and the
//! `[[envoy.descriptor]]` tables of the TOML configuration.
//!
//! Every `*.yaml` / `*.yml` file of `config_dir` (not hidden, not in subdirectories;
//! in name order) is one domain: `domain`, and nested `descriptors` of `key`, optional
//! `value`, `rate_limit` {`unit`, `requests_per_unit`, `unlimited`, `name`,
//! `replaces`}, `shadow_mode`, `descriptors`. Every error names the file, the line and
//! the field. What their loader rejects, this one rejects too (empty domain or key, a
//! domain in two files, a descriptor twice at one level, a bad unit, a unit with
//! `unlimited`, a limit replacing itself); in addition, misplaced fields and duplicate
//! keys are errors here, and every error has its line. One file's fields are read by
//! `super::file`.

use super::limits::{Decider, Limit, Limits, Shared, Unit};
use crate::config::envoy::DescriptorRule;
use crate::config::{Config, ConfigError, Hosts};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The Envoy limits `config` names (`[envoy] config_dir`'s YAML files and
/// `[[envoy.descriptor]]`) when `[envoy] listen` is set; `None` without it.
///
/// # Errors
/// A file that cannot be read, or a limit that is not valid (file, line and field).
pub fn limits_for(config: &Config) -> Result<Option<Shared>, ConfigError> {
    if config.envoy.listen.is_none() {
        return Ok(None);
    }
    let mut limits = load(
        config.envoy.config_dir.as_deref(),
        &config.envoy.descriptors,
        config.fallback.hosts,
    )?;
    limits.ietf_headers = config.envoy.ietf_headers;
    limits.strict = config.envoy.strict;
    Ok(Some(Arc::new(limits)))
}

/// The limits of the YAML files in `dir` (if any) and of `toml`; `hosts` is
/// `[fallback] hosts` (the local share of the YAML limits while Redis is unreachable).
pub fn load(
    dir: Option<&Path>,
    toml: &[DescriptorRule],
    hosts: Hosts,
) -> Result<Limits, ConfigError> {
    let mut loader = Loader {
        limits: Limits::default(),
        domain: String::new(),
        hosts,
        file: String::new(),
    };
    if let Some(dir) = dir {
        for path in yaml_files(dir)? {
            let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            loader.file = path.display().to_string();
            loader.file_text(&text)?;
        }
    }
    for d in toml {
        loader.toml(d)?;
    }
    Ok(loader.limits)
}

/// The `*.yaml` / `*.yml` files of `dir`, hidden ones (`.x.yaml`, Kubernetes' `..data`)
/// excepted, sorted by name.
fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let read = |source: std::io::Error| ConfigError::Parse {
        path: dir.display().to_string(),
        message: format!("envoy.config_dir: cannot read the directory: {source}"),
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        let path = entry.map_err(read)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if yaml && !name.starts_with('.') && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Parses one file's text (`origin` names it) into `limits`: for tests and tools.
pub fn parse_into(
    limits: Limits,
    origin: &str,
    text: &str,
    hosts: Hosts,
) -> Result<Limits, ConfigError> {
    let mut loader = Loader {
        limits,
        domain: String::new(),
        hosts,
        file: origin.to_owned(),
    };
    loader.file_text(text)?;
    Ok(loader.limits)
}

/// The tree being built, and where the loader is (for errors and rule names).
pub(super) struct Loader {
    pub(super) limits: Limits,
    /// The domain of the file being read.
    pub(super) domain: String,
    /// `[fallback] hosts`.
    pub(super) hosts: Hosts,
    /// The file being read.
    pub(super) file: String,
}

impl Loader {
    pub(super) fn add(&mut self, mut limit: Limit) -> Arc<Limit> {
        limit.id = self.limits.all.len();
        let limit = Arc::new(limit);
        self.limits.all.push(Arc::clone(&limit));
        limit
    }

    /// Merges a `[[envoy.descriptor]]` into its domain's tree.
    fn toml(&mut self, d: &DescriptorRule) -> Result<(), ConfigError> {
        let rule = &d.rule;
        let mut path = d.domain.clone();
        for (k, v) in &d.entries {
            path.push('.');
            path.push_str(k);
            if !v.is_empty() {
                path.push('_');
                path.push_str(v);
            }
        }
        let limit = self.add(Limit {
            id: 0,
            decider: Decider::Rule(Arc::clone(rule)),
            requests_per_unit: rule.limit().min(u64::from(u32::MAX)) as u32,
            unit: Some(Unit::at_most(rule.window_ms)),
            window_ms: rule.window_ms,
            name: String::new(),
            replaces: Vec::new(),
            shadow_mode: d.shadow_mode,
            domain: d.domain.clone(),
            path: path.clone(),
            origin: d.origin.clone(),
        });
        let mut node = self.limits.domains.entry(d.domain.clone()).or_default();
        for (k, v) in &d.entries {
            let final_key = if v.is_empty() {
                k.clone()
            } else {
                format!("{k}_{v}")
            };
            if final_key.contains('*') && !node.children.contains_key(&final_key) {
                let parts = final_key.split('*').map(str::to_owned).collect();
                node.wildcards.push((final_key.clone(), parts));
            }
            node = node.children.entry(final_key).or_default();
        }
        if let Some(other) = &node.limit {
            return Err(ConfigError::Parse {
                path: d.origin.clone(),
                message: format!("descriptor '{path}' already has a limit ({})", other.origin),
            });
        }
        node.limit = Some(limit);
        Ok(())
    }
}

/// `field.name` (`name` alone at the top).
pub(super) fn join(field: &str, name: &str) -> String {
    if field.is_empty() {
        name.to_owned()
    } else {
        format!("{field}.{name}")
    }
}
