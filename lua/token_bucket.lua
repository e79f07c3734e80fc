-- Token bucket (CONTRACT §2), the twin of src/algorithm/token_bucket.rs: the same
-- operations on IEEE doubles in the same order, so both give the same fields.
--
-- KEYS[1]  the bucket: a hash {t = tokens in micro-tokens, ts = µs on the Redis clock}
--          named <prefix>:{<rule>:<key>} (the hash tag keeps it in one slot)
-- ARGV[1]  capacity, micro-tokens (integer; capacity × 1e6)
-- ARGV[2]  refill rate, tokens/s (= micro-tokens/µs), > 0
-- ARGV[3]  cost, micro-tokens (integer)
-- ARGV[4]  optional: "now" in µs. Only tests pass it; production uses Redis TIME.
-- Returns  {allowed 0|1, remaining tokens (floor), reset_ms (ceil), wait_ms (ceil)}
--
-- A new or expired key is full. The key expires 1 s after it would be full again, when
-- it is indistinguishable from a missing one; a DENY or a cost of 0 writes nothing.
-- Numbers passed to redis.call are formatted with %.0f: Redis would print large ones
-- as 1e+17, which HSET would store inexactly and PEXPIRE would reject.
-- Needs Redis >= 5 (script effects replication, so TIME may precede writes).
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now
if ARGV[4] then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local tokens = cap
local s = redis.call('HMGET', KEYS[1], 't', 'ts')
if s[1] and s[2] then
  tokens = tonumber(s[1])
  local ts = tonumber(s[2])
  if now < ts then
    now = ts
  end
  tokens = math.min(cap, tokens + math.floor((now - ts) * rate))
end

local allowed = 0
local wait = 0
if tokens >= cost then
  allowed = 1
  tokens = tokens - cost
else
  wait = math.ceil((cost - tokens) / (rate * 1000))
end
local reset = math.ceil((cap - tokens) / (rate * 1000))

if allowed == 1 and cost > 0 then
  redis.call('HSET', KEYS[1], 't', string.format('%.0f', tokens), 'ts', string.format('%.0f', now))
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', reset + 1000))
end
return {allowed, math.floor(tokens / 1000000), reset, wait}
