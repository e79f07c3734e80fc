-- The lease steps the window algorithms share (lease_fixed_window.lua,
-- lease_sliding_window_counter.lua), prepended to them after lease.lua by the `lease!`
-- macro (src/store/scripts.rs), and to no other script. A fixed window's new lease is
-- share_lease() (lease_window_share.lua), a sliding window counter's window_lease() or
-- window_slice() (lease_window_slice.lua).
--
-- A window's lease names the window whose count holds its units (l: fields, start and
-- length). It may be spent in another window: one of a rule whose `window` a reload
-- changed, or any lease once Redis's clock has jumped past its window's end while its
-- holder, on its own clock, may still spend it. So a lease ends only when its holder
-- names it (it has stopped spending) or a witness has counted its lifetime (its
-- w: field, lua/lease.lua lapsed(): its holder's deadline has passed, whatever Redis's
-- clock did), never at its deadline on Redis's clock alone; and until then
-- place_leases() counts its cap (the most it can spend: its lump and a slice's whole
-- accrual) in each window it may be spent in that no count holds it in, the current
-- window's and the previous one's, and moves it to the current window, where it is then
-- a lump lease of its cap. Its holder stops spending a lease cut at its window's end a
-- little before (src/lease/mod.rs WINDOW_SPARE_US) and names it, so that in Redis it
-- ends within its window. The leases stored after a call are summed up in the field o
-- (summarize()) for the per-request scripts (window_leases.lua), which cannot read
-- them one by one.

-- A key with leases stored lives this long at least (ms): a forward jump of Redis's
-- clock shorter than that does not drop them with it (as lease_token_bucket.lua).
local WINDOW_LEASED_KEEP_MS = 86400000

-- True when lease `l` may be spent after `t` (µs, Redis clock): one with a w: field
-- until it is settled, one without (stored by an older script) until its deadline.
local function alive_after(l, t)
  return l.w ~= nil or l[2] > t
end

-- Counts at `start` (the current window of `window` µs; the stored counts are of the
-- window starting at `st_start`) what every stored lease may spend where the counts do
-- not hold it: its cap less its lump when that is in the count, in the current window,
-- and in the previous one if it was stored before this window started. A lease of this
-- rule's window held by the current count adds nothing, nor does one without a w: field
-- that ended within the previous window that counted it. Called before
-- settle_leases(): a lease settled in this call may have been spent in this window. A
-- lease still stored is moved to the current window (`moved`, written by keep_moved()),
-- a lump lease of its cap, with what it added to the current count (`placed`: a fixed
-- window's share of its holder, lease_window_share.lua take_placed()). Returns the
-- units to add to the current count and to the previous one.
local function place_leases(leases, st_start, start, window)
  local cur, prev = 0, 0
  for _, l in pairs(leases) do
    -- Its lump is in the stored count, which rolls into the current or previous one.
    local counted = st_start ~= nil and l[6] == st_start
    local ours = counted and l[7] == window
    local here = counted and st_start == start
    local before = counted and st_start + window == start
    if not (ours and here) then
      local earlier = (l[6] or 0) < start and alive_after(l, start - window)
      if earlier and not (ours and before and not alive_after(l, start)) then
        prev = prev + l[4] - (before and l[1] or 0)
      end
      if alive_after(l, start) then
        l.placed = l[4] - (here and l[1] or 0)
        cur = cur + l.placed
        l[1], l[5], l[6], l[7], l.moved = l[4], 0, start, window, true
      end
    end
  end
  return cur, prev
end

-- The caller's lease this call names (nil: none), before settle_leases() ends it.
local function named_lease(leases)
  local l = leases[holder]
  if l and given_back ~= 0 and l[3] == given_back then
    return l
  end
end

-- True when the caller's named lease `l`, of an earlier window (its deadline no later
-- than `start`: place_leases() counted its cap in the window starting at `start`), was
-- provably not spent from `start` on, on Redis's clock. Its holder spent it until its
-- own deadline, its send of the call that took it (ARGV[14]) + the lifetime − the drift
-- margin − the spare it reports (ARGV[16]); on Redis's clock that is at most the grant
-- (the deadline − the lifetime) + the lifetime − the spare + J, J the forward jumps of
-- Redis's clock since the grant. J is at most Redis's time since the grant less the
-- holder's since it sent that call (it sends this one at ARGV[11]), plus that call's
-- round trip (ARGV[15] − ARGV[14]), with 0.1 % for the two clocks' rates and 1 ms.
-- A late give-back (the holder was slow to call) then takes the whole cap back off this
-- window; a lease spent past a jump of Redis's clock keeps it counted.
local function stopped_before(l, start)
  if not (l.w and l.w[2] and mono and named_sent and named_got) or l[2] > start then
    return false
  end
  local life = l.w[2]
  local jump = (now - (l[2] - life)) - (mono - named_sent) * 0.999
    + (named_got - named_sent) * 1.001 + 1000
  return l[2] - named_spare + jump <= start
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

-- The leases of a window's count (the window starting at `start`), settled at `now`,
-- after place_leases(): `count` less the units given back. A lease that gives units
-- back is alive in the current window, so that window's count holds it; all its cap
-- when it was not spent there (stopped_before()). Returns the count, whether any units
-- came back (the state then changed) and the units taken off the count.
local function give_back(leases, count, start)
  local named = named_lease(leases)
  local back = settle_leases(KEYS[1], leases, now)
  if named and stopped_before(named, start) then
    back = named[4]
  end
  local returned = back > 0
  back = math.min(back, count)
  return count - back, returned, back
end

-- Stores a new window lease of the caller: `granted` units until `now + life`, of the
-- window starting at `start` of length `window`, its life recorded for a witness
-- (lease.lua record_life()) and the lease put in `leases` (for summarize()); `n` as
-- record_lease()'s. Returns its grant number.
local function store_window_lease(leases, granted, life, n, start, window)
  local g = record_lease(KEYS[1], granted, now + life, n, granted, 0, start, window)
  record_life(KEYS[1], g, life)
  leases[holder] = {granted, now + life, g, granted, 0, start, window, w = {g, life}}
  return g
end
