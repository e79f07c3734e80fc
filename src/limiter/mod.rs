//! The decision flow of one `CHECK`: resolve the rule, then answer from the deny cache,
//! Redis, or the fallback (docs/FAILURES.md).
//!
//! It knows neither the wire format (the server parses requests and encodes replies)
//! nor the Redis client: it asks a [`Store`] one bounded question per decision and gets
//! an outcome or a classified [`crate::store::StoreError`]; where the key lives, whether
//! its primary is healthy, batching and the time bound are the store's business.
//!
//! ```text
//! CHECK ─ rule? ─ peer allowed? ─ cost ≤ limit? ─┬─ mode none ──────────────► local twin (full limit)
//!                                                ├─ cached DENY ────────────► cache
//!                                                ├─ its ttl just over ──────► cache; a dry run refreshes it in the background
//!                                                ├─ key's primary open ─────► on_redis_failure
//!                                                ├─ no Redis slot for uid ──► ERR BUSY
//!                                                └─ EVALSHA within timeout ─┬► redis (DENY → cache)
//!                                                                           ├► primary unavailable: its breaker counts it, on_redis_failure
//!                                                                           └► error of this key only: on_redis_failure
//! ```

mod all;
mod all_decide;
mod check;
mod error;
mod lease;
mod lease_sweep;
mod operator;
mod query;
mod record;
mod refresh;
mod refund;
pub mod slots;
#[cfg(test)]
mod tests;
mod tiers;

use crate::admission::Peer;
use crate::cache::{DenyCache, Lookup};
use crate::clock::{local_clock_us, BatchClock};
use crate::config::{Config, Rule};
use crate::decision::Decision;
use crate::fallback::{decide_without_redis, LocalBuckets};
use crate::hot_keys::{HotKey, RuleKeys};
use crate::key::{fits, tag_in, TagKey, TAG_MAX};
use crate::log_every::LogEvery;
use crate::metrics::{DecisionCounters, RedisCalls};
use crate::store::{RedisStore, Store};

pub use all::{Bound, CheckAll, Refused};
use arc_swap::ArcSwap;
pub use error::CheckError;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use operator::{Inspection, Pending, SlotsSeen};

/// The rules in force; swapped whole on reload, so a request sees one version.
pub type Rules = HashMap<String, Arc<Rule>>;

/// A rule in force with its metrics.
struct ActiveRule {
    rule: Arc<Rule>,
    counters: DecisionCounters,
    /// Not in the table of named rules ([`Detached`]).
    detached: bool,
    /// The rule's hottest keys (`TOP`), kept across reloads; `None` for a detached rule.
    hot: Option<Arc<RuleKeys>>,
    /// The rule as it applies to some keys (`[[rule.override]]`), in the rule's order:
    /// the same counters and hot keys, the override's parameters.
    overrides: Vec<Arc<ActiveRule>>,
    /// The log of a shadow rule's would-be DENYs, kept across reloads
    /// ([`record::SHADOW_LOG_INTERVAL`]).
    shadow_log: Arc<LogEvery>,
}

impl ActiveRule {
    /// The rule in force for `key`: its override's if one applies
    /// ([`crate::config::overrides::find`]), else itself.
    fn for_key<'a>(self: &'a Arc<Self>, key: &[u8]) -> &'a Arc<ActiveRule> {
        if self.overrides.is_empty() {
            return self;
        }
        crate::config::overrides::find(&self.rule.overrides, key)
            .and_then(|o| {
                self.overrides
                    .iter()
                    .find(|a| Arc::ptr_eq(&a.rule, &o.rule))
            })
            .unwrap_or(self)
    }
}

/// A rule decided outside the table of named rules, by [`Limiter::check_detached`]:
/// the Envoy front end's limits. Same flow, same guarantees; its decisions are counted
/// under its rule's name. Its access lists are not checked (the front end has its own).
pub struct Detached(Arc<ActiveRule>);

