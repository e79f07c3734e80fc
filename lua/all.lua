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
-- way, then the group fails with that error: it took nothing.
--
-- The common case, every key allowed, costs what the batch script's decisions do plus
-- a few table writes per key: nothing is parsed ahead or kept per key but where its
-- item starts (`starts`, one table reused by every group), its arguments are one table
-- built in one go, and the reply is written straight into the group's reply table,
-- each decision's instant in its slot; a DENY re-reads what it needs from `items`.
local base = now
-- Algorithm index as sent ("0", "1", ...) to its place in `algorithms`: a lookup, where
-- tonumber() would parse the text on every key.
local kind_of = {}
for i = 1, #algorithms do
  kind_of[tostring(i - 1)] = i
end
-- Where each key's item of the current group starts in `items`.
local starts = {}

-- The arguments of the item at `at` (a new table: override() rewrites the first two),
-- with '', '1' after the first three for a dry run, and where the next item starts;
-- sets `now` to the instant the decision is made at (the call's TIME, or the item's
-- "now"), `clock` and `dry`.
local function args_at(at, peek)
  local n = items[at + 1]
  local a
  if n == '3' then
    now = base
    if peek then
      a = {items[at + 2], items[at + 3], items[at + 4], '', '1'}
    else
      a = {items[at + 2], items[at + 3], items[at + 4]}
    end
    n = 3
  else
    n = tonumber(n)
    a = {}
    for j = 1, n do
      a[j] = items[at + 1 + j]
    end
    local t = a[4]
    if t and t ~= '' then
      now = tonumber(t)
    else
      now = base
    end
    a[4], a[5] = nil, nil
    if peek then
      a[4], a[5] = '', '1'
    end
  end
  clock, dry = now, false
  return a, at + 2 + n
end

-- The algorithm of the item at `at` (its function's place in `algorithms`).
local function kind_at(at)
  local text = items[at]
  return kind_of[text] or (tonumber(text) + 1)
end

-- Writes reply `r` of a decision taken at `instant` (0: not taken) into `flat` from
-- w + 1 on.
local function put(flat, w, r, instant)
  flat[w + 1], flat[w + 2], flat[w + 3], flat[w + 4] = r[1], r[2], r[3], r[4]
  flat[w + 5], flat[w + 6], flat[w + 7], flat[w + 8] = instant, r[5] or 0, r[6] or 0, r[7] or 0
end

-- Gives back what the group's keys 1..taken (keys[first + i]) took, last first, each
-- from the instant it was taken at (its slot in `flat`, from `w0` on).
local function give_back_taken(first, taken, flat, w0)
  for i = taken, 1, -1 do
    local at = starts[i]
    local a = args_at(at, false)
    KEYS[1] = keys[first + i]
    override_of(a)
    give_backs[kind_at(at)](a, flat[w0 + 8 * (i - 1) + 5])
  end
end

-- A group denied at its key `denied`: what the keys before it took goes back, from the
-- same instant (nothing ran in between, so each give-back restores exactly what its
-- take wrote), and every key is reported as a dry run of its cost now, from `w0` on.
local function undo(first, count, denied, flat, w0)
  give_back_taken(first, denied - 1, flat, w0)
  local w = w0
  for i = 1, count do
    local at = starts[i]
    local a = args_at(at, true)
    KEYS[1] = keys[first + i]
    put(flat, w, algorithms[kind_at(at)](a), 0)
    w = w + 8
  end
end

-- Decides the `count` keys keys[first + 1 ..] (their items from items[at] on) all or
-- nothing, their reply written into `flat` from flat[w + 1] on. Returns where the
-- next group's items start; or nil and the error a key's command raised (the group
-- took nothing: the keys before it were given back).
local function all_or_nothing(first, count, at, flat, w)
  local w0 = w
  for i = 1, count do
    starts[i] = at
    local kind = kind_at(at)
    local a, next_at = args_at(at, false)
    KEYS[1] = keys[first + i]
    local ok, r = pcall(algorithms[kind], a)
    if not ok then
      local undone, e = pcall(give_back_taken, first, i - 1, flat, w0)
      return nil, undone and r or e
    end
    at = next_at
    if r[1] ~= 1 then
      -- The rest of the group's items, skipped (their keys are decided dry in undo()).
      for j = i + 1, count do
        starts[j] = at
        at = at + 2 + tonumber(items[at + 1])
      end
      local undone, e = pcall(undo, first, count, i, flat, w0)
      if not undone then
        return nil, e
      end
      return at
    end
    put(flat, w, r, now)
    w = w + 8
  end
  return at
end
