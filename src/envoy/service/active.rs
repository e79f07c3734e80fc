//! The limits in force for the Envoy front end ([`Active`]): each limit with what the
//! limiter and the metrics need for it, the limits Envoy sent in descriptors (bounded,
//! per configuration), a descriptor's limit found among them, and the response built
//! from the descriptors' answers with each outcome counted.

use super::DescriptorAnswer;
use crate::algorithm::{Algorithm, Kind as Algo, Per, MAX_LIMIT};
use crate::config::{OnRedisFailure, Rule};
use crate::envoy::limits::{rule_name, Decider, Limit, Shared, Unit};
use crate::envoy::metrics::LimitCounters;
use crate::envoy::response::ietf_headers;
use crate::limiter::Detached;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The limits in force with what the limiter and the metrics need for each, by limit id.
pub(super) struct Active {
    pub(super) limits: Shared,
    pub(super) rules: Vec<Option<Detached>>,
    counters: Vec<LimitCounters>,
    /// The limits Envoy sent in descriptors (`limit`: requests_per_unit, unit), by
    /// domain and both: at most [`MAX_OVERRIDES`].
    overrides: Mutex<HashMap<(String, u32, i32), Arc<Override>>>,
}

/// A limit Envoy sent with a descriptor, and its rule.
pub(super) struct Override {
    limit: Arc<Limit>,
    pub(super) rule: Option<Detached>,
}

/// Distinct descriptor `limit` overrides remembered per configuration; beyond, an
/// override is ignored (the configured limit applies) and a warning is logged once.
const MAX_OVERRIDES: usize = 1024;

impl Active {
    pub(super) fn new(limits: Shared) -> Self {
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

/// A descriptor's limit, the key it is decided under, and the override it comes from
/// if Envoy sent one; `None`: no limit.
pub(super) type Found = Option<(Arc<Limit>, String, Option<Arc<Override>>)>;

impl Active {
    /// The limit of descriptor `d` in `domain`: the configured one, or the `limit` Envoy
    /// sent with it, which replaces the configured one in a configured domain.
    pub(super) fn find(&self, domain: &str, d: &RateLimitDescriptor) -> Found {
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
                crate::envoy::limits::descriptor_key(entries.iter().copied()),
                Some(o),
            )),
            None => found,
        }
    }

    /// The response to the descriptors' answers, in their order: `OVER_LIMIT` if any
    /// is, each outcome counted on its limit's series.
    pub(super) fn respond(&self, answers: Vec<DescriptorAnswer>) -> RateLimitResponse {
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
