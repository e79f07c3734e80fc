-- Sliding window counter with leases (docs/DESIGN.md "Leases"):
-- lua/sliding_window_counter.lua's decision, plus the lease bookkeeping of lua/lease.lua
-- (prepended, with prelude.lua, to this file).
--
-- KEYS[1]  sliding_window_counter.lua's hash {w, c, p, x} plus {n, l:<holder>...}
-- ARGV     sliding_window_counter.lua's (limit, window µs, cost, now), then lease.lua's
--          (holder, grant given back, unspent units, wanted units, lifetime µs, pace
--          µs)
-- Returns  {allowed, remaining, reset_ms, wait_ms, granted units, lifetime µs, grant}
--
-- A lease's units are counted in the current window when granted, with the estimate
-- then (p × remaining weight + c) plus the grant at most `limit`; its deadline is at most
-- the window's end. Every unit is spent later in the same window, where the previous
-- window's weight is smaller and the current count already holds it: the estimate a
-- request would have met at its real time is never above what the grant checked.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local fields, leases = read_state(KEYS[1])
local st_start, st_current, st_previous = tonumber(fields.w), tonumber(fields.c), tonumber(fields.p)
local st_n = tonumber(fields.n)
if st_start and st_current and st_previous then
  if now < st_start then
    now = st_start
  end
else
  st_start, st_current, st_previous = nil, nil, nil
end
local function roll(start)
  if st_start == nil then
    return 0, 0
  elseif st_start == start then
    return st_current, st_previous
  elseif st_start + window == start then
    return 0, st_current
  end
  return 0, 0
end
local function estimate(c, p, elapsed)
  return p * ((window - elapsed) / window) + c
end
local start = now - math.fmod(now, window)
local current, previous = roll(start)
local back = settle_leases(KEYS[1], leases, now)
local returned = back > 0
if st_start ~= start then
  back = 0
end
current = math.max(current - back, 0)
local elapsed = now - start
local allowed = estimate(current, previous, elapsed) + cost <= limit
if allowed then
  current = current + cost
end
local to_end = start + window - now
local life = math.min(lifetime, to_end)
local granted = 0
local grant = 0
if life >= 1000 then
  granted = grant_size(math.max(math.floor(limit - estimate(current, previous, elapsed)), 0), 1, leases)
end
if granted > 0 then
  current = current + granted
  grant = record_lease(KEYS[1], granted, now + life, st_n)
end
local reset = 0
if current > 0 then
  reset = ceil_ms(start + 2 * window - now)
elseif previous > 0 then
  reset = ceil_ms(to_end)
end
-- Written when the counts changed; otherwise, as the plain script, only to lengthen
-- the key's life. A key without leases is decided and stored exactly as
-- sliding_window_counter.lua does (tests/twins.rs).
local ttl, x = expiry(reset)
if (allowed and cost > 0) or granted > 0 or returned then
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', start), 'c', string.format('%.0f', current),
    'p', string.format('%.0f', previous), 'x', string.format('%.0f', x))
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
elseif outlives(tonumber(fields.x), reset, x) then
  redis.call('HSET', KEYS[1], 'x', string.format('%.0f', x))
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
end
local wait = 0
if not allowed then
  if cost > limit then
    wait = math.max(reset, 1)
  else
    -- As sliding_window_counter.lua: solved from the weighting, checked by settle().
    st_start, st_current, st_previous = start, current, previous
    local function estimate_at(t)
      if t < st_start then
        t = st_start
      end
      local s0 = t - math.fmod(t, window)
      local c, p = roll(s0)
      return estimate(c, p, t - s0)
    end
    local when
    if current + cost <= limit then
      when = start + window - window * ((limit - cost - current) / previous)
    else
      when = start + 2 * window - window * ((limit - cost) / current)
    end
    wait = settle(ceil_ms(when - now), 1, function(k)
      return estimate_at(now + k * 1000) + cost <= limit
    end)
  end
end
return {allowed and 1 or 0, math.max(math.floor(limit - estimate(current, previous, elapsed)), 0),
  reset, wait, granted, granted > 0 and life or 0, grant}
