//! Where a table's buckets lie in memory: allocated with the advice to back a large
//! table with huge pages, and loaded ahead of a lookup (prefetch), because a lookup
//! that waits on memory is what the table exists to avoid.

use super::bucket::{home, Bucket};
use std::mem;

/// Asks the CPU to start loading every line (keys, then the values) of `key`'s home
/// bucket in a table whose buckets lie at `base`, `n` of them, as
/// [`Table::place_of_buckets`](super::Table::place_of_buckets) reported; a no-op but on
/// x86-64. All of them: the value found after the key compare was otherwise a second,
/// dependent miss (two thirds of the algorithm's time at 10⁵ keys, docs/perf-log.md).
/// The address is never dereferenced: a stale `base` (the table grew since) only
/// prefetches a useless line.
pub fn prefetch<V>(base: *const u8, n: usize, key: u64) {
    if n == 0 {
        return;
    }
    let size = mem::size_of::<Bucket<V>>();
    prefetch_lines(base.wrapping_add(home(key, n) * size), size);
}

/// Asks the CPU to start loading the `bytes` from `at`, line by line; a no-op but on
/// x86-64. Never dereferences `at`.
pub(super) fn prefetch_lines(at: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint; it never faults, whatever the address.
        unsafe {
            for line in 0..bytes.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line).cast());
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, bytes);
}

/// `n` empty buckets.
pub(super) fn new_buckets<V: Default>(n: usize) -> Box<[Bucket<V>]> {
    let mut buckets: Vec<Bucket<V>> = Vec::with_capacity(n);
    advise_huge_pages(buckets.as_ptr().cast(), n * mem::size_of::<Bucket<V>>());
    buckets.extend((0..n).map(|_| Bucket::new()));
    buckets.into_boxed_slice()
}

/// Tables from this size (bytes) ask for transparent huge pages.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Asks Linux to back `len` bytes at `at` (allocated, not yet touched) with 2 MB pages
/// where it can (`madvise(MADV_HUGEPAGE)`; with THP in its default `madvise` mode only
/// such ranges get them): a lookup at a random place of a large table then misses the
/// TLB far less often. Advice only: its failure changes nothing.
fn advise_huge_pages(at: *const u8, len: usize) {
    #[cfg(target_os = "linux")]
    if len >= HUGE_PAGE_BYTES {
        const PAGE: usize = 4096;
        let start = (at as usize).div_ceil(PAGE) * PAGE;
        let end = (at as usize + len) / PAGE * PAGE;
        if end > start {
            // SAFETY: advice on whole pages of an allocation this table owns; it does
            // not change their contents or validity.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (at, len);
}
