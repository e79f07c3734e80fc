//! The Redis client: runs the algorithms' Lua scripts (`lua/`, one per algorithm) with
//! EVALSHA in Redis Cluster or a standalone Redis, through fred.
//!
//! * Scripts are loaded on every primary (`SCRIPT LOAD` via fred's
//!   `script_load_cluster`) at start and by every probe, and re-loaded on `NOSCRIPT`
//!   (after a restart, a failover or `SCRIPT FLUSH`) before one retry, by one caller
//!   for all the decisions in flight.
//! * Keys are `<prefix>:{<rule>:<key>}:<algorithm>`: the hash tag puts all of a bucket
//!   in one slot.
//! * fred pipelines concurrent commands on its connections by itself; callers simply
//!   run decisions concurrently.
//! * Time bounds: fred ignores per-command options on EVALSHA (fred issue #353), so the
//!   caller bounds each decision with `tokio::time::timeout`; fred's own
//!   `default_command_timeout` is a backstop that frees commands queued while Redis is
//!   away. fred's default reconnect policy is none: we set a constant one.

use crate::algorithm::{token_bucket, Outcome, Params, MICRO};
use crate::circuit::{Circuit, PROBE_INTERVAL};
use crate::config::{parse_node, RedisConfig, RedisMode};
use fred::prelude::*;
use fred::types::config::UnresponsiveConfig;
use fred::types::scripts::Script;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The token bucket script: `lua/prelude.lua` (the decision instant, `ceil_ms`, `settle`)
/// then `lua/token_bucket.lua` (see each file for its arguments and reply).
pub const TOKEN_BUCKET_LUA: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/token_bucket.lua")
);
/// The leaky bucket script.
pub const LEAKY_BUCKET_LUA: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/leaky_bucket.lua")
);
/// The fixed window script.
pub const FIXED_WINDOW_LUA: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/fixed_window.lua")
);
/// The sliding window log script.
pub const SLIDING_WINDOW_LOG_LUA: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/sliding_window_log.lua")
);
/// The sliding window counter script.
pub const SLIDING_WINDOW_COUNTER_LUA: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/sliding_window_counter.lua")
);

/// The five scripts, loaded together.
struct Scripts {
    token_bucket: Script,
    leaky_bucket: Script,
    fixed_window: Script,
    sliding_window_log: Script,
    sliding_window_counter: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            token_bucket: Script::from_lua(TOKEN_BUCKET_LUA),
            leaky_bucket: Script::from_lua(LEAKY_BUCKET_LUA),
            fixed_window: Script::from_lua(FIXED_WINDOW_LUA),
            sliding_window_log: Script::from_lua(SLIDING_WINDOW_LOG_LUA),
            sliding_window_counter: Script::from_lua(SLIDING_WINDOW_COUNTER_LUA),
        }
    }

    fn all(&self) -> [&Script; 5] {
        [
            &self.token_bucket,
            &self.leaky_bucket,
            &self.fixed_window,
            &self.sliding_window_log,
            &self.sliding_window_counter,
        ]
    }
}

/// Delay between reconnection attempts, ms.
const RECONNECT_DELAY_MS: u32 = 100;

/// A connection (pool) to Redis plus the loaded scripts.
pub struct RedisStore {
    client: Client,
    scripts: Scripts,
    prefix: String,
    clustered: bool,
    /// The per-decision bound (`redis.timeout_ms`).
    timeout: Duration,
    probe_timeout: Duration,
    /// Script reloads after `NOSCRIPT` so far, and the lock that makes one caller do it.
    reloads: AtomicU64,
    reload_lock: tokio::sync::Mutex<()>,
}

