//! A rule's algorithm and its parameters as the `[[rule]]` table writes them (`capacity`
//! and a rate for a bucket, `limit` and `window` for a window, `limit` and `max_hold`
//! for a concurrency rule): the parameters the algorithm does not take refused, each
//! value checked against its bounds, and every error naming its field and line. Shared
//! by the rules and by the per-key and run-time overrides, which are validated as rules.

use super::RawRule;
use crate::algorithm::{self, Algorithm, Family, Kind, Per, MAX_LIMIT, MAX_WINDOW_MS};
use crate::config::{ConfigError, Locator};
use std::ops::Range;
use toml::Spanned;

impl RawRule {
    /// The algorithm with its parameters, each checked and named in errors.
    pub(in crate::config) fn algorithm(
        &self,
        rule_span: Range<usize>,
        field: &dyn Fn(&str) -> String,
        at: &Locator,
    ) -> Result<Algorithm, ConfigError> {
        let kind = self.kind(&rule_span, field, at)?;
        self.refuse_other_parameters(kind, field, at)?;
        let algo = kind.as_str();
        let missing = |what: &str, hint: &str| {
            at.invalid(
                rule_span.clone(),
                &field(what),
                &format!("{algo} needs '{what}' ({hint})"),
            )
        };
        let count = |v: &Option<Spanned<u64>>, what: &str, max: u64| {
            count(v, what, max, &missing, field, at)
        };
        Ok(match kind.spec().family {
            Family::Bucket { rate } => {
                let given = match rate {
                    "leak_rate" => &self.leak_rate,
                    _ => &self.refill_rate,
                };
                Algorithm {
                    kind,
                    limit: count(&self.capacity, "capacity", MAX_LIMIT)?,
                    per: Per::Rate(self.rate(given, rate, &missing, field, at)?),
                }
            }
            Family::Window { max_limit } => Algorithm {
                kind,
                limit: count(&self.limit, "limit", max_limit)?,
                per: Per::WindowMs(self.window(&missing, field, at)?),
            },
            Family::Slots => Algorithm {
                kind,
                limit: count(&self.limit, "limit", algorithm::concurrency::MAX_SLOTS)?,
                per: Per::WindowMs(self.max_hold(field, at)?),
            },
        })
    }

    /// `algorithm`, which a rule that is not a composite must name.
    fn kind(
        &self,
        rule_span: &Range<usize>,
        field: &dyn Fn(&str) -> String,
        at: &Locator,
    ) -> Result<Kind, ConfigError> {
        let kind = self.algorithm.as_ref().ok_or_else(|| {
            at.invalid(
                rule_span.clone(),
                &field("algorithm"),
                "a rule needs 'algorithm' (or 'all_of': a composite rule)",
            )
        })?;
        Ok(*kind.get_ref())
    }

    /// An error at the first parameter set that `kind` does not take (a bucket takes
    /// `capacity` and its rate, a window `limit` and `window`, a concurrency rule `limit`
    /// and `max_hold`).
    fn refuse_other_parameters(
        &self,
        kind: Kind,
        field: &dyn Fn(&str) -> String,
        at: &Locator,
    ) -> Result<(), ConfigError> {
        let takes: [&str; 2] = match kind.spec().family {
            Family::Bucket { rate } => ["capacity", rate],
            Family::Window { .. } => ["limit", "window"],
            Family::Slots => ["limit", "max_hold"],
        };
        let given = [
            ("capacity", self.capacity.as_ref().map(|s| s.span())),
            ("refill_rate", self.refill_rate.as_ref().map(|s| s.span())),
            ("leak_rate", self.leak_rate.as_ref().map(|s| s.span())),
            ("limit", self.limit.as_ref().map(|s| s.span())),
            ("window", self.window.as_ref().map(|s| s.span())),
            ("max_hold", self.max_hold.as_ref().map(|s| s.span())),
        ];
        for (extra, span) in given {
            if let (Some(span), false) = (span, takes.contains(&extra)) {
                return Err(at.invalid(
                    span,
                    &field(extra),
                    &format!(
                        "{} has no '{extra}' (it takes {} and {})",
                        kind.as_str(),
                        takes[0],
                        takes[1]
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A concurrency rule's `max_hold`, a whole number of ms from 1 ms to 30 days
    /// (default 60 s).
    fn max_hold(&self, field: &dyn Fn(&str) -> String, at: &Locator) -> Result<u64, ConfigError> {
        let Some(w) = &self.max_hold else {
            return Ok(algorithm::concurrency::DEFAULT_MAX_HOLD_MS);
        };
        duration_ms(w, &field("max_hold"), at)
    }

    /// A rate in units/s, 0.000001..=1e9.
    fn rate(
        &self,
        v: &Option<Spanned<f64>>,
        what: &str,
        missing: &dyn Fn(&str, &str) -> ConfigError,
        field: &dyn Fn(&str) -> String,
        at: &Locator,
    ) -> Result<f64, ConfigError> {
        let v = v.as_ref().ok_or_else(|| missing(what, "units/s, > 0"))?;
        if !(v.get_ref().is_finite() && (1e-6..=1e9).contains(v.get_ref())) {
            return Err(at.invalid(
                v.span(),
                &field(what),
                "must be a number of units/s from 0.000001 to 1e9",
            ));
        }
        Ok(*v.get_ref())
    }

    /// The window, a whole number of ms from 1 ms to 30 days.
    fn window(
        &self,
        missing: &dyn Fn(&str, &str) -> ConfigError,
        field: &dyn Fn(&str) -> String,
        at: &Locator,
    ) -> Result<u64, ConfigError> {
        let w = self.window.as_ref().ok_or_else(|| {
            missing(
                "window",
                "a duration such as \"500ms\", \"1s\", \"1m\", \"3h\", \"1d\"",
            )
        })?;
        duration_ms(w, &field("window"), at)
    }
}

/// A duration field (`window`, `max_hold`): a whole number of ms from 1 ms to 30 days.
fn duration_ms(w: &Spanned<String>, field: &str, at: &Locator) -> Result<u64, ConfigError> {
    let bad = |why: String| at.invalid(w.span(), field, &why);
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
}

/// A count parameter (`capacity`, `limit`): an integer from 1 to `max`; `missing` is the
/// error for a rule without it.
fn count(
    v: &Option<Spanned<u64>>,
    what: &str,
    max: u64,
    missing: &dyn Fn(&str, &str) -> ConfigError,
    field: &dyn Fn(&str) -> String,
    at: &Locator,
) -> Result<u64, ConfigError> {
    let v = v.as_ref().ok_or_else(|| missing(what, "an integer ≥ 1"))?;
    if !(1..=max).contains(v.get_ref()) {
        return Err(at.invalid(
            v.span(),
            &field(what),
            &format!("must be an integer from 1 to {max}"),
        ));
    }
    Ok(*v.get_ref())
}
