//! What is sent to Redis for a decision, per algorithm, in one place: the script (each
//! algorithm's Lua twin, from the algorithm table), the key and its suffix, the
//! arguments, and how the reply is read.
//!
//! Nothing here is per algorithm: a new algorithm's `SPEC` and `Shape` give all of it,
//! except the lease scripts (`lua/lease_*.lua`), listed in [`lease_lua`].

use crate::algorithm::{Arg, Family, Kind, Outcome, Params};
use crate::lease::{Granted, Request};
use fred::error::{Error, ErrorKind};
use fred::types::scripts::Script;
use fred::types::Value;

/// Every algorithm's script, then every lease script, then the batch script, the
/// all-or-nothing script and the give-back script, loaded together.
pub struct Scripts(Vec<Script>);

/// The lease script of an algorithm that takes leases (`lease = "auto"`): prelude, the
/// shared lease bookkeeping, the parts only some lease scripts share (the window lease
/// steps, the sliding window counter's weighting), then the algorithm's own part. `None`
/// for the others.
pub fn lease_lua(kind: Kind) -> Option<&'static str> {
    kind.spec().lease
}

impl Scripts {
    /// The scripts of every algorithm in the table and the lease scripts (their SHA1
    /// computed once).
    pub fn new() -> Self {
        let decisions = Kind::ALL.iter().map(|k| k.spec().lua);
        let leases = Kind::ALL.iter().map(|k| lease_lua(*k).unwrap_or(""));
        let mut scripts: Vec<Script> = decisions.chain(leases).map(Script::from_lua).collect();
        scripts.push(Script::from_lua(batch_lua()));
        scripts.push(Script::from_lua(super::multi::all_lua()));
        scripts.push(Script::from_lua(super::multi::give_back_lua()));
        Scripts(scripts)
    }

    /// The script of `kind`.
    pub fn of(&self, kind: Kind) -> &Script {
        &self.0[kind as usize]
    }

    /// The lease script of `kind` (an empty script for algorithms without leases:
    /// config validation never lets such a rule take leases).
    pub fn lease_of(&self, kind: Kind) -> &Script {
        &self.0[Kind::ALL.len() + kind as usize]
    }

    /// The batch script ([`batch_lua`]).
    pub fn batch(&self) -> &Script {
        &self.0[2 * Kind::ALL.len()]
    }

    /// The all-or-nothing script of several keys ([`super::multi::all_lua`]).
    pub fn together(&self) -> &Script {
        &self.0[2 * Kind::ALL.len() + 1]
    }

    /// The give-back script ([`super::multi::give_back_lua`]).
    pub fn give_back(&self) -> &Script {
        &self.0[2 * Kind::ALL.len() + 2]
    }

    /// Every script.
    pub fn all(&self) -> &[Script] {
        &self.0
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts::new()
    }
}

/// The batch script: several decisions, of any algorithms, in one EVALSHA
/// (`lua/batch.lua` says how it is called and what it returns). Built from the
/// algorithms' own files: the prelude and their shared parts once, then each
/// algorithm's script as a function of its `ARGV`, in the order of [`Kind::ALL`] (the
/// index [`batch_args`] sends). The loop sets the decision's key as `KEYS[1]` of a
/// table the functions and the prelude's helpers share.
pub fn batch_lua() -> String {
    let mut lua = String::from("local items, ARGV, keys, KEYS = ARGV, {}, KEYS, {}\n");
    lua.push_str(include_str!("../../lua/prelude.lua"));
    let mut parts: Vec<&str> = Vec::new();
    for part in Kind::ALL.iter().flat_map(|k| k.spec().parts) {
        if !parts.contains(part) {
            parts.push(part);
            lua.push_str(part);
        }
    }
    let mut names = Vec::new();
    for kind in Kind::ALL {
        let name = format!("decide_{}", *kind as usize);
        lua.push_str(&format!("local function {name}(ARGV)\n"));
        lua.push_str(kind.spec().body);
        lua.push_str("\nend\n");
        names.push(name);
    }
    lua.push_str(&format!("local algorithms = {{{}}}\n", names.join(", ")));
    lua.push_str(include_str!("../../lua/batch.lua"));
    lua
}

/// One decision's share of the batch script's `ARGV`: its algorithm's index, the count
/// of its arguments, then `args` (what its own script would take: [`args`] or
/// [`peek_args`]).
pub fn batch_args(kind: Kind, args: &[Value], into: &mut Vec<Value>) {
    into.push(Value::Integer(kind as i64));
    into.push(Value::Integer(args.len() as i64));
    into.extend(args.iter().cloned());
}

/// The Redis key of `tag` (`"<rule>:<key>"`) under `params`' algorithm:
/// `<prefix>:{<tag>}:<suffix>`. The hash tag puts the key in `tag`'s slot; the suffix
/// (the algorithm's, from its `SPEC`) keeps a rule whose algorithm a reload changed from
/// reading the other algorithm's state (a hash where a sorted set is expected would
/// fail with `WRONGTYPE`; another hash layout would be misread): it starts afresh, as
/// the local twins do.
///
/// A `}` inside the key would end the hash tag early (Redis hashes the text between the
/// first `{` and the next `}`), so it is written as a space, a byte protocol keys never
/// contain: the mapping stays one-to-one and the whole tag is hashed.
pub fn key(prefix: &str, tag: &str, params: &Params) -> String {
    let suffix = params.kind().spec().suffix;
    let mut key = String::with_capacity(prefix.len() + tag.len() + 4 + suffix.len());
    key.push_str(prefix);
    key.push_str(":{");
    if tag.contains('}') {
        key.push_str(&tag.replace('}', " "));
    } else {
        key.push_str(tag);
    }
    key.push_str("}:");
    key.push_str(suffix);
    key
}

