-- The lease steps the window algorithms share (lease_fixed_window.lua,
-- lease_sliding_window_counter.lua), prepended to them after lease.lua by the `lease!`
-- macro (src/store/scripts.rs), and to no other script.

-- The leases of a window's count, settled at `now`: `count` less the units given
-- back, if the stored window (starting at `st_start`) is still the current one
-- (`start`); a lease's deadline is within the window that counted it, so units given
-- back in a later window were counted in one that is over. Returns the count, whether
-- any units came back (the state then changed) and the units taken off the count.
local function give_back(leases, count, st_start, start)
  local back = settle_leases(KEYS[1], leases, now)
  local returned = back > 0
  if st_start ~= start then
    back = 0
  end
  back = math.min(back, count)
  return count - back, returned, back
end

-- A window's new lease: out of `avail` whole units, at most the caller's share of the
-- window's `limit` (so that hosts asking at once get equal parts of each window),
-- living `life` µs (at most the rest of the window; no lease under 1 ms); `n` as
-- record_lease()'s. Returns the units granted and the grant number (0, 0: none).
local function window_lease(avail, leases, asks, life, n, limit)
  if life < 1000 or want <= 0 then
    return 0, 0
  end
  local granted = grant_size(avail, 1, holders(KEYS[1], leases, asks), limit)
  if granted > 0 then
    return granted, record_lease(KEYS[1], granted, now + life, n)
  end
  return 0, 0
end
