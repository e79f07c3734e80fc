//! The series the live dashboard also reads: each rule's decision counters (one handle
//! per verdict × source, registered once per rule), the open connections and the
//! reloads, each moved together with a plain atomic twin that [`snapshot`] reads without
//! parsing the Prometheus text.

use super::{CONNECTIONS, DECISIONS, RELOADS};
use crate::decision::{Decision, Source};
use metrics::{counter, gauge, Counter, Gauge};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

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

/// Counts a configuration reload.
pub fn reload(accepted: bool) {
    RELOADS_DONE[usize::from(!accepted)].fetch_add(1, Relaxed);
    counter!(RELOADS, "result" => if accepted { "ok" } else { "rejected" }).increment(1);
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
