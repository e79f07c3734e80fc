//! What goes to Redis for decisions on several keys at once (`CHECKALL`, composite
//! rules) and for giving units back (`REFUND`, the undo of a reservation): the scripts,
//! their arguments and how their replies are read.
//!
//! The scripts are assembled like the batch script ([`super::batch_script`]):
//! the prelude, the shared parts and each algorithm's own file as a function, then a
//! part of their own: the all-or-nothing group (`lua/all.lua`) with the loop of one
//! group (`lua/all_one.lua`) or of several groups and give-backs of one primary
//! (`lua/all_batch.lua`, [`super::batch_all`]); `lua/give_back.lua` and
//! `lua/give_back_keys.lua` with `lua/give_back_loop.lua`. So the decisions are the
//! algorithms' own, operation for operation, and a give-back in a batch runs the
//! give-back script's own steps.

use super::batch_script::{head, DECLARED};
use super::scripts::args;
use crate::algorithm::{Family, Kind, Outcome, Params};
use fred::error::{Error, ErrorKind};
use fred::types::Value;

/// One decision of an all-or-nothing call as Redis answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// The key's decision (a dry run's when another key of the call was denied).
    pub outcome: Outcome,
    /// The instant (µs on the Redis clock) the key's state was decided at when its
    /// units were taken, else 0: what an undo names to give back exactly those units.
    pub at_us: i64,
}

/// [`head`], then the give-back functions listed in `give_backs`, and
/// `give_back_keys()`, which gives back to several keys in turn.
fn head_with_give_backs(first: &str) -> String {
    let mut lua = head(first);
    lua.push_str(include_str!("../../lua/give_back.lua"));
    // A concurrency rule's slots are given back by RELEASE, never here (the limiter
    // refuses them first); its entry keeps the table in the algorithms' order.
    lua.push_str("local function give_back_none(args, at) end\n");
    let names: Vec<String> = Kind::ALL
        .iter()
        .map(|k| match k.spec().family {
            Family::Slots => "give_back_none".to_owned(),
            _ => format!("give_back_{}", k.spec().suffix),
        })
        .collect();
    lua.push_str(&format!("local give_backs = {{{}}}\n", names.join(", ")));
    lua.push_str(include_str!("../../lua/give_back_keys.lua"));
    lua
}

/// The all-or-nothing script (`lua/all.lua`, `lua/all_one.lua`): keys of one slot
/// decided together.
pub fn all_lua() -> String {
    let mut lua = head_with_give_backs(DECLARED);
    lua.push_str(include_str!("../../lua/all.lua"));
    lua.push_str(include_str!("../../lua/all_one.lua"));
    lua
}

/// The all-or-nothing batch script (`lua/all.lua`, `lua/all_batch.lua`): several groups
/// of one primary, each all or nothing, and give-backs (`lua/give_back_keys.lua`). With `clustered`, Redis Cluster's: one key
/// declared to route the call, every key in `ARGV`, as the cluster batch script
/// ([`super::batch_script::cluster_batch_lua`], which says what Redis checks).
pub fn all_batch_lua(clustered: bool) -> String {
    let mut lua = match clustered {
        false => head_with_give_backs(DECLARED),
        true => head_with_give_backs(super::batch_script::CLUSTER_HEAD),
    };
    lua.push_str(include_str!("../../lua/all.lua"));
    lua.push_str(include_str!("../../lua/all_batch.lua"));
    lua
}

/// The all-or-nothing batch script's share of `ARGV` for one group of `n` keys: the
/// count, then the group's [`all_args`].
pub fn all_batch_args(n: usize, group: &[Value], into: &mut Vec<Value>) {
    into.push(Value::Integer(n as i64));
    into.extend(group.iter().cloned());
}

/// The all-or-nothing batch script's share of `ARGV` for a give-back to `n` keys:
/// minus the count, then the give-back's [`give_back_args`].
pub fn give_back_batch_args(n: usize, give_back: &[Value], into: &mut Vec<Value>) {
    into.push(Value::Integer(-(n as i64)));
    into.extend(give_back.iter().cloned());
}

