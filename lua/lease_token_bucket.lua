-- Token bucket with leases (docs/DESIGN.md "Leases"): lua/token_bucket.lua's decision,
-- on a bucket whose refill is capped at capacity − capacity out on lease and slowed by
-- the refill promised to slices, plus the lease bookkeeping of lua/lease.lua
-- (prepended, with prelude.lua, to this file).
--
-- KEYS[1]  the bucket: token_bucket.lua's hash {t, ts, x} plus {n, o, l:<holder>...,
--          w:<holder>..., a:<holder>...}
-- ARGV     token_bucket.lua's (capacity µ-tokens, rate tokens/s, cost µ-tokens, now),
--          then lease.lua's (holder, grant given back, unspent µ-tokens, wanted
--          µ-tokens, lifetime µs, pace µs)
-- Returns  {allowed, remaining tokens, reset_ms, wait_ms, granted µ-tokens, lifetime µs,
--          grant, µ-tokens given back, slice cap µ-tokens, slice rate µ-tokens/s, the
--          key's last grant, due (lua/lease.lua)}, then a run-time override's three
--          fields (lua/lease.lua leased())
--
-- A lease takes `cap` of the capacity out of the bucket (a lump lease: cap = its units)
-- and, a slice, `rate` of the refill: the holder refills a bucket of its own of `cap` at
-- `rate` until its deadline. The invariant: tokens + capacity out on lease ≤ capacity,
-- and the bucket's refill + the refill promised to slices ≤ refill_rate, after every
-- call. Refill up to now is capped and slowed with every lease stored (lapsed ones
-- included: they may have been spent, or refilled, while they ran), then leases are
-- settled (lapsed: dropped; the caller's: its unspent units go back into the bucket),
-- then the request's cost is decided, then the new lease is taken out of the bucket.
-- The bucket plus every holder's units therefore never hold more, nor refill faster,
-- than one client's bucket deciding every request in Redis: nothing is over-admitted
-- (docs/DESIGN.md gives the argument).
-- Read first: under a run-time override, read_state() puts its capacity and rate in
-- ARGV[1], ARGV[2].
local fields, leases, asks = read_state(KEYS[1])
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local UNIT = 1000000
local st_tokens, st_ts = tonumber(fields.t), tonumber(fields.ts)
local st_n = tonumber(fields.n)
if st_tokens and st_ts then
  if now < st_ts then
    now = st_ts
  end
else
  st_tokens, st_ts = nil, nil
end

-- The bucket's own refill (µ-tokens/µs) while `promised` µ-tokens/s go to slices.
local function own_rate(promised)
  return math.max(rate - promised / UNIT, 0)
end

local out_before, _, promised_before = outstanding(leases)
local level = cap - out_before
if st_tokens then
  level = math.min(level, st_tokens + math.floor((now - st_ts) * own_rate(promised_before)))
end
if level < 0 then
  level = 0
end
local back, out, latest, ended = settle_leases(KEYS[1], leases, now)
-- At least 0: leases taken under a larger capacity (before an override or a reload
-- lowered it) may hold more than the capacity now; the bucket then holds nothing and
-- refills nothing until enough of them have ended.
local room = math.max(cap - out, 0)
local tokens = math.min(level + back, room)

local allowed = tokens >= cost
if allowed then
  tokens = tokens - cost
end
-- The new lease: a paced (saturated) holder gets a slice, its share of the capacity
-- (whole tokens, at most what its demand over the fill time needs) and the same share of
-- the refill, with what the bucket holds of it now; others a lump of what is there.
local granted, slice_cap, slice_rate = 0, 0, 0
if want > 0 then
  local asking = holders(KEYS[1], leases, asks)
  if pace > 0 then
    local fair = math.ceil(cap / UNIT / asking) * UNIT
    local demand = math.ceil(want * cap / (rate * pace) / UNIT) * UNIT
    local c = math.min(fair, demand, math.floor(room / UNIT) * UNIT)
    if c >= UNIT then
      slice_cap = c
      slice_rate = math.floor(rate * UNIT * c / cap)
      granted = math.min(c, tokens)
    end
  else
    granted = grant_size(tokens, UNIT, asking)
  end
end
local grant = 0
if granted > 0 or slice_cap > 0 then
  tokens = tokens - granted
  local reserved = granted
  if slice_cap > 0 then
    reserved = slice_cap
    grant = record_lease(KEYS[1], granted, now + lifetime, st_n, slice_cap, slice_rate)
  else
    grant = record_lease(KEYS[1], granted, now + lifetime, st_n)
  end
  record_life(KEYS[1], grant, lifetime)
  out = out + reserved
  room = room - reserved
  if now + lifetime > latest then
    latest = now + lifetime
  end
end
local _, _, promised = outstanding(leases)
local own = own_rate(promised + slice_rate)

-- Written when the bucket or its leases changed (a lease ended: the refill up to now was
-- capped with it, and must not be computed again without it); otherwise, as the plain
-- script, only to lengthen the key's life, and the future is projected from the stored
-- state. A key without leases is decided and stored exactly as token_bucket.lua does
-- (tests/twins.rs).
local write = (allowed and cost > 0) or grant > 0 or ended
local base, base_ts = tokens, now
if not write and st_tokens then
  base, base_ts = st_tokens, st_ts
end
local function tokens_at(t)
  return math.min(room, base + math.floor((t - base_ts) * own))
end
-- Fully unused again: every lease ended and the bucket refilled to capacity (with
-- leases out, a closed form: their units come back as they end, or lapse).
local reset = 0
if out > 0 then
  reset = ceil_ms((cap - tokens) / rate)
elseif tokens < room then
  reset = settle(ceil_ms((room - tokens) / rate), 0, function(k)
    return tokens_at(now + k * 1000) >= room
  end)
end
local wait = 0
if not allowed then
  if cost > cap then
    wait = math.max(reset, 1)
  elseif cost > room or own <= 0 then
    -- Only leases ending can make room (or refill): at the latest when the last ends.
    wait = math.max(ceil_ms(latest - now) + ceil_ms((cost - tokens) / rate), 1)
  else
    wait = settle(ceil_ms((cost - tokens) / own), 1, function(k)
      return tokens_at(now + k * 1000) >= cost
    end)
  end
end

-- The state matters until every lease has ended and the bucket is full again. A lease
-- ends when its witness says (lua/lease.lua lapsed()), not on Redis's clock, which
-- also expires the key: with leases out the key lives LEASED_KEEP_MS at least, so that
-- a forward jump of Redis's clock shorter than that does not drop them with it.
local LEASED_KEEP_MS = 86400000
local keep = reset
if out > 0 then
  keep = math.max(keep, ceil_ms(latest - now) + ceil_ms((cap - tokens) / rate), LEASED_KEEP_MS)
end
store(write, tonumber(fields.x), keep, 't', tokens, 'ts', now)
-- The leases stored, for the per-request script (bucket_leases.lua); deleted with the
-- last one.
if out > 0 then
  local o = digits(out) .. ' ' .. digits(promised + slice_rate) .. ' ' .. digits(latest)
  if o ~= fields.o then
    redis.call('HSET', KEYS[1], 'o', o)
  end
elseif fields.o then
  redis.call('HDEL', KEYS[1], 'o')
end
return leased({allowed and 1 or 0, math.floor(tokens / UNIT), reset, wait, granted,
  grant > 0 and lifetime or 0, grant, back, slice_cap, slice_rate, grant > 0 and grant or st_n or 0, due})
