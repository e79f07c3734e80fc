//! The decision flow for one request line: parse, resolve the rule, then answer from
//! the deny cache, Redis, or the fallback (CONTRACT §1, §4).
//!
//! ```text
//! CHECK ─ rule? ─ cost ≤ limit? ─┬─ mode none ──────────────► local twin (full limit)
//!                                ├─ cached DENY ────────────► cache
//!                                ├─ circuit open ───────────► on_redis_failure
//!                                └─ EVALSHA within timeout ─┬► redis (DENY → cache)
//!                                                           ├► Redis unavailable: trip circuit, on_redis_failure
//!                                                           └► error of this key only: on_redis_failure
//! ```

use crate::algorithm::{wall_clock_us, BatchClock};
use crate::cache::{DenyCache, TagKey};
use crate::circuit::Circuit;
use crate::config::{Config, Rule};
use crate::fallback::{decide_without_redis, LocalBuckets};
use crate::metrics::{self, DecisionCounters, RedisCalls};
use crate::protocol::{self, Decision, ErrorCode, ProtoError, Reply, Request, Source};
use crate::store::redis::{error_kind, is_unavailable, RedisStore};
use arc_swap::ArcSwap;
use fred::types::Key;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The rules in force; swapped whole on reload, so a request sees one version.
pub type Rules = HashMap<String, Arc<Rule>>;

/// A rule in force with its metrics.
struct Entry {
    rule: Arc<Rule>,
    counters: DecisionCounters,
}

/// The rules in force as the limiter holds them (looked up once per request: foldhash,
/// not SipHash).
type Active = HashMap<String, Arc<Entry>, crate::cache::Hasher>;

fn activate(rules: Rules) -> Active {
    rules
        .into_iter()
        .map(|(name, rule)| {
            let counters = DecisionCounters::new(&name);
            (name, Arc::new(Entry { rule, counters }))
        })
        .collect()
}

/// Everything a decision needs, shared by all connections.
pub struct Limiter {
    rules: ArcSwap<Active>,
    cache: DenyCache,
    local: LocalBuckets,
    redis: Option<Arc<RedisStore>>,
    circuit: Arc<Circuit>,
    timeout: Duration,
    epoch: Instant,
    /// When a per-key Redis error was last logged: s since `epoch`, plus 1 (0 = never).
    last_key_error_log: AtomicU64,
    redis_calls: RedisCalls,
    /// Turns a tag into the key of the deny cache and the local buckets, once a request.
    keys: TagKey,
}

/// Longest `"<rule>:<key>"`: a 64-byte rule name, `:`, a 256-byte key.
const TAG_MAX: usize = 64 + 1 + 256;

/// Writes `"<rule>:<key>"` into `buf` and returns it, or `None` if it does not fit (a
/// key longer than the protocol allows) or is not UTF-8 (keys are printable ASCII).
fn tag_in<'b>(buf: &'b mut [u8; TAG_MAX], rule: &str, key: &[u8]) -> Option<&'b str> {
    let len = rule.len() + 1 + key.len();
    let out = buf.get_mut(..len)?;
    out[..rule.len()].copy_from_slice(rule.as_bytes());
    out[rule.len()] = b':';
    out[rule.len() + 1..].copy_from_slice(key);
    std::str::from_utf8(out).ok()
}

/// Per-key Redis errors are logged at most this often.
const KEY_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A reply on its way: ready now, or waiting on Redis (bounded by the Redis timeout).
pub enum Pending {
    /// Decided without I/O.
    Ready(Option<Reply>),
    /// A Redis decision in flight.
    Redis(Pin<Box<dyn Future<Output = Reply> + Send>>),
}

impl Future for Pending {
    type Output = Reply;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        match self.get_mut() {
            Pending::Ready(reply) => Poll::Ready(reply.take().unwrap_or_else(|| {
                ProtoError::new(ErrorCode::Internal, "reply polled twice").into()
            })),
            Pending::Redis(fut) => fut.as_mut().poll(cx),
        }
    }
}

impl Limiter {
    /// A limiter for `config`. `redis` is `None` in `mode = "none"`; `circuit` is shared
    /// with the Redis prober.
    pub fn new(config: &Config, redis: Option<Arc<RedisStore>>, circuit: Arc<Circuit>) -> Self {
        Limiter {
            rules: ArcSwap::from_pointee(activate(config.rules.clone())),
            cache: DenyCache::new(config.cache.ttl_ms, config.cache.max_entries),
            local: LocalBuckets::new(config.fallback.max_keys),
            redis,
            circuit,
            timeout: config.redis_timeout(),
            epoch: Instant::now(),
            last_key_error_log: AtomicU64::new(0),
            redis_calls: RedisCalls::default(),
            keys: TagKey::default(),
        }
    }

    /// Puts `rules` in force for requests that start from now on; in-flight requests
    /// finish under the rules they started with. Clears the deny cache.
    pub fn replace_rules(&self, rules: Rules) {
        self.rules.store(Arc::new(activate(rules)));
        self.cache.clear();
    }

    /// Answers one request line (terminator removed). The `bool` is true for `QUIT`:
    /// the connection closes after this reply.
    pub fn handle(self: &Arc<Self>, line: &[u8]) -> (Pending, bool) {
        self.handle_with(line, &mut BatchClock::default())
    }

