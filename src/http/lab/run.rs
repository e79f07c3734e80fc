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
    let start = Start {
        rule: &plan.rule.name,
        algorithm: &plan.algorithm,
        prefix,
        started_ms,
        arrivals: arrivals.len(),
        duration_ms: plan.duration_ms,
        clients: plan.clients,
        limit: plan.rule.limit(),
        window_ms: plan.rule.window_ms,
        hold_ms: plan.hold_ms,
    };
    let json = serde_json::to_string(&start).unwrap_or_default();
    if tx
        .send_data(sse::event(Some("start"), &json))
        .await
        .is_err()
    {
        return;
    }
    if plan.is_slots() {
        let t0 = Instant::now();
        if let Some((decided, allowed, released, lapsed)) =
            super::slots::drive(limiter, plan, &arrivals, &mut tx).await
        {
            let json = serde_json::json!({ "decided": decided, "allowed": allowed, "released": released, "lapsed": lapsed, "elapsed_ms": t0.elapsed().as_millis() as u64 }).to_string();
            let _ = tx.send_data(sse::event(Some("done"), &json)).await;
        }
        return;
    }
    let rule = Detached::unlisted(Arc::clone(&plan.rule));
    let peer = Peer::unbounded(0, 0);
    let keys: Vec<String> = (0..plan.clients).map(|c| format!("c{c}")).collect();
    let t0 = Instant::now();
    let mut pending: FuturesUnordered<Pin<Box<dyn Future<Output = Row> + Send>>> =
        FuturesUnordered::new();
    let mut batch: Vec<Row> = Vec::new();
    let mut flush = tokio::time::interval(FLUSH);
    let mut next = 0;
    let (mut allowed, mut decided) = (0u64, 0u64);
    while next < arrivals.len() || !pending.is_empty() {
        let due = arrivals
            .get(next)
            .map(|&(t, _)| t0 + Duration::from_micros((t * 1000.0) as u64));
        tokio::select! {
            Some(row) = pending.next(), if !pending.is_empty() => batch.push(row),
            () = tokio::time::sleep_until(due.unwrap_or(t0)), if due.is_some() => {
                let now_ms = t0.elapsed().as_secs_f64() * 1000.0;
                while let Some(&(t, c)) = arrivals.get(next).filter(|a| a.0 <= now_ms) {
                    next += 1;
                    let mut clock = BatchClock::default();
                    let asked = Instant::now();
                    let row = move |d: crate::limiter::Decided| -> Row {
                        let dd = d.decision;
                        let after = asked.duration_since(t0).as_secs_f64() * 1000.0;
                        (round(t), c, u8::from(dd.allowed), dd.remaining, dd.limit, dd.source.as_str(), dd.wait_ms, round(after))
                    };
                    match limiter.check_detached(&rule, keys[c as usize].as_bytes(), 1, &mut clock, &peer) {
                        Check::Ready(Ok(d)) => batch.push(row(d)),
                        Check::Ready(Err(e)) => {
                            let json = serde_json::json!({ "message": e.to_string() }).to_string();
                            let _ = tx.send_data(sse::event(Some("failed"), &json)).await;
                            return;
                        }
                        Check::Redis(f) => pending.push(Box::pin(async move { row(f.await) })),
                    }
                }
            }
            _ = flush.tick() => {
                if !send(&mut tx, &mut batch, &mut allowed, &mut decided).await {
                    return;
                }
            }
        }
    }
    if !send(&mut tx, &mut batch, &mut allowed, &mut decided).await {
        return;
    }
    let json = serde_json::json!({ "decided": decided, "allowed": allowed, "elapsed_ms": t0.elapsed().as_millis() as u64 }).to_string();
    let _ = tx.send_data(sse::event(Some("done"), &json)).await;
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
