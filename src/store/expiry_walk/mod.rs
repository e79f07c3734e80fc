//! After a reload that makes a rule keep its state longer (a slower refill, a longer
//! window: [`crate::config::diff::keeps_state_longer`]), the rule's keys in Redis still
//! carry the expiry the earlier rule gave them. A key someone asks for has its life
//! lengthened by that decision (`lua/prelude.lua`, `outlives()`); a key nobody asks
//! for would expire under the earlier rule and come back with a fresh budget. So one
//! daemon ([`super::walk_election`]) walks the rule's keys on every primary (`SCAN`)
//! and asks each with a cost of 0 under the new rule: the algorithm's own script, which
//! writes nothing but the key's expiry (`x` and its TTL), and only to lengthen it.
//!
//! The walk runs on a task of its own, off the decisions' path, paced to a share of
//! each primary's time ([`SHARE`]). A reload that changes the rule again during its
//! walk cancels it and, if the rule still keeps state longer than before, starts a new
//! one with the rule in force ([`Walks`]).
//!
//! Here: which walks run, and waiting for this daemon's turn to walk; the walk itself
//! (`SCAN`, the cost-0 asks, the pace) is [`keys`].

mod keys;

pub use keys::match_pattern;

use super::redis::RedisStore;
use super::walk_election::{Election, Turn, GRACE, RENEW_EVERY};
use crate::algorithm::Algorithm;
use crate::config::{diff, Rule};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The share of a primary's time the walk may take: it waits after each call so that
/// the time its calls were outstanding stays within this share of the time it has run
/// (an upper bound of the Redis time it used: the round trips count in full).
pub const SHARE: f64 = 0.25;

/// Keys asked of a primary per `SCAN` (`COUNT`).
pub const SCAN_COUNT: u32 = 1000;

/// Keys sent to a primary at once (pipelined on its connection): Redis runs them back
/// to back, so this bounds how long the walk holds it (≈ 10 µs each).
pub const CHUNK: usize = 100;

/// Attempts of one step (a `SCAN`, a chunk) while the primary does not answer, one
/// second apart, before that primary's walk is given up.
const ATTEMPTS: u32 = 5;

/// The walks this daemon runs, by rule name.
#[derive(Default)]
pub struct Walks {
    running: Mutex<HashMap<String, Running>>,
    next: AtomicU64,
}

struct Running {
    algorithm: Algorithm,
    cancel: CancellationToken,
    id: u64,
}

/// How a walk holding the lock ended.
enum Ended {
    Walked(Tally),
    Lost,
    Cancelled,
}

/// What one walk did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Keys asked.
    pub keys: u64,
    /// Keys whose state still mattered (reset_ms > 0): their expiry now follows the
    /// new rule.
    pub in_use: u64,
    /// Keys that could not be asked (a foreign key matching the pattern, a slot moved).
    pub errors: u64,
    /// Time the walk's calls were outstanding, summed over primaries.
    pub busy: Duration,
    /// Every primary was walked to the end.
    pub complete: bool,
}

impl RedisStore {
    /// After a reload from `was` to `is` (by rule name): starts a walk of each rule that
    /// keeps its state longer, and of each whose walk the reload cancelled (its
    /// parameters changed: keys not walked yet may still carry the earliest expiry).
    /// Returns at once; the walks run on tasks of their own.
    pub fn walk_after_reload(
        self: &Arc<Self>,
        was: &HashMap<String, Arc<Rule>>,
        is: &HashMap<String, Arc<Rule>>,
    ) {
        let mut running = self.walks.running.lock().unwrap_or_else(|p| p.into_inner());
        let mut restart = Vec::new();
        running.retain(|name, walk| {
            let same = is.get(name).is_some_and(|r| r.algorithm == walk.algorithm);
            if !same {
                walk.cancel.cancel();
                restart.push(name.clone());
            }
            same
        });
        for (name, rule) in is {
            let longer = was
                .get(name)
                .is_some_and(|w| diff::keeps_state_longer(&w.algorithm, &rule.algorithm));
            if !(longer || restart.contains(name)) {
                continue;
            }
            let cancel = CancellationToken::new();
            let id = self.walks.next.fetch_add(1, Ordering::Relaxed);
            running.insert(
                name.clone(),
                Running {
                    algorithm: rule.algorithm,
                    cancel: cancel.clone(),
                    id,
                },
            );
            let store = Arc::clone(self);
            let rule = Arc::clone(rule);
            tokio::spawn(async move {
                store.elect_and_walk(&rule, &cancel).await;
                let mut running = store
                    .walks
                    .running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if running.get(&rule.name).is_some_and(|w| w.id == id) {
                    running.remove(&rule.name);
                }
            });
        }
    }

