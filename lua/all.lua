-- The loop of the all-or-nothing script: several decisions on keys of one slot (one
-- shard of the store), taken together or not at all (CHECKALL, composite rules).
-- src/store/multi.rs builds the script as src/store/scripts.rs builds the batch script:
-- `local items, ARGV, keys, KEYS = ARGV, {}, KEYS, {}`, prelude.lua (one TIME for
-- all), the shared parts, each algorithm's script as a function `decide_<kind>(ARGV)`
-- listed in `algorithms`, give_back.lua and its `give_backs` table, then this file.
--
-- KEYS[i]  decision i's key; the caller merged repeated keys (their costs summed), so
--          every key appears once
-- ARGV     per decision, in KEYS' order: its algorithm's index (0-based), the count n of
--          its arguments, then its n arguments (its own script's first three: the
--          parameters and the cost)
-- Returns  per decision five integers, flat: allowed 0|1, remaining, reset_ms,
--          wait_ms, and the instant (µs, Redis clock) its state was decided at when it
--          was taken, else 0
--
-- Each key is decided for real in turn, from the same instant; at the first DENY, the
-- keys already taken get their units back (give_back.lua, prepended: nothing ran in
-- between, so each give-back undoes exactly its take) and every key is reported as a
-- dry run. Redis runs the script atomically: nobody sees a state in between. (A dry
-- run of every key before taking any was the first design: twice the work on every
-- ALLOW, the common case.)
local base = now
local parsed = {}
local at = 1
for i = 1, #keys do
  local kind, n = tonumber(items[at]), tonumber(items[at + 1])
  local args = {}
  for j = 1, n do
    args[j] = items[at + 1 + j]
  end
  at = at + 2 + n
  parsed[i] = {kind = kind, args = args}
end

local function run(i, peek)
  now, clock, dry = base, base, false
  KEYS[1] = keys[i]
  local p = parsed[i]
  local args = {p.args[1], p.args[2], p.args[3]}
  if peek then
    args[4], args[5] = '', '1'
  end
  return algorithms[p.kind + 1](args)
end

local out = {}
local instants = {}
local taken = 0
for i = 1, #keys do
  out[i] = run(i, false)
  if out[i][1] ~= 1 then
    break
  end
  instants[i] = now
  taken = i
end
if taken < #keys then
  -- Denied: what the keys before it took goes back, from the same instant (nothing ran
  -- in between, so each give-back restores exactly what its take wrote), and every
  -- key is reported as a dry run of its cost now.
  for i = taken, 1, -1 do
    now, clock, dry = base, base, false
    KEYS[1] = keys[i]
    local p = parsed[i]
    local a = {p.args[1], p.args[2], p.args[3]}
    override(a)
    give_backs[p.kind + 1](a, instants[i])
  end
  for i = 1, #keys do
    out[i] = run(i, true)
    instants[i] = 0
  end
end
local flat = {}
for i = 1, #keys do
  local r = out[i]
  flat[#flat + 1] = r[1]
  flat[#flat + 1] = r[2]
  flat[#flat + 1] = r[3]
  flat[#flat + 1] = r[4]
  flat[#flat + 1] = instants[i]
end
return flat
