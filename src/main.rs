//! The `ratelimitd` daemon: `ratelimitd --config <path>` (see `--help`).

use clap::Parser;
use ratelimitd::circuit::Circuit;
use ratelimitd::config::{Config, FallbackConfig, OnRedisFailure, RedisMode};
use ratelimitd::limiter::Limiter;
use ratelimitd::server::{self, ConnectionLimits};
use ratelimitd::store::redis::RedisStore;
use ratelimitd::systemd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Per-host rate-limit daemon: answers CHECK requests on a Unix socket, deciding in
/// Redis (Cluster) and falling back to local buckets when Redis is unreachable.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Configuration file (TOML).
    #[arg(long, short = 'c', value_name = "PATH")]
    config: PathBuf,
    /// Validate the configuration, print a summary and exit (0 valid, 2 invalid).
    #[arg(long)]
    check: bool,
}

/// How long start-up waits for Redis before serving from local buckets.
const STARTUP_REDIS_WAIT: Duration = Duration::from_millis(1500);
/// How long shutdown waits for connections to finish their replies.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,fred=error")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ratelimitd: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check {
        println!(
            "{}: OK ({} rules, redis.mode = {:?}, socket {})",
            cli.config.display(),
            config.rules.len(),
            config.redis.mode,
            config.server.socket.display()
        );
        return ExitCode::SUCCESS;
    }
    // One worker: a current-thread runtime (no work-stealing machinery to pay for);
    // more: the multi-thread scheduler.
    let threads = config.server.worker_threads();
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ratelimitd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.config, config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config_path: PathBuf, config: Config) -> Result<(), String> {
    // Installed first, so a signal during start-up is handled, not fatal.
    let signals = Signals::install().map_err(|e| format!("cannot install signal handlers: {e}"))?;
    // Socket activation (systemd/ratelimitd.socket): serve the socket systemd passed.
    let activated = systemd::activated_listener().map_err(|e| e.to_string())?;
    if let Some(listen) = config.metrics.listen {
        ratelimitd::metrics::install(listen)?;
        if !listen.ip().is_loopback() {
            tracing::warn!(%listen, "metrics.listen is not a loopback address; the endpoint has no authentication");
        }
        tracing::info!(%listen, "serving Prometheus metrics");
    }
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
    systemd::notify_status("starting: connecting to Redis");
    let (redis, circuit) = start_redis(&config).await?;
    let limiter = Arc::new(Limiter::new(&config, redis, Arc::clone(&circuit)));
    let sampler = config.metrics.listen.map(|_| {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(ratelimitd::metrics::sample_sizes(move || limiter.sizes()))
    });
    let socket = config.server.socket.clone();
    let (listener, served, is_activated) = match activated {
        Some((listener, path)) => {
            if path.as_deref() != Some(socket.as_path()) {
                tracing::warn!(
                    configured = %socket.display(), passed = ?path,
                    "server.socket differs from the socket systemd passed; serving the one systemd passed"
                );
            }
            (listener, path, true)
        }
        None => {
            let listener =
                server::bind(&socket, config.server.socket_mode).map_err(|e| e.to_string())?;
            (listener, Some(socket.clone()), false)
        }
    };
    tracing::info!(
        socket = %served.as_deref().unwrap_or(&socket).display(),
        socket_activated = is_activated,
        rules = config.rules.len(),
        "ratelimitd serving"
    );
    let status = Arc::new(systemd::Status::new(
        config.redis.mode,
        served.as_deref(),
        is_activated,
        config.rules.len(),
        circuit,
    ));
    systemd::notify_ready(&status.line());
    let supervisor = systemd::notify_enabled().then(|| {
        tokio::spawn(systemd::supervise(
            Arc::clone(&status),
            Arc::clone(&limiter),
            systemd::watchdog_interval(),
        ))
    });

    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(handle_signals(
        signals,
        config_path,
        config.clone(),
        Arc::clone(&limiter),
        shutdown.clone(),
        status,
    ));
    let limits = ConnectionLimits::from(&config.server);
    let serving = server::serve(listener, limiter, limits, shutdown.clone());
    tokio::pin!(serving);
    tokio::select! {
        () = &mut serving => {}
        () = shutdown.cancelled() => {
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut serving).await.is_err() {
                tracing::warn!("connections still open after {SHUTDOWN_GRACE:?}; closing them");
            }
        }
    }
    signals.abort();
    if let Some(supervisor) = supervisor {
        supervisor.abort();
    }
    if let Some(sampler) = sampler {
        sampler.abort();
    }
    // A socket passed by systemd is systemd's: it stays, listening for the next start.
    if !is_activated {
        if let Err(e) = std::fs::remove_file(&socket) {
            tracing::warn!(socket = %socket.display(), error = %e, "could not remove the socket file");
        }
    }
    tracing::info!("ratelimitd stopped");
    Ok(())
}

