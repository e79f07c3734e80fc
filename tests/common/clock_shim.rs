//! A clock shim for a Redis under test: a library loaded with `LD_PRELOAD` that moves
//! `CLOCK_REALTIME` (and `CLOCK_REALTIME_COARSE`, `gettimeofday`, `time`) by an offset,
//! with the raw system call underneath, so Redis's `TIME` runs ahead or behind the
//! host's. Built with `cc` at run time. The offset comes from an environment variable
//! read at each call ([`OFFSET_FROM_ENV`]) or from a file of 8 bytes the test may
//! rewrite while Redis runs ([`OFFSET_FROM_FILE`]).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `offset_ns()` from `RLD_CLOCK_OFFSET_US` (µs, fixed for the process's life).
pub const OFFSET_FROM_ENV: &str = r#"
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static long long offset_ns(void) {
    const char *s = getenv("RLD_CLOCK_OFFSET_US");
    return s ? atoll(s) * 1000LL : 0;
}
"#;

/// `offset_ns()` from the file named by `RLD_CLOCK_OFFSET_FILE`: 8 bytes, a
/// little-endian i64 of µs, mapped shared so a rewrite applies at Redis's next call.
pub const OFFSET_FROM_FILE: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static volatile long long *offset_us;
static volatile int tried;
static long long offset_ns(void) {
    if (!tried) {
        const char *p = getenv("RLD_CLOCK_OFFSET_FILE");
        tried = 1;
        if (p) {
            int fd = open(p, O_RDONLY);
            if (fd >= 0) {
                void *m = mmap(0, 8, PROT_READ, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) offset_us = m;
                close(fd);
            }
        }
    }
    return offset_us ? *offset_us * 1000LL : 0;
}
"#;

/// The functions moved, each calling `offset_ns()`.
const WRAPPERS: &str = r#"
int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long ns = ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns();
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return r;
}
int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    (void)tz;
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}
time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// Builds the shim with `offset` (one of the constants above) in `dir`, as `name`.so;
/// returns the library's path. Panics when `cc` is missing or fails.
pub fn build_clock_shim(dir: &Path, name: &str, offset: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let lib = dir.join(format!("{name}.so"));
    std::fs::write(&src, format!("{offset}{WRAPPERS}")).expect("writing the shim");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("running cc (needed to build the clock shim)");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}
