//! Per-key overrides (tiers): `[[rule.override]]` tables give one key (`key =`) or
//! every key starting with a prefix (`key_prefix =`) other parameters of the rule's
//! algorithm. An exact key wins over a prefix, a longer prefix over a shorter one.
//!
//! An override is the rule with other parameters: same name, same key in Redis (so a
//! tier change applies to the state the key already has, as a reload would), and the
//! reply's `limit` is the override's.

use super::rules::{RawRule, Rule};
use super::{ConfigError, Locator};
use crate::algorithm::Algorithm;
use serde::Deserialize;
use std::sync::Arc;
use toml::Spanned;

/// One `[[rule.override]]` table as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverride {
    key: Option<Spanned<String>>,
    key_prefix: Option<Spanned<String>>,
    capacity: Option<Spanned<u64>>,
    refill_rate: Option<Spanned<f64>>,
    leak_rate: Option<Spanned<f64>>,
    limit: Option<Spanned<u64>>,
    window: Option<Spanned<String>>,
}

/// Which keys an override applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyMatch {
    /// Exactly this key.
    Key(String),
    /// Every key starting with this prefix.
    Prefix(String),
}

/// One validated override: the keys it applies to and the rule with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The keys.
    pub keys: KeyMatch,
    /// The rule as it applies to them (same name; the override's algorithm parameters).
    pub rule: Arc<Rule>,
}

/// The override of `overrides` that applies to `key`: an exact key first, then the
/// longest prefix; `None` when none does.
pub fn find<'a>(overrides: &'a [Override], key: &[u8]) -> Option<&'a Override> {
    let mut best: Option<(&Override, usize)> = None;
    for o in overrides {
        match &o.keys {
            KeyMatch::Key(k) if k.as_bytes() == key => return Some(o),
            KeyMatch::Prefix(p)
                if key.starts_with(p.as_bytes()) && best.is_none_or(|(_, n)| p.len() > n) =>
            {
                best = Some((o, p.len()));
            }
            _ => {}
        }
    }
    best.map(|(o, _)| o)
}

impl RawRule {
    /// The validated `[[rule.override]]` tables of `rule[index]`, whose rule is `base`.
    pub(super) fn validate_overrides(
        &self,
        index: usize,
        base: &Rule,
        at: &Locator,
    ) -> Result<Vec<Override>, ConfigError> {
        let mut out = Vec::with_capacity(self.overrides.len());
        for (j, spanned) in self.overrides.iter().enumerate() {
            let o = spanned.get_ref();
            let field = |name: &str| format!("rule[{index}].override[{j}].{name}");
            let keys = match (&o.key, &o.key_prefix) {
                (Some(k), None) => KeyMatch::Key(checked(k, &field("key"), at)?),
                (None, Some(p)) => KeyMatch::Prefix(checked(p, &field("key_prefix"), at)?),
                _ => {
                    return Err(at.invalid(
                        spanned.span(),
                        &field("key"),
                        "an override needs exactly one of 'key' and 'key_prefix'",
                    ))
                }
            };
            let mut merged = self.clone();
            merged.capacity = o.capacity.clone().or(merged.capacity);
            merged.refill_rate = o.refill_rate.clone().or(merged.refill_rate);
            merged.leak_rate = o.leak_rate.clone().or(merged.leak_rate);
            merged.limit = o.limit.clone().or(merged.limit);
            merged.window = o.window.clone().or(merged.window);
            let algorithm = merged.algorithm(spanned.span(), &field, at)?;
            out.push(Override {
                keys,
                rule: Arc::new(base.with_algorithm(algorithm)),
            });
        }
        Ok(out)
    }
}

impl Rule {
    /// This rule with `algorithm`'s parameters: an override's rule (same name, so the
    /// same key in Redis; no overrides of its own).
    pub fn with_algorithm(&self, algorithm: Algorithm) -> Rule {
        let mut rule = self.clone();
        rule.algorithm = algorithm;
        rule.params = algorithm.params(1);
        rule.fallback_params = algorithm.params(self.fallback_hosts);
        rule.window_ms = algorithm.window_ms();
        rule.overrides = Vec::new();
        rule
    }
}