/// The script arguments for `cost` units under `params`. Integers go as fred integers
/// (sent as bulk strings, formatted with itoa), rates as doubles (shortest round-trip
/// form, which Lua's tonumber reads back exactly).
pub fn args(params: &Params, cost: u32) -> Vec<Value> {
    params.script_args(cost).into_iter().map(value).collect()
}

/// The arguments of a dry run of `cost` units under `params`: [`args`], then `""` for
/// "now" (Redis TIME) and `"1"`. The script replies as the same request would be
/// answered and writes nothing (lua/prelude.lua): the deny cache refreshes an entry
/// with it, a request no client waits for and nothing may be taken by.
pub fn peek_args(params: &Params, cost: u32) -> Vec<Value> {
    let mut args = args(params, cost);
    args.push(Value::from(""));
    args.push(Value::from("1"));
    args
}

fn value(arg: Arg) -> Value {
    match arg {
        // An integer-valued double (a count of µ-units or µs) is sent as an integer; a
        // fractional one (a shared limit) as a double.
        Arg::Whole(x) if x.fract() == 0.0 && x.abs() < 9e15 => Value::Integer(x as i64),
        Arg::Whole(x) | Arg::Double(x) => Value::Double(x),
        Arg::Int(i) => Value::Integer(i),
    }
}

/// Reads a script's reply: `{allowed, remaining, reset_ms, wait_ms}`, every script alike.
pub fn outcome(reply: &[i64]) -> Result<Outcome, Error> {
    match *reply {
        [allowed, remaining, reset_ms, wait_ms] => Ok(Outcome {
            allowed: allowed == 1,
            remaining: remaining.max(0) as u64,
            reset_ms: reset_ms.max(0) as u64,
            wait_ms: wait_ms.max(0) as u64,
        }),
        _ => Err(Error::new(
            ErrorKind::Parse,
            format!("script returned {reply:?}, expected 4 integers"),
        )),
    }
}

/// The lease script's arguments: the decision's three, `""` for "now" (Redis TIME), then
/// the lease's (holder, grant given back, unspent, wanted, lifetime µs, pace µs), the
/// holder's µ-units in the algorithm's units (µ-tokens for buckets, whole units, floored,
/// for windows).
pub fn lease_args(params: &Params, cost: u32, ask: &Request) -> Vec<Value> {
    let per = lease_unit(params);
    let mut args = args(params, cost);
    args.push(Value::from(""));
    args.push(Value::from(&*ask.holder));
    args.push(Value::Integer(ask.given_back));
    args.push(Value::Integer(
        i64::try_from(ask.unspent / per).unwrap_or(i64::MAX),
    ));
    args.push(Value::Integer(
        i64::try_from(ask.want / per).unwrap_or(i64::MAX),
    ));
    args.push(Value::Integer(ask.lifetime_us as i64));
    args.push(Value::Integer(ask.pace_us as i64));
    args
}

/// The holder's µ-units per unit of the algorithm: 1 for buckets (µ-tokens), 10^6 for
/// windows (whole units).
fn lease_unit(params: &Params) -> u64 {
    match params.kind().spec().family {
        Family::Bucket { .. } => 1,
        Family::Window { .. } | Family::Slots => crate::lease::UNIT,
    }
}

/// Reads a lease script's reply: the decision's four integers, then (in the algorithm's
/// units) the units granted now, the lease's lifetime in µs, its grant number, the units
/// the grant named gave back, and a slice's cap and refill (per s); in the holder's
/// µ-units.
pub fn lease_reply(params: &Params, reply: &[i64]) -> Result<(Outcome, Granted), Error> {
    let per = lease_unit(params);
    let mu = |v: i64| (v.max(0) as u64).saturating_mul(per);
    match *reply {
        [a, b, c, d, units, lifetime_us, grant, returned, cap, rate] => Ok((
            outcome(&[a, b, c, d])?,
            Granted {
                units: mu(units),
                lifetime_us: lifetime_us.max(0) as u64,
                grant,
                returned: mu(returned),
                cap: mu(cap),
                rate: mu(rate),
            },
        )),
        _ => Err(Error::new(
            ErrorKind::Parse,
            format!("lease script returned {reply:?}, expected 10 integers"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{token_bucket, WindowParams};

    #[test]
    fn keys_carry_the_tag_and_the_suffix() {
        let tb = Params::TokenBucket(token_bucket::Params::shared(2, 1.0, 1));
        assert_eq!(key("rl", "r:k", &tb), "rl:{r:k}:tb");
        let fw = Params::FixedWindow(WindowParams::shared(3, 1000, 1));
        assert_eq!(key("rl", "r:a}b", &fw), "rl:{r:a b}:fw");
    }

    #[test]
    fn counts_go_as_integers_rates_as_doubles() {
        let tb = Params::TokenBucket(token_bucket::Params::shared(2, 1.5, 1));
        assert_eq!(
            args(&tb, 1),
            vec![
                Value::Integer(2_000_000),
                Value::Double(1.5),
                Value::Integer(1_000_000)
            ]
        );
        let shared = Params::FixedWindow(WindowParams::shared(10, 1000, 4));
        assert_eq!(args(&shared, 2)[0], Value::Double(2.5));
    }
}
