//! Whether Redis may be asked: the circuit breaker and the prober that closes it.
//!
//! Closed: decisions go to Redis. The first failed or timed-out Redis call opens it;
//! from then on decisions are made locally at once (nobody waits on a dead Redis) while
//! a background prober ([`run_prober`]) tries Redis every [`PROBE_INTERVAL`] and closes
//! the circuit as soon as Redis answers. Each transition is logged once, not per
//! request.

use super::redis::RedisStore;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How often an open circuit probes Redis. With probes bounded by the Redis timeout,
/// decisions return to Redis well within 1 s of Redis answering (docs/PROTOCOL.md, "Failure behaviour").
pub const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// Open/closed state shared by every connection.
#[derive(Debug)]
pub struct Circuit {
    open: AtomicBool,
    tripped: Notify,
}

impl Circuit {
    /// A circuit in the given state (`open = true` until Redis has been seen working).
    pub fn new(open: bool) -> Self {
        Circuit {
            open: AtomicBool::new(open),
            tripped: Notify::new(),
        }
    }

    /// True while decisions must not wait on Redis.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Opens the circuit because of `why`; logs and wakes the prober only on the
    /// closed → open transition.
    pub fn trip(&self, why: &dyn std::fmt::Display) {
        if !self.open.swap(true, Ordering::AcqRel) {
            tracing::warn!(reason = %why, "Redis failed; circuit open: deciding locally per on_redis_failure until Redis answers again");
            crate::metrics::circuit(true);
            self.tripped.notify_one();
        }
    }

    /// Closes the circuit (Redis answered a probe); logs only on open → closed.
    pub fn close(&self) {
        if self.open.swap(false, Ordering::AcqRel) {
            tracing::info!("Redis answers again; circuit closed: decisions go to Redis");
            crate::metrics::circuit(false);
        }
    }

    /// Resolves when the circuit is open (at once if it already is).
    pub async fn wait_open(&self) {
        loop {
            let notified = self.tripped.notified();
            if self.is_open() {
                return;
            }
            notified.await;
        }
    }
}

/// Forever: whenever `circuit` is open, probe `store` every [`PROBE_INTERVAL`] and close
/// the circuit when a probe succeeds. A failure is logged (at debug level) when it
/// differs from the previous one.
pub async fn run_prober(store: Arc<RedisStore>, circuit: Arc<Circuit>) {
    loop {
        circuit.wait_open().await;
        let mut last_error = String::new();
        while circuit.is_open() {
            tokio::time::sleep(PROBE_INTERVAL).await;
            match store.probe_bounded().await {
                Ok(()) => circuit.close(),
                Err(e) => {
                    let e = e.to_string();
                    if e != last_error {
                        tracing::debug!(error = %e, "Redis probe failed");
                        last_error = e;
                    }
                }
            }
        }
    }
}
