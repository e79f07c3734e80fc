-- Prepended to every script in lua/ (src/store/redis.rs joins them at build time:
-- a Redis script cannot import another). Scripts run on the Redis clock.
--
-- ARGV[4]  optional: "now" in µs. Only tests pass it; production uses Redis TIME (and
--          sends "" when later arguments follow, as the lease scripts' do).
-- ARGV[5]  decision scripts only, optional: "1" for a dry run (a peek), which decides
--          as a request of this cost would and writes nothing (the deny cache refreshes
--          an entry with it: nobody is admitted by it, so nothing may be taken).
-- Needs Redis >= 5 (script effects replication, so TIME may precede writes).
local now
if ARGV[4] and ARGV[4] ~= '' then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- The node's own clock. `now` may later be moved ahead of it (a clock behind the
-- stored state, e.g. after a failover to a node whose clock is late, counts as
-- standing still); PEXPIRE counts from `clock`, never from `now`.
local clock = now
-- Set by each decision script from ARGV[5]; store() writes nothing when it is.
local dry = false

-- `v` as the digits Redis stores and PEXPIRE reads: no exponent, rounded to a whole
-- number as '%.0f' does. A whole number below 2^53 (every count, µs and ms here, but
-- not a shared capacity's fraction) takes the integer conversion '%d', several times
-- cheaper than glibc's float printing, which was a tenth of a decision's instructions.
-- A script deciding several keys (lua/batch.lua) sets `memo` to a table that keeps
-- each number's digits for the rest of its call: its decisions share one instant, and
-- new keys of one rule store the same state and expiry, so most lookups hit.
local format = string.format
local memo
local function digits(v)
  local s = memo and memo[v]
  if s then
    return s
  end
  if v % 1 == 0 and v < 9007199254740992 and v > -9007199254740992 then
    s = format('%d', v)
  else
    s = format('%.0f', v)
  end
  if memo and v == v then -- NaN is no table key
    memo[v] = s
  end
  return s
end

-- µs to whole ms, rounded up (src/algorithm/mod.rs ceil_ms).
local function ceil_ms(us)
  return math.ceil(us / 1000)
end

-- The first whole ms k >= lo with ok(k), from a closed-form guess: check it, else
-- gallop to a bracket and bisect (src/algorithm/mod.rs settle(), the same steps).
local function settle(guess, lo, ok)
  local k = math.max(guess, lo)
  local good, bad
  local step = 1
  if ok(k) then
    good = k
    while true do
      local below = good - step
      if below < lo then
        bad = lo - 1
        break
      end
      if not ok(below) then
        bad = below
        break
      end
      good = below
      step = step * 2
    end
  else
    bad = k
    while true do
      local above = bad + step
      if ok(above) then
        good = above
        break
      end
      bad = above
      step = step * 2
      if step > 1e15 then
        return above
      end
    end
  end
  while good - bad > 1 do
    local mid = math.floor((bad + good) / 2)
    if ok(mid) then
      good = mid
    else
      bad = mid
    end
  end
  return good
end

-- How long KEYS[1] must live, for a state fully unused `reset_ms` after `now`: counted
-- from the node's own clock (`now - clock` is what a clamp added), plus a 1 s margin.
-- Returns the TTL in ms and the expiry it sets, µs on the node's clock (stored with
-- the state as `x`).
local function expiry(reset_ms)
  local ms = ceil_ms(now - clock) + reset_ms + 1000
  return ms, clock + ms * 1000
end

-- True when a decision that writes nothing must still lengthen the key's life: the
-- rule in force (a reload may have lengthened it) needs the state until `x`, more
-- than 1 s (the margin) after the expiry stored with it (`stored`, nil on keys written
-- before expiries were stored). Within the margin the stored expiry still outlives
-- the state, so a DENY writes nothing.
local function outlives(stored, reset_ms, x)
  return reset_ms > 0 and (stored == nil or x > stored + 1000000)
end

-- The run-time override in force on KEYS[1] (override()): `tier` = {its limit, the
-- high and low 32 bits of its rate or window}, nil without one; `kept` = when it ends,
-- µs on the node's clock, true when it has no end, nil without one.
local tier, kept

-- Stores a state kept in the hash KEYS[1] that is fully unused `reset_ms` after `now`.
-- When `write`: its fields, the pairs (a, va), (b, vb) and, if given, (c, vc), numbers,
-- with the expiry. Otherwise only the expiry, when the rule in force needs the state
-- longer than the one stored with it (`stored`, see outlives()). Either write sets the
-- key's TTL. A dry run writes nothing. Numbers go through digits(): Redis would print
-- large ones as 1e+17, which HSET would store inexactly and PEXPIRE would reject.
local function store(write, stored, reset_ms, a, va, b, vb, c, vc)
  if dry then
    return
  end
  local ttl, x = expiry(reset_ms)
  if write then
    if c then
      redis.call('HSET', KEYS[1], a, digits(va), b, digits(vb),
        c, digits(vc), 'x', digits(x))
    else
      redis.call('HSET', KEYS[1], a, digits(va), b, digits(vb),
        'x', digits(x))
    end
  elseif outlives(stored, reset_ms, x) then
    redis.call('HSET', KEYS[1], 'x', digits(x))
  else
    return
  end
  -- The key outlives its override (override()): none while it has no end (the key
  -- then has no TTL), at least its remaining life otherwise, plus 1 ms: Redis counts
  -- PEXPIRE from its own ms, which may be up to 1 ms behind `clock`.
  if kept then
    if kept == true then
      return
    end
    local left = ceil_ms(kept - clock) + 1
    if left > ttl then
      ttl = left
    end
  end
  redis.call('PEXPIRE', KEYS[1], digits(ttl))
end

-- A run-time override of the key's parameters (OVERRIDE, src/limiter/tiers.rs). For an
-- algorithm whose state is a hash, it lives in that hash, beside the state, in two
-- fields no state or lease field is named: ov = "<a> <b> <l> <h> <o> <e>" (a, b = the
-- decision's ARGV[1] and ARGV[2] under the override, l = its limit, h, o = the high
-- and low 32 bits of its rate (f64 bits) or window (ms), e = when it ends, µs on the
-- node's clock, or "-" until cleared) and op = its text (INSPECT only). One field, so
-- that the HMGET that reads the state reads it too for one more name: the decision
-- script asks for ov after its state's fields and calls override(args, ov). One read,
-- so the cluster batch still reads its key before any write, and the override moves
-- with the state in a slot migration. An override past its end is ignored (Redis 7.0
-- has no per-field expiry); the key's TTL is never below its remaining life (store()),
-- and a key whose override has no end has no TTL. A hash holding only these fields has
-- no state: a new key.
--
-- override() replaces args[1], args[2]; tiered() adds l, h, o to the reply, so the
-- daemon reports the overridden limit and can decide the key without Redis under it.
local function override(args, ov)
  tier, kept = nil, nil
  if not ov then
    return
  end
  local a, b, l, h, o, e = string.match(ov, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  if not a then
    return
  end
  e = tonumber(e)
  if e and e <= clock then
    return
  end
  args[1], args[2] = a, b
  tier = {tonumber(l), tonumber(h), tonumber(o)}
  kept = e or true
end

local function tiered(reply)
  if tier then
    reply[5], reply[6], reply[7] = tier[1], tier[2], tier[3]
  end
  return reply
end
