//! One lab run: each arrival of the plan asks the limiter at its time (`cost` 1, the
//! client's key under the run's rule), and the decisions go to the page in batches
//! every [`FLUSH`], each with its arrival time, verdict, remaining, limit, source and
//! wait. The run stops early when the page leaves. A `concurrency` rule's run takes and
//! gives back slots instead ([`super::slots`]).

use super::plan::Plan;
use super::sse;
use crate::admission::Peer;
use crate::clock::BatchClock;
use crate::limiter::{Check, Detached, Limiter};
use futures::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often decided requests are sent to the page.
pub(super) const FLUSH: Duration = Duration::from_millis(100);

/// One decision as the page receives it: `[arrival ms, client, allowed (1/0),
/// remaining, limit, source, wait_ms, decided after ms]`.
pub(super) type Row = (f64, u32, u8, u64, u64, &'static str, u64, f64);

/// What the page needs to draw the run before its first decision.
#[derive(Serialize)]
struct Start<'a> {
    rule: &'a str,
    algorithm: &'a str,
    prefix: &'a str,
    started_ms: u64,
    arrivals: usize,
    duration_ms: u64,
    clients: u32,
    limit: u64,
    /// The window, ms (`max_hold` for a concurrency rule).
    window_ms: u64,
    /// A concurrency run: how long each request holds its slot, ms (else 0).
    hold_ms: u64,
}

/// Runs `plan` on `limiter` and streams it to `tx` until done or the page leaves.
pub async fn run(
    limiter: &Arc<Limiter>,
    plan: &Plan,
    prefix: &str,
    started_ms: u64,
    mut tx: sse::Sender,
) {
    let arrivals = plan.arrivals(started_ms);
    if !send_start(plan, prefix, started_ms, arrivals.len(), &mut tx).await {
        return;
    }
    if plan.is_slots() {
        run_slots(limiter, plan, &arrivals, &mut tx).await;
    } else {
        run_checks(limiter, plan, &arrivals, &mut tx).await;
    }
}

/// The `start` event; false once the page left.
async fn send_start(
    plan: &Plan,
    prefix: &str,
    started_ms: u64,
    arrivals: usize,
    tx: &mut sse::Sender,
) -> bool {
    let start = Start {
        rule: &plan.rule.name,
        algorithm: &plan.algorithm,
        prefix,
        started_ms,
        arrivals,
        duration_ms: plan.duration_ms,
        clients: plan.clients,
        limit: plan.rule.limit(),
        window_ms: plan.rule.window_ms,
        hold_ms: plan.hold_ms,
    };
    let json = serde_json::to_string(&start).unwrap_or_default();
    tx.send_data(sse::event(Some("start"), &json)).await.is_ok()
}

/// A concurrency rule's run ([`super::slots::drive`]), then its `done` event.
async fn run_slots(
    limiter: &Arc<Limiter>,
    plan: &Plan,
    arrivals: &[(f64, u32)],
    tx: &mut sse::Sender,
) {
    let t0 = Instant::now();
    if let Some((decided, allowed, released, lapsed)) =
        super::slots::drive(limiter, plan, arrivals, tx).await
    {
        let json = serde_json::json!({ "decided": decided, "allowed": allowed, "released": released, "lapsed": lapsed, "elapsed_ms": t0.elapsed().as_millis() as u64 }).to_string();
        let _ = tx.send_data(sse::event(Some("done"), &json)).await;
    }
}

