//! What a reload changes: the rules, `[fallback] hosts` and the Envoy limits apply at
//! once; every other setting needs a restart, and a reload names each one that changed.
//! A reload that would change a rule's algorithm is refused whole ([`refused`]); one
//! that makes a rule keep its state longer ([`keeps_state_longer`]) has that rule's keys
//! in Redis walked, so none expires under the earlier rule's expiry.

use super::envoy::EnvoyConfig;
use super::{Config, FallbackConfig};
use crate::algorithm::{Algorithm, Kind, Per};

/// The settings that differ between `current` and `new` but only apply on a restart,
/// by name (`server.socket`, …; a changed field without its own line is named by its
/// section, `[server]`).
pub fn needs_restart(current: &Config, new: &Config) -> Vec<&'static str> {
    let (s, n, r, m) = (&current.server, &new.server, &current.redis, &new.redis);
    let mut reported: Vec<&'static str> = Vec::new();
    for (changed, what) in restart_fields(current, new)
        .into_iter()
        // A field without a line of its own is still reported, by its section.
        .chain([
            (n != s, "[server]"),
            (m != r, "[redis]"),
            (new.cache != current.cache, "[cache]"),
        ])
    {
        fn section(f: &str) -> &str {
            f.trim_matches(['[', ']']).split('.').next().unwrap_or("")
        }
        let already = what.starts_with('[') && reported.iter().any(|f| section(f) == section(what));
        if changed && !already {
            reported.push(what);
        }
    }
    reported
}

/// `(new.<section>.<field> != current.<section>.<field>, "<section>.<field>")`: one
/// field that only a restart applies, with whether it differs.
macro_rules! differs {
    ($current:ident, $new:ident, $section:ident . $field:ident) => {
        (
            $new.$section.$field != $current.$section.$field,
            concat!(stringify!($section), ".", stringify!($field)),
        )
    };
}

/// Each field that only a restart applies, with whether it differs between `current`
/// and `new`.
fn restart_fields(current: &Config, new: &Config) -> Vec<(bool, &'static str)> {
    let mut fields = server_fields(current, new);
    fields.extend(store_fields(current, new));
    fields.extend(endpoint_fields(current, new));
    fields
}

/// `[server]`'s fields.
fn server_fields(c: &Config, n: &Config) -> Vec<(bool, &'static str)> {
    vec![
        differs!(c, n, server.socket),
        differs!(c, n, server.socket_mode),
        differs!(c, n, server.max_line_bytes),
        differs!(c, n, server.max_in_flight),
        differs!(c, n, server.allow_uids),
        differs!(c, n, server.allow_gids),
        differs!(c, n, server.admin_uids),
        differs!(c, n, server.admin_gids),
        differs!(c, n, server.max_connections),
        (
            n.server.max_connections_per_uid() != c.server.max_connections_per_uid(),
            "server.max_connections_per_uid",
        ),
        differs!(c, n, server.idle_timeout_ms),
        differs!(c, n, server.worker_threads),
        differs!(c, n, server.redis_max_in_flight),
        differs!(c, n, server.redis_max_in_flight_per_uid),
    ]
}

