-- Fixed window (docs/ALGORITHMS.md), the twin of src/algorithm/fixed_window.rs.
--
-- KEYS[1]  a hash {w = start of the window, µs since the epoch, c = units admitted in
--          it, x = the key's expiry, µs on the node's clock, and a run-time
--          override's fields (prelude.lua override())} named <prefix>:{<rule>:<key>}
-- ARGV[1]  limit, units per window (may be fractional in tests of shared limits)
-- ARGV[2]  window, µs (a whole number of ms); windows are aligned to the Unix epoch
-- ARGV[3]  cost, units (integer)
-- ARGV[4]  optional "now" in µs (tests only): see prelude.lua, prepended to this file
--          (then window_leases.lua).
-- ARGV[5]  optional "1": a dry run, the same reply and no write (prelude.lua).
-- Returns  {allowed 0|1, remaining (floor), reset_ms, wait_ms}
--
-- Leases of daemons that take them (field o) are counted as window_leases.lua says.
-- The key expires 1 s after its window ends, counted on the node's own clock (prelude
-- expiry()); a DENY or a cost of 0 writes nothing, unless the rule in force needs the
-- count longer than its stored expiry (a reload lengthened the window).
local s = redis.call('HMGET', KEYS[1], 'w', 'c', 'x', 'ov', 'o')
override(ARGV, s[4])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
dry = ARGV[5] == '1'
local st_start, st_count
local st_x = tonumber(s[3])
if s[1] and s[2] then
  st_start = tonumber(s[1])
  st_count = tonumber(s[2])
  if now < st_start then
    now = st_start
  end
end
-- math.fmod is C fmod: exact, as Rust's %.
local start = now - math.fmod(now, window)
local count = 0
if st_start == start then
  count = st_count
end
-- What leases may still spend (window_leases.lua) is decided on as if counted.
local leased_units, _, latest = leased(s[5], st_start, start, window)

local allowed = count + leased_units + cost <= limit
local to_end = ceil_ms(start + window - now)
local write = allowed and cost > 0
if write then
  count = count + cost
end
local reset = 0
if count + leased_units > 0 then
  reset = to_end
end
if leased_units > 0 then
  reset = math.max(reset, ceil_ms(latest - now))
end
store(write, st_x, reset, 'w', start, 'c', count)
local wait = 0
if not allowed then
  if cost > limit then
    wait = math.max(reset, 1)
  else
    wait = to_end
  end
end
return tiered({allowed and 1 or 0, math.max(math.floor(limit - count - leased_units), 0), reset, wait})
