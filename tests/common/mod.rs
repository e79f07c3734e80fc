#![allow(dead_code)]
//! Integration-test harness shared by the files in `tests/` (`mod common;`).
//!
//! Blocking std code only. Everything listens on 127.0.0.1 or on Unix sockets
//! in a `TempDir`; ports are picked free at run time. Every process started
//! here is owned by a value whose `Drop` kills it by pid (SIGKILL) and reaps
//! it, so a panicking test leaves nothing behind. On Linux each child also
//! gets `PR_SET_PDEATHSIG = SIGKILL` tied to a harness thread that lives as
//! long as the test process, so even values that are never dropped (a cluster
//! in a `static`) or a test binary killed from outside leave no servers behind.
//!
//! Binaries: `redis-server` and `redis-cli` from `PATH`; `valkey-server` and
//! `valkey-cli` with `RATELIMITD_TEST_SERVER=valkey`; either overridable with the
//! `REDIS_SERVER` / `REDIS_CLI` environment variables (`process::redis_server_bin`).

//! One file per kind of helper:
//! * [`process`]: waiting, free ports, temp dirs, children that die with the test;
//! * [`redis_client`]: the RESP2 client, `redis-cli`, a server's command counts;
//! * [`redis`]: one redis-server, a standalone Redis;
//! * [`cluster`]: a Redis Cluster and its faults;
//! * [`daemon`]: the daemon under test and its metrics endpoint;
//! * [`client`]: the line-protocol client and CHECK replies;
//! * [`envoy`]: the Envoy Rate Limit Service's gRPC client and descriptors;
//! * [`clock_shim`]: a library that moves a Redis's clock.

pub mod client;
pub mod clock_shim;
pub mod cluster;
pub mod daemon;
pub mod envoy;
pub mod process;
pub mod redis;
pub mod redis_client;

// Every test file uses its own subset of these.
#[allow(unused_imports)]
pub use {client::*, cluster::*, daemon::*, envoy::*, process::*, redis::*, redis_client::*};
