//! The walk of one rule's keys: `SCAN` on every primary at once, each key asked with a
//! cost of 0 under the rule in force (in pipelined chunks, retried while the primary
//! does not answer), paced to [`SHARE`] of each primary's time so that the walk never
//! crowds out the decisions.

use super::{Tally, ATTEMPTS, CHUNK, SCAN_COUNT, SHARE};
use crate::config::Rule;
use crate::lease::Request;
use crate::store::redis::RedisStore;
use crate::store::{topology::Primary, StoreError, StoreKey};
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use futures::future::join_all;
use std::time::{Duration, Instant};

impl RedisStore {
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
