-- Sliding window counter (docs/ALGORITHMS.md; Cloudflare's weighted estimate), the twin of
-- src/algorithm/sliding_window_counter.rs: the same operations in the same order.
--
-- KEYS[1]  a hash {w = start of the current window (µs since the epoch), c = units
--          admitted in it, p = units admitted in the window before, x = the key's
--          expiry, µs on the node's clock, and a run-time override's fields
--          (prelude.lua override())} named <prefix>:{<rule>:<key>}
-- ARGV[1]  limit, units per window
-- ARGV[2]  window, µs (a whole number of ms); windows are aligned to the Unix epoch
-- ARGV[3]  cost, units (integer)
-- ARGV[4]  optional "now" in µs (tests only): see prelude.lua, prepended to this file
--          (then window_counter.lua and window_leases.lua).
-- ARGV[5]  optional "1": a dry run, the same reply and no write (prelude.lua).
-- Returns  {allowed 0|1, remaining (floor), reset_ms, wait_ms}
--
-- estimate = p × ((window − elapsed) ÷ window) + c; allowed if estimate + cost ≤ limit.
-- Leases of daemons that take them (field o) are counted as window_leases.lua says.
-- wait_ms is solved from the weighting and checked by settle() (window_counter.lua).
-- The key expires 1 s after its current count leaves the weighting, counted on the
-- node's own clock (prelude expiry()); a DENY or a cost of 0 writes nothing, unless the
-- rule in force needs the counts longer than their stored expiry (a reload lengthened
-- the window).
local s = redis.call('HMGET', KEYS[1], 'w', 'c', 'p', 'x', 'ov', 'o')
override(ARGV, s[5])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
dry = ARGV[5] == '1'
local st_start, st_current, st_previous
local st_x = tonumber(s[4])
if s[1] and s[2] and s[3] then
  st_start = tonumber(s[1])
  st_current = tonumber(s[2])
  st_previous = tonumber(s[3])
  if now < st_start then
    now = st_start
  end
end

local start = now - math.fmod(now, window)
local current, previous = roll(st_start, st_current, st_previous, window, start)
-- What leases may still spend (window_leases.lua) is decided on as if counted.
local lc, lp, latest = leased(s[6], st_start, start, window)
local elapsed = now - start
local allowed = estimate(current + lc, previous + lp, elapsed, window) + cost <= limit
local write = allowed and cost > 0
if write then
  current = current + cost
end

local reset = counter_reset(window, start, current + lc, previous + lp)
if lc + lp > 0 then
  reset = math.max(reset, ceil_ms(latest + window - now))
end
store(write, st_x, reset, 'w', start, 'c', current, 'p', previous)
local wait = 0
if not allowed then
  wait = counter_wait(limit, window, cost, reset, start, current + lc, previous + lp)
end
return tiered({allowed and 1 or 0, math.max(math.floor(limit - estimate(current + lc, previous + lp, elapsed, window)), 0), reset, wait})
