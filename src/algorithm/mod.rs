//! Rate-limit algorithms as pure functions of `(state, now, params, cost)`.
//!
//! Each algorithm has a Lua twin in `lua/` that Redis runs with EVALSHA; the two are
//! written operation for operation alike (IEEE doubles, the same order of operations),
//! so for the same inputs they return the same fields. The Rust side serves
//! `redis.mode = "none"` and the local fallback buckets.

pub mod token_bucket;

/// The result of one decision, before it is labelled with a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The request may proceed (its cost was taken).
    pub allowed: bool,
    /// Whole units the key could still take now (floor).
    pub remaining: u64,
    /// ms until the key is back to fully unused (ceil).
    pub reset_ms: u64,
    /// On DENY, ms until the same request could be allowed (ceil); 0 on ALLOW.
    pub wait_ms: u64,
}
