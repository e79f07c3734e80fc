//! The `[[rule]]` tables: what a rule names, its algorithm's parameters, what it does
//! when Redis cannot decide, and their validation.
//!
//! Which parameters an algorithm takes and their bounds come from the algorithm table
//! (`crate::algorithm::Kind::spec`): a new algorithm needs nothing here.
//!
//! An algorithm's parameters as a rule writes them, each checked and named in errors,
//! are read in [`params`].

mod params;

use super::settings::Hosts;
use super::{ConfigError, Locator, PeerAccess};
use crate::algorithm::{self, Algorithm, Kind};
use serde::Deserialize;
use std::ops::Range;
use toml::Spanned;

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

/// One `[[rule]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: Spanned<String>,
    pub(super) algorithm: Option<Spanned<Kind>>,
    pub(super) capacity: Option<Spanned<u64>>,
    pub(super) refill_rate: Option<Spanned<f64>>,
    pub(super) leak_rate: Option<Spanned<f64>>,
    pub(super) limit: Option<Spanned<u64>>,
    pub(super) window: Option<Spanned<String>>,
    pub(super) max_hold: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) on_redis_failure: OnRedisFailure,
    pub(super) fallback_hosts: Option<Spanned<u32>>,
    pub(super) allow_uids: Option<Spanned<Vec<i64>>>,
    pub(super) allow_gids: Option<Spanned<Vec<i64>>>,
    pub(super) lease: Option<Spanned<String>>,
    /// A composite rule's members (`config/composite.rs`).
    pub(super) all_of: Option<Spanned<Vec<String>>>,
    /// Per-key overrides (`config/overrides.rs`).
    #[serde(default, rename = "override")]
    pub(super) overrides: Vec<Spanned<super::overrides::RawOverride>>,
    #[serde(default)]
    pub(super) shadow: bool,
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
    /// Hosts sharing the limit when falling back to local buckets (for `auto`, its floor:
    /// the count in force is the live one, [`crate::fallback::LiveHosts`]).
    pub fallback_hosts: u32,
    /// `fallback_hosts` is `[fallback] hosts = "auto"`: the share follows the daemons
    /// alive in Redis as last seen.
    pub fallback_auto: bool,
    /// Parameters of the shared decision (Redis, or `mode = "none"`): the whole limit.
    pub params: algorithm::Params,
    /// Parameters of a local fallback decision: the share of one of `fallback_hosts`.
    pub fallback_params: algorithm::Params,
    /// The policy window, ms ([`Algorithm::window_ms`]): the seventh field of replies.
    pub window_ms: u64,
    /// Peers that may `CHECK` this rule (`allow_uids` / `allow_gids`; both empty: every
    /// peer the server admits). Others get `ERR PERM`.
    pub access: PeerAccess,
    /// `lease = "auto"`: hot keys are answered from leases (docs/DESIGN.md "Leases");
    /// `"off"` (the default): every decision is a script call.
    pub lease: bool,
    /// The kind of this rule's local states in the eviction sketch (1–255): a hash of
    /// the rule's name and algorithm, so a key evicted under one share comes back
    /// drained under another (a reload, or `fallback.hosts = "auto"` counting other
    /// daemons), and a flood of one rule's keys does not drain another rule's
    /// (`crate::fallback`, module `restart`).
    pub sketch_tag: u8,
    /// A composite rule's members (`all_of`), in order; empty for every other rule. A
    /// composite's `algorithm` is its first member's (what a reply names when the rule
    /// itself is refused); its decisions are its members'.
    pub all_of: Vec<String>,
    /// Per-key overrides (`[[rule.override]]`): other parameters for some keys.
    pub overrides: Vec<super::overrides::Override>,
    /// `shadow = true`: decided and counted as usual, but always answered ALLOW (the
    /// would-be DENY counted as `verdict="shadow_deny"`): a rule tried on live traffic
    /// before it is enforced. A reload flips it without touching the keys' state.
    pub shadow: bool,
}

/// [`Rule::sketch_tag`] of the rule `name` under algorithm `kind` (FNV-1a, folded to
/// 1–255).
fn sketch_tag(name: &str, kind: &str) -> u8 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain([0]).chain(kind.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    ((h >> 56) as u8 ^ (h >> 24) as u8).max(1)
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
            algorithm,
            on_redis_failure,
            fallback_hosts,
            fallback_auto: false,
            params: algorithm.params(1),
            fallback_params: algorithm.params(fallback_hosts),
            window_ms: algorithm.window_ms(),
            access: PeerAccess::default(),
            lease: false,
            shadow: false,
            all_of: Vec::new(),
            overrides: Vec::new(),
            sketch_tag: sketch_tag(&name, algorithm.params(1).kind().as_str()),
            name,
        }
    }

    /// The capacity/limit: the `limit` field of replies and the largest possible cost.
    pub fn limit(&self) -> u64 {
        self.algorithm.limit()
    }
}

impl RawRule {
    /// The rule name as written (checked by [`RawRule::validate`]).
    pub(super) fn name(&self) -> &Spanned<String> {
        &self.name
    }

