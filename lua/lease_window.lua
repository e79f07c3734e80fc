-- The lease steps the window algorithms share (lease_fixed_window.lua,
-- lease_sliding_window_counter.lua), prepended to them after lease.lua by the `lease!`
-- macro (src/store/scripts.rs), and to no other script.
--
-- A window's lease names the window whose count holds its units (l: fields, start and
-- length). A lease granted under the rule in force ends within that window, so its
-- units are spent there. One granted under another window (a reload changed the rule's
-- `window`, a daemon not yet reloaded still asks with the old one) may still be spent
-- in windows of the rule in force that no count holds it in: place_leases() counts its
-- cap (the most it can spend: its lump and a slice's whole accrual) in each of them,
-- the current window's and the previous one's, and moves it to the current window,
-- where it is then a lump lease of its cap. The leases stored after a call are summed
-- up in the field o (summarize()) for the per-request scripts (window_leases.lua),
-- which cannot read them one by one.

-- Counts at `start` (the current window of `window` µs; the stored counts are of the
-- window starting at `st_start`) what every stored lease may spend where the counts do
-- not hold it: its cap (its lump and a slice's whole accrual) less its lump when that
-- is in the count, in the current window if its deadline is after the window's start,
-- and in the previous one if it was alive there. A lease of this rule's window held by
-- the current count, or ended within the previous window that counted it (a slice's
-- accrual then folded into that count: settle_slices()), adds nothing. Called before
-- settle_leases(): a lease lapsing in this call may have been spent in this window. A
-- lease still stored is moved to the current window (`moved`, written by keep_moved()),
-- a lump lease of its cap. Returns the units to add to the current count and to the
-- previous one.
local function place_leases(leases, st_start, start, window)
  local cur, prev = 0, 0
  for _, l in pairs(leases) do
    -- Its lump is in the stored count, which rolls into the current or previous one.
    local counted = st_start ~= nil and l[6] == st_start
    local ours = counted and l[7] == window
    local here = counted and st_start == start
    local before = counted and st_start + window == start
    if not (ours and here) then
      if (l[6] or 0) < start and l[2] > start - window and not (ours and before and l[2] <= start) then
        prev = prev + l[4] - (before and l[1] or 0)
      end
      if l[2] > start then
        cur = cur + l[4] - (here and l[1] or 0)
        l[1], l[5], l[6], l[7], l.moved = l[4], 0, start, window, true
      end
    end
  end
  return cur, prev
end

-- Writes the leases place_leases() moved that are still stored.
local function keep_moved(leases)
  for h, l in pairs(leases) do
    if l.moved then
      redis.call('HSET', KEYS[1], 'l:' .. h, digits(l[1]) .. ' ' .. digits(l[2]) .. ' '
        .. digits(l[3]) .. ' ' .. digits(l[4]) .. ' 0 ' .. digits(l[6]) .. ' '
        .. digits(l[7]))
    end
  end
end

-- The leases stored after a call at `start` (every one is then held by that window's
-- count) for the per-request scripts: o = "<units> <accrual> <start> <window>
-- <latest deadline>", the units the count holds and the accrual the slices may still
-- add (their cap less their lump); deleted with the last lease. `had`: the field read.
-- Returns the latest deadline (0: no lease).
local function summarize(leases, start, window, had)
  local units, accrual, latest = 0, 0, 0
  for _, l in pairs(leases) do
    units = units + l[1]
    if l[5] > 0 then
      accrual = accrual + l[4] - l[1]
    end
    latest = math.max(latest, l[2])
  end
  if latest == 0 then
    if had then
      redis.call('HDEL', KEYS[1], 'o')
    end
    return 0
  end
  local o = digits(units) .. ' ' .. digits(accrual) .. ' ' .. digits(start) .. ' '
    .. digits(window) .. ' ' .. digits(latest)
  if o ~= had then
    redis.call('HSET', KEYS[1], 'o', o)
  end
  return latest
end

-- The leases of a window's count, settled at `now`, after place_leases(): `count` less
-- the units given back. A lease that gives units back is alive in the current window,
-- so that window's count holds it. Returns the count, whether any units came back (the
-- state then changed) and the units taken off the count.
local function give_back(leases, count)
  local back = settle_leases(KEYS[1], leases, now)
  local returned = back > 0
  back = math.min(back, count)
  return count - back, returned, back
end

-- A window's new lease: out of `avail` whole units, at most the caller's share of the
-- window's `limit` (so that hosts asking at once get equal parts of each window),
-- living `life` µs (at most the rest of the window starting at `start`, of `window`
-- µs; no lease under 1 ms); `n` as record_lease()'s. Returns the units granted and the
-- grant number (0, 0: none), and stores the lease in `leases`.
local function window_lease(avail, leases, asks, life, n, limit, start, window)
  if life < 1000 or want <= 0 then
    return 0, 0
  end
  local granted = grant_size(avail, 1, holders(KEYS[1], leases, asks), limit)
  if granted > 0 then
    local g = record_lease(KEYS[1], granted, now + life, n, granted, 0, start, window)
    leases[holder] = {granted, now + life, g, granted, 0, start, window}
    return granted, g
  end
  return 0, 0
end