/// `[redis]`'s, `[cache]`'s and `[fallback]`'s fields (but `[fallback] hosts`, which a
/// reload applies).
fn store_fields(c: &Config, n: &Config) -> [(bool, &'static str); 9] {
    [
        differs!(c, n, redis.mode),
        (
            n.redis.nodes.get_ref() != c.redis.nodes.get_ref(),
            "redis.nodes",
        ),
        differs!(c, n, redis.timeout_ms),
        differs!(c, n, redis.prefix),
        differs!(c, n, cache.ttl_ms),
        differs!(c, n, cache.max_entries),
        differs!(c, n, fallback.max_keys),
        differs!(c, n, fallback.min_hosts),
        differs!(c, n, fallback.state_dir),
    ]
}

/// The endpoints' fields: `[metrics]`, `[http]`, `[envoy] listen`.
fn endpoint_fields(c: &Config, n: &Config) -> [(bool, &'static str); 9] {
    [
        differs!(c, n, metrics.listen),
        differs!(c, n, metrics.max_connections),
        differs!(c, n, http.listen),
        differs!(c, n, http.max_connections),
        differs!(c, n, http.lab),
        differs!(c, n, http.lab_max_rps),
        differs!(c, n, http.lab_max_seconds),
        differs!(c, n, http.lab_max_keys),
        differs!(c, n, envoy.listen),
    ]
}

/// Why a reload from `current` to `new` must be refused, if it must: a rule whose
/// `algorithm` changed. Its keys in Redis carry the algorithm's suffix
/// (`<prefix>:{<rule>:<key>}:<suffix>`), so the rule would start every key fresh: a
/// drained key would get a full budget. A restart may change it (every daemon then
/// starts that rule's keys fresh, which the operator asked for by restarting).
pub fn refused(current: &Config, new: &Config) -> Option<String> {
    let mut names: Vec<&String> = new.rules.keys().collect();
    names.sort();
    names.into_iter().find_map(|name| {
        let (was, is) = (current.rules.get(name)?.algorithm.kind, new.rules[name].algorithm.kind);
        (was != is).then(|| {
            format!(
                "rule '{name}': algorithm changed from {} to {}; a reload cannot change a rule's algorithm (its keys in Redis would start fresh): give the rule a new name, or restart",
                was.spec().name,
                is.spec().name
            )
        })
    })
}

/// The configuration in force after reloading `new` over `current`: `new`'s rules and
/// `[fallback] hosts` (it reaches the rules through their `fallback_hosts`), `new`'s
/// Envoy limits when it has some (`[envoy] listen` set), `current`'s everything else.
pub fn applied(current: Config, new: Config) -> Config {
    let fallback = FallbackConfig {
        hosts: new.fallback.hosts,
        ..current.fallback.clone()
    };
    let envoy = if new.envoy.listen.is_some() {
        EnvoyConfig {
            listen: current.envoy.listen.clone(),
            ..new.envoy
        }
    } else {
        current.envoy.clone()
    };
    Config {
        rules: new.rules,
        fallback,
        envoy,
        ..current
    }
}

/// True when a key's state written under `was` may matter longer under `is` than the
/// expiry `was` gave it (both the same algorithm; the parameters Redis enforces, not a
/// host's share):
///
/// * token bucket: a stored level of `t` tokens (0 ≤ t ≤ `was`'s capacity) is full again
///   after (capacity − t) ÷ rate; linear in `t`, so it lasts longer under `is` for some
///   `t` exactly when it does for the empty bucket (`capacity ÷ rate` grew) or for the
///   full one (the capacity grew);
/// * leaky bucket: a level of `l` drains in `l ÷ leak_rate`: when the leak slowed;
/// * windows: a count or a log matters for (a multiple of) the window: when it grew.
///
/// The 1 s margin each expiry carries is not counted on: it is there for clock steps.
pub fn keeps_state_longer(was: &Algorithm, is: &Algorithm) -> bool {
    // A concurrency key lives as long as its slots' lapse, renewed by their holders.
    if was.kind != is.kind || is.kind == Kind::Concurrency {
        return false;
    }
    match (was.per, is.per) {
        (Per::Rate(r0), Per::Rate(r1)) => match is.kind {
            Kind::LeakyBucket => r1 < r0,
            _ => is.limit as f64 / r1 > was.limit as f64 / r0 || is.limit > was.limit,
        },
        (Per::WindowMs(w0), Per::WindowMs(w1)) => w1 > w0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slower_refill_a_larger_bucket_or_a_longer_window_keeps_state_longer() {
        let tb = |limit, rate| Algorithm {
            kind: Kind::TokenBucket,
            limit,
            per: Per::Rate(rate),
        };
        assert!(keeps_state_longer(&tb(10, 10.0), &tb(10, 0.01)));
        assert!(!keeps_state_longer(&tb(10, 0.01), &tb(10, 10.0)));
        // Same time from empty to full, but a nearly full bucket needs longer.
        assert!(keeps_state_longer(&tb(10, 1.0), &tb(100, 10.0)));
        assert!(!keeps_state_longer(&tb(100, 10.0), &tb(10, 1.0)));
        assert!(!keeps_state_longer(&tb(10, 10.0), &tb(10, 10.0)));
        let lb = |limit, rate| Algorithm {
            kind: Kind::LeakyBucket,
            limit,
            per: Per::Rate(rate),
        };
        // A level drains at the leak rate whatever the capacity.
        assert!(keeps_state_longer(&lb(10, 10.0), &lb(5, 5.0)));
        assert!(!keeps_state_longer(&lb(10, 10.0), &lb(100, 10.0)));
        let window = |kind, ms| Algorithm {
            kind,
            limit: 5,
            per: Per::WindowMs(ms),
        };
        for kind in [
            Kind::FixedWindow,
            Kind::SlidingWindowLog,
            Kind::SlidingWindowCounter,
        ] {
            assert!(keeps_state_longer(
                &window(kind, 1000),
                &window(kind, 60_000)
            ));
            assert!(!keeps_state_longer(
                &window(kind, 60_000),
                &window(kind, 1000)
            ));
        }
        assert!(!keeps_state_longer(
            &window(Kind::FixedWindow, 1000),
            &window(Kind::SlidingWindowLog, 60_000)
        ));
    }

    #[test]
    fn names_each_changed_setting_once() {
        let a = Config::parse("[server]\nsocket = \"/tmp/a.sock\"\n", "a").unwrap();
        let b = Config::parse(
            "[server]\nsocket = \"/tmp/b.sock\"\n[cache]\nttl_ms = 7\n",
            "b",
        )
        .unwrap();
        assert_eq!(needs_restart(&a, &b), vec!["server.socket", "cache.ttl_ms"]);
        assert!(needs_restart(&a, &a).is_empty());
    }

    #[test]
    fn a_changed_algorithm_is_refused_naming_the_rule() {
        let rule = |name: &str, algorithm: &str, params: &str| {
            format!("[[rule]]\nname = \"{name}\"\nalgorithm = \"{algorithm}\"\n{params}\n")
        };
        let bucket = "capacity = 3\nrefill_rate = 1.0";
        let window = "limit = 3\nwindow = \"1m\"";
        let a = Config::parse(&rule("x", "token_bucket", bucket), "a").unwrap();
        let tighter = Config::parse(
            &rule("x", "token_bucket", "capacity = 2\nrefill_rate = 1.0"),
            "b",
        )
        .unwrap();
        assert_eq!(refused(&a, &tighter), None, "parameters may change");
        let renamed = Config::parse(&rule("y", "fixed_window", window), "c").unwrap();
        assert_eq!(
            refused(&a, &renamed),
            None,
            "a new name starts fresh by design"
        );
        let changed = Config::parse(&rule("x", "fixed_window", window), "d").unwrap();
        assert_eq!(
            refused(&a, &changed).as_deref(),
            Some("rule 'x': algorithm changed from token_bucket to fixed_window; a reload cannot change a rule's algorithm (its keys in Redis would start fresh): give the rule a new name, or restart")
        );
    }
}
