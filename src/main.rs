//! The `ratelimitd` daemon: `ratelimitd --config <path>` (see `--help`).

use clap::Parser;
use ratelimitd::circuit::Circuit;
use ratelimitd::config::{Config, FallbackConfig, RedisMode};
use ratelimitd::limiter::Limiter;
use ratelimitd::server::{self, ConnectionLimits};
use ratelimitd::store::redis::RedisStore;
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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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
    let (redis, circuit) = start_redis(&config).await?;
    let limiter = Arc::new(Limiter::new(&config, redis, circuit));
    let socket = config.server.socket.clone();
    let listener = server::bind(&socket, config.server.socket_mode).map_err(|e| e.to_string())?;
    tracing::info!(
        socket = %socket.display(),
        rules = config.rules.len(),
        "ratelimitd serving"
    );

    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(handle_signals(
        signals,
        config_path,
        config.clone(),
        Arc::clone(&limiter),
        shutdown.clone(),
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
    if let Err(e) = std::fs::remove_file(&socket) {
        tracing::warn!(socket = %socket.display(), error = %e, "could not remove the socket file");
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
    match result {
        Ok(()) => {
            tracing::info!(mode = ?config.redis.mode, %nodes, "connected to Redis; scripts loaded on every primary")
        }
        Err(e) => tracing::warn!(
            mode = ?config.redis.mode, %nodes, error = %e,
            "Redis unreachable at start: serving from local buckets (per on_redis_failure) and probing Redis in the background"
        ),
    }
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
) {
    loop {
        tokio::select! {
            _ = signals.term.recv() => { tracing::info!("SIGTERM: finishing in-flight requests and stopping"); break }
            _ = signals.int.recv() => { tracing::info!("SIGINT: finishing in-flight requests and stopping"); break }
            _ = signals.hup.recv() => current = reload(&config_path, current, &limiter),
        }
    }
    shutdown.cancel();
}

/// Re-reads the config; applies the rules, reports settings that need a restart.
fn reload(path: &Path, current: Config, limiter: &Limiter) -> Config {
    let new = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("SIGHUP: new configuration rejected, the old one stays in force: {e}");
            return current;
        }
    };
    for (changed, what) in [
        (new.server != current.server, "[server]"),
        (new.redis != current.redis, "[redis]"),
        (new.cache != current.cache, "[cache]"),
        (
            new.fallback.max_keys != current.fallback.max_keys,
            "fallback.max_keys",
        ),
    ] {
        if changed {
            tracing::warn!(
                "SIGHUP: {what} changed; it applies after a restart (the running value stays)"
            );
        }
    }
    limiter.replace_rules(new.rules.clone());
    tracing::info!(rules = new.rules.len(), "SIGHUP: configuration reloaded");
    // fallback.hosts reaches the rules through their fallback_hosts; max_keys needs a restart.
    let fallback = FallbackConfig {
        hosts: new.fallback.hosts,
        max_keys: current.fallback.max_keys,
    };
    Config {
        rules: new.rules,
        fallback,
        ..current
    }
}
