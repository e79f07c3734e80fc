-- The loop of the all-or-nothing batch script: several groups of one primary in one
-- EVALSHA (src/store/batch_all.rs), each decided all or nothing on its own
-- (lua/all.lua), or a give-back to several keys (lua/give_back_keys.lua: REFUND, the
-- undo of a reservation), one after another, from the batch's TIME, a failure of one
-- not stopping the others (lua/all.lua catches each key's error, not each group's; a
-- give-back's error is caught here). Its head sets `keys` and `at` as the batch
-- script's does (lua/batch.lua):
--
-- Standalone Redis: KEYS, every group's keys in order; ARGV, the groups.
-- Redis Cluster (`#!lua flags=allow-cross-slot-keys`): KEYS[1], one of the keys, which
--          routes the call to its primary; ARGV, n, the n keys, then the groups.
-- A group: its count g of decisions, then their g items (lua/all.lua); its keys are the
--          next g of `keys`. A give-back: minus its count g of keys, then their g
--          items (lua/give_back_keys.lua); its keys are the next g of `keys`.
-- Returns  per group, its reply (lua/all.lua; a give-back's, lua/give_back_keys.lua), or
--          the text of the error it raised, or "ALONE <that text>" when Redis refused
--          one of its keys as not the node's own, as lua/batch.lua says (the same
--          test). A group that raised took nothing: lua/all.lua gave back what its
--          keys before the error took. A give-back Redis refused a key of gave nothing
--          back: every key of it is read (its override) before any is written. A
--          give-back that raised otherwise stopped at that key, as the give-back script
--          alone does.
local function refused(text)
  return text:find('non local key', 1, true) or text:find('TRYAGAIN', 1, true)
    or text:find('cluster is down', 1, true) or text:find('same slot', 1, true)
    or text:find('^MOVED ') or text:find('^ASK ')
end
-- Digits kept for the call (prelude.lua digits()).
memo = {}
local out = {}
local next_key = 0
local g = 0
-- The give-back of the `count` keys after keys[first], from items[at] on, into `flat`:
-- where the next group starts, or nil and the error that stopped it. Every key's
-- override is read first (an HMGET, as give_back.lua override_of() would read it), so
-- a key Redis refuses is met before any key is written.
local function give_back_group(first, count, at, flat)
  local ov = {}
  for i = 1, count do
    local s = redis.pcall('HMGET', keys[first + i], 'ov')
    if s.err and refused(s.err) then
      return nil, s
    end
    ov[i] = s
  end
  local ok, r = pcall(give_back_keys, first, count, at, flat, base, ov)
  if ok then
    return r
  end
  return nil, r
end
while at <= #items do
  local count = tonumber(items[at])
  local done, e, flat
  if count < 0 then
    count = -count
    flat = {}
    done, e = give_back_group(next_key, count, at + 1, flat)
  else
    -- A group of two keys (the common CHECKALL) gets its reply table at its full size
    -- at once, where filling it would grow it four times.
    if count == 2 then
      flat = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
    else
      flat = {}
    end
    done, e = all_or_nothing(next_key, count, at + 1, flat, 0)
  end
  next_key = next_key + count
  g = g + 1
  if done then
    at = done
    out[g] = flat
  else
    -- The group's items, skipped: each is its index, its count n, then n arguments.
    at = at + 1
    for _ = 1, count do
      at = at + 2 + tonumber(items[at + 1])
    end
    local text
    if type(e) == 'table' and e.err then
      text = e.err
    else
      -- Redis before 7 raises a Redis error as its text; a Lua error is a message
      -- without an error code.
      text = (tostring(e):gsub('^%-', ''))
      if not text:find('^%u+ ') then
        text = 'ERR ' .. text
      end
    end
    if refused(text) then
      text = 'ALONE ' .. text
    end
    out[g] = text
  end
end
return out
