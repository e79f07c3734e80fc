//! Why the limiter refuses a request before deciding it ([`CheckError`]): each variant
//! names the field or the limit at fault, and becomes one `ERR` reply (the server
//! encodes it; the text here is the reason it gives).

use crate::admission::Peer;

/// A `CHECK` the limiter refuses before deciding anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// No rule has this name.
    #[error("unknown rule")]
    UnknownRule,
    /// `cost` is above the rule's limit: it can never be allowed.
    #[error("cost {cost} exceeds rule '{rule}' limit {limit} and can never be allowed")]
    CostAboveLimit {
        /// The cost asked.
        cost: u32,
        /// The rule.
        rule: String,
        /// Its capacity/limit.
        limit: u64,
    },
    /// The rule is a `concurrency` rule: its slots are taken with `ACQUIRE`.
    #[error("rule '{rule}' is a concurrency rule: take its slots with ACQUIRE and give them back with RELEASE")]
    Concurrency {
        /// The rule.
        rule: String,
    },
    /// `REFUND` on a `concurrency` rule: its slots are given back with `RELEASE`.
    #[error("rule '{rule}' is a concurrency rule: REFUND gives back no slots; RELEASE does")]
    RefundOfSlots {
        /// The rule.
        rule: String,
    },
    /// `"<rule>:<key>"` does not fit (a key longer than the protocol allows).
    #[error("key too long")]
    KeyTooLong,
    /// The rule's `allow_uids` / `allow_gids` do not list the peer.
    #[error("peer uid {uid} gid {gid} is not in rule '{rule}' allow_uids / allow_gids")]
    Forbidden {
        /// The rule.
        rule: String,
        /// The peer's uid.
        uid: u32,
        /// The peer's gid.
        gid: u32,
    },
    /// The rule is composite (`all_of`): decided by [`super::Limiter::check_composite`].
    #[error("rule '{rule}' is composite")]
    Composite {
        /// The rule.
        rule: String,
    },
    /// `OVERRIDE` refused: a rule that cannot take one, or a bad parameter.
    #[error("{message}")]
    Override {
        /// Why.
        message: String,
    },
    /// The rule takes leases (`lease = "auto"`): its units are answered one key at a
    /// time from leases, so it cannot be decided together with others or given back.
    #[error("rule '{rule}' takes leases (lease = \"auto\"); CHECKALL, composite rules and REFUND need lease = \"off\"")]
    Leased {
        /// The rule.
        rule: String,
    },
    /// The peer's uid holds its share of the requests in flight to Redis, or the daemon
    /// its cap: retry.
    #[error("too many requests in flight to Redis ({held} from uid {uid}; server.redis_max_in_flight_per_uid = {per_uid}, server.redis_max_in_flight = {total}); retry")]
    Busy {
        /// The peer's uid.
        uid: u32,
        /// Its requests in flight now.
        held: usize,
        /// Its share.
        per_uid: usize,
        /// The daemon's cap.
        total: usize,
    },
}

impl CheckError {
    /// [`CheckError::Busy`]: `peer` holds its share of the requests in flight to Redis.
    pub(super) fn busy(peer: &Peer) -> CheckError {
        let limits = peer.in_flight_limits();
        CheckError::Busy {
            uid: peer.uid,
            held: peer.uid_in_flight(),
            per_uid: limits.per_uid,
            total: limits.total,
        }
    }
}
