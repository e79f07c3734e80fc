-- The lease steps the window algorithms share (lease_fixed_window.lua,
-- lease_sliding_window_counter.lua), prepended to them after lease.lua by the `lease!`
-- macro (src/store/scripts.rs), and to no other script. A fixed window's new lease is
-- share_lease() (lease_window_share.lua), a sliding window counter's window_lease() or
-- window_slice() (lease_window_slice.lua).

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
