-- Leaky bucket as a traffic-shaping meter (docs/ALGORITHMS.md), the twin of
-- src/algorithm/leaky_bucket.rs: the same operations on IEEE doubles in the same order.
--
-- KEYS[1]  the queue: a hash {l = level in micro-units, ts = µs on the Redis clock,
--          x = the key's expiry, µs on the node's clock, and a run-time override's fields
--          (prelude.lua override())} named <prefix>:{<rule>:<key>}
-- ARGV[1]  capacity (queue size), micro-units (integer; capacity × 1e6)
-- ARGV[2]  leak rate, units/s (= micro-units/µs), > 0
-- ARGV[3]  cost, micro-units (integer)
-- ARGV[4]  optional "now" in µs (tests only): see prelude.lua, prepended to this file.
-- ARGV[5]  optional "1": a dry run, the same reply and no write (prelude.lua).
-- Returns  {allowed 0|1, remaining units (floor), reset_ms, wait_ms}
--
-- A new or expired key is empty. On ALLOW, wait_ms = level before the request ÷ leak
-- rate (ceil): the caller waits that long, so admitted work runs at the leak rate. On
-- DENY, wait_ms = first whole ms with room for `cost`. The key expires 1 s after the
-- queue would be empty, counted on the node's own clock (prelude expiry()); a DENY or a
-- cost of 0 writes nothing, unless the rule in force needs the state longer than its
-- stored expiry (a reload slowed the leak).
local s = redis.call('HMGET', KEYS[1], 'l', 'ts', 'x', 'ov')
override(ARGV, s[4])
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
dry = ARGV[5] == '1'
local st_level, st_ts
local st_x = tonumber(s[3])
if s[1] and s[2] then
  st_level = tonumber(s[1])
  st_ts = tonumber(s[2])
  if now < st_ts then
    now = st_ts
  end
end

local function level_at(t)
  if not st_level then
    return 0
  end
  if t < st_ts then
    t = st_ts
  end
  return math.max(st_level - math.floor((t - st_ts) * rate), 0)
end

local level = level_at(now)
local allowed = level + cost <= cap
local wait = 0
if allowed then
  wait = ceil_ms(level / rate)
  if cost > 0 then
    level = level + cost
    st_level = level
    st_ts = now
  end
end
-- settle()'s two checks of a right guess, made inline: no closure on the common path.
local reset = ceil_ms(level / rate)
if reset < 0 or level_at(now + reset * 1000) > 0
    or (reset > 0 and level_at(now + (reset - 1) * 1000) <= 0) then
  reset = settle(reset, 0, function(k)
    return level_at(now + k * 1000) <= 0
  end)
end
if not allowed then
  if cost > cap then
    wait = math.max(reset, 1)
  else
    wait = settle(ceil_ms((level + cost - cap) / rate), 1, function(k)
      return level_at(now + k * 1000) + cost <= cap
    end)
  end
end

store(allowed and cost > 0, st_x, reset, 'l', level, 'ts', now)
return tiered({allowed and 1 or 0, math.max(math.floor((cap - level) / 1000000), 0), reset, wait})
