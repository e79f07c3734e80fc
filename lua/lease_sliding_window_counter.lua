-- Sliding window counter with leases (docs/DESIGN.md "Leases"):
-- lua/sliding_window_counter.lua's decision, plus the lease bookkeeping of lua/lease.lua
-- and lua/lease_window.lua, the weighting of lua/window_counter.lua and the window
-- slices of lua/lease_window_slice.lua (prepended, after prelude.lua, to this file).
--
-- KEYS[1]  sliding_window_counter.lua's hash {w, c, p, x} plus {n, o, l:<holder>...,
--          a:<holder>..., g:<holder>...}
-- ARGV     sliding_window_counter.lua's (limit, window µs, cost, now), then lease.lua's
--          (holder, grant given back, unspent units, wanted units, lifetime µs, pace
--          µs)
-- Returns  {allowed, remaining, reset_ms, wait_ms, granted units, lifetime µs, grant,
--          units given back, a slice's cap (units) and rate (µ-units/s; 0, 0: a lump
--          lease), the key's last grant, due}, then a run-time override's three fields
--          (lua/lease.lua leased())
--
-- A lease's units are counted in the current window when granted, with the estimate
-- then (p × remaining weight + c) plus the grant at most `limit`; its deadline is at most
-- the window's end. Every unit is spent later in the same window, where the previous
-- window's weight is smaller and the current count already holds it: the estimate a
-- request would have met at its real time is never above what the grant checked. A
-- saturated holder's lease is a window slice (lease_window_slice.lua): its accrual is
-- in the estimate at every instant, and the slices' rates together are at most the rate
-- at which the previous window's weight falls, so that estimate never rises after a
-- grant (or a decision) checked it. A lease of another window (a reload changed
-- `window`) is counted whole in each window of this rule it may be spent in
-- (lease_window.lua place_leases()); the estimate may then be above the limit, and no
-- slice gets a rate until it is back within it.
-- Read first: under a run-time override, read_state() puts its limit and window in
-- ARGV[1], ARGV[2].
local fields, leases, asks = read_state(KEYS[1])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local shares = read_shares(fields)
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
-- Leases of another window (lease_window.lua place_leases()) counted where they may be
-- spent; a moved one is then its holder's share of this window.
local placed, placed_before = place_leases(leases, st_start, start, window)
for h, l in pairs(leases) do
  if l.moved then
    add_share(shares, start, l[4], now, h)
  end
end
local back, ended
local named = named_lease(leases)
st_current, back, ended = settle_slices(leases, shares, st_start, st_current, now)
-- A lease of an earlier window given back late: all its cap off this window when it
-- was not spent in it (lease_window.lua stopped_before()).
if named and stopped_before(named, start) then
  back = named[4]
end
local current, previous = roll(st_start, st_current, st_previous, window, start)
current, previous = current + placed, previous + placed_before
-- Units given back come off this window's count, which holds every lease alive in it.
back = math.min(back, current)
current = current - back
if back > 0 then
  add_share(shares, start, -back, now)
end
local acc, promised = live_slices(leases, shares)
local elapsed = now - start
local allowed = estimate(current, previous, elapsed, window) + acc + cost <= limit
if allowed then
  current = current + cost
end
local to_end = start + window - now
local life = math.min(lifetime, to_end)
-- What the estimate leaves; a slice's rate only when it is within the limit (up to the
-- rounding of slices whose rates add up to the weight's fall exactly).
local left = limit - estimate(current, previous, elapsed, window) - acc
local avail = math.max(math.floor(left), 0)
local granted, grant, cap, rate = 0, 0, 0, 0
if pace > 0 then
  granted, grant, cap, rate = window_slice(shares, leases, asks, start, window, elapsed,
    previous, limit, avail, promised, life, st_n, left > -1e-6)
else
  granted, grant = window_lease(avail, leases, asks, life, st_n, limit, start, window)
  if granted > 0 then
    add_share(shares, start, granted, now)
  end
end
if granted > 0 then
  current = current + granted
end
write_shares(shares, start, leases)
keep_moved(leases)
local latest = summarize(leases, start, window, fields.o)
-- The live slices' accrual so far, in whole units (rounded up), for what is reported.
local counted = current + math.ceil(acc)
-- A live slice still adds to this window's count, which the next window weighs: the
-- key must outlive this window even while its count and accrual so far are 0 (a slice
-- granted at the window's start with no lump), or it would expire with that accrual.
local live = promised + rate > 0 and math.max(counted, 1) or counted
local reset = counter_reset(window, start, live, previous)
-- A lease moved here from a longer window may outlive this one: its cap is counted in
-- each window it may be spent in, and weighed in the one after.
if latest > 0 then
  reset = math.max(reset, ceil_ms(latest + window - now))
end
-- Written when the counts changed; otherwise, as the plain script, only to lengthen
-- the key's life. A key without leases is decided and stored exactly as
-- sliding_window_counter.lua does (tests/twins.rs).
-- With leases stored, the key lives WINDOW_LEASED_KEEP_MS at least (lease_window.lua).
local keep = latest > 0 and math.max(reset, WINDOW_LEASED_KEEP_MS) or reset
store((allowed and cost > 0) or granted > 0 or grant > 0 or back > 0 or ended
  or placed > 0 or placed_before > 0, tonumber(fields.x), keep, 'w', start, 'c', current,
  'p', previous)
local wait = 0
if not allowed then
  -- As sliding_window_counter.lua, from the counts after the grant.
  wait = counter_wait(limit, window, cost, reset, start, counted, previous)
end
return leased({allowed and 1 or 0, math.max(math.floor(limit - estimate(current, previous, elapsed, window) - acc), 0),
  reset, wait, granted, grant > 0 and life or 0, grant, back, cap, rate, grant > 0 and grant or st_n or 0, due})
