//! What an answer says: one descriptor's status as Envoy reads it, and the optional
//! IETF `RateLimit-Policy` / `RateLimit` headers.

use super::limits::Limit;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use std::sync::Arc;

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers) for the
/// status closest to its limit (an over-limit one first); none without a limit.
/// `windows` holds each status's policy window, ms.
pub(super) fn ietf_headers(statuses: &[DescriptorStatus], windows: &[u64]) -> Vec<HeaderValue> {
    let Some((s, window_ms)) = statuses
        .iter()
        .zip(windows)
        .filter(|(s, _)| s.current_limit.is_some())
        .min_by_key(|(s, _)| (s.code != Code::OverLimit as i32, s.limit_remaining))
    else {
        return Vec::new();
    };
    let Some(limit) = &s.current_limit else {
        return Vec::new();
    };
    let name = if limit.name.is_empty() {
        "default"
    } else {
        limit.name.as_str()
    };
    let reset = s
        .duration_until_reset
        .map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
    let window = window_ms.div_ceil(1000);
    let header = |key: &str, value: String| HeaderValue {
        key: key.into(),
        value,
        raw_value: Vec::new(),
    };
    vec![
        header(
            "RateLimit-Policy",
            format!("\"{name}\";q={};w={window}", limit.requests_per_unit),
        ),
        header(
            "RateLimit",
            format!("\"{name}\";r={};t={reset}", s.limit_remaining),
        ),
    ]
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
