//! The Envoy front end's metrics (docs/METRICS.md), by domain and descriptor.
//!
//! Labels take only configured values, so the series stay as many as the limits
//! configured: `descriptor` is a limit's configured path (`domain.key_value.key`, the
//! stats key envoyproxy/ratelimit uses), never a request's values; a request for a
//! domain that no file configures is counted under `domain="unknown"`. The decisions
//! behind each limit (source `redis`, `cache`, `local`) are also counted in
//! `ratelimitd_decisions_total` under the limit's rule name.

use super::limits::Limits;
use metrics::{counter, Counter};

/// Descriptors answered, by domain × descriptor × code (`ok`, `over_limit`,
/// `shadow_over_limit`: over limit but answered OK, `unlimited`, `no_limit`).
pub const DESCRIPTORS: &str = "ratelimitd_envoy_descriptors_total";
/// `ShouldRateLimit` calls, by overall code (`ok`, `over_limit`) or `error`.
pub const REQUESTS: &str = "ratelimitd_envoy_requests_total";

/// Describes the series (once, after the recorder is installed).
pub fn describe() {
    metrics::describe_counter!(
        DESCRIPTORS,
        "Envoy RLS descriptors answered, by domain, configured descriptor and code"
    );
    metrics::describe_counter!(REQUESTS, "Envoy RLS calls, by overall code");
}

/// The counters of one configured limit: `[ok, over_limit, shadow_over_limit, unlimited]`.
pub struct LimitCounters([Counter; 4]);

/// What a descriptor got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within its limit.
    Ok = 0,
    /// Over its limit.
    OverLimit = 1,
    /// Over its limit, answered OK (`shadow_mode`).
    ShadowOverLimit = 2,
    /// `unlimited: true`.
    Unlimited = 3,
}

impl LimitCounters {
    /// Registers the counters of every limit of `limits`, by limit id.
    pub fn of(limits: &Limits) -> Vec<LimitCounters> {
        limits
            .all
            .iter()
            .map(|l| {
                let domain = l.domain.clone();
                LimitCounters(["ok", "over_limit", "shadow_over_limit", "unlimited"].map(
                    |code| {
                        counter!(DESCRIPTORS, "domain" => domain.clone(), "descriptor" => l.path.clone(), "code" => code)
                    },
                ))
            })
            .collect()
    }

    /// Counts one descriptor.
    pub fn record(&self, outcome: Verdict) {
        self.0[outcome as usize].increment(1);
    }
}

/// Counts a descriptor that matched no limit: `domain` if configured, else `unknown`.
pub fn no_limit(limits: &Limits, domain: &str) {
    let domain = if limits.domains.contains_key(domain) {
        domain.to_owned()
    } else {
        "unknown".to_owned()
    };
    counter!(DESCRIPTORS, "domain" => domain, "descriptor" => "", "code" => "no_limit")
        .increment(1);
}

/// The per-call counters, by overall code: registered once (a handle each), not looked
/// up per call.
pub struct RequestCounters {
    ok: Counter,
    over_limit: Counter,
    error: Counter,
}

impl RequestCounters {
    /// Registers them (no-ops when metrics are off).
    pub fn new() -> Self {
        RequestCounters {
            ok: counter!(REQUESTS, "code" => "ok"),
            over_limit: counter!(REQUESTS, "code" => "over_limit"),
            error: counter!(REQUESTS, "code" => "error"),
        }
    }

    /// Counts one call: `Some(over_limit)`, or `None` for an error.
    pub fn record(&self, over_limit: Option<bool>) {
        match over_limit {
            Some(false) => self.ok.increment(1),
            Some(true) => self.over_limit.increment(1),
            None => self.error.increment(1),
        }
    }
}

impl Default for RequestCounters {
    fn default() -> Self {
        Self::new()
    }
}
