//! Builds the [`Limits`] tree from envoyproxy/ratelimit's YAML files, unchanged, and the
//! `[[envoy.descriptor]]` tables of the TOML configuration.
//!
//! Every `*.yaml` / `*.yml` file of `config_dir` (not hidden, not in subdirectories;
//! in name order) is one domain: `domain`, and nested `descriptors` of `key`, optional
//! `value`, `rate_limit` {`unit`, `requests_per_unit`, `unlimited`, `name`,
//! `replaces`}, `shadow_mode`, `descriptors`. Every error names the file, the line and
//! the field. What their loader rejects, this one rejects too (empty domain or key, a
//! domain in two files, a descriptor twice at one level, a bad unit, a unit with
//! `unlimited`, a limit replacing itself); in addition, unknown or misplaced fields and
//! duplicate keys are errors here, where they silently do nothing there.

use super::limits::{rule_name, Decider, Limit, Limits, Node, Unit};
use super::yaml::{self, Kind, Node as Y};
use crate::algorithm::{Algorithm, Kind as Algo, Per, MAX_LIMIT};
use crate::config::envoy::DescriptorRule;
use crate::config::{ConfigError, Hosts, OnRedisFailure, Rule};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Fields of envoyproxy/ratelimit's descriptors that only change their metrics or
/// response metadata: accepted and ignored (docs/ENVOY.md).
const IGNORED: [&str; 3] = ["detailed_metric", "value_to_metric", "metadata"];

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

struct Loader {
    limits: Limits,
    /// The domain of the file being read.
    domain: String,
    hosts: Hosts,
    file: String,
}

