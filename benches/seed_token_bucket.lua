-- The plain token bucket a Redis rate limiter starts from (the seeds' script): the
-- baseline benches/run.sh compares the daemon's Redis-bound decisions with (scenario s).
-- Not used by the daemon. HMGET tokens and timestamp, refill, HMSET, EXPIRE.
--
-- KEYS[1]  the bucket: a hash {tokens = micro-tokens, ts = µs on the Redis clock}
-- ARGV[1]  capacity, micro-tokens
-- ARGV[2]  refill rate, tokens/s (= micro-tokens/µs)
-- ARGV[3]  cost, micro-tokens
-- Returns  {allowed 0|1, remaining tokens (floor)}
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = cap
if s[1] and s[2] then
  tokens = math.min(cap, tonumber(s[1]) + math.floor((now - tonumber(s[2])) * rate))
end
local allowed = 0
if tokens >= cost then
  allowed = 1
  tokens = tokens - cost
end
redis.call('HMSET', KEYS[1], 'tokens', string.format('%.0f', tokens), 'ts', string.format('%.0f', now))
redis.call('EXPIRE', KEYS[1], math.ceil(cap / rate / 1000000) + 1)
return {allowed, math.floor(tokens / 1000000)}
