//! What is sent to Redis for a decision, per algorithm, in one place: the script (each
//! algorithm's Lua twin, from the algorithm table), the key and its suffix, the
//! arguments, and how the reply is read.
//!
//! Nothing here is per algorithm: a new algorithm's `SPEC` and `Shape` give all of it,
//! except the lease scripts (`lua/lease_*.lua`), listed in [`lease_lua`].

use crate::algorithm::{Arg, Family, Kind, Outcome, Params, Tier};
use crate::lease::{Granted, Request};
use fred::error::{Error, ErrorKind};
use fred::types::scripts::Script;
use fred::types::Value;

pub use super::batch_script::{batch_lua, cluster_batch_lua};

/// Every algorithm's script, then every lease script, then the batch script, the
/// all-or-nothing script, the give-back script and the all-or-nothing batch script (the
/// batch scripts of the store's kind: a standalone Redis's or Redis Cluster's), loaded
/// together.
pub struct Scripts(Vec<Script>);

/// `lua` with each line that is only a comment (`--` after blanks) left empty. Redis
/// reads a script's whole text at every load (at start, and on `NOSCRIPT` within the
/// `redis.timeout_ms` of the calls that met it), and comment lines are more than half
/// of the scripts' text. The lines stay, so an error names the line it names in the
/// assembled text. The scripts hold no long string or long comment (`[[ … ]]`) for a
/// comment line to be part of (a unit test checks).
pub fn uncommented(lua: &str) -> String {
    let mut out = String::with_capacity(lua.len() / 2);
    for line in lua.split_inclusive('\n') {
        if line.trim_start().starts_with("--") {
            out.push_str(if line.ends_with('\n') { "\n" } else { "" });
        } else {
            out.push_str(line);
        }
    }
    out
}

/// The lease script of an algorithm that takes leases (`lease = "auto"`): prelude, the
/// shared lease bookkeeping, the parts only some lease scripts share (the window lease
/// steps, the sliding window counter's weighting), then the algorithm's own part. `None`
/// for the others.
pub fn lease_lua(kind: Kind) -> Option<&'static str> {
    kind.spec().lease
}

impl Scripts {
    /// The scripts of every algorithm in the table, the lease scripts and the batch
    /// scripts; with `clustered`, Redis Cluster's batch scripts, else a standalone
    /// Redis's (a cluster's `#!lua` flags line needs Redis 7 or Valkey 8, so a
    /// standalone Redis is never asked to load one; a cluster never runs the other).
    /// Their comment lines blanked ([`uncommented`]), their SHA1 computed once.
    pub fn new(clustered: bool) -> Self {
        let decisions = Kind::ALL.iter().map(|k| k.spec().lua);
        let leases = Kind::ALL.iter().map(|k| lease_lua(*k).unwrap_or(""));
        let mut texts: Vec<String> = decisions.chain(leases).map(str::to_owned).collect();
        texts.push(match clustered {
            true => cluster_batch_lua(),
            false => batch_lua(),
        });
        texts.push(super::multi::all_lua());
        texts.push(super::multi::give_back_lua());
        texts.push(super::multi::all_batch_lua(clustered));
        Scripts(
            texts
                .iter()
                .map(|t| Script::from_lua(uncommented(t)))
                .collect(),
        )
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

    /// The batch script ([`batch_lua`]), the cluster's ([`cluster_batch_lua`]) when
    /// made for a cluster.
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

    /// The all-or-nothing batch script ([`super::multi::all_batch_lua`]), the cluster's
    /// when made for a cluster.
    pub fn all_batch(&self) -> &Script {
        &self.0[2 * Kind::ALL.len() + 3]
    }

    /// Every script.
    pub fn all(&self) -> &[Script] {
        &self.0
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts::new(false)
    }
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

/// Reads a script's reply: `{allowed, remaining, reset_ms, wait_ms}`, every script
/// alike, then, from a decision under a run-time override (`lua/prelude.lua`
/// tiered()), its limit and the two halves of its rate or window.
pub fn outcome(reply: &[i64]) -> Result<Outcome, Error> {
    let (head, tier) = match *reply {
        [a, b, c, d] => ([a, b, c, d], None),
        [a, b, c, d, limit, high, low] => (
            [a, b, c, d],
            Some(Tier {
                limit: limit.max(0) as u64,
                per_bits: ((high.max(0) as u64) << 32) | (low.max(0) as u64 & 0xffff_ffff),
            }),
        ),
        _ => {
            return Err(Error::new(
                ErrorKind::Parse,
                format!("script returned {reply:?}, expected 4 or 7 integers"),
            ))
        }
    };
    let [allowed, remaining, reset_ms, wait_ms] = head;
    Ok(Outcome {
        allowed: allowed == 1,
        remaining: remaining.max(0) as u64,
        reset_ms: reset_ms.max(0) as u64,
        wait_ms: wait_ms.max(0) as u64,
        tier,
    })
}

/// The lease script's arguments: the decision's three, `""` for "now" (Redis TIME), then
/// the lease's (holder, grant given back, unspent, wanted, lifetime µs, pace µs, this
/// host's monotonic clock µs or `""`, the key's last grant read and when, µs or `""`,
/// when the call that took the grant given back was sent and answered, µs or `""`, and
/// how long before its lifetime it stopped being spent, µs), the
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
    args.push(if ask.mono_us == 0 {
        Value::from("")
    } else {
        Value::Integer(i64::try_from(ask.mono_us).unwrap_or(i64::MAX))
    });
    args.push(Value::Integer(ask.seen));
    for us in [ask.seen_at, ask.grant_sent_us, ask.grant_got_us] {
        args.push(if us == 0 {
            Value::from("")
        } else {
            Value::Integer(i64::try_from(us).unwrap_or(i64::MAX))
        });
    }
    args.push(Value::Integer(
        i64::try_from(ask.spare_us).unwrap_or(i64::MAX),
    ));
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
/// the grant named gave back, a slice's cap and refill (per s), the key's last grant
/// number and when this host could end a lease it is the witness of (µs, its clock);
/// in the holder's µ-units. Under a run-time override three more (`lua/lease.lua`
/// leased()): its limit and rate or window halves, as [`outcome`] reads them after a
/// decision's four, in the outcome's `tier`.
pub fn lease_reply(params: &Params, reply: &[i64]) -> Result<(Outcome, Granted), Error> {
    let per = lease_unit(params);
    let mu = |v: i64| (v.max(0) as u64).saturating_mul(per);
    let (lease, tier) = match reply.len() {
        12 => (reply, None),
        15 => (&reply[..12], Some(&reply[12..])),
        _ => (reply, None),
    };
    match *lease {
        [a, b, c, d, units, lifetime_us, grant, returned, cap, rate, last_grant, due] => Ok((
            match tier {
                Some(&[l, h, o]) => outcome(&[a, b, c, d, l, h, o])?,
                _ => outcome(&[a, b, c, d])?,
            },
            Granted {
                units: mu(units),
                lifetime_us: lifetime_us.max(0) as u64,
                grant,
                returned: mu(returned),
                cap: mu(cap),
                rate: rate.max(0) as u64,
                last_grant,
                witness_due: due.max(0) as u64,
            },
        )),
        _ => Err(Error::new(
            ErrorKind::Parse,
            format!("lease script returned {reply:?}, expected 12 or 15 integers"),
        )),
    }
}

#[cfg(test)]
#[path = "scripts_tests.rs"]
mod tests;
