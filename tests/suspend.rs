//! The deny cache ages entries by the time that really passed, a system suspend
//! included: the local clock ([`ratelimitd::clock::local_clock_us`]) runs on
//! `CLOCK_BOOTTIME`, which keeps counting through a suspend, where `CLOCK_MONOTONIC`
//! (`std::time::Instant`) stops. A DENY cached just before a suspend must not answer
//! after the resume once its `wait_ms` is over.
//!
//! A suspend, simulated for real: this process moves itself into a new time namespace
//! whose `CLOCK_BOOTTIME` is 10 minutes ahead and whose `CLOCK_MONOTONIC` is not (as
//! after a 10-minute suspend), between caching a DENY (60 s `wait_ms`) and looking it
//! up. Needs root (`CAP_SYS_ADMIN`) and a kernel with time namespaces (Linux ≥ 5.6);
//! without them it says it skipped. `setns` into a time namespace needs a
//! single-threaded process, hence no libtest harness (`harness = false`): `main` runs
//! on the only thread.

use ratelimitd::cache::{DenyCache, Lookup};
use ratelimitd::clock::local_clock_us;
use ratelimitd::decision::{Decision, Source};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How long the simulated suspend lasts, s.
const SUSPENDED_S: u64 = 600;

fn main() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("suspend: skipped (needs root to enter a time namespace)");
        return;
    }
    let cache = DenyCache::new(60_000, 1_000, 50);
    let deny = Decision {
        allowed: false,
        limit: 10,
        remaining: 0,
        reset_ms: 60_000,
        wait_ms: 60_000,
        source: Source::Redis,
    };
    let awake = Instant::now();
    let asked = local_clock_us();
    cache.remember(7, 1, &deny, asked, cache.generation(), false);
    assert!(
        matches!(cache.lookup(7, 1, local_clock_us()), Lookup::Hit(_)),
        "the DENY answers before the suspend"
    );

    if let Err(e) = suspend(SUSPENDED_S) {
        println!("suspend: skipped (no time namespace: {e})");
        return;
    }
    let now = local_clock_us();
    let awake = awake.elapsed();
    assert!(
        awake < Duration::from_secs(30),
        "CLOCK_MONOTONIC stood still through the suspend: {awake:?}"
    );
    let aged_s = (now - asked) / 1e6;
    assert!(
        aged_s >= SUSPENDED_S as f64 && aged_s < SUSPENDED_S as f64 + 30.0,
        "the local clock counts the {SUSPENDED_S} s suspended: {aged_s} s"
    );
    assert_eq!(
        cache.lookup(7, 1, now),
        Lookup::Miss,
        "a DENY whose 60 s wait_ms ended during the suspend no longer answers"
    );
    println!(
        "suspend: ok (the local clock moved {aged_s:.1} s, CLOCK_MONOTONIC {awake:?}; the cached DENY expired)"
    );
}

/// Moves this (single-threaded) process into a new time namespace whose
/// `CLOCK_BOOTTIME` is `secs` ahead of the current one: to the process, as if the system
/// had been suspended that long (`CLOCK_MONOTONIC` unchanged).
fn suspend(secs: u64) -> std::io::Result<()> {
    // SAFETY: plain syscalls with valid arguments; the process has one thread.
    if unsafe { libc::unshare(libc::CLONE_NEWTIME) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The offsets of the new namespace, writable until a process enters it.
    std::fs::write("/proc/self/timens_offsets", format!("boottime {secs} 0\n"))?;
    let ns = std::fs::File::open("/proc/self/ns/time_for_children")?;
    // SAFETY: as above; `ns` is an open namespace file.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWTIME) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
