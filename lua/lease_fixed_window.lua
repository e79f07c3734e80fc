-- Fixed window with leases (docs/DESIGN.md "Leases"): lua/fixed_window.lua's decision,
-- plus the lease bookkeeping of lua/lease.lua and lua/lease_window.lua (prepended, after
-- prelude.lua, to this file).
--
-- KEYS[1]  fixed_window.lua's hash {w, c, x} plus {n, o, l:<holder>..., a:<holder>...}
-- ARGV     fixed_window.lua's (limit, window µs, cost, now), then lease.lua's (holder,
--          grant given back, unspent units, wanted units, lifetime µs, pace µs)
-- Returns  {allowed, remaining, reset_ms, wait_ms, granted units, lifetime µs, grant,
--          units given back, 0, 0, the key's last grant, due} (a window's lease is
--          never a slice)
--
-- A lease's units are counted in the window when granted (c += granted) and its
-- deadline is at most the window's end, so every unit spent from it is spent inside the
-- window that counted it: the window's count never admits more than `limit`. Unspent
-- units given back before the deadline are taken off the count (the window is still the
-- same one, since the deadline is within it); lapsed ones stay counted. A lease of
-- another window (a reload changed `window`) is counted again in each window of this
-- one it may be spent in (lease_window.lua place_leases()).
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local fields, leases, asks = read_state(KEYS[1])
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
-- Leases of another window (lease_window.lua place_leases()) counted in this one when
-- they may be spent in it.
local placed = place_leases(leases, st_start, start, window)
count = count + placed
local returned, back
count, returned, back = give_back(leases, count, start)

local allowed = count + cost <= limit
if allowed then
  count = count + cost
end
local to_end = start + window - now
local life = math.min(lifetime, to_end)
local granted, grant = window_lease(math.max(limit - count, 0), leases, asks, life, st_n,
  limit, start, window)
if granted > 0 then
  count = count + granted
end
keep_moved(leases)
local latest = summarize(leases, start, window, fields.o)
local reset = 0
if count > 0 then
  reset = ceil_ms(to_end)
end
-- A lease moved here from a longer window may outlive this one.
if latest > 0 then
  reset = math.max(reset, ceil_ms(latest - now))
end
-- Written when the count changed; otherwise, as the plain script, only to lengthen the
-- key's life. A key without leases is decided and stored exactly as fixed_window.lua
-- does (tests/twins.rs).
-- With leases stored, the key lives WINDOW_LEASED_KEEP_MS at least (lease_window.lua).
local keep = latest > 0 and math.max(reset, WINDOW_LEASED_KEEP_MS) or reset
store((allowed and cost > 0) or granted > 0 or returned or placed > 0, tonumber(fields.x),
  keep, 'w', start, 'c', count)
local wait = 0
if not allowed then
  if cost > limit then
    wait = math.max(reset, 1)
  else
    wait = ceil_ms(to_end)
  end
end
return {allowed and 1 or 0, math.max(math.floor(limit - count), 0), reset, wait, granted,
  granted > 0 and life or 0, grant, back, 0, 0, grant > 0 and grant or st_n or 0, due}