    /// Waits for this daemon's turn to walk `rule` (or for another daemon's walk that
    /// covers it), walks, and records the walk.
    async fn elect_and_walk(&self, rule: &Rule, cancel: &CancellationToken) {
        let name = rule.name.as_str();
        let mut election = Election::new(&self.prefix, name, &rule.algorithm, &self.holder);
        let mut failures = 0;
        let mut said_held = false;
        loop {
            match election.take(self).await {
                Ok(Turn::Mine) => {
                    return self.walk_elected(rule, &mut election, cancel).await;
                }
                Ok(Turn::Covered) => {
                    tracing::info!(
                        rule = name,
                        "expiry walk: another daemon's walk covered this reload"
                    );
                    return;
                }
                Ok(Turn::Held) => {
                    if !said_held {
                        tracing::info!(
                            rule = name,
                            "expiry walk: another daemon walks the keys; waiting for it"
                        );
                        said_held = true;
                    }
                }
                Err(e) => {
                    failures += 1;
                    if failures >= 30 {
                        tracing::warn!(
                            rule = name,
                            "expiry walk not run: the walk election failed {failures} times: {e}"
                        );
                        return;
                    }
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(RENEW_EVERY) => {}
            }
        }
    }

    /// Walks `rule` holding the lock of `election` (renewed meanwhile); records the walk
    /// when it went to the end.
    async fn walk_elected(&self, rule: &Rule, election: &mut Election, cancel: &CancellationToken) {
        let name = rule.name.as_str();
        tokio::time::sleep(GRACE).await;
        let began = Instant::now();
        tracing::info!(
            rule = name,
            primaries = self.topology.load().primaries.len(),
            "expiry walk started: lengthening the expiry of the rule's keys in Redis to the rule in force"
        );
        let renew = async {
            loop {
                tokio::time::sleep(RENEW_EVERY).await;
                match election.take(self).await {
                    Ok(Turn::Mine) | Err(_) => {}
                    Ok(_) => return,
                }
            }
        };
        let ended = tokio::select! {
            tally = self.walk_keys(rule) => Ended::Walked(tally),
            () = renew => Ended::Lost,
            () = cancel.cancelled() => Ended::Cancelled,
        };
        let tally = match ended {
            Ended::Walked(tally) => tally,
            Ended::Lost => {
                tracing::warn!(
                    rule = name,
                    "expiry walk stopped: its lock passed to another daemon, which walks again"
                );
                return;
            }
            Ended::Cancelled => {
                drop(election.release(self).await);
                tracing::info!(
                    rule = name,
                    seconds = began.elapsed().as_secs_f64(),
                    "expiry walk cancelled: a reload changed the rule again"
                );
                return;
            }
        };
        let recorded = if tally.complete {
            election.finish(self).await.unwrap_or(false)
        } else {
            drop(election.release(self).await);
            false
        };
        tracing::info!(
            rule = name,
            keys = tally.keys,
            in_use = tally.in_use,
            errors = tally.errors,
            seconds = began.elapsed().as_secs_f64(),
            redis_busy_ms = tally.busy.as_millis() as u64,
            complete = tally.complete,
            recorded,
            "expiry walk finished"
        );
    }
}
