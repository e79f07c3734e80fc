//! What the load generators share (`loadgen` and `rls_loadgen`, each with
//! `mod common;`, `loadgen/main.rs` by its `#[path]`): the key mix and the runtime.

/// SplitMix64 (Steele, Lea, Flood 2014): a bijective 64-bit mix, so counter values map
/// to well-spread keys.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The tokio runtime of a load generator: `threads` worker threads, or the current
/// thread alone for 1 (or 0). Panics if tokio cannot start it.
pub fn runtime(threads: usize) -> tokio::runtime::Runtime {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .expect("tokio runtime")
}