/// A rate rule's run: each arrival checked at its time, the decisions sent every
/// [`FLUSH`], then the `done` event (or `failed`, at the first check that errs).
async fn run_checks(
    limiter: &Arc<Limiter>,
    plan: &Plan,
    arrivals: &[(f64, u32)],
    tx: &mut sse::Sender,
) {
    let mut checks = Checks::new(limiter, plan);
    let t0 = checks.t0;
    let mut flush = tokio::time::interval(FLUSH);
    let mut next = 0;
    let (mut allowed, mut decided) = (0u64, 0u64);
    while next < arrivals.len() || !checks.pending.is_empty() {
        let due = arrivals
            .get(next)
            .map(|&(t, _)| t0 + Duration::from_micros((t * 1000.0) as u64));
        tokio::select! {
            Some(row) = checks.pending.next(), if !checks.pending.is_empty() => checks.batch.push(row),
            () = tokio::time::sleep_until(due.unwrap_or(t0)), if due.is_some() => {
                if let Err(message) = checks.ask_due(arrivals, &mut next) {
                    let json = serde_json::json!({ "message": message }).to_string();
                    let _ = tx.send_data(sse::event(Some("failed"), &json)).await;
                    return;
                }
            }
            _ = flush.tick() => {
                if !send(tx, &mut checks.batch, &mut allowed, &mut decided).await {
                    return;
                }
            }
        }
    }
    if !send(tx, &mut checks.batch, &mut allowed, &mut decided).await {
        return;
    }
    let json = serde_json::json!({ "decided": decided, "allowed": allowed, "elapsed_ms": t0.elapsed().as_millis() as u64 }).to_string();
    let _ = tx.send_data(sse::event(Some("done"), &json)).await;
}

/// A rate rule's run in progress: the checks waiting on Redis and the decisions not yet
/// sent.
struct Checks<'a> {
    limiter: &'a Arc<Limiter>,
    rule: Detached,
    peer: Peer,
    /// Client `c`'s key, `c<c>`.
    keys: Vec<String>,
    /// When the run started: arrival times count from here.
    t0: Instant,
    pending: FuturesUnordered<Pin<Box<dyn Future<Output = Row> + Send>>>,
    batch: Vec<Row>,
}

impl<'a> Checks<'a> {
    fn new(limiter: &'a Arc<Limiter>, plan: &Plan) -> Self {
        Checks {
            limiter,
            rule: Detached::unlisted(Arc::clone(&plan.rule)),
            peer: Peer::unbounded(0, 0),
            keys: (0..plan.clients).map(|c| format!("c{c}")).collect(),
            t0: Instant::now(),
            pending: FuturesUnordered::new(),
            batch: Vec::new(),
        }
    }

    /// Checks every arrival from `next` on that is due by now (`cost` 1, its client's
    /// key), moving `next` past them.
    ///
    /// # Errors
    /// The message of the first check that failed.
    fn ask_due(&mut self, arrivals: &[(f64, u32)], next: &mut usize) -> Result<(), String> {
        let t0 = self.t0;
        let now_ms = t0.elapsed().as_secs_f64() * 1000.0;
        while let Some(&(t, c)) = arrivals.get(*next).filter(|a| a.0 <= now_ms) {
            *next += 1;
            let mut clock = BatchClock::default();
            let asked = Instant::now();
            let row = move |d: crate::limiter::Decided| -> Row {
                let dd = d.decision;
                let after = asked.duration_since(t0).as_secs_f64() * 1000.0;
                (
                    round(t),
                    c,
                    u8::from(dd.allowed),
                    dd.remaining,
                    dd.limit,
                    dd.source.as_str(),
                    dd.wait_ms,
                    round(after),
                )
            };
            let key = self.keys[c as usize].as_bytes();
            match self
                .limiter
                .check_detached(&self.rule, key, 1, &mut clock, &self.peer)
            {
                Check::Ready(Ok(d)) => self.batch.push(row(d)),
                Check::Ready(Err(e)) => return Err(e.to_string()),
                Check::Redis(f) => self.pending.push(Box::pin(async move { row(f.await) })),
            }
        }
        Ok(())
    }
}

/// Sends the decisions of `batch` (if any) as one event; false once the page left.
pub(super) async fn send(
    tx: &mut sse::Sender,
    batch: &mut Vec<Row>,
    allowed: &mut u64,
    decided: &mut u64,
) -> bool {
    if batch.is_empty() {
        return true;
    }
    *decided += batch.len() as u64;
    *allowed += batch.iter().filter(|r| r.2 == 1).count() as u64;
    let json = serde_json::to_string(&batch).unwrap_or_default();
    batch.clear();
    tx.send_data(sse::event(None, &json)).await.is_ok()
}

/// `ms` to 0.1 ms.
pub(super) fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}
