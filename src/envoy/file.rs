//! One envoyproxy/ratelimit YAML file into the descriptor tree: `domain`, nested
//! `descriptors` (`key`, `value`, `rate_limit`, `shadow_mode`, `share_threshold`,
//! `descriptors`) and `rate_limit` (`unit`, `requests_per_unit`, `unlimited`, `name`,
//! `replaces`), each field checked where it is, every error with file, line and field.
//! The entry points and the TOML side are in [`super::load`].

use super::limits::{rule_name, Decider, Limit, Node, Unit};
use super::load::{join, Loader};
use super::yaml::{self, Kind, Node as Y};
use crate::algorithm::{Algorithm, Kind as Algo, Per, MAX_LIMIT};
use crate::config::{ConfigError, Hosts, OnRedisFailure, Rule};
use std::sync::Arc;

const IGNORED: [&str; 3] = ["detailed_metric", "value_to_metric", "metadata"];

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

    pub(super) fn file_text(&mut self, text: &str) -> Result<(), ConfigError> {
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
            self.descriptor(parent, path, item, &format!("{field}[{i}]"))?;
        }
        Ok(())
    }

    /// One descriptor `item` (the list entry `field`) under `parent`, whose path is
    /// `path`: its key and value, its limit, and its own descriptors.
    fn descriptor(
        &mut self,
        parent: &mut Node,
        path: &str,
        item: &Y,
        field: &str,
    ) -> Result<(), ConfigError> {
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
        for (name, v) in self.fields(item, field, &allowed)? {
            let f = join(field, name);
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
            return Err(self.err(item.line, &join(field, "key"), "descriptor has empty key"));
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
                field,
                format!("duplicate descriptor composite key '{path}'"),
            ));
        }
        let mut node = Node::default();
        if let Some((share, line)) = share {
            if share && !final_key.contains('*') {
                return Err(self.err(line, &join(field, "share_threshold"), format!("share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'")));
            }
            node.share_threshold = share;
        }
        if let Some(rl) = rate_limit {
            node.limit = Some(self.rate_limit(rl, &join(field, "rate_limit"), &path, shadow)?);
        }
        if let Some(list) = children {
            self.descriptors(&mut node, &path, list, &join(field, "descriptors"))?;
        }
        if final_key.contains('*') {
            let parts = final_key.split('*').map(str::to_owned).collect();
            parent.wildcards.push((final_key.clone(), parts));
        }
        parent.children.insert(final_key, node);
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
                _ => replaces = self.replaces(v, &f)?,
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
        let decider = self.decider(parsed, rpu, path);
        Ok(self.add(Limit {
            id: 0,
            decider,
            requests_per_unit: rpu as u32,
            unit: parsed,
            window_ms: parsed.map_or(0, |u| u.seconds() * 1000),
            name,
            replaces,
            shadow_mode,
            domain: self.domain.clone(),
            path: path.to_owned(),
            origin: format!("{}:{}", self.file, node.line),
        }))
    }

    /// A `replaces` list `v` (the field `f`): the names of the limits it replaces.
    fn replaces(&self, v: &Y, f: &str) -> Result<Vec<String>, ConfigError> {
        let Kind::Seq(items) = &v.kind else {
            return Err(self.err(v.line, f, "expected a list of {name: ...}"));
        };
        let mut replaces = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let f = format!("{f}[{i}]");
            let mut r = String::new();
            for (_, n) in self.fields(item, &f, &["name"])? {
                r = self.string(n, &join(&f, "name"))?;
            }
            if r.is_empty() {
                return Err(self.err(item.line, &f, "should not have an empty replaces entry"));
            }
            replaces.push(r);
        }
        Ok(replaces)
    }

    /// What decides a limit of `rpu` requests per `unit` (none: unlimited) at `path`: a
    /// fixed window rule named after the path, or never / always.
    fn decider(&self, unit: Option<Unit>, rpu: u64, path: &str) -> Decider {
        match unit {
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
        }
    }
}
