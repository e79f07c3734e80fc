//! The Envoy Rate Limit Service front end (docs/ENVOY.md): `ShouldRateLimit` of
//! `envoy.service.ratelimit.v3.RateLimitService` over gRPC, beside the line protocol,
//! with envoyproxy/ratelimit's YAML configuration.
//!
//! * [`yaml`]: a YAML document as a tree with lines, duplicate keys rejected;
//! * [`load`]: the YAML files and `[[envoy.descriptor]]` into [`limits::Limits`]
//!   (`file`: one YAML file's fields);
//! * [`limits`]: the descriptor tree, its matching, rule names and keys;
//! * [`service`]: `ShouldRateLimit`, a request into its response (`response`: a
//!   descriptor's status, the IETF headers);
//! * [`metrics`]: counts by domain and descriptor;
//! * [`server`]: the tonic gRPC server on TCP or a Unix socket;
//!
//! Each matched limit is decided by the limiter like any rule (deny cache, per-primary
//! health, Redis within `redis.timeout_ms`, local fallback): this module knows the
//! RLS protocol, not how a decision is made.

mod file;
pub mod limits;
pub mod load;
pub mod metrics;
mod response;
pub mod server;
pub mod service;
pub mod yaml;

use crate::admission::{InFlight, InFlightLimits};
use crate::config::Config;
use crate::limiter::Limiter;
use crate::server::BindError;
use service::Rls;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Starts the front end if `[envoy]` sets `listen` (or, without it, limits: then on its
/// Unix socket beside `server.socket`; a TCP address is warned about at start, as any
/// local process can reach it): binds it, and serves until
/// `shutdown` on a task of its own. Returns the service (the reload gives it new
/// limits) and the task. Its requests to Redis have their own bound,
/// `server.redis_max_in_flight` (past it, decisions are made without Redis).
///
/// # Errors
/// The address or socket cannot be bound.
pub async fn start(
    config: &Config,
    limits: Option<limits::Shared>,
    limiter: &Arc<Limiter>,
    shutdown: CancellationToken,
) -> Result<Option<(Arc<Rls>, JoinHandle<()>)>, BindError> {
    let Some(listen) = &config.envoy.listen else {
        return Ok(None);
    };
    if config.http.listen.is_some() {
        metrics::describe();
    }
    let limits = limits.unwrap_or_default();
    let bound = server::Bound::bind(listen, config.server.socket_mode).await?;
    let total = config.server.redis_max_in_flight;
    let peer = InFlight::new(InFlightLimits {
        total,
        per_uid: total,
    })
    .peer(u32::MAX, u32::MAX);
    if limits.all.is_empty() {
        tracing::warn!(%listen, "envoy.listen is set but no limit is configured (envoy.config_dir, [[envoy.descriptor]]): every descriptor is answered OK");
    }
    let local = bound.local_addr().map(|a| a.to_string());
    if let Some(addr) = bound.local_addr() {
        tracing::warn!(
            %listen,
            "the Envoy front end listens on TCP {addr}: any local process can spend budgets through it; prefer unix:/path"
        );
    }
    tracing::info!(
        %listen, bound = local.as_deref().unwrap_or(""),
        domains = limits.domains.len(), limits = limits.all.len(),
        "serving the Envoy Rate Limit Service (gRPC)"
    );
    let rls = Arc::new(Rls::new(Arc::clone(limiter), limits, peer));
    let task = tokio::spawn(server::serve(bound, Arc::clone(&rls), shutdown));
    Ok(Some((rls, task)))
}
