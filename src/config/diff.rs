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

/// Each field that only a restart applies, with whether it differs between `current`
/// and `new`.
fn restart_fields(current: &Config, new: &Config) -> Vec<(bool, &'static str)> {
    let (s, n, r, m) = (&current.server, &new.server, &current.redis, &new.redis);
    vec![
        (n.socket != s.socket, "server.socket"),
        (n.socket_mode != s.socket_mode, "server.socket_mode"),
        (
            n.max_line_bytes != s.max_line_bytes,
            "server.max_line_bytes",
        ),
        (n.max_in_flight != s.max_in_flight, "server.max_in_flight"),
        (n.allow_uids != s.allow_uids, "server.allow_uids"),
        (n.allow_gids != s.allow_gids, "server.allow_gids"),
        (n.admin_uids != s.admin_uids, "server.admin_uids"),
        (n.admin_gids != s.admin_gids, "server.admin_gids"),
        (
            n.max_connections != s.max_connections,
            "server.max_connections",
        ),
        (
            n.max_connections_per_uid() != s.max_connections_per_uid(),
            "server.max_connections_per_uid",
        ),
        (
            n.idle_timeout_ms != s.idle_timeout_ms,
            "server.idle_timeout_ms",
        ),
        (
            n.worker_threads != s.worker_threads,
            "server.worker_threads",
        ),
        (
            n.redis_max_in_flight != s.redis_max_in_flight,
            "server.redis_max_in_flight",
        ),
        (
            n.redis_max_in_flight_per_uid != s.redis_max_in_flight_per_uid,
            "server.redis_max_in_flight_per_uid",
        ),
        (m.mode != r.mode, "redis.mode"),
        (m.nodes.get_ref() != r.nodes.get_ref(), "redis.nodes"),
        (m.timeout_ms != r.timeout_ms, "redis.timeout_ms"),
        (m.prefix != r.prefix, "redis.prefix"),
        (new.cache.ttl_ms != current.cache.ttl_ms, "cache.ttl_ms"),
        (
            new.cache.max_entries != current.cache.max_entries,
            "cache.max_entries",
        ),
        (
            new.fallback.max_keys != current.fallback.max_keys,
            "fallback.max_keys",
        ),
        (
            new.fallback.min_hosts != current.fallback.min_hosts,
            "fallback.min_hosts",
        ),
        (
            new.fallback.state_dir != current.fallback.state_dir,
            "fallback.state_dir",
        ),
        (
            new.metrics.listen != current.metrics.listen,
            "metrics.listen",
        ),
        (
            new.metrics.max_connections != current.metrics.max_connections,
            "metrics.max_connections",
        ),
        (new.envoy.listen != current.envoy.listen, "envoy.listen"),
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
    if was.kind != is.kind {
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
