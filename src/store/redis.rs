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
//!   every second, every [`PROBE_INTERVAL`] while a primary is open, and at once on a
//!   redirection (`MOVED`, `ASK`).
//! * Nothing queues for an unreachable primary: decisions for its keys are not sent
//!   while its breaker is open, and a probe is not sent while its connection is down.

use super::connection_errors::ConnectionErrors;
use super::credentials::Credentials;
use super::health::{Circuit, PROBE_INTERVAL};
use super::lateness::{mono_us, Lateness};
use super::scripts::{self, Scripts};
use super::tls::{Tls, TlsFiles};
use super::topology::{self, Primary, Topology};
use super::{StoreError, StoreKey};
use crate::algorithm::{token_bucket, Outcome, Params};
use crate::config::{parse_node, RedisConfig, RedisMode};
use arc_swap::ArcSwap;
use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use fred::types::config::{CredentialProvider, UnresponsiveConfig};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Delay between reconnection attempts, ms.
pub const RECONNECT_DELAY_MS: u32 = 100;

/// How often the slot map is refreshed while every primary answers.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Bound of one `CLUSTER SLOTS`.
const REFRESH_TIMEOUT: Duration = Duration::from_millis(500);

/// The commands fred may hold for one primary (they only wait there while it is
/// reachable: see the module comment).
const COMMAND_BUFFER: usize = 16_384;