impl Detached {
    /// `rule` with its counters (register after the metrics recorder is installed).
    pub fn new(rule: Arc<Rule>) -> Self {
        let counters = DecisionCounters::new(&rule.name);
        Detached(Arc::new(ActiveRule {
            rule,
            counters,
            detached: true,
            hot: None,
            overrides: Vec::new(),
            shadow_log: Arc::new(LogEvery::new(record::SHADOW_LOG_INTERVAL)),
        }))
    }

    /// `rule` counted nowhere (no metrics series, not on the dashboard): the rule
    /// lab's ad-hoc rules.
    pub fn unlisted(rule: Arc<Rule>) -> Self {
        Detached(Arc::new(ActiveRule {
            rule,
            counters: DecisionCounters::unlisted(),
            detached: true,
            hot: None,
            overrides: Vec::new(),
            shadow_log: Arc::new(LogEvery::new(record::SHADOW_LOG_INTERVAL)),
        }))
    }

    /// The rule.
    pub fn rule(&self) -> &Arc<Rule> {
        &self.0.rule
    }
}

/// The rules in force as the limiter holds them (looked up once per request: foldhash,
/// not SipHash).
type Active = HashMap<String, Arc<ActiveRule>, crate::key::Hasher>;

/// `rules` with their metrics; a rule of `previous` keeps its hot keys.
fn activate(rules: Rules, previous: &Active) -> Active {
    rules
        .into_iter()
        .map(|(name, rule)| {
            let counters = DecisionCounters::new(&name);
            let detached = false;
            let old = previous.get(&name);
            let hot = old.and_then(|old| old.hot.clone()).unwrap_or_default();
            let shadow_log = old.map_or_else(
                || Arc::new(LogEvery::new(record::SHADOW_LOG_INTERVAL)),
                |old| Arc::clone(&old.shadow_log),
            );
            let overrides = rule
                .overrides
                .iter()
                .map(|o| {
                    Arc::new(ActiveRule {
                        rule: Arc::clone(&o.rule),
                        counters: DecisionCounters::new(&name),
                        detached,
                        hot: Some(Arc::clone(&hot)),
                        overrides: Vec::new(),
                        shadow_log: Arc::clone(&shadow_log),
                    })
                })
                .collect();
            (
                name,
                Arc::new(ActiveRule {
                    rule,
                    counters,
                    detached,
                    hot: Some(hot),
                    overrides,
                    shadow_log,
                }),
            )
        })
        .collect()
}

/// Everything a decision needs, shared by all connections; `S` is where shared state
/// lives (Redis in production).
pub struct Limiter<S: Store = RedisStore> {
    rules: ArcSwap<Active>,
    cache: DenyCache,
    local: LocalBuckets,
    redis: Option<Arc<S>>,
    /// Per-key Redis errors are logged through this.
    key_errors: LogEvery,
    redis_calls: RedisCalls,
    /// Turns a tag into the key of the deny cache and the local buckets, once a request.
    keys: TagKey,
    /// This daemon's leases (rules with `lease = "auto"`), and whether their sweeper runs.
    leases: crate::lease::Book<lease::Home<S>>,
    sweeper: std::sync::OnceLock<()>,
    /// The deny cache's refreshes claimed and not sent yet: they leave together.
    refreshes: refresh::Refreshes<S>,
    /// The concurrency slots this daemon's clients hold, and whether their renewal
    /// runs.
    slots: slots::Holdings<S::Key>,
    renewer: std::sync::OnceLock<()>,
    /// The run-time overrides (`OVERRIDE`) seen in Redis's replies, by key.
    tiers: tiers::Tiers,
}

/// Per-key Redis errors are logged at most this often.
const KEY_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A decision with the rule's policy window, ms (the seventh field of the reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    /// The decision.
    pub decision: Decision,
    /// The rule's policy window ([`crate::algorithm::Algorithm::window_ms`]).
    pub window_ms: u64,
}

/// The answer to a `CHECK` on its way: ready now, or waiting on Redis (bounded by the
/// Redis timeout, and always a decision: Redis failing is decided without it).
pub enum Check {
    /// Decided (or refused) without I/O.
    Ready(Result<Decided, CheckError>),
    /// A Redis decision in flight.
    Redis(Pin<Box<dyn Future<Output = Decided> + Send>>),
}

