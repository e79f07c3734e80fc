//! Prometheus metrics, served on an opt-in HTTP listener (`[http] listen`, see
//! `crate::http`), through the `metrics` facade and `metrics-exporter-prometheus`.
//!
//! Without `[metrics]` no recorder is installed and every handle is a no-op. With it,
//! the per-decision series are registered once (per rule at load and reload) and updated
//! through their handles: an atomic add per decision, no label building or registry
//! lookup. Rarer events (error replies, Redis errors, transitions) look their series up
//! by label when they happen. `docs/METRICS.md` documents each series.
//!
//! The live dashboard reads a few of the same figures from this process without parsing
//! the Prometheus text: [`snapshot`] (decisions per rule × verdict × source, open
//! connections, reloads), kept in plain atomics beside the handles (one relaxed add
//! more per decision).
//!
//! Here: the series' names and descriptions, and the recorder's installation. The
//! per-decision counters and the dashboard's figures are [`counters`]; the other series,
//! set where their event happens, are [`events`].

mod counters;
mod events;

pub use counters::{
    connections, reload, snapshot, DecisionCounters, OpenConnections, Snapshot, Tally,
};
pub use events::{
    circuit, connection_error, connections_max, error_reply, local_evictions, primary_transition,
    primary_up, sample_sizes, sizes, slot_acquired, slot_denied, slot_released, slots_held,
    RedisCalls, Sizes,
};

use metrics::gauge;
use metrics_exporter_prometheus::PrometheusBuilder;
use std::time::Duration;

/// Decisions, by rule × verdict × source.
pub const DECISIONS: &str = "ratelimitd_decisions_total";
/// Error replies (`ERR <CODE>`), by code.
pub const ERRORS: &str = "ratelimitd_errors_total";
/// Duration of Redis decisions (one EVALSHA, NOSCRIPT reload included), seconds.
pub const REDIS_SECONDS: &str = "ratelimitd_redis_call_seconds";
/// Redis decisions that failed, by kind.
pub const REDIS_ERRORS: &str = "ratelimitd_redis_errors_total";
/// 1 while the circuit is open (deciding without Redis), else 0.
pub const CIRCUIT_OPEN: &str = "ratelimitd_circuit_open";
/// Circuit transitions, by `to` (`open`, `closed`).
pub const CIRCUIT_TRANSITIONS: &str = "ratelimitd_circuit_transitions_total";
/// Gauge per primary (`primary="host:port"`): 1 while its slots' keys go to it, 0 while
/// it is bypassed (its breaker open).
pub const PRIMARY_UP: &str = "ratelimitd_primary_up";
/// Counter per primary and new state (`to="up"|"down"`): its breaker's transitions.
pub const PRIMARY_TRANSITIONS: &str = "ratelimitd_primary_transitions_total";
/// Gauge, always 1, labelled with the version and the git commit the binary was built
/// from.
pub const BUILD_INFO: &str = "ratelimitd_build_info";
/// Entries in the deny cache.
pub const CACHE_ENTRIES: &str = "ratelimitd_cache_entries";
/// Keys with local state (local buckets).
pub const LOCAL_KEYS: &str = "ratelimitd_local_keys";
/// Evictions from the local buckets, by `kind`: `fresh` (a state equal to a new key's,
/// dropped without a trace) or `used` (a state that still mattered, recorded so that
/// its key comes back no fuller).
pub const LOCAL_EVICTIONS: &str = "ratelimitd_local_evictions_total";
/// Open client connections.
pub const CONNECTIONS: &str = "ratelimitd_connections";
/// `server.max_connections`: the open connections past which a new one gets `ERR BUSY`.
pub const CONNECTIONS_MAX: &str = "ratelimitd_connections_max";
/// Configuration reloads, by `result` (`ok`, `rejected`).
pub const RELOADS: &str = "ratelimitd_reloads_total";
/// Keys in the lease book (bounded by `fallback.max_keys`).
pub const LEASE_KEYS: &str = "ratelimitd_lease_keys";
/// Leases this daemon holds (grants read whose end Redis has not acknowledged).
pub const LEASES_HELD: &str = "ratelimitd_lease_held";
/// Units unspent on those leases.
pub const LEASE_UNITS: &str = "ratelimitd_lease_units_out";
/// Lease calls in flight.
pub const LEASE_CALLS_IN_FLIGHT: &str = "ratelimitd_lease_calls_in_flight";
/// Grants read.
pub const LEASE_GRANTS: &str = "ratelimitd_lease_grants_total";
/// Units in them.
pub const LEASE_GRANTED_UNITS: &str = "ratelimitd_lease_granted_units_total";
/// Grants whose end Redis acknowledged.
pub const LEASE_GIVE_BACKS: &str = "ratelimitd_lease_give_backs_total";
/// Unspent units given back to the keys' budgets.
pub const LEASE_RETURNED_UNITS: &str = "ratelimitd_lease_returned_units_total";
/// Unspent units that lapsed.
pub const LEASE_LAPSED_UNITS: &str = "ratelimitd_lease_lapsed_units_total";

