-- Sliding window counter with leases (docs/DESIGN.md "Leases"):
-- lua/sliding_window_counter.lua's decision, plus the lease bookkeeping of lua/lease.lua
-- and lua/lease_window.lua (prepended, after prelude.lua, to this file, then the
-- weighting of lua/window_counter.lua).
--
-- KEYS[1]  sliding_window_counter.lua's hash {w, c, p, x} plus {n, l:<holder>...}
-- ARGV     sliding_window_counter.lua's (limit, window µs, cost, now), then lease.lua's
--          (holder, grant given back, unspent units, wanted units, lifetime µs, pace
--          µs)
-- Returns  {allowed, remaining, reset_ms, wait_ms, granted units, lifetime µs, grant,
--          units given back, 0, 0, the key's last grant, due} (a window's lease is
--          never a slice)
--
-- A lease's units are counted in the current window when granted, with the estimate
-- then (p × remaining weight + c) plus the grant at most `limit`; its deadline is at most
-- the window's end. Every unit is spent later in the same window, where the previous
-- window's weight is smaller and the current count already holds it: the estimate a
-- request would have met at its real time is never above what the grant checked.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local fields, leases, asks = read_state(KEYS[1])
local st_start, st_current, st_previous = tonumber(fields.w), tonumber(fields.c), tonumber(fields.p)
local st_n = tonumber(fields.n)
if st_start and st_current and st_previous then
  if now < st_start then
    now = st_start
  end
else
  st_start, st_current, st_previous = nil, nil, nil
end
local start = now - math.fmod(now, window)
local current, previous = roll(st_start, st_current, st_previous, window, start)
local returned, back
current, returned, back = give_back(leases, current, st_start, start)
local elapsed = now - start
local allowed = estimate(current, previous, elapsed, window) + cost <= limit
if allowed then
  current = current + cost
end
local to_end = start + window - now
local life = math.min(lifetime, to_end)
local avail = math.max(math.floor(limit - estimate(current, previous, elapsed, window)), 0)
local granted, grant = window_lease(avail, leases, asks, life, st_n, limit)
if granted > 0 then
  current = current + granted
end
local reset = counter_reset(window, start, current, previous)
-- Written when the counts changed; otherwise, as the plain script, only to lengthen
-- the key's life. A key without leases is decided and stored exactly as
-- sliding_window_counter.lua does (tests/twins.rs).
store((allowed and cost > 0) or granted > 0 or returned, tonumber(fields.x), reset,
  'w', start, 'c', current, 'p', previous)
local wait = 0
if not allowed then
  -- As sliding_window_counter.lua, from the counts after the grant.
  wait = counter_wait(limit, window, cost, reset, start, current, previous)
end
return {allowed and 1 or 0, math.max(math.floor(limit - estimate(current, previous, elapsed, window)), 0),
  reset, wait, granted, granted > 0 and life or 0, grant, back, 0, 0, grant > 0 and grant or st_n or 0, due}
