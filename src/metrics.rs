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

use crate::decision::{Decision, Source};
use crate::protocol::ErrorCode;
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
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

/// Decisions of one rule as the dashboard reads them: `[allowed as usize][source
/// index]` ([`Source::ALL`]).
pub type Tally = [[u64; Source::ALL.len()]; 2];

/// One rule's decisions in atomics, shared by every [`DecisionCounters`] of that name
/// alive (a reload's new counters continue the old ones' figures).
#[derive(Default)]
struct RuleTally([[AtomicU64; Source::ALL.len()]; 2]);

/// The tallies by rule name; an entry dies with the last counters of its rule.
static TALLIES: Mutex<Option<HashMap<String, Weak<RuleTally>>>> = Mutex::new(None);

/// The decision counters of one rule: one handle per verdict × source.
pub struct DecisionCounters {
    /// `[allowed as usize][source index]`.
    by: [[Counter; Source::ALL.len()]; 2],
    /// The dashboard's figures (`None`: not listed, see [`DecisionCounters::unlisted`]).
    tally: Option<Arc<RuleTally>>,
    /// `[source index]` of `verdict="shadow_deny"`.
    shadow_deny: [Counter; Source::ALL.len()],
}

impl DecisionCounters {
    /// Registers the counters of rule `rule` (no-ops when metrics are off; the
    /// dashboard's [`snapshot`] counts either way).
    pub fn new(rule: &str) -> Self {
        let row = |verdict: &'static str| {
            Source::ALL.map(|s| {
                counter!(DECISIONS, "rule" => rule.to_owned(), "verdict" => verdict, "source" => s.as_str())
            })
        };
        let mut tallies = TALLIES.lock().unwrap_or_else(|e| e.into_inner());
        let tallies = tallies.get_or_insert_with(HashMap::new);
        let tally = match tallies.get(rule).and_then(Weak::upgrade) {
            Some(t) => t,
            None => {
                let t = Arc::new(RuleTally::default());
                tallies.insert(rule.to_owned(), Arc::downgrade(&t));
                t
            }
        };
        DecisionCounters {
            by: [row("deny"), row("allow")],
            tally: Some(tally),
            shadow_deny: row("shadow_deny"),
        }
    }

    /// Counters that count nowhere: the rule lab's ad-hoc rules, kept out of the
    /// metrics and the dashboard.
    pub fn unlisted() -> Self {
        let row = || Source::ALL.map(|_| Counter::noop());
        DecisionCounters {
            by: [row(), row()],
            tally: None,
            shadow_deny: row(),
        }
    }

    /// Counts one DENY a shadow rule answered as ALLOW (`verdict="shadow_deny"`, by the
    /// source that decided it).
    pub fn record_shadow_deny(&self, d: &Decision) {
        self.shadow_deny[d.source.index()].increment(1);
    }

    /// Counts one decision.
    pub fn record(&self, d: &Decision) {
        let (verdict, source) = (usize::from(d.allowed), d.source.index());
        self.by[verdict][source].increment(1);
        if let Some(t) = &self.tally {
            t.0[verdict][source].fetch_add(1, Relaxed);
        }
    }
}

/// Open client connections, for [`snapshot`].
static OPEN_CONNECTIONS: AtomicI64 = AtomicI64::new(0);
/// Reloads accepted and rejected, for [`snapshot`].
static RELOADS_DONE: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// What the dashboard reads of this process's counters, at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Decisions so far by rule name (every rule with counters alive), sorted by name.
    pub rules: Vec<(String, Tally)>,
    /// Open client connections.
    pub connections: i64,
    /// Reloads accepted.
    pub reloads_ok: u64,
    /// Reloads rejected (the old configuration stayed).
    pub reloads_rejected: u64,
}

/// The counters as they are now (a lock on the rule table, relaxed loads).
pub fn snapshot() -> Snapshot {
    let mut rules: Vec<(String, Tally)> = {
        let mut tallies = TALLIES.lock().unwrap_or_else(|e| e.into_inner());
        let tallies = tallies.get_or_insert_with(HashMap::new);
        tallies.retain(|_, t| t.strong_count() > 0);
        tallies
            .iter()
            .filter_map(|(name, t)| {
                let t = t.upgrade()?;
                Some((
                    name.clone(),
                    t.0.each_ref()
                        .map(|r| r.each_ref().map(|c| c.load(Relaxed))),
                ))
            })
            .collect()
    };
    rules.sort_by(|a, b| a.0.cmp(&b.0));
    Snapshot {
        rules,
        connections: OPEN_CONNECTIONS.load(Relaxed),
        reloads_ok: RELOADS_DONE[0].load(Relaxed),
        reloads_rejected: RELOADS_DONE[1].load(Relaxed),
    }
}

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

/// The git commit the binary was built from (`git rev-parse --short HEAD` by build.rs),
/// or `unknown` when it was built outside a git checkout.
pub fn build_commit() -> &'static str {
    option_env!("RATELIMITD_COMMIT")
        .filter(|c| !c.is_empty())
        .unwrap_or("unknown")
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

/// Counts a configuration reload.
pub fn reload(accepted: bool) {
    RELOADS_DONE[usize::from(!accepted)].fetch_add(1, Relaxed);
    counter!(RELOADS, "result" => if accepted { "ok" } else { "rejected" }).increment(1);
}

/// Sets [`CONNECTIONS_MAX`] to `max` (`server.max_connections`, which needs a restart to
/// change, so it is set once, when the listener starts).
pub fn connections_max(max: usize) {
    gauge!(CONNECTIONS_MAX).set(max as f64);
}

/// The open-connections gauge, and the figure [`snapshot`] reads.
pub fn connections() -> OpenConnections {
    OpenConnections(gauge!(CONNECTIONS))
}

/// The open-connections gauge and its atomic twin, moved by the same calls.
#[derive(Clone)]
pub struct OpenConnections(Gauge);

impl OpenConnections {
    /// `n` connections opened.
    pub fn increment(&self, n: f64) {
        self.0.increment(n);
        OPEN_CONNECTIONS.fetch_add(n as i64, Relaxed);
    }

    /// `n` connections closed.
    pub fn decrement(&self, n: f64) {
        self.0.decrement(n);
        OPEN_CONNECTIONS.fetch_sub(n as i64, Relaxed);
    }
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
