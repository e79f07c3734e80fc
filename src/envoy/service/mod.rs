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

mod strict;

use super::limits::{rule_name, Decider, Limit, Shared, Unit};
use super::metrics::{self as m, LimitCounters, Verdict};
use super::response::{ietf_headers, status};
use crate::admission::Peer;
use crate::algorithm::{Algorithm, Kind as Algo, Per, MAX_LIMIT};
use crate::clock::BatchClock;
use crate::config::{OnRedisFailure, Rule};
use crate::limiter::{Check, Detached, Limiter};
use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

/// The limits in force with what the limiter and the metrics need for each, by limit id.
struct Active {
    limits: Shared,
    rules: Vec<Option<Detached>>,
    counters: Vec<LimitCounters>,
    /// The limits Envoy sent in descriptors (`limit`: requests_per_unit, unit), by
    /// domain and both: at most [`MAX_OVERRIDES`].
    overrides: Mutex<HashMap<(String, u32, i32), Arc<Override>>>,
}

/// A limit Envoy sent with a descriptor, and its rule.
struct Override {
    limit: Arc<Limit>,
    rule: Option<Detached>,
}

/// Distinct descriptor `limit` overrides remembered per configuration; beyond, an
/// override is ignored (the configured limit applies) and a warning is logged once.
const MAX_OVERRIDES: usize = 1024;

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
            overrides: Mutex::new(HashMap::new()),
        }
    }

    /// The limit of a descriptor `limit` override in `domain` (a fixed window of
    /// `requests_per_unit` per `unit`, as envoyproxy/ratelimit applies it), `None` for an
    /// unknown unit or when [`MAX_OVERRIDES`] are remembered already.
    fn override_for(&self, domain: &str, rpu: u32, unit: i32) -> Option<Arc<Override>> {
        let u = Unit::ALL.into_iter().find(|u| *u as i32 == unit)?;
        let mut map = self.overrides.lock().unwrap_or_else(|e| e.into_inner());
        let key = (domain.to_owned(), rpu, unit);
        if let Some(o) = map.get(&key) {
            return Some(Arc::clone(o));
        }
        if map.len() >= MAX_OVERRIDES {
            if map.len() == MAX_OVERRIDES {
                tracing::warn!(domain, "more than {MAX_OVERRIDES} distinct descriptor limit overrides: further ones are ignored until the next reload");
            }
            return None;
        }
        let path = format!("{domain}/override.{rpu}.{}", u.name());
        let rule = (rpu > 0).then(|| {
            let algorithm = Algorithm {
                kind: Algo::FixedWindow,
                limit: u64::from(rpu).min(MAX_LIMIT),
                per: Per::WindowMs(u.seconds() * 1000),
            };
            let template = self.limits.all.iter().find_map(|l| match &l.decider {
                Decider::Rule(r) if r.name.starts_with("envoy/") => Some(r),
                _ => None,
            });
            let mut rule = Rule::new(
                rule_name(&path),
                algorithm,
                OnRedisFailure::Local,
                template.map_or(1, |r| r.fallback_hosts),
            );
            rule.fallback_auto = template.is_some_and(|r| r.fallback_auto);
            Arc::new(rule)
        });
        let limit = Arc::new(Limit {
            id: usize::MAX,
            decider: rule
                .as_ref()
                .map_or(Decider::Never, |r| Decider::Rule(Arc::clone(r))),
            requests_per_unit: rpu,
            unit: Some(u),
            window_ms: u.seconds() * 1000,
            name: String::new(),
            replaces: Vec::new(),
            shadow_mode: false,
            domain: domain.to_owned(),
            path,
            origin: "a descriptor limit override".into(),
        });
        let o = Arc::new(Override {
            rule: rule.map(Detached::new),
            limit,
        });
        map.insert(key, Arc::clone(&o));
        Some(o)
    }
}

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

/// A descriptor's limit, the key it is decided under, and the override it comes from
/// if Envoy sent one; `None`: no limit.
type Found = Option<(Arc<Limit>, String, Option<Arc<Override>>)>;

/// A descriptor's answer, and its limit and outcome for the metrics.
type DescriptorAnswer = (DescriptorStatus, Option<(Arc<Limit>, Verdict)>);

impl Active {
    /// The limit of descriptor `d` in `domain`: the configured one, or the `limit` Envoy
    /// sent with it, which replaces the configured one in a configured domain.
    fn find(&self, domain: &str, d: &RateLimitDescriptor) -> Found {
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        let found = self
            .limits
            .find(domain, &entries)
            .map(|(l, key)| (Arc::clone(l), key, None));
        let sent = d
            .limit
            .as_ref()
            .filter(|_| self.limits.domains.contains_key(domain));
        match sent.and_then(|o| self.override_for(domain, o.requests_per_unit, o.unit)) {
            Some(o) => Some((
                Arc::clone(&o.limit),
                super::limits::descriptor_key(entries.iter().copied()),
                Some(o),
            )),
            None => found,
        }
    }

    /// The response to the descriptors' answers, in their order: `OVER_LIMIT` if any
    /// is, each outcome counted on its limit's series.
    fn respond(&self, answers: Vec<DescriptorAnswer>) -> RateLimitResponse {
        let mut response = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        };
        let mut windows = Vec::with_capacity(answers.len());
        for (st, outcome) in answers {
            windows.push(outcome.as_ref().map_or(0, |(l, _)| l.window_ms));
            // Overrides (id usize::MAX) have no series of their own.
            if let Some((c, outcome)) =
                outcome.and_then(|(l, o)| Some((self.counters.get(l.id)?, o)))
            {
                c.record(outcome);
            }
            if st.code == Code::OverLimit as i32 {
                response.overall_code = Code::OverLimit as i32;
            }
            response.statuses.push(st);
        }
        if self.limits.ietf_headers {
            response.response_headers_to_add = ietf_headers(&response.statuses, &windows);
        }
        response
    }
}

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
