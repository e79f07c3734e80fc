-- Sliding window log (CONTRACT §2), the twin of src/algorithm/sliding_window_log.rs.
--
-- KEYS[1]  a sorted set named <prefix>:{<rule>:<key>}: one member per admission
--          instant, score = µs on the Redis clock, member = "<µs>:<units admitted then>"
-- ARGV[1]  limit, units per sliding window
-- ARGV[2]  window, µs
-- ARGV[3]  cost, units (integer)
-- ARGV[4]  optional "now" in µs (tests only): see prelude.lua, prepended to this file.
-- Returns  {allowed 0|1, remaining (floor), reset_ms, wait_ms}
--
-- Exact: allowed if the units logged in (now - window, now] plus cost fit in limit.
-- Only admitted units are logged, so the set never holds more than `limit` members;
-- entries that left the window are removed on the next decision, and the key expires
-- 1 s after its newest entry leaves the window.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local flat = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local n = #flat / 2
local ts, units = {}, {}
for i = 1, n do
  ts[i] = tonumber(flat[2 * i])
  units[i] = tonumber(string.match(flat[2 * i - 1], ':(%d+)$'))
end
if n > 0 and now < ts[n] then
  now = ts[n]
end
local cutoff = now - window
local expired = 0
while expired < n and ts[expired + 1] <= cutoff do
  expired = expired + 1
end
local used = 0
for i = expired + 1, n do
  used = used + units[i]
end

local allowed = used + cost <= limit
local admit = allowed and cost > 0
if expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', cutoff))
end
local used_after = used
local newest = nil
if n > expired then
  newest = ts[n]
end
if admit then
  used_after = used + cost
  newest = now
  local merged = cost
  if n > expired and ts[n] == now then
    merged = units[n] + cost
    redis.call('ZREM', KEYS[1], flat[2 * n - 1])
  end
  redis.call('ZADD', KEYS[1], string.format('%.0f', now), string.format('%.0f:%.0f', now, merged))
end
local reset = 0
if newest then
  reset = ceil_ms(newest + window - now)
end
if admit then
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', reset + 1000))
end
local wait = 0
if not allowed then
  if cost > limit then
    wait = math.max(reset, 1)
  else
    local need = used + cost - limit
    local freed = 0
    wait = math.max(reset, 1)
    for i = expired + 1, n do
      freed = freed + units[i]
      if freed >= need then
        wait = ceil_ms(ts[i] + window - now)
        break
      end
    end
  end
end
return {allowed and 1 or 0, math.max(math.floor(limit - used_after), 0), reset, wait}
