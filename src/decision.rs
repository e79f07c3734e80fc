//! What a `CHECK` decides, shared by every layer: the algorithms' callers, the deny
//! cache, the local fallback, the metrics and the reply encoder.
//!
//! It lives on its own so that none of those layers imports another one (the cache
//! does not need the wire format, the wire format does not need the cache). Pure data.

/// Who made a decision (the `source` field of a reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Decided by the Lua script in Redis.
    Redis,
    /// A recent DENY from Redis remembered by this daemon.
    Cache,
    /// A local bucket (Redis unreachable, or `redis.mode = "none"`).
    Local,
    /// Redis unreachable and the rule says `on_redis_failure = "allow"`.
    FailOpen,
    /// Redis unreachable and the rule says `on_redis_failure = "deny"`.
    FailClosed,
    /// Paid from (or, saturated, refused by) a lease this daemon holds on the key
    /// (`lease = "auto"`).
    Lease,
}

impl Source {
    /// Every source, in a fixed order (metrics keep one counter per source).
    pub const ALL: [Source; 6] = [
        Source::Redis,
        Source::Cache,
        Source::Local,
        Source::FailOpen,
        Source::FailClosed,
        Source::Lease,
    ];

    /// The name on the wire and in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Redis => "redis",
            Source::Cache => "cache",
            Source::Local => "local",
            Source::FailOpen => "fail_open",
            Source::FailClosed => "fail_closed",
            Source::Lease => "lease",
        }
    }

    /// This source's position in [`Source::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The answer to a `CHECK`: the first six fields of its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// `ALLOW` when true, `DENY` when false.
    pub allowed: bool,
    /// The capacity (buckets) or limit (windows) enforced for this decision.
    pub limit: u64,
    /// Units the key could still take now (floor).
    pub remaining: u64,
    /// ms until the key is back to fully unused (ceil).
    pub reset_ms: u64,
    /// On DENY, ms until the same request could be allowed (ceil); on ALLOW, 0 except
    /// for traffic-shaping algorithms.
    pub wait_ms: u64,
    /// Who decided.
    pub source: Source,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_matches_the_order_of_all() {
        for (i, s) in Source::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
    }
}
