-- Leases (docs/DESIGN.md "Leases"), the part every lease script shares; prepended after
-- prelude.lua to lease_<algorithm>.lua (src/store/scripts.rs).
--
-- A lease is a part of a key's budget one daemon (a "holder") took to answer CHECKs
-- itself until a deadline. The key's hash keeps, per holder, one field
--   l:<holder id> = "<units> <deadline> <grant> [<cap> <rate> [<start> <window>]]"
-- units in the algorithm's units (µ-tokens for buckets) handed over at the grant, the
-- deadline in µs on the Redis clock (grant time + lifetime), the grant a number unique
-- per key (field n counts them). A bucket's lease may also be a *slice*: the holder
-- keeps a bucket of its own of `cap` µ-tokens, refilled at `rate` µ-tokens/s until the
-- deadline, while the key's bucket in Redis holds `cap` less and refills `rate` slower
-- (lua/lease_token_bucket.lua). Without them, cap = units and rate = 0. A window's
-- lease also names the window whose count holds its units (start and length, µs:
-- lua/lease_window.lua place_leases()). And, per holder
-- asking lately, a field a:<holder id> = "<until>" (µs, Redis clock): the hosts a
-- saturated key is shared between, whether they hold a lease now or not.
-- A bucket's lease also has a field w:<holder id> = "<grant> <life> [<witness> <mono>
-- <since>]": its lifetime (µs) and the daemon (holder id) that counts it on its own
-- monotonic clock, from `mono` (its CLOCK_BOOTTIME, µs) at a call it sent after reading
-- the grant, named its witness at `since` (µs, Redis clock). Such a lease lapses only
-- when its witness has counted its life, whatever Redis's clock did (see lapsed()).
--
-- ARGV[1..4] as the algorithm's own script (ARGV[4] = "" in production), then
-- ARGV[5]  holder id (the daemon's, random per process)
-- ARGV[6]  the grant the holder gives back ("0": none): the last grant whose reply it
--          read and whose end Redis has not acknowledged (it names it again after a
--          call that failed, a reload, a sweep). A holder stops spending a lease when it
--          sends the call that names it, so what it reports unspent is final; and it
--          spends only grants whose reply it read. Its calls that give back or ask run
--          one at a time, in order on its connection to the key's primary.
-- ARGV[7]  units of that lease not spent (algorithm units; a slice's refill included)
-- ARGV[8]  units wanted in the new lease (algorithm units; 0 = none)
-- ARGV[9]  lifetime of the new lease, µs
-- ARGV[10] pace, µs: 0, or (a saturated holder, asking this often) a bucket grants it a
--          slice, its share of the capacity and of the refill rate
-- ARGV[11] the caller's CLOCK_BOOTTIME when it sent the call, µs ("": none)
-- ARGV[12] the highest grant number of the key the caller read in a reply before
--          sending the call (0: none)
-- ARGV[13] the caller's CLOCK_BOOTTIME when it read the reply that showed it that
--          number, µs ("": ARGV[11])
-- ARGV[14] the grant given back: the caller's CLOCK_BOOTTIME when it sent the call that
--          took it, µs ("": unknown), ARGV[15] when it read its reply, ARGV[16] how
--          long before its lifetime (less the drift margin) it stopped spending it, µs
--          (lua/lease_window.lua stopped_before())
-- A grant is at most the holder's share: the holders being the caller, every other host
-- with a lease on the key, and every host that asked for one in the last ASK_US. One
-- that stops asking (or dies) stops counting when its lease and its ask end.
-- Returns  the algorithm's {allowed, remaining, reset_ms, wait_ms}, then
--          {granted units, lifetime µs, grant, units given back, cap, rate, key's last
--          grant, due} (due: 0, or the caller's clock, µs, from when it could end a lease
--          it is the witness of: lapsed(); algorithm units; the holder's deadline is its own clock when it sent
--          the call + lifetime, so it ends before Redis's; the units given back are what
--          the named grant returned to the budget, the rest of its unspent units lapsed),
--          then, under a run-time override, its limit and rate or window halves
--          (leased(): prelude.lua tiered()'s three, as fields 13 to 15).
--
-- Under a run-time override (prelude.lua override()) the request is decided with the
-- override's parameters in place of ARGV[1], ARGV[2], as the plain script does, and no
-- lease is granted: the call asks for nothing, whatever ARGV[8] and ARGV[10] say. The
-- leases already out are settled as always (lapses, the caller's give-back), and keep
-- counting against the overridden capacity or limit until they end.
local holder = ARGV[5]
local given_back = tonumber(ARGV[6])
local unspent = tonumber(ARGV[7])
local want = tonumber(ARGV[8])
local lifetime = tonumber(ARGV[9])
local pace = tonumber(ARGV[10])
local mono = tonumber(ARGV[11] or '')
local seen = tonumber(ARGV[12] or '') or 0
local seen_at = tonumber(ARGV[13] or '') or mono
-- The call ends the caller's own lease: it gives one back or asks (settle_leases()).
-- Fixed before an override sets `want` to 0 (read_state()): a call that asked still
-- ends a stored lease of the caller it never read.
local ends_own = given_back ~= 0 or want > 0
local named_sent = tonumber(ARGV[14] or '')
local named_got = tonumber(ARGV[15] or '')
local named_spare = tonumber(ARGV[16] or '') or 0
-- The earliest instant (the caller's clock, µs) at which the caller, a lease's witness,
-- could end it (0: none); returned, so that it calls then.
local due = 0
-- A host that asked counts among the holders this long after, µs.
local ASK_US = 1200000
-- w: fields whose lease is not stored (an older script ended it), deleted by the next
-- settle_leases().
local orphans = {}

-- The hash, read once: `fields` has the algorithm's fields (strings), `leases` every
-- holder's lease {units, deadline, grant, cap, rate, window start, window length (nil,
-- nil for a bucket's), w = its w: field {grant, life, witness, mono, since} or nil},
-- `asks` every holder's last ask's end (µs).
local function read_state(key)
  local all = redis.call('HGETALL', key)
  local fields, leases, asks, lives = {}, {}, {}, {}
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    local kind = string.sub(f, 1, 2)
    if kind == 'l:' then
      local u, d, g, c, r, ws, wl =
        string.match(v, '^(%d+) (%d+) (%d+) ?(%d*) ?(%d*) ?(%d*) ?(%d*)$')
      if u then
        u = tonumber(u)
        leases[string.sub(f, 3)] = {u, tonumber(d), tonumber(g), tonumber(c) or u,
          tonumber(r) or 0, tonumber(ws), tonumber(wl)}
      end
    elseif kind == 'a:' then
      asks[string.sub(f, 3)] = tonumber(v) or 0
    elseif kind == 'w:' then
      local g, life, id, m, r = string.match(v, '^(%d+) (%d+) ?(%w*) ?(%d*) ?(%d*)$')
      lives[string.sub(f, 3)] = {tonumber(g), tonumber(life), id ~= '' and id or nil,
        tonumber(m), tonumber(r)}
    else
      fields[f] = v
    end
  end
  -- A run-time override in the hash (prelude.lua override()) is not state: its fields
  -- (ov, op) are read here, its parameters put in place of ARGV[1], ARGV[2] (each
  -- lease script reads them after this), store() keeps the key as long as it lives,
  -- and while it is in force nothing is granted (`want` = 0: no lease, no slice, no
  -- ask recorded). A daemon told so by the reply decides the key per request.
  override(ARGV, fields.ov)
  if tier then
    want, pace = 0, 0
  end
  for h, w in pairs(lives) do
    if leases[h] and leases[h][3] == w[1] and w[2] then
      leases[h].w = w
    else
      orphans[#orphans + 1] = 'w:' .. h
    end
  end
  return fields, leases, asks
end

-- True when lease `l` has lapsed at `t` (Redis clock): its deadline has passed and,
-- for a lease with a w: field, its witness (the caller) counted its life plus the drift
-- margin (1 ms + 0.1 %) on its own clock since it read a reply that showed the grant.
-- That reply came after the grant was made, which was after its holder sent the call
-- that took it, from when the holder's deadline is counted: so the holder's deadline
-- has passed, whatever Redis's clock did meanwhile.
local function lapsed(l, t)
  if l[2] > t then
    return false
  end
  local w = l.w
  if not w then
    return true
  end
  return w[3] == holder and mono ~= nil and w[4] ~= nil and mono - w[4] >= w[2] + 1000 + w[2] / 1000
end

-- Names the caller the witness of `h`'s lease `l` (see lapsed()) when it read the
-- grant and the lease has no witness, or one named over twice its life plus 1 s ago
-- on the Redis clock (gone quiet: counting restarts, later, never earlier). Its count
-- starts when it read the reply that showed the grant (`seen_at`, after the grant was
-- made).
local function witness(key, h, l)
  local w = l.w
  if not w or not seen_at or seen < l[3] or w[3] == holder then
    return
  end
  if w[3] and now < w[5] + 2 * w[2] + 1000000 then
    return
  end
  w[3], w[4], w[5] = holder, seen_at, now
  redis.call('HSET', key, 'w:' .. h, digits(l[3]) .. ' ' .. digits(w[2]) .. ' ' .. holder
    .. ' ' .. digits(seen_at) .. ' ' .. digits(now))
end

-- Capacity out on every lease stored (lapsed ones included), the latest deadline, and
-- the refill rate (µ-units/s) promised to slices.
local function outstanding(leases)
  local out, latest, promised = 0, 0, 0
  for _, l in pairs(leases) do
    out = out + l[4]
    promised = promised + l[5]
    if l[2] > latest then
      latest = l[2]
    end
  end
  return out, latest, promised
end

-- Settles the leases at `t`: a lease past its deadline lapses (its units are dropped,
-- counted as spent: the holder may have spent them; a lease with a w: field once its
-- witness counted its life, lapsed()); the caller's own lease ends when the call gives
-- back or asks (the caller stopped spending it). Only the grant the call names, still
-- stored (a lease without a w: field: still before its deadline), gives its unspent
-- units back (at most its cap). A
-- stored grant the call does not name (the caller never read its reply, or named a
-- grant this node never saw: a failover lost it) lapses as spent too: Redis never hands
-- back units a holder may have spent. Deletes the ended fields; returns the units given
-- back to the budget and the capacity still out on the other leases, their latest
-- deadline, and whether any lease ended.
local function settle_leases(key, leases, t)
  local back = 0
  local gone = {}
  -- A call that neither gives back nor asks (a cold key's decision) leaves its
  -- caller's lease alone: the holder may still be spending it.
  for h, l in pairs(leases) do
    if h == holder and ends_own then
      if l[3] == given_back and (l.w or l[2] > t) then
        back = math.min(unspent, l[4])
      end
      gone[#gone + 1] = 'l:' .. h
    else
      witness(key, h, l)
      if lapsed(l, t) then
        gone[#gone + 1] = 'l:' .. h
      elseif l.w and l.w[3] == holder then
        local at = l.w[4] + l.w[2] + 1000 + math.ceil(l.w[2] / 1000)
        if due == 0 or at < due then
          due = at
        end
      end
    end
  end
  local ended = #gone > 0
  for _, f in ipairs({unpack(gone)}) do
    leases[string.sub(f, 3)] = nil
    gone[#gone + 1] = 'w:' .. string.sub(f, 3)
  end
  for _, f in ipairs(orphans) do
    gone[#gone + 1] = f
  end
  if #gone > 0 then
    redis.call('HDEL', key, unpack(gone))
  end
  local out, latest = outstanding(leases)
  return back, out, latest, ended
end

-- The hosts a grant is shared between after settle_leases(): the caller, the other
-- hosts with a lease, and those that asked within ASK_US. Records the caller's ask
-- (when it wants units) and drops asks that ended. Returns their number, and the set
-- of their holder ids (caller included).
local function holders(key, leases, asks)
  local seen, n = {[holder] = true}, 1
  for h, _ in pairs(leases) do
    if not seen[h] then
      seen[h], n = true, n + 1
    end
  end
  local ended = {}
  for h, until_us in pairs(asks) do
    if until_us <= now then
      ended[#ended + 1] = 'a:' .. h
    elseif not seen[h] then
      seen[h], n = true, n + 1
    end
  end
  if #ended > 0 then
    redis.call('HDEL', key, unpack(ended))
  end
  if want > 0 then
    redis.call('HSET', key, 'a:' .. holder, digits(now + ASK_US))
  end
  return n, seen
end

-- A grant out of `avail` units (whole units of `unit` algorithm units) shared by
-- `asking` hosts: at most `want`, at most `total` ÷ asking (`total`: what is shared,
-- `avail` when not given), at least one whole unit when one is there.
local function grant_size(avail, unit, asking, total)
  if want <= 0 or avail < unit then
    return 0
  end
  local share = (total or avail) / asking
  share = math.floor(share / unit) * unit
  if share < unit then
    share = unit
  end
  return math.min(want, share, math.floor(avail / unit) * unit)
end

-- Records a new lease of `units` for the caller, ending at `deadline` (µs, Redis clock);
-- `n` is the key's last grant number; a slice also has its `cap` and `rate`, a window's
-- lease the window whose count holds it (`ws` its start, `wl` its length, µs). Returns
-- the grant number.
local function record_lease(key, units, deadline, n, cap, rate, ws, wl)
  local g = (n or 0) + 1
  local v = digits(units) .. ' ' .. digits(deadline) .. ' ' .. digits(g)
  if cap then
    v = v .. ' ' .. digits(cap) .. ' ' .. digits(rate)
  end
  if ws then
    v = v .. ' ' .. digits(ws) .. ' ' .. digits(wl)
  end
  redis.call('HSET', key, 'n', digits(g), 'l:' .. holder, v)
  return g
end

-- Records that the caller's lease, grant `g`, lives `life` µs (its w: field): it then
-- lapses only once a witness has counted that (lapsed()).
local function record_life(key, g, life)
  redis.call('HSET', key, 'w:' .. holder, digits(g) .. ' ' .. digits(life))
end

-- A lease script's reply `reply` (its twelve fields), with the run-time override in
-- force (prelude.lua override()) as fields 13 to 15, as tiered() adds them to a plain
-- decision's four: the daemon states the override's limit, and stops leasing the key.
local function leased(reply)
  if tier then
    reply[13], reply[14], reply[15] = tier[1], tier[2], tier[3]
  end
  return reply
end