    /// [`Limiter::handle`], reading the wall clock through `clock`, shared by the lines
    /// of one batch.
    pub fn handle_with(self: &Arc<Self>, line: &[u8], clock: &mut BatchClock) -> (Pending, bool) {
        match protocol::parse(line) {
            Ok(Request::Check { rule, key, cost }) => (self.check(rule, key, cost, clock), false),
            Ok(Request::Ping) => (Pending::Ready(Some(Reply::Pong)), false),
            Ok(Request::Quit) => (Pending::Ready(Some(Reply::Bye)), true),
            Err(e) => {
                metrics::error_reply(e.code);
                (Pending::Ready(Some(e.into())), false)
            }
        }
    }

    /// Entries in the deny cache and keys with local state (approximate).
    pub fn sizes(&self) -> (u64, u64) {
        (self.cache.len(), self.local.len())
    }

    /// Decides `CHECK rule key cost` (key and cost already valid per the protocol);
    /// local decisions and cache hits take the time from `clock`.
    pub fn check(
        self: &Arc<Self>,
        rule: &[u8],
        key: &[u8],
        cost: u32,
        clock: &mut BatchClock,
    ) -> Pending {
        let ready = |reply: Reply| Pending::Ready(Some(reply));
        let error = |e: ProtoError| {
            metrics::error_reply(e.code);
            ready(e.into())
        };
        let rules = self.rules.load();
        let Some(entry) = std::str::from_utf8(rule)
            .ok()
            .and_then(|name| rules.get(name))
        else {
            return error(ProtoError::new(
                ErrorCode::Rule,
                format!("unknown rule '{}'", protocol::printable(rule, 64)),
            ));
        };
        let rule = &entry.rule;
        let decided = |d: Decision| {
            entry.counters.record(&d);
            ready(Reply::Decision(d, rule.window_ms))
        };
        if u64::from(cost) > rule.limit() {
            return error(ProtoError::new(
                ErrorCode::Cost,
                format!(
                    "cost {cost} exceeds rule '{}' limit {} and can never be allowed",
                    rule.name,
                    rule.limit()
                ),
            ));
        }
        // "<rule>:<key>" built on the stack and hashed once: cache hits and local
        // decisions allocate nothing for it; a Redis call builds its Redis key once.
        let mut buf = [0u8; TAG_MAX];
        let Some(tag) = tag_in(&mut buf, &rule.name, key) else {
            return error(ProtoError::new(ErrorCode::Key, "key too long"));
        };
        let key = self.keys.of(tag);

        let Some(redis) = &self.redis else {
            let now = clock.now_us();
            return decided(
                self.local
                    .decide(key, rule.limit(), &rule.params, cost, now),
            );
        };
        if let Some(cached) = self.cache.lookup(key, cost, clock.now_us()) {
            return decided(cached);
        }
        if self.circuit.is_open() {
            let now = clock.now_us();
            return decided(decide_without_redis(&self.local, rule, key, cost, now));
        }
        let this = Arc::clone(self);
        let redis = Arc::clone(redis);
        let entry = Arc::clone(entry);
        let redis_key = Key::from(redis.key(tag, &rule.params));
        Pending::Redis(Box::pin(async move {
            let rule = &entry.rule;
            let asked = Instant::now();
            let asked_us = wall_clock_us();
            let call = redis.decide(redis_key.clone(), &rule.params, cost);
            let answer = tokio::time::timeout(this.timeout, call).await;
            this.redis_calls.took(asked.elapsed());
            let decision = match answer {
                Ok(Ok(o)) => {
                    let d = Decision {
                        allowed: o.allowed,
                        limit: rule.limit(),
                        remaining: o.remaining,
                        reset_ms: o.reset_ms,
                        wait_ms: o.wait_ms,
                        source: Source::Redis,
                    };
                    // Not if a reload replaced the rule meanwhile: the reload cleared
                    // the cache, and this DENY was computed with the old limits.
                    let current = this.rules.load();
                    if current
                        .get(&rule.name)
                        .is_some_and(|e| Arc::ptr_eq(e, &entry))
                    {
                        this.cache.remember(key, cost, &d, asked_us);
                    }
                    d
                }
                Ok(Err(e)) if is_unavailable(&e) => {
                    this.redis_calls.failed(error_kind(&e));
                    this.circuit.trip(&e);
                    decide_without_redis(&this.local, rule, key, cost, wall_clock_us())
                }
                Ok(Err(e)) => {
                    // This key's problem, not Redis's: decide it locally, keep the circuit.
                    this.redis_calls.failed("key");
                    this.log_key_error(redis_key.as_str().unwrap_or("?"), &e);
                    decide_without_redis(&this.local, rule, key, cost, wall_clock_us())
                }
                Err(_) => {
                    this.redis_calls.failed("timeout");
                    this.circuit.trip(&format_args!(
                        "no answer within redis.timeout_ms = {}",
                        this.timeout.as_millis()
                    ));
                    decide_without_redis(&this.local, rule, key, cost, wall_clock_us())
                }
            };
            entry.counters.record(&decision);
            Reply::Decision(decision, rule.window_ms)
        }))
    }

    /// Logs a per-key Redis error, at most once per [`KEY_ERROR_LOG_INTERVAL`].
    fn log_key_error(&self, redis_key: &str, error: &dyn std::fmt::Display) {
        let now = self.epoch.elapsed().as_secs() + 1;
        let last = self.last_key_error_log.load(Ordering::Relaxed);
        if (last == 0 || now >= last + KEY_ERROR_LOG_INTERVAL.as_secs())
            && self
                .last_key_error_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(key = redis_key, %error, "Redis could not decide this key; decided per on_redis_failure (further such errors logged at most every 10 s)");
        }
    }
}
