-- Leases (docs/DESIGN.md "Leases"), the part every lease script shares; prepended after
-- prelude.lua to lease_<algorithm>.lua (src/store/scripts.rs).
--
-- A lease is a batch of units one daemon (a "holder") took from a key's budget to
-- answer CHECKs itself until a deadline. The key's hash keeps, per holder, one field
--   l:<holder id> = "<units> <deadline> <grant>"
-- units in the algorithm's units (µ-tokens for buckets), the deadline in µs on the Redis
-- clock (grant time + lifetime), the grant a number unique per key (field n counts them).
--
-- ARGV[1..4] as the algorithm's own script (ARGV[4] = "" in production), then
-- ARGV[5]  holder id (the daemon's, random per process)
-- ARGV[6]  the grant the holder gives back ("0": none): the last grant whose reply it
--          read and whose end Redis has not acknowledged (it names it again after a
--          call that failed, a reload, a sweep). A holder stops spending a lease when it
--          sends the call that names it, so what it reports unspent is final; and it
--          spends only grants whose reply it read. Its calls that give back or ask run
--          one at a time, in order on its connection to the key's primary.
-- ARGV[7]  units of that lease not spent (algorithm units)
-- ARGV[8]  units wanted in the new lease (algorithm units; 0 = none)
-- ARGV[9]  lifetime of the new lease, µs
-- ARGV[10] pace, µs: 0, or (a saturated holder, asking this often) its grant is at
--          most pace × refill rate ÷ holders (buckets)
-- A grant is at most what is left ÷ holders, the holders being the caller and every
-- other host with a lease on the key: the hosts asking for it lately. One that stops
-- asking (or dies) stops counting when its lease ends.
-- Returns  the algorithm's {allowed, remaining, reset_ms, wait_ms}, then
--          {granted units, lifetime µs, grant, units given back} (the holder's deadline
--          is its own clock when it sent the call + lifetime, so it ends before
--          Redis's; the units given back are what the named grant returned to the
--          budget, the rest of its unspent units lapsed).
local holder = ARGV[5]
local given_back = tonumber(ARGV[6])
local unspent = tonumber(ARGV[7])
local want = tonumber(ARGV[8])
local lifetime = tonumber(ARGV[9])
local pace = tonumber(ARGV[10])

-- The hash, read once: `fields` has the algorithm's fields (strings), `leases` every
-- holder's lease {units, deadline, grant}.
local function read_state(key)
  local all = redis.call('HGETALL', key)
  local fields, leases = {}, {}
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if string.sub(f, 1, 2) == 'l:' then
      local u, d, g = string.match(v, '^(%d+) (%d+) (%d+)$')
      if u then
        leases[string.sub(f, 3)] = {tonumber(u), tonumber(d), tonumber(g)}
      end
    else
      fields[f] = v
    end
  end
  return fields, leases
end

-- Units out on every lease stored (lapsed ones included), and the latest deadline.
local function outstanding(leases)
  local out, latest = 0, 0
  for _, l in pairs(leases) do
    out = out + l[1]
    if l[2] > latest then
      latest = l[2]
    end
  end
  return out, latest
end

-- Settles the leases at `t`: a lease past its deadline lapses (its units are dropped,
-- counted as spent: the holder may have spent them); the caller's own lease ends when
-- the call gives back or asks (the caller stopped spending it). Only the grant the call
-- names, still before its deadline, gives its unspent units back. A stored grant the
-- call does not name (the caller never read its reply, or named a grant this node never
-- saw: a failover lost it) lapses as spent too: Redis never hands back units a holder
-- may have spent. Deletes the ended fields; returns the units given back to the budget
-- and the units still out on the other leases, their latest deadline, and whether any
-- lease ended.
local function settle_leases(key, leases, t)
  local back = 0
  local gone = {}
  -- A call that neither gives back nor asks (a cold key's decision) leaves its
  -- caller's lease alone: the holder may still be spending it.
  local mine = given_back ~= 0 or want > 0
  for h, l in pairs(leases) do
    if h == holder and mine then
      if l[3] == given_back and l[2] > t then
        back = math.min(unspent, l[1])
      end
      gone[#gone + 1] = 'l:' .. h
    elseif l[2] <= t then
      gone[#gone + 1] = 'l:' .. h
    end
  end
  for _, f in ipairs(gone) do
    leases[string.sub(f, 3)] = nil
  end
  if #gone > 0 then
    redis.call('HDEL', key, unpack(gone))
  end
  local out, latest = outstanding(leases)
  return back, out, latest, #gone > 0
end

-- Holders of the key after settle_leases(): the other hosts with a lease, and the caller.
local function holders(leases)
  local n = 1
  for h, _ in pairs(leases) do
    if h ~= holder then
      n = n + 1
    end
  end
  return n
end

-- A grant out of `avail` units (whole units of `unit` algorithm units): at most `want`,
-- at most avail ÷ holders and, when `refill` (units/µs) is given, the caller is paced
-- and less than two paces of refill are left, at most its share of the refill over the
-- pace; at least one whole unit when
-- one is there.
local function grant_size(avail, unit, leases, refill)
  if want <= 0 or avail < unit then
    return 0
  end
  local asking = holders(leases)
  local share = avail / asking
  -- Little left (less than two paces of refill): the budget is the refill; share it.
  if refill and pace > 0 and avail < 2 * refill * pace then
    share = math.min(share, refill * pace / asking)
  end
  share = math.floor(share / unit) * unit
  if share < unit then
    share = unit
  end
  return math.min(want, share, math.floor(avail / unit) * unit)
end

-- Records a new lease of `units` for the caller, ending at `deadline` (µs, Redis clock);
-- `n` is the key's last grant number. Returns the grant number.
local function record_lease(key, units, deadline, n)
  local g = (n or 0) + 1
  redis.call('HSET', key, 'n', digits(g), 'l:' .. holder,
    digits(units) .. ' ' .. digits(deadline) .. ' ' .. digits(g))
  return g
end
