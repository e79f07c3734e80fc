-- A sliding window counter's window slices (docs/DESIGN.md "Leases", "Windows"): the
-- steps of lease_sliding_window_counter.lua that share the room the previous window's
-- weight gives back as the current window goes by, and its hot holders' lump leases.
-- Prepended to it by the `lease!` macro, after window_counter.lua, and to no other
-- script.
--
-- Under saturation a sliding window counter's room comes back a little at a time (the
-- previous window's count × the elapsed fraction), so a lease of what is there now
-- hands each asker what came back since the last ask: whoever asks just after another
-- takes most. A saturated holder (pace > 0) is instead granted a *window slice*: a lump
-- now, at most what it is due of the window so far (⌈room ÷ holders⌉ less what it was
-- granted in the window; room = limit − previous × the remaining weight, what the window
-- has admitted by now when it is full), and a rate, its share of the rate at which the
-- weight gives room back (previous ÷ window), which it accrues on its own until its
-- deadline (at most the window's end). Redis counts a slice's accrual in the estimate
-- at every instant, and the rates of the slices stored never exceed the rate the weight
-- falls at, so the estimate with them never rises after a grant checked it.
--
-- Per holder, g:<holder id> = "<window start> <units> <since>" (µs, Redis clock): the
-- units granted to it in that window (lumps, and the whole units its ended slices
-- accrued, less what it gave back), and when its current slice started accruing. A
-- field of an earlier window is deleted by the next call once its holder's lease is
-- no longer stored (a slice accrues from `since` until it ends).

-- No slice is granted for less than this (µs): its holder stops spending a slice cut at
-- its window's end 25 ms before its deadline (src/lease/mod.rs WINDOW_SPARE_US); the
-- holder asks again in the next window.
local SLICE_MIN_US = 50000

-- The g: fields among `fields` (read_state()'s): holder → {window start, units, since}.
local function read_shares(fields)
  local shares = {}
  for f, v in pairs(fields) do
    if string.sub(f, 1, 2) == 'g:' then
      local s, u, t0 = string.match(v, '^(%d+) (%d+) (%d+)$')
      if s then
        shares[string.sub(f, 3)] = {tonumber(s), tonumber(u), tonumber(t0)}
      end
    end
  end
  return shares
end

-- Units holder `h`'s lease `l` accrued by `t` (Redis clock): 0 for a lump lease; a
-- slice accrues l[5] µ-units/s from its start until its deadline.
local function accrued(shares, h, l, t)
  local s = shares[h]
  if l[5] == 0 or not s then
    return 0
  end
  return math.max(l[5] * (math.min(t, l[2]) - s[3]) / 1e12, 0)
end

-- settle_leases() at `t`, then the whole units each slice that ended accrued (rounded
-- down: its holder spends whole units, and accrued no more than Redis counts, from the
-- reply to its own earlier deadline) added to the count of the window it was granted in,
-- if that is the stored one (`st_start`, holding `st_current`). Returns that count, the
-- units given back, and whether any lease ended (the counts are then written).
local function settle_slices(leases, shares, st_start, st_current, t)
  local slices = {}
  for h, l in pairs(leases) do
    if l[5] > 0 then
      slices[h] = l
    end
  end
  local back, _, _, ended = settle_leases(KEYS[1], leases, t)
  for h, l in pairs(slices) do
    local s = shares[h]
    -- A lease stored before leases named their window: its holder's share's.
    local ws = l[6] or (s and s[1])
    if leases[h] == nil and s and st_current and ws == st_start then
      local a = math.floor(accrued(shares, h, l, t) + 1e-6)
      st_current = st_current + a
      s[2], s.dirty = s[2] + a, true
    end
  end
  return st_current, back, ended
end

-- The units the live slices (after settle_slices()) accrued by `now`, and their rates
-- (µ-units/s).
local function live_slices(leases, shares)
  local acc, promised = 0, 0
  for h, l in pairs(leases) do
    acc = acc + accrued(shares, h, l, now)
    promised = promised + l[5]
  end
  return acc, promised
end

-- Adds `units` to holder `h`'s share (the caller's if nil) of the window starting at
-- `start`; `since`: when its new slice starts accruing.
local function add_share(shares, start, units, since, h)
  h = h or holder
  local s = shares[h]
  if not s or s[1] ~= start then
    s = {start, 0, since}
    shares[h] = s
  end
  s[2], s[3], s.dirty = math.max(s[2] + units, 0), since, true
end

-- A hot (not saturated) holder's window lease: out of `avail` whole units, at most the
-- caller's share of the window's `limit` (so that hosts asking at once get equal parts
-- of each window), living `life` µs (at most the rest of the window starting at `start`, of `window`
-- µs; no lease under 1 ms); `n` as record_lease()'s. Returns the units granted and the
-- grant number (0, 0: none), and stores the lease in `leases`.
local function window_lease(avail, leases, asks, life, n, limit, start, window)
  if life < 1000 or want <= 0 then
    return 0, 0
  end
  local granted = grant_size(avail, 1, holders(KEYS[1], leases, asks), limit)
  if granted > 0 then
    return granted, store_window_lease(leases, granted, life, n, start, window)
  end
  return 0, 0
end

-- A saturated caller's window slice at `now`, `elapsed` µs into the window of `window`
-- µs starting at `start`, `previous` units in the window before, `avail` whole units left under the
-- estimate, `promised` the rates of the other live slices, living `life` µs; `n` as
-- record_lease()'s. `fits`: the estimate with the live slices' accrual is within the
-- limit. A rate only keeps the estimate from rising; above the limit (leases of another
-- window counted whole: place_leases()) none is granted until it has fallen back.
-- Returns {lump, grant, cap, rate} (all 0: none).
local function window_slice(shares, leases, asks, start, window, elapsed, previous, limit,
    avail, promised, life, n, fits)
  if life < SLICE_MIN_US or want <= 0 then
    return 0, 0, 0, 0
  end
  local holding = holders(KEYS[1], leases, asks)
  local s = shares[holder]
  local had = (s and s[1] == start) and s[2] or 0
  local room = limit - previous * ((window - elapsed) / window)
  local lump = math.floor(math.max(math.min(want, avail, math.ceil(room / holding) - had), 0))
  local back_rate = previous * 1e12 / window
  local rate = math.min(back_rate / holding, back_rate - promised, want * 1e12 / pace)
  rate = math.max(math.floor(rate), 0)
  local gets = rate * life / 1e12
  if gets < 1 or not fits then
    rate, gets = 0, 0
  end
  if lump < 1 and rate == 0 then
    return 0, 0, 0, 0
  end
  local cap = rate > 0 and lump + math.ceil(gets) or lump
  local grant = record_lease(KEYS[1], lump, now + life, n, cap, rate, start, window)
  record_life(KEYS[1], grant, life)
  leases[holder] = {lump, now + life, grant, cap, rate, start, window, w = {grant, life}}
  add_share(shares, start, lump, now)
  return lump, grant, rate > 0 and cap or 0, rate
end

-- Writes the shares changed and deletes those of windows before `start` whose holder's
-- lease is no longer stored (`leases`).
local function write_shares(shares, start, leases)
  local gone = {}
  for h, s in pairs(shares) do
    if s[1] ~= start then
      if not leases[h] then
        gone[#gone + 1] = 'g:' .. h
      end
    elseif s.dirty then
      redis.call('HSET', KEYS[1], 'g:' .. h,
        digits(s[1]) .. ' ' .. digits(s[2]) .. ' ' .. digits(s[3]))
    end
  end
  if #gone > 0 then
    redis.call('HDEL', KEYS[1], unpack(gone))
  end
end
