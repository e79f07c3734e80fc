//! Where a run-time override (`OVERRIDE`) lives in Redis, and the three scripts that
//! write it, read it for `INSPECT`, and keep it through `RESET`.
//!
//! For an algorithm whose state is a hash (token bucket, leaky bucket, fixed window,
//! sliding window counter) the override lives in the state hash itself, in the fields
//! `ov` (what the decision applies, and its end) and `op` (its text, for `INSPECT`;
//! `lua/prelude.lua` override()), so that the decision reads it in the same `HMGET` as
//! the state and a slot migration moves both at once.
//! The key then lives at least as long as the override: no TTL while it has no end,
//! at least its remaining life otherwise. For the sliding window log (a sorted set) it
//! is the hash `<state key>:ov` beside it (`a b l h o p`, its end as that hash's TTL).
//!
//! The side hash is also written for the hash algorithms, for daemons of the release
//! before in-hash overrides, which read only it (docs/OPERATIONS.md, "Rolling
//! upgrades and in-hash overrides"); it is never read for them here.

use crate::algorithm::Kind;
use crate::store::{StoreKey, TierRecord};
use fred::types::Value;

/// True when `key` (`<prefix>:{<rule>:<key>}:<suffix>`) is the state of an algorithm
/// whose state is a hash, which then holds the key's override.
pub(super) fn in_hash(key: &StoreKey) -> bool {
    let text = key.as_str();
    let suffix = text.rsplit_once("}:").map_or("", |(_, s)| s);
    Kind::ALL.iter().any(|k| {
        k.spec().suffix == suffix && !matches!(k, Kind::SlidingWindowLog | Kind::Concurrency)
    })
}

/// The side hash of `key`'s override: the state key with `:ov`, in the same hash tag's
/// slot.
fn side_key(key: &StoreKey) -> String {
    format!("{}:ov", key.as_str())
}

/// The arguments of an `EVAL` of `script`: the script, the number of `keys`, `keys`,
/// then "1" when `key`'s override lives in its state hash, else "0". A script names only
/// the keys it touches: while a slot migrates, Redis Cluster answers `TRYAGAIN` to a
/// call naming two keys of which only one has moved.
fn eval_args(script: &'static str, key: &StoreKey, keys: Vec<String>) -> Vec<Value> {
    let mut args = vec![Value::from(script), Value::Integer(keys.len() as i64)];
    args.extend(keys.into_iter().map(Value::from));
    args.push(Value::from(if in_hash(key) { "1" } else { "0" }));
    args
}

/// The `EVAL` arguments of [`WRITE`]: the override `tier` written, or cleared (`None`).
pub(super) fn write_args(key: &StoreKey, tier: Option<TierRecord>) -> Vec<Value> {
    let mut args = eval_args(WRITE, key, vec![key.as_str().to_owned(), side_key(key)]);
    if let Some(t) = tier {
        let [a, b] = t.args;
        args.extend([
            a,
            b,
            Value::Integer(t.tier.limit as i64),
            Value::Integer((t.tier.per_bits >> 32) as i64),
            Value::Integer((t.tier.per_bits & 0xffff_ffff) as i64),
            Value::from(t.text),
            Value::from(t.ttl_ms.map_or_else(String::new, |ms| ms.to_string())),
        ]);
    }
    args
}

/// The `EVAL` arguments of [`READ`]: the state hash, or the side hash of a key whose
/// override lives there.
pub(super) fn read_args(key: &StoreKey) -> Vec<Value> {
    let read = if in_hash(key) {
        key.as_str().to_owned()
    } else {
        side_key(key)
    };
    eval_args(READ, key, vec![read])
}

/// The `EVAL` arguments of [`RESET`].
pub(super) fn reset_args(key: &StoreKey) -> Vec<Value> {
    eval_args(RESET, key, vec![key.as_str().to_owned()])
}

