//! The daemon's life: start-up (runtime, metrics, Redis, socket, the optional Envoy
//! front end), signals ([`crate::signals`]), and a graceful shutdown.
//!
//! Everything the process does between parsing its command line and exiting; `main.rs`
//! only parses the CLI, sets up logging and calls [`run`].

use crate::config::{Config, OnRedisFailure, RedisMode};
use crate::envoy::limits::Shared as EnvoyLimits;
use crate::limiter::Limiter;
use crate::metrics;
use crate::server::{self, BindError, ConnectionLimits};
use crate::signals::{self, Reloader, Signals};
use crate::store::health::Circuit;
use crate::store::{RedisStore, StoreError};
use crate::systemd::{self, ActivationError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

mod heartbeat;
mod socket;

use heartbeat::start_heartbeat;
use socket::Socket;

/// How long start-up waits for Redis before serving from local buckets.
const STARTUP_REDIS_WAIT: Duration = Duration::from_millis(1500);
/// How long shutdown waits for connections to finish their replies.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why the daemon could not start (after start-up, nothing stops it but a signal).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The tokio runtime could not be built.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    /// The signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// The socket systemd passed is unusable.
    #[error(transparent)]
    Activation(#[from] ActivationError),
    /// The metrics endpoint could not be set up.
    #[error(transparent)]
    Metrics(#[from] metrics::InstallError),
    /// The Redis client could not be built from `[redis]`.
    #[error("redis: {0}")]
    Store(#[from] StoreError),
    /// The socket could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
}

/// Runs the daemon with `config` (read from `config_path`, re-read on SIGHUP) until
/// SIGTERM or SIGINT. Builds the runtime: one worker thread is a current-thread runtime
/// (no work-stealing machinery to pay for); more, the multi-thread scheduler.
pub fn run(
    config_path: PathBuf,
    config: Config,
    envoy: Option<EnvoyLimits>,
) -> Result<(), StartError> {
    let threads = config.server.worker_threads();
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    let runtime = builder.enable_all().build().map_err(StartError::Runtime)?;
    runtime.block_on(serve(config_path, config, envoy))
}

async fn serve(
    config_path: PathBuf,
    config: Config,
    envoy_limits: Option<EnvoyLimits>,
) -> Result<(), StartError> {
    // Installed first, so a signal during start-up is handled, not fatal.
    let signals = Signals::install().map_err(StartError::Signals)?;
    // Socket activation (systemd/ratelimitd.socket): serve the socket systemd passed.
    let activated = systemd::activated_listener()?;
    let http = start_metrics(&config)?;
    warn_about_small_shares(&config);
    raise_nofile(&config);
    systemd::notify_status("starting: connecting to Redis");
    let (store, circuit) = start_redis(&config).await?;
    let limiter = Arc::new(Limiter::new(&config, store.clone()));
    let envoy_auto = envoy_limits.as_ref().is_some_and(|l| l.any_fallback_auto());
    let mut tasks = Background::start(&config, http, envoy_auto, &store, &circuit, &limiter).await;
    let (listener, socket) = Socket::open(&config, activated)?;
    let status = announce_ready(&config, &socket, circuit);
    tasks.supervisor = supervise(&status);
    let shutdown = CancellationToken::new();
    let envoy = crate::envoy::start(&config, envoy_limits, &limiter, shutdown.clone()).await?;
    let (rls, envoy_server) = envoy.unzip();
    tasks.envoy = envoy_server;
    let reloader = Reloader {
        path: config_path,
        current: config.clone(),
        limiter: Arc::clone(&limiter),
        store,
        envoy: rls,
        status,
    };
    let signals = tokio::spawn(signals::handle(signals, reloader, shutdown.clone()));
    let limits = ConnectionLimits::from(&config.server);
    serve_until_stopped(
        server::serve(listener, limiter, limits, shutdown.clone()),
        &shutdown,
    )
    .await;
    signals.abort();
    tasks.stop().await;
    socket.remove();
    tracing::info!("ratelimitd stopped");
    Ok(())
}

/// The tasks that run beside the server until shutdown, each optional.
struct Background {
    /// Keeps this daemon's share of the fleet known ([`start_heartbeat`]).
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    /// Samples the limiter's sizes for the metrics (with `[http] listen`).
    sampler: Option<tokio::task::JoinHandle<()>>,
    /// Tells systemd's watchdog the daemon is alive.
    supervisor: Option<tokio::task::JoinHandle<()>>,
    /// The Envoy front end's server (with `[envoy] listen`), stopping since shutdown.
    envoy: Option<tokio::task::JoinHandle<()>>,
}

impl Background {
    /// The heartbeat ([`start_heartbeat`]; `envoy_auto`: an Envoy limit counts the fleet)
    /// and, with `[http] listen` (`http`), the endpoint and its sampler ([`start_http`]).
    async fn start(
        config: &Config,
        http: Option<(tokio::net::TcpListener, metrics::PrometheusHandle)>,
        envoy_auto: bool,
        store: &Option<Arc<RedisStore>>,
        circuit: &Arc<Circuit>,
        limiter: &Arc<Limiter>,
    ) -> Background {
        Background {
            heartbeat: start_heartbeat(config, envoy_auto, store.as_ref(), circuit, limiter).await,
            sampler: start_http(config, http, limiter, store),
            supervisor: None,
            envoy: None,
        }
    }

    /// Waits up to [`SHUTDOWN_GRACE`] for the Envoy front end (its calls in flight finish,
    /// bounded by `redis.timeout_ms`, then it removes its socket file), and stops every
    /// other task.
    async fn stop(self) {
        if let Some(server) = self.envoy {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, server).await;
        }
        for task in [self.supervisor, self.sampler, self.heartbeat]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
    }
}

/// With `[http] listen` (`http` bound by [`start_metrics`]): serves the endpoint (and the
/// rule lab when `[http] lab`), and returns the task that samples the limiter's sizes.
fn start_http(
    config: &Config,
    http: Option<(tokio::net::TcpListener, metrics::PrometheusHandle)>,
    limiter: &Arc<Limiter>,
    store: &Option<Arc<RedisStore>>,
) -> Option<tokio::task::JoinHandle<()>> {
    let sampler = config.http.listen.map(|_| {
        let limiter = Arc::clone(limiter);
        tokio::spawn(metrics::sample_sizes(move || limiter.sizes()))
    });
    if let Some((listener, handle)) = http {
        let lab = config.http.lab.then(|| crate::http::lab::Lab::new(config));
        let state = crate::http::State::new(
            &config.http,
            handle,
            Arc::clone(limiter),
            store.clone(),
            lab,
        );
        tokio::spawn(crate::http::serve(
            listener,
            Arc::new(state),
            config.http.max_connections,
        ));
    }
    sampler
}

/// Under systemd (`NOTIFY_SOCKET`): the task that keeps its status line and watchdog fed.
fn supervise(status: &Arc<systemd::Status>) -> Option<tokio::task::JoinHandle<()>> {
    systemd::notify_enabled().then(|| {
        tokio::spawn(systemd::supervise(
            Arc::clone(status),
            systemd::watchdog_interval(),
        ))
    })
}

/// Tells systemd the daemon is ready (its status line: Redis mode, socket, rules,
/// circuit), and returns that status for later updates.
fn announce_ready(config: &Config, socket: &Socket, circuit: Arc<Circuit>) -> Arc<systemd::Status> {
    let status = Arc::new(systemd::Status::new(
        config.redis.mode,
        socket.served.as_deref(),
        socket.activated,
        config.rules.len(),
        circuit,
    ));
    systemd::notify_ready(&status.line());
    status
}

/// When `[http] listen` is set: binds the HTTP endpoint and installs the metrics
/// recorder (before any rule registers its counters); the endpoint is served once the
/// limiter exists.
fn start_metrics(
    config: &Config,
) -> Result<Option<(tokio::net::TcpListener, metrics::PrometheusHandle)>, StartError> {
    let Some(listen) = config.http.listen else {
        return Ok(None);
    };
    let listener = crate::http::bind(listen)
        .map_err(|e| metrics::InstallError::new(format!("http.listen = {listen}: {e}")))?;
    let handle = metrics::install()?;
    if !listen.ip().is_loopback() {
        tracing::warn!(%listen, "http.listen is not a loopback address; the endpoint (metrics, dashboard{}) has no authentication", if config.http.lab { ", lab" } else { "" });
    }
    if config.metrics.listen.is_some() {
        tracing::info!("[metrics] listen is the older name of [http] listen; both work");
    }
    tracing::info!(%listen, lab = config.http.lab, "serving Prometheus metrics at /metrics and the dashboard at /");
    Ok(Some((listener, handle)))
}

/// Runs `serving` until it ends or `shutdown` is cancelled; then gives the open
/// connections [`SHUTDOWN_GRACE`] to finish their replies.
async fn serve_until_stopped(
    serving: impl std::future::Future<Output = ()>,
    shutdown: &CancellationToken,
) {
    tokio::pin!(serving);
    tokio::select! {
        () = &mut serving => {}
        () = shutdown.cancelled() => {
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut serving).await.is_err() {
                tracing::warn!("connections still open after {SHUTDOWN_GRACE:?}; closing them");
            }
        }
    }
}

/// Raises `RLIMIT_NOFILE` to its hard limit and warns if the configured connections
/// would not fit in it.
fn raise_nofile(config: &Config) {
    let metrics = config
        .http
        .listen
        .map_or(0, |_| config.http.max_connections);
    let needed = crate::rlimit::needed(config.server.max_connections, metrics);
    match crate::rlimit::raise_nofile() {
        Ok(n) if n.now < needed => tracing::warn!(
            limit = n.now, needed,
            "RLIMIT_NOFILE is below what server.max_connections needs: raise the hard limit (LimitNOFILE= in the unit) or lower server.max_connections"
        ),
        Ok(n) => tracing::info!(limit = n.now, raised_from = n.before, "RLIMIT_NOFILE"),
        Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE to its hard limit"),
    }
}

/// Warns about rules whose local share is below one unit: with Redis unreachable they
/// deny everything.
fn warn_about_small_shares(config: &Config) {
    for rule in config.rules.values() {
        if config.redis.mode != RedisMode::None
            && rule.on_redis_failure == OnRedisFailure::Local
            && !rule.fallback_params.can_ever_pass(1)
        {
            tracing::warn!(
                rule = %rule.name,
                limit = rule.limit(),
                hosts = rule.fallback_hosts,
                "this rule's share of its limit per host is below 1 unit: while Redis is unreachable it denies every request locally (raise the limit or lower fallback_hosts, or set on_redis_failure)"
            );
        }
    }
}

/// Builds the Redis store (unless `mode = "none"`), waits briefly for it, and starts the
/// background prober. The circuit starts closed only if Redis answered.
async fn start_redis(
    config: &Config,
) -> Result<(Option<Arc<RedisStore>>, Arc<Circuit>), StartError> {
    if config.redis.mode == RedisMode::None {
        tracing::info!(
            "redis.mode = none: every decision is made by local buckets with the full limits"
        );
        return Ok((None, Arc::new(Circuit::new(true))));
    }
    let circuit = Arc::new(Circuit::new(true));
    let store = Arc::new(RedisStore::new(&config.redis, Arc::clone(&circuit))?);
    for warning in store.check_secrets()? {
        tracing::warn!("{warning}");
    }
    store.start();
    // Every primary is probed (scripts loaded) before it takes decisions.
    let deadline = Instant::now() + STARTUP_REDIS_WAIT;
    while circuit.is_open() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let nodes = config.redis.nodes.get_ref().join(",");
    if circuit.is_open() {
        circuit.warned_at_start();
        metrics::circuit(true);
        // The cause, when there is one, was logged once already ("cannot use Redis: …").
        let said = if store.last_connection_error().is_some() {
            " (the cause is in the \"cannot use Redis\" line above)"
        } else {
            ""
        };
        tracing::warn!(
            mode = ?config.redis.mode, %nodes, open_primaries = circuit.open_primaries(),
            "Redis unreachable at start (or some of its primaries){said}: deciding their keys locally (per on_redis_failure) and probing in the background"
        );
    } else {
        tracing::info!(mode = ?config.redis.mode, %nodes, "connected to Redis; scripts loaded on every primary");
    }
    Ok((Some(store), circuit))
}
