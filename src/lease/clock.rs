//! The clock lease deadlines are measured on: `CLOCK_BOOTTIME`, monotonic and still
//! counting while the process is stopped (SIGSTOP, a suspended VM). A lease's deadline
//! is this clock when the lease was *asked for* plus its lifetime, so a holder that was
//! frozen past its deadline sees it passed on waking and spends nothing from it
//! (`CLOCK_MONOTONIC`, and so `std::time::Instant`, stops during a suspend on Linux).

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
}
