-- All or nothing: several decisions on keys of one slot (one shard of the store), taken
-- together or not at all (CHECKALL, composite rules). src/store/multi.rs builds the
-- scripts as src/store/scripts.rs builds the batch script: a head that sets `items`
-- (ARGV), `keys` and empties ARGV and KEYS, prelude.lua (one TIME for all), the shared
-- parts, each algorithm's script as a function `decide_<kind>(ARGV)` listed in
-- `algorithms`, give_back.lua and its `give_backs` table, then this file, then a loop:
-- lua/all_one.lua (one call, one group) or lua/all_batch.lua (several groups of one
-- primary in one call).
--
-- A group's decisions, in items from `at` on: per decision, its algorithm's index
-- (0-based), the count n of its arguments, then its n arguments (its own script's first
-- three: the parameters and the cost; a fourth, "now" in µs, only from tests, as the
-- algorithms' own scripts take it). The caller merged repeated keys (their costs
-- summed), so every key appears once.
-- A group's reply: per decision eight integers, flat: allowed 0|1, remaining, reset_ms,
-- wait_ms, the instant (µs, Redis clock) its state was decided at when it was taken,
-- else 0, then the key's run-time override as prelude.lua tiered() reports it (limit,
-- rate or window halves), or three 0s without one.
--
-- Each key is decided for real in turn, from the same instant; at the first DENY, the
-- keys already taken get their units back (give_back.lua, prepended: nothing ran in
-- between, so each give-back undoes exactly its take) and every key is reported as a
-- dry run. Redis runs the script atomically: nobody sees a state in between. (A dry
-- run of every key before taking any was the first design: twice the work on every
-- ALLOW, the common case.) A key whose command raises an error (Redis Cluster: a key
-- Redis refuses as not the node's own) has the keys before it given back the same
-- way, then the error is raised again: the group took nothing.
local base = now

-- `count` decisions' items from items[at] on, and where the next item starts.
local function parse_items(count, at)
  local parsed = {}
  for i = 1, count do
    local kind, n = tonumber(items[at]), tonumber(items[at + 1])
    local args = {}
    for j = 1, n do
      args[j] = items[at + 1 + j]
    end
    at = at + 2 + n
    parsed[i] = {kind = kind, args = args}
  end
  return parsed, at
end

-- The instant a decision is made at: the call's TIME, or its item's "now".
local function instant_of(p)
  local t = p.args[4]
  if t and t ~= '' then
    return tonumber(t)
  end
  return base
end

local function run(key, p, peek)
  now = instant_of(p)
  clock, dry = now, false
  KEYS[1] = key
  local args = {p.args[1], p.args[2], p.args[3]}
  if peek then
    args[4], args[5] = '', '1'
  end
  return algorithms[p.kind + 1](args)
end

-- Gives back what keys 1..taken took, last first, each from the instant it was taken at.
local function give_back_taken(ks, parsed, instants, taken)
  for i = taken, 1, -1 do
    local p = parsed[i]
    now = instant_of(p)
    clock, dry = now, false
    KEYS[1] = ks[i]
    local a = {p.args[1], p.args[2], p.args[3]}
    override_of(a)
    give_backs[p.kind + 1](a, instants[i])
  end
end

-- Decides the keys `ks` (their items `parsed`) all or nothing; appends the group's
-- reply to `flat`.
local function all_or_nothing(ks, parsed, flat)
  local out, instants, taken = {}, {}, 0
  for i = 1, #ks do
    local ok, r = pcall(run, ks[i], parsed[i], false)
    if not ok then
      give_back_taken(ks, parsed, instants, taken)
      error(r, 0)
    end
    out[i] = r
    if r[1] ~= 1 then
      break
    end
    instants[i] = now
    taken = i
  end
  if taken < #ks then
    -- Denied: what the keys before it took goes back, from the same instant (nothing ran
    -- in between, so each give-back restores exactly what its take wrote), and every
    -- key is reported as a dry run of its cost now.
    give_back_taken(ks, parsed, instants, taken)
    for i = 1, #ks do
      out[i] = run(ks[i], parsed[i], true)
      instants[i] = 0
    end
  end
  for i = 1, #ks do
    local r = out[i]
    flat[#flat + 1] = r[1]
    flat[#flat + 1] = r[2]
    flat[#flat + 1] = r[3]
    flat[#flat + 1] = r[4]
    flat[#flat + 1] = instants[i]
    flat[#flat + 1] = r[5] or 0
    flat[#flat + 1] = r[6] or 0
    flat[#flat + 1] = r[7] or 0
  end
end
