-- Token bucket (docs/ALGORITHMS.md), the twin of src/algorithm/token_bucket.rs: the same
-- operations on IEEE doubles in the same order, so both give the same fields.
--
-- KEYS[1]  the bucket: a hash {t = tokens in micro-tokens, ts = µs on the Redis clock,
--          x = the key's expiry, µs on the node's clock, and a run-time override's
--          fields (prelude.lua override())} named <prefix>:{<rule>:<key>} (the hash tag keeps it in one slot)
-- ARGV[1]  capacity, micro-tokens (integer; capacity × 1e6)
-- ARGV[2]  refill rate, tokens/s (= micro-tokens/µs), > 0
-- ARGV[3]  cost, micro-tokens (integer)
-- ARGV[4]  optional "now" in µs (tests only): see prelude.lua, prepended to this file
--          (then bucket_leases.lua).
-- ARGV[5]  optional "1": a dry run, the same reply and no write (prelude.lua).
-- Returns  {allowed 0|1, remaining tokens (floor), reset_ms, wait_ms}
--
-- A new or expired key is full. Leases of daemons that take them (field o) hold part of
-- the capacity and of the refill as bucket_leases.lua says. The key expires 1 s after it would be full again, when
-- it is indistinguishable from a missing one, counted on the node's own clock (prelude
-- expiry()); a DENY or a cost of 0 writes nothing, unless the rule in force needs the
-- state longer than its stored expiry (a reload slowed the refill).
-- reset_ms / wait_ms are the first whole ms at which the stored bucket is full / holds
-- `cost`: a closed form, checked against the refill rule by settle() (as in Rust).
local s = redis.call('HMGET', KEYS[1], 't', 'ts', 'x', 'ov', 'o')
override(ARGV, s[4])
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
dry = ARGV[5] == '1'
local st_tokens, st_ts
local st_x = tonumber(s[3])
if s[1] and s[2] then
  st_tokens = tonumber(s[1])
  st_ts = tonumber(s[2])
  if now < st_ts then
    now = st_ts
  end
end

local function tokens_at(t)
  if not st_tokens then
    return cap
  end
  if t < st_ts then
    t = st_ts
  end
  return (refill_leased(s[5], cap, rate, st_tokens, st_ts, t))
end

local tokens = tokens_at(now)
local allowed = tokens >= cost
if allowed and cost > 0 then
  tokens = tokens - cost
  st_tokens = tokens
  st_ts = now
end
-- settle()'s two checks of a right guess, made inline: no closure on the common path.
local reset = ceil_ms((cap - tokens) / rate)
if reset < 0 or tokens_at(now + reset * 1000) < cap
    or (reset > 0 and tokens_at(now + (reset - 1) * 1000) >= cap) then
  reset = settle(reset, 0, function(k)
    return tokens_at(now + k * 1000) >= cap
  end)
end
local wait = 0
if not allowed then
  if cost > cap then
    wait = math.max(reset, 1)
  else
    wait = settle(ceil_ms((cost - tokens) / rate), 1, function(k)
      return tokens_at(now + k * 1000) >= cost
    end)
  end
end

store(allowed and cost > 0, st_x, reset, 't', tokens, 'ts', now)
return tiered({allowed and 1 or 0, math.floor(tokens / 1000000), reset, wait})
