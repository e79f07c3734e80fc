//! The integration tests, one module per subject, in one test binary (one link of the
//! crate instead of one per file). Each module's own `//!` says what it covers. Tests
//! that need a process of their own are elsewhere: `tests/serial/` (tests that measure
//! and must run beside no other), `tests/alloc.rs` (a counting global allocator),
//! `tests/clock_step.rs` (sets `LD_PRELOAD` in the process environment) and `chaos/`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../reference/mod.rs"]
mod reference;
#[path = "../secure_redis/mod.rs"]
#[macro_use] // plain_and_tls!, in the modules below
mod secure_redis;

mod algorithms;
mod batch;
mod bounded;
mod cluster;
mod cluster_batch;
mod cluster_batch_moves;
mod cluster_slots;
mod config_doc;
mod connections_per_uid;
mod envoy_compat;
mod envoy_listen;
mod eviction;
mod garbage;
mod harness;
mod local;
mod metrics;
mod module_graph;
mod permissions;
mod production_redis;
mod redis_refusals;
mod reload_algorithm;
mod saved_hosts;
mod socket;
mod standalone;
mod state;
mod systemd;
mod twins;
