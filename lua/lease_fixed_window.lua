-- Fixed window with leases (docs/DESIGN.md "Leases"): lua/fixed_window.lua's decision,
-- plus the lease bookkeeping of lua/lease.lua and lua/lease_window.lua (prepended, after
-- prelude.lua, to this file).
--
-- KEYS[1]  fixed_window.lua's hash {w, c, x} plus {n, l:<holder>...}
-- ARGV     fixed_window.lua's (limit, window µs, cost, now), then lease.lua's (holder,
--          grant given back, unspent units, wanted units, lifetime µs, pace µs)
-- Returns  {allowed, remaining, reset_ms, wait_ms, granted units, lifetime µs, grant,
--          units given back, 0, 0, the key's last grant, due} (a window's lease is
--          never a slice), then a run-time override's three fields (lease.lua leased())
--
-- A lease's units are counted in the window when granted (c += granted) and its
-- deadline is at most the window's end, so every unit spent from it is spent inside the
-- window that counted it: the window's count never admits more than `limit`. Unspent
-- units given back before the deadline are taken off the count (the window is still the
-- same one, since the deadline is within it); lapsed ones stay counted.
-- Read first: under a run-time override, read_state() puts its limit and window in
-- ARGV[1], ARGV[2].
local fields, leases, asks = read_state(KEYS[1])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local st_start, st_count = tonumber(fields.w), tonumber(fields.c)
local st_n = tonumber(fields.n)
if st_start and st_count then
  if now < st_start then
    now = st_start
  end
else
  st_start, st_count = nil, nil
end
-- math.fmod is C fmod: exact, as Rust's %.
local start = now - math.fmod(now, window)
local count = 0
if st_start == start then
  count = st_count
end
local returned, back
count, returned, back = give_back(leases, count, st_start, start)

local allowed = count + cost <= limit
if allowed then
  count = count + cost
end
local to_end = start + window - now
local life = math.min(lifetime, to_end)
local granted, grant = window_lease(math.max(limit - count, 0), leases, asks, life, st_n, limit)
if granted > 0 then
  count = count + granted
end
local reset = 0
if count > 0 then
  reset = ceil_ms(to_end)
end
-- Written when the count changed; otherwise, as the plain script, only to lengthen the
-- key's life. A key without leases is decided and stored exactly as fixed_window.lua
-- does (tests/twins.rs).
store((allowed and cost > 0) or granted > 0 or returned, tonumber(fields.x), reset,
  'w', start, 'c', count)
local wait = 0
if not allowed then
  if cost > limit then
    wait = math.max(reset, 1)
  else
    wait = ceil_ms(to_end)
  end
end
return leased({allowed and 1 or 0, math.max(math.floor(limit - count), 0), reset, wait, granted,
  granted > 0 and life or 0, grant, back, 0, 0, grant > 0 and grant or st_n or 0, due})
