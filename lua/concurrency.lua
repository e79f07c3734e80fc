-- Concurrency slots (docs/ALGORITHMS.md), the twin of src/algorithm/concurrency.rs.
--
-- KEYS[1]  a sorted set <prefix>:{<rule>:<key>}:cc: member = a slot's token
--          "<hold_end µs>-<holder>", score = when the slot lapses unless renewed, µs
--          on the Redis clock (min(hold_end, time renewed + lease))
-- ARGV[1]  limit, slots (may be fractional: a shared limit, floored)
-- ARGV[2]  max_hold, µs
-- ARGV[3]  cost: slots taken at once by a plain decision (no ARGV[6]); 0 reports
-- ARGV[4]  optional "now" in µs (tests only): see prelude.lua, prepended to this file
-- ARGV[5]  optional "1": a dry run of a plain decision (nothing written)
-- ARGV[6]  the operation: "a" acquire, "r" release, "n" renew, "h" hand back slots
--          taken while Redis was unreachable; absent: a plain decision
-- ARGV[7]  lease, µs: how long a slot lives unless its holder renews it ("a", "n", "h")
-- ARGV[8…] "a": the token's holder part ("<daemon>.<n>"); "r", "n", "h": tokens
-- Returns  a plain decision or "a": {allowed 0|1, remaining, reset_ms, wait_ms,
--          hold_end µs (0 on DENY)}; "a" does not read the slots on ALLOW (reset_ms 0,
--          as the reply states it); "r", "n": per token 1 if the key held it, else 0;
--          "h": {slots added}
--
-- Lapsed slots (score <= now) leave before anything is counted. The key expires 1 s
-- after its last slot would lapse, counted on the node's own clock.
local limit = math.floor(tonumber(ARGV[1]))
local max_hold = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local op = ARGV[6] or ''
dry = ARGV[5] == '1' and op == ''
local lease = tonumber(ARGV[7] or '0')

local function hold_end_of(token)
  return tonumber(string.match(token, '^(%d+)-'))
end

-- Only the commands of the documented ACL line (docs/PRODUCTION-REDIS.md): ZADD,
-- ZRANGE, ZREM, ZREMRANGEBYSCORE, PEXPIRE.

-- The hold ends of the live slots (score > now): every member is read, O(limit).
local function live_ends()
  local out = {}
  local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    if tonumber(all[i + 1]) > now then
      out[#out + 1] = hold_end_of(all[i]) or now
    end
  end
  return out
end

-- Live slots, counted up to limit + 1 (enough for every decision). After the purge
-- below every member is live; a dry run counts from the scores.
local function live()
  if dry then
    return #live_ends()
  end
  return #redis.call('ZRANGE', KEYS[1], 0, limit)
end

-- The answer for `count` live slots: ALLOW with the slots left (`reset` read only when
-- `with_reset`), or DENY: wait until the oldest slot's max_hold ends, reset until the
-- last one's does (at least 1 ms each). Slots a dry run would add are not in the set:
-- `extra` is their end (or nil).
local function report(allowed, count, hold_end, extra, with_reset)
  local free = math.max(limit - count, 0)
  if count == 0 then
    if allowed then
      return {1, free, 0, 0, hold_end}
    end
    return {0, free, 1, 1, 0}
  end
  if allowed and not with_reset then
    return {1, free, 0, 0, hold_end}
  end
  local first, last = extra, extra
  for _, e in ipairs(live_ends()) do
    if first == nil or e < first then first = e end
    if last == nil or e > last then last = e end
  end
  local reset = math.max(ceil_ms(last - now), 1)
  if allowed then
    return {1, free, reset, 0, hold_end}
  end
  return {0, free, reset, math.max(ceil_ms(first - now), 1), 0}
end

-- The key lives 1 s past its last lapse, on the node's clock.
local function keep()
  local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if top[2] then
    redis.call('PEXPIRE', KEYS[1], digits(ceil_ms(tonumber(top[2]) - now) + 1000))
  end
end

if not dry then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', digits(now))
end

if op == 'a' then
  local count = live()
  if count >= limit then
    return report(false, count, 0, nil, true)
  end
  local hold_end = now + max_hold
  redis.call('ZADD', KEYS[1], digits(math.min(hold_end, now + lease)),
    digits(hold_end) .. '-' .. ARGV[8])
  keep()
  return report(true, count + 1, hold_end, nil, false)
elseif op == 'r' or op == 'n' then
  -- Lapsed slots are gone (the purge above): a member found is held.
  local out = {}
  for i = 8, #ARGV do
    local token = ARGV[i]
    local held
    if op == 'r' then
      held = redis.call('ZREM', KEYS[1], token) == 1
    else
      held = redis.call('ZADD', KEYS[1], 'XX', 'INCR', 0, token)
      if held then
        local e = hold_end_of(token) or now
        redis.call('ZADD', KEYS[1], 'XX', digits(math.min(e, now + lease)), token)
      end
    end
    out[#out + 1] = held and 1 or 0
  end
  if op == 'n' then
    keep()
  end
  return out
elseif op == 'h' then
  local added = 0
  for i = 8, #ARGV do
    local token = ARGV[i]
    local e = hold_end_of(token)
    if e and e > now then
      added = added + redis.call('ZADD', KEYS[1], 'NX', digits(math.min(e, now + lease)), token)
    end
  end
  keep()
  return {added}
end

-- A plain decision: `cost` anonymous slots, all or none.
local count = live()
local fits = count + cost <= limit
if fits and cost > 0 and not dry then
  local hold_end = now + max_hold
  for i = 1, cost do
    redis.call('ZADD', KEYS[1], digits(hold_end),
      digits(hold_end) .. '-~' .. digits(now) .. '.' .. i)
  end
  keep()
end
local extra = nil
if fits and cost > 0 and dry then
  extra = now + max_hold
end
if fits then
  count = count + cost
end
local r = report(fits, count, 0, extra, true)
if not fits and cost > limit then
  r[4] = math.max(r[4], r[3], 1)
end
return {r[1], r[2], r[3], r[4]}
