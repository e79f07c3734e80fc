//! The Redis client: runs the algorithms' Lua scripts (`lua/`, one per algorithm) with
//! EVALSHA in Redis Cluster or a standalone Redis, through fred, one connection per
//! primary ([`super::topology`]).
//!
//! * A decision goes to the primary owning its key's slot, unless that primary's
//!   breaker is open ([`super::health`]); it is bounded by `redis.timeout_ms`, and a
//!   timeout this process caused by being late ([`super::lateness`]) is not counted
//!   against the primary: the decision waits up to one more `timeout_ms` for Redis's
//!   answer instead (so the local share is not admitted on top of what Redis granted).
//! * Scripts are loaded on a primary by its probes (at start-up and while it is
//!   open) and re-loaded on `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`)
//!   before one retry, by one caller for all the decisions in flight.
//! * Cluster mode: the slot map is asked of a primary that answers (`CLUSTER SLOTS`)
//!   every second, every [`PROBE_INTERVAL`](super::health::PROBE_INTERVAL) while a primary is open, and at once on a
//!   `MOVED` or an `ASK` that could not be followed; a key that an `ASK` sends to the
//!   new owner of a migrating slot is decided there when it can be ([`ask`]).
//! * Nothing queues for an unreachable primary: decisions for its keys are not sent
//!   while its breaker is open, and a probe is not sent while its connection is down.

use super::connect::{connection_settings, credentials, secrets_fingerprint, servers, tls_files};
use super::connection_errors::ConnectionErrors;
use super::credentials::Credentials;
use super::health::Circuit;
use super::lateness::Lateness;
use super::scripts::Scripts;
use super::tls::Tls;
use super::topology::{self, Primary, Topology};
use super::{StoreError, StoreKey};
use crate::algorithm::token_bucket;
use crate::config::{RedisConfig, RedisMode};
use arc_swap::ArcSwap;
use fred::prelude::*;
use fred::types::config::CredentialProvider;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

mod ask;
mod calls;
mod decide;
mod probe;
mod tier;
mod together;
pub(super) mod unsettled;

/// Delay between reconnection attempts, ms.
pub const RECONNECT_DELAY_MS: u32 = 100;

/// How often the slot map is refreshed while every primary answers.
pub(super) const SLOT_MAP_INTERVAL: Duration = Duration::from_secs(1);

/// Bound of one `CLUSTER SLOTS`.
pub(super) const SLOT_MAP_TIMEOUT: Duration = Duration::from_millis(500);

/// Connections to every primary plus the loaded scripts.
pub struct RedisStore {
    pub(super) topology: ArcSwap<Topology>,
    /// Cluster seeds (`host`, client): asked for the slot map when no primary answers.
    pub(super) seeds: Vec<(String, Client)>,
    /// What every client is built from (credentials, TLS); each gets its own server.
    pub(super) base: Config,
    /// The TLS material (`redis.tls`), re-read by [`RedisStore::reload_secrets`].
    pub(super) tls: Option<Tls>,
    /// Whose credentials the clients send (read at every connection).
    pub(super) credentials: Credentials,
    /// Why connecting failed lately, logged once per cause.
    pub(super) connection_errors: Arc<ConnectionErrors>,
    /// A hash of the secret files' contents when last read: a reload reconnects only
    /// when it changed.
    pub(super) secrets_seen: std::sync::Mutex<u64>,
    pub(super) scripts: Scripts,
    pub(super) prefix: String,
    pub(super) clustered: bool,
    /// The per-decision bound (`redis.timeout_ms`).
    pub(super) timeout: Duration,
    pub(super) probe_timeout: Duration,
    pub(super) circuit: Arc<Circuit>,
    pub(super) lateness: Arc<Lateness>,
    pub(super) slot_map_wanted: Notify,
    pub(super) slot_map_lock: tokio::sync::Mutex<()>,
    /// Redis Cluster: the slots whose keys skip the batches for a while.
    pub(super) unsettled: unsettled::Unsettled,
    /// The expiry walks this daemon runs after reloads ([`super::expiry_walk`]).
    pub(super) walks: super::expiry_walk::Walks,
    /// This daemon's id in the walk elections (and the lease holder its walks name).
    pub(super) holder: Arc<str>,
}

