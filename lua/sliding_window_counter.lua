-- Sliding window counter (docs/PROTOCOL.md §2; Cloudflare's weighted estimate), the twin of
-- src/algorithm/sliding_window_counter.rs: the same operations in the same order.
--
-- KEYS[1]  a hash {w = start of the current window (µs since the epoch), c = units
--          admitted in it, p = units admitted in the window before, x = the key's
--          expiry, µs on the node's clock} named <prefix>:{<rule>:<key>}
-- ARGV[1]  limit, units per window
-- ARGV[2]  window, µs (a whole number of ms); windows are aligned to the Unix epoch
-- ARGV[3]  cost, units (integer)
-- ARGV[4]  optional "now" in µs (tests only): see prelude.lua, prepended to this file.
-- Returns  {allowed 0|1, remaining (floor), reset_ms, wait_ms}
--
-- estimate = p × ((window − elapsed) ÷ window) + c; allowed if estimate + cost ≤ limit.
-- wait_ms is solved from the weighting and checked by settle(). The key expires 1 s
-- after its current count leaves the weighting, counted on the node's own clock
-- (prelude expiry()); a DENY or a cost of 0 writes nothing, unless the rule in force
-- needs the counts longer than their stored expiry (a reload lengthened the window).
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local st_start, st_current, st_previous
local s = redis.call('HMGET', KEYS[1], 'w', 'c', 'p', 'x')
local st_x = tonumber(s[4])
if s[1] and s[2] and s[3] then
  st_start = tonumber(s[1])
  st_current = tonumber(s[2])
  st_previous = tonumber(s[3])
  if now < st_start then
    now = st_start
  end
end

-- (current, previous) of the stored state seen from the window starting at `start`.
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

local function estimate_at(t)
  if st_start and t < st_start then
    t = st_start
  end
  local start = t - math.fmod(t, window)
  local c, p = roll(start)
  return estimate(c, p, t - start)
end

local start = now - math.fmod(now, window)
local current, previous = roll(start)
local elapsed = now - start
local allowed = estimate(current, previous, elapsed) + cost <= limit
local write = allowed and cost > 0
if write then
  current = current + cost
  st_start, st_current, st_previous = start, current, previous
end

local reset = 0
if current > 0 then
  reset = ceil_ms(start + 2 * window - now)
elseif previous > 0 then
  reset = ceil_ms(start + window - now)
end
local ttl, x = expiry(reset)
if write then
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', start), 'c', string.format('%.0f', current),
    'p', string.format('%.0f', previous), 'x', string.format('%.0f', x))
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
elseif outlives(st_x, reset, x) then
  redis.call('HSET', KEYS[1], 'x', string.format('%.0f', x))
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
end
local wait = 0
if not allowed then
  if cost > limit then
    wait = math.max(reset, 1)
  else
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
return {allowed and 1 or 0, math.max(math.floor(limit - estimate(current, previous, elapsed)), 0), reset, wait}