/// Concurrency slots held by this daemon's clients, by rule.
pub const SLOTS_HELD: &str = "ratelimitd_slots_held";
/// Slots taken (`ACQUIRE` allowed), by rule × source.
pub const SLOT_ACQUISITIONS: &str = "ratelimitd_slot_acquisitions_total";
/// `ACQUIRE`s denied, by rule × source.
pub const SLOT_DENIALS: &str = "ratelimitd_slot_denials_total";
/// Slots given back, by rule × cause (`release`, `connection_closed`, `max_hold`,
/// `holder_lost`).
pub const SLOT_RELEASES: &str = "ratelimitd_slot_releases_total";

/// Bucket bounds of [`REDIS_SECONDS`], seconds: 50 µs to 1 s (a decision waits at most
/// `redis.timeout_ms`).
const REDIS_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Why the metrics endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InstallError(String);

impl InstallError {
    /// An error saying `what`.
    pub fn new(what: String) -> Self {
        InstallError(what)
    }
}

pub use metrics_exporter_prometheus::PrometheusHandle;

/// How often histograms are compacted (the exporter's upkeep).
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder and starts its upkeep; the HTTP endpoint
/// (`crate::http`) serves what the returned handle renders. Must run inside the tokio
/// runtime, before rules are registered ([`DecisionCounters::new`]).
///
/// # Errors
/// A recorder is already installed, or the histogram buckets are refused.
pub fn install() -> Result<PrometheusHandle, InstallError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(REDIS_SECONDS.into()),
            &REDIS_BUCKETS,
        )
        .map_err(|e| InstallError(e.to_string()))?
        .install_recorder()
        .map_err(|e| InstallError(format!("metrics recorder: {e}")))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    describe();
    gauge!(CIRCUIT_OPEN).set(0.0);
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "commit" => build_commit()).set(1.0);
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(DECISIONS, "CHECK decisions by rule, verdict and source");
    describe_counter!(ERRORS, "ERR replies by code");
    describe_histogram!(REDIS_SECONDS, Unit::Seconds, "Duration of Redis decisions");
    describe_counter!(REDIS_ERRORS, "Redis decisions that failed, by kind");
    describe_gauge!(CIRCUIT_OPEN, "1 while Redis is bypassed (circuit open)");
    describe_counter!(CIRCUIT_TRANSITIONS, "Circuit transitions, by new state");
    describe_gauge!(
        PRIMARY_UP,
        "Per Redis primary: 1 while its keys go to it, 0 while it is bypassed (breaker open)"
    );
    describe_counter!(
        PRIMARY_TRANSITIONS,
        "Per Redis primary: breaker transitions, by new state (up, down)"
    );
    describe_gauge!(
        BUILD_INFO,
        "1, labelled with the version and git commit of the binary"
    );
    describe_gauge!(CACHE_ENTRIES, "Entries in the deny cache");
    describe_gauge!(LOCAL_KEYS, "Keys with local state (local buckets)");
    describe_counter!(
        LOCAL_EVICTIONS,
        "Evictions from the local buckets, by kind (fresh: worth nothing; used: recorded)"
    );
    describe_gauge!(CONNECTIONS, "Open client connections");
    describe_gauge!(
        CONNECTIONS_MAX,
        "server.max_connections: open connections past which a new one is refused"
    );
    describe_counter!(RELOADS, "Configuration reloads by result");
    describe_gauge!(LEASE_KEYS, "Keys in the lease book");
    describe_gauge!(LEASES_HELD, "Leases held (grants not yet ended in Redis)");
    describe_gauge!(LEASE_UNITS, "Units unspent on the leases held");
    describe_gauge!(LEASE_CALLS_IN_FLIGHT, "Lease calls in flight");
    describe_counter!(LEASE_GRANTS, "Lease grants received");
    describe_counter!(LEASE_GRANTED_UNITS, "Units granted on lease");
    describe_counter!(LEASE_GIVE_BACKS, "Leases whose end Redis acknowledged");
    describe_counter!(LEASE_RETURNED_UNITS, "Unspent lease units given back");
    describe_counter!(LEASE_LAPSED_UNITS, "Unspent lease units that lapsed");
    describe_gauge!(
        SLOTS_HELD,
        "Concurrency slots held by this daemon's clients"
    );
    describe_counter!(
        SLOT_ACQUISITIONS,
        "Concurrency slots taken, by rule and source"
    );
    describe_counter!(SLOT_DENIALS, "ACQUIREs denied, by rule and source");
    describe_counter!(
        SLOT_RELEASES,
        "Concurrency slots given back, by rule and cause"
    );
}

/// The git commit the binary was built from (`git rev-parse --short HEAD` by build.rs),
/// or `unknown` when it was built outside a git checkout.
pub fn build_commit() -> &'static str {
    option_env!("RATELIMITD_COMMIT")
        .filter(|c| !c.is_empty())
        .unwrap_or("unknown")
}
