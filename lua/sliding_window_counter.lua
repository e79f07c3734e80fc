-- Sliding window counter (CONTRACT §2; Cloudflare's weighted estimate), the twin of
-- src/algorithm/sliding_window_counter.rs: the same operations in the same order.
--
-- KEYS[1]  a hash {w = start of the current window (µs since the epoch), c = units
--          admitted in it, p = units admitted in the window before} named
--          <prefix>:{<rule>:<key>}
-- ARGV[1]  limit, units per window
-- ARGV[2]  window, µs (a whole number of ms); windows are aligned to the Unix epoch
-- ARGV[3]  cost, units (integer)
-- ARGV[4]  optional: "now" in µs. Only tests pass it; production uses Redis TIME.
-- Returns  {allowed 0|1, remaining (floor), reset_ms, wait_ms}
--
-- estimate = p × ((window − elapsed) ÷ window) + c; allowed if estimate + cost ≤ limit.
-- wait_ms is solved from the weighting and checked by settle(). The key expires 1 s
-- after its current count leaves the weighting; a DENY or a cost of 0 writes nothing.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now
if ARGV[4] then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

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

local st_start, st_current, st_previous
local s = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
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
if allowed and cost > 0 then
  current = current + cost
  st_start, st_current, st_previous = start, current, previous
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', start), 'c', string.format('%.0f', current),
    'p', string.format('%.0f', previous))
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ceil_ms(start + 2 * window - now) + 1000))
end

local reset = 0
if current > 0 then
  reset = ceil_ms(start + 2 * window - now)
elseif previous > 0 then
  reset = ceil_ms(start + window - now)
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
