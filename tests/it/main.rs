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
mod batch_all;
mod bounded;
mod checkall;
mod cluster;
mod cluster_batch;
mod cluster_batch_all;
mod cluster_batch_leases;
mod cluster_batch_leases_moves;
mod cluster_batch_moves;
mod cluster_batch_slow;
mod cluster_slots;
mod composite;
mod concurrency;
mod config_doc;
mod connections_per_uid;
mod ctl;
mod dashboard;
mod envoy_compat;
mod envoy_listen;
mod envoy_strict;
mod eviction;
mod garbage;
mod give_backs_batched;
mod harness;
mod lab;
mod local;
mod metrics;
mod module_graph;
mod operator;
mod override_in_state;
mod override_leased;
mod override_migration;
mod overrides;
mod permissions;
mod primary_metrics;
mod production_redis;
mod redis_refusals;
mod refund;
mod reload_algorithm;
mod runtime_overrides;
mod saved_hosts;
mod shadow;
mod socket;
mod standalone;
mod state;
mod systemd;
mod twin_bucket_reload;
mod twin_lease_overrides;
mod twin_leases;
mod twin_leases_batched;
mod twin_leases_fixed;
mod twin_leases_reload;
mod twin_lua;
mod twin_slots;
mod twin_window_jump;
mod twins;