/// Builds the Redis store (unless `mode = "none"`), waits briefly for it, and starts the
/// background prober. The circuit starts closed only if Redis answered.
async fn start_redis(config: &Config) -> Result<(Option<Arc<RedisStore>>, Arc<Circuit>), String> {
    if config.redis.mode == RedisMode::None {
        tracing::info!(
            "redis.mode = none: every decision is made by local buckets with the full limits"
        );
        return Ok((None, Arc::new(Circuit::new(true))));
    }
    let store = Arc::new(RedisStore::new(&config.redis).map_err(|e| format!("redis: {e}"))?);
    store.connect();
    let deadline = Instant::now() + STARTUP_REDIS_WAIT;
    let mut result = store.probe_bounded().await;
    while result.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        result = store.probe_bounded().await;
    }
    let nodes = config.redis.nodes.get_ref().join(",");
    let circuit = Arc::new(Circuit::new(result.is_err()));
    if result.is_err() {
        ratelimitd::metrics::circuit(true);
    }
    match result {
        Ok(()) => {
            tracing::info!(mode = ?config.redis.mode, %nodes, "connected to Redis; scripts loaded on every primary")
        }
        Err(e) => tracing::warn!(
            mode = ?config.redis.mode, %nodes, error = %e,
            "Redis unreachable at start: serving from local buckets (per on_redis_failure) and probing Redis in the background"
        ),
    }
    store.trip_on_connection_errors(Arc::clone(&circuit));
    tokio::spawn(Arc::clone(&store).run_prober(Arc::clone(&circuit)));
    Ok((Some(store), circuit))
}

/// The signals the daemon handles, registered (so their default action no longer
/// applies) before anything slow happens.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// SIGTERM/SIGINT: graceful stop. SIGHUP: reload the rules from `config_path`; a bad
/// file is logged and the rules in force stay.
async fn handle_signals(
    mut signals: Signals,
    config_path: PathBuf,
    mut current: Config,
    limiter: Arc<Limiter>,
    shutdown: CancellationToken,
    status: Arc<systemd::Status>,
) {
    loop {
        tokio::select! {
            _ = signals.term.recv() => { tracing::info!("SIGTERM: finishing in-flight requests and stopping"); break }
            _ = signals.int.recv() => { tracing::info!("SIGINT: finishing in-flight requests and stopping"); break }
            _ = signals.hup.recv() => {
                systemd::notify_reloading();
                let error;
                (current, error) = reload(&config_path, current, &limiter);
                ratelimitd::metrics::reload(error.is_none());
                status.reloaded(current.rules.len(), error);
                systemd::notify_ready(&status.line());
            }
        }
    }
    systemd::notify_stopping();
    shutdown.cancel();
}

/// Re-reads the config; applies the rules, reports settings that need a restart. Returns
/// the configuration in force and, if the file was rejected, why.
fn reload(path: &Path, current: Config, limiter: &Limiter) -> (Config, Option<String>) {
    let new = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("SIGHUP: new configuration rejected, the old one stays in force: {e}");
            return (current, Some(e.to_string()));
        }
    };
    let (s, n, r, m) = (&current.server, &new.server, &current.redis, &new.redis);
    let mut reported: Vec<&str> = Vec::new();
    for (changed, what) in [
        (n.socket != s.socket, "server.socket"),
        (n.socket_mode != s.socket_mode, "server.socket_mode"),
        (
            n.max_line_bytes != s.max_line_bytes,
            "server.max_line_bytes",
        ),
        (n.max_in_flight != s.max_in_flight, "server.max_in_flight"),
        (n.allow_uids != s.allow_uids, "server.allow_uids"),
        (n.allow_gids != s.allow_gids, "server.allow_gids"),
        (
            n.max_connections != s.max_connections,
            "server.max_connections",
        ),
        (
            n.idle_timeout_ms != s.idle_timeout_ms,
            "server.idle_timeout_ms",
        ),
        (
            n.worker_threads != s.worker_threads,
            "server.worker_threads",
        ),
        (m.mode != r.mode, "redis.mode"),
        (m.nodes.get_ref() != r.nodes.get_ref(), "redis.nodes"),
        (m.timeout_ms != r.timeout_ms, "redis.timeout_ms"),
        (m.prefix != r.prefix, "redis.prefix"),
        (new.cache.ttl_ms != current.cache.ttl_ms, "cache.ttl_ms"),
        (
            new.cache.max_entries != current.cache.max_entries,
            "cache.max_entries",
        ),
        (
            new.fallback.max_keys != current.fallback.max_keys,
            "fallback.max_keys",
        ),
        (new.metrics != current.metrics, "metrics.listen"),
    ]
    .into_iter()
    // A field without a line above is still reported, by its section.
    .chain([
        (n != s, "[server]"),
        (m != r, "[redis]"),
        (new.cache != current.cache, "[cache]"),
    ]) {
        fn section(f: &str) -> &str {
            f.trim_matches(['[', ']']).split('.').next().unwrap_or("")
        }
        let already = what.starts_with('[') && reported.iter().any(|f| section(f) == section(what));
        if changed && !already {
            tracing::warn!(
                "SIGHUP: {what} changed; it needs a restart to apply (the running value stays)"
            );
            reported.push(what);
        }
    }
    limiter.replace_rules(new.rules.clone());
    tracing::info!(rules = new.rules.len(), "SIGHUP: configuration reloaded");
    // fallback.hosts reaches the rules through their fallback_hosts; max_keys needs a restart.
    let fallback = FallbackConfig {
        hosts: new.fallback.hosts,
        max_keys: current.fallback.max_keys,
    };
    let config = Config {
        rules: new.rules,
        fallback,
        ..current
    };
    (config, None)
}
