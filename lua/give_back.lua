-- Giving units back (REFUND, and the undo of a CHECKALL's reservation), per algorithm.
-- src/store/multi.rs builds the scripts that give back: the prelude, the shared parts,
-- each algorithm as `decide_<kind>(ARGV)` listed in `algorithms`, then this file, then
-- `local give_backs = {give_back_<suffix>, ...}` in the algorithm table's order and
-- give_back_keys() (lua/give_back_keys.lua), then a loop: the give-back script's
-- (lua/give_back_loop.lua), or the all-or-nothing scripts' (lua/all.lua with
-- lua/all_one.lua or lua/all_batch.lua, whose batches also carry give-backs).
--
-- Each give_back_<suffix>(args, at) reads KEYS[1] and writes back at most args[3]
-- units (µ-units for buckets, as costs are) at `now` (Redis TIME): never beyond the
-- capacity or limit, never into a window other than the current one. `at` is nil for a
-- REFUND; for an undo it is the instant the reservation was taken at (the `instant`
-- lua/all.lua returned), which pins the units to the window (or log entry) they were
-- taken in, so the undo gives back exactly what the reservation took, or less (a
-- window that has ended keeps its count: it no longer matters).
--
-- Only state fields are written, never the expiry: a state given units back is fully
-- unused no later than before, so the key's TTL still outlives it.

-- The run-time override of KEYS[1] read on its own (a give-back reads no decision's
-- state first): prelude.lua override() of its ov field, or side_override()
-- (side_override.lua) for a key that is not a hash. `s`, when given, is that field as
-- redis.pcall('HMGET', KEYS[1], 'ov') read it already.
local function override_of(args, s)
  s = s or redis.pcall('HMGET', KEYS[1], 'ov')
  if s.err then
    -- Not a hash (a sorted set: its override is beside it), or a key Redis refuses
    -- (the give-back's own read raises it).
    side_override(args)
  else
    override(args, s[1])
  end
end

-- Token bucket: tokens refilled up to now, plus the units, capped at the capacity (less
-- what leases hold: bucket_leases.lua).
local function give_back_tb(args, at)
  local cap, rate, units = tonumber(args[1]), tonumber(args[2]), tonumber(args[3])
  local s = redis.call('HMGET', KEYS[1], 't', 'ts', 'o')
  if not (s[1] and s[2]) then
    return
  end
  local t, ts = tonumber(s[1]), tonumber(s[2])
  if now < ts then
    now = ts
  end
  local tokens, most = refill_leased(s[3], cap, rate, t, ts, now)
  tokens = math.min(most, tokens + units)
  redis.call('HSET', KEYS[1], 't', digits(tokens), 'ts', digits(now))
end

-- Leaky bucket: the level drained up to now, lowered by the units, at least 0.
local function give_back_lb(args, at)
  local rate, units = tonumber(args[2]), tonumber(args[3])
  local s = redis.call('HMGET', KEYS[1], 'l', 'ts')
  if not (s[1] and s[2]) then
    return
  end
  local l, ts = tonumber(s[1]), tonumber(s[2])
  if now < ts then
    now = ts
  end
  local level = math.max(l - math.floor((now - ts) * rate), 0)
  level = math.max(level - units, 0)
  redis.call('HSET', KEYS[1], 'l', digits(level), 'ts', digits(now))
end

-- The start of the epoch-aligned window holding `t`.
local function window_start(t, window)
  return t - math.fmod(t, window)
end

-- Fixed window: the current window's count lowered by the units, at least 0; nothing
-- when the stored count is another window's (or, for an undo, the reservation's
-- window is over).
local function give_back_fw(args, at)
  local window, units = tonumber(args[2]), tonumber(args[3])
  local s = redis.call('HMGET', KEYS[1], 'w', 'c')
  if not (s[1] and s[2]) then
    return
  end
  local w, c = tonumber(s[1]), tonumber(s[2])
  if now < w then
    now = w
  end
  local start = window_start(now, window)
  if w ~= start or (at and window_start(at, window) ~= start) then
    return
  end
  redis.call('HSET', KEYS[1], 'c', digits(math.max(c - units, 0)))
end

-- Sliding window counter: the current window's count lowered by the units, at least
-- 0. An undo whose reservation fell in the window before lowers that window's count
-- (`p`, or `c` while the state has not rolled yet): what it weighs on now is what the
-- reservation added.
local function give_back_swc(args, at)
  local window, units = tonumber(args[2]), tonumber(args[3])
  local s = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
  if not (s[1] and s[2] and s[3]) then
    return
  end
  local w, c, p = tonumber(s[1]), tonumber(s[2]), tonumber(s[3])
  if now < w then
    now = w
  end
  local start = window_start(now, window)
  local taken = start
  if at then
    taken = window_start(at, window)
  end
  if taken == start and w == start then
    redis.call('HSET', KEYS[1], 'c', digits(math.max(c - units, 0)))
  elseif at and taken + window == start then
    if w == start then
      redis.call('HSET', KEYS[1], 'p', digits(math.max(p - units, 0)))
    elseif w == taken then
      redis.call('HSET', KEYS[1], 'c', digits(math.max(c - units, 0)))
    end
  end
end

-- Sliding window log: units taken off log entries still in the window: for a REFUND
-- the newest first; for an undo, the entry logged at the reservation's instant. The
-- running totals of the entries after a changed one are lowered to match; an entry
-- left with no units is removed. The entries are read from the newest back by rank
-- (ZRANGE, which the documented ACL allows), doubling the count read until one is
-- older than those that matter: O(entries after the oldest changed), at most `limit`.
local function give_back_swl(args, at)
  local window, units = tonumber(args[2]), tonumber(args[3])
  local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if not top[1] then
    return
  end
  if now < tonumber(top[2]) then
    now = tonumber(top[2])
  end
  local function wanted(ts)
    if at then
      return ts >= at
    end
    return ts > now - window
  end
  if at and at <= now - window then
    return
  end
  local entries
  local n = 8
  while true do
    local flat = redis.call('ZRANGE', KEYS[1], -n, -1)
    entries = {}
    local older = false
    for i = 1, #flat do
      local ts, cum, x, k = string.match(flat[i], '^(%d+):(%d+):(%d+):(%d+)$')
      if not ts then
        -- An entry of the format before running totals: the next decision rewrites it.
        return
      end
      ts = tonumber(ts)
      if wanted(ts) then
        entries[#entries + 1] = {member = flat[i], ts = ts, cum = tonumber(cum), x = tonumber(x),
          units = tonumber(k), off = 0}
      else
        older = true
      end
    end
    if older or #flat < n then
      break
    end
    n = n * 2
  end
  if #entries == 0 then
    return
  end
  if at then
    if entries[1].ts ~= at then
      return
    end
    entries[1].off = math.min(units, entries[1].units)
  else
    local left = units
    for i = #entries, 1, -1 do
      if left <= 0 then
        break
      end
      local take = math.min(left, entries[i].units)
      entries[i].off = take
      left = left - take
    end
  end
  local removed = 0
  for i = 1, #entries do
    local e = entries[i]
    removed = removed + e.off
    if removed > 0 then
      redis.call('ZREM', KEYS[1], e.member)
      local left = e.units - e.off
      if left > 0 then
        redis.call('ZADD', KEYS[1], digits(e.ts),
          digits(e.ts) .. ':' .. digits(e.cum - removed) .. ':' .. digits(e.x) .. ':' .. digits(left))
      end
    end
  end
end
