-- Sliding window log (docs/ALGORITHMS.md), the twin of src/algorithm/sliding_window_log.rs.
--
-- KEYS[1]  a sorted set named <prefix>:{<rule>:<key>}: one member per admission
--          instant, score = µs on the Redis clock, member =
--          "<µs>:<cum>:<x>:<units>": the units admitted then, `cum` the running total
--          of units admitted up to and including this entry, and (read on the newest
--          entry only) `x` the key's expiry, µs on the node's clock
-- ARGV[1]  limit, units per sliding window
-- ARGV[2]  window, µs
-- ARGV[3]  cost, units (integer)
-- ARGV[4]  optional "now" in µs (tests only): see prelude.lua, prepended to this file.
-- ARGV[5]  optional "1": a dry run, the same reply and no write (prelude.lua).
-- Returns  {allowed 0|1, remaining (floor), reset_ms, wait_ms}
--
-- Exact: allowed if the units logged in (now - window, now] plus cost fit in limit.
-- Only admitted units are logged, so the set never holds more than `limit` members.
-- O(log n) per decision, amortised: the units in the window are the newest entry's
-- running total minus the one before the oldest live entry (two ZRANGEs by rank),
-- expired entries are removed with one ZREMRANGEBYSCORE (each entry once), and a DENY's
-- wait_ms is found by a search over ranks, O(log n) ZRANGEs. The key expires 1 s after
-- its newest entry leaves the window, counted on the node's own clock (prelude
-- expiry()); a DENY or a cost of 0 writes nothing but the trimming, unless the rule in
-- force needs the log longer than its stored expiry (a reload lengthened the window).
-- A dry run writes only the trimming and the rewrite below, which change no decision
-- (nor the key's TTL).
--
-- Members written by versions without running totals ("<µs>:<units>") are rewritten
-- once, O(n), the first time this script finds one as the newest entry.
side_override(ARGV)
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
dry = ARGV[5] == '1'

-- The entry at `rank` (0 = oldest, -1 = newest), or nil.
local function at(rank)
  local m = redis.call('ZRANGE', KEYS[1], rank, rank)[1]
  if not m then
    return nil
  end
  local ts, cum, x, units = string.match(m, '^(%d+):(%d+):(%d+):(%d+)$')
  if not ts then
    return {member = m, legacy = true}
  end
  return {member = m, ts = tonumber(ts), cum = tonumber(cum), x = tonumber(x), units = tonumber(units)}
end

local function member(ts, cum, x, units)
  return digits(ts) .. ':' .. digits(cum) .. ':' .. digits(x) .. ':' .. digits(units)
end

-- Rewrites every member with running totals (members of an earlier format, whose last
-- field is the units); expiry 0, so the next decision stores one. Each new member is
-- added before the old one goes, so the key is never empty and keeps its TTL (also in a
-- dry run, which stores none).
local function migrate()
  local flat = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  local cum = 0
  for i = 1, #flat / 2 do
    local m = flat[2 * i - 1]
    local ts = tonumber(string.match(m, '^(%d+):'))
    local units = tonumber(string.match(m, ':(%d+)$'))
    cum = cum + units
    redis.call('ZADD', KEYS[1], flat[2 * i], member(ts, cum, 0, units))
    redis.call('ZREM', KEYS[1], m)
  end
end

local top = at(-1)
if top and top.legacy then
  migrate()
  top = at(-1)
end
if top and now < top.ts then
  now = top.ts
end
local cutoff = now - window
-- `base`: the running total just before the oldest entry still in the window.
local used, base = 0, 0
local live = false
if top then
  local oldest = at(0)
  if oldest.ts <= cutoff then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', digits(cutoff))
    if top.ts > cutoff then
      oldest = at(0)
    else
      oldest = nil
    end
  end
  if oldest then
    live = true
    base = oldest.cum - oldest.units
    used = top.cum - base
  end
end

local allowed = used + cost <= limit
local admit = allowed and cost > 0
local used_after = used
local newest = nil
if live then
  newest = top.ts
end
if admit then
  used_after = used + cost
  newest = now
end
local reset = 0
if newest then
  reset = ceil_ms(newest + window - now)
end
local ttl, x = expiry(reset)
if admit and not dry then
  local units, cum = cost, cost
  if live then
    cum = top.cum + cost
    if top.ts == now then
      units = top.units + cost
      redis.call('ZREM', KEYS[1], top.member)
    end
  end
  redis.call('ZADD', KEYS[1], digits(now), member(now, cum, x, units))
  redis.call('PEXPIRE', KEYS[1], digits(ttl))
elseif not dry and live and outlives(top.x, reset, x) then
  redis.call('ZREM', KEYS[1], top.member)
  redis.call('ZADD', KEYS[1], digits(top.ts), member(top.ts, top.cum, x, top.units))
  redis.call('PEXPIRE', KEYS[1], digits(ttl))
end

local wait = 0
if not allowed then
  if cost > limit then
    wait = math.max(reset, 1)
  else
    -- The oldest entries leave first: the first rank whose running total since `base`
    -- frees `need` units (the newest always does: cost <= limit). Gallop, then bisect.
    local need = used + cost - limit
    local function frees(rank)
      local e = at(rank)
      return e == nil or e.cum - base >= need
    end
    local bad, good = -1, nil
    local step = 1
    while not good do
      local r = bad + step
      if frees(r) then
        good = r
      else
        bad = r
        step = step * 2
      end
    end
    while good - bad > 1 do
      local mid = math.floor((bad + good) / 2)
      if frees(mid) then
        good = mid
      else
        bad = mid
      end
    end
    local e = at(good)
    wait = ceil_ms(e.ts + window - now)
  end
end
return tiered({allowed and 1 or 0, math.max(math.floor(limit - used_after), 0), reset, wait})
