//! Every clock the daemon reads, and its unit: the one place that names them.
//!
//! * [`local_clock_us`] (f64 µs since the epoch, monotonic): local decisions;
//! * [`wall_clock_us`] (f64 µs since the epoch): the wall clock, read once by the above;
//! * [`boottime_us`] (u64 µs since boot, counting through a suspend or a stopped
//!   process): lease deadlines;
//! * [`mono_us`] (u64 µs since this process's first call): time stamps that fit an
//!   atomic, for this process's own lateness and breakers.
//!
//! Local decisions (`redis.mode = "none"`, the fallback, the deny cache's ageing) use
//! [`local_clock_us`]: µs since the Unix epoch as the wall clock read it once, at the
//! first call, advanced by the boot clock since (`CLOCK_BOOTTIME`, [`boottime_us`]). Windows align to the epoch as in Redis (within
//! the wall clock's error at start), and a step of the wall clock (NTP, an operator)
//! neither hands local buckets a fresh budget (a step forward) nor freezes them (a step
//! back). The boot clock, unlike `CLOCK_MONOTONIC` (and so `std::time::Instant`), keeps
//! counting while the system is suspended (a laptop's lid, a VM suspended to disk): a
//! deny-cache entry is as old as the time that really passed, so a DENY never answers
//! past its `wait_ms` after a resume, and local windows stay aligned with Redis'. It costs
//! what the monotonic clock does (both are read in the vDSO). Durations that only this
//! process measures while it runs (timeouts, log throttling) use `std::time::Instant`.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// µs since the process's first call: a monotonic time stamp that fits an atomic.
pub fn mono_us() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Now on the host's wall clock, µs since the Unix epoch (as Redis `TIME` counts).
pub fn wall_clock_us() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| {
            // Seconds and µs separately: exact, and cheaper than a u128 conversion.
            d.as_secs() as f64 * 1e6 + f64::from(d.subsec_micros())
        })
}

/// The clock of local decisions: µs since the epoch, monotonic, counting suspended
/// time. The wall clock read at the first call, plus the boot clock's time elapsed since
/// (whole µs).
pub fn local_clock_us() -> f64 {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR
        .get_or_init(|| Anchor::new(boottime_us(), wall_clock_us()))
        .at(boottime_us())
}

/// The wall clock (µs since the epoch) read once, and a reading of the boot clock (µs)
/// taken with it: the local clock at any later boot-clock reading.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    boot_us: u64,
    wall_us: f64,
}

impl Anchor {
    fn new(boot_us: u64, wall_us: f64) -> Self {
        Anchor { boot_us, wall_us }
    }

    /// The local clock when the boot clock reads `boot_us`.
    fn at(&self, boot_us: u64) -> f64 {
        self.wall_us + boot_us.saturating_sub(self.boot_us) as f64
    }
}

/// The local clock read at most once per batch of requests (the lines one `read`
/// brought in are decided at one instant): reading the clock is a measurable share of a
/// local decision.
#[derive(Debug, Default)]
pub struct BatchClock(Option<f64>);

impl BatchClock {
    /// Now, µs since the epoch ([`local_clock_us`], on the boot clock): read at the
    /// first call, the same value afterwards.
    pub fn now_us(&mut self) -> f64 {
        *self.0.get_or_insert_with(local_clock_us)
    }
}

/// Lease deadlines are measured on `CLOCK_BOOTTIME`, monotonic and still counting while
/// the process is stopped (SIGSTOP, a suspended VM): a lease's deadline is this clock
/// when the lease was *asked for* plus its lifetime, so a holder that was frozen past
/// its deadline sees it passed on waking and spends nothing from it (`CLOCK_MONOTONIC`,
/// and so `std::time::Instant`, stops during a suspend on Linux).
///
/// Now on `CLOCK_BOOTTIME`, µs since boot. Falls back to `CLOCK_MONOTONIC` on a system
/// without it (never on Linux ≥ 2.6.39).
pub fn boottime_us() -> u64 {
    read(libc::CLOCK_BOOTTIME).unwrap_or_else(|| read(libc::CLOCK_MONOTONIC).unwrap_or(0))
}

fn read(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime writes only into it.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boottime_moves_forward() {
        let a = boottime_us();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = boottime_us();
        assert!(a > 0 && b >= a + 2000, "{a} {b}");
    }

    #[test]
    fn the_local_clock_is_near_the_wall_clock_and_never_goes_back() {
        let a = local_clock_us();
        let b = local_clock_us();
        assert!(b >= a);
        assert!((a - wall_clock_us()).abs() < 5e6, "{a}");
    }

    #[test]
    fn the_local_clock_advances_with_the_boot_clock() {
        // Both read in one order and the other: the local clock's elapsed time lies
        // between the boot clock's inner and outer intervals.
        let (b0, l0, b1) = (boottime_us(), local_clock_us(), boottime_us());
        std::thread::sleep(std::time::Duration::from_millis(3));
        let (b2, l1, b3) = (boottime_us(), local_clock_us(), boottime_us());
        let elapsed = l1 - l0;
        assert!(
            elapsed >= (b2 - b1) as f64 && elapsed <= (b3 - b0) as f64,
            "{elapsed}"
        );
    }
}
