//! What an answer says: one descriptor's status as Envoy reads it, and the optional
//! IETF `RateLimit-Policy` / `RateLimit` headers.

use super::limits::Limit;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use std::sync::Arc;

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11): the
/// policy list names every matched limit once (the binding one first, then the others in
/// descriptor order; a name already listed is not repeated, since the draft's policy
/// names are unique within a field), and `RateLimit` gives the state of the binding one,
/// the status closest to its limit (an over-limit one first). None without a limit.
/// `windows` holds each status's policy window, ms.
pub(super) fn ietf_headers(statuses: &[DescriptorStatus], windows: &[u64]) -> Vec<HeaderValue> {
    let limited: Vec<(&DescriptorStatus, &RateLimit, u64)> = statuses
        .iter()
        .zip(windows)
        .filter_map(|(s, w)| Some((s, s.current_limit.as_ref()?, *w)))
        .collect();
    let Some(&(binding, limit, _)) = limited
        .iter()
        .min_by_key(|(s, _, _)| (s.code != Code::OverLimit as i32, s.limit_remaining))
    else {
        return Vec::new();
    };
    let by_binding_first = limited
        .iter()
        .filter(|(s, _, _)| std::ptr::eq(*s, binding))
        .chain(
            limited
                .iter()
                .filter(|(s, _, _)| !std::ptr::eq(*s, binding)),
        );
    let mut names: Vec<&str> = Vec::new();
    let mut policies: Vec<String> = Vec::new();
    for (_, l, window_ms) in by_binding_first {
        let name = policy_name(l);
        if !names.contains(&name) {
            names.push(name);
            let window = window_ms.div_ceil(1000);
            policies.push(format!("\"{name}\";q={};w={window}", l.requests_per_unit));
        }
    }
    let reset = binding
        .duration_until_reset
        .map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
    let header = |key: &str, value: String| HeaderValue {
        key: key.into(),
        value,
        raw_value: Vec::new(),
    };
    vec![
        header("RateLimit-Policy", policies.join(", ")),
        header(
            "RateLimit",
            format!(
                "\"{}\";r={};t={reset}",
                policy_name(limit),
                binding.limit_remaining
            ),
        ),
    ]
}

/// A limit's policy name in the headers: its `rate_limit.name`, else `default`.
fn policy_name(limit: &RateLimit) -> &str {
    if limit.name.is_empty() {
        "default"
    } else {
        limit.name.as_str()
    }
}

/// A descriptor's status; `current_limit` only for a matched limit (Envoy builds its
/// `x-ratelimit-*` headers from the statuses that carry one).
pub(super) fn status(
    code: Code,
    limit: Option<&Arc<Limit>>,
    remaining: u32,
    reset_ms: u64,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: limit.map(|l| RateLimit {
            name: l.name.clone(),
            requests_per_unit: l.requests_per_unit,
            unit: l.unit.map_or(0, |u| u as i32),
        }),
        limit_remaining: remaining,
        duration_until_reset: limit.map(|_| PbDuration {
            seconds: (reset_ms / 1000) as i64,
            nanos: ((reset_ms % 1000) * 1_000_000) as i32,
        }),
        quota: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str, q: u32, code: Code, remaining: u32) -> DescriptorStatus {
        let mut s = status(code, None, remaining, 30_000);
        s.current_limit = Some(RateLimit {
            name: name.into(),
            requests_per_unit: q,
            unit: 0,
        });
        s.duration_until_reset = Some(PbDuration {
            seconds: 30,
            nanos: 0,
        });
        s
    }

    #[test]
    fn the_policy_lists_every_limit_and_rate_limit_names_the_binding_one() {
        let statuses = [
            named("burst", 100, Code::Ok, 40),
            named("daily", 1000, Code::Ok, 3),
            named("burst", 100, Code::Ok, 50),
            status(Code::Ok, None, 0, 0),
        ];
        let h = ietf_headers(&statuses, &[60_000, 86_400_000, 60_000, 0]);
        assert_eq!(h[0].key, "RateLimit-Policy");
        assert_eq!(h[0].value, "\"daily\";q=1000;w=86400, \"burst\";q=100;w=60");
        assert_eq!(h[1].value, "\"daily\";r=3;t=30");
        // An over-limit status binds, whatever the others' remaining.
        let over = [
            named("a", 5, Code::Ok, 0),
            named("b", 9, Code::OverLimit, 4),
        ];
        let h = ietf_headers(&over, &[1000, 2000]);
        assert_eq!(h[0].value, "\"b\";q=9;w=2, \"a\";q=5;w=1");
        assert_eq!(h[1].value, "\"b\";r=4;t=30");
        assert!(ietf_headers(&[status(Code::Ok, None, 0, 0)], &[0]).is_empty());
    }
}
