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

use super::redis::RedisStore;
use super::walk_election::{Election, Turn, GRACE, RENEW_EVERY};
use super::{topology::Primary, StoreError, StoreKey};
use crate::algorithm::Algorithm;
use crate::config::{diff, Rule};
use crate::lease::Request;
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use futures::future::join_all;
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

    /// Walks every primary's keys of `rule` at once (each paced on its own).
    pub async fn walk_keys(&self, rule: &Rule) -> Tally {
        let pattern = match_pattern(&self.prefix, rule);
        let primaries = self.topology.load().primaries.clone();
        let tallies = join_all(
            primaries
                .iter()
                .map(|p| self.walk_primary(p, &pattern, rule)),
        )
        .await;
        tallies.into_iter().fold(
            Tally {
                complete: !primaries.is_empty(),
                ..Tally::default()
            },
            |a, b| Tally {
                keys: a.keys + b.keys,
                in_use: a.in_use + b.in_use,
                errors: a.errors + b.errors,
                busy: a.busy + b.busy,
                complete: a.complete && b.complete,
            },
        )
    }

    /// Walks the keys of `rule` (`pattern`) on one primary.
    async fn walk_primary(&self, primary: &Primary, pattern: &str, rule: &Rule) -> Tally {
        let mut tally = Tally::default();
        let mut pace = Pace::new();
        let mut cursor = String::from("0");
        loop {
            let page = self.scan(primary, &cursor, pattern, &mut pace).await;
            let (next, keys) = match page {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(rule = %rule.name, primary = primary.name(), "expiry walk: SCAN failed {ATTEMPTS} times, the primary's keys are left as they are: {e}");
                    tally.busy = pace.busy;
                    return tally;
                }
            };
            for chunk in keys.chunks(CHUNK) {
                if !self
                    .extend_chunk(primary, chunk, rule, &mut tally, &mut pace)
                    .await
                {
                    tracing::warn!(rule = %rule.name, primary = primary.name(), "expiry walk: this primary does not answer; its remaining keys are left as they are");
                    tally.busy = pace.busy;
                    return tally;
                }
            }
            if next == "0" {
                tally.complete = true;
                tally.busy = pace.busy;
                return tally;
            }
            cursor = next;
        }
    }

    /// One `SCAN` step on `primary`: the next cursor and the keys matching `pattern`;
    /// the last error when the primary did not answer [`ATTEMPTS`] times.
    async fn scan(
        &self,
        primary: &Primary,
        cursor: &str,
        pattern: &str,
        pace: &mut Pace,
    ) -> Result<(String, Vec<String>), Error> {
        let command = CustomCommand::new_static("SCAN", ClusterHash::Random, false);
        let mut attempt = 0;
        loop {
            let args = vec![
                Value::from(cursor),
                Value::from("MATCH"),
                Value::from(pattern),
                Value::from("COUNT"),
                Value::Integer(i64::from(SCAN_COUNT)),
            ];
            let began = Instant::now();
            let reply = primary.client.custom(command.clone(), args).await;
            pace.spent(began.elapsed()).await;
            attempt += 1;
            match reply {
                Err(e) if attempt < ATTEMPTS => {
                    tracing::debug!("expiry walk: SCAN on {} failed: {e}", primary.name());
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                reply => return reply,
            }
        }
    }

    /// Asks every key of `chunk` with a cost of 0 under `rule`, pipelined; the keys the
    /// primary could not answer are asked again (up to [`ATTEMPTS`]). False when some
    /// never were.
    async fn extend_chunk(
        &self,
        primary: &Primary,
        chunk: &[String],
        rule: &Rule,
        tally: &mut Tally,
        pace: &mut Pace,
    ) -> bool {
        let mut left: Vec<&String> = chunk.iter().collect();
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let began = Instant::now();
            let answers = join_all(left.iter().map(|k| self.extend(primary, k, rule))).await;
            pace.spent(began.elapsed()).await;
            let mut again = Vec::new();
            for (key, answer) in left.into_iter().zip(answers) {
                match answer {
                    Ok(in_use) => {
                        tally.keys += 1;
                        tally.in_use += u64::from(in_use);
                    }
                    Err(StoreError::Unavailable { .. }) => again.push(key),
                    Err(_) => tally.errors += 1,
                }
            }
            if again.is_empty() {
                return true;
            }
            left = again;
        }
        false
    }

    /// Asks `key` with a cost of 0 under `rule` (its lease script for a leased rule, as
    /// its decisions are): the script lengthens the key's expiry when the rule needs the
    /// state longer, and writes nothing else. True when the state still matters.
    async fn extend(&self, primary: &Primary, key: &str, rule: &Rule) -> Result<bool, StoreError> {
        let key = StoreKey(fred::types::Key::from(key));
        let outcome = if rule.lease {
            let ask = Request {
                lifetime_us: 0,
                ..Request::cold(&self.holder)
            };
            self.lease_unbounded(primary, &key, &rule.params, 0, &ask)
                .await
                .map(|(o, _)| o)
        } else {
            self.decide_alone(primary, &key, &rule.params, 0, false)
                .await
        };
        outcome
            .map(|o| o.reset_ms > 0)
            .map_err(StoreError::from_redis)
    }
}

/// The `SCAN MATCH` pattern of `rule`'s keys: `<prefix>:{<rule>:*}:<suffix>`, the
/// prefix and name escaped (a glob character in them is literal).
pub fn match_pattern(prefix: &str, rule: &Rule) -> String {
    let suffix = rule.params.kind().spec().suffix;
    format!(
        "{}:{{{}:*}}:{suffix}",
        glob_escape(prefix),
        glob_escape(&rule.name)
    )
}

fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Keeps a walk within [`SHARE`] of one primary's time.
struct Pace {
    began: Instant,
    busy: Duration,
}

impl Pace {
    fn new() -> Self {
        Pace {
            began: Instant::now(),
            busy: Duration::ZERO,
        }
    }

    /// Counts `took` (a call's round trip) and waits until the calls so far are within
    /// the share of the time run.
    async fn spent(&mut self, took: Duration) {
        self.busy += took;
        let due = self.busy.div_f64(SHARE);
        let ran = self.began.elapsed();
        if due > ran {
            tokio::time::sleep(due - ran).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_names_the_rule_s_keys_literally() {
        let config = crate::config::Config::parse(
            "[[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\ncapacity = 3\nrefill_rate = 1.0\n",
            "t",
        )
        .unwrap();
        let rule = &config.rules["api"];
        assert_eq!(match_pattern("rl", rule), "rl:{api:*}:tb");
        assert_eq!(match_pattern("a*b[", rule), "a\\*b\\[:{api:*}:tb");
    }
}
