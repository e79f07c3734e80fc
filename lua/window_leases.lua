-- The leases a window's key may hold, as the per-request scripts see them: prepended to
-- fixed_window.lua and sliding_window_counter.lua (after prelude.lua) by the `spec!`
-- macro, and shared by the batch scripts that embed them.
--
-- A daemon with `lease = "off"` on a rule whose other daemons still take leases (a
-- reload that turns leases off reaches a fleet one daemon at a time), or that turned
-- them off while its own were out, decides the key with the per-request script, which
-- reads the fields it names, not the leases (l:<holder>, one per holder). The lease
-- scripts keep their sum in one field (lua/lease_window.lua summarize()):
--   o = "<units> <accrual> <start> <window> <latest deadline>"
-- the units the count of the window (start, length: µs) holds for them, the accrual
-- the slices among them may still add, and the latest deadline (Redis clock). Until it
-- passes, the leases may still spend all of it: its whole is counted in each window of
-- the rule in force they may be spent in, unless the count of that window holds it.
-- A key without the field (no lease since the last lease script call) is decided as
-- before: the same reply and state as the Rust twins.

-- The units the leases summed up in `o` add to the counts of the window of `window` µs
-- starting at `start` and of the one before, the stored state being of the window
-- starting at `w` (nil: none); and their latest deadline (0: none).
local function leased(o, w, start, window)
  if not o then
    return 0, 0, 0
  end
  local u, a, ws, wl, d = string.match(o, '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
  if not u then
    return 0, 0, 0
  end
  u, a, ws, wl, d = tonumber(u), tonumber(a), tonumber(ws), tonumber(wl), tonumber(d)
  local ours = wl == window and w == ws
  local cur, prev = 0, 0
  if d > start then
    cur = a + ((ours and ws == start) and 0 or u)
  end
  -- Leases counted in this window were placed by a lease script's call in it, which
  -- counted in the previous window those it held (lease_window.lua place_leases()).
  if d > start - window and not (wl == window and ws == start) then
    prev = a + ((ours and ws + window == start) and 0 or u)
  end
  return cur, prev, d
end