/// Connections to every primary plus the loaded scripts.
pub struct RedisStore {
    topology: ArcSwap<Topology>,
    /// Cluster seeds (`host`, client): asked for the slot map when no primary answers.
    seeds: Vec<(String, Client)>,
    /// What every client is built from (credentials, TLS); each gets its own server.
    base: Config,
    /// The TLS material (`redis.tls`), re-read by [`RedisStore::reload_secrets`].
    tls: Option<Tls>,
    /// Whose credentials the clients send (read at every connection).
    credentials: Credentials,
    /// Why connecting failed lately, logged once per cause.
    connection_errors: Arc<ConnectionErrors>,
    /// A hash of the secret files' contents when last read: a reload reconnects only
    /// when it changed.
    secrets_seen: std::sync::Mutex<u64>,
    scripts: Scripts,
    prefix: String,
    clustered: bool,
    /// The per-decision bound (`redis.timeout_ms`).
    timeout: Duration,
    probe_timeout: Duration,
    circuit: Arc<Circuit>,
    lateness: Arc<Lateness>,
    refresh_wanted: Notify,
    refresh_lock: tokio::sync::Mutex<()>,
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
            scripts: Scripts::new(),
            prefix: cfg.prefix.clone(),
            clustered,
            timeout,
            probe_timeout,
            circuit,
            lateness: Arc::new(Lateness::new(timeout)),
            refresh_wanted: Notify::new(),
            refresh_lock: tokio::sync::Mutex::new(()),
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
    fn primary(
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

    /// Connects `primary`, opens its breaker on connection errors, and runs its prober.
    fn run_primary(self: &Arc<Self>, primary: &Arc<Primary>) {
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

    /// The Redis key of `tag` (`"<rule>:<key>"`) under `params`' algorithm
    /// ([`scripts::key`]), built once per request.
    pub fn key(&self, tag: &str, params: &Params) -> StoreKey {
        StoreKey(Key::from(scripts::key(&self.prefix, tag, params)))
    }

    /// The primary owning `key`'s slot, if known.
    pub fn route(&self, key: &StoreKey) -> Option<Arc<Primary>> {
        self.topology.load().owner(key.0.as_bytes()).cloned()
    }

    /// Waits for `call` (a [`RedisStore::decide`] on `primary`) at most
    /// `redis.timeout_ms`, and tells the primary's breaker how it went. A timeout caused
    /// by this process's own lateness waits once more (up to another `timeout_ms`) for
    /// Redis's answer and is not counted against the primary. On a timeout `call` is
    /// still running: its owner decides whether it runs to its end.
    ///
    /// # Errors
    /// What Redis or the connection reported, a timeout, a redirection (the slot moved:
    /// decided locally, the map is refreshed), or a malformed script reply.
    pub async fn bounded<F>(&self, primary: &Primary, call: &mut F) -> Result<Outcome, StoreError>
    where
        F: Future<Output = Result<Outcome, Error>> + Unpin,
    {
        let mut waited_from = mono_us();
        let mut excused = false;
        let answer = loop {
            match tokio::time::timeout(self.timeout, &mut *call).await {
                Ok(answer) => break Some(answer),
                // This process was late, not Redis: once, give Redis's answer (maybe
                // already in the socket) the time it would have had.
                Err(_) if !excused && self.lateness.excuses(waited_from, self.timeout) => {
                    excused = true;
                    tracing::debug!("a Redis call outlived redis.timeout_ms while this process was late: waiting for its answer");
                    waited_from = mono_us();
                }
                Err(_) => break None,
            }
        };
        match answer {
            Some(Ok(outcome)) => {
                primary.health.succeeded();
                Ok(outcome)
            }
            Some(Err(e)) if is_redirect(&e) => {
                self.refresh_wanted.notify_one();
                Err(StoreError::Key(e))
            }
            Some(Err(e)) => {
                let e = StoreError::from_redis(e);
                if let StoreError::Unavailable { .. } = e {
                    primary.health.failed(&e);
                }
                Err(e)
            }
            None => {
                let why = format!(
                    "no answer within redis.timeout_ms = {}",
                    self.timeout.as_millis()
                );
                if !self.lateness.late_since(waited_from) {
                    primary.health.failed(&why);
                }
                Err(StoreError::timeout(why))
            }
        }
    }

    /// Decides `cost` units for `key` on `primary` (its owner, [`RedisStore::route`])
    /// with EVALSHA of `params`' script, unbounded; [`RedisStore::bounded`] bounds it.
    /// Re-loads the scripts on `NOSCRIPT` (one caller for all) and retries.
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed script reply.
    pub async fn decide(
        &self,
        primary: &Primary,
        key: &StoreKey,
        params: &Params,
        cost: u32,
    ) -> Result<Outcome, Error> {
        let mut generation = primary.reloads.load(Ordering::Acquire);
        let mut reloads = 0;
        loop {
            let script = self.scripts.of(params.kind());
            let args = scripts::args(params, cost);
            let reply: Result<Vec<i64>, Error> =
                script.evalsha(&primary.client, key.0.clone(), args).await;
            match reply {
                // Flushed, restarted or failed over: one caller reloads for all. At most
                // twice: a flush may come right after someone else's reload.
                Err(e) if reloads < 2 && e.details().starts_with("NOSCRIPT") => {
                    self.reload_scripts(primary, generation).await?;
                    generation = primary.reloads.load(Ordering::Acquire);
                    reloads += 1;
                }
                reply => return scripts::outcome(&reply?),
            }
        }
    }

    /// Loads the scripts on `primary` again after a `NOSCRIPT`, unless another decision
    /// already did since `seen` (the reload generation it read before its EVALSHA).
    async fn reload_scripts(&self, primary: &Primary, seen: u64) -> Result<(), Error> {
        let _one_at_a_time = primary.reload_lock.lock().await;
        if primary.reloads.load(Ordering::Acquire) == seen {
            self.load_scripts(&primary.client).await?;
            primary.reloads.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    /// Loads every script on one node.
    async fn load_scripts(&self, client: &Client) -> Result<(), Error> {
        for script in self.scripts.all() {
            script.load(client).await?;
        }
        Ok(())
    }

    /// One health check of `primary`: load the scripts, then take one token from its
    /// probe bucket (a key in its own slots). That last step writes (so a primary
    /// refusing writes, e.g. out of memory, fails the probe) and must answer within
    /// `redis.timeout_ms` (so one too slow for decisions fails it too). Not sent at all
    /// while its connection is down (nothing queues in the client); bounded by the probe
    /// timeout.
    ///
    /// # Errors
    /// Not connected, no answer in time, or what Redis answered.
    pub async fn probe(&self, primary: &Primary) -> Result<(), StoreError> {
        if !primary.client.is_connected() {
            return Err(StoreError::timeout(format!(
                "not connected to {}",
                primary.name()
            )));
        }
        let check = async {
            self.load_scripts(&primary.client).await?;
            let params = Params::TokenBucket(token_bucket::Params::shared(1000, 1000.0, 1));
            let key = self.key(&primary.probe_tag, &params);
            let decision = self.decide(primary, &key, &params, 1);
            match tokio::time::timeout(self.timeout, decision).await {
                Ok(result) => result.map(drop),
                Err(_) => Err(Error::new(
                    ErrorKind::Timeout,
                    format!("probe slower than redis.timeout_ms ({:?})", self.timeout),
                )),
            }
        };
        match tokio::time::timeout(self.probe_timeout, check).await {
            Ok(result) => result.map_err(StoreError::from_redis),
            Err(_) => Err(StoreError::timeout(format!(
                "no answer within {:?}",
                self.probe_timeout
            ))),
        }
    }

    /// Forever (until `primary` is retired): whenever its breaker is open, probe it
    /// every [`PROBE_INTERVAL`], one probe at a time, and close the breaker when one
    /// answers. A failure is logged (at debug level) when it differs from the last.
    async fn prober(&self, primary: Arc<Primary>) {
        // A primary that starts open (start-up) is probed at once, once connected.
        let mut wait = Duration::from_millis(20);
        loop {
            primary.health.wait_open().await;
            let mut last_error = String::new();
            while primary.health.is_open() {
                tokio::time::sleep(wait).await;
                wait = PROBE_INTERVAL;
                if primary.retired.load(Ordering::Relaxed) {
                    return;
                }
                match self.probe(&primary).await {
                    Ok(()) => primary.health.close(),
                    Err(e) => {
                        let e = e.to_string();
                        if e != last_error {
                            tracing::debug!(primary = primary.name(), error = %e, "Redis probe failed");
                            last_error = e;
                        }
                    }
                }
            }
            if primary.retired.load(Ordering::Relaxed) {
                return;
            }
        }
    }

    /// Forever: refresh the slot map every [`REFRESH_INTERVAL`], every
    /// [`PROBE_INTERVAL`] while a primary is open or none is known, and at once when a
    /// decision met a redirection.
    async fn refresher(self: Arc<Self>) {
        loop {
            if let Err(e) = self.refresh().await {
                tracing::debug!(error = %e, "Redis Cluster slot map not refreshed");
            }
            let wait = if self.topology.load().primaries.is_empty() {
                // Start-up: the seeds are still connecting.
                Duration::from_millis(20)
            } else if self.circuit.open_primaries() > 0 {
                PROBE_INTERVAL
            } else {
                REFRESH_INTERVAL
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.refresh_wanted.notified() => {}
            }
        }
    }

    /// Asks a primary that answers (else a seed) for the slot map and puts it in force
    /// if it changed: new primaries get a connection and a prober, primaries that own
    /// no slot any more are retired.
    ///
    /// # Errors
    /// No node answered `CLUSTER SLOTS` in time.
    pub async fn refresh(self: &Arc<Self>) -> Result<(), StoreError> {
        let _one_at_a_time = self.refresh_lock.lock().await;
        let current = self.topology.load_full();
        let mut askers: Vec<(String, Client)> = current
            .primaries
            .iter()
            .filter(|p| !p.health.is_open() && p.client.is_connected())
            .map(|p| (host_of(p.name()), p.client.clone()))
            .collect();
        askers.extend(
            self.seeds
                .iter()
                .filter(|(_, c)| c.is_connected())
                .map(|(h, c)| (h.clone(), c.clone())),
        );
        let mut last = StoreError::timeout("no Redis node connected".into());
        for (host, client) in askers {
            let slots = tokio::time::timeout(REFRESH_TIMEOUT, client.cluster_slots::<Value>());
            let routing = match slots.await {
                Ok(Ok(value)) => ClusterRouting::from_cluster_slots(value, host.as_str()),
                Ok(Err(e)) => Err(e),
                Err(_) => {
                    last = StoreError::timeout(format!(
                        "CLUSTER SLOTS: no answer within {REFRESH_TIMEOUT:?}"
                    ));
                    continue;
                }
            };
            match routing {
                Ok(r) if r.slots().is_empty() => {}
                Ok(routing) => return self.put_in_force(&current, &routing),
                Err(e) => last = StoreError::from_redis(e),
            }
        }
        Err(last)
    }

    /// Puts `routing` in force if it differs from `current`.
    fn put_in_force(
        self: &Arc<Self>,
        current: &Topology,
        routing: &ClusterRouting,
    ) -> Result<(), StoreError> {
        let new_map = Topology::signature(routing);
        let old_map: Vec<(u16, u16, String)> = current.ranges();
        if new_map == old_map {
            return Ok(());
        }
        // The first map's primaries are probed before use (scripts loaded); later ones
        // start closed (a failover's promoted replica takes decisions at once, and
        // `NOSCRIPT` loads the scripts there).
        let first = current.primaries.is_empty();
        let mut made = Vec::new();
        let mut error = None;
        let next = current.rebuild(routing, |host, port, a, b| {
            match self.primary(host, port, a, b, first) {
                Ok(p) => {
                    made.push(Arc::clone(&p));
                    p
                }
                Err(e) => {
                    error.get_or_insert(e);
                    // Unreachable in practice (same settings as the seeds'); keep going
                    // with a primary that is never connected: its keys go local.
                    Arc::new(topology::primary(
                        Client::default(),
                        format!("{host}:{port}"),
                        String::new(),
                        true,
                        self.timeout,
                        &self.circuit,
                    ))
                }
            }
        });
        let retired: Vec<Arc<Primary>> = current
            .primaries
            .iter()
            .filter(|p| next.find(p.name()).is_none())
            .cloned()
            .collect();
        tracing::info!(
            primaries = %next.primaries.iter().map(|p| p.name()).collect::<Vec<_>>().join(","),
            "Redis Cluster slot map in force"
        );
        self.topology.store(Arc::new(next));
        for p in &made {
            self.run_primary(p);
        }
        for p in retired {
            p.retired.store(true, Ordering::Relaxed);
            p.health.retire();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), p.client.quit()).await;
            });
        }
        error.map_or(Ok(()), Err)
    }
}

/// The host part of `host:port`.
fn host_of(name: &str) -> String {
    name.rsplit_once(':').map_or(name, |(h, _)| h).to_owned()
}

/// True for a cluster redirection (`MOVED`, `ASK`): the slot lives elsewhere now.
fn is_redirect(e: &Error) -> bool {
    let d = e.details();
    d.starts_with("MOVED ") || d.starts_with("ASK ") || d.contains("CLUSTERDOWN")
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
    // Bound what may queue in the client (a backpressure error beyond it).
    conn.max_command_buffer_len = COMMAND_BUFFER;
}