impl RedisStore {
    /// Builds the client for `cfg` (`mode` must be `cluster` or `standalone`). Does not
    /// connect: see [`RedisStore::connect`].
    ///
    /// # Errors
    /// A node that is not `host:port`, or a mode of `none`.
    pub fn new(cfg: &RedisConfig) -> Result<Self, Error> {
        let mut hosts = Vec::new();
        for node in cfg.nodes.get_ref() {
            let (host, port) = parse_node(node)
                .map(|(h, p)| (h.to_owned(), p))
                .ok_or_else(|| {
                    Error::new(ErrorKind::Config, format!("redis.nodes: bad node '{node}'"))
                })?;
            hosts.push((host, port));
        }
        let server = match cfg.mode {
            RedisMode::Cluster => ServerConfig::new_clustered(hosts),
            RedisMode::Standalone if hosts.len() == 1 => {
                let (host, port) = hosts.remove(0);
                ServerConfig::new_centralized(host, port)
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::Config,
                    "redis.mode needs one node (standalone) or seed nodes (cluster)",
                ))
            }
        };
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let probe_timeout = (timeout * 4)
            .clamp(Duration::from_millis(250), Duration::from_millis(700))
            .max(timeout + Duration::from_millis(100));
        let config = Config {
            server,
            // Keep trying to connect in the background; never fail a caller on connect.
            fail_fast: false,
            ..Config::default()
        };
        let client = Builder::from_config(config)
            .with_performance_config(|perf| {
                perf.default_command_timeout = Duration::from_secs(1).max(timeout * 2);
            })
            .with_connection_config(|conn| {
                conn.connection_timeout = Duration::from_millis(500);
                conn.internal_command_timeout = Duration::from_millis(500).max(timeout);
                // Never replay a decision on a new connection: it may have run already
                // (its caller has long been answered locally).
                conn.max_command_attempts = 1;
                // A frozen server (SIGSTOP, a long script) accepts bytes but never answers:
                // drop such connections and reconnect.
                conn.unresponsive = UnresponsiveConfig {
                    max_timeout: Some(Duration::from_secs(2)),
                    interval: Duration::from_millis(100),
                };
                // Bound what queues up while disconnected.
                conn.max_command_buffer_len = 100_000;
            })
            .set_policy(ReconnectPolicy::new_constant(0, RECONNECT_DELAY_MS))
            .build()?;
        Ok(RedisStore {
            client,
            scripts: Scripts::new(),
            prefix: cfg.prefix.clone(),
            clustered: cfg.mode == RedisMode::Cluster,
            timeout,
            probe_timeout,
            reloads: AtomicU64::new(0),
            reload_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Starts fred's connection task (reconnecting forever in the background).
    pub fn connect(&self) {
        // The task runs until the client quits; its result only reports why it ended.
        drop(self.client.connect());
    }

    /// The Redis key of `tag` (`"<rule>:<key>"`) under `params`' algorithm:
    /// `<prefix>:{<tag>}:<algorithm>` (`tb`, `lb`, `fw`, `swl`, `swc`). The hash tag puts
    /// the key in `tag`'s slot; the suffix (CONTRACT §5 allows suffixes) keeps a rule
    /// whose algorithm a reload changed from reading the other algorithm's state (a hash
    /// where a sorted set is expected would fail with `WRONGTYPE`; another hash layout
    /// would be misread): it starts afresh, as the local twins do.
    ///
    /// A `}` inside the key would end the hash tag early (Redis hashes the text between
    /// the first `{` and the next `}`), so it is written as a space, a byte protocol keys
    /// never contain: the mapping stays one-to-one and the whole tag is hashed.
    pub fn key(&self, tag: &str, params: &Params) -> String {
        let suffix = match params {
            Params::TokenBucket(_) => "tb",
            Params::LeakyBucket(_) => "lb",
            Params::FixedWindow(_) => "fw",
            Params::SlidingWindowLog(_) => "swl",
            Params::SlidingWindowCounter(_) => "swc",
        };
        let mut key = String::with_capacity(self.prefix.len() + tag.len() + 4 + suffix.len());
        key.push_str(&self.prefix);
        key.push_str(":{");
        if tag.contains('}') {
            key.push_str(&tag.replace('}', " "));
        } else {
            key.push_str(tag);
        }
        key.push_str("}:");
        key.push_str(suffix);
        key
    }

    /// Decides `cost` units for the Redis key `key` ([`RedisStore::key`] of the tag under
    /// `params`) with the script of `params`' algorithm, on the Redis clock. Re-loads the
    /// scripts on `NOSCRIPT` (one caller for all) and retries.
    ///
    /// # Errors
    /// Whatever Redis or the connection reports (down, OOM, cluster down, ...), or a
    /// malformed script reply.
    pub async fn decide(&self, key: Key, params: &Params, cost: u32) -> Result<Outcome, Error> {
        let mut generation = self.reloads.load(Ordering::Acquire);
        let mut reloads = 0;
        loop {
            let (script, args) = self.call(params, cost);
            let reply: Result<Vec<i64>, Error> =
                script.evalsha(&self.client, key.clone(), args).await;
            match reply {
                // Flushed, restarted or failed over: one caller reloads for all. At most
                // twice: a flush may reach the primaries one after the other, so a
                // decision can meet NOSCRIPT again right after someone else's reload.
                Err(e) if reloads < 2 && e.details().starts_with("NOSCRIPT") => {
                    self.reload_scripts(generation).await?;
                    generation = self.reloads.load(Ordering::Acquire);
                    reloads += 1;
                }
                reply => return outcome(&reply?),
            }
        }
    }

    /// The script of `params`' algorithm and its arguments for `cost`. Integers go as
    /// fred integers (sent as bulk strings, formatted with itoa), rates as doubles
    /// (shortest round-trip form, which Lua's tonumber reads back exactly).
    fn call(&self, params: &Params, cost: u32) -> (&Script, Vec<Value>) {
        let micro = Value::Integer(i64::from(cost) * MICRO as i64);
        let s = &self.scripts;
        match params {
            Params::TokenBucket(p) => (
                &s.token_bucket,
                vec![whole(p.capacity), Value::Double(p.refill_rate), micro],
            ),
            Params::LeakyBucket(p) => (
                &s.leaky_bucket,
                vec![whole(p.capacity), Value::Double(p.leak_rate), micro],
            ),
            Params::FixedWindow(w) => (&s.fixed_window, window_args(w, cost)),
            Params::SlidingWindowLog(w) => (&s.sliding_window_log, window_args(w, cost)),
            Params::SlidingWindowCounter(w) => (&s.sliding_window_counter, window_args(w, cost)),
        }
    }

    /// Loads the scripts again after a `NOSCRIPT`, unless another decision already did
    /// since `seen` (the reload generation it read before its EVALSHA): after a `SCRIPT
    /// FLUSH` the decisions in flight wait for one reload instead of each loading every
    /// script on every primary.
    async fn reload_scripts(&self, seen: u64) -> Result<(), Error> {
        let _one_at_a_time = self.reload_lock.lock().await;
        if self.reloads.load(Ordering::Acquire) == seen {
            self.load_scripts().await?;
            self.reloads.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    /// Loads every script on every primary.
    pub async fn load_scripts(&self) -> Result<(), Error> {
        for script in self.scripts.all() {
            script.load(&self.client).await?;
        }
        Ok(())
    }

    /// One health check: refresh the cluster map (cluster mode), load the scripts on
    /// every primary, then take one token from a probe bucket. That last step writes
    /// (so a Redis refusing writes, e.g. out of memory, fails the probe) and must answer
    /// within `redis.timeout_ms` (so a Redis too slow for decisions fails it too).
    pub async fn probe(&self) -> Result<(), Error> {
        if self.clustered {
            self.client.sync_cluster().await?;
        }
        self.load_scripts().await?;
        let params = Params::TokenBucket(token_bucket::Params::shared(1000, 1000.0, 1));
        let key = Key::from(self.key("__probe__:__probe__", &params));
        let decision = self.decide(key, &params, 1);
        match tokio::time::timeout(self.timeout, decision).await {
            Ok(result) => result.map(drop),
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "probe decision slower than redis.timeout_ms ({:?})",
                    self.timeout
                ),
            )),
        }
    }

    /// [`RedisStore::probe`] bounded by the probe timeout.
    pub async fn probe_bounded(&self) -> Result<(), String> {
        match tokio::time::timeout(self.probe_timeout, self.probe()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.probe_timeout)),
        }
    }

    /// Opens `circuit` as soon as fred reports a connection error (a connection dropped
    /// by Redis or the network, a failed reconnect), so decisions go local at once
    /// instead of each waiting `redis.timeout_ms` while fred reconnects; the prober
    /// closes it again when Redis answers. Runs until the client is dropped.
    pub fn trip_on_connection_errors(&self, circuit: Arc<Circuit>) {
        // The listener task ends by itself when the client goes away.
        drop(self.client.on_error(move |(error, server)| {
            let circuit = Arc::clone(&circuit);
            async move {
                let at = server.map_or_else(|| "Redis".to_owned(), |s| s.to_string());
                crate::metrics::connection_error();
                circuit.trip(&format_args!("connection to {at} failed: {error}"));
                Ok(())
            }
        }));
    }

    /// Forever: whenever `circuit` is open, probe Redis every [`PROBE_INTERVAL`] and
    /// close the circuit when a probe succeeds.
    pub async fn run_prober(self: Arc<Self>, circuit: Arc<Circuit>) {
        loop {
            circuit.wait_open().await;
            let mut last_error = String::new();
            while circuit.is_open() {
                tokio::time::sleep(PROBE_INTERVAL).await;
                match self.probe_bounded().await {
                    Ok(()) => circuit.close(),
                    Err(e) => {
                        if e != last_error {
                            tracing::debug!(error = %e, "Redis probe failed");
                            last_error = e;
                        }
                    }
                }
            }
        }
    }
}