impl Limiter<RedisStore> {
    /// A limiter deciding every request in this process (`redis.mode = "none"`).
    pub fn local(config: &Config) -> Self {
        Limiter::new(config, None)
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter for `config` asking `redis` (`None` in `mode = "none"`: every decision
    /// local, at the rules' full limits).
    pub fn new(config: &Config, redis: Option<Arc<S>>) -> Self {
        let grace_ms = config.redis.timeout_ms.saturating_mul(2);
        Limiter {
            rules: ArcSwap::from_pointee(activate(config.rules.clone(), &Active::default())),
            // An expired entry answers while its refresh waits to be sent (at most a
            // quarter of this) and is in flight: at most the time the Redis call may
            // take (one timeout, one more when this process was late).
            cache: DenyCache::new(config.cache.ttl_ms, config.cache.max_entries, grace_ms),
            local: LocalBuckets::new(config.fallback.max_keys),
            redis,
            key_errors: LogEvery::new(KEY_ERROR_LOG_INTERVAL),
            redis_calls: RedisCalls::default(),
            keys: TagKey::default(),
            leases: crate::lease::Book::new(
                crate::lease::new_holder_id(),
                config.fallback.max_keys,
            ),
            sweeper: std::sync::OnceLock::new(),
            refreshes: refresh::Refreshes::new(Duration::from_millis(grace_ms)),
            slots: slots::Holdings::new(),
            renewer: std::sync::OnceLock::new(),
            tiers: tiers::Tiers::new(config.fallback.max_keys),
        }
    }

    /// Puts `rules` in force for requests that start from now on; in-flight requests
    /// finish under the rules they started with. Clears the deny cache; the leases held
    /// stop being spent at once, and are given back (their unspent units reported) by
    /// the next call of each key or the sweep.
    pub fn replace_rules(&self, rules: Rules) {
        let active = activate(rules, &self.rules.load());
        self.rules.store(Arc::new(active));
        self.tiers.clear();
        self.cache.clear();
        self.leases.retire();
    }

    /// The names of the rules in force, sorted.
    pub fn rule_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.rules.load().keys().cloned().collect();
        names.sort();
        names
    }

    /// The `n` keys of rule `rule` this daemon decided most often over the last minute,
    /// most first, with their decision and deny counts (bounded memory and error:
    /// [`crate::hot_keys`]); `None` if no rule has this name.
    pub fn top_keys(&self, rule: &str, n: usize) -> Option<Vec<HotKey>> {
        let rules = self.rules.load();
        let hot = rules.get(rule)?.hot_keys()?;
        Some(hot.top(n, local_clock_us()))
    }

    /// Records the daemons alive in Redis (`fallback.hosts = "auto"`); returns the count
    /// seen before (0: none yet).
    pub fn set_live_hosts(&self, n: u32) -> u32 {
        self.local.hosts.set(n)
    }

    /// Entries in the deny cache, keys with local state (approximate) and the lease
    /// book's figures.
    pub fn sizes(&self) -> crate::metrics::Sizes {
        crate::metrics::Sizes {
            cache_entries: self.cache.len(),
            local_keys: self.local.len(),
            leases: self.leases.sizes(),
        }
    }

    /// Starts loading the local bucket that `CHECK rule key` would decide, when this
    /// daemon decides locally (`redis.mode = "none"`); the connection calls it for each
    /// line of a read before deciding them, so their memory loads overlap. A hint only:
    /// the rule is not looked up (a rule's tag uses the name as the client sends it, and
    /// an unknown rule just prefetches a line for nothing).
    pub fn prefetch_local(&self, rule: &[u8], key: &[u8]) {
        if self.redis.is_some() {
            return;
        }
        if fits(rule, key) {
            self.local.prefetch(self.keys.of(rule, key));
        }
    }

    /// Whether [`Limiter::prefetch_local`] is worth a walk over the lines: decisions
    /// are local and the local buckets have outgrown the CPU caches.
    pub fn prefetches(&self) -> bool {
        self.redis.is_none() && self.local.outgrew_caches()
    }
}
