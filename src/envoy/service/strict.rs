//! `[envoy] strict`: a request's descriptors decided all or nothing, so a request over
//! one descriptor's limit takes nothing from the others (docs/ENVOY.md, "Strict mode").
//!
//! The descriptors whose limit is a rule and not in `shadow_mode` are *held* while the
//! others are answered; then they are decided together by the limiter's `CHECKALL`
//! machinery (one script per Redis slot; across slots a reservation given back before
//! the answer on a DENY). When the request is already over a limit without the limiter
//! (`requests_per_unit: 0`, or a `hits_addend` above a limit), the held descriptors
//! are only read (a cost of 0). Shadow-mode descriptors are taken on their own: they
//! never deny the request. A rule `CHECKALL` refuses (a leased rule; every Redis call
//! slot in use) decides its descriptors one by one, as the default mode does, with a
//! warning the first time. A request with one held descriptor is decided as by default.

use super::{answer, Active, DescriptorAnswer, DescriptorCall, Override, Rls};
use crate::clock::BatchClock;
use crate::envoy::limits::{Decider, Limit};
use crate::limiter::{Bound, CheckAll, Detached};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use futures::future::BoxFuture;
use futures::FutureExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A descriptor waiting to be decided with the request's others.
pub(super) struct Held {
    /// Its position in the request.
    pub index: usize,
    /// Its limit (decided by a rule).
    pub limit: Arc<Limit>,
    /// The key it is decided under.
    pub key: String,
    /// The `limit` Envoy sent with it, if any.
    pub over: Option<Arc<Override>>,
    /// Units asked.
    pub hits: u64,
}

/// Set once a refusal made strict mode decide one by one (warned once per process).
static WARNED: AtomicBool = AtomicBool::new(false);

impl Rls {
    /// Starts deciding `held` (the answers by request position): all or nothing, or
    /// only read when `pending` already holds an `OVER_LIMIT`.
    pub(super) fn start_held<'a>(
        &'a self,
        active: &'a Active,
        pending: &[DescriptorCall],
        held: Vec<Held>,
        clock: &mut BatchClock,
    ) -> BoxFuture<'a, Vec<(usize, DescriptorAnswer)>> {
        if held.is_empty() {
            return futures::future::ready(Vec::new()).boxed();
        }
        let limit_of = |h: &Held| match &h.limit.decider {
            Decider::Rule(r) => r.limit(),
            _ => 0,
        };
        let blocked = pending
            .iter()
            .any(|p| matches!(p, DescriptorCall::Done(st, _) if st.code == Code::OverLimit as i32))
            || held.iter().any(|h| h.hits > limit_of(h));
        // One held descriptor alone is all or nothing already: the usual flow (deny
        // cache, lease) decides it.
        if !blocked && held.len() > 1 {
            let triples: Option<Vec<(&Detached, &[u8], u32)>> = held
                .iter()
                .map(|h| Some((detached(active, h)?, h.key.as_bytes(), h.hits as u32)))
                .collect();
            let all = triples.map(|t| self.limiter.check_all_detached(&t, clock, &self.peer));
            match all {
                Some(CheckAll::Ready(Ok(bound))) => {
                    return futures::future::ready(answers(held, &bound)).boxed();
                }
                Some(CheckAll::Redis(fut)) => {
                    return async move { answers(held, &fut.await) }.boxed();
                }
                Some(CheckAll::Ready(Err(refused))) if !WARNED.swap(true, Ordering::Relaxed) => {
                    tracing::warn!(
                        rule = %held.get(refused.index).map_or("", |h| h.limit.path.as_str()),
                        error = %refused.error,
                        "[envoy] strict: descriptors decided one by one (not all or nothing) while the limiter refuses them together"
                    );
                }
                Some(CheckAll::Ready(Err(_))) | None => {}
            }
        }
        // One by one: read only (cost 0) when the request is over a limit already.
        let calls: Vec<(usize, DescriptorCall)> = held
            .iter()
            .map(|h| {
                let hits = if blocked && h.hits <= limit_of(h) {
                    0
                } else {
                    h.hits
                };
                let call = self.start(active, &h.limit, &h.key, h.over.as_ref(), hits, clock);
                (h.index, call)
            })
            .collect();
        async move {
            let (index, calls): (Vec<usize>, Vec<DescriptorCall>) = calls.into_iter().unzip();
            let answers =
                futures::future::join_all(calls.into_iter().map(DescriptorCall::settle)).await;
            index.into_iter().zip(answers).collect()
        }
        .boxed()
    }
}

/// The rule deciding `h`: its override's, or its limit's.
fn detached<'h>(active: &'h Active, h: &'h Held) -> Option<&'h Detached> {
    match &h.over {
        Some(o) => o.rule.as_ref(),
        None => active.rules.get(h.limit.id)?.as_ref(),
    }
}

/// Each held descriptor's answer from the all-or-nothing decision: its own verdict
/// (whether it alone was within its limit), nothing taken unless all were.
fn answers(held: Vec<Held>, bound: &Bound) -> Vec<(usize, DescriptorAnswer)> {
    held.into_iter()
        .enumerate()
        .map(|(i, h)| {
            let d = bound
                .each
                .get(i)
                .copied()
                .flatten()
                .unwrap_or(bound.decided.decision);
            (
                h.index,
                answer(h.limit, !d.allowed, d.remaining, d.reset_ms),
            )
        })
        .collect()
}
