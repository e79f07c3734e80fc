//! Signals: SIGTERM and SIGINT stop the daemon gracefully; SIGHUP reloads the
//! configuration (TOML rules and the Envoy limits together, or nothing), then the Redis
//! secrets. A bad new configuration is logged and the one in force stays. A rule the
//! reload makes keep its state longer has its keys in Redis walked
//! ([`crate::store::expiry_walk`]).

use crate::config::{diff, Config};
use crate::envoy::service::Rls;
use crate::limiter::Limiter;
use crate::metrics;
use crate::store::RedisStore;
use crate::systemd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// The signals the daemon handles, registered (so their default action no longer
/// applies) before anything slow happens.
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    /// Registers the handlers.
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// What a SIGHUP reload applies the new configuration to.
pub struct Reloader {
    /// The configuration file.
    pub path: PathBuf,
    /// The configuration in force.
    pub current: Config,
    /// Takes the new rules.
    pub limiter: Arc<Limiter>,
    /// Takes the new secrets (`None` in `redis.mode = "none"`).
    pub store: Option<Arc<RedisStore>>,
    /// Takes the new Envoy limits (`None` without `[envoy] listen`).
    pub envoy: Option<Arc<Rls>>,
    /// The status line systemd shows.
    pub status: Arc<systemd::Status>,
}

/// SIGTERM/SIGINT: graceful stop (cancels `shutdown`). SIGHUP: reload through
/// `reloader`.
pub async fn handle(mut signals: Signals, mut reloader: Reloader, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = signals.term.recv() => { tracing::info!("SIGTERM: finishing in-flight requests and stopping"); break }
            _ = signals.int.recv() => { tracing::info!("SIGINT: finishing in-flight requests and stopping"); break }
            _ = signals.hup.recv() => reloader.reload().await,
        }
    }
    systemd::notify_stopping();
    shutdown.cancel();
}

impl Reloader {
    async fn reload(&mut self) {
        systemd::notify_reloading();
        let error = match reload(
            &self.path,
            &self.current,
            &self.limiter,
            self.envoy.as_deref(),
        ) {
            Ok(applied) => {
                // The new rules are in force: a rule that now keeps its state longer has
                // its keys' expiries lengthened in Redis, on a task of its own.
                if let Some(store) = &self.store {
                    store.walk_after_reload(&self.current.rules, &applied.rules);
                }
                self.current = applied;
                None
            }
            Err(e) => Some(e),
        };
        if let Some(store) = &self.store {
            reload_secrets(store, &self.current).await;
        }
        metrics::reload(error.is_none());
        self.status.reloaded(self.current.rules.len(), error);
        systemd::notify_ready(&self.status.line());
    }
}

/// Re-reads the config (TOML and Envoy YAML); applies the rules and the Envoy limits,
/// reports settings that need a restart. A new configuration that changes a rule's
/// algorithm is rejected whole ([`diff::refused`]). Returns the configuration now in force, or why
/// the files were rejected (nothing applied).
fn reload(
    path: &Path,
    current: &Config,
    limiter: &Limiter,
    envoy: Option<&Rls>,
) -> Result<Config, String> {
    let rejected = |e: String| {
        tracing::error!("SIGHUP: new configuration rejected, the old one stays in force: {e}");
        e
    };
    let new = Config::load(path).map_err(|e| rejected(e.to_string()))?;
    if let Some(why) = diff::refused(current, &new) {
        return Err(rejected(format!("{}: {why}", path.display())));
    }
    let limits = crate::envoy::load::limits_for(&new).map_err(|e| rejected(e.to_string()))?;
    for what in diff::needs_restart(current, &new) {
        tracing::warn!(
            "SIGHUP: {what} changed; it needs a restart to apply (the running value stays)"
        );
    }
    limiter.replace_rules(new.rules.clone());
    if let (Some(rls), Some(limits)) = (envoy, limits) {
        rls.replace(Arc::clone(&limits));
        tracing::info!(
            domains = limits.domains.len(),
            limits = limits.all.len(),
            "SIGHUP: Envoy limits reloaded"
        );
    }
    tracing::info!(rules = new.rules.len(), "SIGHUP: configuration reloaded");
    Ok(diff::applied(current.clone(), new))
}

/// Re-reads the Redis password and TLS files and reconnects, so a fixed password or
/// certificate applies without a restart; a file that cannot be used is logged and the
/// material in force stays.
async fn reload_secrets(store: &RedisStore, config: &Config) {
    match store.reload_secrets(&config.redis).await {
        Ok(warnings) => {
            for warning in warnings {
                tracing::warn!("SIGHUP: {warning}");
            }
        }
        Err(e) => tracing::error!(
            "SIGHUP: Redis credentials or certificates not reloaded, the old ones stay in force: {e}"
        ),
    }
}