    /// The validated rule `rule[index]`, spanning `span`; `hosts` is `[fallback] hosts`.
    pub(super) fn validate(
        &self,
        index: usize,
        span: Range<usize>,
        hosts: Hosts,
        at: &Locator,
    ) -> Result<Rule, ConfigError> {
        let field = |name: &str| format!("rule[{index}].{name}");
        let name = self.name.get_ref();
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        {
            return Err(at.invalid(
                self.name.span(),
                &field("name"),
                &format!("'{name}' must be 1 to 64 characters of A-Z a-z 0-9 _ - ."),
            ));
        }
        let algorithm = self.algorithm(span, &field, at)?;
        let fallback_hosts = match &self.fallback_hosts {
            Some(h) if !(1..=10_000).contains(h.get_ref()) => {
                return Err(at.invalid(
                    h.span(),
                    &field("fallback_hosts"),
                    "must be an integer from 1 to 10000",
                ))
            }
            Some(h) => Hosts::Fixed(*h.get_ref()),
            None => hosts,
        };
        let mut rule = Rule::new(
            name.clone(),
            algorithm,
            self.on_redis_failure,
            fallback_hosts.floor(),
        );
        rule.fallback_auto = fallback_hosts == Hosts::Auto;
        rule.lease = self.lease(&algorithm, &field, at)?;
        rule.shadow = self.shadow;
        rule.access = PeerAccess {
            uids: ids(&self.allow_uids, &field("allow_uids"), at)?,
            gids: ids(&self.allow_gids, &field("allow_gids"), at)?,
        };
        rule.overrides = self.validate_overrides(index, &rule, at)?;
        Ok(rule)
    }

    /// `lease`: `"auto"` (true) or `"off"` (false, the default). Only the algorithms whose
    /// count a lease can keep exact take one: a sliding window log records each unit's
    /// own time, which a unit spent later from a lease would not have; a leaky bucket
    /// shapes each request on its own.
    fn lease(
        &self,
        algorithm: &Algorithm,
        field: &dyn Fn(&str) -> String,
        at: &Locator,
    ) -> Result<bool, ConfigError> {
        let Some(lease) = &self.lease else {
            return Ok(false);
        };
        let on = match lease.get_ref().as_str() {
            "auto" => true,
            "off" => false,
            other => {
                return Err(at.invalid(
                    lease.span(),
                    &field("lease"),
                    &format!("'{other}' must be \"auto\" or \"off\""),
                ))
            }
        };
        if on && algorithm.kind.spec().lease.is_none() {
            return Err(at.invalid(
                lease.span(),
                &field("lease"),
                &format!(
                    "{} cannot take leases (only token_bucket, fixed_window and sliding_window_counter can keep a leased budget exact); remove 'lease' or set it to \"off\"",
                    algorithm.kind.as_str()
                ),
            ));
        }
        Ok(on)
    }

    /// A rule named `name` of algorithm `kind` with nothing else set (the parameters
    /// are the caller's to fill in: a run-time override's validation).
    pub(super) fn bare(name: String, kind: Kind) -> Self {
        RawRule {
            name: Spanned::new(0..0, name),
            algorithm: Some(Spanned::new(0..0, kind)),
            capacity: None,
            refill_rate: None,
            leak_rate: None,
            limit: None,
            window: None,
            max_hold: None,
            on_redis_failure: OnRedisFailure::default(),
            fallback_hosts: None,
            allow_uids: None,
            allow_gids: None,
            lease: None,
            all_of: None,
            overrides: Vec::new(),
            shadow: false,
        }
    }
}

/// A rule's `allow_uids` / `allow_gids`: ids from 0 to 2³²−2 (2³²−1 is "no id").
pub(super) fn ids(
    list: &Option<Spanned<Vec<i64>>>,
    field: &str,
    at: &Locator,
) -> Result<Vec<u32>, ConfigError> {
    let Some(list) = list else {
        return Ok(Vec::new());
    };
    if let Some(v) = list
        .get_ref()
        .iter()
        .find(|&&v| !(0..i64::from(u32::MAX)).contains(&v))
    {
        return Err(at.invalid(
            list.span(),
            field,
            &format!(
                "entries must be integers from 0 to {} (got {v})",
                u32::MAX - 1
            ),
        ));
    }
    Ok(list.get_ref().iter().map(|&v| v as u32).collect())
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    fn rule(body: &str) -> Result<Config, String> {
        Config::parse(&format!("[[rule]]\nname = \"r\"\n{body}\n"), "t.toml")
            .map_err(|e| e.to_string())
    }

    #[test]
    fn lease_is_auto_or_off_for_the_algorithms_that_keep_it_exact() {
        for algo in [
            "algorithm = \"token_bucket\"\ncapacity = 10\nrefill_rate = 1.0",
            "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1s\"",
            "algorithm = \"sliding_window_counter\"\nlimit = 10\nwindow = \"1s\"",
        ] {
            let c = rule(&format!("{algo}\nlease = \"auto\"")).unwrap();
            assert!(c.rules["r"].lease, "{algo}");
            let c = rule(&format!("{algo}\nlease = \"off\"")).unwrap();
            assert!(!c.rules["r"].lease, "{algo}");
            assert!(!rule(algo).unwrap().rules["r"].lease, "{algo}");
        }
        let e =
            rule("algorithm = \"token_bucket\"\ncapacity = 1\nrefill_rate = 1.0\nlease = \"on\"")
                .unwrap_err();
        assert!(e.contains("rule[0].lease") && e.contains("'on'"), "{e}");
        for algo in [
            "algorithm = \"sliding_window_log\"\nlimit = 10\nwindow = \"1s\"",
            "algorithm = \"leaky_bucket\"\ncapacity = 10\nleak_rate = 1.0",
        ] {
            let e = rule(&format!("{algo}\nlease = \"auto\"")).unwrap_err();
            assert!(
                e.contains("rule[0].lease") && e.contains("cannot take leases"),
                "{e}"
            );
            assert!(!rule(&format!("{algo}\nlease = \"off\"")).unwrap().rules["r"].lease);
        }
    }
}
