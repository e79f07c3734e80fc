//! Whether a primary may be asked: one breaker per primary (per slot owner), the
//! daemon-wide view of them, and the prober that closes a breaker.
//!
//! Closed: decisions for keys in that primary's slots go to Redis. *Sustained* failure
//! opens it ([`FAILURES_TO_OPEN`] failed calls in a row, with no success in between,
//! spanning at least `redis.timeout_ms`; or a connection error the client reports, which
//! is unambiguous). A call is what went to Redis: the decisions of one batch
//! ([`super::batch`]) failed together, as one call, however many there were
//! ([`CallSent`]). One late reply, or a burst of late replies behind one slow command,
//! is not an outage; a timeout that this process caused by being late is not counted
//! at all ([`super::lateness`]). While open, that primary's keys are decided locally at
//! once, per `on_redis_failure`; keys of the other primaries keep going to Redis. Its
//! prober tries that primary every [`PROBE_INTERVAL`] (one probe at a time, never while
//! its connection is down, so nothing piles up in the client) and closes the breaker
//! as soon as it answers. Each transition is logged once.
//!
//! [`Circuit`] is the daemon-wide view: "open" while any primary is open. Its own
//! transitions (first primary opens, last one closes) are logged as `circuit open` /
//! `circuit closed` and drive the metrics gauge and the systemd status.

use crate::clock::mono_us;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How often an open primary is probed. With probes bounded by the probe timeout,
/// its keys return to Redis well within 1 s of it answering.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// Failed calls in a row (no success between them) that open a primary's breaker,
/// provided they also span at least `redis.timeout_ms`.
pub const FAILURES_TO_OPEN: u32 = 3;

/// The daemon-wide view: how many primaries are open.
#[derive(Debug)]
pub struct Circuit {
    open_primaries: AtomicUsize,
    /// Open until every primary has answered once (no primary known yet).
    unknown: AtomicBool,
    /// The start-up said Redis was unreachable: say when it answers.
    warned: AtomicBool,
}

impl Circuit {
    /// A daemon-wide circuit; `open = true` until Redis has been seen working.
    pub fn new(open: bool) -> Self {
        Circuit {
            open_primaries: AtomicUsize::new(0),
            unknown: AtomicBool::new(open),
            warned: AtomicBool::new(false),
        }
    }

    /// True while at least one primary (or Redis as a whole) is bypassed.
    pub fn is_open(&self) -> bool {
        self.unknown.load(Ordering::Relaxed) || self.open_primaries.load(Ordering::Relaxed) > 0
    }

    /// Primaries open now.
    pub fn open_primaries(&self) -> usize {
        self.open_primaries.load(Ordering::Relaxed)
    }

    /// The start-up logged that Redis was unreachable.
    pub fn warned_at_start(&self) {
        self.warned.store(true, Ordering::Relaxed);
    }

    /// Every primary known has answered once: from now on their breakers say what is
    /// open.
    pub fn known(&self) {
        if self.unknown.swap(false, Ordering::AcqRel) && self.warned.load(Ordering::Relaxed) {
            tracing::info!("Redis answers; circuit closed: decisions go to Redis");
            crate::metrics::circuit(false);
        }
    }

    fn primary_opened(&self, why: &dyn std::fmt::Display) {
        if self.open_primaries.fetch_add(1, Ordering::AcqRel) == 0
            && !self.unknown.load(Ordering::Relaxed)
        {
            tracing::warn!(reason = %why, "Redis failed; circuit open: the failed primary's keys decided locally per on_redis_failure until it answers again");
            crate::metrics::circuit(true);
        }
    }

    fn primary_closed(&self) {
        if self.open_primaries.fetch_sub(1, Ordering::AcqRel) == 1 {
            if self.unknown.load(Ordering::Relaxed) {
                self.known();
            } else {
                tracing::info!("Redis answers again; circuit closed: decisions go to Redis");
                crate::metrics::circuit(false);
            }
        }
    }
}

/// The breaker of one primary.
#[derive(Debug)]
pub struct PrimaryHealth {
    /// `host:port`, for logs.
    name: String,
    open: AtomicBool,
    /// Failed calls in a row, and when the first of them failed ([`mono_us`]).
    failures: AtomicU32,
    first_failure_us: AtomicU64,
    /// When the latest call counted as failed was sent ([`mono_us`]): the other
    /// decisions of that call, and of calls sent before it, are not counted again.
    last_failed_sent_us: AtomicU64,
    /// A failure streak must span this long to open the breaker (`redis.timeout_ms`).
    window_us: u64,
    tripped: Notify,
    circuit: Arc<Circuit>,
}

impl PrimaryHealth {
    /// The breaker of primary `name`, starting open (probed before use) or closed.
    pub fn new(name: String, open: bool, window: Duration, circuit: Arc<Circuit>) -> Self {
        if open {
            circuit.open_primaries.fetch_add(1, Ordering::AcqRel);
        }
        crate::metrics::primary_up(&name, !open);
        PrimaryHealth {
            name,
            open: AtomicBool::new(open),
            failures: AtomicU32::new(0),
            first_failure_us: AtomicU64::new(0),
            last_failed_sent_us: AtomicU64::new(0),
            window_us: u64::try_from(window.as_micros()).unwrap_or(u64::MAX),
            tripped: Notify::new(),
            circuit,
        }
    }

