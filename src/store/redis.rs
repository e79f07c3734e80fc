//! The Redis client: runs the algorithms' Lua scripts (`lua/`, one per algorithm) with
//! EVALSHA in Redis Cluster or a standalone Redis, through fred.
//!
//! * Scripts are loaded on every primary (`SCRIPT LOAD` via fred's
//!   `script_load_cluster`) at start and by every probe, and re-loaded on `NOSCRIPT`
//!   (after a restart, a failover or `SCRIPT FLUSH`) before one retry, by one caller
//!   for all the decisions in flight.
//! * What is sent per algorithm (script, key, arguments, reply) is [`super::scripts`];
//!   when Redis may be asked at all is [`super::health`].
//! * fred pipelines concurrent commands on its connections by itself; callers simply
//!   run decisions concurrently.
//! * Time bounds: fred ignores per-command options on EVALSHA (fred issue #353), so the
//!   caller bounds each decision with `tokio::time::timeout`; fred's own
//!   `default_command_timeout` is a backstop that frees commands queued while Redis is
//!   away. fred's default reconnect policy is none: we set a constant one.

use super::health::Circuit;
use super::scripts::{self, Scripts};
use super::{StoreError, StoreKey};
use crate::algorithm::{token_bucket, Outcome, Params};
use crate::config::{parse_node, RedisConfig, RedisMode};
use fred::prelude::*;
use fred::types::config::UnresponsiveConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    /// A node that is not `host:port`, a mode of `none`, or settings fred refuses.
    pub fn new(cfg: &RedisConfig) -> Result<Self, StoreError> {
        let timeout = cfg.timeout();
        let probe_timeout = (timeout * 4)
            .clamp(Duration::from_millis(250), Duration::from_millis(700))
            .max(timeout + Duration::from_millis(100));
        let config = Config {
            server: servers(cfg)?,
            // Keep trying to connect in the background; never fail a caller on connect.
            fail_fast: false,
            ..Config::default()
        };
        let client = Builder::from_config(config)
            .with_performance_config(|perf| {
                perf.default_command_timeout = Duration::from_secs(1).max(timeout * 2);
            })
            .with_connection_config(|conn| connection_settings(conn, timeout))
            .set_policy(ReconnectPolicy::new_constant(0, RECONNECT_DELAY_MS))
            .build()
            .map_err(|e| StoreError::Config(e.to_string()))?;
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

    /// The Redis key of `tag` (`"<rule>:<key>"`) under `params`' algorithm
    /// ([`scripts::key`]), built once per request.
    pub fn key(&self, tag: &str, params: &Params) -> StoreKey {
        StoreKey(Key::from(scripts::key(&self.prefix, tag, params)))
    }

    /// Decides `cost` units for the Redis key `key` ([`RedisStore::key`] of the tag under
    /// `params`) with the script of `params`' algorithm, on the Redis clock. Re-loads the
    /// scripts on `NOSCRIPT` (one caller for all) and retries.
    ///
    /// # Errors
    /// Whatever Redis or the connection reports (down, OOM, cluster down, ...), or a
    /// malformed script reply.
    pub async fn decide(
        &self,
        key: &StoreKey,
        params: &Params,
        cost: u32,
    ) -> Result<Outcome, StoreError> {
        self.decide_raw(key, params, cost)
            .await
            .map_err(StoreError::from_redis)
    }

    /// [`RedisStore::decide`] with the client's own error.
    async fn decide_raw(
        &self,
        key: &StoreKey,
        params: &Params,
        cost: u32,
    ) -> Result<Outcome, Error> {
        let mut generation = self.reloads.load(Ordering::Acquire);
        let mut reloads = 0;
        loop {
            let script = self.scripts.of(params.kind());
            let args = scripts::args(params, cost);
            let reply: Result<Vec<i64>, Error> =
                script.evalsha(&self.client, key.0.clone(), args).await;
            match reply {
                // Flushed, restarted or failed over: one caller reloads for all. At most
                // twice: a flush may reach the primaries one after the other, so a
                // decision can meet NOSCRIPT again right after someone else's reload.
                Err(e) if reloads < 2 && e.details().starts_with("NOSCRIPT") => {
                    self.reload_scripts(generation).await?;
                    generation = self.reloads.load(Ordering::Acquire);
                    reloads += 1;
                }
                reply => return scripts::outcome(&reply?),
            }
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
        let key = self.key("__probe__:__probe__", &params);
        let decision = self.decide_raw(&key, &params, 1);
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
    pub async fn probe_bounded(&self) -> Result<(), StoreError> {
        match tokio::time::timeout(self.probe_timeout, self.probe()).await {
            Ok(result) => result.map_err(StoreError::from_redis),
            Err(_) => Err(StoreError::timeout(format!(
                "no answer within {:?}",
                self.probe_timeout
            ))),
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
}

/// The fred server settings of `cfg`: seed nodes (cluster) or the one node (standalone).
fn servers(cfg: &RedisConfig) -> Result<ServerConfig, StoreError> {
    let mut hosts = Vec::new();
    for node in cfg.nodes.get_ref() {
        let (host, port) = parse_node(node)
            .ok_or_else(|| StoreError::Config(format!("redis.nodes: bad node '{node}'")))?;
        hosts.push((host.to_owned(), port));
    }
    match cfg.mode {
        RedisMode::Cluster => Ok(ServerConfig::new_clustered(hosts)),
        RedisMode::Standalone if hosts.len() == 1 => {
            let (host, port) = hosts.remove(0);
            Ok(ServerConfig::new_centralized(host, port))
        }
        _ => Err(StoreError::Config(
            "redis.mode needs one node (standalone) or seed nodes (cluster)".into(),
        )),
    }
}

/// How fred's connections behave, for a decision bound of `timeout`.
fn connection_settings(conn: &mut ConnectionConfig, timeout: Duration) {
    conn.connection_timeout = Duration::from_millis(500);
    conn.internal_command_timeout = Duration::from_millis(500).max(timeout);
    // Never replay a decision on a new connection: it may have run already (its caller
    // has long been answered locally).
    conn.max_command_attempts = 1;
    // A frozen server (SIGSTOP, a long script) accepts bytes but never answers: drop
    // such connections and reconnect.
    conn.unresponsive = UnresponsiveConfig {
        max_timeout: Some(Duration::from_secs(2)),
        interval: Duration::from_millis(100),
    };
    // Bound what queues up while disconnected.
    conn.max_command_buffer_len = 100_000;
}
