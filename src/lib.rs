//! ratelimitd: a per-host rate-limit sidecar.
//!
//! Applications ask over a Unix socket, with a one-line protocol, whether a key may do
//! something now (`CHECK rides_request user:42` → `ALLOW 20 19 100 0 redis`). The
//! daemon decides atomically in Redis (Cluster) with Lua scripts run by EVALSHA,
//! remembers recent denials in a deny cache, and falls back to conservative local
//! buckets when Redis is unreachable. The external interface is `CONTRACT.md`;
//! `docs/` explains the design.
//!
//! Modules, one concern each:
//! * [`protocol`]: line framing, request parsing, reply encoding (pure);
//! * [`config`]: the TOML configuration and its validation;
//! * [`algorithm`]: the algorithms as pure functions (Lua twins in `lua/`);
//! * [`store`]: the Redis client;
//! * [`cache`]: the deny cache;
//! * [`circuit`]: the Redis circuit breaker;
//! * [`fallback`]: local buckets, fail-open, fail-closed;
//! * [`limiter`]: the decision flow tying those together;
//! * [`metrics`]: Prometheus metrics (opt-in);
//! * [`server`]: the socket, connections, shutdown;
//! * [`systemd`]: socket activation, `sd_notify` readiness, status and watchdog.

pub mod algorithm;
pub mod cache;
pub mod circuit;
pub mod config;
pub mod fallback;
pub mod limiter;
pub mod metrics;
pub mod protocol;
pub mod server;
pub mod store;
pub mod systemd;