    /// `host:port` of the primary.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True while this primary's keys must not wait on it.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// A call answered: the failure streak ends.
    pub fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// A call sent at `sent_us` ([`mono_us`]) failed (not this process's lateness):
    /// opens the breaker once the streak is sustained ([`FAILURES_TO_OPEN`] in a row
    /// spanning `redis.timeout_ms`). A decision of a call already counted (the same
    /// batch: the same `sent_us`) or of one sent before it adds nothing: a slow batch
    /// is one late call, not one per decision it carried.
    pub fn failed(&self, sent_us: u64, why: &dyn std::fmt::Display) {
        if self
            .last_failed_sent_us
            .fetch_max(sent_us, Ordering::AcqRel)
            >= sent_us
        {
            return;
        }
        let now = mono_us();
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n == 1 {
            self.first_failure_us.store(now, Ordering::Relaxed);
            return;
        }
        let first = self.first_failure_us.load(Ordering::Relaxed);
        if n >= FAILURES_TO_OPEN && now.saturating_sub(first) >= self.window_us {
            self.open(why);
        }
    }

    /// Opens the breaker at once (a connection error: the primary is unreachable);
    /// logs and wakes the prober only on the closed → open transition.
    pub fn open(&self, why: &dyn std::fmt::Display) {
        if !self.open.swap(true, Ordering::AcqRel) {
            tracing::warn!(primary = %self.name, reason = %why, "Redis primary down: its slots decided locally per on_redis_failure");
            crate::metrics::primary_transition(&self.name, false);
            self.circuit.primary_opened(why);
            self.tripped.notify_one();
        }
    }

    /// Closes the breaker (a probe answered); logs only on open → closed.
    pub fn close(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if self.open.swap(false, Ordering::AcqRel) {
            // At start-up every primary is probed before use: not a transition.
            if !self.circuit.unknown.load(Ordering::Relaxed) {
                tracing::info!(primary = %self.name, "Redis primary up: its slots go to Redis");
                crate::metrics::primary_transition(&self.name, true);
            } else {
                crate::metrics::primary_up(&self.name, true);
            }
            self.circuit.primary_closed();
        }
    }

    /// Forgets this primary (it owns no slot any more): no longer counted as open.
    pub fn retire(&self) {
        if self.open.swap(false, Ordering::AcqRel) {
            self.circuit.primary_closed();
        }
        // Nothing of it is bypassed any more (a series cannot be removed).
        crate::metrics::primary_up(&self.name, true);
        self.tripped.notify_one();
    }

    /// Resolves when the breaker is open (at once if it already is).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn primary(circuit: &Arc<Circuit>) -> PrimaryHealth {
        PrimaryHealth::new(
            "p:1".into(),
            false,
            Duration::from_millis(20),
            Arc::clone(circuit),
        )
    }

    #[test]
    fn a_burst_of_failures_shorter_than_the_window_does_not_open() {
        let c = Arc::new(Circuit::new(false));
        let p = primary(&c);
        for _ in 0..10 {
            p.failed(mono_us(), &"late");
            std::thread::sleep(Duration::from_micros(2));
        }
        assert!(!p.is_open());
        p.succeeded();
        std::thread::sleep(Duration::from_millis(25));
        p.failed(mono_us(), &"late");
        assert!(!p.is_open(), "a success ended the streak");
    }

    #[test]
    fn sustained_failure_opens_that_primary_only_and_a_probe_closes_it() {
        let c = Arc::new(Circuit::new(false));
        let (a, b) = (primary(&c), primary(&c));
        a.failed(mono_us(), &"x");
        std::thread::sleep(Duration::from_micros(2));
        a.failed(mono_us(), &"x");
        std::thread::sleep(Duration::from_millis(25));
        a.failed(mono_us(), &"x");
        assert!(a.is_open() && !b.is_open() && c.is_open());
        assert_eq!(c.open_primaries(), 1);
        a.close();
        assert!(!a.is_open() && !c.is_open());
    }

    /// A batch's decisions time out one after another over as long as they queued:
    /// one call sent once, however long its failures span.
    #[test]
    fn the_decisions_of_one_late_call_are_one_failure() {
        let c = Arc::new(Circuit::new(false));
        let p = primary(&c);
        let sent = mono_us();
        for _ in 0..64 {
            p.failed(sent, &"late batch");
        }
        std::thread::sleep(Duration::from_millis(25));
        p.failed(sent, &"late batch");
        p.failed(sent.saturating_sub(1), &"a call sent before it");
        assert!(!p.is_open(), "one call, however many decisions");
        let (second, third) = (mono_us(), mono_us() + 1);
        p.failed(second, &"late");
        std::thread::sleep(Duration::from_millis(25));
        p.failed(third, &"late");
        assert!(p.is_open(), "three calls in a row spanning the window");
    }
}

/// When the Redis call carrying a decision went out ([`mono_us`]; 0 while it waits in
/// this process's batch queue): shared by the decision's caller, which reports a
/// timeout to the breaker ([`PrimaryHealth::failed`]), and whoever sends it (the batch
/// sender stamps every decision of a batch with the batch's time).
#[derive(Debug, Default)]
pub struct CallSent(AtomicU64);

impl CallSent {
    /// A call sent now.
    pub fn now() -> Self {
        CallSent(AtomicU64::new(mono_us().max(1)))
    }

    /// The call goes out now (again, when a decision a batch refused goes alone).
    pub fn mark(&self) {
        self.0.store(mono_us().max(1), Ordering::Relaxed);
    }

    /// When it went out; `None` while it has not.
    pub fn at(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|&t| t != 0)
    }
}