/// The parameters a run-time override (`OVERRIDE <rule> <key> <param>=<value>...`) may
/// name: those of `[[rule.override]]`.
pub const RUN_TIME_PARAMS: [&str; 5] = ["capacity", "refill_rate", "leak_rate", "limit", "window"];

/// The algorithm of a run-time override of `base` (`OVERRIDE`): `pairs` (`param`,
/// `value`) replace `base`'s parameters, validated as `[[rule.override]]` is (the same
/// checks and messages); the parameters not named stay `base`'s.
///
/// # Errors
/// `"<param>: <why>"`: a parameter that is not one of [`RUN_TIME_PARAMS`], one the
/// rule's algorithm does not take, named twice, a value that does not parse, or one out
/// of range.
pub fn run_time(base: &Rule, pairs: &[(&str, &str)]) -> Result<Algorithm, String> {
    let span = 0..0;
    let a = base.algorithm;
    let mut raw = RawOverride::default();
    match a.kind.spec().family {
        crate::algorithm::Family::Bucket { rate } => {
            raw.capacity = Some(Spanned::new(span.clone(), a.limit));
            let r = Some(Spanned::new(span.clone(), a.per.rate()));
            if rate == "leak_rate" {
                raw.leak_rate = r;
            } else {
                raw.refill_rate = r;
            }
        }
        _ => {
            raw.limit = Some(Spanned::new(span.clone(), a.limit));
            let ms = a.per.window_ms();
            raw.window = Some(Spanned::new(span.clone(), format!("{ms}ms")));
        }
    }
    let mut seen: Vec<&str> = Vec::new();
    for &(param, value) in pairs {
        if seen.contains(&param) {
            return Err(format!("{param}: given twice"));
        }
        seen.push(param);
        let count = || {
            value
                .parse::<u64>()
                .map(|v| Some(Spanned::new(span.clone(), v)))
                .map_err(|_| format!("{param}: '{value}' is not a whole number"))
        };
        let rate = || match value.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Some(Spanned::new(span.clone(), v))),
            _ => Err(format!("{param}: '{value}' is not a number of units/s")),
        };
        match param {
            "capacity" => raw.capacity = count()?,
            "limit" => raw.limit = count()?,
            "refill_rate" => raw.refill_rate = rate()?,
            "leak_rate" => raw.leak_rate = rate()?,
            "window" => raw.window = Some(Spanned::new(span.clone(), value.to_owned())),
            _ => {
                return Err(format!(
                    "{param}: not a parameter of an override (it takes {})",
                    RUN_TIME_PARAMS.join(", ")
                ))
            }
        }
    }
    let mut rule = RawRule::bare(base.name.clone(), a.kind);
    rule.capacity = raw.capacity;
    rule.refill_rate = raw.refill_rate;
    rule.leak_rate = raw.leak_rate;
    rule.limit = raw.limit;
    rule.window = raw.window;
    let at = Locator {
        origin: "OVERRIDE",
        text: "",
    };
    rule.algorithm(span, &|name: &str| name.to_owned(), &at)
        .map_err(|e| match e {
            ConfigError::Invalid { field, message, .. } => format!("{field}: {message}"),
            other => other.to_string(),
        })
}

/// `algorithm`'s parameters as `param=value` pairs (a run-time override's text, shown
/// by `INSPECT`).
pub fn text(algorithm: &Algorithm) -> String {
    match algorithm.kind.spec().family {
        crate::algorithm::Family::Bucket { rate } => {
            format!(
                "capacity={} {rate}={}",
                algorithm.limit,
                algorithm.per.rate()
            )
        }
        crate::algorithm::Family::Window { .. } => {
            let w = std::time::Duration::from_millis(algorithm.per.window_ms());
            format!(
                "limit={} window={}",
                algorithm.limit,
                humantime::format_duration(w).to_string().replace(' ', "")
            )
        }
        crate::algorithm::Family::Slots => format!("limit={}", algorithm.limit),
    }
}

