//! One lab run of a `concurrency` rule: each arrival of the plan takes a slot
//! (`ACQUIRE` through the limiter's own path: the concurrency script in Redis under the
//! lab prefix), holds it for the plan's `hold_ms` and gives it back (`RELEASE`). The
//! decisions stream as a rate run's do, `remaining` being the slots free after it.
//!
//! Every slot the run takes is given back by its end: each by its `RELEASE`, and those
//! still held when the run stops early (the page left) by the run's
//! [`Holder`](crate::limiter::slots::Holder), which gives back all of its slots when
//! dropped, as a closed connection does.

use super::plan::Plan;
use super::run::{round, send, Row};
use super::sse;
use crate::admission::Peer;
use crate::limiter::slots::{SlotAnswer, Slots};
use crate::limiter::{Detached, Limiter};
use futures::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// What a call in flight came to.
enum Done {
    /// An `ACQUIRE` decided: its row, and on ALLOW the client and token to give back.
    Decided(Row, Option<(u32, String)>),
    /// A `RELEASE` answered: whether the slot was still held (else it lapsed at its
    /// `max_hold`).
    Released(bool),
}

type Pending = FuturesUnordered<Pin<Box<dyn Future<Output = Done> + Send>>>;

/// How a concurrency run ended: `(decided, allowed, released, lapsed)`, or `None` when
/// the page left or a request was refused (told to the page).
pub(super) async fn drive(
    limiter: &Arc<Limiter>,
    plan: &Plan,
    arrivals: &[(f64, u32)],
    tx: &mut sse::Sender,
) -> Option<(u64, u64, u64, u64)> {
    // Dropped on every return: the slots still held go back.
    let holder = limiter.holder();
    let conn = holder.conn();
    let rule = Arc::new(Detached::unlisted(Arc::clone(&plan.rule)));
    let peer = Peer::unbounded(0, 0);
    let keys: Arc<Vec<String>> = Arc::new((0..plan.clients).map(|c| format!("c{c}")).collect());
    let hold = Duration::from_millis(plan.hold_ms);
    let t0 = Instant::now();
    let mut pending = Pending::new();
    let mut batch: Vec<Row> = Vec::new();
    let mut flush = tokio::time::interval(super::run::FLUSH);
    let (mut allowed, mut decided, mut released, mut lapsed) = (0u64, 0u64, 0u64, 0u64);
    let mut next = 0;
    while next < arrivals.len() || !pending.is_empty() {
        let due = arrivals
            .get(next)
            .map(|&(t, _)| t0 + Duration::from_micros((t * 1000.0) as u64));
        tokio::select! {
            Some(done) = pending.next(), if !pending.is_empty() => match done {
                Done::Decided(row, held) => {
                    batch.push(row);
                    if let Some((c, token)) = held {
                        pending.push(release_after(limiter, &rule, &keys, c, token, hold));
                    }
                }
                Done::Released(true) => released += 1,
                Done::Released(false) => lapsed += 1,
            },
            () = tokio::time::sleep_until(due.unwrap_or(t0)), if due.is_some() => {
                let now_ms = t0.elapsed().as_secs_f64() * 1000.0;
                while let Some(&(t, c)) = arrivals.get(next).filter(|a| a.0 <= now_ms) {
                    next += 1;
                    let after = round(t0.elapsed().as_secs_f64() * 1000.0);
                    let decide = move |a: SlotAnswer| decided_row(a, round(t), c, after);
                    match limiter.acquire_detached(&rule, keys[c as usize].as_bytes(), &peer, conn) {
                        Slots::Ready(a) => match decide(a) {
                            Ok(done) => pending.push(Box::pin(async move { done })),
                            Err(e) => return refused(tx, e).await,
                        },
                        Slots::Pending(f) => pending.push(Box::pin(async move {
                            decide(f.await).unwrap_or_else(|e| {
                                // A refusal after the call (Redis busy): a DENY row the
                                // page can see, with no slot to give back.
                                tracing::debug!("lab acquire refused: {e}");
                                Done::Decided((round(t), c, 0, 0, 0, "error", 0, after), None)
                            })
                        })),
                    }
                }
            }
            _ = flush.tick() => {
                if !send(tx, &mut batch, &mut allowed, &mut decided).await {
                    return None;
                }
            }
        }
    }
    if !send(tx, &mut batch, &mut allowed, &mut decided).await {
        return None;
    }
    drop(holder);
    Some((decided, allowed, released, lapsed))
}

/// The row of an `ACQUIRE` answer, or the refusal's text.
fn decided_row(a: SlotAnswer, t: f64, c: u32, after: f64) -> Result<Done, String> {
    let row = |d: &crate::decision::Decision| -> Row {
        let allowed = u8::from(d.allowed);
        (
            t,
            c,
            allowed,
            d.remaining,
            d.limit,
            d.source.as_str(),
            d.wait_ms,
            after,
        )
    };
    match a {
        SlotAnswer::Acquired(d, token) => Ok(Done::Decided(row(&d), Some((c, token)))),
        SlotAnswer::Denied(d) => Ok(Done::Decided(row(&d), None)),
        SlotAnswer::Refused(e) => Err(e.to_string()),
        SlotAnswer::Released => Err("ACQUIRE answered as a RELEASE".into()),
    }
}

/// Gives back client `c`'s slot `token` after `hold`.
fn release_after(
    limiter: &Arc<Limiter>,
    rule: &Arc<Detached>,
    keys: &Arc<Vec<String>>,
    c: u32,
    token: String,
    hold: Duration,
) -> Pin<Box<dyn Future<Output = Done> + Send>> {
    let (limiter, rule, keys) = (Arc::clone(limiter), Arc::clone(rule), Arc::clone(keys));
    Box::pin(async move {
        tokio::time::sleep(hold).await;
        let key = keys[c as usize].as_bytes();
        let answer = match limiter.release_detached(&rule, key, token.as_bytes()) {
            Slots::Ready(a) => a,
            Slots::Pending(f) => f.await,
        };
        Done::Released(matches!(answer, SlotAnswer::Released))
    })
}

/// Tells the page why the run stopped.
async fn refused(tx: &mut sse::Sender, message: String) -> Option<(u64, u64, u64, u64)> {
    let json = serde_json::json!({ "message": message }).to_string();
    let _ = tx.send_data(sse::event(Some("failed"), &json)).await;
    None
}
