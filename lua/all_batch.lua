-- The loop of the all-or-nothing batch script: several groups of one primary in one
-- EVALSHA (src/store/batch_all.rs), each decided all or nothing on its own
-- (lua/all.lua), one after another, from the batch's TIME, a failure of one not
-- stopping the others (lua/all.lua catches each key's error, not each group's). Its head sets `keys` and `at` as the batch script's does
-- (lua/batch.lua):
--
-- Standalone Redis: KEYS, every group's keys in order; ARGV, the groups.
-- Redis Cluster (`#!lua flags=allow-cross-slot-keys`): KEYS[1], one of the keys, which
--          routes the call to its primary; ARGV, n, the n keys, then the groups.
-- A group: its count g of decisions, then their g items (lua/all.lua); its keys are the
--          next g of `keys`.
-- Returns  per group, its reply (lua/all.lua), or the text of the error it raised, or
--          "ALONE <that text>" when Redis refused one of its keys as not the node's
--          own, as lua/batch.lua says (the same test). A group that raised took
--          nothing: lua/all.lua gave back what its keys before the error took.
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
while at <= #items do
  local count = tonumber(items[at])
  -- A group of two keys (the common CHECKALL) gets its reply table at its full size
  -- at once, where filling it would grow it four times.
  local flat
  if count == 2 then
    flat = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  else
    flat = {}
  end
  local done, e = all_or_nothing(next_key, count, at + 1, flat, 0)
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
