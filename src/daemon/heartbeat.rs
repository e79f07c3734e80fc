//! The fleet heartbeat at start-up: with `fallback.hosts = "auto"`, the count of daemons
//! alive (heard in Redis, else the one saved by the last run) is put in force before
//! serving, and kept fresh while the daemon runs, so each daemon's local share of a limit
//! follows the fleet.

use crate::config::Config;
use crate::limiter::Limiter;
use crate::saved_hosts::SavedHosts;
use crate::store::health::Circuit;
use crate::store::hosts::{Heartbeat, HEARTBEAT_EVERY};
use crate::store::RedisStore;
use std::sync::Arc;
use std::time::Duration;

/// With `fallback.hosts = "auto"` on some rule: puts the count saved by the last run in
/// force ([`SavedHosts`]; else `fallback.min_hosts`), beats once (bounded) so the share
/// is known before serving, says at start-up which share is in force, and keeps beating
/// every [`HEARTBEAT_EVERY`] while the circuit is closed (the count last seen stays in
/// force through an outage, and is saved for the next start). With a fixed number only,
/// says which.
pub(super) async fn start_heartbeat(
    config: &Config,
    envoy_auto: bool,
    redis: Option<&Arc<RedisStore>>,
    circuit: &Arc<Circuit>,
    limiter: &Arc<Limiter>,
) -> Option<tokio::task::JoinHandle<()>> {
    let redis = redis?;
    let auto = envoy_auto || config.rules.values().any(|r| r.fallback_auto);
    if !auto {
        tracing::info!(
            hosts = %config.fallback.hosts,
            "fallback.hosts is a fixed number: with Redis unreachable each daemon enforces limit ÷ hosts (rules' own fallback_hosts apply to them)"
        );
        return None;
    }
    let beat = Heartbeat::new(&config.redis.prefix);
    let mut saved = SavedHosts::open(&config.fallback);
    limiter.set_live_hosts(saved.at_start());
    let first = if circuit.is_open() {
        None
    } else {
        tokio::time::timeout(HEARTBEAT_TIMEOUT, redis.heartbeat(&beat))
            .await
            .ok()
            .and_then(Result::ok)
    };
    match first {
        Some(alive) => {
            let n = saved.heard(alive);
            limiter.set_live_hosts(n);
            tracing::info!(
                hosts = n, alive, id = beat.id(),
                "fallback.hosts = \"auto\": {alive} daemon(s) alive in Redis; with Redis unreachable each enforces limit ÷ {n} (the count last seen stays in force through an outage; never below fallback.min_hosts = {})",
                config.fallback.min_hosts
            );
        }
        None => {
            let n = saved.at_start();
            let from = match (saved.saved(), saved.path()) {
                (Some(s), Some(path)) => {
                    format!(
                        "{s} daemon(s) alive when last heard, saved in {}",
                        path.display()
                    )
                }
                _ => "no count saved".to_owned(),
            };
            tracing::warn!(
                hosts = n, id = beat.id(),
                "fallback.hosts = \"auto\": no heartbeat answered yet, so with Redis unreachable this daemon enforces limit ÷ {n} ({from}; fallback.min_hosts = {}) until one does",
                config.fallback.min_hosts
            );
        }
    }
    Some(keep_beating(beat, saved, redis, circuit, limiter))
}

/// Beats every [`HEARTBEAT_EVERY`] while the circuit is closed, puts each count heard in
/// force (saved for the next start) and logs each change.
fn keep_beating(
    beat: Heartbeat,
    mut saved: SavedHosts,
    redis: &Arc<RedisStore>,
    circuit: &Arc<Circuit>,
    limiter: &Arc<Limiter>,
) -> tokio::task::JoinHandle<()> {
    let (redis, circuit, limiter) = (Arc::clone(redis), Arc::clone(circuit), Arc::clone(limiter));
    tokio::spawn(async move {
        let mut every = tokio::time::interval(HEARTBEAT_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if circuit.is_open() {
                continue;
            }
            let Ok(Ok(alive)) =
                tokio::time::timeout(HEARTBEAT_TIMEOUT, redis.heartbeat(&beat)).await
            else {
                continue;
            };
            let n = saved.heard(alive);
            let before = limiter.set_live_hosts(n);
            if before != n {
                tracing::info!(
                    hosts = n,
                    before,
                    "daemons alive in Redis: {before} -> {n}; with Redis unreachable each enforces limit ÷ {n}"
                );
            }
        }
    })
}

/// A heartbeat waits at most this long for Redis.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(500);
