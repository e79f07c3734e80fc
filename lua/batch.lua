-- The batch script's loop: several decisions and lease calls of one primary in one
-- EVALSHA (src/store/batch.rs). src/store/batch_script.rs builds the script: first a
-- head that sets `keys` (the calls' keys), `at` (where the first call's item starts in
-- ARGV) and empties ARGV and KEYS (so prelude.lua, next, reads no "now" and asks TIME
-- once for the whole batch, and its functions, like the algorithms', see the KEYS[1]
-- this loop sets), then prelude.lua, the shared parts, each algorithm's script as a
-- function `decide_<kind>(ARGV)` listed in `algorithms` (in the order of
-- src/algorithm/registry.rs), then each lease script (lua/lease.lua, its parts and
-- lua/lease_<name>.lua, without the prelude) as a function `lease_<kind>(ARGV)` after
-- them in `algorithms` (at 1 + the count of algorithms + kind), and this file.
--
-- Standalone Redis (batch_lua):
-- KEYS[i]  call i's key
-- ARGV     the calls' items
-- Redis Cluster (cluster_batch_lua, `#!lua flags=allow-cross-slot-keys`):
-- KEYS[1]  one of the keys, which routes the call to its primary
-- ARGV     n, the n keys (call i's is ARGV[1 + i]), then the calls' items
--
-- An item: its function's index in `algorithms` (0-based: an algorithm's index for its
--          decision, the count of algorithms + that for its lease call), the count m
--          of its arguments, then its m arguments, exactly as its own script takes
--          them (a decision's ARGV[4] "now", tests only, and ARGV[5] "1" for a dry
--          run; a lease call's sixteen, lua/lease.lua)
-- Returns  per call, its script's reply, or the text of the error it raised
--          (on Redis 7 a Redis error reply as Redis gave it, such as "WRONGTYPE …" or
--          "OOM …"; before 7, the text those versions raise, behind "ERR" unless it
--          starts with an error code; a Lua error as "ERR …", as a failed EVAL says),
--          or "ALONE <that text>" when Redis refused the key as not the node's own
--          (cluster: see below).
--
-- Each call runs as its own script would, one after another: from the batch's TIME
-- (or its own "now"), on its own key, a failure of one not stopping the others. A
-- lease call's function is its lease script's text: the same operations, the same
-- reply, the same writes.
--
-- Cluster: Redis checks every command a script runs as a client's, before running it
-- (Redis 7 script.c scriptVerifyClusterState, Valkey 8 alike). A key of a slot another
-- node owns, a key absent from a slot this node is migrating (it may already be on the
-- new owner: absent here is not new), a key of a slot this node imports (no ASKING on
-- this call) and a cluster that is down all raise "non local key", "TRYAGAIN" or
-- "cluster is down". Such a key is returned as ALONE: the daemon sends it on its own,
-- where ASK and MOVED are followed. A batched call's first command on its key is a
-- read (a decision's HMGET, a lease call's HGETALL: src/store/scripts.rs checks it), so
-- a refused key was never written. A key that is absent and not refused is absent from
-- a slot the node owns and is not migrating: a new key, decided as one.
local function refused(text)
  return text:find('non local key', 1, true) or text:find('TRYAGAIN', 1, true)
    or text:find('cluster is down', 1, true) or text:find('same slot', 1, true)
    or text:find('^MOVED ') or text:find('^ASK ')
end
local base = now
-- A decision's function index and argument count are single digits: a table lookup
-- is cheaper than tonumber()'s strtod. `args` is made with room for five arguments (a
-- lease call's sixteen grow it).
local digit = {['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5,
  ['6'] = 6, ['7'] = 7, ['8'] = 8, ['9'] = 9}
local number = {}
memo = {}
local out = {}
for i = 1, #keys do
  local kind, n = digit[items[at]] or tonumber(items[at]), digit[items[at + 1]] or tonumber(items[at + 1])
  local args = {nil, nil, nil, nil, nil}
  for j = 1, n do
    args[j] = items[at + 1 + j]
  end
  -- Every script reads its first three arguments as numbers (its parameters and the
  -- cost), repeated from one call of a rule to the next: converted once a call.
  for j = 1, (n < 3 and n or 3) do
    local v = args[j]
    local x = number[v]
    if x == nil then
      x = tonumber(v) or v
      number[v] = x
    end
    args[j] = x
  end
  at = at + 2 + n
  local t = args[4]
  if t and t ~= '' then
    now = tonumber(t)
  else
    now = base
  end
  clock, dry = now, false
  KEYS[1] = keys[i]
  local ok, reply = pcall(algorithms[kind + 1], args)
  if ok then
    out[i] = reply
  elseif type(reply) == 'table' and reply.err then
    out[i] = reply.err
  else
    -- Redis before 7 raises a Redis error as its text; a Lua error is a message
    -- without an error code.
    local text = (tostring(reply):gsub('^%-', ''))
    if not text:find('^%u+ ') then
      text = 'ERR ' .. text
    end
    out[i] = text
  end
  if not ok and refused(out[i]) then
    out[i] = 'ALONE ' .. out[i]
  end
end
return out
