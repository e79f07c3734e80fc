//! The integration tests that measure latency, descriptors, memory or utilisation, in
//! one test binary where they run one at a time, beside no other test: each that starts
//! a process takes [`ONE_AT_A_TIME`], so that another test's daemons and Redis servers
//! cannot distort its figures (the tests of `tests/it/` run in parallel).

#[path = "../common/mod.rs"]
mod common;

mod envoy;
mod exhaustion;
mod expiry_walk;
mod flood;
mod leases;

/// Held by each test of this binary that starts a process, for its whole run (each
/// module's lock; poisoning ignored: a failed test must not fail the ones after it).
pub static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
