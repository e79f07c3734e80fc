//! The live dashboard's event stream (`/events`): once a second, one JSON event with the
//! daemon's own figures as they stand ([`Figures`]): decisions so far per rule by
//! verdict and source, the rules in force, open connections, reloads, per-primary
//! health, leases out, the deny cache and local keys, and each rule's hottest keys. The
//! page turns successive totals into rates itself, so an event lost or late costs
//! nothing but a point.

use super::{sse, State};
use crate::decision::Source;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;

/// How often the figures are sent.
pub const EVERY: Duration = Duration::from_secs(1);
/// Hottest keys shown per rule.
pub const HOT_KEYS: usize = 5;

/// One event of the dashboard's stream.
#[derive(Debug, Serialize)]
pub struct Figures {
    /// Milliseconds since the Unix epoch (this host's clock) when taken.
    pub at_ms: u64,
    /// Sources in the order of each rule's rows.
    pub sources: Vec<&'static str>,
    /// Each rule with counters alive (rules in force, Envoy limits), by name.
    pub rules: Vec<RuleFigures>,
    /// Open client connections on the socket.
    pub connections: i64,
    /// Reloads accepted / rejected since start.
    pub reloads_ok: u64,
    /// Reloads rejected (the old configuration stayed).
    pub reloads_rejected: u64,
    /// `redis.mode` is not `none`.
    pub redis: bool,
    /// Each primary known: `host:port` and whether its breaker is open.
    pub primaries: Vec<Primary>,
    /// Leases held, and units unspent on them.
    pub leases_held: u64,
    /// Units unspent on the leases held.
    pub lease_units: u64,
    /// Entries in the deny cache.
    pub cache_entries: u64,
    /// Keys with local state.
    pub local_keys: u64,
}

/// One rule's figures.
#[derive(Debug, Serialize)]
pub struct RuleFigures {
    /// The rule's name.
    pub name: String,
    /// A rule in force (`false`: an Envoy limit, decided outside the table of rules).
    pub configured: bool,
    /// Decisions allowed so far, per source ([`Figures::sources`] order).
    pub allow: Vec<u64>,
    /// Decisions denied so far, per source.
    pub deny: Vec<u64>,
    /// Its hottest keys over the last minute, most decided first (this daemon's
    /// heavy-hitter summary, as `TOP` reports it; none for an Envoy limit).
    pub top: Vec<HotKey>,
}

/// One hot key of a rule (`hot_keys::HotKey` as the page reads it).
#[derive(Debug, Clone, Serialize)]
pub struct HotKey {
    /// The key as the client sent it.
    pub key: String,
    /// Decisions over the last minute (an upper bound, at most `max_error` above).
    pub decisions: u64,
    /// Of which denied (a lower bound).
    pub denies: u64,
    /// How far `decisions` may be from the truth.
    pub max_error: u64,
}

/// Primary health.
#[derive(Debug, Serialize)]
pub struct Primary {
    /// `host:port`.
    pub name: String,
    /// Its breaker is open: its keys are decided without Redis.
    pub open: bool,
}

/// The figures as they stand now.
pub fn figures(state: &State) -> Figures {
    let snap = crate::metrics::snapshot();
    let sizes = state.limiter.sizes();
    let in_force = state.limiter.rule_names();
    let mut rules: BTreeMap<String, RuleFigures> = in_force
        .iter()
        .map(|name| {
            (
                name.clone(),
                rule_figures(name, true, [[0; Source::ALL.len()]; 2]),
            )
        })
        .collect();
    for (name, tally) in snap.rules {
        let configured = rules.contains_key(&name);
        rules.insert(name.clone(), rule_figures(&name, configured, tally));
    }
    for figures in rules.values_mut() {
        figures.top = state
            .limiter
            .top_keys(&figures.name, HOT_KEYS)
            .unwrap_or_default()
            .into_iter()
            .map(|k| HotKey {
                key: k.key,
                decisions: k.decisions,
                denies: k.denies,
                max_error: k.max_error,
            })
            .collect();
    }
    let primaries = state.redis.as_ref().map_or_else(Vec::new, |r| {
        r.primaries()
            .into_iter()
            .map(|(name, open)| Primary { name, open })
            .collect()
    });
    Figures {
        at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        sources: Source::ALL.iter().map(|s| s.as_str()).collect(),
        rules: rules.into_values().collect(),
        connections: snap.connections,
        reloads_ok: snap.reloads_ok,
        reloads_rejected: snap.reloads_rejected,
        redis: state.redis.is_some(),
        primaries,
        leases_held: sizes.leases.held,
        lease_units: sizes.leases.units,
        cache_entries: sizes.cache_entries,
        local_keys: sizes.local_keys,
    }
}

fn rule_figures(name: &str, configured: bool, tally: crate::metrics::Tally) -> RuleFigures {
    RuleFigures {
        name: name.to_owned(),
        configured,
        allow: tally[1].to_vec(),
        deny: tally[0].to_vec(),
        top: Vec::new(),
    }
}

/// `/events`: the figures every [`EVERY`] until the client leaves; `permit` is the
/// stream's slot, held as long as its task runs.
pub fn stream(
    state: &std::sync::Arc<State>,
    permit: OwnedSemaphorePermit,
) -> hyper::Response<super::Body> {
    let (response, mut tx) = sse::response();
    let state = std::sync::Arc::clone(state);
    tokio::spawn(async move {
        let _permit = permit;
        if tx.send_data(sse::retry(1000)).await.is_err() {
            return;
        }
        let mut tick = tokio::time::interval(EVERY);
        let end = tokio::time::Instant::now() + super::STREAM_MAX;
        while tokio::time::Instant::now() < end {
            tick.tick().await;
            let json = serde_json::to_string(&figures(&state)).unwrap_or_default();
            if tx.send_data(sse::event(None, &json)).await.is_err() {
                return;
            }
        }
    });
    response
}
