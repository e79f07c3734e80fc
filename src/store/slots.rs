//! The calls of a concurrency rule's slots (`ACQUIRE`, `RELEASE`, the renewal of the
//! slots this daemon's clients hold, and the hand-back of slots taken while Redis was
//! unreachable): one EVALSHA of `lua/concurrency.lua` on the key's primary, with its
//! arguments and the reading of its reply. Bounded and heard by the primary's breaker
//! like a decision ([`super::redis::RedisStore`]'s `bounded`).

use super::redis::RedisStore;
use super::topology::Primary;
use super::StoreKey;
use crate::algorithm::{concurrency, Kind, Outcome, Params};
use fred::error::{Error, ErrorKind};
use fred::types::Value;

/// One operation on a key's slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotOp {
    /// Take a slot if fewer than `limit` are held; its token is `"<hold_end
    /// µs>-<holder>"`.
    Acquire {
        /// The token's holder part, `"<daemon>.<n>"`.
        holder: String,
    },
    /// Give back these tokens' slots.
    Release(Vec<String>),
    /// Renew these tokens' slots for another lease.
    Renew(Vec<String>),
    /// Add these tokens' slots, taken while Redis was unreachable, whatever the count
    /// (they are held already).
    HandBack(Vec<String>),
}

/// What a [`SlotOp`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum SlotReply {
    /// `Acquire`: the decision, and on ALLOW the slot's `hold_end`, µs on the Redis
    /// clock.
    Acquired(Outcome, u64),
    /// `Release`, `Renew`: per token, whether the key held it.
    Held(Vec<bool>),
    /// `HandBack`: slots added.
    HandedBack(u64),
}

/// The script's arguments for `op` under `params` (limit, max_hold µs, cost 0, Redis
/// TIME, no dry run, the operation, the lease µs, its tokens).
pub fn slot_args(params: &Params, op: &SlotOp) -> Vec<Value> {
    let mut args = super::scripts::args(params, 0);
    args.push(Value::from(""));
    args.push(Value::from(""));
    let (code, tokens): (&str, &[String]) = match op {
        SlotOp::Acquire { holder } => ("a", std::slice::from_ref(holder)),
        SlotOp::Release(t) => ("r", t),
        SlotOp::Renew(t) => ("n", t),
        SlotOp::HandBack(t) => ("h", t),
    };
    args.push(Value::from(code));
    args.push(Value::Integer(concurrency::HOLDER_LEASE_US as i64));
    args.extend(tokens.iter().map(|t| Value::from(t.as_str())));
    args
}

/// Reads the script's reply to `op`.
///
/// # Errors
/// A reply of another shape (a script of another version).
pub fn slot_reply(op: &SlotOp, reply: &[i64]) -> Result<SlotReply, Error> {
    let bad = || {
        Error::new(
            ErrorKind::Parse,
            format!("concurrency script returned {reply:?} to {op:?}"),
        )
    };
    match op {
        SlotOp::Acquire { .. } => match *reply {
            [a, b, c, d, hold_end] => Ok(SlotReply::Acquired(
                super::scripts::outcome(&[a, b, c, d])?,
                hold_end.max(0) as u64,
            )),
            _ => Err(bad()),
        },
        SlotOp::Release(t) | SlotOp::Renew(t) if reply.len() == t.len() => {
            Ok(SlotReply::Held(reply.iter().map(|&r| r == 1).collect()))
        }
        SlotOp::HandBack(_) => match *reply {
            [n] => Ok(SlotReply::HandedBack(n.max(0) as u64)),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

impl RedisStore {
    /// Runs `op` on `key`'s slots on `primary`; unbounded ([`RedisStore::bounded`]
    /// bounds it). Re-loads the scripts on `NOSCRIPT` and retries.
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed reply.
    pub(super) async fn slots_unbounded(
        &self,
        primary: &Primary,
        key: &StoreKey,
        params: &Params,
        op: &SlotOp,
    ) -> Result<SlotReply, Error> {
        let script = self.scripts.of(Kind::Concurrency);
        let reply =
            Box::pin(self.run_script(primary, script, key, || slot_args(params, op))).await?;
        slot_reply(op, &reply)
    }
}
