//! The limits of every domain as a tree of descriptors, and how a request's descriptor
//! finds its limit: envoyproxy/ratelimit's documented matching, step for step.
//!
//! For each entry of a descriptor, in order: the child `key_value` if configured, else
//! the first wildcard child whose pattern matches `key_value` (each `*` matches any run
//! of characters), else the bare-key child `key` (a counter per value). A limit applies
//! only if it sits on the node the descriptor's last entry reached; a descriptor with
//! more entries than the tree is deep, or that leaves the tree, has no limit. The tree
//! is built by [`super::load`].

use crate::config::Rule;
use std::collections::HashMap;
use std::sync::Arc;

/// The limits in force, shared by the configuration and the server.
pub type Shared = Arc<Limits>;

/// A unit of `requests_per_unit`, with the RLS protocol's enum values
/// (`RateLimitResponse.RateLimit.Unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second = 1,
    /// 60 s.
    Minute = 2,
    /// 3600 s.
    Hour = 3,
    /// 86400 s.
    Day = 4,
    /// 30 days, as envoyproxy/ratelimit counts a month.
    Month = 5,
    /// 365 days, as envoyproxy/ratelimit counts a year.
    Year = 6,
    /// 7 days.
    Week = 7,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length, s (envoyproxy/ratelimit's `UnitToDivider`): windows are
    /// aligned to the Unix epoch, as theirs.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit named `s` (case-insensitive, as theirs).
    pub fn parse(s: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s))
    }

    /// Its name in the YAML files.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The longest unit not longer than `ms` (at least a second): the unit reported for a
    /// TOML rule's policy window.
    pub fn at_most(ms: u64) -> Unit {
        Unit::ALL
            .into_iter()
            .rev()
            .find(|u| u.seconds() * 1000 <= ms)
            .unwrap_or(Unit::Second)
    }
}

/// Who decides a matched limit.
#[derive(Debug, Clone, PartialEq)]
pub enum Decider {
    /// `unlimited: true`: always OK, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: always over limit, never counted.
    Never,
    /// A rule decided by the limiter: a fixed window of `requests_per_unit` per unit
    /// (YAML), or a TOML rule (`[[envoy.descriptor]]`).
    Rule(Arc<Rule>),
}

/// One configured limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// Its index in [`Limits::all`].
    pub id: usize,
    /// Who decides it.
    pub decider: Decider,
    /// `current_limit.requests_per_unit` of the response.
    pub requests_per_unit: u32,
    /// `current_limit.unit` (`None` for `unlimited`).
    pub unit: Option<Unit>,
    /// The policy window, ms: the unit's length, or a TOML rule's window
    /// (`RateLimit-Policy`'s `w`).
    pub window_ms: u64,
    /// `rate_limit.name` (`current_limit.name`; what `replaces` refers to).
    pub name: String,
    /// Names of the limits this one replaces in the same request.
    pub replaces: Vec<String>,
    /// Over limit is answered OK (and counted).
    pub shadow_mode: bool,
    /// The domain.
    pub domain: String,
    /// `domain.key_value.key`: the configured path, envoyproxy/ratelimit's stats key;
    /// the `descriptor` label of the metrics.
    pub path: String,
    /// Where it was configured (`file:line`), for errors and logs.
    pub origin: String,
}

/// One node of a domain's descriptor tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Node {
    /// Children by `key_value` (a value given, wildcards included) or `key` (bare key).
    pub children: HashMap<String, Node>,
    /// The children whose `key_value` holds `*`, in file order, split on `*`.
    pub wildcards: Vec<(String, Vec<String>)>,
    /// The limit on this node.
    pub limit: Option<Arc<Limit>>,
    /// `share_threshold: true` (a wildcard node): every value it matches shares one
    /// counter.
    pub share_threshold: bool,
}

/// Every domain's tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// Root node of each domain.
    pub domains: HashMap<String, Node>,
    /// Every limit, by id.
    pub all: Vec<Arc<Limit>>,
    /// `[envoy] ietf_headers`: answers carry `RateLimit-Policy` and `RateLimit`.
    pub ietf_headers: bool,
    /// `[envoy] strict`: a request's descriptors are decided all or nothing.
    pub strict: bool,
}

/// True if `value` matches a pattern split on `*` (each `*` matches any run, possibly
/// empty): envoyproxy/ratelimit's `wildcardMatch`.
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed || !value.starts_with(first.as_str()) || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

impl Limits {
    /// True if some limit's rule shares its local limit by the daemons alive
    /// (`fallback.hosts = "auto"`): the daemon then keeps its heartbeat.
    pub fn any_fallback_auto(&self) -> bool {
        self.all
            .iter()
            .any(|l| matches!(&l.decider, Decider::Rule(r) if r.fallback_auto))
    }

