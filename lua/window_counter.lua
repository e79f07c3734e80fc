-- The sliding window counter's weighting, shared by sliding_window_counter.lua and
-- lease_sliding_window_counter.lua: prepended to them after prelude.lua (and lease.lua)
-- by the `spec!` and `lease!` macros, and to no other script, which would only pay for
-- defining these functions on every call.

-- The counts (current, previous) seen from the window starting at `start` of a state
-- whose window started at `w` (nil: no state) with `c` units in it and `p` in the one
-- before.
local function roll(w, c, p, window, start)
  if w == start then
    return c, p
  elseif w ~= nil and w + window == start then
    return 0, c
  end
  return 0, 0
end

-- Cloudflare's weighted estimate `elapsed` µs into the current window:
-- p × ((window − elapsed) ÷ window) + c.
local function estimate(c, p, elapsed, window)
  return p * ((window - elapsed) / window) + c
end

-- reset_ms after `now`: when the counts of the window starting at `start`, `current`
-- and `previous` before it, have both left the weighting (the current one, at the end
-- of the next window).
local function counter_reset(window, start, current, previous)
  if current > 0 then
    return ceil_ms(start + 2 * window - now)
  elseif previous > 0 then
    return ceil_ms(start + window - now)
  end
  return 0
end

-- The wait_ms of a DENY of `cost` after `now`, the window starting at `start` holding
-- `current` units and the one before `previous`: for a cost above the limit (it never
-- fits), reset_ms (`reset`), at least 1; otherwise solved from the weighting and
-- checked by settle() (src/algorithm/sliding_window_counter.rs, the same steps).
local function counter_wait(limit, window, cost, reset, start, current, previous)
  if cost > limit then
    return math.max(reset, 1)
  end
  local when
  if current + cost <= limit then
    when = start + window - window * ((limit - cost - current) / previous)
  else
    when = start + 2 * window - window * ((limit - cost) / current)
  end
  return settle(ceil_ms(when - now), 1, function(k)
    local t = now + k * 1000
    local s = t - math.fmod(t, window)
    local c, p = roll(start, current, previous, window, s)
    return estimate(c, p, t - s, window) + cost <= limit
  end)
end