impl Loader {
    fn err(&self, line: usize, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.file.clone(),
            line,
            field: field.to_owned(),
            message: message.into(),
        }
    }

    /// The pairs of a mapping, with every key known to `allowed`.
    fn fields<'n>(
        &self,
        node: &'n Y,
        field: &str,
        allowed: &[&str],
    ) -> Result<Vec<(&'n str, &'n Y)>, ConfigError> {
        let Kind::Map(pairs) = &node.kind else {
            return Err(self.err(
                node.line,
                field,
                format!("expected a mapping, found {}", node.what()),
            ));
        };
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            let name = match &k.kind {
                Kind::Scalar { text, .. } => text.as_str(),
                _ => "",
            };
            if !allowed.contains(&name) && !IGNORED.contains(&name) {
                let at = if field.is_empty() {
                    String::new()
                } else {
                    format!(" in {field}")
                };
                return Err(self.err(
                    k.line,
                    &join(field, name),
                    format!(
                        "unknown field{at} (expected one of: {})",
                        allowed.join(", ")
                    ),
                ));
            }
            if !IGNORED.contains(&name) {
                out.push((name, v));
            }
        }
        Ok(out)
    }

    fn string(&self, node: &Y, field: &str) -> Result<String, ConfigError> {
        match &node.kind {
            _ if node.is_null() => Ok(String::new()),
            Kind::Scalar { text, .. } => Ok(text.clone()),
            _ => Err(self.err(
                node.line,
                field,
                format!("expected a string, found {}", node.what()),
            )),
        }
    }

    fn boolean(&self, node: &Y, field: &str) -> Result<bool, ConfigError> {
        if let Kind::Scalar { text, plain: true } = &node.kind {
            match text.as_str() {
                "true" | "True" | "TRUE" | "yes" | "on" => return Ok(true),
                "false" | "False" | "FALSE" | "no" | "off" => return Ok(false),
                _ => {}
            }
        }
        Err(self.err(node.line, field, "expected true or false"))
    }

    fn file_text(&mut self, text: &str) -> Result<(), ConfigError> {
        let root = yaml::parse(text)
            .map_err(|e| self.err(e.line, "", e.message))?
            .unwrap_or(Y {
                line: 1,
                kind: Kind::Map(Vec::new()),
            });
        let mut domain = String::new();
        let mut descriptors = None;
        for (name, value) in self.fields(&root, "", &["domain", "descriptors"])? {
            match name {
                "domain" => domain = self.string(value, "domain")?,
                _ => descriptors = Some(value),
            }
        }
        if domain.is_empty() {
            return Err(self.err(root.line, "domain", "config file cannot have empty domain"));
        }
        if self.limits.domains.contains_key(&domain) {
            return Err(self.err(
                root.line,
                "domain",
                format!("duplicate domain '{domain}' (another file already defines it)"),
            ));
        }
        self.domain.clone_from(&domain);
        let mut node = Node::default();
        if let Some(list) = descriptors {
            self.descriptors(&mut node, &domain, list, "descriptors")?;
        }
        self.limits.domains.insert(domain, node);
        Ok(())
    }

    fn descriptors(
        &mut self,
        parent: &mut Node,
        path: &str,
        list: &Y,
        field: &str,
    ) -> Result<(), ConfigError> {
        let items = match &list.kind {
            Kind::Seq(items) => items.as_slice(),
            _ if list.is_null() => &[],
            _ => {
                return Err(self.err(
                    list.line,
                    field,
                    format!("expected a list, found {}", list.what()),
                ))
            }
        };
        for (i, item) in items.iter().enumerate() {
            let field = format!("{field}[{i}]");
            let (mut key, mut value, mut rate_limit, mut children, mut shadow) =
                (String::new(), String::new(), None, None, false);
            let mut share = None;
            let allowed = [
                "key",
                "value",
                "rate_limit",
                "descriptors",
                "shadow_mode",
                "quota_mode",
                "share_threshold",
            ];
            for (name, v) in self.fields(item, &field, &allowed)? {
                let f = join(&field, name);
                match name {
                    "key" => key = self.string(v, &f)?,
                    "value" => value = self.string(v, &f)?,
                    "rate_limit" => rate_limit = Some(v),
                    "descriptors" => children = Some(v),
                    "shadow_mode" => shadow = self.boolean(v, &f)?,
                    "share_threshold" => share = Some((self.boolean(v, &f)?, v.line)),
                    _ => {
                        if self.boolean(v, &f)? {
                            return Err(self.err(
                                v.line,
                                &f,
                                "quota_mode is not supported by ratelimitd",
                            ));
                        }
                    }
                }
            }
            if key.is_empty() {
                return Err(self.err(item.line, &join(&field, "key"), "descriptor has empty key"));
            }
            let final_key = if value.is_empty() {
                key.clone()
            } else {
                format!("{key}_{value}")
            };
            let path = format!("{path}.{final_key}");
            if parent.children.contains_key(&final_key) {
                return Err(self.err(
                    item.line,
                    &field,
                    format!("duplicate descriptor composite key '{path}'"),
                ));
            }
            let mut node = Node::default();
            if let Some((share, line)) = share {
                if share && !final_key.contains('*') {
                    return Err(self.err(line, &join(&field, "share_threshold"), format!("share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'")));
                }
                node.share_threshold = share;
            }
            if let Some(rl) = rate_limit {
                node.limit =
                    Some(self.rate_limit(rl, &join(&field, "rate_limit"), &path, shadow)?);
            }
            if let Some(list) = children {
                self.descriptors(&mut node, &path, list, &join(&field, "descriptors"))?;
            }
            if final_key.contains('*') {
                let parts = final_key.split('*').map(str::to_owned).collect();
                parent.wildcards.push((final_key.clone(), parts));
            }
            parent.children.insert(final_key, node);
        }
        Ok(())
    }

    fn rate_limit(
        &mut self,
        node: &Y,
        field: &str,
        path: &str,
        shadow_mode: bool,
    ) -> Result<Arc<Limit>, ConfigError> {
        let (mut unit, mut unit_line, mut rpu, mut unlimited, mut name, mut replaces) = (
            String::new(),
            node.line,
            0u64,
            false,
            String::new(),
            Vec::new(),
        );
        let allowed = ["unit", "requests_per_unit", "unlimited", "name", "replaces"];
        for (key, v) in self.fields(node, field, &allowed)? {
            let f = join(field, key);
            match key {
                "unit" => (unit, unit_line) = (self.string(v, &f)?, v.line),
                "requests_per_unit" => {
                    rpu = self
                        .string(v, &f)?
                        .parse()
                        .ok()
                        .filter(|n| *n <= u64::from(u32::MAX))
                        .ok_or_else(|| self.err(v.line, &f, "expected an integer 0..=4294967295"))?
                }
                "unlimited" => unlimited = self.boolean(v, &f)?,
                "name" => name = self.string(v, &f)?,
                _ => {
                    let Kind::Seq(items) = &v.kind else {
                        return Err(self.err(v.line, &f, "expected a list of {name: ...}"));
                    };
                    for (i, item) in items.iter().enumerate() {
                        let f = format!("{f}[{i}]");
                        let mut r = String::new();
                        for (_, n) in self.fields(item, &f, &["name"])? {
                            r = self.string(n, &join(&f, "name"))?;
                        }
                        if r.is_empty() {
                            return Err(self.err(
                                item.line,
                                &f,
                                "should not have an empty replaces entry",
                            ));
                        }
                        replaces.push(r);
                    }
                }
            }
        }
        let parsed = Unit::parse(&unit);
        let f = join(field, "unit");
        if unlimited && parsed.is_some() {
            return Err(self.err(
                unit_line,
                &f,
                "should not specify rate limit unit when unlimited",
            ));
        }
        if !unlimited && parsed.is_none() {
            return Err(self.err(unit_line, &f, format!("invalid rate limit unit '{unit}' (second, minute, hour, day, week, month or year)")));
        }
        if !name.is_empty() && replaces.contains(&name) {
            return Err(self.err(
                node.line,
                &join(field, "replaces"),
                "replaces should not contain name of same descriptor",
            ));
        }
        if rpu > MAX_LIMIT {
            return Err(self.err(
                node.line,
                &join(field, "requests_per_unit"),
                format!("above {MAX_LIMIT}"),
            ));
        }
        let decider = match parsed {
            None => Decider::Unlimited,
            Some(_) if rpu == 0 => Decider::Never,
            Some(u) => {
                let algorithm = Algorithm {
                    kind: Algo::FixedWindow,
                    limit: rpu,
                    per: Per::WindowMs(u.seconds() * 1000),
                };
                let mut rule = Rule::new(
                    rule_name(path),
                    algorithm,
                    OnRedisFailure::Local,
                    self.hosts.floor(),
                );
                rule.fallback_auto = self.hosts == Hosts::Auto;
                Decider::Rule(Arc::new(rule))
            }
        };
        Ok(self.add(Limit {
            id: 0,
            decider,
            requests_per_unit: rpu as u32,
            unit: parsed,
            name,
            replaces,
            shadow_mode,
            domain: self.domain.clone(),
            path: path.to_owned(),
            origin: format!("{}:{}", self.file, node.line),
        }))
    }

    fn add(&mut self, mut limit: Limit) -> Arc<Limit> {
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

fn join(field: &str, name: &str) -> String {
    if field.is_empty() {
        name.to_owned()
    } else {
        format!("{field}.{name}")
    }
}