/// Replaces the override of `KEYS[1]` (state) / `KEYS[2]` (side hash) with `ARGV[2..8]` (a,
/// b, l, h, o, p, then its ttl in ms or ""), or clears it when there are none; `ARGV[1]`
/// "1": the override lives in the state hash (fields `ov` = "a b l h o end", end in µs
/// on the node's clock or "-", and `op` = p), and in the side hash for older daemons.
/// One script: a decision never reads half an override.
///
/// The state hash's TTL: none under an override without end (`PERSIST`); under one
/// with a ttl, the longest of that ttl (plus 1 ms: Redis counts a TTL from its own ms,
/// which may be up to 1 ms behind `TIME`), the key's TTL and what its state needs (its
/// stored expiry `x`, µs on the node's clock). A clear gives a key left without TTL
/// (its override had no end) its state's TTL again, or deletes it when its state is
/// fully unused (no `x` ahead), as an expired key would be.
const WRITE: &str = "local hash = ARGV[1] == '1'\n\
local t = redis.call('TIME')\n\
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n\
redis.call('DEL', KEYS[2])\n\
if hash then\n\
  redis.call('HDEL', KEYS[1], 'ov', 'op')\n\
end\n\
local function state_ms()\n\
  local x = tonumber(redis.call('HGET', KEYS[1], 'x') or '')\n\
  if x and x > now then return math.ceil((x - now) / 1000) end\n\
  return nil\n\
end\n\
if #ARGV < 8 then\n\
  if hash and redis.call('PTTL', KEYS[1]) == -1 then\n\
    local ms = state_ms()\n\
    if ms then redis.call('PEXPIRE', KEYS[1], ms) else redis.call('DEL', KEYS[1]) end\n\
  end\n\
  return 1\n\
end\n\
redis.call('HSET', KEYS[2], 'a', ARGV[2], 'b', ARGV[3], 'l', ARGV[4], 'h', ARGV[5], 'o', ARGV[6], 'p', ARGV[7])\n\
if ARGV[8] ~= '' then redis.call('PEXPIRE', KEYS[2], ARGV[8]) end\n\
if not hash then return 1 end\n\
local ov = ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[6] .. ' '\n\
if ARGV[8] == '' then\n\
  redis.call('HSET', KEYS[1], 'ov', ov .. '-', 'op', ARGV[7])\n\
  redis.call('PERSIST', KEYS[1])\n\
  return 1\n\
end\n\
local ttl = tonumber(ARGV[8])\n\
redis.call('HSET', KEYS[1], 'ov', ov .. string.format('%d', now + ttl * 1000), 'op', ARGV[7])\n\
local need = math.max(ttl + 1, redis.call('PTTL', KEYS[1]), state_ms() or 0)\n\
redis.call('PEXPIRE', KEYS[1], string.format('%d', need))\n\
return 1";

/// The override in `KEYS[1]`, the state hash (`ARGV[1]` "1", as for [`WRITE`]) or the
/// side hash, as `{text, ms left}` (-1: no end), or nil without one in force (an
/// override of the state hash past its end is none).
const READ: &str = "if ARGV[1] == '1' then\n\
  local o = redis.call('HMGET', KEYS[1], 'op', 'ov')\n\
  if not (o[1] and o[2]) then return false end\n\
  local e = tonumber(string.match(o[2], '(%S+)$'))\n\
  if not e then return {o[1], -1} end\n\
  local t = redis.call('TIME')\n\
  local left = e - (tonumber(t[1]) * 1000000 + tonumber(t[2]))\n\
  if left <= 0 then return false end\n\
  return {o[1], math.ceil(left / 1000)}\n\
end\n\
local p = redis.call('HGET', KEYS[1], 'p')\n\
if not p then return false end\n\
return {p, redis.call('PTTL', KEYS[1])}";

/// `RESET` of `KEYS[1]`: its state and any leases recorded in it deleted; an override in
/// it (`ARGV[1]` "1", as for [`WRITE`]) still in force is written back, with the TTL of
/// its remaining life plus 1 ms (none without end). The side hash stays as it is.
const RESET: &str = "if ARGV[1] ~= '1' then\n\
  redis.call('DEL', KEYS[1])\n\
  return 1\n\
end\n\
local o = redis.call('HMGET', KEYS[1], 'ov', 'op')\n\
redis.call('DEL', KEYS[1])\n\
if not (o[1] and o[2]) then return 1 end\n\
local e = tonumber(string.match(o[1], '(%S+)$'))\n\
local ms\n\
if e then\n\
  local t = redis.call('TIME')\n\
  ms = math.ceil((e - (tonumber(t[1]) * 1000000 + tonumber(t[2]))) / 1000)\n\
  if ms <= 0 then return 1 end\n\
  ms = ms + 1\n\
end\n\
redis.call('HSET', KEYS[1], 'ov', o[1], 'op', o[2])\n\
if ms then\n\
  redis.call('PEXPIRE', KEYS[1], string.format('%d', ms))\n\
end\n\
return 1";
