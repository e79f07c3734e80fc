-- Fixed window with leases (docs/DESIGN.md "Leases"): lua/fixed_window.lua's decision,
-- plus the lease bookkeeping of lua/lease.lua, lua/lease_window.lua and the shares of
-- lua/lease_window_share.lua (prepended, after prelude.lua, to this file).
--
-- KEYS[1]  fixed_window.lua's hash {w, c, x} plus {n, o, l:<holder>..., a:<holder>...,
--          g:<holder>...}
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
-- same one, since the deadline is within it); lapsed ones stay counted. Each grant
-- leaves room for the share every other host asking is still due in the window
-- (lease_window_share.lua). A lease of another window (a reload changed `window`) is
-- counted again in each window of this one it may be spent in (lease_window.lua
-- place_leases()), and in its holder's take of that window.
-- Read first: under a run-time override, read_state() puts its limit and window in
-- ARGV[1], ARGV[2].
local fields, leases, asks = read_state(KEYS[1])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local st_start, st_count = tonumber(fields.w), tonumber(fields.c)
local st_n = tonumber(fields.n)
local takes = read_takes(fields)
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
take_placed(takes, leases, start)
count, returned, back = give_back(leases, count, start)
take(takes, start, -back)

-- A caller asking for a lease is admitted within its due (lease_window_share.lua), and
-- takes its request's units too: its take is all it was admitted in the window.
local room = due_of(math.max(limit - count, 0), leases, asks, takes, start, limit)
local allowed = count + cost <= limit
if room and cost > room and taken(takes, holder, start) > 0 then
  allowed = false
end
if allowed then
  count = count + cost
  if room then
    room = math.max(room - cost, 0)
  end
end
if want > 0 then
  take(takes, start, allowed and cost or 0, want, pace)
end
local to_end = start + window - now
local life = math.min(lifetime, to_end)
local granted, grant = share_lease(math.max(limit - count, 0), room, leases, takes, start,
  window, life, st_n)
if granted > 0 then
  count = count + granted
end
write_takes(takes)
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
-- A call that asked wrote its a: and g: fields: the key then lives past the window
-- even with nothing counted (a hash holding only those would have no TTL). With leases
-- stored, the key lives WINDOW_LEASED_KEEP_MS at least (lease_window.lua).
local keep = reset
if want > 0 and keep == 0 then
  keep = ceil_ms(to_end)
end
if latest > 0 then
  keep = math.max(keep, WINDOW_LEASED_KEEP_MS)
end
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
-- What the caller could still take: to one asking for a lease, at most its due (the
-- rest is kept for the others), so that a host that took its share is saturated.
local remaining = math.max(math.floor(limit - count), 0)
if room then
  remaining = math.min(remaining, math.max(room - granted, 0))
end
return leased({allowed and 1 or 0, remaining, reset, wait, granted,
  granted > 0 and life or 0, grant, back, 0, 0, grant > 0 and grant or st_n or 0, due})