    /// The limit of the descriptor `entries` (key, value pairs) in `domain`, if any, and
    /// the descriptor's key under it ([`descriptor_key`]; an entry matched by a
    /// `share_threshold` wildcard counts as its pattern, so all its matches share one
    /// counter).
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<(&Arc<Limit>, String)> {
        let mut node = self.domains.get(domain)?;
        let mut shared: Vec<(usize, &str)> = Vec::new();
        let mut buf = String::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            buf.clear();
            buf.push_str(key);
            buf.push('_');
            buf.push_str(value);
            let next = match node.children.get(&buf) {
                Some(n) => n,
                None => match node
                    .wildcards
                    .iter()
                    .find(|(_, parts)| wildcard_match(parts, &buf))
                {
                    Some((pattern, _)) => {
                        let n = node.children.get(pattern)?;
                        if n.share_threshold {
                            shared.push((i, &pattern[key.len() + 1..]));
                        }
                        n
                    }
                    None => node.children.get(*key)?,
                },
            };
            if i + 1 == entries.len() {
                let limit = next.limit.as_ref()?;
                let values = entries.iter().enumerate().map(|(j, (k, v))| {
                    let v = shared
                        .iter()
                        .find(|(at, _)| *at == j)
                        .map_or(*v, |(_, p)| *p);
                    (*k, v)
                });
                return Some((limit, descriptor_key(values)));
            }
            if next.children.is_empty() {
                return None;
            }
            node = next;
        }
        None
    }
}

/// Longest rule name (the line protocol's bound, which the Redis key tag assumes).
const NAME_MAX: usize = 64;

/// The name of the rule deciding a YAML limit at `path` (`domain.key_value.key`):
/// `envoy/<path>`, so its Redis keys (`<prefix>:{envoy/<path>:<values>}`) and metrics
/// say which limit they belong to, and no TOML rule (whose names have no `/`) shares
/// them. Bytes outside printable ASCII, `%` and `:` are percent-encoded (a `:` would
/// make the tag `<rule>:<key>` of one limit and key the tag of another); a name longer
/// than 64 bytes keeps its first 47 and ends with `~` and 16 hex digits of the SHA-1 of
/// the whole.
pub fn rule_name(path: &str) -> String {
    let mut name = String::from("envoy/");
    percent_encode_into(&mut name, path, b"%:");
    shorten(name, NAME_MAX)
}

/// Longest descriptor key given to the limiter (the line protocol's key bound).
pub const KEY_MAX: usize = 256;

/// The key of a request's descriptor under its limit: `key=value` per entry joined by
/// `,`, percent-encoding `%`, `,`, `=` and bytes outside printable ASCII; above 256
/// bytes, the first 199 then `~` and the SHA-1 of the whole in hex (two different
/// descriptors share a key only if SHA-1 collides).
pub fn descriptor_key<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut key = String::new();
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        percent_encode_into(&mut key, k, b"%,=");
        key.push('=');
        percent_encode_into(&mut key, v, b"%,=");
    }
    shorten(key, KEY_MAX)
}

fn percent_encode_into(out: &mut String, s: &str, special: &[u8]) {
    use std::fmt::Write;
    for b in s.bytes() {
        if (0x21..=0x7e).contains(&b) && !special.contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// `s` if at most `max` bytes (ASCII), else its head and `~<hex SHA-1>` in `max` bytes.
fn shorten(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    use sha1::{Digest, Sha1};
    let digest = Sha1::digest(s.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let tail = if max < 100 { &hex[..16] } else { &hex[..] };
    format!("{}~{tail}", &s[..max - 1 - tail.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(p: &str) -> Vec<String> {
        p.split('*').map(str::to_owned).collect()
    }

    #[test]
    fn wildcards_match_like_envoyproxy_ratelimit() {
        for (pattern, value, want) in [
            ("path_/foo*", "path_/foo/bar", true),
            ("path_/foo*", "path_/foo", true),
            ("path_/foo*", "path_/fo", false),
            ("path_a*b*c", "path_aXXbYYc", true),
            ("path_a*b*c", "path_ac", false),
            ("path_a*b*c", "path_abc", true),
            ("path_ab*ba", "path_aba", false),
            ("k_v", "k_v", true),
        ] {
            assert_eq!(
                wildcard_match(&parts(pattern), value),
                want,
                "{pattern} {value}"
            );
        }
    }

    #[test]
    fn names_and_keys_are_printable_and_bounded() {
        assert_eq!(rule_name("d.k_v"), "envoy/d.k_v");
        // "d.x" with key "y:z=1" and "d.x:y" with key "z=1" must not share a tag.
        assert_eq!(rule_name("d.x:y"), "envoy/d.x%3Ay");
        let long = rule_name(&"x".repeat(100));
        assert_eq!(long.len(), 64);
        assert!(long.starts_with("envoy/xxx") && long.contains('~'));
        assert_ne!(long, rule_name(&"x".repeat(101)));
        assert_eq!(
            descriptor_key([("user", "a b"), ("p", "x=y,%")]),
            "user=a%20b,p=x%3Dy%2C%25"
        );
        let k = descriptor_key([("k", "é".repeat(200).as_str())]);
        assert_eq!(k.len(), KEY_MAX);
    }

    #[test]
    fn units_are_the_protocol_enum() {
        assert_eq!(Unit::parse("MINUTE"), Some(Unit::Minute));
        assert_eq!(Unit::Week as i32, 7);
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::at_most(90_000), Unit::Minute);
        assert_eq!(Unit::at_most(500), Unit::Second);
    }
}
