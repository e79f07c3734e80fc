//! `ShouldRateLimit`: a request's descriptors to their limits, each limit decided by
//! the limiter, the answers into a `RateLimitResponse` as Envoy reads it.
//!
//! Per descriptor: no limit → `OK` without `current_limit` (as envoyproxy/ratelimit);
//! `unlimited` → `OK` with `limit_remaining` = 2³²−1; `requests_per_unit: 0` → always
//! `OVER_LIMIT`; otherwise the limiter decides `hits_addend` units (the descriptor's own
//! `hits_addend` if Envoy sent one, 0 checks without consuming; else the request's,
//! where 0 means 1) of the descriptor's key under the limit's rule. A `hits_addend`
//! above the limit can never pass: `OVER_LIMIT`, nothing consumed. The descriptors are
//! decided concurrently; the request is `OVER_LIMIT` if any descriptor not in
//! `shadow_mode` is. Units a descriptor admitted stay taken when another descriptor of
//! the same request is over its limit (as in envoyproxy/ratelimit; docs/ENVOY.md).

use super::limits::{Decider, Limit, Shared};
use super::metrics::{self as m, LimitCounters, Outcome};
use crate::admission::Peer;
use crate::clock::BatchClock;
use crate::limiter::{Check, CheckError, Detached, Limiter};
use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use std::sync::Arc;

/// The limits in force with what the limiter and the metrics need for each, by limit id.
struct Active {
    limits: Shared,
    rules: Vec<Option<Detached>>,
    counters: Vec<LimitCounters>,
}

impl Active {
    fn new(limits: Shared) -> Self {
        let rules = limits
            .all
            .iter()
            .map(|l| match &l.decider {
                Decider::Rule(rule) => Some(Detached::new(Arc::clone(rule))),
                _ => None,
            })
            .collect();
        let counters = LimitCounters::of(&limits);
        Active {
            limits,
            rules,
            counters,
        }
    }
}

/// Why a call gets a gRPC error instead of an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RlsError {
    /// An empty domain or no descriptor (envoyproxy/ratelimit refuses these too).
    #[error("{0}")]
    Invalid(&'static str),
    /// The daemon's requests in flight to Redis are at `server.redis_max_in_flight`.
    #[error("{0}")]
    Busy(String),
}

/// The Rate Limit Service: the limits in force, the limiter, and the peer whose share
/// of requests in flight to Redis the front end uses.
pub struct Rls {
    limiter: Arc<Limiter>,
    peer: Peer,
    active: ArcSwap<Active>,
    requests: m::RequestCounters,
}

