//! The chaos suite: a real 6-node Redis Cluster on loopback, one or more
//! real daemons, sustained load from several client threads over the Unix socket, and
//! one fault injected mid-run per scenario (kill, freeze, fail over, flush, OOM, killed
//! connections, slow Redis, N daemons in an outage).
//!
//! Every scenario asserts, on what the clients saw (client-side timestamps):
//! * every request got exactly one reply, none of them `ERR`, and the daemon never
//!   exited or restarted;
//! * during the fault, reply latency p99 ≤ `redis.timeout_ms` + 5 ms and max ≤ 250 ms;
//! * sources switch to `local` / `fail_open` / `fail_closed` as each rule says, and are
//!   back to `redis` within 1 s of Redis answering again (as the test itself observes:
//!   3 primaries, each with `cluster_state:ok`, each accepting a write);
//! * admitted counts stay within the bounds of docs/FAILURES.md: per key, what Redis admitted
//!   ≤ capacity + refill × time (one more capacity per data loss), and per daemon what a
//!   local bucket admitted ≤ (capacity + refill × time) ÷ hosts;
//! * the daemon logs each transition (`circuit open`, `circuit closed`) once per fault.
//!
//! Each scenario writes `<name>.json` and a `<name>.row` table line to
//! `$CHAOS_REPORT_DIR` (default `target/chaos`) before asserting; `chaos/run.sh` runs
//! them all (`--ignored`, release build, one at a time) and prints the table. The tests
//! are `#[ignore]`d so that `cargo test --all-targets` does not run them twice.
//! See chaos/README.md.

#[path = "../tests/common/mod.rs"]
mod common;

mod admitted;
mod checks;
mod load;
mod report;
mod scenario;

mod degraded;
mod lost_state;
mod outages;
mod partial;
mod paused;

use admitted::*;
use checks::*;
use common::*;
use load::*;
use report::*;
use scenario::*;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `redis.timeout_ms` of every daemon.
pub(crate) const TIMEOUT_MS: u64 = 25;
/// Bound on the p99 reply latency during a fault: `timeout_ms` + 5 ms.
pub(crate) const P99_BOUND: Duration = Duration::from_millis(TIMEOUT_MS + 5);
/// Bound on the slowest reply during a fault.
pub(crate) const MAX_BOUND: Duration = Duration::from_millis(250);
/// Decisions must be back on Redis this soon after Redis answers again.
pub(crate) const RECOVERY_BOUND: Duration = Duration::from_secs(1);
/// Latency is judged on replies sent from a fault's start until this long after
/// Redis answers again.
pub(crate) const FAULT_TAIL: Duration = Duration::from_secs(1);
/// Load before the first fault (all decisions must come from Redis).
pub(crate) const WARMUP: Duration = Duration::from_millis(1200);
/// Load after Redis answers again (room to see the return and that it lasts).
pub(crate) const AFTERMATH: Duration = Duration::from_millis(2000);
/// How long the test waits for Redis to answer again after a fault.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);
/// A load thread stops by itself after this long, whatever happens.
pub(crate) const LOAD_HARD_CAP: Duration = Duration::from_secs(60);
/// A reply slower than this counts as missing (the connection is then abandoned).
pub(crate) const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// The rules: one per `on_redis_failure`, same bucket. Index = position in `RULES`.
pub(crate) const RULES: [(&str, &str); 3] = [
    ("chaos_local", "local"),
    ("chaos_open", "allow"),
    ("chaos_closed", "deny"),
];
/// Expected fallback source per rule (same index as `RULES`).
pub(crate) const FALLBACK_SOURCE: [&str; 3] = ["local", "fail_open", "fail_closed"];
pub(crate) const CAPACITY: f64 = 20.0;
pub(crate) const REFILL_RATE: f64 = 10.0;
/// Keys per rule (`k0`..): spread over the three primaries' slots.
pub(crate) const KEYS: u32 = 32;