impl RedisStore {
    /// Builds the clients for `cfg` (`mode` must be `cluster` or `standalone`); `circuit`
    /// is the daemon-wide view of the primaries' breakers. Does not connect: see
    /// [`RedisStore::start`].
    ///
    /// # Errors
    /// A node that is not `host:port`, a mode of `none`, or settings fred refuses.
    pub fn new(cfg: &RedisConfig, circuit: Arc<Circuit>) -> Result<Self, StoreError> {
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
        let base = Config {
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
        let servers = servers(cfg, tls.as_ref().and_then(Tls::server_name))?;
        let clustered = cfg.mode == RedisMode::Cluster;
        let mut store = RedisStore {
            topology: ArcSwap::from_pointee(Topology::empty()),
            seeds: Vec::new(),
            base,
            tls,
            credentials,
            connection_errors: Arc::new(ConnectionErrors::default()),
            secrets_seen: std::sync::Mutex::new(secrets_fingerprint(cfg)),
            scripts: Scripts::new(clustered),
            prefix: cfg.prefix.clone(),
            clustered,
            timeout,
            probe_timeout,
            circuit,
            lateness: Arc::new(Lateness::new(timeout)),
            slot_map_wanted: Notify::new(),
            slot_map_lock: tokio::sync::Mutex::new(()),
            unsettled: unsettled::Unsettled::new(),
            walks: super::expiry_walk::Walks::default(),
            holder: walker_id().into(),
        };
        match servers {
            ServerConfig::Clustered { hosts, .. } => {
                for server in hosts {
                    let host = server.host.to_string();
                    let client = store.client(ServerConfig::Centralized { server })?;
                    store.seeds.push((host, client));
                }
            }
            // Standalone, or Sentinel (fred follows the sentinels' primary): one primary
            // owning every slot.
            single => {
                let name = match &single {
                    ServerConfig::Centralized { server } => server.to_string(),
                    _ => format!("sentinel:{}", cfg.service_name.clone().unwrap_or_default()),
                };
                let client = store.client(single)?;
                let primary = store.primary_on(client, name, "__probe__:__probe__".into(), true);
                store.topology.store(Arc::new(Topology::single(primary)));
            }
        }
        Ok(store)
    }

    /// Connects (in the background, reconnecting forever) and starts the lateness
    /// ticker, the probers and (cluster mode) the slot-map refresher.
    pub fn start(self: &Arc<Self>) {
        let lateness = Arc::clone(&self.lateness);
        tokio::spawn(async move { lateness.run().await });
        for (_, seed) in &self.seeds {
            self.record_errors(seed);
            drop(seed.connect());
        }
        for primary in &self.topology.load().primaries {
            self.run_primary(primary);
        }
        if self.clustered {
            let store = Arc::clone(self);
            tokio::spawn(async move { store.refresher().await });
        }
    }

    /// Each primary known now (`host:port`) and whether its breaker is open (its keys
    /// decided without Redis), in slot-map order: the dashboard's health panel.
    pub fn primaries(&self) -> Vec<(String, bool)> {
        self.topology
            .load()
            .primaries
            .iter()
            .map(|p| (p.name().to_owned(), p.health.is_open()))
            .collect()
    }

    /// The event-loop lag ticker's view.
    pub fn lateness(&self) -> &Lateness {
        &self.lateness
    }

    /// A client for `server` (one node, or the sentinels) with the daemon's settings.
    fn client(&self, server: ServerConfig) -> Result<Client, StoreError> {
        let timeout = self.timeout;
        let config = Config {
            server,
            ..self.base.clone()
        };
        Builder::from_config(config)
            .with_performance_config(|perf| {
                perf.default_command_timeout = Duration::from_secs(1).max(timeout * 2);
            })
            .with_connection_config(|conn| connection_settings(conn, timeout))
            .set_policy(ReconnectPolicy::new_constant(0, RECONNECT_DELAY_MS))
            .build()
            .map_err(|e| StoreError::Config(e.to_string()))
    }

    /// Logs why `client`'s connections fail, once per cause.
    fn record_errors(&self, client: &Client) {
        let errors = Arc::clone(&self.connection_errors);
        // The listener task ends by itself when the client goes away.
        drop(client.on_error(move |(error, server)| {
            let errors = Arc::clone(&errors);
            async move {
                let at = server.map_or_else(|| "Redis".to_owned(), |s| s.to_string());
                errors.record(&error, &at);
                Ok(())
            }
        }));
    }

    /// A primary on `client`, named `name`, probed through `probe_tag`.
    fn primary_on(
        &self,
        client: Client,
        name: String,
        probe_tag: String,
        open: bool,
    ) -> Arc<Primary> {
        Arc::new(topology::primary(
            client,
            name,
            probe_tag,
            open,
            self.timeout,
            &self.circuit,
        ))
    }

    /// A new primary `host:port` owning slots `first..=last` (its probe key is found in
    /// them); `open` until a probe answers.
    pub(super) fn primary(
        &self,
        host: &str,
        port: u16,
        first: u16,
        last: u16,
        open: bool,
    ) -> Result<Arc<Primary>, StoreError> {
        let server = Server {
            host: host.into(),
            port,
            ..self.seed_like(host)
        };
        let client = self.client(ServerConfig::Centralized { server })?;
        let suffix = token_bucket::SPEC.suffix;
        let tag = topology::probe_tag_for(&self.prefix, suffix, |s| first <= s && s <= last)
            .unwrap_or_else(|| "__probe__:__probe__".into());
        Ok(self.primary_on(client, format!("{host}:{port}"), tag, open))
    }

    /// Server settings for a node learnt from the cluster (TLS name as the seeds').
    fn seed_like(&self, host: &str) -> Server {
        let mut server = Server::new(host, 0);
        server.tls_server_name = self.tls.as_ref().and_then(Tls::server_name).map(Into::into);
        server
    }

    /// Connects `primary`, opens its breaker on connection errors, and runs its prober
    /// and its batches' sender.
    pub(super) fn run_primary(self: &Arc<Self>, primary: &Arc<Primary>) {
        primary
            .batch
            .start(Arc::downgrade(self), Arc::downgrade(primary), self.timeout);
        primary
            .batch_all
            .start(Arc::downgrade(self), Arc::downgrade(primary), self.timeout);
        self.record_errors(&primary.client);
        drop(primary.client.connect());
        let p = Arc::clone(primary);
        // The listener ends by itself when the client goes away.
        drop(primary.client.on_error(move |(error, _)| {
            let p = Arc::clone(&p);
            async move {
                if !p.retired.load(Ordering::Relaxed) {
                    crate::metrics::connection_error();
                    p.health
                        .open(&format_args!("connection to {} failed: {error}", p.name()));
                }
                Ok(())
            }
        }));
        let store = Arc::clone(self);
        let p = Arc::clone(primary);
        tokio::spawn(async move { store.prober(p).await });
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
    /// again and reconnects every client, so that a fixed password or certificate
    /// applies without a restart (the paths themselves are fixed until a restart).
    /// Returns warnings to log.
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
            // A cause still there after the fix is said again.
            self.connection_errors.forget();
            // In the background; a failure shows as a connection error (which opens that
            // primary's breaker and names the cause), never as a reload error.
            let clients: Vec<Client> = self
                .topology
                .load()
                .primaries
                .iter()
                .map(|p| p.client.clone())
                .chain(self.seeds.iter().map(|(_, c)| c.clone()))
                .collect();
            tokio::spawn(async move {
                for client in clients {
                    drop(client.force_reconnection().await);
                }
            });
        }
        Ok(warnings)
    }

    /// The primary owning `key`'s slot, if known.
    pub fn owner(&self, key: &StoreKey) -> Option<Arc<Primary>> {
        self.topology.load().owner(key.0.as_bytes()).cloned()
    }
}

/// This process's id in the expiry walks' elections: `walk:<host>:<pid>:<start µs>`,
/// unique across restarts.
fn walker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    format!(
        "walk:{host}:{}:{:.0}",
        std::process::id(),
        crate::clock::wall_clock_us()
    )
}