/// What one descriptor waits for.
enum Pending<'a> {
    /// Answered without the limiter.
    Done(DescriptorStatus, Option<(&'a Arc<Limit>, Outcome)>),
    /// Decided by the limiter: the check, its limit, and whether it can never pass.
    Check(Check, &'a Arc<Limit>, bool),
}

impl Rls {
    /// A service deciding `limits` with `limiter`, its Redis requests counted as `peer`'s.
    /// Registers its metrics: build it after the recorder is installed.
    pub fn new(limiter: Arc<Limiter>, limits: Shared, peer: Peer) -> Self {
        Rls {
            limiter,
            peer,
            active: ArcSwap::from_pointee(Active::new(limits)),
            requests: m::RequestCounters::new(),
        }
    }

    /// Puts `limits` in force for calls that start from now on.
    pub fn replace(&self, limits: Shared) {
        self.active.store(Arc::new(Active::new(limits)));
    }

    /// Answers one `ShouldRateLimit` call. Errors only for a malformed request or an
    /// overload; Redis failing is decided locally, within `redis.timeout_ms`.
    pub async fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RlsError> {
        let result = self.decide(req).await;
        self.requests.record(
            result
                .as_ref()
                .ok()
                .map(|r| r.overall_code == Code::OverLimit as i32),
        );
        result
    }

    async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, RlsError> {
        if req.domain.is_empty() {
            return Err(RlsError::Invalid("rate limit domain must not be empty"));
        }
        if req.descriptors.is_empty() {
            return Err(RlsError::Invalid(
                "rate limit descriptor list must not be empty",
            ));
        }
        let active = self.active.load_full();
        let mut found = Vec::with_capacity(req.descriptors.len());
        for d in &req.descriptors {
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            found.push(active.limits.find(&req.domain, &entries));
        }
        // `replaces`: a limit named by another matched limit is not evaluated.
        let replaced: Vec<&str> = found
            .iter()
            .flatten()
            .flat_map(|(l, _)| l.replaces.iter().map(String::as_str))
            .collect();
        let mut clock = BatchClock::default();
        let mut pending = Vec::with_capacity(found.len());
        for (d, f) in req.descriptors.iter().zip(&found) {
            let Some((limit, key)) = f
                .as_ref()
                .filter(|(l, _)| l.name.is_empty() || !replaced.contains(&l.name.as_str()))
            else {
                m::no_limit(&active.limits, &req.domain);
                pending.push(Pending::Done(status(Code::Ok, None, 0, 0), None));
                continue;
            };
            let hits = d
                .hits_addend
                .map_or(u64::from(req.hits_addend.max(1)), |h| h.value);
            let p = match &limit.decider {
                Decider::Unlimited => Pending::Done(
                    status(Code::Ok, None, u32::MAX, 0),
                    Some((limit, Outcome::Unlimited)),
                ),
                Decider::Never => {
                    let s = limit.unit.map_or(1, |u| u.seconds()) * 1000;
                    let now_ms = (crate::clock::wall_clock_us() / 1000.0) as u64;
                    let st = status(Code::OverLimit, Some(limit), 0, s - now_ms % s);
                    Pending::Done(st, Some((limit, Outcome::OverLimit)))
                }
                Decider::Rule(rule) => {
                    let never = hits > rule.limit();
                    let cost = if never { 0 } else { hits as u32 };
                    let Some(detached) = &active.rules[limit.id] else {
                        unreachable!("every rule limit has its detached rule");
                    };
                    let check = self.limiter.check_detached(
                        detached,
                        key.as_bytes(),
                        cost,
                        &mut clock,
                        &self.peer,
                    );
                    Pending::Check(check, limit, never)
                }
            };
            pending.push(p);
        }
        let statuses = futures::future::join_all(pending.into_iter().map(|p| async move {
            match p {
                Pending::Done(st, outcome) => Ok((st, outcome)),
                Pending::Check(check, limit, never) => {
                    let decided = match check {
                        Check::Ready(Ok(d)) => d,
                        Check::Redis(fut) => fut.await,
                        Check::Ready(Err(e @ CheckError::Busy { .. })) => {
                            return Err(RlsError::Busy(e.to_string()))
                        }
                        Check::Ready(Err(e)) => {
                            unreachable!("detached rules refuse nothing else: {e}")
                        }
                    };
                    let d = decided.decision;
                    let over = never || !d.allowed;
                    let remaining = if over {
                        0
                    } else {
                        d.remaining.min(u64::from(u32::MAX)) as u32
                    };
                    let code = if over && !limit.shadow_mode {
                        Code::OverLimit
                    } else {
                        Code::Ok
                    };
                    let outcome = match (over, limit.shadow_mode) {
                        (false, _) => Outcome::Ok,
                        (true, false) => Outcome::OverLimit,
                        (true, true) => Outcome::ShadowOverLimit,
                    };
                    Ok((
                        status(code, Some(limit), remaining, d.reset_ms),
                        Some((limit, outcome)),
                    ))
                }
            }
        }))
        .await;
        let mut response = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        };
        let mut windows = Vec::with_capacity(statuses.len());
        for s in statuses {
            let (st, outcome) = s?;
            windows.push(outcome.map_or(0, |(l, _)| l.window_ms));
            if let Some((limit, outcome)) = outcome {
                active.counters[limit.id].record(outcome);
            }
            if st.code == Code::OverLimit as i32 {
                response.overall_code = Code::OverLimit as i32;
            }
            response.statuses.push(st);
        }
        if active.limits.ietf_headers {
            response.response_headers_to_add = ietf_headers(&response.statuses, &windows);
        }
        Ok(response)
    }
}

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers) for the
/// status closest to its limit (an over-limit one first); none without a limit.
/// `windows` holds each status's policy window, ms.
fn ietf_headers(statuses: &[DescriptorStatus], windows: &[u64]) -> Vec<HeaderValue> {
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
fn status(
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
