-- A fixed window's shares (docs/DESIGN.md "Leases", "Windows"): the steps of
-- lease_fixed_window.lua that keep a part of each window for every host asking for the
-- key. Prepended to it by the `lease!` macro, after lease_window.lua, and to no other
-- script.
--
-- A grant of at most ⌊limit ÷ holders⌋ does not by itself make the window's parts
-- equal: a host asking again, its lease spent, would take the part of a host that has
-- not asked yet in this window, which then finds the window full. So Redis keeps what
-- each holder took of the window, and a grant leaves room for what every other host
-- counted among the holders is still due: its share less what it took; for a host whose
-- last ask was not saturated (no pace), at most what that ask wanted (a host asking for
-- little keeps little back). A grant is at most the caller's own due or what the window
-- holds beyond the others' (the larger), and never more than the window has left; the
-- request such a call decides is admitted only within that due too (unless it is the
-- caller's first admission in the window: a request larger than a share still passes
-- once). So a saturated host counted among the holders gets its share whenever in the
-- window it asks, and room no host is due goes to whoever asks.
--
-- Per holder, g:<holder id> = "<window start> <units> <wanted> <pace>": the units it
-- took in that window (its requests decided by calls that asked for a lease, and its
-- leases, less the units it gave back), what its last ask wanted (units) and that ask's
-- pace (µs; 0: not saturated). Kept while the holder counts among the holders (an ask or
-- a lease not ended), so that the next window keeps its share back before it asks
-- there, and while it is of the current window (a host that paused past its ask's life
-- still has what it took); otherwise deleted by the next call that asks.

-- The g: fields among `fields` (read_state()'s): holder → {window start, units, wanted,
-- pace}.
local function read_takes(fields)
  local takes = {}
  for f, v in pairs(fields) do
    if string.sub(f, 1, 2) == 'g:' then
      local s, u, w, p = string.match(v, '^(%d+) (%d+) (%d+) (%d+)$')
      if s then
        takes[string.sub(f, 3)] = {tonumber(s), tonumber(u), tonumber(w), tonumber(p)}
      end
    end
  end
  return takes
end

-- The units holder `h` took of the window starting at `start`.
local function taken(takes, h, start)
  local t = takes[h]
  if t and t[1] == start then
    return t[2]
  end
  return 0
end

-- Adds `units` (negative: given back) to the caller's take of the window starting at
-- `start`, and records what its ask `wanted` and that ask's `pace` (wanted nil: a call
-- that asks for nothing, which changes only a take of this window).
local function take(takes, start, units, wanted, pace)
  local t = takes[holder]
  if not wanted and (units == 0 or not t or t[1] ~= start) then
    return
  end
  if not t then
    t = {start, 0, 0, 0}
    takes[holder] = t
  elseif t[1] ~= start then
    t[1], t[2] = start, 0
    t.dirty = true
  end
  if units ~= 0 then
    t[2], t.dirty = math.max(t[2] + units, 0), true
  end
  if wanted and (wanted ~= t[3] or pace ~= t[4]) then
    t[3], t[4], t.dirty = wanted, pace, true
  end
end

-- Adds to each holder's take of the window starting at `start` what place_leases()
-- counted there of its lease of another window (`placed`: moved to this one): a lease
-- its holder may spend in this window is part of what it took of it, as it is part of
-- the count, and a give-back of it comes off both.
local function take_placed(takes, leases, start)
  for h, l in pairs(leases) do
    if l.placed and l.placed > 0 then
      local t = takes[h]
      if not t then
        t = {start, 0, 0, 0}
        takes[h] = t
      elseif t[1] ~= start then
        t[1], t[2] = start, 0
      end
      t[2], t.dirty = t[2] + l.placed, true
    end
  end
end

-- The caller's due of the window of `limit` starting at `start`, with `avail` whole
-- units left: its share (⌊limit ÷ holders⌋, at least 1) less what it took, or what the
-- window holds beyond the other holders' dues, whichever is more; nil for a call that
-- asks for nothing. Records the caller's ask (holders()) and marks the takes of hosts
-- no longer counted among the holders for deletion.
local function due_of(avail, leases, asks, takes, start, limit)
  if want <= 0 then
    return nil
  end
  local count, counted = holders(KEYS[1], leases, asks)
  local share = math.max(math.floor(limit / count), 1)
  local others = 0
  for h, t in pairs(takes) do
    if not counted[h] then
      -- Kept while it is of this window: a host back from a pause has its take.
      if t[1] ~= start then
        t.gone = true
      end
    elseif h ~= holder then
      local owed = math.max(share - taken(takes, h, start), 0)
      if t[4] == 0 then
        owed = math.min(owed, t[3])
      end
      others = others + owed
    end
  end
  return math.max(share - taken(takes, holder, start), avail - others, 0)
end

-- A fixed window's new lease for the caller: out of `avail` whole units left in the
-- window of `window` µs starting at `start`, at most its due `room` (due_of(), nil:
-- none), living `life` µs (no lease under 1 ms); `n` as record_lease()'s. The lease
-- names its window (lease_window.lua) and has a w: field, as window_lease()'s; it is
-- stored in `leases` too (summarize()). Returns the units granted and the grant number
-- (0, 0: none).
local function share_lease(avail, room, leases, takes, start, window, life, n)
  if life < 1000 or not room then
    return 0, 0
  end
  local granted = math.floor(math.min(want, avail, room))
  if granted > 0 then
    take(takes, start, granted)
    return granted, store_window_lease(leases, granted, life, n, start, window)
  end
  return 0, 0
end

-- Writes the takes changed and deletes those due_of() marked.
local function write_takes(takes)
  local gone = {}
  for h, t in pairs(takes) do
    if t.gone then
      gone[#gone + 1] = 'g:' .. h
    elseif t.dirty then
      redis.call('HSET', KEYS[1], 'g:' .. h,
        digits(t[1]) .. ' ' .. digits(t[2]) .. ' ' .. digits(t[3]) .. ' ' .. digits(t[4]))
    end
  end
  if #gone > 0 then
    redis.call('HDEL', KEYS[1], unpack(gone))
  end
end
