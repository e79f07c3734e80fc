//! The series set where their event happens, looked up by label then (error replies,
//! Redis errors, breaker transitions, slots taken and given back), and the sizes sampled
//! every second: none is on the path of every decision.

use super::{
    CACHE_ENTRIES, CIRCUIT_OPEN, CIRCUIT_TRANSITIONS, CONNECTIONS_MAX, ERRORS, LEASES_HELD,
    LEASE_CALLS_IN_FLIGHT, LEASE_GIVE_BACKS, LEASE_GRANTED_UNITS, LEASE_GRANTS, LEASE_KEYS,
    LEASE_LAPSED_UNITS, LEASE_RETURNED_UNITS, LEASE_UNITS, LOCAL_EVICTIONS, LOCAL_KEYS,
    PRIMARY_TRANSITIONS, PRIMARY_UP, REDIS_ERRORS, REDIS_SECONDS, SLOTS_HELD, SLOT_ACQUISITIONS,
    SLOT_DENIALS, SLOT_RELEASES,
};
use crate::decision::Source;
use crate::protocol::ErrorCode;
use metrics::{counter, gauge, histogram, Counter, Histogram};
use std::time::Duration;

/// The local-eviction counters, `[fresh, used]` (no-ops when metrics are off).
pub fn local_evictions() -> [Counter; 2] {
    [
        counter!(LOCAL_EVICTIONS, "kind" => "fresh"),
        counter!(LOCAL_EVICTIONS, "kind" => "used"),
    ]
}

/// Counts one `ERR` reply.
pub fn error_reply(code: ErrorCode) {
    counter!(ERRORS, "code" => code.as_str()).increment(1);
}

/// Handles of the Redis call series, registered once.
pub struct RedisCalls {
    seconds: Histogram,
}

impl Default for RedisCalls {
    fn default() -> Self {
        RedisCalls {
            seconds: histogram!(REDIS_SECONDS),
        }
    }
}

impl RedisCalls {
    /// Records how long one Redis decision took (until its answer, error or timeout).
    pub fn took(&self, d: Duration) {
        self.seconds.record(d.as_secs_f64());
    }

    /// Counts a failed Redis decision of `kind` (e.g. `timeout`, `io`, `cluster`).
    pub fn failed(&self, kind: &'static str) {
        counter!(REDIS_ERRORS, "kind" => kind).increment(1);
    }
}

/// Counts a connection-level Redis error reported by fred (kind `connection`).
pub fn connection_error() {
    counter!(REDIS_ERRORS, "kind" => "connection").increment(1);
}

/// Records a circuit transition (`open = true`: Redis bypassed).
pub fn circuit(open: bool) {
    gauge!(CIRCUIT_OPEN).set(if open { 1.0 } else { 0.0 });
    counter!(CIRCUIT_TRANSITIONS, "to" => if open { "open" } else { "closed" }).increment(1);
}

/// Sets primary `primary`'s gauge: `up` while its keys go to it (or it owns no slot any
/// more: nothing of it is bypassed), down while bypassed.
pub fn primary_up(primary: &str, up: bool) {
    gauge!(PRIMARY_UP, "primary" => primary.to_owned()).set(if up { 1.0 } else { 0.0 });
}

/// Records a transition of primary `primary`'s breaker (`up = true`: closed again).
pub fn primary_transition(primary: &str, up: bool) {
    primary_up(primary, up);
    counter!(PRIMARY_TRANSITIONS, "primary" => primary.to_owned(), "to" => if up { "up" } else { "down" })
        .increment(1);
}

/// Sets [`CONNECTIONS_MAX`] to `max` (`server.max_connections`, which needs a restart to
/// change, so it is set once, when the listener starts).
pub fn connections_max(max: usize) {
    gauge!(CONNECTIONS_MAX).set(max as f64);
}

/// The sizes sampled every second ([`sample_sizes`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Sizes {
    /// Entries in the deny cache.
    pub cache_entries: u64,
    /// Keys with local state.
    pub local_keys: u64,
    /// The lease book's figures.
    pub leases: crate::lease::Sizes,
}

/// Sets the size gauges, and the lease counters from their totals.
pub fn sizes(s: &Sizes) {
    gauge!(CACHE_ENTRIES).set(s.cache_entries as f64);
    gauge!(LOCAL_KEYS).set(s.local_keys as f64);
    let l = &s.leases;
    gauge!(LEASE_KEYS).set(l.keys as f64);
    gauge!(LEASES_HELD).set(l.held as f64);
    gauge!(LEASE_UNITS).set(l.units as f64);
    gauge!(LEASE_CALLS_IN_FLIGHT).set(l.in_flight as f64);
    counter!(LEASE_GRANTS).absolute(l.grants);
    counter!(LEASE_GRANTED_UNITS).absolute(l.granted_units);
    counter!(LEASE_GIVE_BACKS).absolute(l.given_back);
    counter!(LEASE_RETURNED_UNITS).absolute(l.returned_units);
    counter!(LEASE_LAPSED_UNITS).absolute(l.lapsed_units);
}

/// Forever: every second, sets the size series from `read()`.
pub async fn sample_sizes(read: impl Fn() -> Sizes) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        sizes(&read());
    }
}

/// Adds `by` (±1) to the slots held under `rule`.
pub fn slots_held(rule: &str, by: f64) {
    gauge!(SLOTS_HELD, "rule" => rule.to_owned()).increment(by);
}

/// A slot of `rule` taken, decided by `source`.
pub fn slot_acquired(rule: &str, source: Source) {
    counter!(SLOT_ACQUISITIONS, "rule" => rule.to_owned(), "source" => source.as_str())
        .increment(1);
}

/// An `ACQUIRE` of `rule` denied, decided by `source`.
pub fn slot_denied(rule: &str, source: Source) {
    counter!(SLOT_DENIALS, "rule" => rule.to_owned(), "source" => source.as_str()).increment(1);
}

/// A slot of `rule` given back for `cause`.
pub fn slot_released(rule: &str, cause: &'static str) {
    counter!(SLOT_RELEASES, "rule" => rule.to_owned(), "cause" => cause).increment(1);
}
