//! `ShouldRateLimit`: a request's descriptors to their limits, each limit decided by
//! the limiter, the answers into a `RateLimitResponse` as Envoy reads it.
//!
//! Per descriptor: no limit → `OK` without `current_limit` (as envoyproxy/ratelimit);
//! `unlimited` → `OK` with `limit_remaining` = 2³²−1; `requests_per_unit: 0` → always
//! `OVER_LIMIT`; a `limit` Envoy sent with the descriptor replaces the configured one
//! (in a configured domain); otherwise the limiter decides `hits_addend` units (the descriptor's own
//! `hits_addend` if Envoy sent one, 0 checks without consuming; else the request's,
//! where 0 means 1) of the descriptor's key under the limit's rule. A `hits_addend`
//! above the limit can never pass: `OVER_LIMIT`, nothing consumed. The descriptors are
//! decided concurrently; the request is `OVER_LIMIT` if any descriptor not in
//! `shadow_mode` is. Units a descriptor admitted stay taken when another descriptor of
//! the same request is over its limit (as in envoyproxy/ratelimit; docs/ENVOY.md),
//! unless `[envoy] strict` is on ([`strict`]: all or nothing).

mod active;
mod strict;

use super::limits::{Decider, Limit, Shared};
use super::metrics::{self as m, Verdict};
use super::response::status;
use crate::admission::Peer;
use crate::clock::BatchClock;
use crate::limiter::{Check, Limiter};
use active::{Active, Found, Override};
use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::sync::Arc;

/// Why a call gets a gRPC error instead of an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RlsError {
    /// An empty domain or no descriptor (envoyproxy/ratelimit refuses these too).
    #[error("{0}")]
    Invalid(&'static str),
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
enum DescriptorCall {
    /// Answered without the limiter.
    Done(DescriptorStatus, Option<(Arc<Limit>, Verdict)>),
    /// Decided by the limiter: the check, its limit, and whether it can never pass.
    Check(Check, Arc<Limit>, bool),
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
        let found: Vec<Found> = req
            .descriptors
            .iter()
            .map(|d| active.find(&req.domain, d))
            .collect();
        // `replaces`: a limit named by another matched limit is not evaluated.
        let replaced: Vec<&str> = found
            .iter()
            .flatten()
            .flat_map(|(l, _, _)| l.replaces.iter().map(String::as_str))
            .collect();
        let mut clock = BatchClock::default();
        let mut pending = Vec::with_capacity(found.len());
        let mut held = Vec::new();
        for (index, (d, f)) in req.descriptors.iter().zip(&found).enumerate() {
            let Some((limit, key, over)) = f
                .as_ref()
                .filter(|(l, _, _)| l.name.is_empty() || !replaced.contains(&l.name.as_str()))
            else {
                m::no_limit(&active.limits, &req.domain);
                pending.push(DescriptorCall::Done(status(Code::Ok, None, 0, 0), None));
                continue;
            };
            let hits = d
                .hits_addend
                .map_or(u64::from(req.hits_addend.max(1)), |h| h.value);
            if active.limits.strict
                && !limit.shadow_mode
                && matches!(limit.decider, Decider::Rule(_))
            {
                // Decided below, with the request's other held descriptors.
                held.push(strict::Held {
                    index,
                    limit: Arc::clone(limit),
                    key: key.clone(),
                    over: over.clone(),
                    hits,
                });
                pending.push(DescriptorCall::Done(status(Code::Ok, None, 0, 0), None));
                continue;
            }
            pending.push(self.start(&active, limit, key, over.as_ref(), hits, &mut clock));
        }
        let together = self.start_held(&active, &pending, held, &mut clock);
        let (mut decided, held) = futures::future::join(
            futures::future::join_all(pending.into_iter().map(DescriptorCall::settle)),
            together,
        )
        .await;
        for (index, answer) in held {
            decided[index] = answer;
        }
        Ok(active.respond(decided))
    }

    /// Starts deciding `hits` units of `key` under `limit` (the limit of override
    /// `over` if Envoy sent one), or answers at once when the limit needs no limiter.
    fn start(
        &self,
        active: &Active,
        limit: &Arc<Limit>,
        key: &str,
        over: Option<&Arc<Override>>,
        hits: u64,
        clock: &mut BatchClock,
    ) -> DescriptorCall {
        let limit = Arc::clone(limit);
        match &limit.decider {
            Decider::Unlimited => DescriptorCall::Done(
                status(Code::Ok, None, u32::MAX, 0),
                Some((Arc::clone(&limit), Verdict::Unlimited)),
            ),
            Decider::Never => {
                let s = limit.unit.map_or(1, |u| u.seconds()) * 1000;
                let now_ms = (crate::clock::wall_clock_us() / 1000.0) as u64;
                let st = status(Code::OverLimit, Some(&limit), 0, s - now_ms % s);
                DescriptorCall::Done(st, Some((Arc::clone(&limit), Verdict::OverLimit)))
            }
            Decider::Rule(rule) => {
                let never = hits > rule.limit();
                let cost = if never { 0 } else { hits as u32 };
                let detached = match over {
                    Some(o) => o.rule.as_ref(),
                    None => active.rules[limit.id].as_ref(),
                };
                let Some(detached) = detached else {
                    unreachable!("every rule limit has its detached rule");
                };
                let check =
                    self.limiter
                        .check_detached(detached, key.as_bytes(), cost, clock, &self.peer);
                DescriptorCall::Check(check, limit, never)
            }
        }
    }
}

/// A descriptor's answer, and its limit and outcome for the metrics.
type DescriptorAnswer = (DescriptorStatus, Option<(Arc<Limit>, Verdict)>);

impl DescriptorCall {
    /// The descriptor's answer: at once, or when the limiter has decided.
    async fn settle(self) -> DescriptorAnswer {
        let (check, limit, never) = match self {
            DescriptorCall::Done(st, outcome) => return (st, outcome),
            DescriptorCall::Check(check, limit, never) => (check, limit, never),
        };
        let decided = match check {
            Check::Ready(Ok(d)) => d,
            Check::Redis(fut) => fut.await,
            // Detached rules skip access lists, take no cost above their limit
            // (`never`), get keys that fit (shortened), and are decided without Redis
            // when no Redis slot is free.
            Check::Ready(Err(e)) => unreachable!("a detached rule was refused: {e}"),
        };
        let d = decided.decision;
        answer(limit, never || !d.allowed, d.remaining, d.reset_ms)
    }
}

/// A decided descriptor's answer: `OVER_LIMIT` if `over` (`OK` in `shadow_mode`), its
/// `remaining` units and `reset_ms` (the limiter's decision).
fn answer(limit: Arc<Limit>, over: bool, remaining: u64, reset_ms: u64) -> DescriptorAnswer {
    let remaining = if over {
        0
    } else {
        remaining.min(u64::from(u32::MAX)) as u32
    };
    let code = if over && !limit.shadow_mode {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let outcome = match (over, limit.shadow_mode) {
        (false, _) => Verdict::Ok,
        (true, false) => Verdict::OverLimit,
        (true, true) => Verdict::ShadowOverLimit,
    };
    (
        status(code, Some(&limit), remaining, reset_ms),
        Some((limit, outcome)),
    )
}