/// True when `error` means Redis cannot decide at all (down, unreachable, timing out,
/// failing over, out of memory, loading, read-only, script cache gone): the circuit
/// opens. False for errors tied to one request or key (`WRONGTYPE` on a foreign key, a
/// script runtime error, a malformed reply): that request is decided without Redis but
/// the others keep going to Redis.
pub fn is_unavailable(error: &Error) -> bool {
    match error.kind() {
        ErrorKind::InvalidArgument | ErrorKind::Parse => false,
        ErrorKind::Unknown => {
            // Redis 5 and 6 wrap an error raised inside a script as `ERR Error running
            // script … -OOM …`: look inside for the ones that mean Redis cannot decide.
            let details = error.details();
            !details.starts_with("ERR")
                || [
                    "-OOM",
                    "-READONLY",
                    "-LOADING",
                    "-MASTERDOWN",
                    "-CLUSTERDOWN",
                    "-BUSY",
                ]
                .iter()
                .any(|p| details.contains(p))
        }
        _ => true,
    }
}

/// A short label for the kind of an error that opens the circuit, for metrics (`io`,
/// `timeout`, `cluster`, `oom`, `busy`, `noscript`, `loading`, `readonly`, `redis`, …).
pub fn error_kind(error: &Error) -> &'static str {
    let details = error.details();
    match error.kind() {
        ErrorKind::IO => "io",
        ErrorKind::Timeout => "timeout",
        ErrorKind::Cluster => "cluster",
        ErrorKind::Canceled => "canceled",
        ErrorKind::Backpressure => "backpressure",
        ErrorKind::Routing => "routing",
        _ if details.starts_with("OOM") || details.contains("-OOM") => "oom",
        _ if details.starts_with("BUSY") => "busy",
        _ if details.starts_with("NOSCRIPT") => "noscript",
        _ if details.starts_with("LOADING") => "loading",
        _ if details.starts_with("READONLY") => "readonly",
        _ => "redis",
    }
}

/// A script argument from an integer-valued double (a count of µ-units or µs), sent as
/// an integer; a fractional one (a shared limit) as a double.
fn whole(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9e15 {
        Value::Integer(x as i64)
    } else {
        Value::Double(x)
    }
}

/// `limit`, `window` (µs) and `cost` of the window scripts.
fn window_args(w: &crate::algorithm::WindowParams, cost: u32) -> Vec<Value> {
    vec![
        whole(w.limit),
        whole(w.window),
        Value::Integer(i64::from(cost)),
    ]
}

fn outcome(reply: &[i64]) -> Result<Outcome, Error> {
    match *reply {
        [allowed, remaining, reset_ms, wait_ms] => Ok(Outcome {
            allowed: allowed == 1,
            remaining: remaining.max(0) as u64,
            reset_ms: reset_ms.max(0) as u64,
            wait_ms: wait_ms.max(0) as u64,
        }),
        _ => Err(Error::new(
            ErrorKind::Parse,
            format!("script returned {reply:?}, expected 4 integers"),
        )),
    }
}