/// A key or prefix as the protocol allows keys: 1 to 256 bytes of 0x21–0x7E.
fn checked(s: &Spanned<String>, field: &str, at: &Locator) -> Result<String, ConfigError> {
    let v = s.get_ref();
    if v.is_empty() || v.len() > 256 || !v.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(at.invalid(
            s.span(),
            field,
            "must be 1 to 256 bytes of printable ASCII without spaces, as keys are",
        ));
    }
    Ok(v.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn parse(overrides: &str) -> Result<Config, String> {
        Config::parse(
            &format!("[[rule]]\nname = \"r\"\nalgorithm = \"token_bucket\"\ncapacity = 20\nrefill_rate = 10.0\n{overrides}"),
            "t.toml",
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn an_exact_key_wins_then_the_longest_prefix() {
        let c = parse(
            "[[rule.override]]\nkey_prefix = \"t:\"\ncapacity = 50\n\
             [[rule.override]]\nkey_prefix = \"t:ent:\"\ncapacity = 200\nrefill_rate = 100.0\n\
             [[rule.override]]\nkey = \"t:ent:acme\"\ncapacity = 1000\n",
        )
        .unwrap();
        let o = &c.rules["r"].overrides;
        let limit = |k: &str| find(o, k.as_bytes()).map(|o| o.rule.limit());
        assert_eq!(limit("t:ent:acme"), Some(1000));
        assert_eq!(limit("t:ent:other"), Some(200));
        assert_eq!(limit("t:x"), Some(50));
        assert_eq!(limit("u"), None);
        // Parameters not given are the rule's.
        assert_eq!(find(o, b"t:x").unwrap().rule.algorithm.per.rate(), 10.0);
    }

    #[test]
    fn run_time_overrides_are_checked_as_static_ones() {
        let c = parse("").unwrap();
        let r = &c.rules["r"];
        let a = run_time(r, &[("capacity", "200")]).unwrap();
        assert_eq!((a.limit, a.per.rate()), (200, 10.0));
        assert_eq!(text(&a), "capacity=200 refill_rate=10");
        let t = crate::algorithm::Tier::of(&a);
        assert_eq!(t.algorithm(a.kind), Some(a));
        for (pairs, names) in [
            (vec![("limit", "5")], "limit: token_bucket has no 'limit'"),
            (vec![("capacity", "0")], "capacity: must be an integer"),
            (
                vec![("capacity", "x")],
                "capacity: 'x' is not a whole number",
            ),
            (vec![("refill_rate", "0")], "refill_rate: must be a number"),
            (vec![("colour", "1")], "colour: not a parameter"),
            (
                vec![("capacity", "2"), ("capacity", "3")],
                "capacity: given twice",
            ),
        ] {
            let e = run_time(r, &pairs).unwrap_err();
            assert!(e.starts_with(names), "{pairs:?}: {e}");
        }
    }

    #[test]
    fn bad_overrides_name_their_field() {
        for (body, what) in [
            (
                "[[rule.override]]\ncapacity = 5\n",
                "rule[0].override[0].key",
            ),
            (
                "[[rule.override]]\nkey = \"a\"\nkey_prefix = \"b\"\n",
                "exactly one",
            ),
            (
                "[[rule.override]]\nkey = \"a b\"\n",
                "rule[0].override[0].key",
            ),
            (
                "[[rule.override]]\nkey = \"a\"\nwindow = \"1s\"\n",
                "rule[0].override[0].window",
            ),
            (
                "[[rule.override]]\nkey = \"a\"\ncapacity = 0\n",
                "rule[0].override[0].capacity",
            ),
        ] {
            let e = parse(body).unwrap_err();
            assert!(e.contains(what), "{body}: {e}");
        }
    }
}
