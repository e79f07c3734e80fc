-- The run-time override of a sliding window log (OVERRIDE, src/limiter/tiers.rs),
-- whose state is a sorted set, not a hash: the hash <KEYS[1]>:ov beside it, in its hash
-- tag's slot, with the fields a, b, l, h, o (as in prelude.lua override()'s ov) and p
-- (its text), and a TTL for its end. Prepended after prelude.lua to
-- sliding_window_log.lua by its `spec!` (and so present in the scripts that hold every
-- algorithm); no other single-key script defines it, as each would pay for defining it
-- on every call.
--
-- Read with pcall: while its slot migrates, Redis Cluster refuses a script's read of a
-- key absent from the node (the hash moved ahead of the state, or there is none), and
-- the decision must still be made from the state still here: such a decision is made
-- under the rule's own parameters (docs/DESIGN.md, "Run-time overrides").
local function side_override(args)
  tier, kept = nil, nil
  local o = redis.pcall('HMGET', KEYS[1] .. ':ov', 'a', 'b', 'l', 'h', 'o')
  if o.err then
    return
  end
  if o[1] and o[2] and o[3] and o[4] and o[5] then
    args[1], args[2] = o[1], o[2]
    tier = {tonumber(o[3]), tonumber(o[4]), tonumber(o[5])}
  end
end
