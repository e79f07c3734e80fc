//! Composite rules: `all_of = ["api_burst", "api_daily"]`. `CHECK api <key> <cost>` is
//! the `CHECKALL` of its members with the same key and cost; the members keep their own
//! state (what `CHECK api k` takes, `CHECK api_daily k` sees).
//!
//! A composite names 1 to 8 rules defined in the same file that are neither
//! composites nor leased (a lease answers one key at a time), and takes no algorithm
//! parameters of its own; `allow_uids` / `allow_gids` restrict who may use it (the
//! members' own lists apply too).

use super::rules::{ids, RawRule, Rule};
use super::{ConfigError, Locator, PeerAccess};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

/// Most members of a composite rule: as many as a `CHECKALL` has triples.
pub const MAX_MEMBERS: usize = 8;

impl RawRule {
    /// The composite rule `rule[index]` (spanning `span`) over `rules`, the rules that
    /// are not composites.
    pub(super) fn composite(
        &self,
        index: usize,
        span: Range<usize>,
        rules: &HashMap<String, Arc<Rule>>,
        at: &Locator,
    ) -> Result<Rule, ConfigError> {
        let field = |name: &str| format!("rule[{index}].{name}");
        let Some(all_of) = &self.all_of else {
            return Err(at.invalid(span, &field("all_of"), "not a composite rule"));
        };
        self.refuse_own_parameters(index, at)?;
        let names = all_of.get_ref();
        let bad = |why: String| at.invalid(all_of.span(), &field("all_of"), &why);
        let first = members(names, rules).map_err(bad)?[0];
        let mut rule = Rule::new(
            self.name.get_ref().clone(),
            first.algorithm,
            first.on_redis_failure,
            first.fallback_hosts,
        );
        rule.all_of = names.clone();
        rule.access = PeerAccess {
            uids: ids(&self.allow_uids, &field("allow_uids"), at)?,
            gids: ids(&self.allow_gids, &field("allow_gids"), at)?,
        };
        Ok(rule)
    }

    /// An error at the first algorithm parameter or override a composite rule sets: its
    /// members have their own.
    fn refuse_own_parameters(&self, index: usize, at: &Locator) -> Result<(), ConfigError> {
        let field = |name: &str| format!("rule[{index}].{name}");
        let own = [
            ("algorithm", self.algorithm.as_ref().map(|s| s.span())),
            ("capacity", self.capacity.as_ref().map(|s| s.span())),
            ("refill_rate", self.refill_rate.as_ref().map(|s| s.span())),
            ("leak_rate", self.leak_rate.as_ref().map(|s| s.span())),
            ("limit", self.limit.as_ref().map(|s| s.span())),
            ("window", self.window.as_ref().map(|s| s.span())),
            ("max_hold", self.max_hold.as_ref().map(|s| s.span())),
            (
                "fallback_hosts",
                self.fallback_hosts.as_ref().map(|s| s.span()),
            ),
            ("lease", self.lease.as_ref().map(|s| s.span())),
        ];
        if let Some((name, span)) = own.into_iter().find_map(|(n, s)| Some((n, s?))) {
            return Err(at.invalid(
                span,
                &field(name),
                &format!("a composite rule (all_of) takes no '{name}': its members have their own"),
            ));
        }
        if let Some(o) = self.overrides.first() {
            return Err(at.invalid(
                o.span(),
                &field("override"),
                "a composite rule (all_of) takes no override: its members take their own",
            ));
        }
        Ok(())
    }
}

/// The rules `names` stands for, in order: 1 to [`MAX_MEMBERS`] distinct rules of `rules`,
/// none itself a composite or leased.
///
/// # Errors
/// Why `names` is not such a list (the message for `all_of`).
fn members<'r>(
    names: &[String],
    rules: &'r HashMap<String, Arc<Rule>>,
) -> Result<Vec<&'r Arc<Rule>>, String> {
    if names.is_empty() || names.len() > MAX_MEMBERS {
        return Err(format!(
            "must name 1 to {MAX_MEMBERS} rules (got {})",
            names.len()
        ));
    }
    let mut members = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            return Err(format!("names rule '{name}' twice"));
        }
        let Some(member) = rules.get(name).filter(|m| m.all_of.is_empty()) else {
            return Err(format!(
                "names '{name}', which is not a rule of this file (or is itself a composite rule)"
            ));
        };
        if member.lease {
            return Err(format!(
                "names '{name}', which takes leases; members of a composite rule need lease = \"off\""
            ));
        }
        members.push(member);
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const MEMBERS: &str = "[[rule]]\nname = \"burst\"\nalgorithm = \"token_bucket\"\ncapacity = 3\nrefill_rate = 1.0\n\n[[rule]]\nname = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1d\"\n";

    fn parse(composite: &str) -> Result<Config, String> {
        Config::parse(
            &format!("{MEMBERS}\n[[rule]]\nname = \"api\"\n{composite}\n"),
            "t.toml",
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_composite_names_its_members() {
        let c = parse("all_of = [\"burst\", \"daily\"]").unwrap();
        assert_eq!(c.rules["api"].all_of, vec!["burst", "daily"]);
        assert!(c.rules["burst"].all_of.is_empty());
    }

    #[test]
    fn bad_composites_name_the_field() {
        for (body, what) in [
            ("all_of = []", "1 to 8"),
            ("all_of = [\"nope\"]", "'nope'"),
            ("all_of = [\"burst\", \"burst\"]", "twice"),
            ("all_of = [\"burst\"]\ncapacity = 3", "rule[2].capacity"),
            (
                "all_of = [\"burst\"]\nmax_hold = \"5s\"",
                "rule[2].max_hold",
            ),
            (
                "all_of = [\"burst\"]\nalgorithm = \"token_bucket\"",
                "rule[2].algorithm",
            ),
        ] {
            let e = parse(body).unwrap_err();
            assert!(e.contains(what), "{body}: {e}");
        }
        let e = Config::parse("[[rule]]\nname = \"a\"\n", "t.toml").unwrap_err();
        assert!(e.to_string().contains("all_of"), "{e}");
    }
}
