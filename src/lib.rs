//! ratelimitd: a per-host rate-limit sidecar.
//!
//! Applications ask over a Unix socket, with a one-line protocol, whether a key may do
//! something now (`CHECK rides_request user:42` → `ALLOW 20 19 100 0 redis 2000`). The
//! daemon decides atomically in Redis (Cluster) with Lua scripts run by EVALSHA,
//! remembers recent denials in a deny cache, and falls back to conservative local
//! buckets when Redis is unreachable. `docs/PROTOCOL.md` is the wire protocol,
//! `docs/CONFIGURATION.md` the configuration, `docs/FAILURES.md` the failure behaviour;
//! `docs/DESIGN.md` maps the modules and walks one request through them.
//!
//! Modules, one concern each (shared types first, then from the wire inwards):
//! * [`decision`], [`key`], [`clock`], [`log_every`]: what every layer shares;
//! * [`admission`]: peers, uid/gid lists, the cap on requests in flight to Redis;
//! * [`protocol`]: line framing, request parsing, reply encoding (pure);
//! * [`config`]: the TOML configuration, its validation, what a reload changes;
//! * [`algorithm`]: the algorithms as pure functions and their table (Lua twins in `lua/`);
//! * [`limiter`]: the decision flow: deny cache → lease → store → local, asking the store
//!   through one interface ([`store::Store`]);
//! * [`lease`]: token leases of hot keys (`lease = "auto"`), their per-key state;
//! * [`hot_keys`]: each rule's hottest keys over the last minute (`TOP`), bounded;
//! * [`cache`]: the deny cache; [`fallback`]: local buckets, fail-open, fail-closed;
//!   [`saved_hosts`]: the count of daemons alive, kept across restarts;
//! * [`store`]: the store interface and its Redis implementation (client, scripts,
//!   routing, health, batching);
//! * [`server`]: the socket, connections, dispatch of a line to the limiter;
//! * [`envoy`]: the Envoy Rate Limit Service (gRPC) front end and its YAML limits;
//! * [`metrics`]: Prometheus metrics (opt-in), served by [`metrics_http`];
//! * [`daemon`]: start-up, shutdown; [`signals`]: SIGTERM, SIGHUP and the reload; [`rlimit`]: the descriptor budget; [`systemd`]: notify, watchdog,
//!   socket activation.

// The docs are read with `cargo doc --document-private-items`: one module per concern,
// and a module's doc may name the private parts it is made of.
#![allow(rustdoc::private_intra_doc_links)]

pub mod admission;
pub mod algorithm;
pub mod cache;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod decision;
pub mod envoy;
pub mod fallback;
pub mod hot_keys;
pub mod key;
pub mod lease;
pub mod limiter;
pub mod log_every;
pub mod metrics;
pub mod metrics_http;
pub mod protocol;
pub mod rlimit;
pub mod saved_hosts;
pub mod server;
pub mod signals;
pub mod state_map;
pub mod store;
pub mod systemd;