/// The give-back script (`lua/give_back.lua`, `lua/give_back_loop.lua`).
pub fn give_back_lua() -> String {
    let mut lua = head_with_give_backs(DECLARED);
    lua.push_str(include_str!("../../lua/give_back_loop.lua"));
    lua
}

/// The all-or-nothing script's arguments for `items` (parameters, cost), in the order
/// of its keys.
pub fn all_args(items: &[(Params, u32)]) -> Vec<Value> {
    let mut out = Vec::with_capacity(items.len() * 5);
    for (params, cost) in items {
        out.push(Value::Integer(params.kind() as i64));
        out.push(Value::Integer(3));
        out.extend(args(params, *cost));
    }
    out
}

/// The give-back script's arguments for `items` (parameters, units, and the instant of
/// the reservation undone, µs on the Redis clock; `None` for a `REFUND`).
pub fn give_back_args(items: &[(Params, u32, Option<i64>)]) -> Vec<Value> {
    let mut out = Vec::with_capacity(items.len() * 6);
    for (params, units, at) in items {
        out.push(Value::Integer(params.kind() as i64));
        out.push(Value::Integer(4));
        out.extend(args(params, *units));
        out.push(match at {
            Some(at) => Value::Integer(*at),
            None => Value::from(""),
        });
    }
    out
}

/// Reads the all-or-nothing script's reply for `n` keys.
///
/// # Errors
/// A reply of another length (a parse error: the key's problem, not Redis's).
pub fn taken(reply: &[i64], n: usize) -> Result<Vec<Taken>, Error> {
    if reply.len() != 8 * n {
        return Err(Error::new(
            ErrorKind::Parse,
            format!(
                "all-or-nothing script returned {} integers for {n} keys",
                reply.len()
            ),
        ));
    }
    reply
        .chunks(8)
        .map(|c| {
            let outcome = if c[5] > 0 {
                super::scripts::outcome(&[c[0], c[1], c[2], c[3], c[5], c[6], c[7]])?
            } else {
                super::scripts::outcome(&c[..4])?
            };
            Ok(Taken {
                outcome,
                at_us: c[4],
            })
        })
        .collect()
}

/// Reads the give-back script's reply for `n` keys: each key's state for a cost of 0,
/// with its run-time override if any (a limit of 0: none).
///
/// # Errors
/// A reply of another length.
pub fn given_back(reply: &[i64], n: usize) -> Result<Vec<Outcome>, Error> {
    if reply.len() != 7 * n {
        return Err(Error::new(
            ErrorKind::Parse,
            format!(
                "give-back script returned {} integers for {n} keys",
                reply.len()
            ),
        ));
    }
    reply
        .chunks(7)
        .map(|c| super::scripts::outcome(if c[4] > 0 { c } else { &c[..4] }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::token_bucket;

    #[test]
    fn every_algorithm_has_a_give_back() {
        let lua = give_back_lua();
        for kind in Kind::ALL {
            if kind.spec().family == Family::Slots {
                continue;
            }
            let f = format!("local function give_back_{}(", kind.spec().suffix);
            assert!(lua.contains(&f), "{f}");
        }
        assert!(lua.contains("local function give_back_none("));
    }

    #[test]
    fn replies_of_the_wrong_length_are_errors() {
        assert!(taken(&[1, 2, 3, 4, 5], 1).is_err());
        let plain = &taken(&[1, 2, 3, 4, 5, 0, 0, 0], 1).unwrap()[0];
        assert_eq!((plain.at_us, plain.outcome.tier), (5, None));
        // Under a run-time override: its limit and the halves of its rate or window.
        let tiered = &taken(&[1, 2, 3, 4, 5, 7, 0, 1000], 1).unwrap()[0];
        let tier = tiered.outcome.tier.expect("a tier");
        assert_eq!((tier.limit, tier.per_bits), (7, 1000));
        assert!(given_back(&[1, 2, 3], 1).is_err());
        let tb = Params::TokenBucket(token_bucket::Params::shared(2, 1.0, 1));
        assert_eq!(all_args(&[(tb, 1)]).len(), 5);
        assert_eq!(give_back_args(&[(tb, 1, None)]).len(), 6);
    }
}
