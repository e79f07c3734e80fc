//! What one lease call asks of Redis and what it gets back (docs/DESIGN.md "Leases"):
//! the arguments [`crate::store::scripts::lease_args`] sends and the reply
//! [`crate::store::scripts::lease_reply`] reads, kept apart from the per-key state
//! machine (`mod.rs`).

use super::LIFETIME_US;
use std::sync::Arc;

/// What one lease call asks of Redis (besides the request it decides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// This daemon's holder id (random per process).
    pub holder: Arc<str>,
    /// The grant given back (0: none).
    pub given_back: i64,
    /// µ-units of that grant not spent (a slice's refill until the call included).
    pub unspent: u64,
    /// µ-units wanted in a new lease (0: none).
    pub want: u64,
    /// Lifetime asked, µs.
    pub lifetime_us: u64,
    /// 0, or (saturated) how often this host asks, µs: Redis grants a bucket's holder a
    /// slice, its share of the capacity and of the refill rate.
    pub pace_us: u64,
    /// The book's reload generation when the call started (not sent: a lease granted
    /// to a call started before a reload is not spent).
    pub generation: u64,
    /// This host's [`crate::clock::boottime_us`] when the call is sent (0: not sent, the
    /// call cannot witness a lease).
    pub mono_us: u64,
    /// The key's highest grant number this host read in a reply before sending the call
    /// (0: none): a lease of a grant up to it was made before the call was sent.
    pub seen: i64,
    /// This host's clock when it read the reply that showed it `seen`, µs.
    pub seen_at: u64,
    /// The grant given back: this host's clock when it sent the call that took it and
    /// when it read the reply, and how much before its lifetime it stopped spending it,
    /// µs (0, 0, 0: unknown). Redis bounds from them how far its clock can have jumped
    /// while the lease was spent (lua/lease_window.lua stopped_before()).
    pub grant_sent_us: u64,
    /// See [`Request::grant_sent_us`].
    pub grant_got_us: u64,
    /// See [`Request::grant_sent_us`].
    pub spare_us: u64,
}

impl Request {
    /// A call that gives nothing back and asks for nothing (a cold key's decision).
    pub fn cold(holder: &Arc<str>) -> Request {
        Request {
            holder: Arc::clone(holder),
            given_back: 0,
            unspent: 0,
            want: 0,
            lifetime_us: LIFETIME_US,
            pace_us: 0,
            generation: 0,
            mono_us: 0,
            seen: 0,
            seen_at: 0,
            grant_sent_us: 0,
            grant_got_us: 0,
            spare_us: 0,
        }
    }
}

/// What Redis granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Granted {
    /// µ-units handed over now (0: none).
    pub units: u64,
    /// Lifetime granted, µs (counted on the holder's clock from when it sent the call).
    pub lifetime_us: u64,
    /// The grant's number, to give it back with (0: no lease).
    pub grant: i64,
    /// µ-units of the grant the call named that went back to the key's budget (the rest
    /// of its unspent units lapsed).
    pub returned: u64,
    /// A slice: the µ-units the holder's own bucket may hold (0: a lump lease, `units`).
    pub cap: u64,
    /// A slice: its refill, µ-units/s, from the reply until the deadline.
    pub rate: u64,
    /// The key's last grant number (any holder's) after the call.
    pub last_grant: i64,
    /// 0, or this host's clock (µs) from when it could end, in Redis, a lease of
    /// another holder it is the witness of: it calls the key again then.
    pub witness_due: u64,
}

/// What the call's decision reported besides the grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reported {
    /// Units the key could still take in Redis.
    pub remaining: u64,
    /// ms until the key is fully unused.
    pub reset_ms: u64,
    /// On DENY, ms until the request could pass in Redis (0 on ALLOW).
    pub wait_ms: u64,
    /// Redis decided under a run-time override (`OVERRIDE`) and granted nothing: the key
    /// is decided per request while it lasts.
    pub overridden: bool,
}
