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

use super::connection_errors::ConnectionErrors;
use super::credentials::Credentials;
use super::health::Circuit;
use super::scripts::{self, Scripts};
use super::tls::{Tls, TlsFiles};
use super::{StoreError, StoreKey};
use crate::algorithm::{token_bucket, Outcome, Params};
use crate::config::{parse_node, RedisConfig, RedisMode};
use fred::prelude::*;
use fred::types::config::{CredentialProvider, UnresponsiveConfig};
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
    /// The TLS material (`redis.tls`), re-read by [`RedisStore::reload_secrets`].
    tls: Option<Tls>,
    /// Whose credentials the client sends (read at every connection).
    credentials: Credentials,
    /// Why connecting failed lately, logged once per cause.
    connection_errors: Arc<ConnectionErrors>,
    /// A hash of the secret files' contents when last read: a reload reconnects only
    /// when it changed.
    secrets_seen: std::sync::Mutex<u64>,
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
        let tls = cfg
            .tls
            .then(|| Tls::new(&tls_files(cfg)))
            .transpose()
            .map_err(StoreError::Config)?;
        let credentials = credentials(cfg)?;
        let config = Config {
            server: servers(cfg, tls.as_ref().and_then(Tls::server_name))?,
            // Keep trying to connect in the background; never fail a caller on connect.
            fail_fast: false,
            // Asked before every AUTH/HELLO: a rotated password file applies at the next
            // connection, and the password never sits in fred's config (or its Debug).
            credential_provider: credentials
                .any()
                .then(|| Arc::new(credentials.clone()) as Arc<dyn CredentialProvider>),
            tls: tls
                .as_ref()
                .map(Tls::fred_config)
                .transpose()
                .map_err(StoreError::Config)?,
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
            tls,
            credentials,
            connection_errors: Arc::new(ConnectionErrors::default()),
            secrets_seen: std::sync::Mutex::new(secrets_fingerprint(cfg)),
        })
    }

    /// Starts fred's connection task (reconnecting forever in the background) and
    /// the listener that logs why connections fail, once per cause.
    pub fn connect(&self) {
        let errors = Arc::clone(&self.connection_errors);
        // The listener task ends by itself when the client goes away.
        drop(self.client.on_error(move |(error, server)| {
            let errors = Arc::clone(&errors);
            async move {
                let at = server.map_or_else(|| "Redis".to_owned(), |s| s.to_string());
                errors.record(&error, &at);
                Ok(())
            }
        }));
        // The task runs until the client quits; its result only reports why it ended.
        drop(self.client.connect());
    }

    /// Why the last connection attempt failed, if one did.
    pub fn last_connection_error(&self) -> Option<String> {
        self.connection_errors.last()
    }

    /// Warnings about the secrets' files to log at start-up and on reload (a password
    /// file other users can read).
    ///
    /// # Errors
    /// A password file that cannot be read, named with its field and path.
    pub fn check_secrets(&self) -> Result<Vec<String>, StoreError> {
        self.credentials.check().map_err(StoreError::Config)
    }

    /// On reload (SIGHUP): reads the password files, the CA and the client certificate
    /// again and reconnects, so that a fixed password or certificate applies without a
    /// restart (the paths themselves are fixed until a restart). Returns warnings to
    /// log.
    ///
    /// # Errors
    /// A file that cannot be read or used; the material in force stays as it was.
    pub async fn reload_secrets(&self, cfg: &RedisConfig) -> Result<Vec<String>, StoreError> {
        let warnings = self.check_secrets()?;
        if let Some(tls) = &self.tls {
            tls.reload(&tls_files(cfg)).map_err(StoreError::Config)?;
        }
        // Only when a file changed: a reconnect fails the decisions in flight on the old
        // connections, and fixes made on Redis' side need none (fred keeps retrying).
        let now = secrets_fingerprint(cfg);
        let mut seen = self.secrets_seen.lock().unwrap_or_else(|p| p.into_inner());
        if *seen != now {
            *seen = now;
            // In the background; a failure shows as a connection error (which opens the
            // circuit and names the cause), never as a reload error.
            let client = self.client.clone();
            tokio::spawn(async move { drop(client.force_reconnection().await) });
        }
        Ok(warnings)
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

/// The fred server settings of `cfg`: seed nodes (cluster), the one node (standalone)
/// or the sentinels (sentinel). With `tls_server_name`, the seeds' certificates are
/// checked against that name (nodes learnt later get it from [`Tls::fred_config`]).
fn servers(cfg: &RedisConfig, tls_name: Option<&str>) -> Result<ServerConfig, StoreError> {
    let parse = |field: &str, nodes: &[String]| {
        nodes
            .iter()
            .map(|node| {
                let (host, port) = parse_node(node)
                    .ok_or_else(|| StoreError::Config(format!("{field}: bad node '{node}'")))?;
                let mut server = Server::new(host, port);
                server.tls_server_name = tls_name.map(Into::into);
                Ok(server)
            })
            .collect::<Result<Vec<_>, StoreError>>()
    };
    let mut hosts = parse("redis.nodes", cfg.nodes.get_ref())?;
    match cfg.mode {
        RedisMode::Cluster => Ok(ServerConfig::Clustered {
            hosts,
            policy: Default::default(),
        }),
        RedisMode::Standalone if hosts.len() == 1 => Ok(ServerConfig::Centralized {
            server: hosts.remove(0),
        }),
        RedisMode::Sentinel => Ok(ServerConfig::Sentinel {
            hosts: parse("redis.sentinels", &cfg.sentinels)?,
            service_name: cfg.service_name.clone().unwrap_or_default(),
        }),
        _ => Err(StoreError::Config(
            "redis.mode needs one node (standalone), seed nodes (cluster) or sentinels".into(),
        )),
    }
}

/// A hash of the contents of every secret file `cfg` names (password files, CA, client
/// certificate and key); an unreadable file hashes as empty. Never logged.
fn secrets_fingerprint(cfg: &RedisConfig) -> u64 {
    use std::hash::{Hash, Hasher};
    let password = Credentials::resolve_password_file(cfg.password_file.as_deref());
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for path in [
        &password,
        &cfg.sentinel_password_file,
        &cfg.tls_ca_file,
        &cfg.tls_cert_file,
        &cfg.tls_key_file,
    ]
    .into_iter()
    .flatten()
    {
        std::fs::read(path).unwrap_or_default().hash(&mut hasher);
    }
    hasher.finish()
}

/// The TLS files and name of `cfg`.
fn tls_files(cfg: &RedisConfig) -> TlsFiles {
    TlsFiles {
        ca: cfg.tls_ca_file.clone(),
        cert: cfg.tls_cert_file.clone(),
        key: cfg.tls_key_file.clone(),
        server_name: cfg.tls_server_name.clone(),
    }
}

/// The credentials of `cfg`, the password file resolved (config, then the systemd
/// credential), read once so that a missing file is reported now.
fn credentials(cfg: &RedisConfig) -> Result<Credentials, StoreError> {
    let sentinels = cfg
        .sentinels
        .iter()
        .filter_map(|n| parse_node(n).map(|(h, p)| (h.to_owned(), p)))
        .collect();
    let credentials = Credentials {
        username: cfg.username.clone(),
        password_file: Credentials::resolve_password_file(cfg.password_file.as_deref()),
        sentinel_username: cfg.sentinel_username.clone(),
        sentinel_password_file: cfg.sentinel_password_file.clone(),
        sentinels,
    };
    credentials.check().map_err(StoreError::Config)?;
    Ok(credentials)
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
