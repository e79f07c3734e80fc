-- The batch script's loop: several decisions of one standalone Redis in one EVALSHA
-- (src/store/batch.rs). src/store/scripts.rs builds the script: first
-- `local items, ARGV, keys, KEYS = ARGV, {}, KEYS, {}` (so prelude.lua, next, reads no
-- "now" and asks TIME once for the whole batch, and its functions, like the
-- algorithms', see the KEYS[1] this loop sets), then prelude.lua, the shared parts,
-- each algorithm's script as a function `decide_<kind>(ARGV)` listed in `algorithms`
-- (in the order of src/algorithm/registry.rs), and this file.
--
-- KEYS[i]  decision i's key
-- ARGV     per decision, in KEYS' order: its algorithm's index (0-based), the count n of
--          its arguments, then its n arguments, exactly as its own script takes them
--          (ARGV[4] "now", tests only; ARGV[5] "1" for a dry run)
-- Returns  per decision, its script's reply, or the text of the error it raised
--          (on Redis 7 a Redis error reply as Redis gave it, such as "WRONGTYPE …" or
--          "OOM …"; before 7, the text those versions raise, behind "ERR" unless it
--          starts with an error code; a Lua error as "ERR …", as a failed EVAL says).
--
-- Each decision runs as its own script would, one after another: from the batch's
-- TIME (or its own "now"), on its own key, a failure of one not stopping the others.
local base = now
local out = {}
local at = 1
for i = 1, #keys do
  local kind, n = tonumber(items[at]), tonumber(items[at + 1])
  local args = {}
  for j = 1, n do
    args[j] = items[at + 1 + j]
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
end
return out
